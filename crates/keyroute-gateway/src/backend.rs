//! A cache listener's side of its pool's servers: each client connection's own connection to
//! each server it needs, the requests of a pipelined batch gathered per server and written at
//! once, and the placement and accounting of each command. Shared by the memcached and Redis
//! listeners, which differ only in their protocol.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::metrics::Outcome;
use crate::pool::{Pool, Snapshot, WorkerState};
use crate::state::Shared;

/// A connection to one server, held by one client connection, with the requests of the batch
/// being made for it.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    pub(crate) stream: TcpStream,
    pub(crate) buf: BytesMut,
    pub(crate) out: Vec<u8>,
    /// It failed in this batch: its later answers are not waited for, and it is dropped after.
    pub(crate) broken: bool,
}

/// A client connection's servers: few (a pool's), so found by a scan.
#[derive(Default)]
pub(crate) struct Servers(pub(crate) Vec<Server>);

impl Servers {
    pub(crate) fn find(&self, addr: SocketAddr) -> Option<usize> {
        self.0.iter().position(|s| s.addr == addr)
    }

    /// Drops the connections that failed.
    pub(crate) fn sweep(&mut self) {
        self.0.retain(|s| !s.broken);
    }
}

/// A pool's settings that a batch uses.
pub(crate) struct Settings {
    pub(crate) answer: Duration,
    pub(crate) connect: Duration,
    pub(crate) attempts: usize,
    pub(crate) may_eject: bool,
    /// Sent first on every new server connection (Redis's `AUTH`), whose one-line answer must
    /// start with `+`.
    pub(crate) greeting: Option<Arc<[u8]>>,
    /// The servers' password (Redis's `server_password`), which `MIGRATE` gives the new owner.
    pub(crate) password: Option<Arc<str>>,
}

impl Settings {
    /// The settings of `snap`'s pool.
    pub(crate) fn of(snap: &Snapshot) -> Settings {
        Settings {
            answer: snap.config().retry.per_try_timeout,
            connect: snap.config().connect_timeout,
            attempts: snap.config().retry.attempts.max(1) as usize,
            may_eject: snap.may_eject(),
            greeting: None,
            password: None,
        }
    }
}

/// Writes each server's requests of the batch at once; a server that cannot take them is broken.
pub(crate) async fn flush(servers: &mut Servers, s: &Settings) {
    for server in &mut servers.0 {
        if server.out.is_empty() {
            continue;
        }
        if !matches!(tokio::time::timeout(s.answer, server.stream.write_all(&server.out)).await, Ok(Ok(()))) {
            server.broken = true;
        }
        server.out.clear();
    }
}

/// An answer that cannot be framed: the connection is out of step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Garbled;

/// Reads until `frame` finds a whole answer at the start of the server's buffer; its length.
pub(crate) async fn frame(
    server: &mut Server,
    frame: &impl Fn(&[u8]) -> Result<Option<usize>, Garbled>,
) -> Result<usize, &'static str> {
    loop {
        if let Some(n) = frame(&server.buf).map_err(|_| "server answer garbled")? {
            return Ok(n);
        }
        server.buf.reserve(4096);
        match server.stream.read_buf(&mut server.buf).await {
            Ok(0) | Err(_) => return Err("server connection lost"),
            Ok(_) => {}
        }
    }
}

/// Runs `read` (which appends one answer to `out`) within `timeout`. A server that failed in this
/// batch gives none: it is marked broken, its later answers are not waited for, and its connection
/// is dropped at the batch's end.
pub(crate) async fn answer_into(
    server: &mut Server,
    timeout: Duration,
    out: &mut Vec<u8>,
    read: impl AsyncFnOnce(&mut Server, &mut Vec<u8>) -> Result<(), &'static str>,
) -> Result<(), &'static str> {
    if server.broken {
        return Err("server connection lost");
    }
    let result = tokio::time::timeout(timeout, read(server, out)).await.unwrap_or(Err("server timeout"));
    if result.is_err() {
        server.broken = true;
    }
    result
}

/// Waits for a server's answer as a try waits for an HTTP worker's response headers: the server
/// counts as awaited meanwhile, and an answer is its sign of life. A server that answers nothing
/// for the pool's stall window (`[pool.passive] stall_ms`) while commands wait on it is stalled,
/// and new commands go around it, as for an HTTP worker.
pub(crate) async fn awaiting<T, E>(w: &Arc<WorkerState>, answer: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    let _waiting = w.await_headers(Instant::now());
    let result = answer.await;
    if result.is_ok() {
        w.headers_arrived(Instant::now());
    }
    result
}

/// A key's hash on the batch's table (recorded in the pool's recent keys, for the dashboard and
/// the remapped share), or `None` when the strategy does not place this key by hash.
#[derive(Clone, Copy)]
pub(crate) struct Placed(pub(crate) Option<u64>);

impl Placed {
    pub(crate) fn of(pool: &Pool, snap: &Snapshot, key: &[u8]) -> Placed {
        let policy = snap.policy();
        if !policy.strategy().hashes_key(key) {
            return Placed(None);
        }
        let hash = policy.key_hash(key);
        pool.record_key(hash);
        if let Some(hot) = snap.hot() {
            hot.observe(hash, &String::from_utf8_lossy(key));
        }
        Placed(Some(hash))
    }
}

pub(crate) fn pool_of(shared: &Shared, index: usize) -> Option<Arc<Pool>> {
    shared.front.routing.load().pools.get(index).cloned()
}

/// Where a key goes on the batch's table, skipping `tried`, and why.
pub(crate) fn pick(pool: &Pool, snap: &Snapshot, hash: Placed, tried: &[usize], now: Instant) -> Option<usize> {
    let d = snap.decide(hash.0, tried, now)?;
    let outcome = match d.owner {
        _ if !tried.is_empty() => Outcome::Retry,
        None => Outcome::Unkeyed,
        Some(o) if o == d.node => Outcome::Owner,
        Some(_) => Outcome::Unavailable,
    };
    pool.metrics.outcome(outcome);
    Some(d.node)
}

/// This client's connection to `w` (its index), made now if needed; a connect that fails is
/// counted against the server.
pub(crate) async fn connect(servers: &mut Servers, w: &WorkerState, s: &Settings) -> Option<usize> {
    if let Some(i) = servers.find(w.address) {
        return (!servers.0[i].broken).then_some(i);
    }
    let open = async {
        let mut stream = TcpStream::connect(w.address).await?;
        let _ = stream.set_nodelay(true);
        if let Some(greeting) = &s.greeting {
            // Redis's AUTH or HELLO: one whole reply, a status or (HELLO's) a map.
            stream.write_all(greeting).await?;
            let mut answer = Vec::new();
            let mut chunk = [0u8; 1024];
            while !matches!(crate::resp::codec::reply_len(&answer), Ok(Some(_))) && answer.len() < 64 * 1024 {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                answer.extend_from_slice(&chunk[..n]);
            }
            if !(answer.starts_with(b"+") || answer.starts_with(b"%")) {
                let first = answer.split(|&b| b == b'\n').next().unwrap_or_default();
                tracing::warn!(server = %w.address, answer = %String::from_utf8_lossy(first).trim_end(), "the server refused the proxy's greeting (AUTH or HELLO)");
                return Err(std::io::Error::other("refused the proxy's greeting"));
            }
        }
        Ok::<TcpStream, std::io::Error>(stream)
    };
    match tokio::time::timeout(s.connect, open).await {
        Ok(Ok(stream)) => {
            servers.0.push(Server {
                addr: w.address,
                stream,
                buf: BytesMut::with_capacity(4096),
                out: Vec::new(),
                broken: false,
            });
            Some(servers.0.len() - 1)
        }
        _ => {
            w.metrics.connect_errors.fetch_add(1, Relaxed);
            failed(w, s);
            None
        }
    }
}

/// The server for a key: its placement on the batch's table, walking its ranking past servers
/// that cannot be reached (nothing was sent to them), up to the pool's attempts. Returns the
/// connection's index and the node; `None` (counted as no worker) when none could be reached.
pub(crate) async fn place(
    pool: &Pool,
    snap: &Snapshot,
    servers: &mut Servers,
    s: &Settings,
    hash: Placed,
    now: Instant,
) -> Option<(usize, usize)> {
    let mut tried = Vec::new();
    while tried.len() < s.attempts {
        let Some(node) = pick(pool, snap, hash, &tried, now) else { break };
        let w = &snap.workers()[node];
        match connect(servers, w, s).await {
            Some(server) => return Some((server, node)),
            None => {
                w.metrics.retries.fetch_add(1, Relaxed);
                tried.push(node);
            }
        }
    }
    pool.metrics.no_worker.fetch_add(1, Relaxed);
    None
}

/// Counts a failure of `w` (passive ejection).
pub(crate) fn failed(w: &WorkerState, s: &Settings) {
    w.metrics.record_class(None);
    if w.observe_failure(s.may_eject, Instant::now()).is_some() {
        w.metrics.ejections.fetch_add(1, Relaxed);
    }
}

pub(crate) fn succeeded(w: &WorkerState, started: Instant) {
    w.metrics.record_latency(started.elapsed());
    w.metrics.record_class(Some(200));
    w.observe_success();
}

/// A client connection of a cache listener: its socket, what it sent not yet served, the answers
/// not yet written, and its connections to the servers.
pub(crate) struct Client {
    stream: TcpStream,
    stop: tokio::sync::watch::Receiver<bool>,
    pub(crate) input: BytesMut,
    pub(crate) out: Vec<u8>,
    pub(crate) servers: Servers,
    /// Connections used one exchange at a time, outside the batches (the warm-up route's).
    pub(crate) side: Servers,
    /// Which replica of a hot key the next read takes.
    pub(crate) turn: usize,
}

impl Client {
    pub(crate) fn new(stream: TcpStream, shared: &Shared) -> Client {
        let _ = stream.set_nodelay(true);
        Client {
            stream,
            stop: shared.stop_accepting.subscribe(),
            input: BytesMut::with_capacity(4096),
            out: Vec::with_capacity(4096),
            servers: Servers::default(),
            side: Servers::default(),
            turn: 0,
        }
    }

    /// Writes the answers gathered; `false` when the client is gone.
    pub(crate) async fn reply(&mut self) -> bool {
        if self.out.is_empty() {
            return true;
        }
        let ok = self.stream.write_all(&self.out).await.is_ok();
        self.out.clear();
        ok
    }

    /// Reads more of the client's; `false` when it closed, or the gateway stops.
    pub(crate) async fn read(&mut self) -> bool {
        self.input.reserve(4096);
        let read = tokio::select! {
            r = self.stream.read_buf(&mut self.input) => r,
            _ = self.stop.wait_for(|s| *s) => return false,
        };
        matches!(read, Ok(n) if n > 0)
    }

    /// Reads and drops `n` bytes of the client's (a refused data block), without holding them.
    pub(crate) async fn discard(&mut self, mut n: usize) -> bool {
        let here = n.min(self.input.len());
        self.input.advance(here);
        n -= here;
        let mut scratch = [0u8; 8192];
        while n > 0 {
            let want = n.min(scratch.len());
            match self.stream.read(&mut scratch[..want]).await {
                Ok(0) | Err(_) => return false,
                Ok(got) => n -= got,
            }
        }
        true
    }
}

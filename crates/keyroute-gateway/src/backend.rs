//! A cache listener's side of its pool's servers: the connections a client connection's batches
//! use (shared by the thread's clients: see the `pipe` module) and its own side connections, the
//! requests of a pipelined batch gathered per server and submitted at once, and the placement and
//! accounting of each command. Shared by the memcached and Redis listeners, which differ only in
//! their protocol.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::copies::Copies;
use crate::metrics::Outcome;
use crate::pipe::{Pipe, Reader, Registry, peer_closed};
use crate::pool::{Pool, Snapshot, WorkerState};
use crate::state::Shared;

/// A client connection's way to one server, with the requests of the batch being made for it.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    link: Link,
    pub(crate) out: Vec<u8>,
    /// It failed in this batch: its later answers are not waited for, and it is dropped after.
    pub(crate) broken: bool,
}

enum Link {
    /// A connection of this client's own (the side connections of the warm-up and fill routes,
    /// used one exchange at a time).
    Own { stream: TcpStream, buf: BytesMut },
    /// The thread's shared connection: the ticket of this batch's requests, and the read side
    /// while it is this client's turn.
    Shared { pipe: Arc<Pipe>, ticket: Option<u64>, turn: Option<tokio::sync::OwnedMutexGuard<Reader>> },
}

impl Server {
    /// What has been read of the server's answers and not yet consumed (on a shared connection,
    /// only during this client's turn: see [`Server::begin`]).
    pub(crate) fn buffered(&self) -> &[u8] {
        match &self.link {
            Link::Own { buf, .. } => buf,
            Link::Shared { turn: Some(r), .. } => &r.buf,
            Link::Shared { .. } => &[],
        }
    }

    /// Drops the first `n` bytes read (an answer taken).
    pub(crate) fn consume(&mut self, n: usize) {
        match &mut self.link {
            Link::Own { buf, .. } => buf.advance(n),
            Link::Shared { turn: Some(r), .. } => r.buf.advance(n),
            Link::Shared { .. } => {}
        }
    }

    /// On a shared connection, waits for this batch's turn to read.
    async fn begin(&mut self) -> Result<(), &'static str> {
        if let Link::Shared { pipe, ticket, turn } = &mut self.link
            && turn.is_none()
        {
            let t = ticket.ok_or("server connection lost")?;
            *turn = Some(pipe.turn(t).await.map_err(|_| "server connection lost")?);
        }
        Ok(())
    }

    /// Reads more of the server's answers.
    async fn fill(&mut self) -> Result<(), &'static str> {
        let read = match &mut self.link {
            Link::Own { stream, buf } => {
                buf.reserve(4096);
                stream.read_buf(buf).await
            }
            Link::Shared { pipe, turn: Some(r), .. } => pipe.read(&mut r.buf).await,
            Link::Shared { .. } => return Err("server connection lost"),
        };
        match read {
            Ok(0) | Err(_) => Err("server connection lost"),
            Ok(_) => Ok(()),
        }
    }

    /// The server failed in this batch: on a shared connection, every client waiting on it fails
    /// too (the connection is out of step).
    fn fail(&mut self) {
        self.broken = true;
        if let Link::Shared { pipe, ticket, turn } = &mut self.link {
            pipe.poison();
            *ticket = None;
            *turn = None;
        }
    }

    /// This batch's answers on this server are read: the turn passes to the next client. A
    /// ticket whose answers were never read leaves the connection out of step, so it is poisoned
    /// instead.
    pub(crate) fn release(&mut self) {
        if let Link::Shared { pipe, ticket, turn } = &mut self.link
            && let Some(t) = ticket.take()
        {
            if turn.take().is_some() {
                pipe.pass(t);
            } else {
                pipe.poison();
            }
        }
    }

    /// Writes the requests gathered now, on a connection of this client's own (the side
    /// connections); `false` when it failed.
    pub(crate) async fn send_now(&mut self, timeout: Duration) -> bool {
        let Link::Own { stream, .. } = &mut self.link else { return false };
        let ok = matches!(tokio::time::timeout(timeout, stream.write_all(&self.out)).await, Ok(Ok(())));
        self.out.clear();
        if !ok {
            self.broken = true;
        }
        ok
    }

    /// Whether this connection cannot take the batch's requests: it failed, or (between
    /// batches) its server closed it, in which case a new one is opened and the request is
    /// never lost to a connection that was already gone (issue 31).
    fn dead(&self) -> bool {
        self.broken
            || match &self.link {
                Link::Shared { pipe, ticket: None, .. } => pipe.closed_while_idle(),
                Link::Shared { pipe, .. } => pipe.is_broken(),
                Link::Own { stream, buf } => buf.is_empty() && self.out.is_empty() && peer_closed(stream),
            }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A client gone in the middle of its turn (its task cancelled) leaves the rest of its
        // answers unread.
        if let Link::Shared { pipe, ticket: Some(_), .. } = &self.link {
            pipe.poison();
        }
    }
}

/// A client connection's servers: few (a pool's), so found by a scan. With a registry, they are
/// the thread's shared connections; without, connections of the client's own.
#[derive(Default)]
pub(crate) struct Servers(pub(crate) Vec<Server>, Option<Arc<Registry>>);

impl Servers {
    /// Servers reached over the thread's shared connections.
    pub(crate) fn shared() -> Servers {
        Servers(Vec::new(), Some(Registry::current()))
    }

    pub(crate) fn find(&self, addr: SocketAddr) -> Option<usize> {
        self.0.iter().position(|s| s.addr == addr)
    }

    /// Ends the batch: each turn passes on, and the servers that failed are dropped.
    pub(crate) fn sweep(&mut self) {
        for s in &mut self.0 {
            s.release();
        }
        self.0.retain(|s| !s.broken);
    }

    /// Sets the link to `addr` at `at` (or a new one): its index.
    fn put(&mut self, at: Option<usize>, addr: SocketAddr, link: Link) -> usize {
        let server = Server { addr, link, out: Vec::new(), broken: false };
        match at {
            Some(i) => {
                self.0[i] = server;
                i
            }
            None => {
                self.0.push(server);
                self.0.len() - 1
            }
        }
    }

    /// Frees the batch buffers of an idle client.
    pub(crate) fn idle(&mut self) {
        for s in &mut self.0 {
            s.out = Vec::new();
        }
    }
}

/// A pool's settings that a batch uses.
pub(crate) struct Settings {
    pub(crate) answer: Duration,
    pub(crate) connect: Duration,
    pub(crate) attempts: usize,
    pub(crate) may_eject: bool,
    /// Sent first on every new server connection (Redis's `AUTH`, or `HELLO 3`), whose answer
    /// must be a status (`+OK`) or a map (`HELLO`'s).
    pub(crate) greeting: Option<Arc<[u8]>>,
    /// Whether what the server sent is its whole answer to the greeting (the listener's framing).
    pub(crate) greeting_whole: fn(&[u8]) -> bool,
    /// The servers' password (Redis's `server_password`), which `MIGRATE` gives the new owner.
    pub(crate) password: Option<Arc<str>>,
    /// Where the pool's hot keys have copies (the pool's, across its snapshots).
    pub(crate) copies: Arc<Copies>,
}

impl Settings {
    /// The settings of `pool`, whose snapshot is `snap`.
    pub(crate) fn of(pool: &Pool, snap: &Snapshot) -> Settings {
        Settings {
            copies: crate::copies::of(pool),
            answer: snap.config().retry.per_try_timeout,
            connect: snap.config().connect_timeout,
            attempts: snap.config().retry.attempts.max(1) as usize,
            may_eject: snap.may_eject(),
            greeting: None,
            greeting_whole: |_| true,
            password: None,
        }
    }
}

/// Sends each server's requests of the batch. On shared connections they are submitted together
/// (one ticket per server, in the same order on every connection) and written by each
/// connection's writer with other clients' requests; on the client's own, written now. A server
/// that cannot take them is broken.
pub(crate) async fn flush(servers: &mut Servers, s: &Settings) {
    if let Some(registry) = &servers.1 {
        let _order = registry.submit.lock();
        for server in &mut servers.0 {
            if let Link::Shared { pipe, ticket, .. } = &mut server.link
                && !server.out.is_empty()
            {
                match pipe.submit(&server.out) {
                    Some(t) => *ticket = Some(t),
                    None => server.broken = true,
                }
                server.out.clear();
            }
        }
    }
    for server in &mut servers.0 {
        if !server.out.is_empty() && matches!(server.link, Link::Own { .. }) {
            server.send_now(s.answer).await;
        }
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
    server.begin().await?;
    loop {
        if let Some(n) = frame(server.buffered()).map_err(|_| "server answer garbled")? {
            return Ok(n);
        }
        server.fill().await?;
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
        server.fail();
    }
    result
}

/// An answer read in the first pass of a batch's answers: where it is in the batch's arena, or
/// why the server gave none.
pub(crate) type Slot = Result<std::ops::Range<usize>, &'static str>;

/// One answer a command of the batch reads: its server (an index into the client's), the node
/// whose stall clock runs while it is awaited (none for an answer only dropped), and how the
/// listener frames it.
pub(crate) struct Read<R> {
    pub(crate) server: usize,
    pub(crate) node: Option<usize>,
    pub(crate) how: R,
}

/// How a listener reads one answer of a server: appended to `out`.
pub(crate) trait Framing {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        s: &'a Settings,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), &'static str>> + Send + 'a;
}

/// Reads every answer of a batch (`reads`: each command's, in the client's order) into `arena`,
/// server by server, before any is used: a shared connection's turn is then held only while this
/// client's answers on it are read, never while it waits on another server, so a slow server
/// holds up only the commands sent to it. One slot per read, in `reads`' order.
pub(crate) async fn read_all<R: Framing>(
    snap: &Snapshot,
    servers: &mut Servers,
    s: &Settings,
    reads: &[Read<R>],
    arena: &mut Vec<u8>,
) -> Vec<Slot> {
    let mut slots: Vec<Slot> = vec![Err("server connection lost"); reads.len()];
    let mut order: Vec<usize> = Vec::new();
    for r in reads {
        if !order.contains(&r.server) {
            order.push(r.server);
        }
    }
    for server in order {
        for (r, slot) in reads.iter().zip(slots.iter_mut()).filter(|(r, _)| r.server == server) {
            let start = arena.len();
            let answer = r.how.read(&mut servers.0[server], s, arena);
            let result = match r.node.and_then(|n| snap.workers().get(n)) {
                Some(w) => awaiting(w, answer).await,
                None => answer.await,
            };
            *slot = match result {
                Ok(()) => Ok(start..arena.len()),
                Err(why) => {
                    arena.truncate(start);
                    Err(why)
                }
            };
        }
        servers.0[server].release();
    }
    slots
}

/// Waits for a server's answer as a try waits for an HTTP worker's response headers: the server
/// counts as awaited meanwhile, and an answer is its sign of life. A server that answers nothing
/// for the pool's stall window (`[pool.passive] stall_ms`) while commands wait on it is stalled,
/// and new commands go around it, as for an HTTP worker.
pub(crate) async fn awaiting<T, E>(w: &Arc<WorkerState>, answer: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    let _waiting = w.awaiting(Instant::now());
    let result = answer.await;
    if result.is_ok() {
        w.answered(Instant::now());
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

/// The pool a cache listener serves, by its name: a reload may reorder the pools, never rename
/// the listener's.
pub(crate) fn pool_of(shared: &Shared, config: &crate::config::CacheListener) -> Option<Arc<Pool>> {
    shared.fleet.pool(&config.pool_name)
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
    let at = servers.find(w.address);
    if let Some(i) = at {
        if servers.0[i].broken {
            return None;
        }
        if !servers.0[i].dead() {
            return Some(i);
        }
        // The shared connection failed in another client's batch: this one takes the new one
        // (in place: the batch's commands name their server by its index).
    }
    let shared = servers.1.as_ref().and_then(|r| r.get(w.address, &s.greeting));
    if let Some(pipe) = shared {
        return Some(servers.put(at, w.address, Link::Shared { pipe, ticket: None, turn: None }));
    }
    let open = async {
        let mut stream = TcpStream::connect(w.address).await?;
        let _ = stream.set_nodelay(true);
        if let Some(greeting) = &s.greeting {
            // Redis's AUTH or HELLO: one whole reply, a status or (HELLO's) a map.
            stream.write_all(greeting).await?;
            let mut answer = Vec::new();
            let mut chunk = [0u8; 1024];
            while !(s.greeting_whole)(&answer) && answer.len() < 64 * 1024 {
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
            let link = match &servers.1 {
                Some(registry) => {
                    // Another client may have opened one meanwhile: one connection per server.
                    let pipe = registry.get(w.address, &s.greeting).unwrap_or_else(|| {
                        let pipe = Pipe::new(w.address, stream, s.answer);
                        registry.put(s.greeting.clone(), &pipe);
                        pipe
                    });
                    Link::Shared { pipe, ticket: None, turn: None }
                }
                None => Link::Own { stream, buf: BytesMut::with_capacity(4096) },
            };
            Some(servers.put(at, w.address, link))
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

/// A write of `hash`'s key was acknowledged by the server of node `writer`: once no fill of a copy
/// of it is landing, the copies on the other servers that may hold one are deleted (`delete`: the
/// listener's command for it), over the client's side connections, each deletion acknowledged
/// before the client is answered. See the `pool::copies` module: a fill that read the key before
/// this write either drops its copy or lands before these deletes.
pub(crate) async fn delete_copies<R: Framing>(
    snap: &Snapshot,
    side: &mut Servers,
    s: &Settings,
    hash: u64,
    writer: usize,
    delete: &[u8],
    how: &R,
) {
    if snap.hot().is_none() {
        return;
    }
    let holders = s.copies.written(hash, Instant::now()).await;
    let writer = snap.workers().get(writer).map(|w| w.address);
    for addr in holders.into_iter().filter(|a| Some(*a) != writer) {
        let Some(w) = snap.workers().iter().find(|w| w.address == addr) else { continue };
        let Some(i) = connect(side, w, s).await else { continue };
        side.0[i].out.extend_from_slice(delete);
        let mut dropped = Vec::new();
        if !side.0[i].send_now(s.answer).await || how.read(&mut side.0[i], s, &mut dropped).await.is_err() {
            side.0[i].broken = true;
        }
    }
    side.sweep();
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
            input: BytesMut::new(),
            out: Vec::new(),
            servers: Servers::shared(),
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

    /// Reads more of the client's; `false` when it closed, or the gateway stops. A client with
    /// nothing unread holds no buffer while it waits (an idle client costs its socket and this
    /// task, not buffers).
    ///
    /// Once the gateway stops, what the client had already sent is still read and served (its
    /// commands are answered, then the connection closes when nothing more is there): a stop
    /// never drops a command that reached the socket, and never resets a connection that has
    /// unread bytes.
    pub(crate) async fn read(&mut self) -> bool {
        if *self.stop.borrow() {
            return self.read_now();
        }
        if self.input.is_empty() {
            self.input = BytesMut::new();
            self.out = Vec::new();
            self.servers.idle();
            let ready = tokio::select! {
                biased;
                r = self.stream.readable() => Some(r),
                _ = self.stop.wait_for(|s| *s) => None,
            };
            match ready {
                None => return self.read_now(),
                Some(Err(_)) => return false,
                Some(Ok(())) => {}
            }
        }
        self.input.reserve(4096);
        loop {
            match keyroute_http1::buf::read_draining(&self.stream, &mut self.input) {
                Ok(0) => return false,
                Ok(_) => return true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return false,
            }
            let ready = tokio::select! {
                biased;
                r = self.stream.readable() => Some(r),
                _ = self.stop.wait_for(|s| *s) => None,
            };
            match ready {
                None => return self.read_now(),
                Some(Err(_)) => return false,
                Some(Ok(())) => {}
            }
        }
    }

    /// After the stop: what the kernel holds for the socket now, without waiting; `false` when it
    /// holds nothing (the connection then closes). Read from the socket itself, not through the
    /// runtime's readiness, which can lag bytes that have already arrived: a command the client
    /// finished sending is never taken for one still on its way.
    fn read_now(&mut self) -> bool {
        use std::io::Read as _;
        let mut chunk = [0u8; 4096];
        match (&*socket2::SockRef::from(&self.stream)).read(&mut chunk) {
            Ok(n) if n > 0 => {
                self.input.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// Reads and drops `n` bytes of the client's (a refused data block), without holding them.
    pub(crate) async fn discard(&mut self, mut n: usize) -> bool {
        let here = n.min(self.input.len());
        self.input.advance(here);
        n -= here;
        // On the heap: an array here would make every connection's task this much larger.
        let mut scratch = vec![0u8; n.min(8192)];
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

//! A memcached proxy listener (`protocol = "memcached"`): memcached's text protocol in front of
//! a pool of memcached servers, placed by the pool's strategy (every keyroute strategy, and the
//! compatibility modes: with `twemproxy` a nutcracker pool's servers own the same keys).
//!
//! # How a connection is served
//!
//! Commands are read as the client pipelines them and answered in order. Each client connection
//! holds its own connection to each server it needed, so a client's commands reach a server in
//! the client's order (as with twemproxy's per-server connections, minus their sharing).
//!
//! - A one-key command goes to the server [`Snapshot::decide`] picks for the key: its owner, or,
//!   when the owner is unhealthy, ejected or draining, the next server of the key's ranking
//!   (keyroute's failover: only that server's keys move, where twemproxy's `auto_eject_hosts`
//!   rebuilds its ring over the live servers and moves others' keys too).
//! - A server that cannot be reached is counted as a failure (passive ejection, as for HTTP
//!   workers) and the command tries the next server of the ranking, up to the pool's
//!   `retry.attempts`: nothing was sent, so no write is applied twice. A server that fails after
//!   the command was sent (no answer within `retry.per_try_timeout_ms`, a closed connection)
//!   answers the client `SERVER_ERROR`: the command may have been applied.
//! - `get`, `gets`, `gat` and `gats` with several keys are split by server: every server's part
//!   is sent before any answer is read (the servers work in parallel), and the values are
//!   returned in the client's order under one `END`. A server that fails leaves its keys out (a
//!   miss, as mcrouter does), counted.
//! - `noreply` and meta quiet mode (`q`): the proxy follows the command with `mn` and reads the
//!   server up to its `MN`, so it always knows where the answer ends. Under `noreply` nothing is
//!   sent to the client; in quiet mode what the server did send (a failure) is passed on.
//!
//! Limits: keys of 1 to 250 bytes without spaces or control bytes, data blocks up to the
//! listener's `max_item_bytes` (memcached's `-I`, 1 MiB by default; a larger one is skipped and
//! answered `SERVER_ERROR object too large for cache`, as memcached does), command lines of
//! 64 KiB. Every refusal is listed in [`codec`].

pub(crate) mod codec;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use self::codec::{Answer, Command, Refused};
use crate::config::CacheListener;
use crate::metrics::Outcome;
use crate::pool::{Pool, WorkerState};
use crate::state::Shared;

/// A connection to one server, held by one client connection.
struct Server {
    stream: TcpStream,
    buf: BytesMut,
}

/// Why a server gave no answer.
#[derive(Debug)]
enum Failure {
    /// No connection: nothing was sent.
    Connect,
    /// Sent, and then no (whole) answer.
    Answer(&'static str),
}

/// Serves one client connection until it closes, sends `quit`, or the gateway stops.
pub(crate) async fn serve<H: Send + 'static>(
    mut client: TcpStream,
    shared: Arc<Shared>,
    config: CacheListener,
    _held: H,
) {
    let _ = client.set_nodelay(true);
    let mut stop = shared.stop_accepting.subscribe();
    let mut input = BytesMut::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut servers: HashMap<SocketAddr, Server> = HashMap::new();
    loop {
        // Answer every whole command buffered, then write the answers at once.
        loop {
            let Some((n, line)) = codec::line(&input) else {
                if input.len() > codec::MAX_LINE {
                    out.extend_from_slice(b"CLIENT_ERROR line too long\r\n");
                    let _ = client.write_all(&out).await;
                    return;
                }
                break;
            };
            let line = line.to_vec();
            let parsed = codec::parse(&line, config.max_item_bytes);
            match parsed {
                Err(Refused::TooLarge { skip }) => {
                    out.extend_from_slice(&Refused::TooLarge { skip }.line());
                    input.advance(n);
                    if !discard(&mut client, &mut input, skip).await {
                        let _ = client.write_all(&out).await;
                        return;
                    }
                }
                Err(r) => {
                    out.extend_from_slice(&r.line());
                    input.advance(n);
                }
                Ok(Command::Quit) => {
                    let _ = client.write_all(&out).await;
                    return;
                }
                Ok(Command::Version) => {
                    out.extend_from_slice(format!("VERSION keyroute-{}\r\n", env!("CARGO_PKG_VERSION")).as_bytes());
                    input.advance(n);
                }
                Ok(Command::MetaNoop) => {
                    out.extend_from_slice(b"MN\r\n");
                    input.advance(n);
                }
                Ok(Command::Keyed { key, data, quiet, answer }) => {
                    // The whole command (line and data) must be here before it is sent.
                    let total = n + data.map_or(0, |d| d + 2);
                    if input.len() < total {
                        break;
                    }
                    if data.is_some_and(|d| &input[n + d..total] != b"\r\n") {
                        out.extend_from_slice(b"CLIENT_ERROR bad data chunk\r\n");
                        let _ = client.write_all(&out).await;
                        return;
                    }
                    let request = input.split_to(total);
                    let Some(pool) = pool_of(&shared, config.pool) else {
                        out.extend_from_slice(b"SERVER_ERROR no pool\r\n");
                        continue;
                    };
                    one_key(&pool, &mut servers, &key, &request, quiet, answer, &mut out).await;
                }
                Ok(Command::Retrieve { kind, exptime, keys }) => {
                    let keys: Vec<Vec<u8>> = keys.iter().map(|k| k.to_vec()).collect();
                    let exptime = exptime.map(<[u8]>::to_vec);
                    input.advance(n);
                    let Some(pool) = pool_of(&shared, config.pool) else {
                        out.extend_from_slice(b"SERVER_ERROR no pool\r\n");
                        continue;
                    };
                    retrieve(&pool, &mut servers, kind, exptime.as_deref(), &keys, &mut out).await;
                }
            }
        }
        if !out.is_empty() {
            if client.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        input.reserve(4096);
        let read = tokio::select! {
            r = client.read_buf(&mut input) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn pool_of(shared: &Shared, index: usize) -> Option<Arc<Pool>> {
    shared.front.routing.load().pools.get(index).cloned()
}

/// Reads and drops `n` bytes of the client's (a refused data block), without holding them.
async fn discard(client: &mut TcpStream, input: &mut BytesMut, mut n: usize) -> bool {
    let here = n.min(input.len());
    input.advance(here);
    n -= here;
    let mut scratch = [0u8; 8192];
    while n > 0 {
        let want = n.min(scratch.len());
        match client.read(&mut scratch[..want]).await {
            Ok(0) | Err(_) => return false,
            Ok(got) => n -= got,
        }
    }
    true
}

/// The server for a key, skipping `tried`: its node index and state.
fn pick(pool: &Pool, key: &[u8], tried: &[usize]) -> Option<(usize, Arc<WorkerState>, Outcome)> {
    let snap = pool.snapshot();
    let hash = snap.policy().key_hash(key);
    let keyed = snap.policy().strategy().hashes_key(key);
    if keyed {
        pool.record_key(hash);
    }
    let now = Instant::now();
    let d = snap.decide(keyed.then_some(hash), tried, now)?;
    let outcome = match (d.owner, d.spill) {
        _ if !tried.is_empty() => Outcome::Retry,
        (None, _) => Outcome::Unkeyed,
        (Some(o), _) if o == d.node => Outcome::Owner,
        _ => Outcome::Unavailable,
    };
    Some((d.node, Arc::clone(&snap.workers()[d.node]), outcome))
}

/// The connection to `w` this client holds, made if needed.
async fn connection<'a>(
    servers: &'a mut HashMap<SocketAddr, Server>,
    w: &WorkerState,
    timeout: Duration,
) -> Option<&'a mut Server> {
    match servers.entry(w.address) {
        std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
        std::collections::hash_map::Entry::Vacant(e) => {
            let stream = tokio::time::timeout(timeout, TcpStream::connect(w.address)).await.ok()?.ok()?;
            let _ = stream.set_nodelay(true);
            Some(e.insert(Server { stream, buf: BytesMut::with_capacity(4096) }))
        }
    }
}

/// Sends `request` (and `mn` after it when `quiet`), and reads one answer (or, when `quiet`,
/// whatever comes before `MN`).
async fn exchange(
    server: &mut Server,
    request: &[u8],
    retrieval: bool,
    answer: Answer,
    quiet: bool,
    timeout: Duration,
) -> Result<Vec<u8>, Failure> {
    let send = async {
        server.stream.write_all(request).await?;
        if quiet {
            server.stream.write_all(b"mn\r\n").await?;
        }
        Ok::<(), std::io::Error>(())
    };
    match tokio::time::timeout(timeout, send).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(Failure::Answer("server connection lost")),
        Err(_) => return Err(Failure::Answer("server timeout")),
    }
    tokio::time::timeout(timeout, read_answer(server, retrieval, answer, quiet))
        .await
        .unwrap_or(Err(Failure::Answer("server timeout")))
}

/// Sends the first part of an exchange only (a multi-get's), so that every server works at once.
async fn send_only(server: &mut Server, request: &[u8], timeout: Duration) -> bool {
    matches!(tokio::time::timeout(timeout, server.stream.write_all(request)).await, Ok(Ok(())))
}

async fn read_answer(server: &mut Server, retrieval: bool, answer: Answer, quiet: bool) -> Result<Vec<u8>, Failure> {
    let mut got = Vec::new();
    loop {
        if quiet && server.buf.starts_with(b"MN\r\n") {
            server.buf.advance(4);
            return Ok(got);
        }
        let garbled = Failure::Answer("server answer garbled");
        match codec::answer_len(&server.buf, retrieval, answer).map_err(|_| garbled)? {
            Some(n) if !quiet => return Ok(server.buf.split_to(n).to_vec()),
            Some(n) => got.extend_from_slice(&server.buf.split_to(n)),
            None => {
                server.buf.reserve(4096);
                match server.stream.read_buf(&mut server.buf).await {
                    Ok(0) | Err(_) => return Err(Failure::Answer("server connection lost")),
                    Ok(_) => {}
                }
            }
        }
    }
}

/// A command of one key: sent to its server (walking the ranking past servers that cannot be
/// reached), its answer appended to `out`.
async fn one_key(
    pool: &Pool,
    servers: &mut HashMap<SocketAddr, Server>,
    key: &[u8],
    request: &[u8],
    quiet: bool,
    answer: Answer,
    out: &mut Vec<u8>,
) {
    let snap = pool.snapshot();
    let (attempts, timeout, connect_timeout) =
        (snap.config().retry.attempts.max(1), snap.config().retry.per_try_timeout, snap.config().connect_timeout);
    let may_eject = snap.may_eject();
    drop(snap);
    let mut tried = Vec::new();
    while tried.len() < attempts as usize {
        let Some((node, w, outcome)) = pick(pool, key, &tried) else { break };
        pool.metrics.outcome(outcome);
        let started = Instant::now();
        let result = match connection(servers, &w, connect_timeout).await {
            None => Err(Failure::Connect),
            Some(server) => exchange(server, request, false, answer, quiet, timeout).await,
        };
        w.metrics.record_latency(started.elapsed());
        match result {
            Ok(a) => {
                w.metrics.record_class(Some(200));
                w.observe_success();
                // `noreply`: nothing to the client; quiet meta: what the server said.
                if !(quiet && answer == Answer::Line) {
                    out.extend_from_slice(&a);
                }
                return;
            }
            Err(f) => {
                servers.remove(&w.address);
                w.metrics.record_class(None);
                if w.observe_failure(may_eject, Instant::now()).is_some() {
                    w.metrics.ejections.fetch_add(1, Relaxed);
                }
                match f {
                    Failure::Connect => {
                        w.metrics.connect_errors.fetch_add(1, Relaxed);
                        w.metrics.retries.fetch_add(1, Relaxed);
                        tried.push(node);
                    }
                    Failure::Answer(why) => {
                        out.extend_from_slice(format!("SERVER_ERROR {why}\r\n").as_bytes());
                        return;
                    }
                }
            }
        }
    }
    pool.metrics.no_worker.fetch_add(1, Relaxed);
    out.extend_from_slice(b"SERVER_ERROR no server available\r\n");
}

/// `get`/`gets`/`gat`/`gats`: split by server, sent to all, merged in the client's order.
async fn retrieve(
    pool: &Pool,
    servers: &mut HashMap<SocketAddr, Server>,
    kind: codec::Retrieval,
    exptime: Option<&[u8]>,
    keys: &[Vec<u8>],
    out: &mut Vec<u8>,
) {
    let snap = pool.snapshot();
    let (timeout, connect_timeout) = (snap.config().retry.per_try_timeout, snap.config().connect_timeout);
    let may_eject = snap.may_eject();
    drop(snap);
    let verb: &[u8] = match kind {
        codec::Retrieval::Get => b"get",
        codec::Retrieval::Gets => b"gets",
        codec::Retrieval::Gat => b"gat",
        codec::Retrieval::Gats => b"gats",
    };
    // Each server's keys, in the client's order; servers in the order first needed.
    let mut parts: Vec<(Arc<WorkerState>, Vec<u8>)> = Vec::new();
    for key in keys {
        let Some((_, w, outcome)) = pick(pool, key, &[]) else {
            pool.metrics.no_worker.fetch_add(1, Relaxed);
            continue;
        };
        pool.metrics.outcome(outcome);
        let i = match parts.iter().position(|(x, _)| Arc::ptr_eq(x, &w)) {
            Some(i) => i,
            None => {
                let mut line = verb.to_vec();
                if let Some(e) = exptime {
                    line.push(b' ');
                    line.extend_from_slice(e);
                }
                parts.push((w, line));
                parts.len() - 1
            }
        };
        parts[i].1.push(b' ');
        parts[i].1.extend_from_slice(key);
    }
    let started = Instant::now();
    let mut sent = Vec::with_capacity(parts.len());
    for (w, line) in &mut parts {
        line.extend_from_slice(b"\r\n");
        let ok = match connection(servers, w, connect_timeout).await {
            Some(server) => send_only(server, line, timeout).await,
            None => {
                w.metrics.connect_errors.fetch_add(1, Relaxed);
                false
            }
        };
        sent.push(ok);
    }
    let mut answers: HashMap<Vec<u8>, std::collections::VecDeque<Vec<u8>>> = HashMap::new();
    for ((w, _), ok) in parts.iter().zip(sent) {
        let answer = match (ok, servers.get_mut(&w.address)) {
            (true, Some(server)) => tokio::time::timeout(timeout, read_answer(server, true, Answer::Line, false))
                .await
                .unwrap_or(Err(Failure::Answer("server timeout"))),
            _ => Err(Failure::Connect),
        };
        w.metrics.record_latency(started.elapsed());
        match answer {
            Ok(a) => {
                w.metrics.record_class(Some(200));
                w.observe_success();
                for (key, block) in codec::value_blocks(&a) {
                    answers.entry(key.to_vec()).or_default().push_back(block.to_vec());
                }
            }
            Err(_) => {
                // Its keys are misses; the failure is counted and the connection dropped.
                servers.remove(&w.address);
                w.metrics.record_class(None);
                if w.observe_failure(may_eject, Instant::now()).is_some() {
                    w.metrics.ejections.fetch_add(1, Relaxed);
                }
            }
        }
    }
    for key in keys {
        if let Some(block) = answers.get_mut(key).and_then(std::collections::VecDeque::pop_front) {
            out.extend_from_slice(&block);
        }
    }
    out.extend_from_slice(b"END\r\n");
}

//! A memcached proxy listener (`protocol = "memcached"`): memcached's text protocol in front of
//! a pool of memcached servers, placed by the pool's strategy (every keyroute strategy, and the
//! compatibility modes: with `twemproxy` a nutcracker pool's servers own the same keys).
//!
//! # How a connection is served
//!
//! Commands are read as the client pipelines them and served in batches: every whole command
//! buffered is submitted to its server first, then the answers are read, server by server, and
//! written back in the client's order at once. The clients of a thread share one connection per
//! server (nutcracker's model, see the `pipe` module): the requests of many clients reach a server
//! in one write, a client's in its order, and each client reads its own answers when its turn on
//! the connection comes.
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
//!   miss, as mcrouter does), counted; a retrieval of one key is answered `SERVER_ERROR` instead,
//!   like any command of one key.
//! - `noreply` and meta quiet mode (`q`): the proxy follows the command with `mn` and reads the
//!   server up to its `MN`, so it always knows where the answer ends. Under `noreply` nothing is
//!   sent to the client; in quiet mode what the server did send (a failure) is passed on.
//!
//! - **Warm-up on a join** (mcrouter's warm-up route, with `[pool.handoff]`): while a server that
//!   joined is within its handoff window, the keys admitted to it so far go to it, and a `get` of
//!   one key that misses there is read on the key's previous server (`mg`, for its flags and time
//!   to live), answered from there, and added to the joining server (`ms ... ME`, so a write that
//!   got there first wins), counted in `keyroute_pool_warm_fills_total`. A write of such a key
//!   (anything but `mg`) also deletes the previous server's copy (`delete ... noreply`, counted in
//!   `keyroute_pool_warm_invalidations_total`), so that a later miss is never filled with a value
//!   older than the last write the proxy forwarded. Keys not yet admitted stay on their previous
//!   server, reads and writes alike. A multi-key `get` is warmed key by key; `gets` and `gat`
//!   are not (a filled value would carry the new server's CAS, or not the new TTL).
//! - **Hot keys** (with `[pool.hot_keys]`, detected as for HTTP, their replica count growing and
//!   shrinking with their rate): reads of a hot key spread over its replicas (the first of its
//!   ranking), and a miss on a replica is filled from the key's owner as above; a `set` goes to
//!   every replica, and any other write (`cas`, `incr`, `append`, meta...) to the first one, with
//!   the others' copies deleted, so that no replica serves a value older than the last write the
//!   proxy forwarded.
//!
//! Limits: keys of 1 to 250 bytes without spaces or control bytes, data blocks up to the
//! listener's `max_item_bytes` (memcached's `-I`, 1 MiB by default; a larger one is skipped and
//! answered `SERVER_ERROR object too large for cache`, as memcached does), command lines of
//! 64 KiB. Every refusal is listed in [`keyroute_cache_proto::memcache`].

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Buf;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::backend::{
    self, Client, Placed, Read, Server, Servers, Settings, connect, failed, pick, pool_of, succeeded,
};
use crate::config::CacheListener;
use crate::pool::{Pool, Snapshot};
use crate::state::Shared;
use keyroute_cache_proto::memcache::{self as codec, Answer, Command, Refused};

/// The most commands served in one batch.
const BATCH: usize = 1024;

/// A multi-get's key, and (node, previous node) when it is placed on a server within its handoff
/// window.
type MultiKey = (Vec<u8>, Option<(usize, usize)>);

/// A command of the batch, once sent: where its answer comes from.
enum Pending {
    /// Answered by the proxy.
    Ready(&'static [u8]),
    /// Answered by the proxy, with text of its own.
    Owned(Vec<u8>),
    /// One answer from one server (`node` of the batch's snapshot); `noreply` when the client
    /// wants none.
    One { server: usize, node: usize, retrieval: bool, answer: Answer, quiet: bool, noreply: bool },
    /// A multi-get's parts (server, node), and its keys in the client's order.
    /// A `get` of several keys also carries, for each key placed on a server within its handoff
    /// window, that server and the key's previous one: a miss there is filled from it.
    Multi { parts: Vec<(usize, usize)>, keys: Vec<MultiKey> },
    /// A `get` of one key on a server that joined within the handoff window: its answer, and on
    /// a miss the key's previous server's value, filled into the new one (the warm-up route).
    /// `copy`: the key's hash when the server is a hot key's replica and `previous` its owner
    /// (the copy is then one of [`crate::copies`], with a bounded lifetime).
    Warm { server: usize, node: usize, previous: usize, key: Vec<u8>, copy: Option<u64> },
    /// A write of a key (its hash and bytes) in a pool with hot keys, after the command's own
    /// entry: once `node` answered it, the copies other servers may hold are deleted (see
    /// [`backend::delete_copies`]). Reads no answer of its own.
    Written { hash: u64, key: Vec<u8>, node: usize },
    /// An answer read and dropped: an invalidation (`delete KEY noreply` and `mn`, read to its
    /// `MN`), or a hot key's write to a replica other than the one that answers the client.
    Discard { server: usize, answer: Answer, quiet: bool },
}

/// Serves one client connection until it closes, sends `quit`, or the gateway stops.
pub(crate) async fn serve<H: Send + 'static>(stream: TcpStream, shared: Arc<Shared>, config: CacheListener, _held: H) {
    let mut c = Client::new(stream, &shared);
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        // A batch's work is a future of its own, on the heap while it runs: an idle connection's
        // task holds only its client and its read.
        if !Box::pin(batch(&mut c, &shared, &config, &mut pending)).await {
            return;
        }
        // More whole commands than one batch are served before reading.
        let more = codec::line(&c.input).is_some() && !waiting_for_data(&c.input, config.max_item_bytes);
        if !more && !c.read().await {
            return;
        }
    }
}

/// One batch: the whole commands buffered (up to [`BATCH`]) sent, answered and written back;
/// `false` when the connection is to close.
async fn batch(c: &mut Client, shared: &Shared, config: &CacheListener, pending: &mut Vec<Pending>) -> bool {
    let Some(pool) = pool_of(shared, config) else { return false };
    // One snapshot for the batch: its commands are placed on one table.
    let snap = pool.snapshot();
    let settings = Settings::of(&pool, &snap);
    let now = Instant::now();
    let mut close = false;
    while pending.len() < BATCH {
        let Some((n, line)) = codec::line(&c.input) else {
            if c.input.len() > codec::MAX_LINE {
                pending.push(Pending::Ready(b"CLIENT_ERROR line too long\r\n"));
                close = true;
            }
            break;
        };
        match codec::parse(line, config.max_item_bytes) {
            Err(Refused::Unframed) => {
                pending.push(Pending::Owned(Refused::Unframed.line()));
                close = true;
                break;
            }
            Err(refused @ (Refused::TooLarge { skip } | Refused::FormatSkip { skip })) => {
                // The refused command's block is skipped, never read as commands.
                pending.push(Pending::Owned(refused.line()));
                c.input.advance(n);
                if skip > c.input.len() {
                    // The block is skipped as it arrives: the answers so far go out first.
                    finish(&snap, &pool, pending, &mut c.servers, &mut c.side, &settings, now, &mut c.out).await;
                    if !c.reply().await || !c.discard(skip).await {
                        return false;
                    }
                    continue;
                }
                c.input.advance(skip);
            }
            Err(r) => {
                pending.push(Pending::Owned(r.line()));
                c.input.advance(n);
            }
            Ok(Command::Quit) => {
                close = true;
                break;
            }
            Ok(Command::Version) => {
                pending
                    .push(Pending::Owned(format!("VERSION keyroute-{}\r\n", env!("CARGO_PKG_VERSION")).into_bytes()));
                c.input.advance(n);
            }
            Ok(Command::MetaNoop) => {
                pending.push(Pending::Ready(b"MN\r\n"));
                c.input.advance(n);
            }
            Ok(Command::Keyed { key, data, quiet, answer }) => {
                // The whole command (line and data) must be here before it is sent.
                let total = n + data.map_or(0, |d| d + 2);
                if c.input.len() < total {
                    break;
                }
                if data.is_some_and(|d| &c.input[n + d..total] != b"\r\n") {
                    // As memcached: the declared bytes and two more are taken as the block, and
                    // what follows is the next command.
                    pending.push(Pending::Ready(b"CLIENT_ERROR bad data chunk\r\n"));
                    c.input.advance(total);
                    continue;
                }
                let hash = Placed::of(&pool, &snap, &key);
                let request = &c.input[..total];
                let write = !line.starts_with(b"mg ");
                // A write in a pool with hot keys: the copies on its replicas are deleted, in
                // this batch and again once the write is answered (see `pool::copies`).
                let copies = match (snap.hot(), hash.0) {
                    (Some(hot), Some(h)) if write && codec::valid_key(&key) => Some((h, hot.replicas(h))),
                    _ => None,
                };
                // A key whose owner joined within the handoff window goes to it at once, and is
                // moved there from its previous owner before any command runs on it (as the Redis
                // listener's and `keyroute move`'s: they agree on where a key lives).
                let handoff = hash.0.and_then(|h| snap.store_handoff(h, now));
                if let Some((node, previous)) = handoff
                    && codec::valid_key(&key)
                {
                    fill_from(&snap, &pool, &mut c.side, &settings, (&key, None), previous, node, None).await;
                }
                let to = handoff.map(|(node, _)| node);
                let p =
                    send_one(&snap, &pool, &mut c.servers, &settings, (hash, to), request, quiet, answer, now).await;
                // A write during the warm-up deletes the copy on the key's previous server,
                // so that no miss is ever filled with a value older than this write.
                let invalidate = match (&p, hash.0) {
                    (Pending::One { node, .. }, Some(h)) if write => snap.warm_source(h, *node, now),
                    _ => None,
                };
                let writer = match &p {
                    Pending::One { node, .. } => Some(*node),
                    _ => None,
                };
                pending.push(p);
                if let (Some((h, replicas)), Some(node)) = (copies, writer) {
                    delete_copies_now(&snap, &mut c.servers, &settings, h, replicas, node, &key, now, pending).await;
                    pending.push(Pending::Written { hash: h, key: key.to_vec(), node });
                }
                if let Some(previous) = invalidate
                    && codec::valid_key(&key)
                    && let Some(server) = connect(&mut c.servers, &snap.workers()[previous], &settings).await
                {
                    let out = &mut c.servers.0[server].out;
                    out.extend_from_slice(b"delete ");
                    out.extend_from_slice(&key);
                    out.extend_from_slice(b" noreply\r\nmn\r\n");
                    pool.metrics.warm_invalidations.fetch_add(1, Relaxed);
                    pending.push(Pending::Discard { server, answer: Answer::Line, quiet: true });
                }
                c.input.advance(total);
            }
            Ok(Command::Retrieve { kind, exptime, keys }) => {
                let p = match keys.single() {
                    // One key: its server's answer as it is.
                    Some(key) => {
                        let hash = Placed::of(&pool, &snap, key);
                        let request = &c.input[..n];
                        // A hot key's reads take its replicas in turn.
                        let hot = hot_replica(&snap, hash, &mut c.turn, now);
                        let p = match hot {
                            Some(node) => send_to(&snap, &mut c.servers, &settings, node, request).await,
                            None => None,
                        };
                        // Within a handoff, a `get`'s miss on the new owner is read through (below);
                        // `gets` and `gat` move the key first (a filled value would carry the new
                        // server's CAS, or not the new TTL).
                        let handoff = hash.0.and_then(|h| snap.store_handoff(h, now)).filter(|_| p.is_none());
                        if let Some((node, previous)) = handoff
                            && kind != codec::Retrieval::Get
                        {
                            fill_from(&snap, &pool, &mut c.side, &settings, (key, None), previous, node, None).await;
                        }
                        let p = match p {
                            Some(p) => p,
                            None => send_one(
                                &snap,
                                &pool,
                                &mut c.servers,
                                &settings,
                                (hash, handoff.map(|(node, _)| node)),
                                request,
                                false,
                                Answer::Line,
                                now,
                            )
                            .await
                            .retrieval(),
                        };
                        match (p, hash.0) {
                            (Pending::One { server, node, .. }, Some(h)) if kind == codec::Retrieval::Get => {
                                // A joining server warms from the key's previous one; a
                                // hot key's replica from the key's owner.
                                let hot_owner = hot.and_then(|_| snap.policy().owner(h)).filter(|&owner| owner != node);
                                match snap.warm_source(h, node, now).or(hot_owner) {
                                    Some(previous) => Pending::Warm {
                                        server,
                                        node,
                                        previous,
                                        key: key.to_vec(),
                                        // A hot key's replica fills a copy; a joining server, a
                                        // key it now owns.
                                        copy: snap.warm_source(h, node, now).is_none().then_some(h),
                                    },
                                    None => Pending::One {
                                        server,
                                        node,
                                        retrieval: true,
                                        answer: Answer::Line,
                                        quiet: false,
                                        noreply: false,
                                    },
                                }
                            }
                            (p, _) => p,
                        }
                    }
                    None => send_multi(&snap, &pool, &mut c.servers, &settings, kind, exptime, keys, now).await,
                };
                pending.push(p);
                c.input.advance(n);
            }
        }
    }
    finish(&snap, &pool, pending, &mut c.servers, &mut c.side, &settings, now, &mut c.out).await;
    let open = c.reply().await && !close;
    if pending.capacity() > 64 {
        *pending = Vec::new();
    }
    open
}

/// How a memcached answer is framed: a retrieval's (`VALUE` blocks to `END`), its kind, and
/// whether it is a quiet command's (whatever comes before `MN`).
struct Framed {
    retrieval: bool,
    answer: Answer,
    quiet: bool,
}

impl backend::Framing for Framed {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        s: &'a Settings,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), &'static str>> + Send + 'a {
        answer_into(server, self.retrieval, self.answer, self.quiet, s.answer, out)
    }
}

impl Pending {
    /// How many answers this command reads.
    fn parts(&self) -> usize {
        match self {
            Pending::Ready(_) | Pending::Owned(_) | Pending::Written { .. } => 0,
            Pending::One { .. } | Pending::Discard { .. } | Pending::Warm { .. } => 1,
            Pending::Multi { parts, .. } => parts.len(),
        }
    }

    /// Appends the answers this command reads, in order, each with how it is framed (retrieval,
    /// answer kind, quiet).
    fn reads(&self, out: &mut Vec<Read<Framed>>) {
        let read = |server: usize, node: Option<usize>, (retrieval, answer, quiet)| Read {
            server,
            node,
            how: Framed { retrieval, answer, quiet },
        };
        match self {
            Pending::Ready(_) | Pending::Owned(_) | Pending::Written { .. } => {}
            Pending::One { server, node, retrieval, answer, quiet, .. } => {
                out.push(read(*server, Some(*node), (*retrieval, *answer, *quiet)));
            }
            Pending::Discard { server, answer, quiet } => out.push(read(*server, None, (false, *answer, *quiet))),
            Pending::Warm { server, node, .. } => out.push(read(*server, Some(*node), (true, Answer::Line, false))),
            Pending::Multi { parts, .. } => {
                out.extend(parts.iter().map(|&(server, node)| read(server, Some(node), (true, Answer::Line, false))));
            }
        }
    }

    /// The same, its answer read as a retrieval's (`VALUE` blocks to `END`).
    fn retrieval(self) -> Pending {
        match self {
            Pending::One { server, node, answer, quiet, noreply, .. } => {
                Pending::One { server, node, retrieval: true, answer, quiet, noreply }
            }
            other => other,
        }
    }
}

/// Whether the first buffered command is a storage command whose data has not all arrived.
fn waiting_for_data(input: &[u8], max_item: usize) -> bool {
    let Some((n, line)) = codec::line(input) else { return true };
    match codec::parse(line, max_item) {
        Ok(Command::Keyed { data: Some(d), .. }) => input.len() < n + d + 2,
        _ => false,
    }
}

/// A command of one key: queued for its server, walking the key's ranking past servers that
/// cannot be reached (nothing was sent to them).
#[allow(clippy::too_many_arguments)]
async fn send_one(
    snap: &Snapshot,
    pool: &Pool,
    servers: &mut Servers,
    s: &Settings,
    (hash, to): (Placed, Option<usize>),
    request: &[u8],
    quiet: bool,
    answer: Answer,
    now: Instant,
) -> Pending {
    // `to`: the key's new owner within a handoff (placed as usual when it cannot be reached).
    let direct = match to {
        Some(node) => connect(servers, &snap.workers()[node], s).await.map(|server| (server, node)),
        None => None,
    };
    let placed = match direct {
        Some(d) => Some(d),
        None => backend::place(pool, snap, servers, s, hash, now).await,
    };
    let Some((server, node)) = placed else {
        return Pending::Ready(b"SERVER_ERROR no server available\r\n");
    };
    let out = &mut servers.0[server].out;
    out.extend_from_slice(request);
    if quiet {
        out.extend_from_slice(b"mn\r\n");
    }
    // `noreply`: nothing to the client; a quiet meta command: what the server did say.
    let noreply = quiet && answer == Answer::Line;
    Pending::One { server, node, retrieval: false, answer, quiet, noreply }
}

/// `get`/`gets`/`gat`/`gats` of several keys: one request per server, with its keys in the
/// client's order. A server that cannot be reached leaves its keys out (misses).
#[allow(clippy::too_many_arguments)]
async fn send_multi(
    snap: &Snapshot,
    pool: &Pool,
    servers: &mut Servers,
    s: &Settings,
    kind: codec::Retrieval,
    exptime: Option<&[u8]>,
    keys: codec::Keys<'_>,
    now: Instant,
) -> Pending {
    let verb: &[u8] = match kind {
        codec::Retrieval::Get => b"get",
        codec::Retrieval::Gets => b"gets",
        codec::Retrieval::Gat => b"gat",
        codec::Retrieval::Gats => b"gats",
    };
    // (node, its request line)
    let mut lines: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut warm: Vec<MultiKey> = Vec::new();
    for key in keys.iter() {
        let hash = Placed::of(pool, snap, key);
        // Within a handoff the key's new owner, as for one key.
        let owner = hash.0.and_then(|h| snap.store_handoff(h, now)).map(|(node, _)| node);
        let Some(node) = owner.or_else(|| pick(pool, snap, hash, &[], now)) else {
            pool.metrics.no_worker.fetch_add(1, Relaxed);
            warm.push((key.to_vec(), None));
            continue;
        };
        // `gets` and `gat` are not warmed: a filled value would carry the new server's CAS, or
        // no new TTL.
        let previous = match (kind, hash.0) {
            (codec::Retrieval::Get, Some(h)) => snap.warm_source(h, node, now),
            _ => None,
        };
        warm.push((key.to_vec(), previous.map(|p| (node, p))));
        let i = match lines.iter().position(|(n, _)| *n == node) {
            Some(i) => i,
            None => {
                let mut line = verb.to_vec();
                if let Some(e) = exptime {
                    line.push(b' ');
                    line.extend_from_slice(e);
                }
                lines.push((node, line));
                lines.len() - 1
            }
        };
        lines[i].1.push(b' ');
        lines[i].1.extend_from_slice(key);
    }
    let mut parts = Vec::with_capacity(lines.len());
    for (node, line) in lines {
        let Some(server) = connect(servers, &snap.workers()[node], s).await else { continue };
        let out = &mut servers.0[server].out;
        out.extend_from_slice(&line);
        out.extend_from_slice(b"\r\n");
        parts.push((server, node));
    }
    Pending::Multi { parts, keys: warm }
}

/// Writes the batch's requests (one write per server), then reads every answer, in order, into
/// `out`.
#[allow(clippy::too_many_arguments)]
async fn finish(
    snap: &Snapshot,
    pool: &Pool,
    pending: &mut Vec<Pending>,
    servers: &mut Servers,
    side: &mut Servers,
    s: &Settings,
    started: Instant,
    out: &mut Vec<u8>,
) {
    backend::flush(servers, s).await;
    let mut reads: Vec<Read<Framed>> = Vec::with_capacity(pending.len());
    for p in pending.iter() {
        p.reads(&mut reads);
    }
    let mut arena = Vec::new();
    let slots = backend::read_all(snap, servers, s, &reads, &mut arena).await;
    let mut at = 0;
    for p in pending.drain(..) {
        let slot = &slots[at..at + p.parts()];
        at += p.parts();
        match p {
            Pending::Ready(bytes) => out.extend_from_slice(bytes),
            Pending::Owned(bytes) => out.extend_from_slice(&bytes),
            Pending::One { node, noreply, .. } => {
                let w = &snap.workers()[node];
                let mark = out.len();
                match &slot[0] {
                    Ok(range) => {
                        succeeded(w, started);
                        if !noreply {
                            out.extend_from_slice(&arena[range.clone()]);
                        }
                    }
                    Err(why) => server_error(out, mark, w, s, why),
                }
            }
            Pending::Discard { .. } => {}
            Pending::Written { hash, key, node } => {
                let mut delete = b"delete ".to_vec();
                delete.extend_from_slice(&key);
                delete.extend_from_slice(b"\r\n");
                let line = Framed { retrieval: false, answer: Answer::Line, quiet: false };
                backend::delete_copies(snap, side, s, hash, node, &delete, &line).await;
            }
            Pending::Warm { node, previous, key, copy, .. } => {
                let w = &snap.workers()[node];
                let mark = out.len();
                match &slot[0] {
                    Ok(range) => {
                        succeeded(w, started);
                        if &arena[range.clone()] == b"END\r\n" {
                            fill_from(snap, pool, side, s, (&key, copy), previous, node, Some(&mut *out)).await;
                            out.extend_from_slice(b"END\r\n");
                        } else {
                            out.extend_from_slice(&arena[range.clone()]);
                        }
                    }
                    Err(why) => server_error(out, mark, w, s, why),
                }
            }
            Pending::Multi { parts, keys } => {
                let mut answers: Vec<&[u8]> = Vec::with_capacity(parts.len());
                for ((_, node), result) in parts.into_iter().zip(slot) {
                    let w = &snap.workers()[node];
                    match result {
                        Ok(range) => {
                            succeeded(w, started);
                            answers.push(&arena[range.clone()]);
                        }
                        // Its keys are misses; the failure is counted.
                        Err(_) => failed(w, s),
                    }
                }
                // Each server answers its keys in the order they were asked (the client's, restricted
                // to that server), skipping misses: a key's value, if any, is at the head of its
                // server's answer when the keys before it are taken. One look at each server's head
                // per key (a key asked twice is answered twice).
                let blocks: Vec<Vec<(&[u8], &[u8])>> = answers.iter().map(|a| codec::value_blocks(a)).collect();
                let mut heads = vec![0usize; blocks.len()];
                for (key, warm) in &keys {
                    let hit =
                        (0..blocks.len()).find(|&p| blocks[p].get(heads[p]).is_some_and(|(k, _)| *k == key.as_slice()));
                    if let Some(p) = hit {
                        out.extend_from_slice(blocks[p][heads[p]].1);
                        heads[p] += 1;
                    } else if let Some((node, previous)) = *warm {
                        // A miss on a server within its handoff window: the warm-up route.
                        fill_from(snap, pool, side, s, (key, None), previous, node, Some(&mut *out)).await;
                    }
                }
                out.extend_from_slice(b"END\r\n");
            }
        }
    }
    servers.sweep();
}

/// Appends the server's next answer to `out` (or, when `quiet`, whatever comes before `MN`). A
/// server that failed in this batch gives none (see [`backend::answer_into`]).
async fn answer_into(
    server: &mut Server,
    retrieval: bool,
    answer: Answer,
    quiet: bool,
    timeout: Duration,
    out: &mut Vec<u8>,
) -> Result<(), &'static str> {
    let frame = |buf: &[u8]| {
        if quiet && buf.starts_with(b"MN\r\n") {
            return Ok(Some(4));
        }
        codec::answer_len(buf, retrieval, answer).map_err(|_| backend::Garbled)
    };
    backend::answer_into(server, timeout, out, async |server: &mut Server, out: &mut Vec<u8>| {
        loop {
            let n = backend::frame(server, &frame).await?;
            if quiet && server.buffered().starts_with(b"MN\r\n") {
                server.consume(4);
                return Ok(());
            }
            out.extend_from_slice(&server.buffered()[..n]);
            server.consume(n);
            if !quiet {
                return Ok(());
            }
        }
    })
    .await
}

/// A key read from `previous` and added to `joined`: the value on `previous` (read with `mg`, for
/// its flags and remaining time to live), appended to `out` as a `VALUE` block when there is an
/// `out` (a `get`'s miss), and added to `joined` (`ms ... ME`: an add, so that a write that got
/// there first wins), over the client's side connections, outside the batch.
///
/// - **A move** (`copy` is `None`: `joined` is the key's new owner within a handoff window):
///   then deleted from `previous` (`md`), so that the key lives in one place, as `keyroute move`
///   leaves it. memcached has no atomic move: a delete of the key through another connection
///   between the read and the add is undone until the key's TTL ends.
/// - **A hot key's copy** (`copy`: its hash; `previous` is its owner): it lives
///   [`crate::copies::COPY_LIFETIME`] at most, and lands only if no write of the key was
///   answered since the owner was read.
#[allow(clippy::too_many_arguments)]
async fn fill_from(
    snap: &Snapshot,
    pool: &Pool,
    side: &mut Servers,
    s: &Settings,
    (key, copy): (&[u8], Option<u64>),
    previous: usize,
    joined: usize,
    out: Option<&mut Vec<u8>>,
) {
    let hot = snap.hot().zip(copy);
    let fill = hot.map(|(_, h)| s.copies.begin_fill(h, snap.workers()[joined].address, Instant::now()));
    let old = &snap.workers()[previous];
    let Some(p) = connect(side, old, s).await else { return };
    let server = &mut side.0[p];
    server.out.extend_from_slice(b"mg ");
    server.out.extend_from_slice(key);
    server.out.extend_from_slice(b" v f t\r\n");
    backend::flush(side, s).await;
    let mut answer = Vec::new();
    if answer_into(&mut side.0[p], false, Answer::Meta, false, s.answer, &mut answer).await.is_err() {
        failed(old, s);
        side.sweep();
        return;
    }
    // VA <size> f<flags> t<ttl>\r\n<data>\r\n
    let Some((n, head)) = codec::line(&answer) else { return };
    let mut words = head.split(|&b| b == b' ');
    if words.next() != Some(b"VA") {
        return;
    }
    let size = words.next().and_then(|w| std::str::from_utf8(w).ok()).and_then(|w| w.parse::<usize>().ok());
    let (mut flags, mut ttl) = ("0".to_owned(), "0".to_owned());
    for w in words {
        let text = String::from_utf8_lossy(&w[1.min(w.len())..]).into_owned();
        match w.first() {
            Some(b'f') => flags = text,
            // -1: no expiry, which a set says as 0.
            Some(b't') if text != "-1" => ttl = text,
            _ => {}
        }
    }
    let Some(size) = size.filter(|&z| answer.len() >= n + z) else { return };
    let data = &answer[n..n + size];
    if let Some(out) = out {
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.extend_from_slice(format!(" {flags} {size}\r\n").as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    let landing = match (hot, fill) {
        (Some((hot, _)), Some(fill)) => {
            // A copy: at most its lifetime (memcached's 0 is "never"; -1 was read as 0 above).
            let max = crate::copies::COPY_LIFETIME.as_secs();
            ttl = match ttl.parse::<u64>() {
                Ok(t) if (1..=max).contains(&t) => t,
                _ => max,
            }
            .to_string();
            match s.copies.landing(fill).await {
                Some(landing) => Some((hot, landing)),
                None => return,
            }
        }
        _ => None,
    };
    pool.metrics.warm_fills.fetch_add(1, Relaxed);
    let Some(j) = connect(side, &snap.workers()[joined], s).await else { return };
    let server = &mut side.0[j];
    server.out.extend_from_slice(b"ms ");
    server.out.extend_from_slice(key);
    server.out.extend_from_slice(format!(" {size} F{flags} T{ttl} ME q\r\n").as_bytes());
    server.out.extend_from_slice(data);
    server.out.extend_from_slice(b"\r\nmn\r\n");
    backend::flush(side, s).await;
    let mut dropped = Vec::new();
    let added = answer_into(&mut side.0[j], false, Answer::Meta, true, s.answer, &mut dropped).await.is_ok();
    if let Some((_, landing)) = landing {
        s.copies.landed(landing, Instant::now());
    } else if added && let Some(p) = connect(side, old, s).await {
        // Stored, or the new owner had a newer value: the previous one is superseded.
        let server = &mut side.0[p];
        server.out.extend_from_slice(b"md ");
        server.out.extend_from_slice(key);
        server.out.extend_from_slice(b" q\r\nmn\r\n");
        backend::flush(side, s).await;
        let _ = answer_into(&mut side.0[p], false, Answer::Meta, true, s.answer, &mut dropped).await;
    }
    side.sweep();
}

/// A write of a key in a pool with hot keys, sent to `writer`: the copies its replicas may hold
/// (the first `replicas` of its ranking while it is hot, and every server that may still hold one,
/// hot or not) are deleted in the same batch (`delete KEY noreply` and `mn`, whose answers are
/// read and dropped), so that no read after the write on the same connections sees an older
/// copy. Copies are made only by fills from the owner, with a bounded lifetime; a write is never
/// copied, since its result on a replica depends on what that replica held.
#[allow(clippy::too_many_arguments)]
async fn delete_copies_now(
    snap: &Snapshot,
    servers: &mut Servers,
    s: &Settings,
    h: u64,
    replicas: usize,
    writer: usize,
    key: &[u8],
    now: Instant,
    pending: &mut Vec<Pending>,
) {
    let mut nodes: Vec<usize> = snap.policy().ranked(h).take(replicas).filter(|&i| i != writer).collect();
    if snap.hot().is_some() {
        for a in s.copies.holders(h, now) {
            if let Some(i) = snap.workers().iter().position(|w| w.address == a)
                && i != writer
                && !nodes.contains(&i)
            {
                nodes.push(i);
            }
        }
    }
    for node in nodes {
        let Some(server) = connect(servers, &snap.workers()[node], s).await else { continue };
        let out = &mut servers.0[server].out;
        out.extend_from_slice(b"delete ");
        out.extend_from_slice(key);
        out.extend_from_slice(b" noreply\r\nmn\r\n");
        pending.push(Pending::Discard { server, answer: Answer::Line, quiet: true });
    }
}

/// For a hot key (more than one replica), the replica this read takes: the healthy ones of the
/// first of its ranking, in turn per client connection (`turn`).
fn hot_replica(snap: &Snapshot, hash: Placed, turn: &mut usize, now: Instant) -> Option<usize> {
    let h = hash.0?;
    let r = snap.hot()?.replicas(h);
    if r < 2 {
        return None;
    }
    let healthy: Vec<usize> =
        snap.policy().ranked(h).take(r).filter(|&i| snap.state(i, now) == crate::pool::State::Healthy).collect();
    if healthy.is_empty() {
        return None;
    }
    *turn = turn.wrapping_add(1);
    Some(healthy[*turn % healthy.len()])
}

/// A retrieval of one key sent to `node` (`None` when it cannot be reached: the caller places it
/// as usual).
async fn send_to(snap: &Snapshot, servers: &mut Servers, s: &Settings, node: usize, request: &[u8]) -> Option<Pending> {
    let server = connect(servers, &snap.workers()[node], s).await?;
    servers.0[server].out.extend_from_slice(request);
    Some(Pending::One { server, node, retrieval: true, answer: Answer::Line, quiet: false, noreply: false })
}

/// A server's failure to answer, in place of its answer from `mark` on: counted, and told the
/// client as `SERVER_ERROR`.
fn server_error(out: &mut Vec<u8>, mark: usize, w: &crate::pool::WorkerState, s: &Settings, why: &str) {
    out.truncate(mark);
    failed(w, s);
    out.extend_from_slice(b"SERVER_ERROR ");
    out.extend_from_slice(why.as_bytes());
    out.extend_from_slice(b"\r\n");
}

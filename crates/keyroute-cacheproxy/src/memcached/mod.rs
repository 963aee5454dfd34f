//! A memcached proxy listener (`protocol = "memcached"`): memcached's text protocol in front of
//! a pool of memcached servers, placed by the pool's strategy (every keyroute strategy, and the
//! compatibility modes: with `twemproxy` a nutcracker pool's servers own the same keys).
//!
//! # How a connection is served
//!
//! Commands are read as the client pipelines them and served in batches: every whole command
//! buffered is submitted to its server first, then the answers are read, server by server, and
//! written back in the client's order at once. The clients of a thread share one connection per
//! server (nutcracker's model, see [`crate::pipe`]): the requests of many clients reach a server
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
//!   shrinking with their rate): a `get` of one hot key goes where the pool's one steering rule
//!   sends it, as an HTTP request for it would go: the least loaded of its replicas (the first of
//!   its ranking), by the commands in flight on each; a miss on a replica is filled from the
//!   key's owner as above. Every other command of a hot key goes to its owner (`gets` too: its
//!   CAS is its server's), and a write deletes the copies the replicas may hold, so that no replica
//!   serves a value older than the last write the proxy forwarded.
//!
//! - **Replicated pools** (`[pool.replication]`): each key on several servers, written to all
//!   and read with failover; see `replicated`.
//! - **Commands of every server** (`broadcast = true`): `flush_all`, `verbosity`, `stats`; see
//!   `broadcast`.
//!
//! Limits: keys of 1 to 250 bytes without spaces or control bytes, data blocks up to the
//! listener's `max_item_bytes` (memcached's `-I`, 1 MiB by default; a larger one is skipped and
//! answered `SERVER_ERROR object too large for cache`, as memcached does), command lines of
//! 64 KiB. Every refusal is listed in [`keyroute_cache_proto::memcache`].

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::LocalKey;
use std::time::Duration;

use keyroute_cache_proto::memcache::{self as codec, Answer, Command, Refused};

use self::broadcast::Every;
use tokio::time::Instant;

mod broadcast;
mod replicated;

use crate::conn::Lost;
use crate::driver::{Batch, Lists, Placed, Planned, Protocol, failed};
use crate::servers::{Framing, Read, Server, Slot, answer_into as read_answer, flush, frame};

/// The memcached protocol over the driver: one client connection's.
pub(crate) struct Memcached {
    /// The largest data block taken (`max_item_bytes`).
    pub(crate) max_item: usize,
    /// Whether the commands of every server (`flush_all`, `verbosity`, `stats`) are sent to
    /// each server (`broadcast = true`), or refused.
    pub(crate) broadcast: bool,
    /// The class of the command planned last (see [`CLASSES`]).
    pub(crate) class: u16,
    /// A read planned in this batch may be asked again of another server when it is answered
    /// (see [`Pending::reasks`]).
    pub(crate) reask: bool,
}

/// The classes a memcached listener's commands are counted by: each command it takes, and
/// `other` (refused and unknown commands).
pub(crate) const CLASSES: [&str; 24] = [
    "get",
    "gets",
    "gat",
    "gats",
    "set",
    "add",
    "replace",
    "append",
    "prepend",
    "cas",
    "delete",
    "incr",
    "decr",
    "touch",
    "mg",
    "ms",
    "md",
    "ma",
    "mn",
    "version",
    "flush_all",
    "verbosity",
    "stats",
    "other",
];

/// Whether a command line only reads its key, for a route's `read_pool`: `get`, and `mg` without
/// the flags that write (`T` sets a new TTL, `N` creates the item, `E` sets its CAS). `gets` and
/// `gat` are not: the `cas` after a `gets` needs its server's unique, and `gat` touches.
fn reads_only(line: &[u8]) -> bool {
    let mut words = line.split(|&c| c == b' ').filter(|w| !w.is_empty());
    match words.next() {
        Some(b"get") => true,
        Some(b"mg") => words.skip(1).all(|f| !matches!(f.first(), Some(b'T' | b'N' | b'E'))),
        _ => false,
    }
}

/// The class of a command line (its first word).
fn class_of(line: &[u8]) -> u16 {
    let word = line.split(|&c| c == b' ').find(|w| !w.is_empty()).unwrap_or_default();
    CLASSES.iter().position(|c| c.as_bytes() == word).unwrap_or(CLASSES.len() - 1) as u16
}

/// A multi-get's key, and where a miss of it is asked next.
type MultiKey = (Vec<u8>, Fallback);

/// Where a multi-get asks a key that its server did not answer with a value.
pub(crate) enum Fallback {
    /// Nowhere: a miss.
    None,
    /// A key placed on `node` within its handoff window: its previous server (the warm-up route).
    Warm { node: usize, previous: usize },
    /// A key of a replicated pool read from its copy on `first`: the other copies, in order.
    Copies { first: usize, rest: Vec<usize> },
}

/// A command of the batch, once planned: where its answer comes from.
pub(crate) enum Pending {
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
    /// A `get` of one key whose miss is filled from another server: on a server that joined
    /// within the handoff window, from the key's previous one (the warm-up route); on a hot key's
    /// replica, from its owner (`copy`: the key's hash; the copy is then one of
    /// [`crate::copies`], with a bounded lifetime).
    Warm { server: usize, node: usize, previous: usize, key: Vec<u8>, copy: Option<u64> },
    /// A write of a key (its hash and bytes) in a pool with hot keys, after the command's own
    /// entry: once `node` answered it, the copies other servers may hold are deleted (see
    /// [`crate::driver::delete_copies`]). Reads no answer of its own.
    Written { hash: u64, key: Vec<u8>, node: usize },
    /// An answer read and dropped: an invalidation (`delete KEY noreply` and `mn`, read to its
    /// `MN`), or a hot key's copy deleted on a replica.
    Discard { server: usize, answer: Answer, quiet: bool },
    /// A write of a replicated pool sent to every copy (server, node), how many could not be
    /// reached, and how its answers are framed: the client hears the worst.
    AllSync { parts: Vec<(usize, usize)>, unreachable: usize, answer: Answer, quiet: bool, noreply: bool },
    /// A `get` of one key of a replicated pool, from its first copy; a miss or a failure is asked
    /// of the `rest`, in order.
    Copies { server: usize, node: usize, key: Vec<u8>, rest: Vec<usize> },
    /// A command of every server: each reachable server's answer (server, node), and how many
    /// could not be reached.
    Broadcast { every: Every, parts: Vec<(usize, usize)>, unreachable: usize, noreply: bool },
}

impl Pending {
    /// Whether a miss (or failure) of the read is asked again of another server when it is
    /// answered: what the batch sends after it must not write, or the second answer could see a
    /// later command of the client.
    fn reasks(&self) -> bool {
        match self {
            Pending::Warm { .. } | Pending::Copies { .. } => true,
            Pending::Multi { keys, .. } => keys.iter().any(|(_, f)| !matches!(f, Fallback::None)),
            _ => false,
        }
    }
}

/// How a memcached answer is framed: a retrieval's (`VALUE` blocks to `END`), its kind, and
/// whether it is a quiet command's (whatever comes before `MN`).
pub(crate) struct Framed {
    retrieval: bool,
    answer: Answer,
    quiet: bool,
}

impl Framing for Framed {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        timeout: Duration,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), Lost>> + Send + 'a {
        answer_into(server, self.retrieval, self.answer, self.quiet, timeout, out)
    }
}

impl crate::driver::Pending for Pending {
    type Framing = Framed;

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
            Pending::Broadcast { every, parts, .. } => {
                let answer = match every {
                    Every::Stats { .. } => Answer::Stats,
                    Every::Same { .. } => Answer::Line,
                };
                out.extend(parts.iter().map(|&(server, node)| read(server, Some(node), (false, answer, false))));
            }
            Pending::Warm { server, node, .. } | Pending::Copies { server, node, .. } => {
                out.push(read(*server, Some(*node), (true, Answer::Line, false)));
            }
            Pending::AllSync { parts, answer, quiet, .. } => {
                out.extend(parts.iter().map(|&(server, node)| read(server, Some(node), (false, *answer, *quiet))));
            }
            Pending::Multi { parts, .. } => {
                out.extend(parts.iter().map(|&(server, node)| read(server, Some(node), (true, Answer::Line, false))));
            }
        }
    }
}

impl Pending {
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

impl Protocol for Memcached {
    type Pending = Pending;

    const NAME: &'static str = "memcached";

    fn classes() -> &'static [&'static str] {
        &CLASSES
    }

    fn class(&self) -> u16 {
        self.class
    }

    fn is_error(answer: &[u8]) -> bool {
        answer.starts_with(b"SERVER_ERROR") || answer.starts_with(b"CLIENT_ERROR") || answer.starts_with(b"ERROR")
    }

    fn route_key<'a>(&self, input: &'a [u8]) -> Option<(std::borrow::Cow<'a, [u8]>, bool)> {
        let (_, line) = codec::line(input)?;
        match codec::parse(line, self.max_item).ok()? {
            Command::Keyed { key, .. } => Some((key, reads_only(line))),
            Command::Retrieve { kind, keys, .. } => {
                keys.iter().next().map(|k| (std::borrow::Cow::Borrowed(k), kind == codec::Retrieval::Get))
            }
            Command::Broadcast { .. } => Some((std::borrow::Cow::Borrowed(&b""[..]), false)),
            _ => None,
        }
    }

    fn spare() -> &'static LocalKey<RefCell<Vec<Lists<Self>>>> {
        thread_local! {
            static SPARE: RefCell<Vec<Lists<Memcached>>> = const { RefCell::new(Vec::new()) };
        }
        &SPARE
    }

    fn whole(&self, input: &[u8]) -> bool {
        codec::line(input).is_some() && !waiting_for_data(input, self.max_item)
    }

    async fn plan(&mut self, input: &[u8], b: &mut Batch<'_, Self>) -> Planned {
        // A read of this batch may be asked again of another server when it is answered (a
        // replicated key's next copy, a hot key's owner, a joined server's previous one): a
        // command that may write waits for the next batch, after that read's answer, which then
        // never sees it.
        if self.reask && !codec::line(input).is_some_and(|(_, line)| reads_only(line)) {
            return Planned::Wait;
        }
        let before = b.pending.len();
        let planned = self.plan_command(input, b).await;
        self.reask |= b.pending.get(before..).is_some_and(|p| p.iter().any(Pending::reasks));
        planned
    }

    fn after(&mut self, _servers: &mut crate::servers::Servers, _side: &mut crate::servers::Servers) {
        self.reask = false;
    }

    async fn answer(&mut self, b: &mut Batch<'_, Self>, p: Pending, slot: &[Slot], arena: &[u8]) {
        match p {
            Pending::Ready(bytes) => b.out.extend_from_slice(bytes),
            Pending::Owned(bytes) => b.out.extend_from_slice(&bytes),
            Pending::One { node, noreply, .. } => match &slot[0] {
                Ok(range) => {
                    b.succeeded(node);
                    if !noreply {
                        b.out.extend_from_slice(&arena[range.clone()]);
                    }
                }
                Err(why) => server_error(b, node, why),
            },
            Pending::Discard { .. } => {}
            Pending::AllSync { parts, unreachable, noreply, .. } => {
                replicated::all_sync_answer(b, &parts, unreachable, noreply, slot, arena);
            }
            Pending::Copies { node, key, rest, .. } => {
                replicated::get_answer(b, node, (&key, &rest), &slot[0], arena).await;
            }
            Pending::Broadcast { every, parts, unreachable, noreply } => {
                broadcast::answer(b, every, &parts, unreachable, noreply, slot, arena);
            }
            Pending::Written { hash, key, node } => {
                // (The meta form: a key decoded from base64 may not be a classic command's.)
                let mut delete = b"md ".to_vec();
                delete.extend_from_slice(&codec::meta_key(&key));
                delete.extend_from_slice(b"\r\n");
                let line = Framed { retrieval: false, answer: Answer::Line, quiet: false };
                crate::driver::delete_copies(b, hash, node, &delete, &line).await;
            }
            Pending::Warm { node, previous, key, copy, .. } => match &slot[0] {
                Ok(range) => {
                    b.succeeded(node);
                    if &arena[range.clone()] == b"END\r\n" {
                        fill_from(b, (&key, copy), previous, node, true).await;
                        b.out.extend_from_slice(b"END\r\n");
                    } else {
                        b.out.extend_from_slice(&arena[range.clone()]);
                    }
                }
                Err(why) => server_error(b, node, why),
            },
            Pending::Multi { parts, keys } => {
                let mut answers: Vec<&[u8]> = Vec::with_capacity(parts.len());
                let mut answered = Vec::with_capacity(parts.len());
                for ((_, node), result) in parts.into_iter().zip(slot) {
                    match result {
                        Ok(range) => {
                            b.succeeded(node);
                            answers.push(&arena[range.clone()]);
                            answered.push(node);
                        }
                        // Its keys are misses; the failure is counted.
                        Err(_) => b.failed(node),
                    }
                }
                // Each server answers its keys in the order they were asked (the client's,
                // restricted to that server), skipping misses: a key's value, if any, is at the
                // head of its server's answer when the keys before it are taken. One look at each
                // server's head per key (a key asked twice is answered twice).
                let blocks: Vec<Vec<(&[u8], &[u8])>> = answers.iter().map(|a| codec::value_blocks(a)).collect();
                let mut heads = vec![0usize; blocks.len()];
                let mut found: Vec<Option<&[u8]>> = Vec::with_capacity(keys.len());
                for (key, _) in &keys {
                    let hit =
                        (0..blocks.len()).find(|&p| blocks[p].get(heads[p]).is_some_and(|(k, _)| *k == key.as_slice()));
                    found.push(hit.map(|p| {
                        heads[p] += 1;
                        blocks[p][heads[p] - 1].1
                    }));
                }
                // A replicated pool's keys that missed, or failed, on their first copy: asked of
                // their next copies, each copy's at once.
                let todo = keys.iter().zip(&found).filter_map(|((key, fallback), hit)| match fallback {
                    Fallback::Copies { first, rest } if hit.is_none() => {
                        let missed = if answered.contains(first) { vec![*first] } else { Vec::new() };
                        Some(replicated::Todo { key, rest, missed })
                    }
                    _ => None,
                });
                let todo: Vec<replicated::Todo<'_>> = todo.collect();
                let mut failed_over = replicated::resolve(b, todo).await.into_iter();
                for ((key, fallback), hit) in keys.iter().zip(found) {
                    match (hit, fallback) {
                        (Some(block), _) => b.out.extend_from_slice(block),
                        (None, Fallback::None) => {}
                        // A miss on a server within its handoff window: the warm-up route.
                        (None, Fallback::Warm { node, previous }) => {
                            fill_from(b, (key, None), *previous, *node, true).await;
                        }
                        (None, Fallback::Copies { .. }) => {
                            if let Some(Some(block)) = failed_over.next() {
                                b.out.extend_from_slice(&block);
                            }
                        }
                    }
                }
                b.out.extend_from_slice(b"END\r\n");
            }
        }
    }
}

impl Memcached {
    /// Plans the first command of `input` (see [`Protocol::plan`]).
    async fn plan_command(&mut self, input: &[u8], b: &mut Batch<'_, Self>) -> Planned {
        let Some((n, line)) = codec::line(input) else {
            self.class = CLASSES.len() as u16 - 1;
            if input.len() > codec::MAX_LINE {
                b.pending.push(Pending::Ready(b"CLIENT_ERROR line too long\r\n"));
                return Planned::Close;
            }
            return Planned::Wait;
        };
        self.class = class_of(line);
        match codec::parse(line, self.max_item) {
            Err(Refused::Unframed) => {
                b.pending.push(Pending::Owned(Refused::Unframed.line()));
                Planned::Close
            }
            Err(refused @ (Refused::TooLarge { skip } | Refused::FormatSkip { skip })) => {
                // The refused command's block is skipped, never read as commands.
                b.pending.push(Pending::Owned(refused.line()));
                Planned::Skip { n, skip }
            }
            Err(r) => {
                b.pending.push(Pending::Owned(r.line()));
                Planned::Next(n)
            }
            Ok(Command::Quit) => Planned::Close,
            Ok(Command::Version) => {
                let version = format!("VERSION keyroute-{}\r\n", env!("CARGO_PKG_VERSION"));
                b.pending.push(Pending::Owned(version.into_bytes()));
                Planned::Next(n)
            }
            Ok(Command::MetaNoop) => {
                b.pending.push(Pending::Ready(b"MN\r\n"));
                Planned::Next(n)
            }
            Ok(Command::Broadcast { cmd, noreply }) => {
                let p = if self.broadcast {
                    broadcast::plan(b, cmd, noreply).await
                } else {
                    Pending::Owned(Refused::NotProxied(cmd.name()).line())
                };
                b.pending.push(p);
                Planned::Next(n)
            }
            Ok(Command::Keyed { key, data, quiet, answer }) => {
                // The whole command (line and data) must be here before it is sent.
                let total = n + data.map_or(0, |d| d + 2);
                if input.len() < total {
                    return Planned::Wait;
                }
                if data.is_some_and(|d| &input[n + d..total] != b"\r\n") {
                    // As memcached: the declared bytes and two more are taken as the block, and
                    // what follows is the next command.
                    b.pending.push(Pending::Ready(b"CLIENT_ERROR bad data chunk\r\n"));
                    return Planned::Next(total);
                }
                keyed(b, &key, &input[..total], line.trim_ascii_start().starts_with(b"mg "), quiet, answer).await;
                Planned::Next(total)
            }
            Ok(Command::Retrieve { kind, exptime, keys }) => {
                let p = match keys.single() {
                    Some(key) => retrieve_one(b, kind, key, &input[..n]).await,
                    None => retrieve_many(b, kind, exptime, keys).await,
                };
                b.pending.push(p);
                Planned::Next(n)
            }
        }
    }
}

/// A command of one key (a storage command with its data, `delete`, `incr`, `touch`, a meta
/// command): to the key's owner (past it, the handoff, slow start and failover), never to a hot
/// key's replica. A write in a pool with hot keys deletes the copies replicas may hold, in this
/// batch and again once it is answered (see [`crate::copies`]); a write to a key warming on a new
/// owner deletes the previous owner's copy.
async fn keyed(b: &mut Batch<'_, Memcached>, key: &[u8], request: &[u8], meta_get: bool, quiet: bool, answer: Answer) {
    let hash = b.placed(key, key);
    let frame = crate::shadow::Frame::Memcached { retrieval: false, answer, quiet };
    crate::shadow::offer(b, (key, hash), request, frame, None);
    let write = !meta_get;
    if let (Some(r), Some(h)) = (b.snap.config().replication, hash.0) {
        let copies = b.snap.copies(h, r.copies, b.now);
        if write {
            return replicated::write(b, hash, &copies, (key, request), quiet, answer).await;
        }
        // `mg`: the first copy's answer, as a `gets`'s.
        let p = send_one(b, hash, copies.first().copied(), request, quiet, answer, false).await;
        b.pending.push(p);
        return;
    }
    let copies = match (b.snap.hot(), hash.0) {
        (Some(hot), Some(h)) if write && codec::valid_key(key) => Some((h, hot.replicas(h))),
        _ => None,
    };
    // A key whose owner joined within the handoff window goes to it at once, and is moved there
    // from its previous owner before any command runs on it (as the Redis listener's and
    // `keyroute move`'s: they agree on where a key lives).
    let handoff = hash.0.and_then(|h| b.snap.store_handoff(h, b.now));
    if let Some((node, previous)) = handoff
        && codec::valid_key(key)
    {
        fill_from(b, (key, None), previous, node, false).await;
    }
    let p = send_one(b, hash, handoff.map(|(node, _)| node), request, quiet, answer, false).await;
    // A write during the warm-up deletes the copy on the key's previous server, so that no miss
    // is ever filled with a value older than this write.
    let writer = match &p {
        Pending::One { node, .. } => Some(*node),
        _ => None,
    };
    let invalidate = match (writer, hash.0) {
        (Some(node), Some(h)) if write => b.snap.warm_source(h, node, b.now),
        _ => None,
    };
    b.pending.push(p);
    if let (Some((h, replicas)), Some(node)) = (copies, writer) {
        delete_copies_now(b, h, replicas, node, key).await;
        b.pending.push(Pending::Written { hash: h, key: key.to_vec(), node });
    }
    if let Some(previous) = invalidate
        && codec::valid_key(key)
        && let Some(server) = b.connect(previous).await
    {
        let out = &mut b.servers.0[server].out;
        out.extend_from_slice(b"delete ");
        out.extend_from_slice(key);
        out.extend_from_slice(b" noreply\r\nmn\r\n");
        b.pool.metrics.warm_invalidations.fetch_add(1, Relaxed);
        b.pending.push(Pending::Discard { server, answer: Answer::Line, quiet: true });
    }
}

/// A retrieval of one key: its server's answer as it is. A `get` of a hot key goes where the
/// steering rule sends it (the least loaded of its replicas); a miss on a replica is filled from
/// the owner, and a miss on a server within its handoff window from the key's previous one.
async fn retrieve_one(b: &mut Batch<'_, Memcached>, kind: codec::Retrieval, key: &[u8], request: &[u8]) -> Pending {
    let hash = b.placed(key, key);
    let frame = crate::shadow::Frame::Memcached { retrieval: true, answer: Answer::Line, quiet: false };
    crate::shadow::offer(b, (key, hash), request, frame, None);
    if let (Some(r), Some(h)) = (b.snap.config().replication, hash.0) {
        let copies = b.snap.copies(h, r.copies, b.now);
        if kind == codec::Retrieval::Get {
            return replicated::get(b, hash, copies, key, request).await;
        }
        // `gets` and `gat`: the first copy's answer (its CAS unique is that server's).
        return send_one(b, hash, copies.first().copied(), request, false, Answer::Line, false).await.retrieval();
    }
    // Within a handoff, a `get`'s miss on the new owner is read through (below); `gets` and
    // `gat` move the key first (a filled value would carry the new server's CAS, or not the new
    // TTL).
    let handoff = hash.0.and_then(|h| b.snap.store_handoff(h, b.now));
    if let Some((node, previous)) = handoff
        && kind != codec::Retrieval::Get
    {
        fill_from(b, (key, None), previous, node, false).await;
    }
    let get = kind == codec::Retrieval::Get;
    let to = handoff.map(|(node, _)| node);
    let p = send_one(b, hash, to, request, false, Answer::Line, get && to.is_none()).await.retrieval();
    let (Pending::One { server, node, .. }, Some(h)) = (&p, hash.0) else { return p };
    if !get {
        return p;
    }
    let (server, node) = (*server, *node);
    // A joining server warms from the key's previous one; a hot key's replica from its owner.
    let hot_owner = b
        .snap
        .hot()
        .filter(|hot| hot.replicas(h) > 1)
        .and_then(|_| b.snap.policy().owner(h))
        .filter(|&owner| owner != node);
    let warm = b.snap.warm_source(h, node, b.now);
    match warm.or(hot_owner) {
        // A hot key's replica fills a copy; a joining server, a key it now owns.
        Some(previous) => {
            Pending::Warm { server, node, previous, key: key.to_vec(), copy: warm.is_none().then_some(h) }
        }
        None => p,
    }
}

/// `get`/`gets`/`gat`/`gats` of several keys: one request per server, with its keys in the
/// client's order, each key to its owner. A server that cannot be reached leaves its keys out
/// (misses).
async fn retrieve_many(
    b: &mut Batch<'_, Memcached>,
    kind: codec::Retrieval,
    exptime: Option<&[u8]>,
    keys: codec::Keys<'_>,
) -> Pending {
    if b.off_route(keys.iter(), true) {
        return Pending::Ready(b"CLIENT_ERROR keys of one command route to different pools\r\n");
    }
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
        let hash = b.placed(key, key);
        // A replicated pool's key: its first copy, the others behind it for a `get`.
        let mut copies = match (b.snap.config().replication, hash.0) {
            (Some(r), Some(h)) => b.snap.copies(h, r.copies, b.now),
            _ => Vec::new(),
        };
        // Within a handoff the key's new owner, as for one key.
        let owner = hash.0.and_then(|h| b.snap.store_handoff(h, b.now)).map(|(node, _)| node);
        let first = copies.first().copied();
        let Some(node) = first.or(owner).or_else(|| b.pick(hash, &[], false).map(|d| d.node)) else {
            b.pool.metrics.no_worker.fetch_add(1, Relaxed);
            warm.push((key.to_vec(), Fallback::None));
            continue;
        };
        // `gets` and `gat` are neither warmed nor failed over: a value from elsewhere would carry
        // another server's CAS, or no new TTL.
        let fallback = match (kind, hash.0) {
            (codec::Retrieval::Get, _) if first.is_some() => {
                copies.remove(0);
                Fallback::Copies { first: node, rest: copies }
            }
            (codec::Retrieval::Get, Some(h)) => match b.snap.warm_source(h, node, b.now) {
                Some(previous) => Fallback::Warm { node, previous },
                None => Fallback::None,
            },
            _ => Fallback::None,
        };
        warm.push((key.to_vec(), fallback));
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
        let Some(server) = b.connect(node).await else { continue };
        b.sent(node);
        let out = &mut b.servers.0[server].out;
        out.extend_from_slice(&line);
        out.extend_from_slice(b"\r\n");
        parts.push((server, node));
    }
    Pending::Multi { parts, keys: warm }
}

/// Whether the first buffered command is a storage command whose data has not all arrived.
fn waiting_for_data(input: &[u8], max_item: usize) -> bool {
    let Some((n, line)) = codec::line(input) else { return true };
    match codec::parse(line, max_item) {
        Ok(Command::Keyed { data: Some(d), .. }) => input.len() < n + d + 2,
        _ => false,
    }
}

/// A command of one key: queued for its server (`to`: the key's new owner within a handoff,
/// placed as usual when it cannot be reached), walking the key's ranking past servers that
/// cannot be reached (nothing was sent to them). `replicas`: a hot key may be read from a
/// replica.
async fn send_one(
    b: &mut Batch<'_, Memcached>,
    hash: Placed,
    to: Option<usize>,
    request: &[u8],
    quiet: bool,
    answer: Answer,
    replicas: bool,
) -> Pending {
    let Some((server, node)) = b.place(to, hash, replicas).await else {
        return Pending::Ready(b"SERVER_ERROR no server available\r\n");
    };
    let out = &mut b.servers.0[server].out;
    out.extend_from_slice(request);
    if quiet {
        out.extend_from_slice(b"mn\r\n");
    }
    // `noreply`: nothing to the client; a quiet meta command: what the server did say.
    let noreply = quiet && answer == Answer::Line;
    Pending::One { server, node, retrieval: false, answer, quiet, noreply }
}

/// Appends the server's next answer to `out` (or, when `quiet`, whatever comes before `MN`). A
/// server that failed in this batch gives none (see [`read_answer`]).
async fn answer_into(
    server: &mut Server,
    retrieval: bool,
    answer: Answer,
    quiet: bool,
    timeout: Duration,
    out: &mut Vec<u8>,
) -> Result<(), Lost> {
    let framing = |buf: &[u8]| {
        if quiet && buf.starts_with(b"MN\r\n") {
            return Ok(Some(4));
        }
        codec::answer_len(buf, retrieval, answer).map_err(|_| crate::conn::Garbled)
    };
    read_answer(server, timeout, out, async |server: &mut Server, out: &mut Vec<u8>| {
        loop {
            let n = frame(server, &framing).await?;
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
/// its flags and remaining time to live), appended to the client's output as a `VALUE` block when
/// `answer` (a `get`'s miss), and added to `joined` (`ms ... ME`: an add, so that a write that got
/// there first wins), over the client's side connections, outside the batch.
///
/// - **A move** (`copy` is `None`: `joined` is the key's new owner within a handoff window):
///   then deleted from `previous` (`md`), so that the key lives in one place, as `keyroute move`
///   leaves it. memcached has no atomic move: a delete of the key through another connection
///   between the read and the add is undone until the key's TTL ends.
/// - **A hot key's copy** (`copy`: its hash; `previous` is its owner): it lives
///   [`crate::copies::COPY_LIFETIME`] at most, and lands only if no write of the key was
///   answered since the owner was read.
async fn fill_from(
    b: &mut Batch<'_, Memcached>,
    (key, copy): (&[u8], Option<u64>),
    previous: usize,
    joined: usize,
    answer: bool,
) {
    let fill = copy.filter(|_| b.snap.hot().is_some()).map(|h| {
        let holder = b.snap.workers()[joined].address;
        (h, b.s.state.copies.begin_fill(h, holder, Instant::now()))
    });
    let Ok(Some(mut value)) = read_value(b, key, previous).await else { return };
    if answer {
        value.block(key, b.out);
    }
    let landing = match fill {
        Some((_, fill)) => {
            // A copy: at most its lifetime (memcached's 0 is "never"; -1 was read as 0).
            let max = crate::copies::COPY_LIFETIME.as_secs();
            value.ttl = match value.ttl.parse::<u64>() {
                Ok(t) if (1..=max).contains(&t) => t,
                _ => max,
            }
            .to_string();
            match b.s.state.copies.landing(fill).await {
                Some(landing) => Some(landing),
                None => return,
            }
        }
        None => None,
    };
    b.pool.metrics.warm_fills.fetch_add(1, Relaxed);
    let added = add_value(b, key, &value, joined).await;
    if let Some(landing) = landing {
        b.s.state.copies.landed(landing, Instant::now());
    } else if added && let Some(p) = b.side(previous).await {
        // Stored, or the new owner had a newer value: the previous one is superseded.
        let server = &mut b.side.0[p];
        server.out.extend_from_slice(b"md ");
        server.out.extend_from_slice(&codec::meta_key(key));
        server.out.extend_from_slice(b" q\r\nmn\r\n");
        flush(b.side, b.s.answer).await;
        let mut dropped = Vec::new();
        let _ = answer_into(&mut b.side.0[p], false, Answer::Meta, true, b.s.answer, &mut dropped).await;
    }
    b.side.sweep();
}

/// A value read from a server with its flags and remaining time to live, to be added to another.
pub(crate) struct Value {
    flags: String,
    /// Seconds, as a set takes them (0: no expiry).
    ttl: String,
    data: Vec<u8>,
}

impl Value {
    /// The value as a `get` answers it (`VALUE KEY FLAGS SIZE`, the data), appended to `out`.
    fn block(&self, key: &[u8], out: &mut Vec<u8>) {
        out.extend_from_slice(b"VALUE ");
        out.extend_from_slice(key);
        out.extend_from_slice(format!(" {} {}\r\n", self.flags, self.data.len()).as_bytes());
        out.extend_from_slice(&self.data);
        out.extend_from_slice(b"\r\n");
    }
}

/// The values of `keys` on node `from` (`mg KEY v f t` each, for its flags and remaining time to
/// live, in one write), over the client's side connections, in the order of `keys`: `None` for a
/// key it has not; `Err` when it failed to answer (counted against it).
pub(crate) async fn read_values(
    b: &mut Batch<'_, Memcached>,
    keys: &[&[u8]],
    from: usize,
) -> Result<Vec<Option<Value>>, ()> {
    let Some(p) = b.side(from).await else { return Err(()) };
    let server = &mut b.side.0[p];
    for key in keys {
        server.out.extend_from_slice(b"mg ");
        server.out.extend_from_slice(&codec::meta_key(key));
        server.out.extend_from_slice(b" v f t\r\n");
    }
    flush(b.side, b.s.answer).await;
    let mut values = Vec::with_capacity(keys.len());
    for _ in keys {
        let mut read = Vec::new();
        if answer_into(&mut b.side.0[p], false, Answer::Meta, false, b.s.answer, &mut read).await.is_err() {
            failed(b.worker(from), b.s);
            b.side.sweep();
            return Err(());
        }
        let Ok(value) = parse_value(&read) else {
            // Not a meta answer: the copy's later answers cannot be told apart; the connection
            // is dropped.
            failed(b.worker(from), b.s);
            b.side.0[p].broken = true;
            b.side.sweep();
            return Err(());
        };
        values.push(value);
    }
    Ok(values)
}

/// The value of `key` on node `from` (see [`read_values`]).
pub(crate) async fn read_value(b: &mut Batch<'_, Memcached>, key: &[u8], from: usize) -> Result<Option<Value>, ()> {
    Ok(read_values(b, &[key], from).await?.pop().flatten())
}

/// A meta get's answer: `VA <size> f<flags> t<ttl>`, the data; or `EN`.
fn parse_value(read: &[u8]) -> Result<Option<Value>, ()> {
    let Some((n, head)) = codec::line(read) else { return Err(()) };
    let mut words = head.split(|&c| c == b' ');
    match words.next() {
        Some(b"VA") => {}
        Some(b"EN") => return Ok(None),
        _ => return Err(()),
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
    let Some(size) = size.filter(|&z| read.len() >= n + z) else { return Err(()) };
    Ok(Some(Value { flags, ttl, data: read[n..n + size].to_vec() }))
}

/// Adds `value` to node `to` as `key` (`ms ... ME`: an add, so that a write that got there first
/// wins), over the client's side connections; whether the server answered.
pub(crate) async fn add_value(b: &mut Batch<'_, Memcached>, key: &[u8], value: &Value, to: usize) -> bool {
    let Some(j) = b.side(to).await else { return false };
    let server = &mut b.side.0[j];
    server.out.extend_from_slice(b"ms ");
    server.out.extend_from_slice(&codec::meta_key(key));
    let Value { flags, ttl, data } = value;
    server.out.extend_from_slice(format!(" {} F{flags} T{ttl} ME q\r\n", data.len()).as_bytes());
    server.out.extend_from_slice(data);
    server.out.extend_from_slice(b"\r\nmn\r\n");
    flush(b.side, b.s.answer).await;
    let mut dropped = Vec::new();
    let added = answer_into(&mut b.side.0[j], false, Answer::Meta, true, b.s.answer, &mut dropped).await.is_ok();
    if !added {
        failed(b.worker(to), b.s);
    }
    b.side.sweep();
    added
}

/// A write of a key in a pool with hot keys, sent to `writer`: the copies its replicas may hold
/// (the first `replicas` of its ranking while it is hot, and every server that may still hold one,
/// hot or not) are deleted in the same batch (`delete KEY noreply` and `mn`, whose answers are
/// read and dropped), so that no read after the write on the same connections sees an older
/// copy. Copies are made only by fills from the owner, with a bounded lifetime; a write is never
/// copied, since its result on a replica depends on what that replica held.
async fn delete_copies_now(b: &mut Batch<'_, Memcached>, h: u64, replicas: usize, writer: usize, key: &[u8]) {
    for node in b.copy_holders(h, replicas, writer) {
        let Some(server) = b.connect(node).await else { continue };
        let out = &mut b.servers.0[server].out;
        out.extend_from_slice(b"delete ");
        out.extend_from_slice(key);
        out.extend_from_slice(b" noreply\r\nmn\r\n");
        b.pending.push(Pending::Discard { server, answer: Answer::Line, quiet: true });
    }
}

/// A server's failure to answer: counted, and told the client as `SERVER_ERROR`.
fn server_error(b: &mut Batch<'_, Memcached>, node: usize, why: &str) {
    b.failed(node);
    b.out.extend_from_slice(b"SERVER_ERROR ");
    b.out.extend_from_slice(why.as_bytes());
    b.out.extend_from_slice(b"\r\n");
}

/// The check of a memcached server: `version` on a fresh connection.
#[derive(Debug)]
pub(crate) struct Check {
    /// The time to connect.
    pub(crate) connect: Duration,
}

impl keyroute_fleet::pool::Check for Check {
    fn check<'a>(
        &'a self,
        worker: &'a Arc<keyroute_fleet::pool::WorkerState>,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Ok(mut conn) = crate::conn::ServerConn::open(worker.address, self.connect).await else { return false };
            if conn.write(b"version\r\n").await.is_err() {
                return false;
            }
            let line = |buf: &[u8]| Ok(buf.iter().position(|&c| c == b'\n').map(|i| i + 1));
            match conn.frame(line).await {
                Ok(n) => conn.buffered()[..n].starts_with(b"VERSION "),
                Err(_) => false,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::reads_only;

    #[test]
    fn only_pure_reads_go_to_a_read_pool() {
        for r in [&b"get k"[..], b"get a b", b"mg k v", b"mg k v f t c", b"  mg k v"] {
            assert!(reads_only(r), "{}", String::from_utf8_lossy(r));
        }
        for w in [
            &b"gets k"[..],
            b"gat 10 k",
            b"gats 10 k",
            b"mg k v T30",
            b"mg k N30 v",
            b"mg k E5",
            b"set k 0 0 1",
            b"md k",
        ] {
            assert!(!reads_only(w), "{}", String::from_utf8_lossy(w));
        }
    }
}

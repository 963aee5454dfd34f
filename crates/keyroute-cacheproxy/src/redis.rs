//! A Redis proxy listener (`protocol = "redis"`): RESP2 and RESP3 in front of a pool of standalone Redis
//! servers, placed by the pool's strategy (the `redis-cluster` mode places by keyslot, `twemproxy`
//! as nutcracker does), each key by its `{hash tag}` when it has one (in the `twemproxy` mode, by
//! the pool's `hash_tag` as nutcracker does, and by the whole key without one).
//!
//! # Commands
//!
//! - **One key** (`GET`, `SET`, `INCR`, `EXPIRE`, `HSET`, `LPUSH`, `ZADD`, `XADD`... every command
//!   of [`keyroute_cache_proto::commands`]): sent to the key's server as the client wrote it, its reply passed back.
//! - **Several keys**, split by server and merged: `MGET` (values in the client's order), `MSET`
//!   (`OK` when every server said so), `DEL`, `UNLINK`, `EXISTS`, `TOUCH` (the sum of the counts).
//!   `MSETNX`, `EVAL`, `EVALSHA` and `EVAL_RO`/`EVALSHA_RO` go to one server when all their keys
//!   have it (hash tags make it so), and are refused otherwise: they are atomic on one server only.
//! - **The proxy's own**: `PING`, `ECHO`, `QUIT`, `SELECT 0`, `COMMAND` (an empty list),
//!   `CLIENT SETNAME`/`SETINFO` (accepted, kept nowhere).
//! - **Refused**, each with an error that says why, as twemproxy and Envoy's Redis proxy refuse
//!   them: commands of every server or none (`KEYS`, `SCAN`, `RANDOMKEY`, `DBSIZE`, `FLUSHALL`,
//!   `FLUSHDB`, `INFO`, `CONFIG`...), blocking commands (`BLPOP`, `BRPOP`, `BLMOVE`, `BZPOPMIN`,
//!   `WAIT`, `XREAD`/`XREADGROUP`...), transactions (`MULTI`, `EXEC`, `WATCH`...), pub/sub
//!   (`SUBSCRIBE`, `PUBLISH`...), `SELECT` of another database, and anything else unknown.
//! - **RESP3**: `HELLO 3` (with `AUTH default PASSWORD` and `SETNAME`, as Redis takes them) answers
//!   the proxy's map (`server` keyroute, `proto`, `mode` standalone...) and switches the client:
//!   its connections to the servers are opened anew with `HELLO 3`, so the servers' maps, sets,
//!   nulls, doubles and booleans reach it as they are, and split commands merge in RESP3.
//!   `HELLO 2` switches back; another version is `-NOPROTO`.
//! - **Passwords**: with `password` on the listener, a client must `AUTH PASSWORD` (or `AUTH
//!   default PASSWORD`) first; every other command gets `-NOAUTH` until then, and a wrong one
//!   `-WRONGPASS`, as Redis answers. With `server_password`, the proxy sends `AUTH` on every
//!   connection it opens to a server (a server that refuses it is a failed connect).
//!
//! - **A server that joins, with `[pool.handoff]`**: a store's key lives in one place, so every
//!   key whose owner is the new server goes there at once (no gradual admission, unlike the
//!   memcached listener's warm-up), and within the window, a command on such a key first moves
//!   it from its previous owner (`MIGRATE ... KEYS key` run there: atomic, and never replacing a
//!   newer value the new owner has), counted in `keyroute_pool_warm_fills_total`. `keyroute
//!   move` moves the keys no command touched (see the `relocate` module). A server that leaves is
//!   not read through: the proxy no longer knows it.
//!
//! - **Hot keys** (with `[pool.hot_keys]`, detected and sized as for HTTP): a hot key's `GET`
//!   goes where the pool's one steering rule sends it, as an HTTP request for it would go: the
//!   least loaded of its replicas (the first of its ranking), by the commands in flight on each; a
//!   replica's miss is read from the owner (`GET` and `PTTL`), answered, and copied to the replica
//!   with `SET ... PX` (at most 10 s, which bounds how stale a copy can be when its fill raced a
//!   write); a command pipelined after such a `GET` that may write waits for its answer, so the
//!   owner's value never shows the client's later write. Any other command
//!   that writes the key (and `DEL`, `UNLINK`, `MSET` of it) goes to the owner and deletes the
//!   replicas' copies in the same batch, so no later read through the proxy sees a value older
//!   than the last write it forwarded. Other reads of a hot key go to its owner. Copies are a
//!   cache's: on a pool whose keys `keyroute move` will move, leave hot keys off (a copy on a
//!   new owner would count as a newer value there).
//!
//! Commands are served in pipelined batches as the memcached listener's are (see
//! [`crate::driver`]): sent to their servers first, one write per server, then the replies read in
//! the client's order. A server that cannot be reached is a passive-ejection failure and a
//! one-key command goes to the key's next server; a server that fails after the command was sent
//! answers `-ERR keyroute: server timeout` (or `connection lost`), counted.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::thread::LocalKey;
use std::time::Duration;

use keyroute_cache_proto::commands::{self, Access};
use keyroute_cache_proto::resp as codec;
use keyroute_fleet::config::{PoolConfig, ReplicaReads};

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::cluster::Unfollowed;
use crate::conn::Lost;
use crate::driver::{Batch, Lists, Placed, Planned, Protocol};
use crate::servers::{Framing, Read, Server, Servers, Slot, answer_into, flush, frame};

/// A command of the batch, once sent: where its reply comes from.
pub(crate) enum Pending {
    /// Answered by the proxy.
    Ready(Vec<u8>),
    /// One reply from one server (`node` of the batch's snapshot); `written`, a key the command
    /// writes in a pool with hot keys (its hash and bytes), whose copies on replicas are deleted
    /// once the server answered (see [`crate::driver::delete_copies`]).
    /// `cluster`: in a Redis Cluster pool, what a redirection to follow, or a read a replica
    /// could not answer, needs.
    One { server: usize, node: usize, written: Option<Written>, cluster: Option<Box<Sent>> },
    /// A split command's parts: (server, node, the client's positions of its keys), and the keys
    /// it writes in a pool with hot keys, whose copies are deleted once the servers answered.
    /// `raw`: in a Redis Cluster pool, each part's command as sent (in `parts`' order), for a
    /// redirection to follow.
    /// `pins`: the keys of a write in a cluster pool whose replicas serve reads (see
    /// [`crate::cluster::Cluster::written`]).
    Split {
        how: Merge,
        parts: Vec<(usize, usize, Positions)>,
        n: usize,
        written: Vec<(Written, usize)>,
        raw: Vec<Box<[u8]>>,
        pins: Vec<u64>,
    },
    /// A hot key's `GET` on a replica (`node`) that is not its owner: a miss there is read from
    /// the owner, answered, and copied to the replica.
    HotGet { server: usize, node: usize, owner: usize, hash: u64, key: Vec<u8> },
    /// A reply read and dropped (a hot key's copy deleted on a replica).
    Discard { server: usize },
}

/// A command of one key sent in a Redis Cluster pool.
pub(crate) struct Sent {
    /// The command as sent.
    raw: Box<[u8]>,
    /// Its key's slot.
    slot: u16,
    /// A read sent to a replica: asked of the slot's master when the replica fails, answers an
    /// error or misses (the key may be newer than the replica, or in a slot being migrated).
    replica: bool,
    /// A write in a pool whose replicas serve reads: its key's pin, set again when it is answered.
    pin: Option<u64>,
}

impl Pending {
    /// Whether the read is asked again of another server when its answer is a miss: a cluster
    /// replica's (of its master), a hot key replica's (of its owner). What the batch sends after
    /// it must not write, or the second answer could see a later command of the client.
    fn reasks(&self) -> bool {
        match self {
            Pending::HotGet { .. } => true,
            Pending::One { cluster: Some(sent), .. } => sent.replica,
            _ => false,
        }
    }
}

/// A split command's part: the client's positions of its keys (a few, on the stack).
type Positions = SmallVec<[usize; 8]>;

/// A key a command writes: its hash and its bytes.
type Written = (u64, Vec<u8>);

/// A RESP reply, framed as a whole.
pub(crate) struct Reply;

impl Framing for Reply {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        timeout: Duration,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), Lost>> + Send + 'a {
        reply_into(server, timeout, out)
    }
}

impl crate::driver::Pending for Pending {
    type Framing = Reply;

    fn reads(&self, out: &mut Vec<Read<Reply>>) {
        let read = |server: usize, node: Option<usize>| Read { server, node, how: Reply };
        match self {
            Pending::Ready(_) => {}
            Pending::One { server, node, .. } | Pending::HotGet { server, node, .. } => {
                out.push(read(*server, Some(*node)))
            }
            Pending::Discard { server } => out.push(read(*server, None)),
            Pending::Split { parts, .. } => {
                out.extend(parts.iter().map(|(server, node, _)| read(*server, Some(*node))))
            }
        }
    }
}

/// How a split command's replies merge.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Merge {
    /// `MGET`: the values, in the client's order.
    Values,
    /// `DEL`, `UNLINK`, `EXISTS`, `TOUCH`: the sum.
    Sum,
    /// `MSET`: `OK` when every server said so.
    Ok,
}

fn error(out: &mut Vec<u8>, message: &str) -> Vec<u8> {
    out.clear();
    out.extend_from_slice(b"-ERR keyroute: ");
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(b"\r\n");
    std::mem::take(out)
}

/// The Redis protocol over the driver: one client connection's, and what it has said of itself
/// (its password given, its protocol).
pub(crate) struct Redis {
    /// The largest argument taken (`max_item_bytes`).
    max_item: usize,
    /// The password clients give with `AUTH` first (the listener's), if any.
    password: Option<Arc<str>>,
    /// The proxy's greeting to each server it connects to, for each protocol the client may
    /// speak.
    greetings: [Option<Arc<[u8]>>; 2],
    /// The same with `READONLY` (a cluster pool whose replicas serve reads), made on first use.
    readonly: std::sync::OnceLock<[Option<Arc<[u8]>>; 2]>,
    /// The servers' password, which `MIGRATE` gives the new owner.
    server_password: Option<Arc<str>>,
    authenticated: bool,
    resp3: bool,
    /// The client switched protocols in this batch: its server connections are opened anew.
    switched: bool,
    /// The class of the command planned last (see [`commands::classes`]).
    class: u16,
    /// A read planned in this batch may be asked again of another server when it is answered
    /// (see [`Pending::reasks`]).
    reask: bool,
}

impl Redis {
    /// A new client of a listener with these passwords and limit.
    pub(crate) fn new(max_item: usize, password: Option<&str>, server_password: Option<&str>) -> Redis {
        Redis {
            max_item,
            password: password.map(Arc::from),
            greetings: [greeting(server_password, false), greeting(server_password, true)],
            readonly: std::sync::OnceLock::new(),
            server_password: server_password.map(Arc::from),
            authenticated: password.is_none(),
            resp3: false,
            switched: false,
            class: 0,
            reask: false,
        }
    }
}

impl Redis {
    /// Plans the first command of `input`, its argument ranges parsed into `ranges`.
    async fn plan_with(
        &mut self,
        input: &[u8],
        b: &mut Batch<'_, Self>,
        ranges: &mut Vec<std::ops::Range<usize>>,
    ) -> Planned {
        self.class = commands::OTHER;
        let (n, inline) = match codec::request_into(input, self.max_item, ranges) {
            Ok(Some(r)) => r,
            Ok(None) => return Planned::Wait,
            Err(codec::Unframed(why)) => {
                // Nothing of it is sent: the client is answered Redis's error and closed, as
                // Redis would close it, and the shared server connections are untouched.
                b.pending.push(Pending::Ready(format!("-{why}\r\n").into_bytes()));
                return Planned::Close;
            }
        };
        // What a server is sent: an array as the client framed it (validated as Redis reads
        // it), or an inline command re-encoded as an array, so that the server reads the
        // arguments the proxy placed (a quoted key is placed by what Redis stores).
        // Up to eight arguments (every one-key command) on the stack: no list is allocated.
        let mut small: [&[u8]; 8] = [&[]; 8];
        let large: Vec<&[u8]>;
        let inline_raw;
        let (args, raw): (&[&[u8]], &[u8]) = match &inline {
            None if ranges.len() <= small.len() => {
                for (a, r) in small.iter_mut().zip(ranges.iter()) {
                    *a = &input[r.clone()];
                }
                (&small[..ranges.len()], &input[..n])
            }
            None => {
                large = ranges.iter().map(|r| &input[r.clone()]).collect();
                (&large, &input[..n])
            }
            Some(words) => {
                let mut encoded = Vec::new();
                codec::command(&mut encoded, words.iter().map(Vec::as_slice));
                inline_raw = encoded;
                large = words.iter().map(Vec::as_slice).collect();
                (&large, &inline_raw)
            }
        };
        if args.is_empty() {
            return Planned::Next(n);
        }
        let mut upper = [0u8; 32];
        let name = match args[0] {
            a if a.len() <= upper.len() => {
                upper[..a.len()].copy_from_slice(a);
                upper[..a.len()].make_ascii_uppercase();
                std::str::from_utf8(&upper[..a.len()]).unwrap_or("?")
            }
            _ => "?",
        };
        self.class = commands::class(name);
        if name == "QUIT" {
            b.pending.push(Pending::Ready(b"+OK\r\n".to_vec()));
            return Planned::Close;
        }
        if name == "AUTH"
            && let Some(password) = &self.password
        {
            // AUTH PASSWORD, or AUTH default PASSWORD (Redis 6's form).
            let given = match args.len() {
                2 => Some(args[1]),
                3 if args[1] == b"default" => Some(args[2]),
                _ => None,
            };
            self.authenticated = given.is_some_and(|g| matches_password(g, password));
            let answer: &[u8] = match (given, self.authenticated) {
                (None, _) => b"-ERR wrong number of arguments for 'auth' command\r\n",
                (_, true) => b"+OK\r\n",
                (_, false) => b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            };
            b.pending.push(Pending::Ready(answer.to_vec()));
            return Planned::Next(n);
        }
        if name == "HELLO" {
            let (answer, proto) = hello(args, self.password.as_deref(), &mut self.authenticated, self.resp3);
            b.pending.push(Pending::Ready(answer));
            if let Some(p) = proto.filter(|&p| p != self.resp3) {
                // The client's server connections speak its protocol: they are opened anew,
                // after this batch.
                self.resp3 = p;
                self.switched = true;
                return Planned::End(n);
            }
            return Planned::Next(n);
        }
        if !self.authenticated {
            b.pending.push(Pending::Ready(b"-NOAUTH Authentication required.\r\n".to_vec()));
            return Planned::Next(n);
        }
        let p = serve_command(b, self.server_password.as_deref(), name, args, raw).await;
        b.pending.push(p);
        Planned::Next(n)
    }
}

impl Protocol for Redis {
    type Pending = Pending;

    const NAME: &'static str = "redis";

    fn classes() -> &'static [&'static str] {
        commands::classes()
    }

    fn class(&self) -> u16 {
        self.class
    }

    fn is_error(answer: &[u8]) -> bool {
        matches!(answer.first(), Some(b'-' | b'!'))
    }

    fn route_key<'a>(&self, input: &'a [u8]) -> Option<(std::borrow::Cow<'a, [u8]>, bool)> {
        let mut ranges = Vec::new();
        let (_, inline) = codec::request_into(input, self.max_item, &mut ranges).ok()??;
        let args: Vec<std::borrow::Cow<'a, [u8]>> = match inline {
            None => ranges.iter().map(|r| std::borrow::Cow::Borrowed(&input[r.clone()])).collect(),
            Some(words) => words.into_iter().map(std::borrow::Cow::Owned).collect(),
        };
        let name = String::from_utf8_lossy(args.first()?).to_ascii_uppercase();
        let (at, read) = match name.as_str() {
            "MGET" | "EXISTS" => (1, true),
            "DEL" | "UNLINK" | "TOUCH" | "MSET" | "MSETNX" => (1, false),
            "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" => (3, name.ends_with("_RO")),
            n => (1, commands::one_key(n, args.len())? == Access::Read),
        };
        args.into_iter().nth(at).map(|k| (k, read))
    }

    fn whole(&self, input: &[u8]) -> bool {
        // Asked between batches, of what is left: a partial command, or more than a batch.
        matches!(codec::request(input, self.max_item), Ok(Some(_)))
    }

    fn spare() -> &'static LocalKey<RefCell<Vec<Lists<Self>>>> {
        thread_local! {
            static SPARE: RefCell<Vec<Lists<Redis>>> = const { RefCell::new(Vec::new()) };
        }
        &SPARE
    }

    fn greeting(&self, pool: &PoolConfig) -> Option<Arc<[u8]>> {
        let greetings = match pool.cluster {
            Some(c) if c.replica_reads != ReplicaReads::Never => self.readonly.get_or_init(|| {
                let pw = self.server_password.as_deref();
                [Some(readonly_greeting(pw, false)), Some(readonly_greeting(pw, true))]
            }),
            _ => &self.greetings,
        };
        greetings[usize::from(self.resp3)].clone()
    }

    fn greeted(greeting: &[u8], answer: &[u8]) -> Option<bool> {
        codec::greeted(greeting, answer)
    }

    async fn plan(&mut self, input: &[u8], b: &mut Batch<'_, Self>) -> Planned {
        // A read of this batch may be asked again of another server when it is answered (a
        // cluster replica's miss, a hot key replica's): a command that may write waits for the
        // next batch, after that read's answer, which then never sees it.
        if self.reask && !matches!(self.route_key(input), Some((_, true))) {
            return Planned::Wait;
        }
        let before = b.pending.len();
        let mut ranges = std::mem::take(&mut b.lists.ranges);
        let planned = self.plan_with(input, b, &mut ranges).await;
        b.lists.ranges = ranges;
        self.reask |= b.pending.get(before..).is_some_and(|p| p.iter().any(Pending::reasks));
        planned
    }

    async fn answer(&mut self, b: &mut Batch<'_, Self>, p: Pending, slot: &[Slot], arena: &[u8]) {
        match p {
            Pending::Ready(bytes) => b.out.extend_from_slice(&bytes),
            Pending::One { node, written, cluster, .. } => {
                let pin = cluster.as_ref().and_then(|c| c.pin);
                match (&slot[0], cluster) {
                    // A replica that failed, erred or missed: the master answers.
                    (result, Some(sent)) if sent.replica && !replica_answered(result, arena) => {
                        match result {
                            // A replica still loading, or cut from its master: not chosen for a
                            // while (a client's bad command, WRONGTYPE..., counts against none).
                            Ok(range) => {
                                b.succeeded(node);
                                let reply = &arena[range.clone()];
                                if reply.starts_with(b"-LOADING") || reply.starts_with(b"-MASTERDOWN") {
                                    b.s.state.cluster.avoid(b.worker(node).address, Instant::now());
                                }
                            }
                            Err(_) => {
                                b.failed(node);
                                b.s.state.cluster.avoid(b.worker(node).address, Instant::now());
                            }
                        }
                        b.pool.metrics.replica_failovers.fetch_add(1, Relaxed);
                        from_master(b, &sent).await;
                    }
                    (Ok(range), cluster) => {
                        b.succeeded(node);
                        let reply = &arena[range.clone()];
                        match &cluster {
                            Some(sent) if crate::cluster::redirected(reply) => followed(b, reply, &sent.raw).await,
                            _ => b.out.extend_from_slice(reply),
                        }
                    }
                    (Err(why), _) => server_error(b, node, why),
                }
                // A write's key read from its master for a while from now, answered or not (it
                // may have run).
                if let Some(pin) = pin {
                    b.s.state.cluster.written(pin, Instant::now());
                }
                // Answered or not, the write may have been applied.
                if let Some((hash, key)) = written {
                    delete_copies(b, hash, node, &key).await;
                }
            }
            Pending::HotGet { node, owner, hash, key, .. } => match &slot[0] {
                Ok(range) => {
                    b.succeeded(node);
                    let reply = &arena[range.clone()];
                    if matches!(reply, b"$-1\r\n" | b"_\r\n") {
                        if !hot_fill(b, (hash, &key), owner, node).await {
                            b.out.extend_from_slice(b"-ERR keyroute: server connection lost\r\n");
                        }
                    } else {
                        b.out.extend_from_slice(reply);
                    }
                }
                Err(why) => server_error(b, node, why),
            },
            Pending::Discard { .. } => {}
            Pending::Split { how, parts, n, written, raw, pins } => {
                let mut replies = Vec::with_capacity(parts.len());
                let mut failure = None;
                for (k, ((_, node, positions), result)) in parts.into_iter().zip(slot).enumerate() {
                    match result {
                        Ok(range) => {
                            b.succeeded(node);
                            let reply = &arena[range.clone()];
                            // A cluster part whose slot moved under it: the redirection followed
                            // (the node it names answers, an ASK's maybe -TRYAGAIN while the
                            // slot's keys are on both nodes); one that cannot be followed answers
                            // TRYAGAIN, never the redirection (the client speaks plain Redis).
                            let reply = match raw.get(k) {
                                _ if !crate::cluster::redirected(reply) => Cow::Borrowed(reply),
                                Some(raw) => {
                                    let greeting = b.s.greeting.bytes.clone();
                                    match crate::cluster::follow(b.pool, greeting.as_deref(), reply, raw).await {
                                        Ok(last) => Cow::Owned(last),
                                        Err(Unfollowed::NotSent) => {
                                            Cow::Borrowed(crate::cluster::part_redirected(b.pool))
                                        }
                                        // Sent on and lost: it may have run, so not "try again".
                                        Err(Unfollowed::Lost) => {
                                            failure = Some(crate::conn::CONNECTION_LOST);
                                            continue;
                                        }
                                    }
                                }
                                None => Cow::Borrowed(crate::cluster::part_redirected(b.pool)),
                            };
                            replies.push((reply, positions));
                        }
                        Err(why) => {
                            b.failed(node);
                            failure = Some(*why);
                        }
                    }
                }
                merge(how, &replies, n, failure, b.out);
                let now = Instant::now();
                for pin in pins {
                    b.s.state.cluster.written(pin, now);
                }
                for ((hash, key), writer) in written {
                    delete_copies(b, hash, writer, &key).await;
                }
            }
        }
    }

    fn after(&mut self, servers: &mut Servers, side: &mut Servers) {
        self.reask = false;
        if std::mem::take(&mut self.switched) {
            *servers = Servers::shared();
            *side = Servers::default();
        }
    }
}

/// Whether a replica's `result` answers the client: not a failure, an error or a null.
fn replica_answered(result: &Slot, arena: &[u8]) -> bool {
    let Ok(range) = result else { return false };
    let reply = &arena[range.clone()];
    !(reply.starts_with(b"-") || matches!(reply, b"$-1\r\n" | b"*-1\r\n" | b"_\r\n"))
}

/// A cluster's redirection `reply` to the command `raw`, followed, and its last node's reply
/// answered (in the protocol of the batch's connections: the client's when it was sent, whatever
/// a later `HELLO` of the batch says).
async fn followed(b: &mut Batch<'_, Redis>, reply: &[u8], raw: &[u8]) {
    let greeting = b.s.greeting.bytes.clone();
    match crate::cluster::follow(b.pool, greeting.as_deref(), reply, raw).await {
        Ok(last) => b.out.extend_from_slice(&last),
        Err(Unfollowed::NotSent) => {
            b.out.extend_from_slice(b"-ERR keyroute: the cluster's redirection could not be followed\r\n")
        }
        Err(Unfollowed::Lost) => b.out.extend_from_slice(b"-ERR keyroute: server connection lost\r\n"),
    }
}

/// A read a replica could not answer, sent to its slot's master (a side connection: the batch's
/// still has replies to give), and its reply (a redirection followed) answered.
async fn from_master(b: &mut Batch<'_, Redis>, sent: &Sent) {
    let Some(master) = b.s.state.cluster.node(b.snap, sent.slot, 1, b.now).1 else {
        b.out.extend_from_slice(b"-ERR keyroute: no server available\r\n");
        return;
    };
    let Some(j) = b.side(master).await else {
        b.out.extend_from_slice(b"-ERR keyroute: server connection lost\r\n");
        return;
    };
    let server = &mut b.side.0[j];
    server.out.extend_from_slice(&sent.raw);
    let mut reply = Vec::new();
    let answered = match server.send_now(b.s.answer).await {
        true => reply_into(server, b.s.answer, &mut reply).await,
        false => Err("server connection lost"),
    };
    if answered.is_err() {
        server.broken = true;
    }
    b.side.sweep();
    match answered {
        Ok(()) if crate::cluster::redirected(&reply) => {
            b.succeeded(master);
            followed(b, &reply, &sent.raw).await;
        }
        Ok(()) => {
            b.succeeded(master);
            b.out.extend_from_slice(&reply);
        }
        Err(why) => server_error(b, master, why),
    }
}

/// A server's failure to answer: counted, and told the client.
fn server_error(b: &mut Batch<'_, Redis>, node: usize, why: &str) {
    b.failed(node);
    b.out.extend_from_slice(format!("-ERR keyroute: {why}\r\n").as_bytes());
}

/// What the proxy sends first on each server connection: `HELLO 3` for a client that speaks
/// RESP3 (with `AUTH default PASSWORD` when the servers need one), else `AUTH PASSWORD` or nothing.
fn greeting(password: Option<&str>, resp3: bool) -> Option<Arc<[u8]>> {
    let mut args: Vec<&[u8]> = Vec::new();
    if resp3 {
        args.extend([&b"HELLO"[..], b"3"]);
        if let Some(p) = password {
            args.extend([&b"AUTH"[..], b"default", p.as_bytes()]);
        }
    } else if let Some(p) = password {
        args.extend([&b"AUTH"[..], p.as_bytes()]);
    }
    if args.is_empty() {
        return None;
    }
    let mut g = Vec::new();
    codec::command(&mut g, args.into_iter());
    Some(Arc::from(g))
}

/// [`greeting`] and then `READONLY`: a cluster's replica serves the reads of its master's slots
/// (a master takes it and serves as before).
fn readonly_greeting(password: Option<&str>, resp3: bool) -> Arc<[u8]> {
    let mut g = greeting(password, resp3).map(|g| g.to_vec()).unwrap_or_default();
    codec::command(&mut g, [&b"READONLY"[..]].into_iter());
    Arc::from(g)
}

/// `HELLO [protover [AUTH username password] [SETNAME name]]`: its answer, and the protocol to
/// speak from now on (`Some(true)`: RESP3) when it names one and is accepted. `AUTH` in it
/// authenticates as the `AUTH` command does.
fn hello(args: &[&[u8]], password: Option<&str>, authenticated: &mut bool, resp3: bool) -> (Vec<u8>, Option<bool>) {
    let mut proto = None;
    let mut rest = &args[1..];
    if let Some(v) = rest.first() {
        match *v {
            b"2" => proto = Some(false),
            b"3" => proto = Some(true),
            _ if std::str::from_utf8(v).is_ok_and(|v| v.parse::<i64>().is_ok()) => {
                return (b"-NOPROTO unsupported protocol version\r\n".to_vec(), None);
            }
            _ => return (b"-ERR Protocol version is not an integer or out of range\r\n".to_vec(), None),
        }
        rest = &rest[1..];
    }
    let mut auth = None;
    while let Some(option) = rest.first() {
        let option = option.to_ascii_uppercase();
        match (option.as_slice(), rest.len()) {
            (b"AUTH", 3..) => {
                auth = Some((rest[1], rest[2]));
                rest = &rest[3..];
            }
            (b"SETNAME", 2..) => rest = &rest[2..],
            _ => {
                let message = format!("-ERR Syntax error in HELLO option '{}'\r\n", String::from_utf8_lossy(&option));
                return (message.into_bytes(), None);
            }
        }
    }
    if let Some((user, given)) = auth {
        // With no password on the listener, the default user takes any (Redis's `nopass`).
        let ok = user == b"default" && password.is_none_or(|p| matches_password(given, p));
        if !ok {
            return (b"-WRONGPASS invalid username-password pair or user is disabled.\r\n".to_vec(), None);
        }
        *authenticated = true;
    }
    if !*authenticated {
        return (
            b"-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n".to_vec(),
            None,
        );
    }
    let three = proto.unwrap_or(resp3);
    let fields: [(&str, Option<&str>, i64); 7] = [
        ("server", Some("keyroute"), 0),
        ("version", Some(env!("CARGO_PKG_VERSION")), 0),
        ("proto", None, if three { 3 } else { 2 }),
        ("id", None, 0),
        ("mode", Some("standalone"), 0),
        ("role", Some("master"), 0),
        ("modules", None, -1),
    ];
    let mut o = if three { b"%7\r\n".to_vec() } else { b"*14\r\n".to_vec() };
    for (name, text, number) in fields {
        codec::bulk(&mut o, name.as_bytes());
        match (text, number) {
            (Some(t), _) => codec::bulk(&mut o, t.as_bytes()),
            (None, -1) => o.extend_from_slice(b"*0\r\n"),
            (None, n) => o.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        }
    }
    (o, proto)
}

/// Whether `given` is the listener's password, in time independent of where they differ.
fn matches_password(given: &[u8], password: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    bool::from(given.ct_eq(password.as_bytes()))
}

/// Whether some keys of a command of several (`MSET`'s every other argument, `EVAL`'s `numkeys`)
/// route to another pool than the batch's.
fn off_route(b: &Batch<'_, Redis>, name: &str, args: &[&[u8]]) -> bool {
    let read = matches!(name, "MGET" | "EXISTS" | "EVAL_RO" | "EVALSHA_RO");
    let keys: Vec<&[u8]> = match name {
        "MSET" | "MSETNX" => args.iter().skip(1).step_by(2).copied().collect(),
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" => {
            let n = args.get(2).and_then(|n| std::str::from_utf8(n).ok()).and_then(|n| n.parse::<usize>().ok());
            args.iter().skip(3).take(n.unwrap_or(0)).copied().collect()
        }
        _ => args.iter().skip(1).copied().collect(),
    };
    b.off_route(keys.into_iter(), read)
}

/// One command: answered here, refused, or sent (whole, or split by server).
async fn serve_command(b: &mut Batch<'_, Redis>, pw: Option<&str>, name: &str, args: &[&[u8]], raw: &[u8]) -> Pending {
    let mut scratch = Vec::new();
    let arity = |min: usize| args.len() >= min;
    match name {
        "PING" => {
            let mut o = Vec::new();
            match args.get(1) {
                Some(msg) => codec::bulk(&mut o, msg),
                None => o.extend_from_slice(b"+PONG\r\n"),
            }
            return Pending::Ready(o);
        }
        "ECHO" if args.len() == 2 => {
            let mut o = Vec::new();
            codec::bulk(&mut o, args[1]);
            return Pending::Ready(o);
        }
        "SELECT" if args.len() == 2 => {
            return Pending::Ready(if args[1] == b"0" {
                b"+OK\r\n".to_vec()
            } else {
                error(&mut scratch, "only database 0 is served (keys of other databases would share its servers)")
            });
        }
        "COMMAND" => return Pending::Ready(b"*0\r\n".to_vec()),
        "CLIENT" if args.len() >= 2 && matches!(args[1].to_ascii_uppercase().as_slice(), b"SETNAME" | b"SETINFO") => {
            return Pending::Ready(b"+OK\r\n".to_vec());
        }
        "MGET" | "DEL" | "UNLINK" | "EXISTS" | "TOUCH" | "MSET" | "MSETNX" | "EVAL" | "EVALSHA" | "EVAL_RO"
        | "EVALSHA_RO"
            if b.ctx.listener.routed() && off_route(b, name, args) =>
        {
            return Pending::Ready(error(&mut scratch, "keys of one command route to different pools"));
        }
        "MGET" | "DEL" | "UNLINK" | "EXISTS" | "TOUCH" if arity(2) => {
            let how = if name == "MGET" { Merge::Values } else { Merge::Sum };
            return split(b, pw, how, args[0], &args[1..], 1).await;
        }
        "MSET" if arity(3) && args.len() % 2 == 1 => {
            return split(b, pw, Merge::Ok, args[0], &args[1..], 2).await;
        }
        "MSETNX" if arity(3) && args.len() % 2 == 1 => {
            let keys: Vec<&[u8]> = args[1..].iter().step_by(2).copied().collect();
            return together(b, pw, name, &keys, raw).await;
        }
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" if arity(3) => {
            let numkeys = std::str::from_utf8(args[2]).ok().and_then(|n| n.parse::<usize>().ok());
            // (Compared as a count of the arguments left: a huge numkeys must not overflow.)
            let Some(numkeys) = numkeys.filter(|&k| k <= args.len() - 3) else {
                return Pending::Ready(b"-ERR Number of keys can't be greater than number of args\r\n".to_vec());
            };
            if numkeys == 0 {
                return Pending::Ready(error(&mut scratch, &format!("{name} without keys has no server to go to")));
            }
            return together(b, pw, name, &args[3..3 + numkeys], raw).await;
        }
        _ => {}
    }
    // PFCOUNT of one key counts it; of several it merges them, on one server only.
    if let Some(access) = commands::one_key(name, args.len()) {
        if args.len() < 2 {
            return Pending::Ready(
                format!("-ERR wrong number of arguments for '{}' command\r\n", name.to_ascii_lowercase()).into_bytes(),
            );
        }
        return one(b, pw, access, name, args[1], raw).await;
    }
    let message = match commands::refusal(name) {
        Some(why) => format!("{name} {why}: not proxied"),
        None => format!("unknown command or not proxied: '{}'", name.escape_debug()),
    };
    Pending::Ready(error(&mut scratch, &message))
}

/// The key's placement: its hash tag's, when it has one.
fn placed(b: &mut Batch<'_, Redis>, key: &[u8]) -> Placed {
    let part = placed_part(b.snap.config().strategy, key);
    b.placed(key, part)
}

/// The part of a key that places it: its `{hash tag}` (as Redis Cluster and twemproxy users
/// write them), except in the `twemproxy` mode, which places as nutcracker does: by the pool's
/// own `hash_tag`, and by the whole key when it has none.
pub(crate) fn placed_part(strategy: keyroute::Strategy, key: &[u8]) -> &[u8] {
    match strategy {
        keyroute::Strategy::Compat(keyroute::compat::Mode::Twemproxy) => key,
        _ => codec::hash_tag(key),
    }
}

/// The node a key goes to: its owner in a store's handoff (the key moved there first: see
/// [`read_through`]), or its placement on the batch's table; `None` when no server is available.
async fn node_for(b: &mut Batch<'_, Redis>, pw: Option<&str>, key: &[u8]) -> Option<usize> {
    let hash = placed(b, key);
    node_of(b, pw, hash, key, Access::Write).await
}

/// [`node_for`] of a key already placed (hashed once, and counted once in the pool's key
/// statistics and hot-key detection), for a command that reads it only or writes it (`access`: in
/// a cluster pool whose replicas serve reads, a write pins its key to its master).
async fn node_of(
    b: &mut Batch<'_, Redis>,
    pw: Option<&str>,
    hash: Placed,
    key: &[u8],
    access: Access,
) -> Option<usize> {
    if b.snap.config().cluster.is_some()
        && let Some(node) = cluster_target(b, pw, (key, hash), access, false).node
    {
        return Some(node);
    }
    if let Some(node) = read_through(b, pw, hash, key).await {
        return Some(node);
    }
    b.pick(hash, &[], false).map(|d| d.node)
}

/// Where a command of one key goes in a Redis Cluster pool, by the pool's map (`None`s without
/// one, or for a node not a member yet).
struct Target {
    /// The node: its slot's master, or for a read that may go to a replica, the least loaded of
    /// its slot's nodes (see [`crate::cluster::Cluster::node`]).
    node: Option<usize>,
    /// The slot's master.
    master: Option<usize>,
    /// A write in a pool whose replicas serve reads: the key's pin (see [`crate::cluster::Cluster::written`]).
    pin: Option<u64>,
}

/// Whether the batch's pool is a cluster whose replicas serve reads.
fn replica_reads(b: &Batch<'_, Redis>) -> bool {
    b.snap.config().cluster.is_some_and(|c| c.replica_reads != ReplicaReads::Never)
}

/// The place of `key`'s last write among the pool's pins: its placement hash (its hash tag's),
/// or its slot when the strategy has none.
fn pin_of(hash: Placed, key: &[u8]) -> u64 {
    hash.0.unwrap_or_else(|| u64::from(keyroute::slots::key_slot(key)))
}

/// The [`Target`] of `key` (placed `hash`) for a command that reads it only or writes it
/// (`access`), which may go to a replica (`replicas`: a command of one key). The pool's refresh
/// task starts here, with the servers' `AUTH`; a write's key is pinned to its master for a while.
fn cluster_target(
    b: &Batch<'_, Redis>,
    pw: Option<&str>,
    (key, hash): (&[u8], Placed),
    access: Access,
    replicas: bool,
) -> Target {
    let cluster = &b.s.state.cluster;
    cluster.start(&b.ctx.fleet, b.pool, || greeting(pw, false));
    let slot = keyroute::slots::key_slot(key);
    let reads = b.snap.config().cluster.map_or(ReplicaReads::Never, |c| c.replica_reads);
    let (mut readers, mut pin) = (1, None);
    if reads != ReplicaReads::Never {
        let p = pin_of(hash, key);
        if access == Access::Write {
            cluster.written(p, Instant::now());
            pin = Some(p);
        } else if replicas {
            let hot = hash.0.zip(b.snap.hot()).map_or(0, |(h, hot)| hot.replicas(h));
            readers = cluster.readers(reads, hot, p, Instant::now());
        }
    }
    let (node, master) = cluster.node(b.snap, slot, readers, b.now);
    Target { node, master, pin }
}

/// The node of a read: `node` when it is its slot's master (`master`), or a replica that can be
/// reached; else (a replica that cannot be: counted against it, and not chosen for a while) the
/// master.
async fn reachable(b: &mut Batch<'_, Redis>, node: Option<usize>, master: Option<usize>) -> Option<usize> {
    match node {
        Some(n) if node != master => {
            if b.connect(n).await.is_some() {
                return node;
            }
            b.s.state.cluster.avoid(b.worker(n).address, Instant::now());
            master
        }
        _ => node,
    }
}

/// A command of one key in a Redis Cluster pool: to its slot's master by the map, or a replica for
/// a read that may go to one (without a map, where the pool's strategy places it: the cluster
/// redirects it), the command kept for a redirection to follow, or for the master to answer what
/// a replica could not.
async fn cluster_one(
    b: &mut Batch<'_, Redis>,
    pw: Option<&str>,
    access: Access,
    hash: Placed,
    key: &[u8],
    raw: &[u8],
) -> Pending {
    let t = cluster_target(b, pw, (key, hash), access, true);
    let to = reachable(b, t.node, t.master).await;
    let Some((server, node)) = b.place(to, hash, false).await else {
        return Pending::Ready(b"-ERR keyroute: no server available\r\n".to_vec());
    };
    b.servers.0[server].out.extend_from_slice(raw);
    // (A read on a replica, by the map: a failed master's read placed by the strategy too.)
    let replica = access == Access::Read && t.master.is_some() && Some(node) != t.master && replica_reads(b);
    let sent = Sent { raw: raw.into(), slot: keyroute::slots::key_slot(key), replica, pin: t.pin };
    Pending::One { server, node, written: None, cluster: Some(Box::new(sent)) }
}

/// A key whose owner joined the pool within its handoff window, and was another member's before:
/// the key is moved from that member first (`MIGRATE`, atomic there, never replacing what the
/// new owner has), and the new owner is returned. A command then never starts from nothing on a
/// key that has not moved yet. `keyroute move` moves the keys no command touched, with the same
/// `MIGRATE`, so whichever comes first moves a key and the other finds nothing.
async fn read_through(b: &mut Batch<'_, Redis>, pw: Option<&str>, hash: Placed, key: &[u8]) -> Option<usize> {
    let (node, previous) = b.snap.store_handoff(hash.0?, b.now)?;
    let target = b.snap.workers()[node].address;
    let source = b.snap.workers()[previous].address;
    if let Some(i) = b.side(previous).await {
        let (host, port) = (target.ip().to_string(), target.port().to_string());
        let timeout = b.s.answer.as_millis().to_string();
        let mut args: Vec<&[u8]> = vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), b"", b"0", timeout.as_bytes()];
        if let Some(p) = pw {
            args.extend([&b"AUTH"[..], p.as_bytes()]);
        }
        args.extend([&b"KEYS"[..], key]);
        let server = &mut b.side.0[i];
        codec::command(&mut server.out, args.into_iter());
        let mut reply = Vec::new();
        let answered = match server.send_now(b.s.answer).await {
            true => reply_into(server, b.s.answer, &mut reply).await,
            false => Err("server connection lost"),
        };
        match answered {
            Ok(()) if reply.starts_with(b"+OK") => {
                b.pool.metrics.warm_fills.fetch_add(1, Relaxed);
            }
            // NOKEY: nothing there (or moved already); BUSYKEY: the new owner's is newer.
            Ok(()) if reply.starts_with(b"+NOKEY") || reply.starts_with(b"-BUSYKEY") => {}
            Ok(()) => {
                tracing::warn!(server = %source, to = %target, error = %String::from_utf8_lossy(&reply).trim_end(), "a key could not be read through from its previous owner");
            }
            Err(_) => b.failed(previous),
        }
        b.side.sweep();
    }
    Some(node)
}

/// A command of one key, sent whole to the key's server (past servers that cannot be reached).
/// A hot key's `GET` goes where the steering rule sends it (the least loaded of its replicas), and
/// a miss on a replica is filled from the owner; every other command of the key goes to its
/// owner, and a write deletes the replicas' copies.
async fn one(
    b: &mut Batch<'_, Redis>,
    pw: Option<&str>,
    access: Access,
    name: &str,
    key: &[u8],
    raw: &[u8],
) -> Pending {
    let hash = placed(b, key);
    if b.snap.config().cluster.is_some() {
        return cluster_one(b, pw, access, hash, key, raw).await;
    }
    if b.snap.config().shadow.is_some() {
        let part = placed_part(b.snap.config().strategy, key);
        crate::shadow::offer(b, (part, hash), raw, crate::shadow::Frame::Redis, b.s.greeting.bytes.clone());
    }
    let mut written = None;
    let mut replicas = false;
    if let Some(h) = hash.0
        && let Some(hot) = b.snap.hot()
    {
        let r = hot.replicas(h);
        if name == "GET" && r > 1 {
            replicas = true;
        } else if access == Access::Write {
            invalidate_copies(b, h, r, key).await;
            written = Some((h, key.to_vec()));
        }
    }
    // A key read through from its previous owner goes to its new one (then, as any key, placed).
    let to = read_through(b, pw, hash, key).await;
    let Some((server, node)) = b.place(to, hash, replicas && to.is_none()).await else {
        return Pending::Ready(b"-ERR keyroute: no server available\r\n".to_vec());
    };
    b.servers.0[server].out.extend_from_slice(raw);
    // A hot key's replica other than the owner: its miss is read from the owner and copied to it.
    // (The owner is looked up only then: it is one more pass over the table.)
    let owner = if replicas { hash.0.and_then(|h| Some((h, b.snap.policy().owner(h)?))) } else { None };
    match owner {
        Some((h, owner)) if owner != node => Pending::HotGet { server, node, owner, hash: h, key: key.to_vec() },
        _ => Pending::One { server, node, written, cluster: None },
    }
}

/// The longest a hot key's copy on a replica lives (milliseconds): how long the pool remembers
/// which servers may hold one, and how stale a copy made by another gateway can be.
const HOT_COPY_MS: i64 = crate::copies::COPY_LIFETIME.as_millis() as i64;

/// A write of a key in a pool with hot keys: the copies on its replicas other than the owner (the
/// first `r` of its ranking while it is hot, and any server that may still hold a copy, hot or
/// not) are deleted in the same batch, before any later read of them on the same connections;
/// after the owner's answer they are deleted again, past any fill that raced the write (see the
/// `pool::copies` module).
async fn invalidate_copies(b: &mut Batch<'_, Redis>, h: u64, r: usize, key: &[u8]) {
    let Some(owner) = b.snap.policy().owner(h) else { return };
    for node in b.copy_holders(h, r.max(1), owner) {
        let Some(server) = b.connect(node).await else { continue };
        codec::command(&mut b.servers.0[server].out, [&b"DEL"[..], key].into_iter());
        b.pending.push(Pending::Discard { server });
    }
}

/// A hot key's miss on a replica: `GET` and `PTTL` on the owner (a side connection), the value
/// answered, and copied to the replica (`SET ... PX`, at most [`HOT_COPY_MS`]).
async fn hot_fill(b: &mut Batch<'_, Redis>, (hash, key): (u64, &[u8]), owner: usize, replica: usize) -> bool {
    // Recorded before the owner is read: a write acknowledged from now on deletes this copy, or
    // makes the fill drop it.
    let holder = b.snap.workers()[replica].address;
    let fill = b.snap.hot().map(|_| b.s.state.copies.begin_fill(hash, holder, Instant::now()));
    let Some(j) = b.side(owner).await else { return false };
    codec::command(&mut b.side.0[j].out, [&b"GET"[..], key].into_iter());
    codec::command(&mut b.side.0[j].out, [&b"PTTL"[..], key].into_iter());
    flush(b.side, b.s.answer).await;
    let (mut value, mut ttl) = (Vec::new(), Vec::new());
    let ok = reply_into(&mut b.side.0[j], b.s.answer, &mut value).await.is_ok()
        && reply_into(&mut b.side.0[j], b.s.answer, &mut ttl).await.is_ok();
    b.side.sweep();
    if !ok {
        b.failed(owner);
        return false;
    }
    b.out.extend_from_slice(&value);
    let Some(bytes) = bulk_payload(&value) else { return true };
    let ms = std::str::from_utf8(ttl.strip_prefix(b":").unwrap_or_default())
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .unwrap_or(-1);
    let px = if ms < 0 { HOT_COPY_MS } else { ms.min(HOT_COPY_MS) }.max(1).to_string();
    // The copy lands only if no write was acknowledged since the owner was read, and no write's
    // deletes are sent until it has landed.
    let Some(fill) = fill else { return true };
    let Some(landing) = b.s.state.copies.landing(fill).await else { return true };
    // On a side connection too: the replica's batch connection still has this batch's replies
    // to give.
    if let Some(k) = b.side(replica).await {
        let server = &mut b.side.0[k];
        codec::command(&mut server.out, [&b"SET"[..], key, bytes, b"PX", px.as_bytes()].into_iter());
        let mut dropped = Vec::new();
        if server.send_now(b.s.answer).await && reply_into(server, b.s.answer, &mut dropped).await.is_ok() {
            b.pool.metrics.warm_fills.fetch_add(1, Relaxed);
        } else {
            server.broken = true;
        }
        b.side.sweep();
    }
    b.s.state.copies.landed(landing, Instant::now());
    true
}

/// Deletes the copies of a key that `writer` acknowledged a write of (`DEL`).
async fn delete_copies(b: &mut Batch<'_, Redis>, hash: u64, writer: usize, key: &[u8]) {
    let mut del = Vec::new();
    codec::command(&mut del, [&b"DEL"[..], key].into_iter());
    crate::driver::delete_copies(b, hash, writer, &del, &Reply).await;
}

/// The payload of a bulk string reply (`None` for a null, or another type).
fn bulk_payload(reply: &[u8]) -> Option<&[u8]> {
    let rest = reply.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let n: usize = std::str::from_utf8(rest[..nl].strip_suffix(b"\r")?).ok()?.parse().ok()?;
    rest.get(nl + 1..nl + 1 + n)
}

/// A command whose keys must share a server (it is atomic there): sent whole to it, or refused.
async fn together(b: &mut Batch<'_, Redis>, pw: Option<&str>, name: &str, keys: &[&[u8]], raw: &[u8]) -> Pending {
    if b.snap.config().cluster.is_some() {
        let first = keys.first().map(|k| keyroute::slots::key_slot(k));
        if keys.iter().any(|k| Some(keyroute::slots::key_slot(k)) != first) {
            return Pending::Ready(b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec());
        }
    }
    let mut nodes = Vec::with_capacity(keys.len());
    for k in keys {
        nodes.push(node_for(b, pw, k).await);
    }
    if nodes.windows(2).any(|w| w[0] != w[1]) {
        let mut scratch = Vec::new();
        return Pending::Ready(error(
            &mut scratch,
            &format!("the keys of {name} are on different servers (give them one {{hash tag}})"),
        ));
    }
    one(b, pw, Access::Write, name, keys[0], raw).await
}

/// A command split by server: each server gets the same command over its keys (`stride` 2: key
/// and value pairs).
async fn split(
    b: &mut Batch<'_, Redis>,
    pw: Option<&str>,
    how: Merge,
    verb: &[u8],
    items: &[&[u8]],
    stride: usize,
) -> Pending {
    // (node, slot in a cluster pool) -> the client's positions of its keys (a few servers, a few
    // keys each, on the stack): a cluster's node takes a command of several keys of one slot.
    let mut by_node: SmallVec<[((usize, u16), Positions); 4]> = SmallVec::new();
    let cluster = b.snap.config().cluster.is_some();
    if cluster {
        // Split on the cluster's map: its first one is waited for (a second at most).
        b.s.state.cluster.start(&b.ctx.fleet, b.pool, || greeting(pw, false));
        b.s.state.cluster.first_map(Duration::from_secs(1)).await;
    }
    let n = items.len() / stride;
    let writes = matches!(how, Merge::Ok) || verb.eq_ignore_ascii_case(b"DEL") || verb.eq_ignore_ascii_case(b"UNLINK");
    let mut written = Vec::new();
    let mut pins = Vec::new();
    for i in 0..n {
        let key = items[i * stride];
        // One hash a key (twemproxy's placement is an MD5 of it), counted once.
        let hash = placed(b, key);
        let mut hot_hash = None;
        // (A cluster's hot keys have no copies of the proxy's: its replicas are the cluster's.)
        if writes
            && !cluster
            && let Some(h) = hash.0
            && let Some(r) = b.snap.hot().map(|hot| hot.replicas(h))
        {
            invalidate_copies(b, h, r, key).await;
            hot_hash = Some(h);
        }
        // (TOUCH changes what a cluster's replica would not: its key's master is pinned too.)
        let touch = verb.eq_ignore_ascii_case(b"TOUCH");
        let access = if writes || touch { Access::Write } else { Access::Read };
        if access == Access::Write && replica_reads(b) {
            pins.push(pin_of(hash, key));
        }
        let Some(node) = node_of(b, pw, hash, key, access).await else {
            b.pool.metrics.no_worker.fetch_add(1, Relaxed);
            return Pending::Ready(b"-ERR keyroute: no server available\r\n".to_vec());
        };
        if let Some(h) = hot_hash {
            written.push(((h, key.to_vec()), node));
        }
        let group = (node, if cluster { keyroute::slots::key_slot(key) } else { 0 });
        match by_node.iter_mut().find(|(x, _)| *x == group) {
            Some((_, positions)) => positions.push(i),
            None => by_node.push((group, smallvec::smallvec![i])),
        }
    }
    // Every server's connection first: a part sent is a reply owed, so nothing is sent unless
    // every part can be.
    let mut conns: SmallVec<[usize; 4]> = SmallVec::with_capacity(by_node.len());
    for ((node, _), _) in &by_node {
        match b.connect(*node).await {
            Some(server) => conns.push(server),
            None => return Pending::Ready(b"-ERR keyroute: a server of these keys cannot be reached\r\n".to_vec()),
        }
    }
    let mut parts = Vec::with_capacity(by_node.len());
    let mut raw = Vec::new();
    for (((node, _), positions), server) in by_node.into_iter().zip(conns) {
        b.sent(node);
        let words = std::iter::once(verb)
            .chain(positions.iter().flat_map(|&i| items[i * stride..(i + 1) * stride].iter().copied()));
        let out = &mut b.servers.0[server].out;
        let at = out.len();
        codec::command(out, Counted(words, 1 + positions.len() * stride));
        if cluster {
            raw.push(Box::from(&out[at..]));
        }
        parts.push((server, node, positions));
    }
    Pending::Split { how, parts, n, written, raw, pins }
}

/// An iterator whose length is known ahead (a command's words, for its array header).
struct Counted<I>(I, usize);

impl<'a, I: Iterator<Item = &'a [u8]>> Iterator for Counted<I> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let next = self.0.next();
        self.1 = self.1.saturating_sub(usize::from(next.is_some()));
        next
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<'a, I: Iterator<Item = &'a [u8]>> ExactSizeIterator for Counted<I> {}

/// A split command's reply from its servers' replies.
fn merge(how: Merge, replies: &[(Cow<'_, [u8]>, Positions)], n: usize, failure: Option<&str>, out: &mut Vec<u8>) {
    if let Some(why) = failure {
        out.extend_from_slice(format!("-ERR keyroute: {why}\r\n").as_bytes());
        return;
    }
    // A server's error is the command's.
    if let Some((r, _)) = replies.iter().find(|(r, _)| r.first() == Some(&b'-')) {
        out.extend_from_slice(r);
        return;
    }
    match how {
        Merge::Ok => out.extend_from_slice(b"+OK\r\n"),
        Merge::Sum => {
            let sum: i64 = replies
                .iter()
                .filter_map(|(r, _)| std::str::from_utf8(r.strip_prefix(b":")?).ok()?.trim().parse::<i64>().ok())
                .sum();
            let _ = std::io::Write::write_fmt(out, format_args!(":{sum}\r\n"));
        }
        Merge::Values => {
            let mut values: Vec<&[u8]> = vec![b"$-1\r\n"; n];
            for (r, positions) in replies {
                let Some(elements) = codec::elements(r) else { continue };
                for (e, &i) in elements.iter().zip(positions) {
                    values[i] = e;
                }
            }
            let _ = std::io::Write::write_fmt(out, format_args!("*{n}\r\n"));
            for v in values {
                out.extend_from_slice(v);
            }
        }
    }
}

/// Appends the server's next reply to `out`.
async fn reply_into(server: &mut Server, timeout: Duration, out: &mut Vec<u8>) -> Result<(), Lost> {
    let framing = |buf: &[u8]| codec::reply_len(buf).map_err(|_| crate::conn::Garbled);
    answer_into(server, timeout, out, async |server: &mut Server, out: &mut Vec<u8>| {
        let n = frame(server, &framing).await?;
        out.extend_from_slice(&server.buffered()[..n]);
        server.consume(n);
        Ok(())
    })
    .await
}

/// The check of a Redis server: `PING` on a fresh connection, after `AUTH` with the servers'
/// password when the proxy has one.
#[derive(Debug)]
pub(crate) struct Check {
    /// The time to connect.
    pub(crate) connect: Duration,
    /// The servers' password.
    pub(crate) password: Option<String>,
}

impl keyroute_fleet::pool::Check for Check {
    fn check<'a>(
        &'a self,
        worker: &'a Arc<keyroute_fleet::pool::WorkerState>,
    ) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Ok(mut conn) = crate::conn::ServerConn::open(worker.address, self.connect).await else { return false };
            let mut request = Vec::new();
            if let Some(p) = &self.password {
                codec::command(&mut request, [&b"AUTH"[..], p.as_bytes()].into_iter());
            }
            codec::command(&mut request, [&b"PING"[..]].into_iter());
            if conn.write(&request).await.is_err() {
                return false;
            }
            let framing = |buf: &[u8]| codec::reply_len(buf).map_err(|_| crate::conn::Garbled);
            if self.password.is_some() {
                match conn.frame(framing).await {
                    Ok(n) if conn.buffered().starts_with(b"+OK") => conn.consume(n),
                    _ => return false,
                }
            }
            conn.frame(framing).await.is_ok() && conn.buffered().starts_with(b"+PONG")
        })
    }
}

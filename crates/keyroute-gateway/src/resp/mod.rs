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
//! - **Hot keys** (with `[pool.hot_keys]`, detected and sized as for HTTP): a hot key's `GET`s
//!   take its replicas (the first of its ranking) in turn; a replica's miss is read from the
//!   owner (`GET` and `PTTL`), answered, and copied to the replica with `SET ... PX` (at most
//!   10 s, which bounds how stale a copy can be when its fill raced a write). Any other command
//!   that writes the key (and `DEL`, `UNLINK`, `MSET` of it) goes to the owner and deletes the
//!   replicas' copies in the same batch, so no later read through the proxy sees a value older
//!   than the last write it forwarded. Other reads of a hot key go to its owner. Copies are a
//!   cache's: on a pool whose keys `keyroute move` will move, leave hot keys off (a copy on a
//!   new owner would count as a newer value there).
//!
//! Commands are served in pipelined batches as the memcached listener's are (see
//! [`crate::backend`]): sent to their servers first, one write per server, then the replies read in
//! the client's order. A server that cannot be reached is a passive-ejection failure and a
//! one-key command goes to the key's next server; a server that fails after the command was sent
//! answers `-ERR keyroute: server timeout` (or `connection lost`), counted.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Buf as _;
use keyroute_cache_proto::commands::{self, Access};
use keyroute_cache_proto::resp as codec;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::backend::{
    self, Client, Placed, Read, Server, Servers, Settings, connect, failed, pick, pool_of, succeeded,
};
use crate::config::CacheListener;
use crate::pool::{Pool, Snapshot};
use crate::state::Shared;

/// A command of the batch, once sent: where its reply comes from.
enum Pending {
    /// Answered by the proxy.
    Ready(Vec<u8>),
    /// One reply from one server (`node` of the batch's snapshot); `written`, a key the command
    /// writes in a pool with hot keys (its hash and bytes), whose copies on replicas are deleted
    /// once the server answered (see [`backend::delete_copies`]).
    One { server: usize, node: usize, written: Option<Written> },
    /// A split command's parts: (server, node, the client's positions of its keys), and the keys
    /// it writes in a pool with hot keys, whose copies are deleted once the servers answered.
    Split { how: Merge, parts: Vec<(usize, usize, Vec<usize>)>, n: usize, written: Vec<(Written, usize)> },
    /// A hot key's `GET` on a replica (`node`) that is not its owner: a miss there is read from
    /// the owner, answered, and copied to the replica.
    HotGet { server: usize, node: usize, owner: usize, hash: u64, key: Vec<u8> },
    /// A reply read and dropped (a hot key's copy deleted on a replica).
    Discard { server: usize },
}

/// A key a command writes: its hash and its bytes.
type Written = (u64, Vec<u8>);

/// A RESP reply, framed as a whole.
struct Reply;

impl backend::Framing for Reply {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        s: &'a Settings,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), &'static str>> + Send + 'a {
        reply_into(server, s, out)
    }
}

impl Pending {
    /// How many replies this command reads.
    fn parts(&self) -> usize {
        match self {
            Pending::Ready(_) => 0,
            Pending::One { .. } | Pending::HotGet { .. } | Pending::Discard { .. } => 1,
            Pending::Split { parts, .. } => parts.len(),
        }
    }

    /// Appends the replies this command reads, in order.
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
enum Merge {
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

/// What a client connection has said of itself: its password given, its protocol.
struct Session {
    /// The proxy's greeting to each server it connects to, for each protocol the client may
    /// speak.
    greetings: [Option<Arc<[u8]>>; 2],
    password: Option<Arc<str>>,
    authenticated: bool,
    resp3: bool,
}

/// Serves one client connection until it closes, sends `QUIT`, or the gateway stops.
pub(crate) async fn serve<H: Send + 'static>(stream: TcpStream, shared: Arc<Shared>, config: CacheListener, _held: H) {
    let mut c = Client::new(stream, &shared);
    let mut pending: Vec<Pending> = Vec::new();
    let mut session = Session {
        greetings: [
            greeting(config.server_password.as_deref(), false),
            greeting(config.server_password.as_deref(), true),
        ],
        password: config.server_password.as_deref().map(Arc::from),
        authenticated: config.password.is_none(),
        resp3: false,
    };
    loop {
        // A batch's work is a future of its own, on the heap while it runs: an idle connection's
        // task holds only its client and its read.
        if !Box::pin(batch(&mut c, &shared, &config, &mut session, &mut pending)).await {
            return;
        }
        // More whole commands than one batch are served before reading.
        let more = matches!(codec::request(&c.input, config.max_item_bytes), Ok(Some(_)));
        if !more && !c.read().await {
            return;
        }
    }
}

/// One batch: the whole commands buffered (up to 1024) served and answered; `false` when the
/// connection is to close.
async fn batch(
    c: &mut Client,
    shared: &Shared,
    config: &CacheListener,
    session: &mut Session,
    pending: &mut Vec<Pending>,
) -> bool {
    let Some(pool) = pool_of(shared, config) else { return false };
    let snap = pool.snapshot();
    let mut settings = Settings::of(&pool, &snap);
    settings.greeting = session.greetings[usize::from(session.resp3)].clone();
    settings.password = session.password.clone();
    settings.greeting_whole = |b| matches!(codec::reply_len(b), Ok(Some(_)));
    let now = Instant::now();
    let mut close = false;
    let mut switched = false;
    while pending.len() < 1024 {
        let (n, parsed) = match codec::request(&c.input, config.max_item_bytes) {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(codec::Unframed(why)) => {
                // Nothing of it is sent: the client is answered Redis's error and closed, as
                // Redis would close it, and the shared server connections are untouched.
                pending.push(Pending::Ready(format!("-{why}\r\n").into_bytes()));
                close = true;
                break;
            }
        };
        // What a server is sent: an array as the client framed it (validated as Redis reads
        // it), or an inline command re-encoded as an array, so that the server reads the
        // arguments the proxy placed (a quoted key is placed by what Redis stores).
        let inline_raw;
        let (args, raw): (Vec<&[u8]>, &[u8]) = match &parsed {
            codec::Args::Bulk(ranges) => (ranges.iter().map(|r| &c.input[r.clone()]).collect(), &c.input[..n]),
            codec::Args::Inline(words) => {
                let mut encoded = Vec::new();
                codec::command(&mut encoded, words.iter().map(Vec::as_slice));
                inline_raw = encoded;
                (words.iter().map(Vec::as_slice).collect(), &inline_raw)
            }
        };
        if args.is_empty() {
            c.input.advance(n);
            continue;
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
        if name == "QUIT" {
            pending.push(Pending::Ready(b"+OK\r\n".to_vec()));
            close = true;
            break;
        }
        if name == "AUTH" && config.password.is_some() {
            // AUTH PASSWORD, or AUTH default PASSWORD (Redis 6's form).
            let given = match args.len() {
                2 => Some(args[1]),
                3 if args[1] == b"default" => Some(args[2]),
                _ => None,
            };
            session.authenticated =
                given.is_some_and(|g| matches_password(g, config.password.as_deref().unwrap_or("")));
            let answer: &[u8] = match (given, session.authenticated) {
                (None, _) => b"-ERR wrong number of arguments for 'auth' command\r\n",
                (_, true) => b"+OK\r\n",
                (_, false) => b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
            };
            pending.push(Pending::Ready(answer.to_vec()));
            c.input.advance(n);
            continue;
        }
        if name == "HELLO" {
            let (answer, proto) = hello(&args, config.password.as_deref(), &mut session.authenticated, session.resp3);
            pending.push(Pending::Ready(answer));
            c.input.advance(n);
            if let Some(p) = proto.filter(|&p| p != session.resp3) {
                // The client's server connections speak its protocol: they are opened anew,
                // after this batch.
                session.resp3 = p;
                switched = true;
                break;
            }
            continue;
        }
        if !session.authenticated {
            pending.push(Pending::Ready(b"-NOAUTH Authentication required.\r\n".to_vec()));
            c.input.advance(n);
            continue;
        }
        let mut to = To {
            snap: &snap,
            pool: &pool,
            servers: &mut c.servers,
            side: &mut c.side,
            s: &settings,
            now,
            turn: &mut c.turn,
            extra: Vec::new(),
        };
        let p = serve_command(&mut to, name, &args, raw).await;
        let extra = std::mem::take(&mut to.extra);
        pending.push(p);
        pending.extend(extra);
        c.input.advance(n);
    }
    backend::flush(&mut c.servers, &settings).await;
    finish(&snap, &pool, pending, &mut c.servers, &mut c.side, &settings, now, &mut c.out).await;
    if !c.reply().await || close {
        return false;
    }
    if switched {
        c.servers = Servers::shared();
        c.side = Servers::default();
    }
    if pending.capacity() > 64 {
        *pending = Vec::new();
    }
    true
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

/// Where a batch's commands go: its snapshot of the pool, the client's connections to the
/// servers (the batch's, and the side ones of the read-through), the settings and the time.
struct To<'a> {
    snap: &'a Snapshot,
    pool: &'a Pool,
    servers: &'a mut Servers,
    side: &'a mut Servers,
    s: &'a Settings,
    now: Instant,
    /// Which replica of a hot key the next `GET` takes.
    turn: &'a mut usize,
    /// Requests sent besides the command's own (a hot key's copies deleted), whose replies are
    /// read and dropped: they follow the command in the batch.
    extra: Vec<Pending>,
}

/// One command: answered here, refused, or sent (whole, or split by server).
async fn serve_command(to: &mut To<'_>, name: &str, args: &[&[u8]], raw: &[u8]) -> Pending {
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
        "MGET" | "DEL" | "UNLINK" | "EXISTS" | "TOUCH" if arity(2) => {
            let how = if name == "MGET" { Merge::Values } else { Merge::Sum };
            let keys: Vec<&[u8]> = args[1..].to_vec();
            return split(to, how, args[0], &keys, 1).await;
        }
        "MSET" if arity(3) && args.len() % 2 == 1 => {
            let pairs: Vec<&[u8]> = args[1..].to_vec();
            return split(to, Merge::Ok, args[0], &pairs, 2).await;
        }
        "MSETNX" if arity(3) && args.len() % 2 == 1 => {
            let keys: Vec<&[u8]> = args[1..].iter().step_by(2).copied().collect();
            return together(to, name, &keys, raw).await;
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
            return together(to, name, &args[3..3 + numkeys], raw).await;
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
        return one(to, access, name, args[1], raw).await;
    }
    let message = match commands::refusal(name) {
        Some(why) => format!("{name} {why}: not proxied"),
        None => format!("unknown command or not proxied: '{}'", name.escape_debug()),
    };
    Pending::Ready(error(&mut scratch, &message))
}

/// The key's placement: its hash tag's, when it has one.
fn placed(pool: &Pool, snap: &Snapshot, key: &[u8]) -> Placed {
    Placed::of(pool, snap, placed_part(snap.config().strategy, key))
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
async fn node_for(to: &mut To<'_>, key: &[u8]) -> Option<usize> {
    let hash = placed(to.pool, to.snap, key);
    if let Some(node) = read_through(to, hash, key).await {
        return Some(node);
    }
    pick(to.pool, to.snap, hash, &[], to.now)
}

/// A key whose owner joined the pool within its handoff window, and was another member's before:
/// the key is moved from that member first (`MIGRATE`, atomic there, never replacing what the
/// new owner has), and the new owner is returned. A command then never starts from nothing on a
/// key that has not moved yet. `keyroute move` moves the keys no command touched, with the same
/// `MIGRATE`, so whichever comes first moves a key and the other finds nothing.
async fn read_through(to: &mut To<'_>, hash: Placed, key: &[u8]) -> Option<usize> {
    let (node, previous) = to.snap.store_handoff(hash.0?, to.now)?;
    let target = to.snap.workers()[node].address;
    let source = &to.snap.workers()[previous];
    if let Some(i) = connect(to.side, source, to.s).await {
        let (host, port) = (target.ip().to_string(), target.port().to_string());
        let timeout = to.s.answer.as_millis().to_string();
        let mut args: Vec<&[u8]> = vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), b"", b"0", timeout.as_bytes()];
        if let Some(p) = &to.s.password {
            args.extend([&b"AUTH"[..], p.as_bytes()]);
        }
        args.extend([&b"KEYS"[..], key]);
        let server = &mut to.side.0[i];
        codec::command(&mut server.out, args.into_iter());
        let mut reply = Vec::new();
        let answered = match server.send_now(to.s.answer).await {
            true => reply_into(server, to.s, &mut reply).await,
            false => Err("server connection lost"),
        };
        match answered {
            Ok(()) if reply.starts_with(b"+OK") => {
                to.pool.metrics.warm_fills.fetch_add(1, Relaxed);
            }
            // NOKEY: nothing there (or moved already); BUSYKEY: the new owner's is newer.
            Ok(()) if reply.starts_with(b"+NOKEY") || reply.starts_with(b"-BUSYKEY") => {}
            Ok(()) => {
                tracing::warn!(server = %source.address, to = %target, error = %String::from_utf8_lossy(&reply).trim_end(), "a key could not be read through from its previous owner");
            }
            Err(_) => failed(source, to.s),
        }
        to.side.sweep();
    }
    Some(node)
}

/// A command of one key, sent whole to the key's server (past servers that cannot be reached).
/// A hot key's `GET` takes its replicas in turn; its writes go to its owner and delete the
/// replicas' copies.
async fn one(to: &mut To<'_>, access: Access, name: &str, key: &[u8], raw: &[u8]) -> Pending {
    let hash = placed(to.pool, to.snap, key);
    let mut written = None;
    if let Some(h) = hash.0
        && let Some(hot) = to.snap.hot()
    {
        let r = hot.replicas(h);
        if name == "GET" && r > 1 {
            if let Some(p) = hot_get(to, h, r, key, raw).await {
                return p;
            }
        } else if access == Access::Write {
            invalidate_copies(to, h, r, key).await;
            written = Some((h, key.to_vec()));
        }
    }
    let placed = match read_through(to, hash, key).await {
        Some(node) => match connect(to.servers, &to.snap.workers()[node], to.s).await {
            Some(server) => Some((server, node)),
            None => backend::place(to.pool, to.snap, to.servers, to.s, hash, to.now).await,
        },
        None => backend::place(to.pool, to.snap, to.servers, to.s, hash, to.now).await,
    };
    match placed {
        Some((server, node)) => {
            to.servers.0[server].out.extend_from_slice(raw);
            Pending::One { server, node, written }
        }
        None => Pending::Ready(b"-ERR keyroute: no server available\r\n".to_vec()),
    }
}

/// The longest a hot key's copy on a replica lives (milliseconds): how long the pool remembers
/// which servers may hold one, and how stale a copy made by another gateway can be.
const HOT_COPY_MS: i64 = crate::copies::COPY_LIFETIME.as_millis() as i64;

/// A hot key's `GET` (`r` replicas): sent to the healthy replica whose turn it is. `None` when
/// that is the owner, or it cannot be reached (the command is then placed as usual).
async fn hot_get(to: &mut To<'_>, h: u64, r: usize, key: &[u8], raw: &[u8]) -> Option<Pending> {
    let owner = to.snap.policy().owner(h)?;
    let healthy: Vec<usize> = to
        .snap
        .policy()
        .ranked(h)
        .take(r)
        .filter(|&i| to.snap.state(i, to.now) == crate::pool::State::Healthy)
        .collect();
    if healthy.is_empty() {
        return None;
    }
    *to.turn = to.turn.wrapping_add(1);
    let node = healthy[*to.turn % healthy.len()];
    if node == owner {
        return None;
    }
    let server = connect(to.servers, &to.snap.workers()[node], to.s).await?;
    to.servers.0[server].out.extend_from_slice(raw);
    Some(Pending::HotGet { server, node, owner, hash: h, key: key.to_vec() })
}

/// A write of a key in a pool with hot keys: the copies on its replicas other than the owner (the
/// first `r` of its ranking while it is hot, and any server that may still hold a copy, hot or
/// not) are deleted in the same batch, before any later read of them on the same connections;
/// after the owner's answer they are deleted again, past any fill that raced the write (see the
/// `pool::copies` module).
async fn invalidate_copies(to: &mut To<'_>, h: u64, r: usize, key: &[u8]) {
    let Some(owner) = to.snap.policy().owner(h) else { return };
    let holders = if to.snap.hot().is_some() { to.s.copies.holders(h, to.now) } else { Vec::new() };
    let mut others: Vec<usize> = to.snap.policy().ranked(h).take(r.max(1)).filter(|&i| i != owner).collect();
    for a in holders {
        if let Some(i) = to.snap.workers().iter().position(|w| w.address == a)
            && i != owner
            && !others.contains(&i)
        {
            others.push(i);
        }
    }
    for node in others {
        let Some(server) = connect(to.servers, &to.snap.workers()[node], to.s).await else { continue };
        codec::command(&mut to.servers.0[server].out, [&b"DEL"[..], key].into_iter());
        to.extra.push(Pending::Discard { server });
    }
}

/// A hot key's miss on a replica: `GET` and `PTTL` on the owner (a side connection), the value
/// answered, and copied to the replica (`SET ... PX`, at most [`HOT_COPY_MS`]).
#[allow(clippy::too_many_arguments)]
async fn hot_fill(
    snap: &Snapshot,
    pool: &Pool,
    side: &mut Servers,
    s: &Settings,
    (hash, key): (u64, &[u8]),
    owner: usize,
    replica: usize,
    out: &mut Vec<u8>,
) -> bool {
    // Recorded before the owner is read: a write acknowledged from now on deletes this copy, or
    // makes the fill drop it.
    let fill = snap.hot().map(|_| s.copies.begin_fill(hash, snap.workers()[replica].address, Instant::now()));
    let Some(j) = connect(side, &snap.workers()[owner], s).await else { return false };
    codec::command(&mut side.0[j].out, [&b"GET"[..], key].into_iter());
    codec::command(&mut side.0[j].out, [&b"PTTL"[..], key].into_iter());
    backend::flush(side, s).await;
    let (mut value, mut ttl) = (Vec::new(), Vec::new());
    let ok = reply_into(&mut side.0[j], s, &mut value).await.is_ok()
        && reply_into(&mut side.0[j], s, &mut ttl).await.is_ok();
    side.sweep();
    if !ok {
        failed(&snap.workers()[owner], s);
        return false;
    }
    out.extend_from_slice(&value);
    let Some(bytes) = bulk_payload(&value) else { return true };
    let ms = std::str::from_utf8(ttl.strip_prefix(b":").unwrap_or_default())
        .ok()
        .and_then(|t| t.trim().parse::<i64>().ok())
        .unwrap_or(-1);
    let px = if ms < 0 { HOT_COPY_MS } else { ms.min(HOT_COPY_MS) }.max(1).to_string();
    // The copy lands only if no write was acknowledged since the owner was read, and no write's
    // deletes are sent until it has landed.
    let Some(fill) = fill else { return true };
    let Some(landing) = s.copies.landing(fill).await else { return true };
    // On a side connection too: the replica's batch connection still has this batch's replies
    // to give.
    if let Some(k) = connect(side, &snap.workers()[replica], s).await {
        let server = &mut side.0[k];
        codec::command(&mut server.out, [&b"SET"[..], key, bytes, b"PX", px.as_bytes()].into_iter());
        let mut dropped = Vec::new();
        if server.send_now(s.answer).await && reply_into(server, s, &mut dropped).await.is_ok() {
            pool.metrics.warm_fills.fetch_add(1, Relaxed);
        } else {
            server.broken = true;
        }
        side.sweep();
    }
    s.copies.landed(landing, Instant::now());
    true
}

/// Deletes the copies of a key that `writer` acknowledged a write of (`DEL`).
async fn delete_copies(snap: &Snapshot, side: &mut Servers, s: &Settings, hash: u64, writer: usize, key: &[u8]) {
    let mut del = Vec::new();
    codec::command(&mut del, [&b"DEL"[..], key].into_iter());
    backend::delete_copies(snap, side, s, hash, writer, &del, &Reply).await;
}

/// The payload of a bulk string reply (`None` for a null, or another type).
fn bulk_payload(reply: &[u8]) -> Option<&[u8]> {
    let rest = reply.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let n: usize = std::str::from_utf8(rest[..nl].strip_suffix(b"\r")?).ok()?.parse().ok()?;
    rest.get(nl + 1..nl + 1 + n)
}

/// A command whose keys must share a server (it is atomic there): sent whole to it, or refused.
async fn together(to: &mut To<'_>, name: &str, keys: &[&[u8]], raw: &[u8]) -> Pending {
    let mut nodes = Vec::with_capacity(keys.len());
    for k in keys {
        nodes.push(node_for(to, k).await);
    }
    if nodes.windows(2).any(|w| w[0] != w[1]) {
        let mut scratch = Vec::new();
        return Pending::Ready(error(
            &mut scratch,
            &format!("the keys of {name} are on different servers (give them one {{hash tag}})"),
        ));
    }
    one(to, Access::Write, name, keys[0], raw).await
}

/// A command split by server: each server gets the same command over its keys (`stride` 2: key
/// and value pairs).
async fn split(to: &mut To<'_>, how: Merge, verb: &[u8], items: &[&[u8]], stride: usize) -> Pending {
    // node -> the client's positions of its keys
    let mut by_node: Vec<(usize, Vec<usize>)> = Vec::new();
    let n = items.len() / stride;
    let writes = matches!(how, Merge::Ok) || verb.eq_ignore_ascii_case(b"DEL") || verb.eq_ignore_ascii_case(b"UNLINK");
    let mut written = Vec::new();
    for i in 0..n {
        let key = items[i * stride];
        let mut hot_hash = None;
        if writes
            && let Some(h) = placed(to.pool, to.snap, key).0
            && let Some(r) = to.snap.hot().map(|hot| hot.replicas(h))
        {
            invalidate_copies(to, h, r, key).await;
            hot_hash = Some(h);
        }
        let Some(node) = node_for(to, key).await else {
            to.pool.metrics.no_worker.fetch_add(1, Relaxed);
            return Pending::Ready(b"-ERR keyroute: no server available\r\n".to_vec());
        };
        if let Some(h) = hot_hash {
            written.push(((h, key.to_vec()), node));
        }
        match by_node.iter_mut().find(|(x, _)| *x == node) {
            Some((_, positions)) => positions.push(i),
            None => by_node.push((node, vec![i])),
        }
    }
    let mut parts = Vec::with_capacity(by_node.len());
    for (node, positions) in by_node {
        let Some(server) = connect(to.servers, &to.snap.workers()[node], to.s).await else {
            return Pending::Ready(b"-ERR keyroute: a server of these keys cannot be reached\r\n".to_vec());
        };
        let words = std::iter::once(verb)
            .chain(positions.iter().flat_map(|&i| items[i * stride..(i + 1) * stride].iter().copied()));
        let words: Vec<&[u8]> = words.collect();
        codec::command(&mut to.servers.0[server].out, words.into_iter());
        parts.push((server, node, positions));
    }
    Pending::Split { how, parts, n, written }
}

/// Reads every reply of the batch, in order, into `out`.
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
    let mut reads: Vec<Read<Reply>> = Vec::with_capacity(pending.len());
    for p in pending.iter() {
        p.reads(&mut reads);
    }
    let mut arena = Vec::new();
    let slots = backend::read_all(snap, servers, s, &reads, &mut arena).await;
    let mut at = 0;
    let error = |out: &mut Vec<u8>, w: &crate::pool::WorkerState, why: &str| {
        failed(w, s);
        out.extend_from_slice(format!("-ERR keyroute: {why}\r\n").as_bytes());
    };
    for p in pending.drain(..) {
        let slot = &slots[at..at + p.parts()];
        at += p.parts();
        match p {
            Pending::Ready(bytes) => out.extend_from_slice(&bytes),
            Pending::One { node, written, .. } => {
                let w = &snap.workers()[node];
                match &slot[0] {
                    Ok(range) => {
                        succeeded(w, started);
                        out.extend_from_slice(&arena[range.clone()]);
                    }
                    Err(why) => error(out, w, why),
                }
                // Answered or not, the write may have been applied.
                if let Some((hash, key)) = written {
                    delete_copies(snap, side, s, hash, node, &key).await;
                }
            }
            Pending::HotGet { node, owner, hash, key, .. } => {
                let w = &snap.workers()[node];
                match &slot[0] {
                    Ok(range) => {
                        succeeded(w, started);
                        let reply = &arena[range.clone()];
                        if matches!(reply, b"$-1\r\n" | b"_\r\n") {
                            if !hot_fill(snap, pool, side, s, (hash, &key), owner, node, out).await {
                                out.extend_from_slice(b"-ERR keyroute: server connection lost\r\n");
                            }
                        } else {
                            out.extend_from_slice(reply);
                        }
                    }
                    Err(why) => error(out, w, why),
                }
            }
            Pending::Discard { .. } => {}
            Pending::Split { how, parts, n, written } => {
                let mut replies = Vec::with_capacity(parts.len());
                let mut failure = None;
                for ((_, node, positions), result) in parts.into_iter().zip(slot) {
                    let w = &snap.workers()[node];
                    match result {
                        Ok(range) => {
                            succeeded(w, started);
                            replies.push((&arena[range.clone()], positions));
                        }
                        Err(why) => {
                            failed(w, s);
                            failure = Some(*why);
                        }
                    }
                }
                merge(how, &replies, n, failure, out);
                for ((hash, key), writer) in written {
                    delete_copies(snap, side, s, hash, writer, &key).await;
                }
            }
        }
    }
    servers.sweep();
}

/// A split command's reply from its servers' replies.
fn merge(how: Merge, replies: &[(&[u8], Vec<usize>)], n: usize, failure: Option<&str>, out: &mut Vec<u8>) {
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
            out.extend_from_slice(format!(":{sum}\r\n").as_bytes());
        }
        Merge::Values => {
            let mut values: Vec<&[u8]> = vec![b"$-1\r\n"; n];
            for (r, positions) in replies {
                let Some(elements) = codec::elements(r) else { continue };
                for (e, &i) in elements.iter().zip(positions) {
                    values[i] = e;
                }
            }
            out.extend_from_slice(format!("*{n}\r\n").as_bytes());
            for v in values {
                out.extend_from_slice(v);
            }
        }
    }
}

/// Appends the server's next reply to `out`.
async fn reply_into(server: &mut Server, s: &Settings, out: &mut Vec<u8>) -> Result<(), &'static str> {
    let frame = |buf: &[u8]| codec::reply_len(buf).map_err(|_| backend::Garbled);
    backend::answer_into(server, s.answer, out, async |server: &mut Server, out: &mut Vec<u8>| {
        let n = backend::frame(server, &frame).await?;
        out.extend_from_slice(&server.buffered()[..n]);
        server.consume(n);
        Ok(())
    })
    .await
}

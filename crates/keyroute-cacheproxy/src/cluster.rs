//! Redis Cluster behind a Redis listener (`[pool.cluster]`): clients speak plain Redis to the
//! proxy and never see the cluster.
//!
//! - **The slot map**: the pool's `[[pool.worker]]`s are seed nodes. A task per pool asks a known
//!   node for `CLUSTER SLOTS` (the map's nodes first, then the seeds), every `refresh_ms` and at
//!   once after a redirection, and keeps the map: which master, and which replicas, serve each of
//!   the 16,384 slots. The pool's members become the masters (and the replicas, when they serve
//!   reads), as a membership source's would, so that connections, health, ejection and metrics
//!   are theirs.
//! - **Placement**: a key's slot is Redis Cluster's (CRC16 of its `{hash tag}`, mod 16,384); its
//!   command goes to the master the map names for it. Before the first map (or for a master not
//!   yet a member), the command goes where the pool's strategy places it, and the cluster
//!   redirects it.
//! - **Reads from replicas** (`replica_reads`, `READONLY` sent on every connection of the pool):
//!   `always`, every reading command of one key; `hot`, a hot key's (`[pool.hot_keys]`, detected
//!   as in any pool) over the first `r` of its slot's nodes, `r` its replica count. Such a read
//!   goes to the least loaded (commands in flight) of the slot's healthy master and replicas,
//!   ties taken in turn. A replica is as new as Redis's asynchronous replication made it: a key
//!   written through this proxy is read from its master for the next second ([`PIN`], from the
//!   write's answer), and a replica's failure, error or miss (a null: a key created since the
//!   replica's copy, a slot being migrated, a replica still loading) is asked of the master; a
//!   command after such a read in a client's pipeline that may write waits for the read's answer
//!   (the master's answer never shows it). A replica that failed, or answers `LOADING` or
//!   `MASTERDOWN`, is not chosen for [`AVOID`]. Commands of several keys (`MGET`...) and `EVAL_RO`
//!   go to masters.
//! - **Redirections**: a `-MOVED SLOT HOST:PORT` reply sends the command again to that node (the
//!   map is patched for the slot and refreshed); `-ASK SLOT HOST:PORT` sends it there after
//!   `ASKING` (a slot being migrated: the map is not changed). Up to five hops; the client gets the
//!   last node's reply. A slot migrating under load (`redis-cli --cluster reshard`) is served
//!   without an error.
//! - **Commands of several keys** (`MGET`, `MSET`, `DEL`...) are split by slot, each slot's keys in
//!   one command to its master, a part redirected followed as a command of one key is (a part
//!   whose slot's keys are on both nodes of a migration answers Redis's `-TRYAGAIN`, and so does
//!   one that could not be sent on; one sent on and not answered fails the command with `server
//!   connection lost`: it may have run); a command of several keys waits for the pool's first map, up to
//!   a second, so that it is split on it. `MSETNX` and `EVAL` need all their keys in one slot
//!   (else Redis's `CROSSSLOT`).
//!
//! Not done: nodes named by host name (a map or redirection naming a master by one is not taken:
//! the command answers an error; a replica named by one is left out).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use keyroute_cache_proto::resp;
use keyroute_fleet::Fleet;
use keyroute_fleet::config::ReplicaReads;
use keyroute_fleet::config::WorkerConfig;
use keyroute_fleet::pool::{Member, Pool, Snapshot, State};
use tokio::time::Instant;

use crate::conn::ServerConn;

/// The slots of Redis Cluster.
const SLOTS: usize = 16_384;

/// The most redirections one command follows.
const HOPS: usize = 5;

/// How long a key written through the proxy is read from its master only (a replica may not have
/// the write yet).
pub(crate) const PIN: Duration = Duration::from_secs(1);

/// How long a replica that failed is not chosen for reads (see [`avoid`]).
const AVOID: Duration = Duration::from_secs(5);

/// The keys' last writes are kept in this many places (by key hash; two keys that share one share
/// their pin, which only sends a read to its master).
const PINS: usize = 16_384;

/// A cluster pool's state: its slot map, and its refresh task's wake-up.
pub(crate) struct Cluster {
    map: ArcSwapOption<SlotMap>,
    refresh: tokio::sync::Notify,
    /// Whether the pool's refresh task runs (it clears this when it ends).
    running: AtomicBool,
    /// Where the next read that may go to a replica starts looking (ties taken in turn).
    turn: AtomicUsize,
    /// When each place of [`PINS`] was last written, in ms since `epoch` (0: never), made on first
    /// use (a pool whose replicas serve reads).
    written: std::sync::OnceLock<Box<[AtomicU32]>>,
    epoch: Instant,
    /// Replicas not chosen for reads until then (see [`avoid`]).
    avoided: arc_swap::ArcSwap<Vec<(SocketAddr, Instant)>>,
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster {
            map: ArcSwapOption::empty(),
            refresh: tokio::sync::Notify::new(),
            running: AtomicBool::new(false),
            turn: AtomicUsize::new(0),
            written: std::sync::OnceLock::new(),
            epoch: Instant::now(),
            avoided: arc_swap::ArcSwap::from_pointee(Vec::new()),
        }
    }
}

impl Cluster {
    fn pins(&self) -> &[AtomicU32] {
        self.written.get_or_init(|| (0..PINS).map(|_| AtomicU32::new(0)).collect())
    }

    /// `now` in ms since the state was made, never 0.
    fn ms(&self, now: Instant) -> u32 {
        (now.saturating_duration_since(self.epoch).as_millis() as u32).max(1)
    }

    /// The members of `snap` a command of `slot` goes to by the pool's map: the node, and the
    /// slot's master. The node is the master, or, for a read that may go to `readers` > 1 of the
    /// slot's nodes (its master first, then its replicas), the least loaded of those that are
    /// healthy members and not avoided (commands in flight; ties taken in turn). `None`s without
    /// a map, or for a node not a member (yet).
    pub(crate) fn node(
        &self,
        snap: &Snapshot,
        slot: u16,
        readers: usize,
        now: Instant,
    ) -> (Option<usize>, Option<usize>) {
        let map = self.map.load();
        let Some(shard) = map.as_ref().and_then(|m| m.shard(slot)) else { return (None, None) };
        let member = |a: &SocketAddr| snap.workers().iter().position(|w| w.address == *a);
        let master = shard.first().and_then(member);
        let n = readers.min(shard.len());
        if n <= 1 {
            return (master, master);
        }
        let start = self.turn.fetch_add(1, Relaxed);
        let avoided = self.avoided.load();
        let mut best: Option<(u64, usize)> = None;
        for k in 0..n {
            let addr = &shard[(start + k) % n];
            if avoided.iter().any(|(a, until)| a == addr && *until > now) {
                continue;
            }
            let Some(i) = member(addr) else { continue };
            let w = &snap.workers()[i];
            if w.state_with(now, Duration::ZERO) != State::Healthy {
                continue;
            }
            let load = w.in_flight();
            if best.is_none_or(|(least, _)| load < least) {
                best = Some((load, i));
            }
        }
        (best.map(|(_, i)| i).or(master), master)
    }

    /// How many of a slot's nodes a command of one key may go to (see [`Cluster::node`]): 1 (its
    /// master) but for a read in a pool whose replicas serve reads (`hot`: `hot_replicas`, the
    /// key's replica count when it is hot), of a key not written through the proxy within
    /// [`PIN`] (`pin`: its hash).
    pub(crate) fn readers(&self, reads: ReplicaReads, hot_replicas: usize, pin: u64, now: Instant) -> usize {
        let readers = match reads {
            ReplicaReads::Never => return 1,
            ReplicaReads::Hot => hot_replicas,
            ReplicaReads::Always => usize::MAX,
        };
        if readers <= 1 {
            return 1;
        }
        let at = self.pins()[(pin % PINS as u64) as usize].load(Relaxed);
        let pinned = at != 0 && self.ms(now).wrapping_sub(at) < PIN.as_millis() as u32;
        if pinned { 1 } else { readers }
    }

    /// Notes a write of the key hashed `pin` at `now` (when it is planned, and again when it is
    /// answered), in a pool whose replicas serve reads: its reads go to its master for the next
    /// [`PIN`].
    pub(crate) fn written(&self, pin: u64, now: Instant) {
        self.pins()[(pin % PINS as u64) as usize].store(self.ms(now), Relaxed);
    }

    /// A replica that could not be reached, or failed a read, is not chosen for reads until
    /// [`AVOID`] has passed (a Redis pool's members are not ejected by default: see the README's
    /// "a store fails where a cache fails over").
    pub(crate) fn avoid(&self, addr: SocketAddr, now: Instant) {
        self.avoided.rcu(|list| {
            let mut list: Vec<(SocketAddr, Instant)> =
                list.iter().copied().filter(|&(a, until)| a != addr && until > now).collect();
            list.push((addr, now + AVOID));
            list
        });
    }

    /// Starts `pool`'s refresh task if it is not running (`greeting`: what a new connection is
    /// sent first, the servers' `AUTH`, made only then: this is asked for every command).
    pub(crate) fn start(&self, fleet: &Arc<Fleet>, pool: &Arc<Pool>, greeting: impl FnOnce() -> Option<Arc<[u8]>>) {
        if !self.running.load(Relaxed) && self.running.compare_exchange(false, true, SeqCst, SeqCst).is_ok() {
            tokio::spawn(run(Arc::clone(fleet), Arc::downgrade(pool), greeting()));
        }
    }

    /// Waits (at most `limit`) for the pool's first slot map: a command of several keys is split
    /// by slot, and a part sent where the map does not say would come back redirected.
    pub(crate) async fn first_map(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        while self.map.load().is_none() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Which nodes serve each slot.
#[derive(Debug, PartialEq)]
pub(crate) struct SlotMap {
    /// Each shard's nodes: its master, then its replicas.
    shards: Vec<Box<[SocketAddr]>>,
    /// Each slot's shard: an index into `shards`, or `u16::MAX` for a slot no node serves.
    owner: Box<[u16]>,
}

impl SlotMap {
    /// The nodes of `slot`, its master first, if one serves it.
    fn shard(&self, slot: u16) -> Option<&[SocketAddr]> {
        let i = *self.owner.get(usize::from(slot))?;
        self.shards.get(usize::from(i)).map(|s| &s[..])
    }

    /// The master of `slot`, if one serves it.
    fn master(&self, slot: u16) -> Option<SocketAddr> {
        self.shard(slot)?.first().copied()
    }

    /// The masters.
    fn masters(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.shards.iter().filter_map(|s| s.first().copied())
    }

    /// Every node once: the masters, then the replicas.
    fn nodes(&self) -> Vec<SocketAddr> {
        let mut nodes: Vec<SocketAddr> = self.masters().collect();
        for a in self.shards.iter().flat_map(|s| s.iter().skip(1)) {
            if !nodes.contains(a) {
                nodes.push(*a);
            }
        }
        nodes
    }

    /// The shard whose master is `addr`, added (without replicas) when there is none.
    fn shard_of(shards: &mut Vec<Box<[SocketAddr]>>, master: SocketAddr, replicas: Vec<SocketAddr>) -> usize {
        match shards.iter().position(|s| s.first() == Some(&master)) {
            Some(i) => i,
            None => {
                shards.push(std::iter::once(master).chain(replicas).collect());
                shards.len() - 1
            }
        }
    }

    /// The map from a `CLUSTER SLOTS` reply: `[[start, end, [ip, port, ...], replicas...], ...]`,
    /// given by the node at `from` (a node that does not know its own address says `""`, `?` or
    /// null: it is `from`'s). A master named by host name only is refused (the map is not taken);
    /// a replica named so is left out.
    fn parse(reply: &[u8], from: SocketAddr) -> Option<SlotMap> {
        let mut shards: Vec<Box<[SocketAddr]>> = Vec::new();
        let mut owner = vec![u16::MAX; SLOTS].into_boxed_slice();
        for range in resp::elements(reply)? {
            let fields = resp::elements(range)?;
            let (start, end) = (integer(fields.first()?)?, integer(fields.get(1)?)?);
            let master = address(fields.get(2)?, Some(from))?;
            let replicas = fields[3..].iter().filter_map(|r| address(r, None)).collect();
            let i = SlotMap::shard_of(&mut shards, master, replicas);
            let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            for slot in &mut owner[start..=end] {
                *slot = u16::try_from(i).ok()?;
            }
        }
        Some(SlotMap { shards, owner })
    }
}

/// A node of a `CLUSTER SLOTS` range (`[ip, port, id, ...]`); one that does not know its address
/// is `from`'s when that is given (the answering node's).
fn address(node: &[u8], from: Option<SocketAddr>) -> Option<SocketAddr> {
    let node = resp::elements(node)?;
    let host = node.first()?;
    let ip: IpAddr = match bulk(host) {
        None if host.starts_with(b"$-1") || host.starts_with(b"_") => from?.ip(),
        Some(b"") | Some(b"?") => from?.ip(),
        Some(text) => std::str::from_utf8(text).ok()?.parse().ok()?,
        None => return None,
    };
    let port = u16::try_from(integer(node.get(1)?)?).ok()?;
    Some(SocketAddr::new(ip, port))
}

/// A RESP integer reply's value.
fn integer(reply: &[u8]) -> Option<i64> {
    let body = reply.strip_prefix(b":")?.strip_suffix(b"\r\n")?;
    resp::redis_integer(body)
}

/// A RESP bulk string's bytes.
fn bulk(reply: &[u8]) -> Option<&[u8]> {
    let body = reply.strip_prefix(b"$")?;
    let at = body.iter().position(|&b| b == b'\n')?;
    body.get(at + 1..)?.strip_suffix(b"\r\n")
}

/// Asks the pool's refresh task for a new map now (after a redirection).
fn refresh_soon(pool: &Pool) {
    crate::state(pool).cluster.refresh.notify_one();
}

/// The refresh task of a cluster pool: the map asked for every `refresh_ms`, or when woken (at
/// most every 100 ms); ends when the pool is gone from the fleet (a reload removed or replaced
/// it) or is no longer a cluster, and may then be started again.
async fn run(fleet: Arc<Fleet>, pool: Weak<Pool>, greeting: Option<Arc<[u8]>>) {
    loop {
        let Some(current) = pool.upgrade() else { return };
        let state = crate::state(&current);
        let serving = fleet.pool(&current.name).is_some_and(|p| Arc::ptr_eq(&p, &current));
        let every = current.snapshot().config().cluster.map(|c| c.refresh);
        let Some(every) = every.filter(|_| serving) else {
            state.cluster.running.store(false, SeqCst);
            return;
        };
        match discover(&current, &state, greeting.as_deref()).await {
            Some(map) => apply(&current, &state, map),
            None => tracing::warn!(pool = %current.name, "no node of the cluster answered CLUSTER SLOTS"),
        }
        drop(current);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let woken = state.cluster.refresh.notified();
        let _ = tokio::time::timeout(every, woken).await;
    }
}

/// The map, from the first node that gives one: the current map's masters, then the seeds.
async fn discover(pool: &Pool, state: &crate::PoolState, greeting: Option<&[u8]>) -> Option<SlotMap> {
    let snap = pool.snapshot();
    let timeout = snap.config().retry.per_try_timeout;
    let connect = snap.config().connect_timeout;
    let mut candidates: Vec<SocketAddr> = state.cluster.map.load().as_ref().map(|m| m.nodes()).unwrap_or_default();
    for w in snap.workers() {
        if !candidates.contains(&w.address) {
            candidates.push(w.address);
        }
    }
    for w in &snap.config().workers {
        if !candidates.contains(&w.address) {
            candidates.push(w.address);
        }
    }
    for addr in candidates {
        let ask = async {
            let mut conn = ServerConn::open(addr, connect).await.ok()?;
            if let Some(g) = greeting {
                conn.greet_within(g, resp::greeted, timeout).await.ok()?;
            }
            let mut request = Vec::new();
            resp::command(&mut request, [&b"CLUSTER"[..], b"SLOTS"].into_iter());
            conn.write(&request).await.ok()?;
            let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
            SlotMap::parse(&conn.buffered()[..n], addr)
        };
        if let Ok(Some(map)) = tokio::time::timeout(timeout.max(Duration::from_millis(500)), ask).await
            && !map.shards.is_empty()
        {
            return Some(map);
        }
    }
    None
}

/// A new map in force: the pool's members become its masters, and its replicas when they serve
/// reads (again, after a reload set them to the seeds: nothing is published when they are the
/// same), and the map is published.
fn apply(pool: &Pool, state: &crate::PoolState, map: SlotMap) {
    let reads = pool.snapshot().config().cluster.map_or(ReplicaReads::Never, |c| c.replica_reads);
    let nodes: Vec<SocketAddr> = if reads == ReplicaReads::Never { map.masters().collect() } else { map.nodes() };
    let members: Vec<Member> = nodes
        .into_iter()
        .map(|a| Member {
            worker: WorkerConfig { name: a.to_string(), address: a, weight: 1, zone: None, id: None },
            draining: false,
            at_this_gateway: false,
        })
        .collect();
    if let Err(e) = pool.set_members(&members) {
        tracing::warn!(pool = %pool.name, error = %e, "the cluster's nodes could not become the pool's members");
    }
    state.cluster.map.store(Some(Arc::new(map)));
}

/// Where a `-MOVED` or `-ASK` reply sends a command: whether it asks (`ASK`), its slot and node.
fn redirection(reply: &[u8]) -> Option<(bool, u16, SocketAddr)> {
    let (ask, rest) = match reply {
        r if r.starts_with(b"-MOVED ") => (false, &r[7..]),
        r if r.starts_with(b"-ASK ") => (true, &r[5..]),
        _ => return None,
    };
    let text = std::str::from_utf8(rest).ok()?.trim_end();
    let (slot, addr) = text.split_once(' ')?;
    // HOST:PORT, the host an IP (v6 written without brackets); a host name is not followed.
    let (host, port) = addr.rsplit_once(':')?;
    let ip: IpAddr = host.trim_start_matches('[').trim_end_matches(']').parse().ok()?;
    Some((ask, slot.parse().ok()?, SocketAddr::new(ip, port.parse().ok()?)))
}

/// Whether a reply is a redirection.
pub(crate) fn redirected(reply: &[u8]) -> bool {
    reply.starts_with(b"-MOVED ") || reply.starts_with(b"-ASK ")
}

/// Why a redirection was not followed to the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unfollowed {
    /// The command was not sent on: a node named by host name, one not reached, or the hops ran
    /// out (every node that got it redirected it, and ran nothing).
    NotSent,
    /// The command was sent to a node that did not answer in time: it may have run.
    Lost,
}

/// Follows a redirection `reply` to the command `raw` (see the module): the last node's reply.
pub(crate) async fn follow(
    pool: &Pool,
    greeting: Option<&[u8]>,
    reply: &[u8],
    raw: &[u8],
) -> Result<Vec<u8>, Unfollowed> {
    let snap = pool.snapshot();
    let (connect, timeout) = (snap.config().connect_timeout, snap.config().retry.per_try_timeout);
    let mut reply = reply.to_vec();
    for _ in 0..HOPS {
        if !redirected(&reply) {
            return Ok(reply);
        }
        // A redirection keyroute cannot read (a host name) is not passed on: the client speaks
        // plain Redis.
        let (ask, slot, addr) = redirection(&reply).ok_or(Unfollowed::NotSent)?;
        pool.metrics.cluster_redirects[usize::from(ask)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !ask {
            patch(pool, slot, addr);
            refresh_soon(pool);
        }
        let mut sent = false;
        let exchange = async {
            let mut conn = ServerConn::open(addr, connect).await.ok()?;
            if let Some(g) = greeting {
                conn.greet_within(g, resp::greeted, timeout).await.ok()?;
            }
            let mut request = Vec::new();
            if ask {
                resp::command(&mut request, [&b"ASKING"[..]].into_iter());
            }
            request.extend_from_slice(raw);
            sent = true;
            conn.write(&request).await.ok()?;
            if ask {
                let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
                conn.consume(n);
            }
            let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
            Some(conn.buffered()[..n].to_vec())
        };
        let answered = tokio::time::timeout(timeout, exchange).await.ok().flatten();
        reply = answered.ok_or(if sent { Unfollowed::Lost } else { Unfollowed::NotSent })?;
    }
    if redirected(&reply) { Err(Unfollowed::NotSent) } else { Ok(reply) }
}

/// The map with `slot` served by `addr` (a `MOVED` says so before the next refresh does).
fn patch(pool: &Pool, slot: u16, addr: SocketAddr) {
    let state = crate::state(pool);
    // As one update of whatever map is there (a refresh may store a newer one meanwhile).
    state.cluster.map.rcu(|current| {
        let current = current.as_ref()?;
        if current.master(slot) == Some(addr) {
            return Some(Arc::clone(current));
        }
        let mut shards = current.shards.clone();
        let i = SlotMap::shard_of(&mut shards, addr, Vec::new());
        let mut owner = current.owner.clone();
        if let (Some(o), Ok(i)) = (owner.get_mut(usize::from(slot)), u16::try_from(i)) {
            *o = i;
        }
        Some(Arc::new(SlotMap { shards, owner }))
    });
}

/// A split command's part whose redirection could not be followed: refreshes the map, and gives
/// the client `TRYAGAIN` (as Redis Cluster does for a command of several keys in a moving slot)
/// rather than the redirection.
pub(crate) fn part_redirected(pool: &Pool) -> &'static [u8] {
    refresh_soon(pool);
    b"-TRYAGAIN keyroute: a slot of these keys is moving; try again\r\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_map_is_read_from_cluster_slots() {
        let mut reply = b"*2\r\n".to_vec();
        for (start, end, port) in [(0, 5460, 7000), (5461, 16383, 7001)] {
            reply.extend_from_slice(
                format!("*3\r\n:{start}\r\n:{end}\r\n*3\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$2\r\nid\r\n").as_bytes(),
            );
        }
        let from: SocketAddr = "127.0.0.1:7000".parse().expect("addr");
        let map = SlotMap::parse(&reply, from).expect("a map");
        assert_eq!(map.master(0), Some("127.0.0.1:7000".parse().expect("addr")));
        assert_eq!(map.master(5461), Some("127.0.0.1:7001".parse().expect("addr")));
        assert_eq!(map.master(16383), Some("127.0.0.1:7001".parse().expect("addr")));
        assert!(SlotMap::parse(b"*1\r\n*3\r\n:5\r\n:16384\r\n*2\r\n$9\r\n127.0.0.1\r\n:1\r\n", from).is_none());
        assert!(SlotMap::parse(b"+OK\r\n", from).is_none());
        // A node that does not know its address: the one that answered.
        let empty = SlotMap::parse(b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$0\r\n\r\n:7005\r\n", from).expect("a map");
        assert_eq!(empty.master(9), Some("127.0.0.1:7005".parse().expect("addr")));
        assert!(SlotMap::parse(b"*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$6\r\nnode-b\r\n:7005\r\n", from).is_none());
        // Replicas, after the master: two ranges of one master are one shard; a replica named by
        // host name is left out.
        let node = |host: &str, port: u16| format!("*2\r\n${}\r\n{host}\r\n:{port}\r\n", host.len());
        let mut reply = b"*3\r\n".to_vec();
        for (start, end, nodes) in [
            (0, 99, vec![node("127.0.0.1", 7000), node("127.0.0.1", 7100), node("replica-b", 7200)]),
            (100, 16000, vec![node("127.0.0.1", 7001)]),
            (16001, 16383, vec![node("127.0.0.1", 7000), node("127.0.0.1", 7100)]),
        ] {
            reply.extend_from_slice(format!("*{}\r\n:{start}\r\n:{end}\r\n", 2 + nodes.len()).as_bytes());
            reply.extend_from_slice(nodes.concat().as_bytes());
        }
        let map = SlotMap::parse(&reply, from).expect("a map");
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        assert_eq!(map.shard(5), Some(&[a(7000), a(7100)][..]));
        assert_eq!(map.shard(16383), Some(&[a(7000), a(7100)][..]));
        assert_eq!(map.shard(100), Some(&[a(7001)][..]));
        assert_eq!(map.nodes(), [a(7000), a(7001), a(7100)]);
        assert_eq!(redirection(b"-MOVED 1 fe80::1:6381\r\n").map(|r| r.2.port()), Some(6381));
        assert_eq!(redirection(b"-MOVED 1 node-b:6381\r\n"), None);
        assert_eq!(
            redirection(b"-MOVED 3999 127.0.0.1:6381\r\n"),
            Some((false, 3999, "127.0.0.1:6381".parse().expect("addr")))
        );
        assert_eq!(redirection(b"-ASK 3999 127.0.0.1:6381\r\n").map(|r| r.0), Some(true));
        assert_eq!(redirection(b"-ERR x\r\n"), None);
    }
}

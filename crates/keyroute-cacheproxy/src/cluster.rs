//! Redis Cluster behind a Redis listener (`[pool.cluster]`): clients speak plain Redis to the
//! proxy and never see the cluster.
//!
//! - **The slot map**: the pool's `[[pool.worker]]`s are seed nodes. A task per pool asks a known
//!   node for `CLUSTER SLOTS` (the map's nodes first, then the seeds), every `refresh_ms` and at
//!   once after a redirection, and keeps the map: which master serves each of the 16,384 slots.
//!   The pool's members become the masters (as a membership source's would), so that connections,
//!   health, ejection and metrics are theirs.
//! - **Placement**: a key's slot is Redis Cluster's (CRC16 of its `{hash tag}`, mod 16,384); its
//!   command goes to the master the map names for it. Before the first map (or for a master not
//!   yet a member), the command goes where the pool's strategy places it, and the cluster
//!   redirects it.
//! - **Redirections**: a `-MOVED SLOT HOST:PORT` reply sends the command again to that node (the
//!   map is patched for the slot and refreshed); `-ASK SLOT HOST:PORT` sends it there after
//!   `ASKING` (a slot being migrated: the map is not changed). Up to five hops; the client gets the
//!   last node's reply. A slot migrating under load (`redis-cli --cluster reshard`) is served
//!   without an error.
//! - **Commands of several keys** (`MGET`, `MSET`, `DEL`...) are split by slot, each slot's keys in
//!   one command to its master; `MSETNX` and `EVAL` need all their keys in one slot (else Redis's
//!   `CROSSSLOT`).
//!
//! Not done: reads from replicas (`READONLY`); the redirection of a split command's parts (a part
//! redirected while its slot moves answers the client an error, as `TRYAGAIN` would).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use keyroute_cache_proto::resp;
use keyroute_fleet::Fleet;
use keyroute_fleet::config::WorkerConfig;
use keyroute_fleet::pool::{Member, Pool};

use crate::conn::ServerConn;

/// The slots of Redis Cluster.
const SLOTS: usize = 16_384;

/// The most redirections one command follows.
const HOPS: usize = 5;

/// A cluster pool's state: its slot map, and its refresh task's wake-up.
#[derive(Default)]
pub(crate) struct Cluster {
    map: ArcSwapOption<SlotMap>,
    refresh: tokio::sync::Notify,
    started: OnceLock<()>,
}

/// Which master serves each slot.
#[derive(Debug, PartialEq)]
pub(crate) struct SlotMap {
    masters: Vec<SocketAddr>,
    /// Each slot's master: an index into `masters`, or `u16::MAX` for a slot no node serves.
    owner: Box<[u16]>,
}

impl SlotMap {
    /// The master of `slot`, if one serves it.
    fn master(&self, slot: u16) -> Option<SocketAddr> {
        let i = *self.owner.get(usize::from(slot))?;
        self.masters.get(usize::from(i)).copied()
    }

    /// The map from a `CLUSTER SLOTS` reply: `[[start, end, [ip, port, ...], replicas...], ...]`.
    fn parse(reply: &[u8]) -> Option<SlotMap> {
        let mut masters: Vec<SocketAddr> = Vec::new();
        let mut owner = vec![u16::MAX; SLOTS].into_boxed_slice();
        for range in resp::elements(reply)? {
            let fields = resp::elements(range)?;
            let (start, end) = (integer(fields.first()?)?, integer(fields.get(1)?)?);
            let node = resp::elements(fields.get(2)?)?;
            let ip: std::net::IpAddr = std::str::from_utf8(bulk(node.first()?)?).ok()?.parse().ok()?;
            let port = u16::try_from(integer(node.get(1)?)?).ok()?;
            let addr = SocketAddr::new(ip, port);
            let i = match masters.iter().position(|m| *m == addr) {
                Some(i) => i,
                None => {
                    masters.push(addr);
                    masters.len() - 1
                }
            };
            let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            for slot in &mut owner[start..=end] {
                *slot = u16::try_from(i).ok()?;
            }
        }
        Some(SlotMap { masters, owner })
    }
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

/// The cluster state of `pool` (made on first use).
fn of(pool: &Pool) -> Arc<crate::PoolState> {
    crate::state(pool)
}

/// The master that serves `slot` now by the pool's map, if it has one.
pub(crate) fn master(pool: &Pool, slot: u16) -> Option<SocketAddr> {
    of(pool).cluster.map.load().as_ref()?.master(slot)
}

/// Starts the pool's refresh task if it is not running (`greeting`: what a new connection is
/// sent first, the servers' `AUTH`).
pub(crate) fn start(fleet: &Arc<Fleet>, pool: &Arc<Pool>, greeting: Option<Arc<[u8]>>) {
    let state = of(pool);
    if state.cluster.started.set(()).is_ok() {
        tokio::spawn(run(Arc::clone(fleet), pool.name.clone(), greeting));
    }
}

/// Asks the pool's refresh task for a new map now (after a redirection).
fn refresh_soon(pool: &Pool) {
    of(pool).cluster.refresh.notify_one();
}

/// The refresh task of cluster pool `name`: the map asked for every `refresh_ms`, or at once when
/// woken; ends with the pool.
async fn run(fleet: Arc<Fleet>, name: String, greeting: Option<Arc<[u8]>>) {
    loop {
        let Some(pool) = fleet.pool(&name) else { return };
        let Some(every) = pool.snapshot().config().cluster.map(|c| c.refresh) else { return };
        let state = of(&pool);
        match discover(&pool, &state, greeting.as_deref()).await {
            Some(map) => apply(&pool, &state, map),
            None => tracing::warn!(pool = %name, "no node of the cluster answered CLUSTER SLOTS"),
        }
        drop(pool);
        let woken = state.cluster.refresh.notified();
        let _ = tokio::time::timeout(every, woken).await;
    }
}

/// The map, from the first node that gives one: the current map's masters, then the seeds.
async fn discover(pool: &Pool, state: &crate::PoolState, greeting: Option<&[u8]>) -> Option<SlotMap> {
    let snap = pool.snapshot();
    let timeout = snap.config().retry.per_try_timeout;
    let connect = snap.config().connect_timeout;
    let mut candidates: Vec<SocketAddr> =
        state.cluster.map.load().as_ref().map(|m| m.masters.clone()).unwrap_or_default();
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
                conn.greet(g, |a| matches!(resp::reply_len(a), Ok(Some(_)))).await.ok()?;
            }
            let mut request = Vec::new();
            resp::command(&mut request, [&b"CLUSTER"[..], b"SLOTS"].into_iter());
            conn.write(&request).await.ok()?;
            let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
            SlotMap::parse(&conn.buffered()[..n])
        };
        if let Ok(Some(map)) = tokio::time::timeout(timeout.max(Duration::from_millis(500)), ask).await
            && !map.masters.is_empty()
        {
            return Some(map);
        }
    }
    None
}

/// A new map in force: the pool's members become its masters, and the map is published.
fn apply(pool: &Pool, state: &crate::PoolState, map: SlotMap) {
    if state.cluster.map.load().as_deref() == Some(&map) {
        return;
    }
    let members: Vec<Member> = map
        .masters
        .iter()
        .map(|a| Member {
            worker: WorkerConfig { name: a.to_string(), address: *a, weight: 1, zone: None, id: None },
            draining: false,
            at_this_gateway: false,
        })
        .collect();
    if let Err(e) = pool.set_members(&members) {
        tracing::warn!(pool = %pool.name, error = %e, "the cluster's masters could not become the pool's members");
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
    Some((ask, slot.parse().ok()?, addr.parse().ok()?))
}

/// Whether a reply is a redirection.
pub(crate) fn redirected(reply: &[u8]) -> bool {
    reply.starts_with(b"-MOVED ") || reply.starts_with(b"-ASK ")
}

/// Follows a redirection `reply` to the command `raw` (see the module): the last node's reply,
/// or `None` when a node could not be reached or the hops ran out.
pub(crate) async fn follow(pool: &Pool, greeting: Option<&[u8]>, reply: &[u8], raw: &[u8]) -> Option<Vec<u8>> {
    let snap = pool.snapshot();
    let (connect, timeout) = (snap.config().connect_timeout, snap.config().retry.per_try_timeout);
    let mut reply = reply.to_vec();
    for _ in 0..HOPS {
        let Some((ask, slot, addr)) = redirection(&reply) else { return Some(reply) };
        pool.metrics.cluster_redirects[usize::from(ask)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !ask {
            patch(pool, slot, addr);
            refresh_soon(pool);
        }
        let exchange = async {
            let mut conn = ServerConn::open(addr, connect).await.ok()?;
            if let Some(g) = greeting {
                conn.greet(g, |a| matches!(resp::reply_len(a), Ok(Some(_)))).await.ok()?;
            }
            let mut request = Vec::new();
            if ask {
                resp::command(&mut request, [&b"ASKING"[..]].into_iter());
            }
            request.extend_from_slice(raw);
            conn.write(&request).await.ok()?;
            if ask {
                let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
                conn.consume(n);
            }
            let n = conn.frame(|b| resp::reply_len(b).map_err(|_| crate::conn::Garbled)).await.ok()?;
            Some(conn.buffered()[..n].to_vec())
        };
        reply = tokio::time::timeout(timeout, exchange).await.ok()??;
    }
    None
}

/// The map with `slot` served by `addr` (a `MOVED` says so before the next refresh does).
fn patch(pool: &Pool, slot: u16, addr: SocketAddr) {
    let state = of(pool);
    let Some(current) = state.cluster.map.load_full() else { return };
    if current.master(slot) == Some(addr) {
        return;
    }
    let mut masters = current.masters.clone();
    let i = match masters.iter().position(|m| *m == addr) {
        Some(i) => i,
        None => {
            masters.push(addr);
            masters.len() - 1
        }
    };
    let mut owner = current.owner.clone();
    if let (Some(o), Ok(i)) = (owner.get_mut(usize::from(slot)), u16::try_from(i)) {
        *o = i;
    }
    state.cluster.map.store(Some(Arc::new(SlotMap { masters, owner })));
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
        let map = SlotMap::parse(&reply).expect("a map");
        assert_eq!(map.master(0), Some("127.0.0.1:7000".parse().expect("addr")));
        assert_eq!(map.master(5461), Some("127.0.0.1:7001".parse().expect("addr")));
        assert_eq!(map.master(16383), Some("127.0.0.1:7001".parse().expect("addr")));
        assert!(SlotMap::parse(b"*1\r\n*3\r\n:5\r\n:16384\r\n*2\r\n$9\r\n127.0.0.1\r\n:1\r\n").is_none());
        assert!(SlotMap::parse(b"+OK\r\n").is_none());
        assert_eq!(
            redirection(b"-MOVED 3999 127.0.0.1:6381\r\n"),
            Some((false, 3999, "127.0.0.1:6381".parse().expect("addr")))
        );
        assert_eq!(redirection(b"-ASK 3999 127.0.0.1:6381\r\n").map(|r| r.0), Some(true));
        assert_eq!(redirection(b"-ERR x\r\n"), None);
    }
}

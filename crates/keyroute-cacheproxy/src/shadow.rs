//! Shadow traffic (`[pool.shadow]`, mcrouter's ShadowRoute, Envoy's request mirroring): a share
//! of a pool's commands of one key copied to another pool, say a new fleet being tried, whose
//! answers are read and dropped.
//!
//! - **Which**: a key is shadowed when its hash, mixed (so that the shadowed keys spread over the
//!   primary pool's servers, whatever its strategy), falls in the pool's `share`: a key is shadowed
//!   always or never, so the shadow pool sees whole keys' histories (a read after its write).
//! - **Never in the client's way**: a copy is handed to the pool's shadow task over a bounded
//!   queue without waiting; when the queue is full (a slow or dead shadow) the copy is dropped and
//!   counted, never queued behind the client. The client's own command and answer are untouched.
//! - **The task** takes what is queued (up to 256 copies at once), places each on the shadow pool
//!   by its strategy (the owner, or past it the next available server), sends each server its
//!   copies in one write on a connection of its own, and reads and drops their answers within the
//!   shadow pool's `per_try_timeout_ms`. `keyroute_pool_shadow_commands_total{outcome}` counts
//!   copies answered, failed (no server, a lost connection, a timeout) and dropped.
//!
//! What is copied: memcached's commands of one key (storage, `delete`, arithmetic, `touch`, a
//! `get` of one key, the meta commands) and Redis's commands of one key; multi-key commands are
//! not (their parts would be placed anew on the shadow pool), nor is a command of more than 64 KiB
//! (counted as dropped: the queue holds at most `queue` times that). The queue's size is the one
//! the pool had when its first copy was made.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use keyroute_cache_proto::{memcache, resp};
use keyroute_fleet::Fleet;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use crate::conn::{Garbled, Lost, ServerConn};
use crate::driver::{Batch, Placed, Protocol};

/// The most copies the task takes at once.
const TAKE: usize = 256;

/// The largest command copied: a larger one (a big value) is dropped, counted, so that the queue
/// holds at most `queue` times this many bytes.
const LARGEST: usize = 64 * 1024;

/// A pool's shadow: the queue to its task, made with the first copy.
#[derive(Default)]
pub(crate) struct Shadow {
    queue: OnceLock<mpsc::Sender<Copied>>,
}

/// One command copied: the bytes that place it, the request as sent, how its answer is framed,
/// and what a new connection is sent first.
pub(crate) struct Copied {
    part: Box<[u8]>,
    request: Box<[u8]>,
    frame: Frame,
    greeting: Option<Arc<[u8]>>,
}

/// How a copied command's answer is framed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Frame {
    /// A memcached answer: a retrieval's, its kind, and a quiet command's (then followed by `mn`
    /// and read to its `MN`).
    Memcached { retrieval: bool, answer: memcache::Answer, quiet: bool },
    /// A RESP2 reply.
    Redis,
}

/// Whether the key hashed `hash` is in the shadowed `share`: the hash mixed (SplitMix64's
/// finaliser), as a fraction of the 64-bit range.
pub(crate) fn chosen(hash: u64, share: f64) -> bool {
    let mut z = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < share
}

/// Copies the command `request` (of the key placed by `part`, hashed `hash` on the primary pool)
/// to the pool's shadow when its key is in the share; never waits.
pub(crate) fn offer<P: Protocol>(
    b: &Batch<'_, P>,
    (part, hash): (&[u8], Placed),
    request: &[u8],
    frame: Frame,
    greeting: Option<Arc<[u8]>>,
) {
    let Some(config) = &b.snap.config().shadow else { return };
    let h = hash.0.unwrap_or_else(|| b.snap.policy().key_hash(part));
    if !chosen(h, config.share) {
        return;
    }
    if request.len() > LARGEST {
        b.pool.metrics.shadow[2].fetch_add(1, Relaxed);
        return;
    }
    let queue = b.s.state.shadow.queue.get_or_init(|| {
        let (tx, rx) = mpsc::channel(config.queue);
        tokio::spawn(run(Arc::clone(&b.ctx.fleet), b.pool.name.clone(), rx));
        tx
    });
    let copied = Copied { part: part.into(), request: request.into(), frame, greeting };
    if queue.try_send(copied).is_err() {
        b.pool.metrics.shadow[2].fetch_add(1, Relaxed);
    }
}

/// The shadow task of pool `primary`: copies taken from the queue, sent to the pool its
/// `[pool.shadow]` names now, their answers read and dropped. Ends with the pool (its queue's
/// sender goes with it).
async fn run(fleet: Arc<Fleet>, primary: String, mut queue: mpsc::Receiver<Copied>) {
    let mut conns: HashMap<SocketAddr, ServerConn> = HashMap::new();
    let mut copies = Vec::with_capacity(TAKE);
    while queue.recv_many(&mut copies, TAKE).await > 0 {
        let Some(pool) = fleet.pool(&primary) else { return };
        let count = |outcome: usize, n: usize| pool.metrics.shadow[outcome].fetch_add(n as u64, Relaxed);
        let target = pool.snapshot().config().shadow.as_ref().and_then(|s| fleet.pool(&s.pool));
        let Some(target) = target else {
            count(1, copies.len());
            copies.clear();
            continue;
        };
        let snap = target.snapshot();
        let (connect, answer) = (snap.config().connect_timeout, snap.config().retry.per_try_timeout);
        let now = Instant::now();
        // Each server's copies, in the order they came.
        let mut by: Vec<(SocketAddr, Vec<usize>)> = Vec::new();
        for (i, c) in copies.iter().enumerate() {
            let policy = snap.policy();
            let hash = policy.strategy().hashes_key(&c.part).then(|| policy.key_hash(&c.part));
            let Some(d) = snap.decide_owner(hash, &[], now) else {
                count(1, 1);
                continue;
            };
            let addr = snap.workers()[d.node].address;
            match by.iter_mut().find(|(a, _)| *a == addr) {
                Some((_, list)) => list.push(i),
                None => by.push((addr, vec![i])),
            }
        }
        for (addr, list) in by {
            if exchange(&mut conns, addr, (&copies, &list), connect, answer).await.is_ok() {
                count(0, list.len());
            } else {
                conns.remove(&addr);
                count(1, list.len());
            }
        }
        copies.clear();
    }
}

/// Sends `list`'s copies to `addr` in one write (on its connection, opened and greeted if
/// needed), and reads and drops their answers, each within `answer`.
async fn exchange(
    conns: &mut HashMap<SocketAddr, ServerConn>,
    addr: SocketAddr,
    (copies, list): (&[Copied], &[usize]),
    connect: Duration,
    answer: Duration,
) -> Result<(), Lost> {
    fn lost<E>(_: E) -> Lost {
        crate::conn::CONNECTION_LOST
    }
    let conn = match conns.entry(addr) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let mut conn = ServerConn::open(addr, connect).await.map_err(lost::<std::io::Error>)?;
            if let Some(greeting) = list.first().and_then(|&i| copies[i].greeting.as_ref()) {
                conn.greet_within(greeting, resp::greeted, answer).await?;
            }
            v.insert(conn)
        }
    };
    let mut out = Vec::new();
    for &i in list {
        out.extend_from_slice(&copies[i].request);
        if let Frame::Memcached { quiet: true, .. } = copies[i].frame {
            out.extend_from_slice(b"mn\r\n");
        }
    }
    timeout(answer, conn.write(&out)).await.map_err(lost)?.map_err(lost::<std::io::Error>)?;
    for &i in list {
        timeout(answer, read_one(conn, copies[i].frame)).await.map_err(lost)??;
    }
    Ok(())
}

/// Reads and drops one answer framed as `frame` says.
async fn read_one(conn: &mut ServerConn, frame: Frame) -> Result<(), Lost> {
    match frame {
        Frame::Redis => {
            let n = conn.frame(|b| resp::reply_len(b).map_err(|_| Garbled)).await?;
            conn.consume(n);
        }
        Frame::Memcached { retrieval, answer, quiet } => loop {
            let n = conn
                .frame(|b| {
                    if quiet && b.starts_with(b"MN\r\n") {
                        return Ok(Some(4));
                    }
                    memcache::answer_len(b, retrieval, answer).map_err(|_| Garbled)
                })
                .await?;
            let end = !quiet || conn.buffered().starts_with(b"MN\r\n");
            conn.consume(n);
            if end {
                break;
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::chosen;

    #[test]
    fn a_share_of_keys_is_chosen_whatever_their_hashes() {
        // Sequential hashes (a strategy's worst case) and spread ones alike.
        for share in [0.01, 0.1, 0.5] {
            let n = 100_000u64;
            let picked = (0..n).filter(|&h| chosen(h, share)).count() as f64 / n as f64;
            assert!((picked - share).abs() < share * 0.1 + 0.002, "{share}: {picked}");
            let spread = (0..n).filter(|&h| chosen(h.wrapping_mul(0x9e37_79b9_7f4a_7c15), share)).count() as f64;
            assert!((spread / n as f64 - share).abs() < share * 0.1 + 0.002);
        }
        assert!((0..1000).all(|h| chosen(h, 1.0)));
        // A key is chosen always or never.
        assert_eq!(chosen(42, 0.3), chosen(42, 0.3));
    }
}

//! Compatibility modes: placement exactly as a deployed system does it, so that a fleet moves to
//! keyroute with no key moving. Each mode reproduces one system at a stated version, is locked by
//! golden vectors produced by that system's real program (`testdata/compat/`), and documents where
//! the original is odd.
//!
//! - [`redis`]: Redis Cluster's keyslots (CRC16 with hash tags) and the slot layout of
//!   `redis-cli --cluster create`.
//! - [`groupcache`]: Go groupcache's `consistenthash` ring.
//! - [`guava`]: Guava's `Hashing.consistentHash`, over murmur3_128, md5 or a raw 64-bit input.
//! - [`libketama`]: last.fm's ketama MD5 continuum.

pub mod groupcache;
pub mod guava;
pub mod libketama;
pub mod redis;

/// The index of the first of `points` (sorted by value) at or after `h`, wrapping to 0: the pick of
/// every 32-bit point ring here.
fn first_at_or_after(points: &[(u32, u32)], h: u32) -> Option<usize> {
    if points.is_empty() {
        return None;
    }
    let i = points.partition_point(|&(p, _)| p < h);
    Some(if i == points.len() { 0 } else { i })
}

/// A point ring walked onwards from a key's point: distinct nodes, owner first. The systems these
/// rings reproduce have no failover of their own; this is keyroute's ranking over them.
#[derive(Clone, Debug)]
pub struct PointWalk<'a> {
    points: &'a [(u32, u32)],
    at: usize,
    left: usize,
    seen: Vec<bool>,
}

impl<'a> PointWalk<'a> {
    fn new(points: &'a [(u32, u32)], hash: u64, nodes: usize) -> Self {
        let at = first_at_or_after(points, hash as u32).unwrap_or(0);
        PointWalk { points, at, left: points.len(), seen: vec![false; nodes] }
    }
}

impl Iterator for PointWalk<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.left > 0 {
            let (_, n) = self.points[self.at % self.points.len()];
            self.at += 1;
            self.left -= 1;
            let n = n as usize;
            if self.seen.get(n).is_some_and(|s| !s) {
                self.seen[n] = true;
                return Some(n);
            }
        }
        None
    }
}

//! Envoy's `RING_HASH` and `MAGLEV` load balancers, from Envoy's source.
//!
//! # What it reproduces
//!
//! envoyproxy/envoy `source/extensions/load_balancing_policies/ring_hash/ring_hash_lb.cc`,
//! `.../maglev/maglev_lb.cc`, `.../common/thread_aware_lb_impl.cc` (`normalizeHostWeights`) and
//! `source/common/common/hash.h` (`HashUtil::xxHash64`). **Envoy cannot be installed on this
//! project's machines, so these modes were written from that source and are not checked against
//! a running Envoy**: `testdata/compat/envoy/` holds vectors of this implementation only (the
//! specification's reference figures, reproduced in the tests below), to catch regressions.
//! Validate against your Envoy before relying on them: `keyroute place --compat envoy-ring-hash`
//! next to the hosts Envoy's admin `/clusters` lists.
//!
//! # The definition
//!
//! - **What names a host**: its hash key: the `envoy.lb` `hash_key` metadata if set, else the
//!   address string (`10.0.0.5:8080`, `[::1]:80`), or the hostname with
//!   `use_hostname_for_hashing`. Here, a node's name. Weights are normalised, `w_i / sum` in
//!   double, over the hosts given (Envoy builds over the healthy hosts, all hosts in panic).
//! - **Key hash**: Envoy's header hash policy for one value is `XXH64(value, 0)`.
//! - **Ring** ([`EnvoyRingHash`]): `scale = min(ceil(min_w x min_ring_size) / min_w,
//!   max_ring_size)` (defaults 1,024 and 8,388,608); hosts in order, running sums
//!   `target += scale x w`, and while `current < target` a point `XXH64(key ++ "_" ++ decimal(i))`,
//!   `i` counting that host's points. Sorted; the pick is libketama's search on 64-bit values:
//!   the first point `>= h`, else the first point.
//! - **Maglev** ([`EnvoyMaglev`]): table size `M` (default 65,537, prime); hosts sorted by hash
//!   key bytes, `offset = XXH64(key, 0) mod M`, `skip = XXH64(key, 1) mod (M - 1) + 1`; rounds
//!   `1, 2, ...` in which a host takes its next free preferred slot unless `round x w <
//!   target`, after which `target += max_w`. The pick is `table[h mod M]`.
//!
//! # Failover
//!
//! Envoy rebuilds both over the healthy hosts when health changes (so a dead host's keys move,
//! and with weights other keys too), which [`EnvoyRingHash::ejecting`] and
//! [`EnvoyMaglev::ejecting`] build. On a retry with a host predicate it perturbs the pick:
//! the ring moves `attempt` points on, Maglev hashes `h ^ (2^64 - attempt)`
//! ([`EnvoyRingHash::retry`], [`EnvoyMaglev::retry`]). keyroute's ranking (`ranked_hash`) walks
//! the ring onwards, or for Maglev follows the pick by the rendezvous order of the others.
//!
//! # Guarantees and quirks
//!
//! - The reference figures of the specification, reproduced (`tests` below): ring sizes 1,026
//!   (3 hosts), 1,024 (8), 1,054 (31), 1,026 and 1,092 (weighted 8 and 31); Maglev entries
//!   3,641 / 7,282 / 10,923 / 18,204 for weights 1 / 2 / 3 / 5.
//! - The ring's size follows the *smallest* weight: one host of weight 1 among hosts of weight
//!   100 makes a ring of about 100 x 1,024 x hosts points, up to the maximum.
//!
//! # Cost
//!
//! One XXH64 of the key; a binary search over the ring, or one table read for Maglev.

use xxhash_rust::xxh64::xxh64;

use crate::rendezvous::{Fallback, Rendezvous};
use crate::{Error, NodeSet, Placement, Ranking};

/// Envoy's default `minimum_ring_size`.
pub const DEFAULT_MIN_RING_SIZE: u64 = 1024;
/// Envoy's default (and largest) `maximum_ring_size`.
pub const DEFAULT_MAX_RING_SIZE: u64 = 8_388_608;
/// Envoy's default Maglev `table_size`.
pub const DEFAULT_TABLE_SIZE: u64 = 65_537;

/// The live nodes' normalised weights, `w / sum` in double, with their indices (Envoy's
/// `normalizeHostWeights` with one locality).
fn normalized(nodes: &NodeSet) -> Vec<(usize, f64)> {
    let sum = nodes.total_weight() as f64;
    nodes.live().iter().map(|&i| (i as usize, f64::from(nodes.nodes()[i as usize].weight()) * 1.0 / sum)).collect()
}

/// Envoy's ring scale: `min(ceil(min_w x min_ring_size) / min_w, max_ring_size)` for the smallest
/// normalised weight `min_w`; the ring has `ceil(scale)` points.
fn ring_scale(min_w: f64, min_ring_size: u64, max_ring_size: u64) -> f64 {
    ((min_w * min_ring_size as f64).ceil() / min_w).min(max_ring_size as f64)
}

/// The number of points of Envoy's ring over `nodes` (0 without a node of weight), before it is
/// built.
pub fn ring_size(nodes: &NodeSet, min_ring_size: u64, max_ring_size: u64) -> u64 {
    normalized(nodes)
        .iter()
        .map(|&(_, w)| w)
        .reduce(f64::min)
        .map_or(0, |m| ring_scale(m, min_ring_size, max_ring_size).ceil() as u64)
}

/// Envoy's `RING_HASH` ring over `nodes`. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct EnvoyRingHash {
    nodes: NodeSet,
    min_ring_size: u64,
    max_ring_size: u64,
    /// (point, node), sorted by point.
    ring: Vec<(u64, u32)>,
}

impl EnvoyRingHash {
    /// The ring with Envoy's default sizes (1,024 to 8,388,608).
    ///
    /// # Errors
    ///
    /// As [`EnvoyRingHash::with_sizes`].
    pub fn new(nodes: NodeSet) -> Result<Self, Error> {
        EnvoyRingHash::with_sizes(nodes, DEFAULT_MIN_RING_SIZE, DEFAULT_MAX_RING_SIZE)
    }

    /// The ring with `minimum_ring_size` and `maximum_ring_size`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) unless
    /// `1 <= min <= max <= 8,388,608` (Envoy's limits).
    pub fn with_sizes(nodes: NodeSet, min_ring_size: u64, max_ring_size: u64) -> Result<Self, Error> {
        if min_ring_size == 0 || min_ring_size > max_ring_size || max_ring_size > DEFAULT_MAX_RING_SIZE {
            return Err(Error::invalid_parameter(format!(
                "envoy ring sizes must satisfy 1 <= minimum ({min_ring_size}) <= maximum ({max_ring_size}) <= {DEFAULT_MAX_RING_SIZE}"
            )));
        }
        let weights = normalized(&nodes);
        let mut ring = Vec::new();
        if let Some(min_w) = weights.iter().map(|&(_, w)| w).reduce(f64::min) {
            let scale = ring_scale(min_w, min_ring_size, max_ring_size);
            ring.reserve(scale.ceil() as usize);
            let (mut current, mut target) = (0.0f64, 0.0f64);
            let mut key = Vec::with_capacity(64);
            for &(n, w) in &weights {
                let name = nodes.nodes()[n].name().as_bytes();
                key.clear();
                key.extend_from_slice(name);
                key.push(b'_');
                let base = key.len();
                target += scale * w;
                let mut i = 0u64;
                while current < target {
                    key.truncate(base);
                    key.extend_from_slice(i.to_string().as_bytes());
                    ring.push((xxh64(&key, 0), n as u32));
                    i += 1;
                    current += 1.0;
                }
            }
        }
        // By (point, node): node order breaks ties, as a stable sort by point would (points are
        // pushed in node order), and an unstable sort of pairs is faster.
        ring.sort_unstable();
        Ok(EnvoyRingHash { nodes, min_ring_size, max_ring_size, ring })
    }

    /// The ring Envoy builds when `dead` are unhealthy: over the others.
    ///
    /// # Errors
    ///
    /// As [`EnvoyRingHash::with_sizes`].
    pub fn ejecting(&self, dead: &[usize]) -> Result<Self, Error> {
        EnvoyRingHash::with_sizes(super::drained(&self.nodes, dead)?, self.min_ring_size, self.max_ring_size)
    }

    /// The ring's size (points).
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether the ring is empty (no host with weight).
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    fn index(&self, hash: u64) -> Option<usize> {
        super::first_at_or_after(&self.ring, hash)
    }

    /// Envoy's pick on retry `attempt` with a retry host predicate: `attempt` points on.
    pub fn retry(&self, hash: u64, attempt: u32) -> Option<usize> {
        let i = self.index(hash)?;
        Some(self.ring[(i + attempt as usize) % self.ring.len()].1 as usize)
    }
}

impl Placement for EnvoyRingHash {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// `XXH64(key, 0)`.
    fn key_hash(&self, key: &[u8]) -> u64 {
        xxh64(key, 0)
    }

    fn pick_hash(&self, hash: u64) -> Option<usize> {
        self.index(hash).map(|i| self.ring[i].1 as usize)
    }
}

/// The ring walked onwards from a key's point: distinct nodes (see [`super::PointWalk`]).
pub type EnvoyRingRanked<'a> = super::PointWalk<'a, u64>;

impl Ranking for EnvoyRingHash {
    type Ranked<'a> = EnvoyRingRanked<'a>;

    /// keyroute's ranking: the ring walked onwards (Envoy's own is [`EnvoyRingHash::ejecting`]).
    fn ranked_hash(&self, hash: u64) -> EnvoyRingRanked<'_> {
        super::PointWalk::from(&self.ring, hash, self.nodes.len())
    }
}

/// Envoy's `MAGLEV` table over `nodes`. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct EnvoyMaglev {
    nodes: NodeSet,
    size: u64,
    table: Vec<u32>,
    fallback: Rendezvous,
}

impl EnvoyMaglev {
    /// The table of `table_size` entries (Envoy's default is [`DEFAULT_TABLE_SIZE`]).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) unless `table_size` is
    /// a prime up to 5,000,011 (Envoy: "The table size of maglev must be prime number").
    pub fn new(nodes: NodeSet, table_size: u64) -> Result<Self, Error> {
        if !crate::maglev::is_prime(table_size) || table_size > 5_000_011 {
            return Err(Error::invalid_parameter(format!(
                "envoy maglev table size {table_size} must be a prime up to 5000011"
            )));
        }
        let mut hosts = normalized(&nodes);
        let mut table = Vec::new();
        if !hosts.is_empty() {
            hosts.sort_by(|a, b| nodes.nodes()[a.0].name().as_bytes().cmp(nodes.nodes()[b.0].name().as_bytes()));
            let max_w = hosts.iter().map(|&(_, w)| w).fold(0.0f64, f64::max);
            let m = table_size;
            // (node, offset, skip, weight, target, next)
            let mut entries: Vec<(u32, u64, u64, f64, f64, u64)> = hosts
                .iter()
                .map(|&(n, w)| {
                    let key = nodes.nodes()[n].name().as_bytes();
                    (n as u32, xxh64(key, 0) % m, xxh64(key, 1) % (m - 1) + 1, w, 0.0, 0)
                })
                .collect();
            const EMPTY: u32 = u32::MAX;
            table = vec![EMPTY; m as usize];
            let mut filled = 0u64;
            let mut iteration = 1u32;
            while filled < m {
                for e in entries.iter_mut() {
                    if filled >= m {
                        break;
                    }
                    if f64::from(iteration) * e.3 < e.4 {
                        continue;
                    }
                    e.4 += max_w;
                    let mut c = (e.1 + e.2 * e.5) % m;
                    while table[c as usize] != EMPTY {
                        e.5 += 1;
                        c = (e.1 + e.2 * e.5) % m;
                    }
                    table[c as usize] = e.0;
                    e.5 += 1;
                    filled += 1;
                }
                iteration += 1;
            }
        }
        let fallback = Rendezvous::new(nodes.clone());
        Ok(EnvoyMaglev { nodes, size: table_size, table, fallback })
    }

    /// The table Envoy builds when `dead` are unhealthy: over the others.
    ///
    /// # Errors
    ///
    /// As [`EnvoyMaglev::new`].
    pub fn ejecting(&self, dead: &[usize]) -> Result<Self, Error> {
        EnvoyMaglev::new(super::drained(&self.nodes, dead)?, self.size)
    }

    /// The table's size (0 when no host has weight).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// How many entries each node holds.
    pub fn entries(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for &n in &self.table {
            counts[n as usize] += 1;
        }
        counts
    }

    /// Envoy's pick on retry `attempt` with a retry host predicate: `h ^ (2^64 - attempt)`.
    pub fn retry(&self, hash: u64, attempt: u32) -> Option<usize> {
        let h = if attempt > 0 { hash ^ 0u64.wrapping_sub(u64::from(attempt)) } else { hash };
        self.pick_hash(h)
    }
}

impl Placement for EnvoyMaglev {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// `XXH64(key, 0)`.
    fn key_hash(&self, key: &[u8]) -> u64 {
        xxh64(key, 0)
    }

    fn pick_hash(&self, hash: u64) -> Option<usize> {
        if self.table.is_empty() {
            return None;
        }
        Some(self.table[(hash % self.table.len() as u64) as usize] as usize)
    }
}

impl Ranking for EnvoyMaglev {
    type Ranked<'a> = Fallback<'a>;

    /// keyroute's ranking: the pick, then the rendezvous order of the others (Envoy's own is
    /// [`EnvoyMaglev::ejecting`]).
    fn ranked_hash(&self, hash: u64) -> Fallback<'_> {
        Fallback::new(self.pick_hash(hash), &self.fallback, hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: usize, weight: impl Fn(usize) -> u32) -> NodeSet {
        let spec: Vec<String> = (0..n).map(|i| format!("127.0.0.1:{}:weight={}", 21001 + i, weight(i))).collect();
        NodeSet::parse(&spec.join(",")).expect("valid")
    }

    #[test]
    fn xxh64_of_the_reference() {
        // XXH64("", 0) and XXH64("abc", 0) from the xxHash reference.
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
    }

    #[test]
    fn ring_sizes_of_the_specification() {
        let w8 = [1, 2, 3, 1, 1, 2, 3, 5];
        let size = |nodes| EnvoyRingHash::new(nodes).expect("valid").len();
        assert_eq!(size(ip(3, |_| 1)), 1026);
        assert_eq!(size(ip(8, |_| 1)), 1024);
        assert_eq!(size(ip(31, |_| 1)), 1054);
        assert_eq!(size(ip(8, |i| w8[i])), 1026);
        assert_eq!(size(ip(31, |i| 1 + (i % 5) as u32)), 1092);
        // In ip31w, the weight-1 hosts get 12 or 13 points (running sums).
        let r = EnvoyRingHash::new(ip(31, |i| 1 + (i % 5) as u32)).expect("valid");
        let mut per = vec![0usize; 31];
        for &(_, n) in &r.ring {
            per[n as usize] += 1;
        }
        let ones: Vec<usize> = (0..31).filter(|i| i % 5 == 0).map(|i| per[i]).collect();
        assert!(ones.iter().all(|&c| c == 12 || c == 13), "{ones:?}");
        assert!(EnvoyRingHash::with_sizes(ip(3, |_| 1), 10, 5).is_err());
        // The size a gateway checks before building is the built ring's.
        for nodes in [ip(3, |_| 1), ip(8, |i| w8[i]), ip(31, |i| 1 + (i % 5) as u32)] {
            let r = EnvoyRingHash::new(nodes.clone()).expect("valid");
            assert_eq!(ring_size(&nodes, DEFAULT_MIN_RING_SIZE, DEFAULT_MAX_RING_SIZE), r.len() as u64);
        }
    }

    #[test]
    fn maglev_entries_of_the_specification() {
        let w8 = [1, 2, 3, 1, 1, 2, 3, 5];
        let m = EnvoyMaglev::new(ip(8, |i| w8[i]), DEFAULT_TABLE_SIZE).expect("valid");
        let e = m.entries();
        for (i, &w) in w8.iter().enumerate() {
            let want = match w {
                1 => 3641,
                2 => 7282,
                3 => 10923,
                _ => 18204,
            };
            assert_eq!(e[i], want, "host {i} of weight {w}");
        }
        assert!(EnvoyMaglev::new(ip(3, |_| 1), 65536).is_err());
        assert!(EnvoyMaglev::new(NodeSet::empty(), 7).expect("valid").pick_hash(1).is_none());
    }

    #[test]
    fn ejecting_and_retries() {
        let r = EnvoyRingHash::new(ip(4, |_| 1)).expect("valid");
        let e = r.ejecting(&[2]).expect("valid");
        assert!((0..500u64).all(|k| e.pick_hash(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)) != Some(2)));
        assert_eq!(r.retry(77, 0), r.pick_hash(77));
        let m = EnvoyMaglev::new(ip(4, |_| 1), 251).expect("valid");
        assert_eq!(m.retry(77, 1), m.pick_hash(77 ^ u64::MAX));
        let ranked: Vec<usize> = m.ranked_hash(77).collect();
        assert_eq!(ranked.len(), 4);
        assert_eq!(Some(ranked[0]), m.pick_hash(77));
    }
}

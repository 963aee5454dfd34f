//! Compatibility modes: placement exactly as a deployed system does it, so that a fleet moves to
//! keyroute with no key moving. Each mode reproduces one system at a stated version, is locked by
//! golden vectors produced by that system's real program (`testdata/compat/`), and documents where
//! the original is odd.
//!
//! | mode | system | module | what a node's name is |
//! |---|---|---|---|
//! | `nginx` | nginx `hash $key consistent` | [`nginx`] | the `server` directive's text |
//! | `twemproxy` | twemproxy `distribution: ketama`, `hash: md5` | [`twemproxy`] | the server's `name`, or its `host:port` |
//! | `libketama` | libketama (last.fm's ketama) | [`libketama`] | the `ADDR` of its server file |
//! | `redis-cluster` | Redis Cluster keyslots and `redis-cli --cluster create` | [`redis`] | the master's `host:port` |
//! | `guava` | Guava's `Hashing.consistentHash` | [`guava`] | (not hashed: node `i` is bucket `i`) |
//! | `haproxy` | HAProxy `hash-type consistent` | [`haproxy`] | (not hashed: the server `id`, `:id=N`) |
//! | `envoy-ring-hash` | Envoy `RING_HASH` (from its source) | [`envoy`] | the host's hash key or address |
//! | `envoy-maglev` | Envoy `MAGLEV` (from its source) | [`envoy`] | the host's hash key or address |
//! | `groupcache` | Go groupcache's `consistenthash` | [`groupcache`] | the peer's name (its URL in `HTTPPool`) |
//!
//! Every mode is a [`Placement`] and a [`Ranking`]; [`CompatTable`] holds any of them, built by
//! [`Mode`] with [`CompatOptions`], and is what [`crate::Table::Compat`] and the strategy names
//! (`"nginx"`, `"haproxy"`, ...) select. Each module says what the original does when a node is
//! dead, and offers it next to keyroute's ranking. (The strategy alias `ketama` is keyroute's own
//! ring; the `libketama` mode is last.fm's continuum, exactly.)

use std::fmt;
use std::str::FromStr;

use crate::{Error, NodeSet, Placement, Ranking};

/// [`Placement`] and [`Ranking`] for a table of sorted 32-bit `(point, node)` pairs in a `points`
/// field, with its `nodes` and an inherent `hash_of(&self, key) -> u64`: the pick is the first
/// point at or after the key's hash, the ranking a walk onwards ([`PointWalk`]).
macro_rules! point_ring {
    ($table:ty, $ranked:ident, $rank_doc:literal) => {
        impl $crate::Placement for $table {
            fn nodes(&self) -> &$crate::NodeSet {
                &self.nodes
            }

            fn key_hash(&self, key: &[u8]) -> u64 {
                self.hash_of(key)
            }

            fn pick_hash(&self, hash: u64) -> Option<usize> {
                let i = super::first_at_or_after(&self.points, hash as u32)?;
                Some(self.points[i].1 as usize)
            }
        }

        /// The ring walked onwards from a key's point (see [`super::PointWalk`]).
        pub type $ranked<'a> = super::PointWalk<'a>;

        impl $crate::Ranking for $table {
            type Ranked<'a> = $ranked<'a>;

            #[doc = $rank_doc]
            fn ranked_hash(&self, hash: u64) -> $ranked<'_> {
                super::PointWalk::new(&self.points, hash, self.nodes.len())
            }
        }
    };
}

pub mod envoy;
pub mod groupcache;
pub mod guava;
pub mod haproxy;
pub mod libketama;
pub mod nginx;
pub mod redis;
pub mod twemproxy;

/// CRC32 (IEEE 802.3, zlib's `crc32`), eight bytes at a time (slicing-by-8).
pub fn crc32(bytes: &[u8]) -> u32 {
    !crc32_update(!0, bytes)
}

/// The CRC32 register after `bytes`, from register `crc` (`!0` to start; the CRC is `!register`):
/// a prefix hashed once, then continued.
pub(crate) fn crc32_update(mut crc: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let lo = crc ^ u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let t = &CRC32_TABLES;
        crc = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][usize::from(c[4])]
            ^ t[2][usize::from(c[5])]
            ^ t[1][usize::from(c[6])]
            ^ t[0][usize::from(c[7])];
    }
    for &b in chunks.remainder() {
        crc = (crc >> 8) ^ CRC32_TABLES[0][usize::from((crc as u8) ^ b)];
    }
    crc
}

/// `CRC32_TABLES[0]` is the byte-wise table; table `k` advances a byte through `k` more zero bytes.
const CRC32_TABLES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// MD5 of `bytes`.
fn md5(bytes: &[u8]) -> [u8; 16] {
    use md5::{Digest, Md5};
    Md5::digest(bytes).into()
}

/// The little-endian `u32` of a digest at byte `o`.
fn u32le(d: &[u8; 16], o: usize) -> u32 {
    u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]])
}

/// The ketama points of one server (libketama and twemproxy): group `k` in `0..groups` is
/// `MD5(label ++ "-" ++ decimal(k))`, and each of its four little-endian words is a point of `node`.
fn ketama_points(label: &str, groups: u32, node: u32, points: &mut Vec<(u32, u32)>) {
    for k in 0..groups {
        let d = md5(format!("{label}-{k}").as_bytes());
        points.extend([0, 4, 8, 12].map(|o| (u32le(&d, o), node)));
    }
}

/// Refuses weights other than 0 (drained) and 1 for the modes whose original has no weights.
fn unweighted(nodes: &NodeSet, mode: &str) -> Result<(), Error> {
    match nodes.nodes().iter().find(|n| n.weight() > 1) {
        Some(n) => Err(Error::invalid_parameter(format!(
            "{mode} has no weights: node '{}' has weight {} (use 1, or 0 to drain it)",
            n.name(),
            n.weight()
        ))),
        None => Ok(()),
    }
}

/// Refuses a ring of more than [`crate::ring::MAX_POINTS`] points before allocating it.
fn check_points(points: u64, mode: &str) -> Result<(), Error> {
    if points > crate::ring::MAX_POINTS {
        return Err(Error::new(
            crate::ErrorKind::TooLarge,
            format!("{mode}: {points} points is more than {} (lower the weights or replicas)", crate::ring::MAX_POINTS),
        ));
    }
    Ok(())
}

/// The same nodes with `dead` drained (weight 0): the set a system that rebuilds over its live
/// servers (twemproxy's ejection, Envoy's healthy hosts) builds from.
fn drained(nodes: &NodeSet, dead: &[usize]) -> Result<NodeSet, Error> {
    NodeSet::try_new(
        nodes
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| if dead.contains(&i) { n.clone().with_weight(0) } else { n.clone() }),
    )
}

/// A compatibility mode, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// `nginx` ([`nginx::NginxHash`]).
    Nginx,
    /// `twemproxy` ([`twemproxy::Twemproxy`]).
    Twemproxy,
    /// `libketama` ([`libketama::Libketama`]).
    Libketama,
    /// `redis-cluster` ([`redis::RedisCluster`]).
    RedisCluster,
    /// `guava` ([`guava::GuavaConsistentHash`]).
    Guava,
    /// `haproxy` ([`haproxy::HaproxyRing`]).
    Haproxy,
    /// `envoy-ring-hash` ([`envoy::EnvoyRingHash`]).
    EnvoyRingHash,
    /// `envoy-maglev` ([`envoy::EnvoyMaglev`]).
    EnvoyMaglev,
    /// `groupcache` ([`groupcache::GroupcacheRing`]).
    Groupcache,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 9] = [
        Mode::Nginx,
        Mode::Twemproxy,
        Mode::Libketama,
        Mode::RedisCluster,
        Mode::Guava,
        Mode::Haproxy,
        Mode::EnvoyRingHash,
        Mode::EnvoyMaglev,
        Mode::Groupcache,
    ];

    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Nginx => "nginx",
            Mode::Twemproxy => "twemproxy",
            Mode::Libketama => "libketama",
            Mode::RedisCluster => "redis-cluster",
            Mode::Guava => "guava",
            Mode::Haproxy => "haproxy",
            Mode::EnvoyRingHash => "envoy-ring-hash",
            Mode::EnvoyMaglev => "envoy-maglev",
            Mode::Groupcache => "groupcache",
        }
    }

    /// Whether an empty key is placed by the original (nginx and HAProxy send it round robin).
    pub fn hashes_empty_key(self) -> bool {
        !matches!(self, Mode::Nginx | Mode::Haproxy)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = Error;

    /// # Errors
    ///
    /// An unknown name, listing the valid ones.
    fn from_str(s: &str) -> Result<Self, Error> {
        Mode::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Mode::ALL.iter().map(|m| m.name()).collect();
            Error::invalid_parameter(format!("unknown compatibility mode '{s}' (valid: {})", names.join(", ")))
        })
    }
}

/// The parameters of the modes that have some, with the originals' defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CompatOptions {
    /// groupcache: points per node (HTTPPool's default, 50).
    pub groupcache_replicas: u32,
    /// guava: what `consistentHash` is given.
    pub guava_input: guava::GuavaInput,
    /// haproxy: the key hash (default `sdbm` with avalanche).
    pub haproxy_hash: haproxy::HaproxyHash,
    /// twemproxy: `hash_tag` (none by default).
    pub twemproxy_hash_tag: Option<[u8; 2]>,
    /// envoy-ring-hash: `minimum_ring_size` (1,024).
    pub envoy_min_ring_size: u64,
    /// envoy-ring-hash: `maximum_ring_size` (8,388,608).
    pub envoy_max_ring_size: u64,
    /// envoy-maglev: `table_size` (65,537).
    pub envoy_table_size: u64,
}

impl Default for CompatOptions {
    fn default() -> Self {
        CompatOptions {
            groupcache_replicas: 50,
            guava_input: guava::GuavaInput::Murmur3_128,
            haproxy_hash: haproxy::HaproxyHash::default(),
            twemproxy_hash_tag: None,
            envoy_min_ring_size: envoy::DEFAULT_MIN_RING_SIZE,
            envoy_max_ring_size: envoy::DEFAULT_MAX_RING_SIZE,
            envoy_table_size: envoy::DEFAULT_TABLE_SIZE,
        }
    }
}

impl CompatOptions {
    /// The number of entries (points, slots) the table of `mode` over `nodes` would have, before
    /// it is built: what a gateway checks against its size limit.
    pub fn table_entries(&self, mode: Mode, nodes: &NodeSet) -> u64 {
        let total = nodes.total_weight();
        let live = nodes.live_count() as u64;
        match mode {
            Mode::Nginx => total.saturating_mul(u64::from(nginx::POINTS_PER_WEIGHT)),
            Mode::Twemproxy | Mode::Libketama => live.saturating_mul(160),
            Mode::RedisCluster => u64::from(redis::SLOTS),
            Mode::Guava => nodes.len() as u64,
            Mode::Haproxy => total.saturating_mul(u64::from(haproxy::POINTS_PER_WEIGHT)),
            Mode::EnvoyRingHash => envoy::ring_size(nodes, self.envoy_min_ring_size, self.envoy_max_ring_size),
            Mode::EnvoyMaglev => self.envoy_table_size,
            Mode::Groupcache => (nodes.len() as u64).saturating_mul(u64::from(self.groupcache_replicas)),
        }
    }
}

/// Any compatibility table. See the [module documentation](self).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum CompatTable {
    /// nginx.
    Nginx(nginx::NginxHash),
    /// twemproxy.
    Twemproxy(twemproxy::Twemproxy),
    /// libketama.
    Libketama(libketama::Libketama),
    /// Redis Cluster.
    RedisCluster(redis::RedisCluster),
    /// Guava.
    Guava(guava::GuavaConsistentHash),
    /// HAProxy.
    Haproxy(haproxy::HaproxyRing),
    /// Envoy's ring.
    EnvoyRingHash(envoy::EnvoyRingHash),
    /// Envoy's Maglev.
    EnvoyMaglev(envoy::EnvoyMaglev),
    /// groupcache.
    Groupcache(groupcache::GroupcacheRing),
}

macro_rules! each_compat {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            CompatTable::Nginx($t) => $e,
            CompatTable::Twemproxy($t) => $e,
            CompatTable::Libketama($t) => $e,
            CompatTable::RedisCluster($t) => $e,
            CompatTable::Guava($t) => $e,
            CompatTable::Haproxy($t) => $e,
            CompatTable::EnvoyRingHash($t) => $e,
            CompatTable::EnvoyMaglev($t) => $e,
            CompatTable::Groupcache($t) => $e,
        }
    };
}

impl CompatTable {
    /// The table of `mode` over `nodes`.
    ///
    /// # Errors
    ///
    /// The mode's construction errors (no node with weight where the original refuses that, a
    /// Maglev size that is not prime, an HAProxy weight above 256, ...).
    pub fn build(mode: Mode, nodes: NodeSet, options: &CompatOptions) -> Result<Self, Error> {
        Ok(match mode {
            Mode::Nginx => CompatTable::Nginx(nginx::NginxHash::new(nodes)?),
            Mode::Twemproxy => CompatTable::Twemproxy(twemproxy::Twemproxy::new(nodes, options.twemproxy_hash_tag)?),
            Mode::Libketama => CompatTable::Libketama(libketama::Libketama::new(nodes)?),
            Mode::RedisCluster => CompatTable::RedisCluster(redis::RedisCluster::new(nodes)?),
            Mode::Guava => CompatTable::Guava(guava::GuavaConsistentHash::new(nodes, options.guava_input)?),
            Mode::Haproxy => CompatTable::Haproxy(haproxy::HaproxyRing::new(nodes, options.haproxy_hash)?),
            Mode::EnvoyRingHash => CompatTable::EnvoyRingHash(envoy::EnvoyRingHash::with_sizes(
                nodes,
                options.envoy_min_ring_size,
                options.envoy_max_ring_size,
            )?),
            Mode::EnvoyMaglev => CompatTable::EnvoyMaglev(envoy::EnvoyMaglev::new(nodes, options.envoy_table_size)?),
            Mode::Groupcache => {
                CompatTable::Groupcache(groupcache::GroupcacheRing::new(nodes, options.groupcache_replicas)?)
            }
        })
    }

    /// The table's mode.
    pub fn mode(&self) -> Mode {
        match self {
            CompatTable::Nginx(_) => Mode::Nginx,
            CompatTable::Twemproxy(_) => Mode::Twemproxy,
            CompatTable::Libketama(_) => Mode::Libketama,
            CompatTable::RedisCluster(_) => Mode::RedisCluster,
            CompatTable::Guava(_) => Mode::Guava,
            CompatTable::Haproxy(_) => Mode::Haproxy,
            CompatTable::EnvoyRingHash(_) => Mode::EnvoyRingHash,
            CompatTable::EnvoyMaglev(_) => Mode::EnvoyMaglev,
            CompatTable::Groupcache(_) => Mode::Groupcache,
        }
    }
}

impl Placement for CompatTable {
    fn nodes(&self) -> &NodeSet {
        each_compat!(self, t => t.nodes())
    }

    fn key_hash(&self, key: &[u8]) -> u64 {
        each_compat!(self, t => t.key_hash(key))
    }

    fn pick_hash(&self, hash: u64) -> Option<usize> {
        each_compat!(self, t => t.pick_hash(hash))
    }
}

/// The ranking iterator of a [`CompatTable`].
#[derive(Clone, Debug)]
pub enum CompatRanked<'a> {
    /// A 32-bit point ring walked onwards (nginx, twemproxy, libketama, groupcache).
    Walk(PointWalk<'a>),
    /// HAProxy's nearest-left order.
    Haproxy(haproxy::HaproxyRanked<'a>),
    /// Envoy's ring walked onwards.
    EnvoyRing(envoy::EnvoyRingRanked<'a>),
    /// A pick followed by the rendezvous order of the rest (Redis, Guava, Envoy's Maglev).
    Fallback(crate::rendezvous::Fallback<'a>),
}

impl Iterator for CompatRanked<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match self {
            CompatRanked::Walk(r) => r.next(),
            CompatRanked::Haproxy(r) => r.next(),
            CompatRanked::EnvoyRing(r) => r.next(),
            CompatRanked::Fallback(r) => r.next(),
        }
    }
}

impl Ranking for CompatTable {
    type Ranked<'a> = CompatRanked<'a>;

    fn ranked_hash(&self, hash: u64) -> CompatRanked<'_> {
        match self {
            CompatTable::Nginx(t) => CompatRanked::Walk(t.ranked_hash(hash)),
            CompatTable::Twemproxy(t) => CompatRanked::Walk(t.ranked_hash(hash)),
            CompatTable::Libketama(t) => CompatRanked::Walk(t.ranked_hash(hash)),
            CompatTable::Groupcache(t) => CompatRanked::Walk(t.ranked_hash(hash)),
            CompatTable::RedisCluster(t) => CompatRanked::Fallback(t.ranked_hash(hash)),
            CompatTable::Guava(t) => CompatRanked::Fallback(t.ranked_hash(hash)),
            CompatTable::EnvoyMaglev(t) => CompatRanked::Fallback(t.ranked_hash(hash)),
            CompatTable::Haproxy(t) => CompatRanked::Haproxy(t.ranked_hash(hash)),
            CompatTable::EnvoyRingHash(t) => CompatRanked::EnvoyRing(t.ranked_hash(hash)),
        }
    }
}

/// Sorts `(point, node)` pairs by point, stably: equal points keep the order they were pushed in
/// (node order, as the stable sorts of the originals leave them). An LSD radix sort of four
/// 8-bit passes: a ring of 12,800 points sorts in a fraction of a comparison sort's time.
fn sort_points(points: &mut Vec<(u32, u32)>) {
    if points.len() < 256 {
        points.sort_by_key(|p| p.0);
        return;
    }
    let mut from = std::mem::take(points);
    let mut to = vec![(0u32, 0u32); from.len()];
    for shift in [0u32, 8, 16, 24] {
        let mut counts = [0usize; 256];
        for &(p, _) in &from {
            counts[((p >> shift) & 0xff) as usize] += 1;
        }
        if counts.contains(&from.len()) {
            continue; // every point has the same byte here: the pass would change nothing
        }
        let mut at = 0;
        for c in &mut counts {
            let n = *c;
            *c = at;
            at += n;
        }
        for &e in &from {
            let b = ((e.0 >> shift) & 0xff) as usize;
            to[counts[b]] = e;
            counts[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
    }
    *points = from;
}

/// The index of the first of `points` (sorted by value) at or after `h`, wrapping to 0: the pick of
/// every point ring here (32-bit points, and Envoy's 64-bit ones).
fn first_at_or_after<P: Copy + Ord>(points: &[(P, u32)], h: P) -> Option<usize> {
    if points.is_empty() {
        return None;
    }
    let i = points.partition_point(|&(p, _)| p < h);
    Some(if i == points.len() { 0 } else { i })
}

/// A point ring walked onwards from a key's point: distinct nodes, owner first. nginx fails over
/// this way; for the systems with no failover of their own it is keyroute's ranking over them.
#[derive(Clone, Debug)]
pub struct PointWalk<'a, P = u32> {
    points: &'a [(P, u32)],
    at: usize,
    left: usize,
    seen: Vec<bool>,
}

impl<'a> PointWalk<'a> {
    fn new(points: &'a [(u32, u32)], hash: u64, nodes: usize) -> Self {
        PointWalk::from(points, hash as u32, nodes)
    }
}

impl<'a, P: Copy + Ord> PointWalk<'a, P> {
    fn from(points: &'a [(P, u32)], h: P, nodes: usize) -> Self {
        let at = first_at_or_after(points, h).unwrap_or(0);
        PointWalk { points, at, left: points.len(), seen: vec![false; nodes] }
    }
}

impl<P: Copy> Iterator for PointWalk<'_, P> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_zlibs() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"The quick brown fox jumps over the lazy dog"), 0x414F_A339);
        // Every length around the 8-byte stride, against the byte-wise definition.
        let bytewise = |b: &[u8]| !b.iter().fold(!0u32, |c, &x| (c >> 8) ^ CRC32_TABLES[0][usize::from((c as u8) ^ x)]);
        let data: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..data.len() {
            assert_eq!(crc32(&data[..len]), bytewise(&data[..len]), "{len}");
        }
    }

    #[test]
    fn drained_and_weighted_nodes_in_the_modes_without_weights() {
        let options = CompatOptions::default();
        let drained = NodeSet::parse("a,b:weight=0,c,d").expect("valid");
        for mode in [Mode::Guava, Mode::Groupcache, Mode::RedisCluster] {
            let t = CompatTable::build(mode, drained.clone(), &options).expect("valid");
            for k in 0..2000u32 {
                let key = k.to_le_bytes();
                let h = t.key_hash(&key);
                assert_ne!(t.pick_hash(h), Some(1), "{mode}: a drained node owns nothing");
                let ranked: Vec<usize> = t.ranked_hash(h).collect();
                assert_eq!(ranked.first().copied(), t.pick_hash(h), "{mode}");
                assert!(!ranked.contains(&1), "{mode}: {ranked:?}");
            }
            let weighted = NodeSet::parse("a,b:weight=2,c").expect("valid");
            let err = CompatTable::build(mode, weighted, &options).expect_err("no weights");
            assert!(err.to_string().contains("no weights"), "{err}");
        }
    }

    #[test]
    fn huge_tables_are_refused_before_they_are_allocated() {
        let options = CompatOptions::default();
        let heavy = NodeSet::parse("a:weight=4294967295,b").expect("valid");
        for mode in [Mode::Nginx, Mode::Haproxy] {
            assert!(CompatTable::build(mode, heavy.clone(), &options).is_err(), "{mode}");
        }
        let many = CompatOptions { groupcache_replicas: 100_000, ..options };
        let names: Vec<String> = (0..400).map(|i| format!("n{i}")).collect();
        assert!(CompatTable::build(Mode::Groupcache, NodeSet::parse(&names.join(",")).expect("valid"), &many).is_err());
        // HAProxy ids that coincide modulo 2^20, or above an int.
        assert!(
            CompatTable::build(Mode::Haproxy, NodeSet::parse("a:id=1,b:id=1048577").expect("valid"), &options).is_err()
        );
        assert!(
            CompatTable::build(Mode::Haproxy, NodeSet::parse("a:id=2147483648").expect("valid"), &options).is_err()
        );
    }

    #[test]
    fn twemproxy_hashes_an_empty_key_to_zero() {
        let t = CompatTable::build(Mode::Twemproxy, NodeSet::parse("a,b,c").expect("valid"), &CompatOptions::default())
            .expect("valid");
        assert_eq!(t.key_hash(b""), 0);
        let tagged = CompatOptions { twemproxy_hash_tag: Some(*b"{}"), ..CompatOptions::default() };
        let t = CompatTable::build(Mode::Twemproxy, NodeSet::parse("a,b,c").expect("valid"), &tagged).expect("valid");
        assert_ne!(t.key_hash(b"{}x"), 0, "an empty tag hashes the whole key");
    }

    #[test]
    fn radix_sort_is_a_stable_sort_by_point() {
        let mut rng = crate::hash::SplitMix64::new(9);
        use crate::hash::RandomSource;
        for n in [0usize, 1, 255, 256, 5000] {
            // Few distinct points, so that ties are many.
            let v: Vec<(u32, u32)> = (0..n).map(|i| ((rng.below(700) as u32) << 20 | 3, i as u32)).collect();
            let mut want = v.clone();
            want.sort_by_key(|p| p.0);
            let mut got = v;
            sort_points(&mut got);
            assert_eq!(got, want, "{n}");
        }
    }
}

//! The consistent hash ring with virtual nodes and weights.
//!
//! # The algorithm
//!
//! Hash every node onto a circle of 2^64 positions many times (its *virtual nodes*, or points), and
//! hash each key onto the same circle: the key belongs to the first point at or after its position,
//! wrapping past the top (Karger et al., *Consistent hashing and random trees*, STOC 1997). The
//! key's **preference list** is the distinct nodes met walking on clockwise (Dynamo's replication
//! rule: DeCandia et al., SOSP 2007).
//!
//! # Guarantees
//!
//! - **Minimal movement.** A node's points depend only on its name, so adding a node moves only the
//!   keys that now fall just before one of its points (to it), and removing one moves only its own
//!   keys, each to the next point's node. Raising a node's weight only adds points (keys move only to
//!   it); lowering it only removes points.
//! - **Balance improves with points.** With `V` points per node, a node's share of the circle has a
//!   relative standard deviation of about `1/sqrt(V)`: 10% at V = 100, 8% at 160. The tests check the
//!   busiest node against that law.
//! - **Weights are absolute.** A node of weight `w` gets `V x w` points. (libketama instead
//!   normalises points by the *total* weight, so adding one node changes every other node's point
//!   count and moves keys between unrelated nodes. keyroute never does.)
//!
//! # Cost
//!
//! Build is `O(P)` for `P = V x sum(w)` points: points are bucketed by their top bits (a counting
//! sort; the hashes are uniform, so buckets are tiny) and the bucket starts are kept as an index.
//! A lookup reads the bucket's start and end, and scans the bucket's few points: `O(1)` expected,
//! two cache lines (the index's, and the points' with their nodes beside them), no tree walk or
//! binary search. Memory is 16 bytes a point (its position and its node) and 4 to 8 for the index.
//!
//! # When to choose it
//!
//! Large or fast-changing fleets (thousands of nodes, where rendezvous's `O(n)` pick costs too much),
//! compatibility with an existing ring client (the [`RingScheme::JavaMd5`] scheme reproduces the
//! consistent-hashing note's Java sketch exactly), and replication along the ring. Its balance is
//! worse than rendezvous's or Maglev's for the same memory; raise `V` to tighten it.
//!
//! # Point schemes (part of the placement contract)
//!
//! - [`RingScheme::Xxh3`] (default): point `i` of node `name` is at `XXH3-64("{name}#{i}")`, for
//!   `i` in `0..V x weight`; keys are hashed by the table's [`KeyHasher`].
//! - [`RingScheme::JavaMd5`]: the Java sketch: point at `md5_64("{name}#{i}")`, keys at
//!   `md5_64(key)`, both ordered as Java's *signed* `long` (the sketch keeps them in a
//!   `TreeMap<Long, String>`); the owner is the first point at or after the key (`ceilingEntry`),
//!   wrapping to the first.
//!
//! Two points at the same position (a 64-bit collision) keep both; the node with the smaller name
//! comes first, so the result does not depend on the order nodes are listed in.

use crate::hash::{KeyHasher, md5_64, xxh3_64};
use crate::{Error, ErrorKind, NodeSet, Placement, Ranking};

/// How node points and keys are placed on the ring. See the [module documentation](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RingScheme {
    /// Points at `XXH3-64("{name}#{i}")`; keys by the table's key hasher.
    #[default]
    Xxh3,
    /// The consistent-hashing note's Java sketch: MD5-64 for points `"{name}#{i}"` and keys,
    /// compared as signed 64-bit integers.
    JavaMd5,
}

impl RingScheme {
    /// The scheme's name in configuration and on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            RingScheme::Xxh3 => "xxh3",
            RingScheme::JavaMd5 => "java-md5",
        }
    }
}

impl std::str::FromStr for RingScheme {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "xxh3" | "keyroute" => Ok(RingScheme::Xxh3),
            "java-md5" => Ok(RingScheme::JavaMd5),
            _ => Err(Error::invalid_parameter(format!("unknown ring scheme '{s}' (expected one of: xxh3, java-md5)"))),
        }
    }
}

/// Java's `Long` order as unsigned order: flip the sign bit.
const SIGN: u64 = 1 << 63;

/// The default number of points per unit of weight: 160, as in libketama and nginx (40 x 4),
/// which keeps a node's share within about 8% (one standard deviation) of its fair share.
pub const DEFAULT_VNODES: u32 = 160;

/// The largest ring keyroute builds: 2^25 points (512 MiB). Larger weights x vnodes are an error.
pub const MAX_POINTS: u64 = 1 << 25;

/// A consistent hash ring. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{HashRing, NodeSet, Placement, RingScheme};
/// let ring = HashRing::builder().vnodes(100).scheme(RingScheme::JavaMd5).build(NodeSet::parse("A,B,C")?)?;
/// let owner = ring.pick(b"user:42").map(|n| n.name().to_owned());
/// assert!(owner.is_some());
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct HashRing {
    nodes: NodeSet,
    hasher: KeyHasher,
    scheme: RingScheme,
    vnodes: u32,
    /// The points, sorted by position (as unsigned, after the scheme's transform) then by their
    /// node's name; each beside its node, so that a lookup reads one cache line, not two.
    points: Box<[Point]>,
    /// `index[b]` = the first point in bucket `b` (points whose top bits are `b`); `index[B] = P`.
    index: Box<[u32]>,
    /// `64 - log2(B)`.
    shift: u32,
}

/// A point of the ring and the node it belongs to.
#[derive(Clone, Copy, Debug)]
struct Point {
    at: u64,
    owner: u32,
}

/// Options for building a [`HashRing`].
#[derive(Clone, Copy, Debug)]
pub struct HashRingBuilder {
    vnodes: u32,
    scheme: RingScheme,
    hasher: KeyHasher,
}

impl Default for HashRingBuilder {
    fn default() -> Self {
        HashRingBuilder { vnodes: DEFAULT_VNODES, scheme: RingScheme::default(), hasher: KeyHasher::default() }
    }
}

impl HashRingBuilder {
    /// Points per unit of weight (default [`DEFAULT_VNODES`]).
    #[must_use]
    pub fn vnodes(mut self, vnodes: u32) -> Self {
        self.vnodes = vnodes;
        self
    }

    /// The point scheme (default [`RingScheme::Xxh3`]).
    #[must_use]
    pub fn scheme(mut self, scheme: RingScheme) -> Self {
        self.scheme = scheme;
        self
    }

    /// The key hash for [`RingScheme::Xxh3`] (ignored by [`RingScheme::JavaMd5`], which hashes keys
    /// with MD5).
    #[must_use]
    pub fn hasher(mut self, hasher: KeyHasher) -> Self {
        self.hasher = hasher;
        self
    }

    /// Builds the ring.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`] if `vnodes` is 0; [`ErrorKind::TooLarge`] if the ring would
    /// have more than [`MAX_POINTS`] points.
    pub fn build(self, nodes: NodeSet) -> Result<HashRing, Error> {
        if self.vnodes == 0 {
            return Err(Error::invalid_parameter("vnodes must be at least 1"));
        }
        let total = u64::from(self.vnodes) * nodes.total_weight();
        if total > MAX_POINTS {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "a ring of {total} points (vnodes {} x total weight {}) is above the limit of {MAX_POINTS}",
                    self.vnodes,
                    nodes.total_weight()
                ),
            ));
        }
        let hasher = match self.scheme {
            RingScheme::Xxh3 => self.hasher,
            RingScheme::JavaMd5 => KeyHasher::Md5,
        };
        Ok(build(nodes, self.vnodes, self.scheme, hasher, total as usize))
    }
}

#[inline]
fn point_hash(scheme: RingScheme, label: &[u8]) -> u64 {
    match scheme {
        RingScheme::Xxh3 => xxh3_64(label),
        RingScheme::JavaMd5 => md5_64(label) ^ SIGN,
    }
}

fn build(nodes: NodeSet, vnodes: u32, scheme: RingScheme, hasher: KeyHasher, total: usize) -> HashRing {
    // Bucket count: the power of two at or above the point count (at least 2), so a bucket holds
    // about one point on average.
    let buckets = total.next_power_of_two().max(2);
    let shift = 64 - buckets.trailing_zeros();
    // Every point's position, node by node: a point's owner is the node whose run it is in, so
    // only the positions are kept (8 bytes a point, not 16).
    let mut at: Vec<u64> = Vec::with_capacity(total);
    let mut labels = Labels::default();
    for node in nodes.nodes() {
        let count = u64::from(vnodes) * u64::from(node.weight());
        labels.start(node.name().as_bytes());
        let mut made = 0;
        while made < count {
            let n = labels.fill(count - made);
            at.extend(labels.iter(n).map(|label| point_hash(scheme, label)));
            made += n as u64;
        }
    }
    let runs = nodes.nodes().iter().map(|n| (u64::from(vnodes) * u64::from(n.weight())) as usize);
    let (points, index) = order_points(&at, runs, nodes.name_ranks(), shift);
    HashRing { nodes, hasher, scheme, vnodes, points: points.into(), index: index.into(), shift }
}

/// The ring's points in order (by position, then by their owners' name ranks) and its bucket
/// index (bucket `b`'s points start at `index[b]`; `index[buckets]` is the point count), for
/// `2^(64 - shift)` buckets. `at` holds the positions in runs, one per node in node order, of
/// the lengths `runs` gives.
fn order_points(at: &[u64], runs: impl Iterator<Item = usize>, ranks: &[u32], shift: u32) -> (Vec<Point>, Vec<u32>) {
    let buckets = 1usize << (64 - shift);
    let bucket = |h: u64| (h >> shift) as usize;
    // A counting sort by bucket. Counting is a pass of its own: done while the positions were
    // hashed, its random increments made the build 1.4x slower.
    let mut index = vec![0u32; buckets + 1];
    for &h in at {
        index[bucket(h)] += 1;
    }
    // The index is its own cursor: it first holds each bucket's end (a running sum kept in a
    // register, not reloaded from the entry before), and each point placed moves its bucket's
    // entry down by one, to the bucket's start when all are placed.
    let mut sum = 0u32;
    for e in &mut index {
        sum += *e;
        *e = sum;
    }
    let mut sorted = vec![Point { at: 0, owner: 0 }; at.len()];
    let mut rest = at;
    for (owner, len) in runs.enumerate() {
        let (run, after) = rest.split_at(len.min(rest.len()));
        for &h in run {
            let b = bucket(h);
            index[b] -= 1;
            sorted[index[b] as usize] = Point { at: h, owner: owner as u32 };
        }
        rest = after;
    }
    // The buckets are in order, so two neighbours out of order (or at the same position) share a
    // bucket: only such a bucket is sorted. Most buckets hold one point or none, and one pass
    // over the points finds the others.
    let mut i = 1;
    while i < sorted.len() {
        if sorted[i - 1].at < sorted[i].at {
            i += 1;
            continue;
        }
        let b = bucket(sorted[i].at);
        let (lo, hi) = (index[b] as usize, index[b + 1] as usize);
        match &mut sorted[lo..hi] {
            // Most of these: two points, ordered without calling a sort.
            [x, y] if x.at != y.at => std::mem::swap(x, y),
            points => points.sort_unstable_by_key(|p| (p.at, ranks[p.owner as usize])),
        }
        i = hi.max(i + 1);
    }
    (sorted, index)
}

/// Labels made in batches: `name#0`, `name#1`, ... written into slots of a buffer, then hashed.
///
/// A label is hashed by word loads; had its digits just been written byte by byte, each load
/// would wait for those stores to reach the cache (a store cannot be forwarded to a wider load),
/// about a sixth of the build. Here the number is counted up in a register ([`Decimal`]) and
/// written by one 8-byte store, a batch before it is read. The name and `#` are written into
/// every slot once per node.
#[derive(Debug, Default)]
struct Labels {
    /// `BATCH` slots of `stride` bytes: `name#` and 8 bytes for the number.
    buf: Vec<u8>,
    stride: usize,
    /// Bytes of `name#`.
    base: usize,
    /// The next label's number.
    number: Decimal,
    /// Each slot's label length.
    lens: [usize; Labels::BATCH],
}

impl Labels {
    const BATCH: usize = 32;

    /// Starts the labels of the node named `name` at `name#0`.
    fn start(&mut self, name: &[u8]) {
        self.base = name.len() + 1;
        self.stride = self.base + 8;
        self.buf.clear();
        self.buf.resize(Self::BATCH * self.stride, 0);
        for slot in self.buf.chunks_exact_mut(self.stride) {
            slot[..name.len()].copy_from_slice(name);
            slot[name.len()] = b'#';
        }
        self.number = Decimal::default();
    }

    /// Writes the next `min(left, BATCH)` labels into the slots; returns how many.
    fn fill(&mut self, left: u64) -> usize {
        let n = left.min(Self::BATCH as u64) as usize;
        for (k, slot) in self.buf.chunks_exact_mut(self.stride).take(n).enumerate() {
            let (ascii, digits) = self.number.ascii();
            slot[self.base..].copy_from_slice(&ascii.to_le_bytes());
            self.lens[k] = self.base + digits;
            self.number.increment();
        }
        n
    }

    /// The first `n` labels written.
    fn iter(&self, n: usize) -> impl Iterator<Item = &[u8]> {
        self.buf.chunks_exact(self.stride).zip(&self.lens).take(n).map(|(slot, &len)| &slot[..len])
    }
}

/// A decimal number of up to 8 digits counted up in one register, without a division: byte `i`
/// holds the `i`-th digit from the right plus `0xF6`, so a 9 is `0xFF` and adding one carries
/// into the next byte by itself. (A node has at most [`MAX_POINTS`] labels, fewer than 10^8.)
#[derive(Clone, Copy, Debug)]
struct Decimal {
    biased: u64,
    digits: u32,
}

const _: () = assert!(MAX_POINTS <= 100_000_000, "a label's number must fit in 8 decimal digits");

impl Decimal {
    const BIAS: u64 = 0xF6F6_F6F6_F6F6_F6F6;

    /// Adds one.
    fn increment(&mut self) {
        let x = self.biased.wrapping_add(1);
        // The digits that were 9 wrapped to 0x00: back to a biased 0.
        let wrapped = x.trailing_zeros() / 8;
        let low = if wrapped >= 8 { u64::MAX } else { (1u64 << (8 * wrapped)) - 1 };
        self.biased = x | (Self::BIAS & low);
        if wrapped >= self.digits {
            self.digits = (wrapped + 1).min(8);
        }
    }

    /// The number in ASCII, its first digit in the lowest byte (the order of
    /// `to_le_bytes`), and how many digits it has.
    fn ascii(self) -> (u64, usize) {
        // Each byte is at least 0xF6: subtracting 0xC6 from every byte borrows nothing.
        let ascii = self.biased - 0xC6C6_C6C6_C6C6_C6C6;
        (ascii.swap_bytes() >> (8 * (8 - self.digits)), self.digits as usize)
    }
}

impl Default for Decimal {
    fn default() -> Self {
        Decimal { biased: Self::BIAS, digits: 1 }
    }
}

impl HashRing {
    /// Options for a ring: vnodes, scheme, key hash.
    pub fn builder() -> HashRingBuilder {
        HashRingBuilder::default()
    }

    /// A ring with the default options ([`DEFAULT_VNODES`] points per unit of weight, XXH3).
    ///
    /// # Errors
    ///
    /// As [`HashRingBuilder::build`].
    pub fn new(nodes: NodeSet) -> Result<Self, Error> {
        Self::builder().build(nodes)
    }

    /// Points per unit of weight.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// The point scheme.
    pub fn scheme(&self) -> RingScheme {
        self.scheme
    }

    /// The total number of points.
    pub fn point_count(&self) -> usize {
        self.points.len()
    }

    /// The position (in `0..point_count`) of the first point at or after `h`, wrapping.
    #[inline]
    fn successor(&self, h: u64) -> usize {
        let b = (h >> self.shift) as usize;
        let (lo, hi) = (self.index[b] as usize, self.index[b + 1] as usize);
        let mut p = lo;
        while p < hi && self.points[p].at < h {
            p += 1;
        }
        if p == self.points.len() { 0 } else { p }
    }

    /// Each node's share of the ring's circumference (the fraction of uniformly hashed keys it
    /// owns), indexed like the node set.
    pub fn shares(&self) -> Vec<f64> {
        let mut shares = vec![0.0; self.nodes.len()];
        let n = self.points.len();
        for p in 0..n {
            let prev = if p == 0 { self.points[n - 1].at } else { self.points[p - 1].at };
            let arc = self.points[p].at.wrapping_sub(prev);
            shares[self.points[p].owner as usize] += arc as f64 / 2f64.powi(64);
        }
        if n == 1 {
            shares[self.points[0].owner as usize] = 1.0;
        }
        shares
    }
}

impl Placement for HashRing {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    #[inline]
    fn key_hash(&self, key: &[u8]) -> u64 {
        match self.scheme {
            RingScheme::Xxh3 => self.hasher.hash(key),
            RingScheme::JavaMd5 => md5_64(key) ^ SIGN,
        }
    }

    #[inline]
    fn pick_hash(&self, hash: u64) -> Option<usize> {
        if self.points.is_empty() {
            return None;
        }
        Some(self.points[self.successor(hash)].owner as usize)
    }
}

/// The distinct nodes met walking clockwise from a key: its preference list on the ring.
#[derive(Clone, Debug)]
pub struct RingRanked<'a> {
    ring: &'a HashRing,
    at: usize,
    steps: usize,
    found: usize,
    seen: crate::replicas::BitSet,
}

impl Iterator for RingRanked<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let n = self.ring.points.len();
        while self.steps < n && self.found < self.ring.nodes.live_count() {
            let owner = self.ring.points[self.at].owner as usize;
            self.steps += 1;
            self.at += 1;
            if self.at == n {
                self.at = 0;
            }
            if self.seen.insert(owner) {
                self.found += 1;
                return Some(owner);
            }
        }
        None
    }
}

impl Ranking for HashRing {
    type Ranked<'a> = RingRanked<'a>;

    fn ranked_hash(&self, hash: u64) -> RingRanked<'_> {
        let at = if self.points.is_empty() { 0 } else { self.successor(hash) };
        RingRanked { ring: self, at, steps: 0, found: 0, seen: crate::replicas::BitSet::new(self.nodes.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{RandomSource, SplitMix64};

    /// The naive ring: a sorted list and a binary search, as in the note's Python sketch.
    fn naive_pick(ring: &HashRing, h: u64) -> Option<usize> {
        let mut pts: Vec<(u64, u32, usize)> = Vec::new();
        for (i, node) in ring.nodes.nodes().iter().enumerate() {
            for v in 0..u64::from(ring.vnodes) * u64::from(node.weight()) {
                let label = format!("{}#{v}", node.name());
                pts.push((point_hash(ring.scheme, label.as_bytes()), ring.nodes.name_ranks()[i], i));
            }
        }
        pts.sort();
        if pts.is_empty() {
            return None;
        }
        let p = pts.partition_point(|&(x, _, _)| x < h);
        Some(pts[if p == pts.len() { 0 } else { p }].2)
    }

    /// The points in order and the bucket index, against a plain sort, on positions drawn from
    /// small ranges: many points share a bucket, and many share a position (ordered by their
    /// owners' name ranks).
    #[test]
    fn points_are_ordered_by_position_then_name_rank() {
        let mut rng = SplitMix64::new(0x0bde5);
        for round in 0..300 {
            let nodes = 1 + rng.below(12) as usize;
            let mut ranks: Vec<u32> = (0..nodes as u32).collect();
            for i in (1..nodes).rev() {
                ranks.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let runs: Vec<usize> = (0..nodes).map(|_| rng.below(30) as usize).collect();
            let shift = 64 - (1 + rng.below(8) as u32);
            // Positions in a few buckets' worth (ties), or anywhere.
            let spread = [4, 1 << 58, u64::MAX][round % 3];
            let at: Vec<u64> = (0..runs.iter().sum::<usize>())
                .map(|_| {
                    let top = rng.below(1 << (64 - shift)) << shift;
                    top | ((rng.next_u64() % spread) & ((1u64 << shift) - 1))
                })
                .collect();
            let (points, index) = order_points(&at, runs.iter().copied(), &ranks, shift);
            let mut want: Vec<(u64, u32, u32)> = Vec::new();
            let mut k = 0;
            for (owner, &len) in runs.iter().enumerate() {
                for &h in &at[k..k + len] {
                    want.push((h, ranks[owner], owner as u32));
                }
                k += len;
            }
            want.sort_unstable();
            let got: Vec<(u64, u32, u32)> = points.iter().map(|p| (p.at, ranks[p.owner as usize], p.owner)).collect();
            assert_eq!(got, want, "round {round}");
            assert_eq!(index.len(), (1 << (64 - shift)) + 1);
            for (b, w) in index.windows(2).enumerate() {
                assert!(w[0] <= w[1], "round {round}: bucket {b}");
                for p in &points[w[0] as usize..w[1] as usize] {
                    assert_eq!((p.at >> shift) as usize, b, "round {round}: a point in bucket {b}");
                }
            }
            assert_eq!(*index.last().unwrap_or(&0) as usize, points.len());
            assert_eq!(index[0], 0);
        }
    }

    #[test]
    fn labels_count_up_in_decimal() {
        let check = |d: Decimal, v: u64| {
            let (ascii, digits) = d.ascii();
            assert_eq!(&ascii.to_le_bytes()[..digits], v.to_string().as_bytes(), "{v}");
        };
        let mut d = Decimal::default();
        for v in 0..=123_456u64 {
            check(d, v);
            d.increment();
        }
        // Across every carry into a new digit that a node's labels can reach (fewer than 10^8).
        for k in 1..=7u32 {
            let from = 10u64.pow(k) - 3;
            let mut d = Decimal::default();
            for v in 0..from {
                if v % 10_000_000 == 0 {
                    check(d, v);
                }
                d.increment();
            }
            for v in from..from + 6 {
                check(d, v);
                d.increment();
            }
        }
        let mut labels = Labels::default();
        for name in ["n", "", "a-longer-name:11211"] {
            labels.start(name.as_bytes());
            let mut v = 0;
            for left in [5, 1, 40, 33, 2000] {
                let n = labels.fill(left);
                assert_eq!(n, left.min(32) as usize);
                for label in labels.iter(n) {
                    assert_eq!(label, format!("{name}#{v}").as_bytes());
                    v += 1;
                }
            }
        }
    }

    #[test]
    fn lookup_matches_a_sorted_list_and_binary_search() {
        let mut rng = SplitMix64::new(5);
        for round in 0..40 {
            let n = 1 + rng.below(20) as usize;
            let spec: Vec<String> = (0..n).map(|i| format!("n{i}:weight={}", rng.below(3))).collect();
            let set = NodeSet::parse(&spec.join(",")).expect("valid");
            let scheme = if round % 2 == 0 { RingScheme::Xxh3 } else { RingScheme::JavaMd5 };
            let ring = HashRing::builder().vnodes(1 + rng.below(50) as u32).scheme(scheme).build(set).expect("ok");
            for _ in 0..500 {
                let h = rng.next_u64();
                assert_eq!(ring.pick_hash(h), naive_pick(&ring, h));
            }
            // Exactly on points, and just after them.
            for p in ring.points.iter().take(50).map(|p| p.at) {
                assert_eq!(ring.pick_hash(p), naive_pick(&ring, p));
                assert_eq!(ring.pick_hash(p.wrapping_add(1)), naive_pick(&ring, p.wrapping_add(1)));
            }
        }
    }

    #[test]
    fn tiny_rings_do_not_panic() {
        let ring = HashRing::builder().vnodes(1).build(NodeSet::parse("a").expect("valid")).expect("ok");
        for h in [0, 1, u64::MAX, 1 << 63] {
            assert_eq!(ring.pick_hash(h), Some(0));
        }
        assert_eq!(ring.ranked_hash(7).collect::<Vec<_>>(), vec![0]);
        let empty = HashRing::new(NodeSet::try_new([]).expect("valid")).expect("ok");
        assert_eq!(empty.pick_hash(3), None);
        assert_eq!(empty.ranked_hash(3).count(), 0);
    }

    #[test]
    fn limits_are_errors() {
        let set = NodeSet::parse("a:weight=4000000000").expect("valid");
        let err = HashRing::new(set).expect_err("too large");
        assert_eq!(err.kind(), ErrorKind::TooLarge);
        let err = HashRing::builder().vnodes(0).build(NodeSet::parse("a").expect("valid")).expect_err("zero");
        assert_eq!(err.kind(), ErrorKind::InvalidParameter);
    }

    #[test]
    fn shares_are_each_nodes_arcs() {
        // Independently of the ring's arrays: rebuild the sorted point list the naive way, give
        // each point the arc (previous point, point] (the first point also the wrap-around arc),
        // in exact integers, and check that the ring's lookups at both ends of every arc name the
        // point's node, and that each node's share is the sum of its arcs.
        let mut rng = SplitMix64::new(0x5a5e);
        for round in 0..30 {
            let n = 1 + rng.below(12) as usize;
            let spec: Vec<String> = (0..n).map(|i| format!("s{i}-{}:weight={}", rng.below(99), rng.below(4))).collect();
            let set = NodeSet::parse(&spec.join(",")).expect("unique names");
            let scheme = if round % 2 == 0 { RingScheme::Xxh3 } else { RingScheme::JavaMd5 };
            let vnodes = 1 + rng.below(40) as u32;
            let ring = HashRing::builder().vnodes(vnodes).scheme(scheme).build(set.clone()).expect("ok");
            let mut pts: Vec<(u64, u32, usize)> = Vec::new();
            for (i, node) in set.nodes().iter().enumerate() {
                for v in 0..u64::from(vnodes) * u64::from(node.weight()) {
                    let label = format!("{}#{v}", node.name());
                    pts.push((point_hash(scheme, label.as_bytes()), set.name_ranks()[i], i));
                }
            }
            pts.sort();
            let mut arcs = vec![0u128; n];
            for (k, &(p, _, owner)) in pts.iter().enumerate() {
                let prev = if k == 0 { pts[pts.len() - 1].0 } else { pts[k - 1].0 };
                let arc = if k == 0 { (1u128 << 64) - u128::from(prev) + u128::from(p) } else { u128::from(p - prev) };
                if arc > 0 {
                    assert_eq!(ring.pick_hash(p), Some(owner), "round {round}: at point {k}");
                    assert_eq!(ring.pick_hash(prev.wrapping_add(1)), Some(owner), "round {round}: after point {k}");
                }
                arcs[owner] += arc;
            }
            let shares = ring.shares();
            assert_eq!(shares.len(), n);
            if pts.is_empty() {
                assert!(shares.iter().all(|&s| s == 0.0), "round {round}: an empty ring owns nothing");
                continue;
            }
            assert_eq!(arcs.iter().sum::<u128>(), 1u128 << 64);
            for (i, (&share, &arc)) in shares.iter().zip(&arcs).enumerate() {
                let exact = arc as f64 / 2f64.powi(64);
                assert!((share - exact).abs() <= 1e-12, "round {round}: node {i} share {share}, its arcs {exact}");
            }
        }
    }
}

//! Rendezvous hashing (highest random weight), weighted by the logarithmic method.
//!
//! # The algorithm
//!
//! For a key, score every live node with a hash of the pair (key, node) and give the key to the
//! node with the highest score (Thaler and Ravishankar, *Using name-based mappings to increase hit
//! rates*, IEEE/ACM ToN 1998). Sorting the nodes by score gives the key's **ranked list**: the
//! owner, then the runner-up that takes over when the owner is down, then the next, and the first
//! `k` are where a key with `k` replicas lives.
//!
//! # Guarantees
//!
//! - **Minimal movement.** A score depends only on the key and the node, so adding a node moves only
//!   the keys it now wins (to it), and removing a node moves only its own keys (each to its
//!   runner-up). Changing one node's weight moves keys only to or from that node.
//! - **Balance without virtual nodes.** Each node gets a fresh independent score per key, so each of
//!   `n` equal nodes owns `1/n` of the keys up to binomial noise: over 1M keys on 10 nodes the
//!   busiest node holds 1.004x the mean (`keyroute sim balance -s rendezvous`; the tests bound it
//!   at 1.018, six binomial standard deviations, and every node's count within six of its exact share).
//! - **Weights.** With weights, node `i`'s score is `w_i / -ln(u_i)`, where `u_i` in (0, 1) is its
//!   uniform hash value; equivalently the key goes to the smallest `-ln(u_i) / w_i`, the first arrival
//!   among independent exponential clocks of rates `w_i`, which node `i` wins with probability
//!   exactly `w_i / sum(w)` (Schindelhauer and Schomaker 2005; Resch, *Weighted rendezvous hashing*).
//!   Unlike weighted rings, a weight change does not disturb the other nodes' shares.
//!
//! # Cost
//!
//! A pick scores every live node: `O(n)`, in one pass of explicit vector code where the CPU has
//! AVX-512 (eight nodes a step) or AVX2 (four), a scalar loop elsewhere; the node seeds are hashed
//! once at build. `ranked` finds the key's first three nodes in that same one pass and each
//! further node with another pass, lazily and with no allocation. With several weights, a pick is
//! one AVX-512 pass over all groups (bounds on the clocks, exact only when they are close), and a
//! ranking one pass per group. The environment variable `KEYROUTE_SIMD=scalar` or `avx2` keeps a
//! process to the lower kernel (all give the same answers). Build is `O(n log n)`. Figures:
//! BENCHMARKS.md. For thousands of nodes, prefer
//! [`HashRing`](crate::HashRing) (`O(1)` lookups through its bucket index) or
//! [`Maglev`](crate::Maglev).
//!
//! # When to choose it
//!
//! The default for cache-affine fleets of up to a few hundred nodes: the best balance of the hashing
//! strategies, minimal movement, weights that behave, and a ranked list for failover and replicas.
//!
//! # The exact definition (part of the placement contract)
//!
//! Live nodes are grouped by weight. Within a group, nodes are ordered by the integer score
//! [`hash::score`]`(key_hash, node_seed)`, highest first, ties by name. Across
//! groups, the candidates are compared by `-ln(u) x (1/w)`, smallest first, where
//! `u = ((score >> 11) + 0.5) / 2^53` and `ln` is keyroute's portable logarithm; ties by higher
//! score, then by name. With
//! one weight this is simply "highest score wins", and no floating point is involved.

use crate::hash::{self, KeyHasher, ln_portable};
use crate::{NodeSet, Placement, Ranking};

/// A rendezvous (highest random weight) table. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, Placement, Ranking, Rendezvous};
/// let table = Rendezvous::new(NodeSet::parse("a,b,c")?);
/// let owner = table.pick(b"cat.jpg").map(|n| n.name());
/// let ranked: Vec<&str> = table.ranked(b"cat.jpg").map(|i| table.nodes().nodes()[i].name()).collect();
/// assert_eq!(ranked.len(), 3);
/// assert_eq!(Some(ranked[0]), owner);
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Rendezvous {
    nodes: NodeSet,
    hasher: KeyHasher,
    // Live nodes only, grouped by weight (heaviest group first), structure of arrays.
    seeds: Box<[u64]>,
    // The seeds folded by `kernel::fold`, for the vector passes.
    mixed: Box<[u64]>,
    // Each live node's `(1 - 1e-9) / weight / 2^32` and `1 / weight`, for the one-pass weighted
    // pick (both empty with one weight).
    slow: Box<[f64]>,
    inv_weights: Box<[f64]>,
    index: Box<[u32]>,
    rank: Box<[u32]>,
    groups: Box<[Group]>,
    simd: kernel::Level,
}

#[derive(Clone, Copy, Debug)]
struct Group {
    start: u32,
    end: u32,
    inv_weight: f64,
}

/// A candidate's position in the ranking order: score (higher first), then name rank (lower first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cand {
    score: u64,
    rank: u32,
    pos: u32,
}

impl Cand {
    const NONE: Cand = Cand { score: 0, rank: 0, pos: 0 };

    /// Whether `self` comes before `other` within a weight group.
    #[inline(always)]
    fn before(&self, other: &Cand) -> bool {
        self.score > other.score || (self.score == other.score && self.rank < other.rank)
    }
}

impl Rendezvous {
    /// Builds the table with the default key hash.
    pub fn new(nodes: NodeSet) -> Self {
        Self::with_hasher(nodes, KeyHasher::default())
    }

    /// Builds the table with the given key hash.
    pub fn with_hasher(nodes: NodeSet, hasher: KeyHasher) -> Self {
        let mut live: Vec<u32> = nodes.live().to_vec();
        let all = nodes.nodes();
        // Heaviest group first; within a group, input order (it does not affect results).
        live.sort_by_key(|&i| std::cmp::Reverse(all[i as usize].weight()));
        let seeds: Box<[u64]> = live.iter().map(|&i| nodes.seeds()[i as usize]).collect();
        let mixed = seeds.iter().map(|&s| kernel::fold(s)).collect();
        let rank = live.iter().map(|&i| nodes.name_ranks()[i as usize]).collect();
        let mut groups = Vec::new();
        let mut start = 0usize;
        while start < live.len() {
            let w = all[live[start] as usize].weight();
            let mut end = start + 1;
            while end < live.len() && all[live[end] as usize].weight() == w {
                end += 1;
            }
            groups.push(Group { start: start as u32, end: end as u32, inv_weight: 1.0 / f64::from(w) });
            start = end;
        }
        let per_node = |f: fn(f64) -> f64| -> Box<[f64]> {
            if groups.len() > 1 {
                groups.iter().flat_map(|g| (g.start..g.end).map(move |_| f(g.inv_weight))).collect()
            } else {
                Box::default()
            }
        };
        // The 2^-32 turns the top half of a score into a fraction (a power of two: exact).
        let slow = per_node(|w| w * (1.0 - 1e-9) / 4_294_967_296.0);
        let inv_weights = per_node(|w| w);
        Rendezvous {
            nodes,
            hasher,
            seeds,
            mixed,
            slow,
            inv_weights,
            index: live.into(),
            rank,
            groups: groups.into(),
            simd: kernel::Level::detect(),
        }
    }

    /// The number of live nodes.
    pub fn live_count(&self) -> usize {
        self.seeds.len()
    }

    /// The positions of the best `K` candidates of group `g` (fewer if it has fewer), best first;
    /// `L` is `K + 1`.
    #[inline]
    fn group_top<const K: usize, const L: usize>(&self, h: u64, g: &Group, out: &mut [u32; K]) -> usize {
        const { assert!(L == K + 1) };
        let (start, end) = (g.start as usize, g.end as usize);
        let k = K.min(end - start);
        #[cfg(target_arch = "x86_64")]
        if end - start >= VECTOR_MIN {
            let (hx, mixed) = (kernel::fold(h), &self.mixed[start..end]);
            let mut packed = [0u64; L];
            let found = match self.simd {
                // SAFETY: `Level::detect` chose Avx512 only after checking the CPU's features.
                kernel::Level::Avx512 => unsafe { kernel::avx512::top(hx, mixed, g.start, &mut packed) },
                // SAFETY: `Level::detect` chose Avx2 only after checking the CPU's features.
                kernel::Level::Avx2 => unsafe { kernel::avx2::top(hx, mixed, g.start, &mut packed) },
                kernel::Level::Scalar => false,
            };
            if found {
                for (o, &v) in out.iter_mut().zip(&packed[..k]) {
                    *o = v as u32;
                }
                return k;
            }
        }
        let (seeds, ranks) = (&self.seeds[start..end], &self.rank[start..end]);
        if K == 1 {
            // A pick: the branch-free loop (no insertion into a list).
            return kernel::best_scalar(h, seeds, ranks, None).map_or(0, |(_, _, at)| {
                out[0] = (start + at) as u32;
                1
            });
        }
        let mut found = [(0u64, 0u32, 0usize); K];
        let k = kernel::top_scalar(h, seeds, ranks, &mut found);
        for (o, &(_, _, at)) in out.iter_mut().zip(&found[..k]) {
            *o = (start + at) as u32;
        }
        k
    }

    /// The candidate at position `p`.
    #[inline]
    fn cand(&self, h: u64, p: u32) -> Cand {
        Cand { score: hash::score(h, self.seeds[p as usize]), rank: self.rank[p as usize], pos: p }
    }

    /// The first `K` positions of the key's ranking (fewer if there are fewer live nodes): one
    /// best-`K` pass per weight group, then the groups' lists merged by their exponential clocks; a
    /// weighted pick (`K = 1`) first tries one AVX-512 pass over every group.
    #[inline]
    fn head<const K: usize, const L: usize>(&self, h: u64, out: &mut [u32; K]) -> usize {
        match &*self.groups {
            [] => 0,
            [g] => self.group_top::<K, L>(h, g, out),
            groups if K == 1 => {
                // A pick, in one pass over all groups where the CPU allows, when the earliest
                // clock's lead over every other node's lower bound decides it.
                #[cfg(target_arch = "x86_64")]
                if self.simd == kernel::Level::Avx512 {
                    let mut two = [0u64; 2];
                    // SAFETY: `Level::detect` chose Avx512 only after checking the CPU's features;
                    // `slow` is as long as `mixed` with several groups, and there are live nodes.
                    unsafe { kernel::avx512::earliest(kernel::fold(h), &self.mixed, &self.slow, &mut two) };
                    let p = two[0] as u32;
                    let c = Clock::new(self.cand(h, p), self.inv_weights[p as usize]);
                    let decided = c.hi < f64::from_bits(two[1] & 0xffff_ffff_0000_0000);
                    #[cfg(test)]
                    tests::ONE_PASS.with(|n| {
                        let (answered, handed) = n.get();
                        n.set(if decided { (answered + 1, handed) } else { (answered, handed + 1) });
                    });
                    if decided {
                        out[0] = p;
                        return 1;
                    }
                }
                // The earliest of the groups' winners (every group has a live node).
                let mut first = Clock::NONE;
                for (gi, g) in groups.iter().enumerate() {
                    let mut p = [0u32; K];
                    if self.group_top::<K, L>(h, g, &mut p) > 0 {
                        let c = Clock::new(self.cand(h, p[0]), g.inv_weight);
                        let take = gi == 0 || c.before(&first);
                        first = Clock::select(take, c, first);
                    }
                }
                out[0] = first.cand.pos;
                1
            }
            groups if groups.len() <= MERGED_GROUPS => {
                let mut cands = [[0u32; K]; MERGED_GROUPS];
                let mut lens = [0usize; MERGED_GROUPS];
                let mut used = [0usize; MERGED_GROUPS];
                let mut heads = [Clock::NONE; MERGED_GROUPS];
                for (gi, g) in groups.iter().enumerate() {
                    lens[gi] = self.group_top::<K, L>(h, g, &mut cands[gi]);
                    if lens[gi] > 0 {
                        heads[gi] = Clock::new(self.cand(h, cands[gi][0]), g.inv_weight);
                    }
                }
                let mut n = 0;
                while n < K {
                    // The earliest head among the groups with one left (a group that gave all its
                    // `K` cannot be needed again).
                    let mut first: Option<usize> = None;
                    for gi in (0..groups.len()).filter(|&gi| used[gi] < lens[gi]) {
                        if first.is_none_or(|b| heads[gi].before(&heads[b])) {
                            first = Some(gi);
                        }
                    }
                    let Some(b) = first else { break };
                    out[n] = cands[b][used[b]];
                    n += 1;
                    used[b] += 1;
                    if used[b] < lens[b] {
                        heads[b] = Clock::new(self.cand(h, cands[b][used[b]]), groups[b].inv_weight);
                    }
                }
                n
            }
            _ => {
                // Many weights: one exact pass per position.
                let mut taken = Taken::default();
                while taken.len() < K {
                    let Some(p) = self.next_after(h, taken.as_slice()) else { break };
                    out[taken.len()] = p;
                    taken.push(p);
                }
                taken.len()
            }
        }
    }

    /// The best candidate of group `g` strictly after `floor` in group order.
    #[inline]
    fn group_best(&self, h: u64, g: &Group, floor: Option<Cand>) -> Option<Cand> {
        let (start, end) = (g.start as usize, g.end as usize);
        let seeds = &self.seeds[start..end];
        // The vector pass has a fixed cost of a few dozen cycles; below 16 nodes the scalar loop
        // is faster (measured: see BENCHMARKS.md).
        #[cfg(target_arch = "x86_64")]
        if self.simd == kernel::Level::Avx512 && seeds.len() >= 16 {
            let fast = match floor {
                // SAFETY: `Level::detect` chose Avx512 only after checking the CPU's features.
                None => unsafe { kernel::avx512::best_below::<false>(h, seeds, u64::MAX, false) },
                // SAFETY: as above.
                Some(f) => unsafe { kernel::avx512::best_below::<true>(h, seeds, f.score, true) },
            };
            match fast {
                kernel::Fast::Nothing => return None,
                kernel::Fast::Best { score, at } => {
                    return Some(Cand { score, rank: self.rank[start + at], pos: (start + at) as u32 });
                }
                // Equal scores somewhere: the exact scalar pass below settles them.
                kernel::Fast::Ambiguous => {}
            }
        }
        kernel::best_scalar(h, seeds, &self.rank[start..end], floor.map(|f| (f.score, f.rank)))
            .map(|(score, rank, at)| Cand { score, rank, pos: (start + at) as u32 })
    }

    /// The next position in the key's ranking after the positions in `taken` (all earlier in it).
    fn next_after(&self, h: u64, taken: &[u32]) -> Option<u32> {
        let score_of = |p: usize| hash::score(h, self.seeds[p]);
        let mut best: Option<Clock> = None;
        for g in self.groups.iter() {
            // The group's floor is its last member taken (members are taken in group order).
            let floor = taken
                .iter()
                .filter(|&&p| (g.start..g.end).contains(&p))
                .map(|&p| Cand { score: score_of(p as usize), rank: self.rank[p as usize], pos: p })
                .reduce(|a, b| if a.before(&b) { b } else { a });
            let Some(c) = self.group_best(h, g, floor) else { continue };
            if self.groups.len() == 1 {
                return Some(c.pos);
            }
            let clock = Clock::new(c, g.inv_weight);
            if best.as_ref().is_none_or(|b| clock.before(b)) {
                best = Some(clock);
            }
        }
        best.map(|b| b.cand.pos)
    }
}

/// A group winner's exponential clock `-ln(u) / w`, bounded cheaply and computed exactly only when
/// the bounds cannot decide a comparison: with `t = 1 - u`, `t <= -ln(u) <= t / u` (and `t + t^2`
/// for `t <= 1/2`), and winners have `u` close to 1, where the bounds are tight. Picks rarely
/// compute a logarithm at all.
#[derive(Clone, Copy, Debug)]
struct Clock {
    cand: Cand,
    inv_weight: f64,
    lo: f64,
    hi: f64,
}

impl Clock {
    const NONE: Clock = Clock { cand: Cand::NONE, inv_weight: 0.0, lo: 0.0, hi: 0.0 };

    #[inline]
    fn new(cand: Cand, inv_weight: f64) -> Self {
        let u = unit(cand.score);
        let t = 1.0 - u;
        // `-ln(1 - t) = t + t^2/2 + t^3/3 + ...`, at most `t + t^2` for `t <= 1/2` (the tail after
        // `t^2/2` is below `t^3 / (3 (1 - t))`): no division for the winners, whose `u` is near 1.
        let upper = if t <= 0.5 { t + t * t } else { t / u };
        // Margins far above the rounding error of these few operations and of `ln_portable`.
        Clock { cand, inv_weight, lo: t * inv_weight * (1.0 - 1e-9), hi: upper * inv_weight * (1.0 + 1e-9) }
    }

    /// `a` if `take`, else `b`, field by field (conditional moves rather than a branch).
    #[inline(always)]
    fn select(take: bool, a: Clock, b: Clock) -> Clock {
        let pick_u64 = |x: u64, y: u64| if take { x } else { y };
        let pick_f64 = |x: f64, y: f64| f64::from_bits(pick_u64(x.to_bits(), y.to_bits()));
        Clock {
            cand: Cand {
                score: pick_u64(a.cand.score, b.cand.score),
                rank: pick_u64(a.cand.rank.into(), b.cand.rank.into()) as u32,
                pos: pick_u64(a.cand.pos.into(), b.cand.pos.into()) as u32,
            },
            inv_weight: pick_f64(a.inv_weight, b.inv_weight),
            lo: pick_f64(a.lo, b.lo),
            hi: pick_f64(a.hi, b.hi),
        }
    }

    fn exact(&self) -> f64 {
        exp_key(self.cand.score) * self.inv_weight
    }

    /// Whether this clock rings first: a smaller key, or on a tie a higher score, then a smaller name.
    ///
    /// Which one rings first is data, not a pattern a branch predictor could learn: the bounds are
    /// compared without branching, and only the rare overlap of the bounds branches.
    #[inline]
    fn before(&self, other: &Clock) -> bool {
        let (earlier, later) = (self.hi < other.lo, other.hi < self.lo);
        if earlier | later {
            return earlier;
        }
        self.before_exactly(other)
    }

    #[cold]
    fn before_exactly(&self, other: &Clock) -> bool {
        let (a, b) = (self.exact(), other.exact());
        a < b || (a == b && self.cand.before(&other.cand))
    }
}

/// `-ln(u)` for the uniform value of a score: the exponential clock of the logarithmic method.
#[inline]
fn exp_key(score: u64) -> f64 {
    -ln_portable(unit(score))
}

#[inline(always)]
fn unit(score: u64) -> f64 {
    ((score >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
}

impl Placement for Rendezvous {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    #[inline]
    fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    #[inline]
    fn pick_hash(&self, hash: u64) -> Option<usize> {
        let mut first = [0u32; 1];
        (self.head::<1, 2>(hash, &mut first) == 1).then(|| self.index[first[0] as usize] as usize)
    }
}

/// The lazy ranked list of a key on a [`Rendezvous`] table: distinct nodes, best first.
///
/// The first three nodes come from one pass over the scores, each further one from another pass
/// (no sort); positions already yielded are held inline, so there is no allocation for the first 8.
#[derive(Clone, Debug)]
pub struct RendezvousRanked<'a> {
    table: &'a Rendezvous,
    hash: u64,
    taken: Taken,
    skip: Option<u32>,
    // The ranking's first positions, found in one pass when the first is asked for.
    head: [u32; HEAD],
    head_len: Option<u8>,
}

/// How many positions of a ranking the first pass finds: three covers a pick with two replicas, or
/// a pick and two failovers.
const HEAD: usize = 3;

/// Above this many weight groups, rankings are found one exact pass per position.
const MERGED_GROUPS: usize = 8;

/// The smallest group the vector passes are used for: from four nodes on they are faster than the
/// scalar loop (measured with `examples/placement_loop.rs` of keyroute-bench; see BENCHMARKS.md).
const VECTOR_MIN: usize = 4;

impl RendezvousRanked<'_> {
    fn next_position(&mut self) -> Option<u32> {
        let i = self.taken.len();
        if i >= self.table.seeds.len() {
            return None;
        }
        let head_len = *self
            .head_len
            .get_or_insert_with(|| self.table.head::<HEAD, { HEAD + 1 }>(self.hash, &mut self.head) as u8);
        let p = match self.head.get(i) {
            Some(&p) if i < usize::from(head_len) => p,
            _ => self.table.next_after(self.hash, self.taken.as_slice())?,
        };
        self.taken.push(p);
        Some(p)
    }
}

impl Iterator for RendezvousRanked<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        loop {
            let p = self.next_position()?;
            let node = self.table.index[p as usize];
            if Some(node) != self.skip {
                return Some(node as usize);
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.table.seeds.len() - self.taken.len();
        (left.saturating_sub(usize::from(self.skip.is_some())), Some(left))
    }
}

impl Ranking for Rendezvous {
    type Ranked<'a> = RendezvousRanked<'a>;

    fn ranked_hash(&self, hash: u64) -> RendezvousRanked<'_> {
        self.ranked_inner(hash, None)
    }
}

impl Rendezvous {
    fn ranked_inner(&self, hash: u64, skip: Option<u32>) -> RendezvousRanked<'_> {
        RendezvousRanked { table: self, hash, taken: Taken::default(), skip, head: [0; HEAD], head_len: None }
    }

    /// The rendezvous ranking of a key with one node left out: the fallback ranking that strategies
    /// without a ranking of their own use after their pick (see [`Fallback`]).
    pub(crate) fn ranked_without(&self, hash: u64, skip: usize) -> RendezvousRanked<'_> {
        self.ranked_inner(hash, u32::try_from(skip).ok())
    }
}

/// A ranking for strategies that have none of their own ([`Modulo`](crate::Modulo),
/// [`JumpHash`](crate::JumpHash), [`Maglev`](crate::Maglev), [`SlotTable`](crate::SlotTable)):
/// their pick first, then the other live nodes in the key's weighted rendezvous order.
///
/// Failing over along this list moves only the failed node's keys, and spreads them over the
/// remaining nodes in proportion to weight.
#[derive(Clone, Debug)]
pub struct Fallback<'a> {
    first: Option<usize>,
    rest: Option<RendezvousRanked<'a>>,
}

impl<'a> Fallback<'a> {
    pub(crate) fn new(first: Option<usize>, hrw: &'a Rendezvous, hash: u64) -> Self {
        Fallback { first, rest: first.map(|f| hrw.ranked_without(hash, f)) }
    }
}

impl Iterator for Fallback<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if let Some(f) = self.first.take() {
            return Some(f);
        }
        self.rest.as_mut()?.next()
    }
}

/// A small set of positions, inline up to 8.
#[derive(Clone, Debug, Default)]
struct Taken {
    inline: [u32; 8],
    len: usize,
    spill: Vec<u32>,
}

impl Taken {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, p: u32) {
        if self.len < self.inline.len() {
            self.inline[self.len] = p;
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline);
            }
            self.spill.push(p);
        }
        self.len += 1;
    }

    fn as_slice(&self) -> &[u32] {
        if self.len <= self.inline.len() { &self.inline[..self.len] } else { &self.spill }
    }
}

mod kernel;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::Node;
    use crate::hash::{RandomSource, SplitMix64};

    /// The naive definition: score every node, sort by the contract's order.
    fn naive_ranking(t: &Rendezvous, h: u64) -> Vec<usize> {
        let set = t.nodes();
        let mut live: Vec<usize> = set.live().iter().map(|&i| i as usize).collect();
        let single = {
            let w: Vec<u32> = live.iter().map(|&i| set.nodes()[i].weight()).collect();
            w.windows(2).all(|p| p[0] == p[1])
        };
        // Per-group orders, then a merge by the cross-group key.
        let mut groups: std::collections::BTreeMap<std::cmp::Reverse<u32>, Vec<usize>> = Default::default();
        for &i in &live {
            groups.entry(std::cmp::Reverse(set.nodes()[i].weight())).or_default().push(i);
        }
        for g in groups.values_mut() {
            g.sort_by(|&a, &b| {
                let (sa, sb) = (hash::score(h, set.seeds()[a]), hash::score(h, set.seeds()[b]));
                sb.cmp(&sa).then(set.name_ranks()[a].cmp(&set.name_ranks()[b]))
            });
        }
        if single {
            return groups.into_values().next().unwrap_or_default();
        }
        let mut heads: Vec<std::collections::VecDeque<usize>> = groups.into_values().map(Into::into).collect();
        live.clear();
        loop {
            let mut best: Option<(f64, u64, u32, usize)> = None;
            for (gi, q) in heads.iter().enumerate() {
                if let Some(&i) = q.front() {
                    let s = hash::score(h, set.seeds()[i]);
                    let k = exp_key(s) * (1.0 / f64::from(set.nodes()[i].weight()));
                    let r = set.name_ranks()[i];
                    let better = match best {
                        None => true,
                        Some((bk, bs, br, _)) => k < bk || (k == bk && (s > bs || (s == bs && r < br))),
                    };
                    if better {
                        best = Some((k, s, r, gi));
                    }
                }
            }
            let Some((_, _, _, gi)) = best else { break };
            if let Some(i) = heads[gi].pop_front() {
                live.push(i);
            }
        }
        live
    }

    fn random_set(rng: &mut SplitMix64, n: usize, weighted: bool) -> NodeSet {
        NodeSet::try_new((0..n).map(|i| {
            let w = if weighted { rng.below(4) as u32 } else { 1 };
            Node::new_unchecked(&format!("node-{i}-{}", rng.below(1000))).with_weight(w)
        }))
        .expect("unique names")
    }

    /// The table with each selection loop this CPU can run: scalar, and the vector ones it has.
    fn at_every_level(t: &Rendezvous) -> Vec<Rendezvous> {
        kernel::Level::available().into_iter().map(|simd| Rendezvous { simd, ..t.clone() }).collect()
    }

    /// Overwrites the live nodes' seeds (and the folded copies the vector passes read).
    fn set_seeds(t: &mut Rendezvous, seeds: Vec<u64>) {
        t.mixed = seeds.iter().map(|&s| kernel::fold(s)).collect();
        t.seeds = seeds.into();
    }

    #[test]
    fn ranking_matches_the_naive_definition() {
        let mut rng = SplitMix64::new(11);
        for round in 0..240 {
            let n = 1 + rng.below(150) as usize;
            // Every third weighted round has up to 12 distinct weights: more groups than the
            // merged head handles, beside the common few.
            let set = match round % 3 {
                0 => random_set(&mut rng, n, false),
                1 => random_set(&mut rng, n, true),
                _ => NodeSet::try_new((0..n).map(|i| {
                    Node::new_unchecked(&format!("w-{i}-{}", rng.below(1000))).with_weight(1 + rng.below(12) as u32)
                }))
                .expect("unique names"),
            };
            for t in at_every_level(&Rendezvous::new(set)) {
                for _ in 0..20 {
                    let h = rng.next_u64();
                    let got: Vec<usize> = t.ranked_hash(h).collect();
                    assert_eq!(got, naive_ranking(&t, h), "n={n} round={round} level={:?}", t.simd);
                    assert_eq!(t.pick_hash(h), got.first().copied());
                    // A ranking cut short and resumed is the same ranking (the head, then passes).
                    let first: Vec<usize> = t.ranked_hash(h).take(2).collect();
                    assert_eq!(first[..], got[..got.len().min(2)]);
                }
            }
        }
    }

    thread_local! {
        /// The one-pass weighted pick on this thread: (answered, handed to the exact passes).
        pub(super) static ONE_PASS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }

    #[test]
    fn weighted_picks_agree_at_every_level() {
        // The one-pass weighted pick (bounds on the clocks, AVX-512) against the exact group passes
        // of the scalar level, on many keys; on every other table a tie for first place is forced
        // (the winner's seed given to another node of its weight: the same clock), which the
        // one pass cannot order and must hand over, the exact passes breaking it by name.
        let mut rng = SplitMix64::new(31);
        let (mut answered, mut handed, mut ties) = (0u64, 0u64, 0u64);
        for round in 0..120 {
            let n = 2 + rng.below(120) as usize;
            let set = NodeSet::try_new((0..n).map(|i| {
                Node::new_unchecked(&format!("p-{i}-{}", rng.below(1000))).with_weight(1 + rng.below(6) as u32)
            }))
            .expect("unique names");
            let base = Rendezvous::new(set);
            for _ in 0..500 {
                let h = rng.next_u64();
                let mut table = base.clone();
                let mut tied = false;
                if round % 2 == 1 {
                    let winner = base.pick_hash(h).expect("live nodes");
                    let p = base.index.iter().position(|&i| i as usize == winner).expect("a position");
                    let g = base.groups.iter().find(|g| (g.start..g.end).contains(&(p as u32))).expect("a group");
                    if g.end - g.start > 1 {
                        let q = g.start as usize + (p - g.start as usize + 1) % (g.end - g.start) as usize;
                        let mut seeds = base.seeds.to_vec();
                        seeds[q] = seeds[p];
                        set_seeds(&mut table, seeds);
                        tied = base.groups.len() > 1;
                    }
                }
                let tables = at_every_level(&table);
                let exact = tables[0].pick_hash(h);
                for t in &tables[1..] {
                    let before = ONE_PASS.with(std::cell::Cell::get);
                    assert_eq!(t.pick_hash(h), exact, "n={n} level={:?} hash={h} tied={tied}", t.simd);
                    let after = ONE_PASS.with(std::cell::Cell::get);
                    let (a, f) = (after.0 - before.0, after.1 - before.1);
                    #[cfg(target_arch = "x86_64")]
                    if t.simd == kernel::Level::Avx512 && base.groups.len() > 1 {
                        assert_eq!(a + f, 1, "one one-pass pick per weighted pick");
                        assert!(!(tied && a == 1), "a tie for first answered by the one pass: n={n} hash={h}");
                        ties += u64::from(tied);
                    }
                    answered += a;
                    handed += f;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if kernel::Level::available().contains(&kernel::Level::Avx512) {
            // Most untied picks are answered in one pass; every forced tie was handed over.
            assert!(
                answered > 20_000 && handed >= ties && ties > 5_000,
                "{answered} answered, {handed} handed, {ties} ties"
            );
            eprintln!("the one-pass weighted pick answered {answered}, handed over {handed} ({ties} forced ties)");
            return;
        }
        kernel::Level::skip("weighted_picks_agree_at_every_level", "avx512", "this CPU has no AVX-512 one-pass pick");
    }

    #[test]
    fn equal_scores_are_broken_by_name() {
        // Two nodes whose seeds collide cannot be built from names, so test the group scan directly
        // with a table whose seeds are overwritten.
        let mut t = Rendezvous::new(NodeSet::parse("b,a,c,e,d").expect("valid"));
        set_seeds(&mut t, vec![5; 5]);
        for t in at_every_level(&t) {
            let order: Vec<&str> = t.ranked_hash(0).map(|i| t.nodes().nodes()[i].name()).collect();
            assert_eq!(order, ["a", "b", "c", "d", "e"], "{:?}", t.simd);
        }
    }

    #[test]
    fn equal_scores_in_a_large_ranking_are_broken_by_name() {
        // 20 nodes (the vector and cached-score paths), half of them sharing one seed.
        let names: Vec<String> = (0..20).map(|i| format!("n{i:02}")).collect();
        let mut t = Rendezvous::new(NodeSet::parse(&names.join(",")).expect("valid"));
        let mut seeds = t.seeds.to_vec();
        for s in seeds.iter_mut().step_by(2) {
            *s = 42;
        }
        set_seeds(&mut t, seeds);
        for (t, h) in at_every_level(&t).iter().flat_map(|t| [0u64, 1, 42, u64::MAX, 0x9e37_79b9].map(|h| (t, h))) {
            // The definition over the table's (overwritten) seeds: score, then name.
            let mut expected: Vec<usize> = (0..t.seeds.len()).collect();
            expected.sort_by(|&a, &b| {
                hash::score(h, t.seeds[b]).cmp(&hash::score(h, t.seeds[a])).then(t.rank[a].cmp(&t.rank[b]))
            });
            let expected: Vec<usize> = expected.into_iter().map(|p| t.index[p] as usize).collect();
            let got: Vec<usize> = t.ranked_hash(h).collect();
            assert_eq!(got, expected, "hash {h}");
            assert_eq!(t.pick_hash(h), got.first().copied());
        }
    }

    #[test]
    fn empty_and_drained_sets_pick_nothing() {
        let t = Rendezvous::new(NodeSet::try_new([]).expect("empty is valid"));
        assert_eq!(t.pick(b"k"), None);
        assert_eq!(t.ranked(b"k").count(), 0);
        let t = Rendezvous::new(NodeSet::parse("a:weight=0,b:weight=0").expect("valid"));
        assert_eq!(t.pick(b"k"), None);
    }
}

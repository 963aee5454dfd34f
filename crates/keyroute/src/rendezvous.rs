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
//! A pick scores every live node: `O(n)`, about half a nanosecond per node here (the node seeds are hashed
//! once at build, and the score loop vectorises). `ranked` yields lazily, each further node costing
//! another pass, with no allocation. Build is `O(n log n)`. For thousands of nodes, prefer
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
        let seeds = live.iter().map(|&i| nodes.seeds()[i as usize]).collect();
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
        Rendezvous {
            nodes,
            hasher,
            seeds,
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
            let mut clock = Clock::new(c, g.inv_weight);
            match &mut best {
                None => best = Some(clock),
                Some(b) => {
                    if clock.before(b) {
                        *b = clock;
                    }
                }
            }
        }
        best.map(|b| b.cand.pos)
    }
}

/// A group winner's exponential clock `-ln(u) / w`, bounded cheaply and computed exactly only when
/// the bounds cannot decide a comparison: with `t = 1 - u`, `t <= -ln(u) <= t / u`, and winners
/// have `u` close to 1, where the bounds are tight. Picks rarely compute a logarithm at all.
#[derive(Clone, Copy, Debug)]
struct Clock {
    cand: Cand,
    inv_weight: f64,
    lo: f64,
    hi: f64,
    exact: Option<f64>,
}

impl Clock {
    fn new(cand: Cand, inv_weight: f64) -> Self {
        let u = unit(cand.score);
        let t = 1.0 - u;
        // Margins far above the rounding error of these few operations and of `ln_portable`.
        Clock {
            cand,
            inv_weight,
            lo: t * inv_weight * (1.0 - 1e-9),
            hi: t / u * inv_weight * (1.0 + 1e-9),
            exact: None,
        }
    }

    fn exact(&mut self) -> f64 {
        *self.exact.get_or_insert_with(|| exp_key(self.cand.score) * self.inv_weight)
    }

    /// Whether this clock rings first: a smaller key, or on a tie a higher score, then a smaller name.
    fn before(&mut self, other: &mut Clock) -> bool {
        if self.hi < other.lo {
            return true;
        }
        if other.hi < self.lo {
            return false;
        }
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
        if let [g] = &*self.groups {
            // One weight: the highest score wins.
            return self.group_best(hash, g, None).map(|c| self.index[c.pos as usize] as usize);
        }
        self.next_after(hash, &[]).map(|p| self.index[p as usize] as usize)
    }
}

/// The lazy ranked list of a key on a [`Rendezvous`] table: distinct nodes, best first.
///
/// Each further node costs one selection pass over the scores (no sort); positions already yielded
/// are held inline, so there is no allocation for the first 8.
#[derive(Clone, Debug)]
pub struct RendezvousRanked<'a> {
    table: &'a Rendezvous,
    hash: u64,
    taken: Taken,
    skip: Option<u32>,
}

impl RendezvousRanked<'_> {
    fn next_position(&mut self) -> Option<u32> {
        if self.taken.len() >= self.table.seeds.len() {
            return None;
        }
        let p = self.table.next_after(self.hash, self.taken.as_slice())?;
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
        RendezvousRanked { table: self, hash, taken: Taken::default(), skip }
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

/// The selection loop: the best score in a range, in one pass, with no buffer. A portable scalar
/// version (the reference), and an AVX-512 version (eight nodes a step) chosen once, when a table
/// is built, if the CPU has it. Both give the same answer; the vector one hands equal scores (a
/// 64-bit coincidence) to the scalar one.
mod kernel {
    use crate::hash::score;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Level {
        Scalar,
        #[cfg(target_arch = "x86_64")]
        Avx512,
    }

    impl Level {
        pub(super) fn detect() -> Level {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
                    return Level::Avx512;
                }
            }
            Level::Scalar
        }
    }

    /// The best `(score, rank, index)` among `seeds` strictly after `floor = (score, rank)` in the
    /// order "higher score, then lower rank".
    ///
    /// Both orders are folded into one 96-bit key, `score << 32 | !rank` (higher is better), so the
    /// loop is two compares and two selects, without unpredictable branches.
    #[inline]
    pub(super) fn best_scalar(
        h: u64,
        seeds: &[u64],
        ranks: &[u32],
        floor: Option<(u64, u32)>,
    ) -> Option<(u64, u32, usize)> {
        let key = |s: u64, r: u32| (u128::from(s) << 32) | u128::from(!r);
        let below = floor.map_or(u128::MAX, |(s, r)| key(s, r));
        let mut best = 0u128; // below every key: `!rank` is never 0 for a rank below u32::MAX
        let mut at = usize::MAX;
        for (j, (&seed, &r)) in seeds.iter().zip(ranks).enumerate() {
            let k = key(score(h, seed), r);
            let take = (k < below) & (k > best);
            best = if take { k } else { best };
            at = if take { j } else { at };
        }
        (at != usize::MAX).then_some(((best >> 32) as u64, !(best as u32), at))
    }

    /// What the vector pass found.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) enum Fast {
        /// No score below the floor.
        Nothing,
        /// The single best score below the floor and its index.
        Best { score: u64, at: usize },
        /// Equal scores were seen; use the scalar pass.
        Ambiguous,
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod avx512 {
        use std::arch::x86_64::*;

        use super::Fast;

        #[inline]
        #[target_feature(enable = "avx512f,avx512dq")]
        fn mix(x: __m512i, m: __m512i) -> __m512i {
            let x = _mm512_xor_si512(x, _mm512_srli_epi64::<32>(x));
            let x = _mm512_mullo_epi64(x, m);
            let x = _mm512_xor_si512(x, _mm512_srli_epi64::<29>(x));
            let x = _mm512_mullo_epi64(x, m);
            _mm512_xor_si512(x, _mm512_srli_epi64::<32>(x))
        }

        /// The highest score strictly below `below` among `seeds`, eight at a time. `floor_here`
        /// says that one seed (the floor's own node) scores exactly `below`; any other score equal
        /// to `below`, any tie for the best, or a best of 0 is reported as ambiguous.
        ///
        /// # Safety
        ///
        /// The CPU must support AVX-512F and AVX-512DQ.
        #[target_feature(enable = "avx512f,avx512dq,popcnt")]
        pub(in super::super) unsafe fn best_below<const FLOOR: bool>(
            h: u64,
            seeds: &[u64],
            below: u64,
            floor_here: bool,
        ) -> Fast {
            let hv = _mm512_set1_epi64(h as i64);
            let mv = _mm512_set1_epi64(crate::hash::MIX_MULTIPLIER as i64);
            let bv = _mm512_set1_epi64(below as i64);
            // Two independent accumulators (even and odd blocks of eight) to shorten the
            // loop-carried dependency; merged at the end, earlier index first on equal scores.
            let mut best = [_mm512_setzero_si512(); 2];
            let mut best_idx = [_mm512_set1_epi64(-1); 2];
            let mut tie: __mmask8 = 0;
            let mut at_floor = 0u32;
            let mut step = |block: usize, live: __mmask8, x: __m512i, k: usize| {
                let idx =
                    _mm512_add_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_epi64((block * 8) as i64));
                let s = mix(_mm512_xor_si512(x, hv), mv);
                // Without a floor (a pick), every live lane is a candidate: two fewer compares.
                let cand = if FLOOR {
                    at_floor += _mm512_mask_cmpeq_epu64_mask(live, s, bv).count_ones();
                    _mm512_mask_cmplt_epu64_mask(live, s, bv)
                } else {
                    live
                };
                tie |= _mm512_mask_cmpeq_epu64_mask(cand, s, best[k]);
                let gt = _mm512_mask_cmpgt_epu64_mask(cand, s, best[k]);
                best[k] = _mm512_mask_mov_epi64(best[k], gt, s);
                best_idx[k] = _mm512_mask_mov_epi64(best_idx[k], gt, idx);
            };
            let full = seeds.len() / 8;
            let ptr = seeds.as_ptr();
            for block in 0..full {
                // SAFETY: block * 8 + 8 <= seeds.len().
                let x = unsafe { _mm512_loadu_si512(ptr.add(block * 8).cast()) };
                step(block, 0xff, x, block & 1);
            }
            let left = seeds.len() - full * 8;
            if left > 0 {
                let live: __mmask8 = (1u8 << left) - 1;
                // SAFETY: the mask only reads the `left` lanes inside `seeds`.
                let x = unsafe { _mm512_maskz_loadu_epi64(live, ptr.add(full * 8).cast()) };
                step(full, live, x, full & 1);
            }
            // Merge: lane-wise, the higher score wins; on equal scores, report ambiguity.
            tie |= _mm512_mask_cmpeq_epu64_mask(
                _mm512_cmpneq_epi64_mask(best_idx[0], _mm512_set1_epi64(-1))
                    & _mm512_cmpneq_epi64_mask(best_idx[1], _mm512_set1_epi64(-1)),
                best[0],
                best[1],
            );
            let take1 = _mm512_cmpgt_epu64_mask(best[1], best[0])
                | (_mm512_cmpeq_epi64_mask(best_idx[0], _mm512_set1_epi64(-1))
                    & _mm512_cmpneq_epi64_mask(best_idx[1], _mm512_set1_epi64(-1)));
            let best_v = _mm512_mask_mov_epi64(best[0], take1, best[1]);
            let best_i = _mm512_mask_mov_epi64(best_idx[0], take1, best_idx[1]);
            if tie != 0 || at_floor > u32::from(floor_here) {
                return Fast::Ambiguous;
            }
            let valid = _mm512_cmpneq_epi64_mask(best_i, _mm512_set1_epi64(-1));
            if valid == 0 {
                return Fast::Nothing;
            }
            let max = _mm512_mask_reduce_max_epu64(valid, best_v);
            let lanes = _mm512_mask_cmpeq_epu64_mask(valid, best_v, _mm512_set1_epi64(max as i64));
            if lanes.count_ones() != 1 {
                return Fast::Ambiguous;
            }
            let mut out = [0i64; 8];
            // SAFETY: `out` has room for eight lanes.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), best_i) };
            Fast::Best { score: max, at: out[lanes.trailing_zeros() as usize] as usize }
        }
    }

    #[cfg(test)]
    mod tests {
        #[cfg(target_arch = "x86_64")]
        use super::*;

        #[cfg(not(target_arch = "x86_64"))]
        #[test]
        fn the_vector_pass_agrees_with_the_scalar_one() {
            eprintln!("SKIPPED the_vector_pass_agrees_with_the_scalar_one: no AVX-512 kernel on this architecture");
        }

        /// What the scalar reference says about one vector pass's input: which scores are tied.
        #[cfg(target_arch = "x86_64")]
        struct Ties {
            /// Equal scores the pass cannot order by itself: a tie for the best candidate, another
            /// node scoring exactly the floor, or a best candidate scoring 0 (the accumulators' start).
            /// The pass must report these as ambiguous.
            must: bool,
            /// Any real coincidence the pass may see on its way: two candidates with equal scores
            /// (best or not, the pass compares lane by lane), another node at the floor, or a
            /// candidate scoring 0. Ambiguity without one of these is spurious.
            may: bool,
        }

        #[cfg(target_arch = "x86_64")]
        fn ties(h: u64, seeds: &[u64], below: Option<u64>) -> Ties {
            let scores: Vec<u64> = seeds.iter().map(|&s| score(h, s)).collect();
            let cands: Vec<u64> = scores.iter().copied().filter(|&s| below.is_none_or(|b| s < b)).collect();
            let at_floor = below.map_or(0, |b| scores.iter().filter(|&&s| s == b).count());
            let mut sorted = cands.clone();
            sorted.sort_unstable();
            let equal_pair = sorted.windows(2).any(|w| w[0] == w[1]);
            let best = cands.iter().copied().max();
            let best_tied = best.is_some_and(|m| cands.iter().filter(|&&s| s == m).count() > 1);
            Ties {
                must: best_tied || at_floor > 1 || best == Some(0),
                may: equal_pair || at_floor > 1 || cands.contains(&0),
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[test]
        fn the_vector_pass_agrees_with_the_scalar_one() {
            use crate::hash::{RandomSource, SplitMix64};
            if Level::detect() != Level::Avx512 {
                eprintln!(
                    "SKIPPED the_vector_pass_agrees_with_the_scalar_one: this CPU lacks AVX-512F/DQ, \
                     so the vector pass is never used here and was not tested"
                );
                return;
            }
            let mut rng = SplitMix64::new(8);
            let (mut best_seen, mut ambiguous_seen, mut must_seen) = (0u32, 0u32, 0u32);
            for round in 0..4000u32 {
                let n = 1 + rng.below(70) as usize;
                let mut seeds: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
                // Ranks a random permutation, so that breaking a tie by index would not pass for
                // breaking it by rank.
                let mut ranks: Vec<u32> = (0..n as u32).collect();
                for i in (1..n).rev() {
                    ranks.swap(i, rng.below(i as u64 + 1) as usize);
                }
                let mut h = rng.next_u64();
                let with_floor = round % 2 == 1;
                let mut j = rng.below(n as u64) as usize; // the floor's node
                let pos = |rng: &mut SplitMix64| rng.below(n as u64) as usize;
                match (round / 2) % 6 {
                    0 => {} // distinct seeds: the common case, where the pass must answer itself
                    1 if n > 1 => {
                        let (a, b) = (pos(&mut rng), pos(&mut rng));
                        seeds[a] = seeds[b]; // a tie somewhere (often not for the best)
                    }
                    2 if n > 1 => {
                        // A tie for the best candidate below the floor (or overall).
                        let below = if with_floor { score(h, seeds[j]) } else { u64::MAX };
                        let best = (0..n)
                            .filter(|&i| !with_floor || score(h, seeds[i]) < below)
                            .max_by_key(|&i| score(h, seeds[i]));
                        if let Some(b) = best {
                            let other = loop {
                                let o = pos(&mut rng);
                                if o != j || !with_floor {
                                    break o;
                                }
                            };
                            seeds[other] = seeds[b];
                        }
                    }
                    3 if n > 2 => {
                        let s = seeds[pos(&mut rng)];
                        for _ in 0..1 + rng.below(n as u64 / 2) {
                            let at = pos(&mut rng);
                            seeds[at] = s; // one seed many times
                        }
                    }
                    4 => h = seeds[pos(&mut rng)], // that node scores exactly 0
                    5 if n > 1 => {
                        let other = (j + 1 + rng.below(n as u64 - 1) as usize) % n;
                        seeds[other] = seeds[j]; // another node at the floor's score
                        if rng.below(2) == 0 {
                            j = other;
                        }
                    }
                    _ => {}
                }
                let floor = with_floor.then(|| (score(h, seeds[j]), ranks[j]));
                let exact = best_scalar(h, &seeds, &ranks, floor);
                let fast = match floor {
                    // SAFETY: detected above.
                    None => unsafe { avx512::best_below::<false>(h, &seeds, u64::MAX, false) },
                    // SAFETY: detected above.
                    Some(f) => unsafe { avx512::best_below::<true>(h, &seeds, f.0, true) },
                };
                let t = ties(h, &seeds, floor.map(|f| f.0));
                must_seen += u32::from(t.must);
                let what = format!("round {round}, n {n}, floor {floor:?}: {fast:?}, scalar {exact:?}");
                match fast {
                    Fast::Nothing => {
                        assert!(!t.must, "missed a tie: {what}");
                        assert_eq!(exact, None, "{what}");
                    }
                    Fast::Best { score, at } => {
                        assert!(!t.must, "missed a tie: {what}");
                        assert_eq!(exact, Some((score, ranks[at], at)), "{what}");
                        best_seen += 1;
                    }
                    Fast::Ambiguous => {
                        assert!(t.may, "spurious ambiguity, no two scores are equal: {what}");
                        ambiguous_seen += 1;
                    }
                }
            }
            // Both outcomes were exercised, and the ties that must be flagged did occur.
            assert!(
                best_seen > 1500 && ambiguous_seen > 1000 && must_seen > 800,
                "{best_seen} {ambiguous_seen} {must_seen}"
            );
        }
    }
}

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

    #[test]
    fn ranking_matches_the_naive_definition() {
        let mut rng = SplitMix64::new(11);
        for round in 0..200 {
            let n = 1 + rng.below(150) as usize;
            let set = random_set(&mut rng, n, round % 2 == 1);
            let t = Rendezvous::new(set);
            for _ in 0..20 {
                let h = rng.next_u64();
                let got: Vec<usize> = t.ranked_hash(h).collect();
                assert_eq!(got, naive_ranking(&t, h), "n={n} round={round}");
                assert_eq!(t.pick_hash(h), got.first().copied());
            }
        }
    }

    #[test]
    fn equal_scores_are_broken_by_name() {
        // Two nodes whose seeds collide cannot be built from names, so test the group scan directly
        // with a table whose seeds are overwritten.
        let mut t = Rendezvous::new(NodeSet::parse("b,a,c").expect("valid"));
        t.seeds = vec![5, 5, 5].into();
        let order: Vec<&str> = t.ranked_hash(0).map(|i| t.nodes().nodes()[i].name()).collect();
        assert_eq!(order, ["a", "b", "c"]);
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
        t.seeds = seeds.into();
        for h in [0u64, 1, 42, u64::MAX, 0x9e37_79b9] {
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

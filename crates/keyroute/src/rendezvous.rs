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
//!   busiest node holds at most ~1.01x the mean (measured by the tests).
//! - **Weights.** With weights, node `i`'s score is `w_i / -ln(u_i)`, where `u_i` in (0, 1) is its
//!   uniform hash value; equivalently the key goes to the smallest `-ln(u_i) / w_i`, the first arrival
//!   among independent exponential clocks of rates `w_i`, which node `i` wins with probability
//!   exactly `w_i / sum(w)` (Schindelhauer and Schomaker 2005; Resch, *Weighted rendezvous hashing*).
//!   Unlike weighted rings, a weight change does not disturb the other nodes' shares.
//!
//! # Cost
//!
//! A pick scores every live node: `O(n)`, about a nanosecond per node here (the node seeds are hashed
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
//! [`hash::score`](crate::hash::score)`(key_hash, node_seed)`, highest first, ties by name. Across
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

const CHUNK: usize = 64;

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
        Rendezvous { nodes, hasher, seeds, index: live.into(), rank, groups: groups.into() }
    }

    /// The best candidate of positions `start..end` strictly after `floor` in group order.
    #[inline]
    fn group_best(&self, h: u64, start: usize, end: usize, floor: Option<Cand>) -> Option<Cand> {
        let mut best: Option<Cand> = None;
        let mut buf = [0u64; CHUNK];
        let mut at = start;
        while at < end {
            let len = (end - at).min(CHUNK);
            let seeds = &self.seeds[at..at + len];
            let scores = &mut buf[..len];
            let max = kernel::scores_max(h, seeds, scores, floor.map(|f| f.score));
            // `max` is the highest score strictly below the floor's (or any, without a floor);
            // candidates equal to the floor's score with a later name rank are checked apart.
            if let Some(f) = floor {
                for (j, &s) in scores.iter().enumerate() {
                    if s == f.score {
                        let c = Cand { score: s, rank: self.rank[at + j], pos: (at + j) as u32 };
                        if f.before(&c) && best.is_none_or(|b| c.before(&b)) {
                            best = Some(c);
                        }
                    }
                }
            }
            if let Some(max) = max {
                if best.is_none_or(|b| max >= b.score) {
                    for (j, &s) in scores.iter().enumerate() {
                        if s == max {
                            let c = Cand { score: s, rank: self.rank[at + j], pos: (at + j) as u32 };
                            if best.is_none_or(|b| c.before(&b)) {
                                best = Some(c);
                            }
                        }
                    }
                }
            }
            at += len;
        }
        best
    }

    /// The next node in the ranking after the nodes in `taken` (all earlier in the ranking).
    fn next_after(&self, h: u64, taken: &[u32]) -> Option<u32> {
        let mut best: Option<(f64, Cand)> = None;
        for g in self.groups.iter() {
            // The group's floor is its last member already taken (they come in group order).
            let floor = taken
                .iter()
                .filter(|&&p| (g.start..g.end).contains(&p))
                .map(|&p| Cand { score: hash::score(h, self.seeds[p as usize]), rank: self.rank[p as usize], pos: p })
                .reduce(|a, b| if a.before(&b) { b } else { a });
            let Some(c) = self.group_best(h, g.start as usize, g.end as usize, floor) else { continue };
            if self.groups.len() == 1 {
                return Some(c.pos);
            }
            let key = exp_key(c.score) * g.inv_weight;
            let better = match &best {
                None => true,
                Some((bk, bc)) => key < *bk || (key == *bk && c.before(bc)),
            };
            if better {
                best = Some((key, c));
            }
        }
        best.map(|(_, c)| c.pos)
    }

    /// The number of live nodes.
    pub fn live_count(&self) -> usize {
        self.seeds.len()
    }
}

/// `-ln(u)` for the uniform value of a score: the exponential clock of the logarithmic method.
#[inline]
fn exp_key(score: u64) -> f64 {
    let u = ((score >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    -ln_portable(u)
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
        self.next_after(hash, &[]).map(|p| self.index[p as usize] as usize)
    }
}

/// The lazy ranked list of a key on a [`Rendezvous`] table: distinct nodes, best first.
///
/// Holds the positions already yielded inline (no allocation for the first 8).
#[derive(Clone, Debug)]
pub struct RendezvousRanked<'a> {
    table: &'a Rendezvous,
    hash: u64,
    taken: Taken,
    skip: Option<u32>,
}

impl Iterator for RendezvousRanked<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        loop {
            if self.taken.len() >= self.table.seeds.len() {
                return None;
            }
            let p = self.table.next_after(self.hash, self.taken.as_slice())?;
            self.taken.push(p);
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
        RendezvousRanked { table: self, hash, taken: Taken::default(), skip: None }
    }
}

impl Rendezvous {
    /// The rendezvous ranking of a key with one node left out: the fallback ranking that strategies
    /// without a ranking of their own use after their pick (see [`Fallback`]).
    pub(crate) fn ranked_without(&self, hash: u64, skip: usize) -> RendezvousRanked<'_> {
        RendezvousRanked { table: self, hash, taken: Taken::default(), skip: u32::try_from(skip).ok() }
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

/// The scoring loop, compiled for the best vector unit the CPU has (chosen at run time). All paths
/// compute the same integers.
mod kernel {
    use crate::hash::score;

    /// Writes each seed's score into `out` and returns the highest score strictly below `below`
    /// (any score if `below` is `None`), or `None` if there is none.
    #[inline(always)]
    fn generic(h: u64, seeds: &[u64], out: &mut [u64], below: Option<u64>) -> Option<u64> {
        for (o, &s) in out.iter_mut().zip(seeds) {
            *o = score(h, s);
        }
        match below {
            None => out.iter().copied().max(),
            Some(b) => out.iter().copied().filter(|&s| s < b).max(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl")]
    fn avx512(h: u64, seeds: &[u64], out: &mut [u64], below: Option<u64>) -> Option<u64> {
        generic(h, seeds, out, below)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn avx2(h: u64, seeds: &[u64], out: &mut [u64], below: Option<u64>) -> Option<u64> {
        generic(h, seeds, out, below)
    }

    #[inline]
    pub(super) fn scores_max(h: u64, seeds: &[u64], out: &mut [u64], below: Option<u64>) -> Option<u64> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512dq") && std::arch::is_x86_feature_detected!("avx512vl") {
                // SAFETY: the CPU supports the features `avx512` is compiled for (checked above).
                return unsafe { avx512(h, seeds, out, below) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked above).
                return unsafe { avx2(h, seeds, out, below) };
            }
        }
        generic(h, seeds, out, below)
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
    fn empty_and_drained_sets_pick_nothing() {
        let t = Rendezvous::new(NodeSet::try_new([]).expect("empty is valid"));
        assert_eq!(t.pick(b"k"), None);
        assert_eq!(t.ranked(b"k").count(), 0);
        let t = Rendezvous::new(NodeSet::parse("a:weight=0,b:weight=0").expect("valid"));
        assert_eq!(t.pick(b"k"), None);
    }
}

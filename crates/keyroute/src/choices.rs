//! The power of d random choices, least loaded, and affinity (two choices among a key's owners).
//!
//! # Power of two choices
//!
//! Sample `d` distinct nodes at random and send the request to the least loaded of them
//! (Mitzenmacher, *The Power of Two Choices in Randomized Load Balancing*, IEEE TPDS 2001; Azar,
//! Broder, Karlin and Upfal 1994). With `n` requests on `n` nodes, one random choice leaves the
//! busiest node with `~ln n / ln ln n` requests; two choices bring it down to `~ln ln n / ln 2`,
//! exponentially better, and a third choice adds little (`keyroute sim choices` reproduces the
//! numbers: 1M requests on 1M nodes give a busiest node of 8-10 with one choice and 4 with two).
//!
//! The load is what the caller measures, usually requests in flight, which also carries what
//! round robin throws away: a slow node accumulates requests and starts losing comparisons. And
//! because each gateway draws its own pairs, several gateways acting on stale counts do not all
//! pile onto the same idle node, which is what [`LeastLoaded`] does (the simulator's
//! `stale-gateways` scenario shows it). This is NGINX's `random two least_conn` and Envoy's
//! `LEAST_REQUEST` balancer (choice count 2).
//!
//! With weights, loads are compared relative to weight (`load / weight`), as Envoy does.
//!
//! # Affinity
//!
//! [`affinity`] applies two choices to the first `d` nodes of a key's *ranking* instead of to random
//! nodes: a key has two homes, both of which cache it, and each request goes to the less loaded one.
//! Locality and load at once; a hot key is split over two nodes (and a slow owner is routed
//! around), at the cost of caching each key twice.
//!
//! # Cost
//!
//! `O(d)` per pick for power of choices (plus an `O(n)` candidate list the caller may keep), `O(n)`
//! for least loaded. Randomness is injected ([`RandomSource`]), so runs are reproducible.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::hash::RandomSource;
use crate::{Choice, Error};

/// A per-node load the caller supplies: requests in flight, queue length, anything additive.
///
/// One method. Implemented for slices and vectors of integers and of atomics (read relaxed), and
/// for closures `Fn(usize) -> u64`.
pub trait LoadView {
    /// The load of node `index` (0 if unknown).
    fn load(&self, index: usize) -> u64;
}

impl LoadView for [u64] {
    fn load(&self, index: usize) -> u64 {
        self.get(index).copied().unwrap_or(0)
    }
}

impl LoadView for [u32] {
    fn load(&self, index: usize) -> u64 {
        self.get(index).map_or(0, |&l| u64::from(l))
    }
}

impl LoadView for [AtomicU64] {
    fn load(&self, index: usize) -> u64 {
        self.get(index).map_or(0, |l| l.load(Ordering::Relaxed))
    }
}

impl LoadView for [AtomicU32] {
    fn load(&self, index: usize) -> u64 {
        self.get(index).map_or(0, |l| u64::from(l.load(Ordering::Relaxed)))
    }
}

impl<T> LoadView for Vec<T>
where
    [T]: LoadView,
{
    fn load(&self, index: usize) -> u64 {
        self.as_slice().load(index)
    }
}

impl<F: Fn(usize) -> u64> LoadView for F {
    fn load(&self, index: usize) -> u64 {
        self(index)
    }
}

/// Whether `a` (load, weight) is strictly less loaded than `b`, relative to weight.
#[inline]
pub(crate) fn lighter(a: (u64, u32), b: (u64, u32)) -> bool {
    u128::from(a.0) * u128::from(b.1) < u128::from(b.0) * u128::from(a.1)
}

/// Power of `d` random choices. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, PowerOfChoices, hash::SplitMix64};
/// let nodes = NodeSet::parse("a,b,c,d")?;
/// let p2c = PowerOfChoices::new(2)?;
/// let loads = [9u64, 0, 9, 9];
/// let mut rng = SplitMix64::new(1);
/// let picks: Vec<usize> = (0..100).filter_map(|_| p2c.pick(&nodes, nodes.live(), &loads[..], &mut rng)).collect();
/// // Node 1 wins every comparison it is drawn into; node 0, 2, 3 only when paired with each other.
/// assert!(picks.iter().filter(|&&i| i == 1).count() > 40);
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerOfChoices {
    d: usize,
}

impl PowerOfChoices {
    /// `d` choices per pick (2 is the classic; 1 is uniform random).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) if `d` is 0.
    pub fn new(d: usize) -> Result<Self, Error> {
        if d == 0 {
            return Err(Error::invalid_parameter("the number of choices must be at least 1"));
        }
        Ok(PowerOfChoices { d })
    }

    /// The number of choices.
    pub fn choices(&self) -> usize {
        self.d
    }

    /// Samples `min(d, candidates.len())` distinct candidates and returns the least loaded relative to
    /// weight (the first sampled on a tie). `candidates` are node indices of `nodes`, typically its
    /// live and healthy ones; `None` if there are none.
    pub fn pick<L, R>(&self, nodes: &crate::NodeSet, candidates: &[u32], loads: &L, rng: &mut R) -> Option<usize>
    where
        L: LoadView + ?Sized,
        R: RandomSource + ?Sized,
    {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let weight = |i: usize| nodes.get(i).map_or(1, |x| x.weight().max(1));
        let mut best: Option<(usize, (u64, u32))> = None;
        let mut consider = |i: usize| {
            let lw = (loads.load(i), weight(i));
            if best.is_none_or(|(_, b)| lighter(lw, b)) {
                best = Some((i, lw));
            }
        };
        if self.d >= n {
            candidates.iter().for_each(|&c| consider(c as usize));
        } else if self.d == 2 {
            let a = rng.below(n as u64) as usize;
            let mut b = rng.below(n as u64 - 1) as usize;
            if b >= a {
                b += 1;
            }
            consider(candidates[a] as usize);
            consider(candidates[b] as usize);
        } else {
            // Distinct samples by rejection; d < n, so each draw succeeds with probability > 1/n... in
            // practice d is tiny and almost every draw succeeds.
            let mut drawn: Vec<usize> = Vec::with_capacity(self.d);
            while drawn.len() < self.d {
                let j = rng.below(n as u64) as usize;
                if !drawn.contains(&j) {
                    drawn.push(j);
                    consider(candidates[j] as usize);
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

/// Always the least loaded candidate relative to weight (ties broken at random).
///
/// The contrast to [`PowerOfChoices`]: optimal with one fresh view of the loads, but several
/// gateways acting on stale counts all send their next burst to the same idle node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeastLoaded;

impl LeastLoaded {
    /// The least loaded of `candidates` relative to weight; ties broken uniformly at random.
    pub fn pick<L, R>(&self, nodes: &crate::NodeSet, candidates: &[u32], loads: &L, rng: &mut R) -> Option<usize>
    where
        L: LoadView + ?Sized,
        R: RandomSource + ?Sized,
    {
        let mut best: Option<(usize, (u64, u32))> = None;
        let mut ties = 0u64;
        for &c in candidates {
            let i = c as usize;
            let lw = (loads.load(i), nodes.get(i).map_or(1, |x| x.weight().max(1)));
            match best {
                Some((_, b)) if lighter(b, lw) => {}
                Some((_, b)) if !lighter(lw, b) => {
                    // A tie: reservoir-sample among the tied.
                    ties += 1;
                    if rng.below(ties + 1) == 0 {
                        best = Some((i, lw));
                    }
                }
                _ => {
                    best = Some((i, lw));
                    ties = 0;
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

/// Affinity: the least loaded (relative to weight) of the first `d` eligible nodes of a key's
/// ranking; on a tie, the earlier one (the owner). See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, Ranking, Rendezvous, choices::affinity};
/// let nodes = NodeSet::parse("a,b,c")?;
/// let table = Rendezvous::new(nodes.clone());
/// let ranking: Vec<usize> = table.ranked(b"hot.jpg").collect();
/// let mut loads = vec![0u64; 3];
/// loads[ranking[0]] = 5; // the owner is busy: the runner-up takes the request
/// let c = affinity(ranking.iter().copied(), 2, &nodes, &loads, |_| true).expect("some");
/// assert_eq!((c.node, c.rank), (ranking[1], 1));
/// # Ok::<(), keyroute::Error>(())
/// ```
pub fn affinity<I, L>(
    ranking: I,
    d: usize,
    nodes: &crate::NodeSet,
    loads: &L,
    eligible: impl Fn(usize) -> bool,
) -> Option<Choice>
where
    I: IntoIterator<Item = usize>,
    L: LoadView + ?Sized,
{
    let mut best: Option<(Choice, (u64, u32))> = None;
    for (rank, node) in ranking.into_iter().filter(|&i| eligible(i)).take(d.max(1)).enumerate() {
        let lw = (loads.load(node), nodes.get(node).map_or(1, |x| x.weight().max(1)));
        if best.is_none_or(|(_, b)| lighter(lw, b)) {
            best = Some((Choice { node, rank }, lw));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeSet;
    use crate::hash::SplitMix64;

    #[test]
    fn samples_are_distinct_and_cover_all_when_d_is_large() {
        let nodes = NodeSet::parse("a,b,c").expect("valid");
        let mut rng = SplitMix64::new(2);
        let loads = [3u64, 2, 1];
        for _ in 0..50 {
            // d >= n: the least loaded always.
            assert_eq!(PowerOfChoices::new(5).expect("ok").pick(&nodes, nodes.live(), &loads[..], &mut rng), Some(2));
            // d = n - 1 distinct: the busiest can never win.
            let p = PowerOfChoices::new(2).expect("ok").pick(&nodes, nodes.live(), &loads[..], &mut rng);
            assert_ne!(p, Some(0));
        }
        assert_eq!(PowerOfChoices::new(2).expect("ok").pick(&nodes, &[], &loads[..], &mut rng), None);
        assert!(PowerOfChoices::new(0).is_err());
    }

    #[test]
    fn three_choices_never_pick_the_two_busiest() {
        let nodes = NodeSet::parse("a,b,c,d").expect("valid");
        let mut rng = SplitMix64::new(9);
        let loads = [9u64, 8, 1, 0];
        for _ in 0..200 {
            let p = PowerOfChoices::new(3).expect("ok").pick(&nodes, nodes.live(), &loads[..], &mut rng);
            assert!(matches!(p, Some(2 | 3)));
        }
    }

    #[test]
    fn least_loaded_uses_weights_and_breaks_ties_randomly() {
        let nodes = NodeSet::parse("a,b:weight=4,c").expect("valid");
        let mut rng = SplitMix64::new(4);
        assert_eq!(LeastLoaded.pick(&nodes, nodes.live(), &[2u64, 4, 2][..], &mut rng), Some(1));
        let mut seen = [0; 3];
        for _ in 0..300 {
            if let Some(i) = LeastLoaded.pick(&nodes, &[0, 2], &[1u64, 0, 1][..], &mut rng) {
                seen[i] += 1;
            }
        }
        assert!(seen[0] > 100 && seen[2] > 100, "{seen:?}");
    }
}

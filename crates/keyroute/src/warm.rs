//! Warm before traffic: slow start and previous-owner handoff, so that a node that joins (or
//! recovers) takes its share of keys as a trickle instead of all at once with a cold cache.
//!
//! # The problem
//!
//! "Adding a ninth worker during a busy week means the caches ... might empty out." Consistent
//! hashing moves only `1/(n+1)` of the keys to a newcomer, but all of them at once, and each of
//! those keys then misses once on a cold cache. The old owner still has them warm.
//!
//! # The rule
//!
//! During a warm-up window, each key that a warming node owns is *admitted* to it when a fixed
//! number derived from the key's hash, `u = mix64(hash ^ WARM_SALT) / 2^64`, is below the node's
//! progress `p` (0 to 1). A key not yet admitted goes where it went before:
//!
//! - **Handoff** ([`Handoff`], scale-out): to its owner in the table built without the warming
//!   nodes. Every table is a function of its node set, so for a join that is exactly the key's
//!   owner before the join: its previous owner, still alive and warm. Progress is linear in time
//!   ([`Ramp`] with `min_share = 0`), from 1 to 0 chance of going to the old owner.
//! - **Slow start** (a join or a recovery): to the next node of the key's ranking that is not held
//!   back, which is where the key went while the node was away. Progress ramps by time from
//!   `min_share`, and, when nodes report cache hits, is slowed by the node's hit rate over the
//!   pool's ([`Ramp::progress_with_hits`]).
//!
//! # Guarantees
//!
//! - **Only the newcomer's keys move, and only as stated.** A key whose owner is not warming is
//!   never touched; a key owned by a warming node goes either to it or to its previous owner (or,
//!   for slow start, its ranking's next node). `tests/warm.rs` checks it for every strategy.
//! - **A trickle, not a flood.** The admitted keys are those with `u < p`: a share `p` of the
//!   newcomer's keys (within sampling error), and a set that only grows as `p` grows, so a key
//!   moves at most once during the window and never back and forth.
//! - **Deterministic.** `u` depends only on the key hash: every gateway admits the same keys at the
//!   same progress.
//!
//! # Cost
//!
//! One extra mix per request for a key owned by a warming node, and (handoff) one lookup in the
//! table without the newcomers, built once per membership change off the request path.

use std::time::Duration;

use crate::hash::mix64;
use crate::{Error, NodeSet, Placement, Policy};

/// The salt of the admission number: keeps admission independent of the placement hashes.
pub const WARM_SALT: u64 = 0x7761_726d_7570_2121;

/// The key's admission number in `[0, 1)`: `mix64(hash ^ WARM_SALT) / 2^64`.
#[inline]
pub fn admission(hash: u64) -> f64 {
    (mix64(hash ^ WARM_SALT) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether a key is admitted to a warming node at `progress`.
#[inline]
pub fn admitted(hash: u64, progress: f64) -> bool {
    progress >= 1.0 || admission(hash) < progress
}

/// A warm-up ramp: progress from `min_share` to 1 over `window`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ramp {
    /// How long the ramp lasts.
    pub window: Duration,
    /// The progress at the start, in `[0, 1]`.
    pub min_share: f64,
}

/// The fewest hit/miss reports of a warming node before its hit rate is trusted.
pub const MIN_REPORTS: u64 = 20;

impl Ramp {
    /// The ramp.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) for a zero window or a
    /// share outside `[0, 1]`.
    pub fn try_new(window: Duration, min_share: f64) -> Result<Self, Error> {
        if window.is_zero() {
            return Err(Error::invalid_parameter("the warm-up window must be > 0"));
        }
        if !(0.0..=1.0).contains(&min_share) {
            return Err(Error::invalid_parameter("min_share must be in [0, 1]"));
        }
        Ok(Ramp { window, min_share })
    }

    /// Progress after `elapsed`: `min_share + (1 - min_share) * elapsed / window`, 1 from the end of
    /// the window on.
    pub fn progress(&self, elapsed: Duration) -> f64 {
        if elapsed >= self.window {
            return 1.0;
        }
        let t = elapsed.as_secs_f64() / self.window.as_secs_f64();
        (self.min_share + (1.0 - self.min_share) * t).clamp(0.0, 1.0)
    }

    /// Progress by time, slowed by the node's hit rate since it started warming (`hits` of
    /// `reports`) over the pool's hit rate: a node whose cache is still cold gets its keys more
    /// slowly. Until [`MIN_REPORTS`] reports, or when the pool reports no hits, time alone decides;
    /// the window's end is a hard bound either way.
    pub fn progress_with_hits(&self, elapsed: Duration, hits: u64, reports: u64, pool_hit_rate: f64) -> f64 {
        let by_time = self.progress(elapsed);
        if by_time >= 1.0 || reports < MIN_REPORTS || pool_hit_rate <= 0.0 {
            return by_time;
        }
        let own = hits as f64 / reports as f64;
        let factor = (own / pool_hit_rate).clamp(0.0, 1.0);
        (self.min_share.max(by_time * factor)).min(by_time)
    }
}

/// Previous-owner handoff after a join: the table without the warming nodes, and where each of its
/// nodes is in the current table. See the [module documentation](self).
#[derive(Debug)]
pub struct Handoff {
    before: Policy,
    to_current: Vec<usize>,
    warming: Vec<usize>,
}

impl Handoff {
    /// The handoff for `current` with the nodes at `warming` (indices into its node set) warming.
    /// `None` when no node warms, or when the strategy does not place by key.
    ///
    /// # Errors
    ///
    /// The strategy refuses the node set without the warming nodes.
    pub fn new(current: &Policy, warming: &[usize]) -> Result<Option<Self>, Error> {
        if warming.is_empty() || current.table().is_none() {
            return Ok(None);
        }
        let nodes = current.nodes();
        let kept: Vec<usize> = (0..nodes.len()).filter(|i| !warming.contains(i)).collect();
        let set = NodeSet::try_new(kept.iter().filter_map(|&i| nodes.get(i).cloned()))?;
        let before = current.rebuild(set)?;
        let mut warming = warming.to_vec();
        warming.sort_unstable();
        warming.dedup();
        Ok(Some(Handoff { before, to_current: kept, warming }))
    }

    /// The warming nodes (current indices), sorted.
    pub fn warming(&self) -> &[usize] {
        &self.warming
    }

    /// Whether node `i` (current index) is warming.
    pub fn is_warming(&self, i: usize) -> bool {
        self.warming.binary_search(&i).is_ok()
    }

    /// The key's owner in the table without the warming nodes, as a current index.
    pub fn previous_owner(&self, hash: u64) -> Option<usize> {
        let i = self.before.table()?.pick_hash(hash)?;
        self.to_current.get(i).copied()
    }

    /// Where a key whose current owner is `owner` goes: `owner`, unless it is warming and the key is
    /// not admitted at its progress, in which case the previous owner.
    pub fn route(&self, hash: u64, owner: usize, progress: impl Fn(usize) -> f64) -> usize {
        if !self.is_warming(owner) || admitted(hash, progress(owner)) {
            return owner;
        }
        self.previous_owner(hash).unwrap_or(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_is_linear_and_bounded_by_its_window() {
        let r = Ramp::try_new(Duration::from_secs(10), 0.1).expect("valid");
        assert!((r.progress(Duration::ZERO) - 0.1).abs() < 1e-12);
        assert!((r.progress(Duration::from_secs(5)) - 0.55).abs() < 1e-12);
        assert_eq!(r.progress(Duration::from_secs(10)), 1.0);
        // A cold node (hit rate a quarter of the pool's) ramps at a quarter of the pace.
        let p = r.progress_with_hits(Duration::from_secs(5), 10, 100, 0.4);
        assert!((p - 0.1375).abs() < 1e-12, "{p}");
        assert_eq!(r.progress_with_hits(Duration::from_secs(11), 0, 100, 0.9), 1.0);
        assert!(Ramp::try_new(Duration::ZERO, 0.0).is_err());
        assert!(Ramp::try_new(Duration::from_secs(1), 1.5).is_err());
    }

    #[test]
    fn admission_is_a_uniform_growing_set() {
        let n = 100_000u64;
        for p in [0.1, 0.5, 0.9] {
            let share = (0..n).filter(|&k| admitted(mix64(k), p)).count() as f64 / n as f64;
            assert!((share - p).abs() < 0.01, "{p}: {share}");
        }
        for k in 0..10_000u64 {
            let h = mix64(k);
            assert!(!admitted(h, 0.3) || admitted(h, 0.6));
        }
    }
}

//! Round robin and NGINX's smooth weighted round robin.
//!
//! # Round robin
//!
//! A counter; each request goes to the next node, wrapping at the end. Every node sees the same
//! number of requests and the state is one integer, but the counter knows nothing about requests or
//! nodes: a slow node keeps its turn, and since nothing ties a key to a node, every node ends up
//! caching everything, each cache warming from only `1/n` of the traffic. The right default when
//! requests are cheap and alike and nodes remember nothing between them.
//!
//! # Smooth weighted round robin
//!
//! NGINX's algorithm (`ngx_http_upstream_get_peer`, 2012): every node has a `current` value; on
//! each pick, add every node's weight to its `current`, choose the node with the largest `current`,
//! and subtract the total weight from it. Over any window of `sum(w)` picks each node gets exactly
//! its weight's worth of turns, and they are spread out rather than bunched: weights `a = 5, b = 1,
//! c = 1` give `a a b a c a a`, not `a a a a a b c`. Ties go to the earlier node, as in NGINX.
//!
//! # Cost
//!
//! Round robin: one atomic increment, lock-free. Smooth weighted: `O(n)` per pick over mutable
//! state, so [`SmoothWeighted::next`] takes `&mut self`; share it behind a lock.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::NodeSet;

/// Plain round robin over the live nodes. Lock-free: shares one atomic counter.
///
/// # Examples
///
/// ```
/// let rr = keyroute::RoundRobin::new(&keyroute::NodeSet::parse("a,b:weight=0,c")?);
/// let picks: Vec<usize> = (0..4).filter_map(|_| rr.pick()).collect();
/// assert_eq!(picks, [0, 2, 0, 2]);
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Debug)]
pub struct RoundRobin {
    live: Box<[u32]>,
    next: AtomicU64,
}

impl RoundRobin {
    /// Round robin over `nodes`' live nodes, starting at the first.
    pub fn new(nodes: &NodeSet) -> Self {
        RoundRobin { live: nodes.live().into(), next: AtomicU64::new(0) }
    }

    /// The next live node.
    pub fn pick(&self) -> Option<usize> {
        self.pick_among(|_| true)
    }

    /// The next live node for which `eligible` holds, skipping the others (one turn is used per pick,
    /// so skipped nodes do not make their successor's share grow by more than their own).
    pub fn pick_among(&self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let n = self.live.len();
        if n == 0 {
            return None;
        }
        let start = (self.next.fetch_add(1, Ordering::Relaxed) % n as u64) as usize;
        (0..n).map(|k| self.live[(start + k) % n] as usize).find(|&i| eligible(i))
    }
}

impl Clone for RoundRobin {
    fn clone(&self) -> Self {
        RoundRobin { live: self.live.clone(), next: AtomicU64::new(self.next.load(Ordering::Relaxed)) }
    }
}

/// NGINX's smooth weighted round robin. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, SmoothWeighted};
/// let nodes = NodeSet::parse("a:weight=5,b,c")?;
/// let mut wrr = SmoothWeighted::new(&nodes);
/// let order: String = (0..7).filter_map(|_| wrr.next()).map(|i| nodes.nodes()[i].name()).collect();
/// assert_eq!(order, "aabacaa");
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SmoothWeighted {
    weight: Box<[i64]>,
    current: Box<[i64]>,
}

impl SmoothWeighted {
    /// Smooth weighted round robin over `nodes`, all `current` values at 0.
    pub fn new(nodes: &NodeSet) -> Self {
        let weight: Box<[i64]> = nodes.nodes().iter().map(|n| i64::from(n.weight())).collect();
        let current = vec![0; weight.len()].into();
        SmoothWeighted { weight, current }
    }

    /// The next node (`None` if no node has weight).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<usize> {
        self.next_among(|_| true)
    }

    /// The next node among those for which `eligible` holds; ineligible nodes neither gain nor lose
    /// turns, as NGINX skips peers that are down.
    pub fn next_among(&mut self, eligible: impl Fn(usize) -> bool) -> Option<usize> {
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for i in 0..self.weight.len() {
            if self.weight[i] == 0 || !eligible(i) {
                continue;
            }
            self.current[i] += self.weight[i];
            total += self.weight[i];
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let b = best?;
        self.current[b] -= total;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_window_of_total_weight_gives_exact_turns() {
        let nodes = NodeSet::parse("a:weight=3,b:weight=7,c:weight=0,d:weight=2").expect("valid");
        let mut wrr = SmoothWeighted::new(&nodes);
        for _ in 0..5 {
            let mut counts = [0; 4];
            for _ in 0..12 {
                counts[wrr.next().expect("live")] += 1;
            }
            assert_eq!(counts, [3, 7, 0, 2]);
        }
    }

    #[test]
    fn ineligible_nodes_are_skipped() {
        let nodes = NodeSet::parse("a,b,c").expect("valid");
        let rr = RoundRobin::new(&nodes);
        let picks: Vec<_> = (0..6).filter_map(|_| rr.pick_among(|i| i != 1)).collect();
        assert!(!picks.contains(&1));
        assert_eq!(rr.pick_among(|_| false), None);
        let mut wrr = SmoothWeighted::new(&nodes);
        assert_eq!(wrr.next_among(|_| false), None);
        assert!((0..10).all(|_| wrr.next_among(|i| i == 2) == Some(2)));
    }
}

//! Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, *Consistent Hashing
//! with Bounded Loads*, SODA 2018).
//!
//! # The algorithm
//!
//! Give every node a capacity of `ceil((1 + e) x mean load)`, counting the request being placed, and
//! send each request to the first node of its key's ranking (ring or rendezvous) that is under
//! capacity. With weights, node `i`'s capacity is `ceil((1 + e) x (L + 1) x w_i / W)` for a total
//! load `L` and total weight `W`.
//!
//! # Guarantees
//!
//! - **No node above capacity while any node has room.** The capacities sum to at least
//!   `(1 + e)(L + 1) > L`, so some node is always under capacity, and the walk down a complete
//!   ranking finds one. The busiest node carries at most `ceil((1 + e) x` its fair share`)`.
//! - **Locality while balanced.** A key leaves its owner only while the owner is full, and then goes
//!   to its runner-up, the same node every time: a hot key spills onto its second node (and third...)
//!   instead of onto everyone. The paper shows the expected number of extra moves per insertion or
//!   deletion is `O(1/e^2)`.
//!
//! # Cost
//!
//! The ranking's cost per node tried; usually one or two. Computing the mean is `O(n)` here; callers
//! that keep running totals can use [`BoundedLoad::capacity`] and their own walk.
//!
//! # When to choose it
//!
//! Cache-affine fleets with hot keys: `e = 0.25` keeps every node within 25% of the mean while most
//! requests still reach their key's owner (Vimeo's and HAProxy's `hash-balance-factor 125`).
//!
//! Loads are what the caller measures, typically requests in flight per node
//! ([`LoadView`]); nodes the caller cannot use (unhealthy) are left out by the
//! `eligible` filter, and do not count towards the mean.

use crate::{Error, LoadView, NodeSet};

/// The bounded-load rule with balance parameter `e`. See the [module documentation](self).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundedLoad {
    factor: f64,
}

/// A node chosen by a load-aware rule, and where it stood in the key's ranking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The node's index.
    pub node: usize,
    /// Its position in the key's ranking among eligible nodes (0 = the key's owner).
    pub rank: usize,
}

impl BoundedLoad {
    /// The rule with `epsilon` (`e >= 0`; capacity is `(1 + e)` times the mean).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`](crate::ErrorKind::InvalidParameter) if `epsilon` is negative
    /// or not finite.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = keyroute::BoundedLoad::try_new(0.25)?;
    /// // 8 equal nodes, 99 requests in flight, one more coming: mean 12.5, capacity ceil(15.625).
    /// assert_eq!(b.capacity(99, 1, 8), 16);
    /// assert!(keyroute::BoundedLoad::try_new(-1.0).is_err());
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn try_new(epsilon: f64) -> Result<Self, Error> {
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(Error::invalid_parameter(format!(
                "bounded-load epsilon must be finite and >= 0, got {epsilon}"
            )));
        }
        Ok(BoundedLoad { factor: 1.0 + epsilon })
    }

    /// The `e` of this rule.
    pub fn epsilon(&self) -> f64 {
        self.factor - 1.0
    }

    /// A node's capacity, counting the request being placed: `ceil((1 + e)(total_load + 1) x weight
    /// / total_weight)`, at least 1 for a live node.
    pub fn capacity(&self, total_load: u64, weight: u32, total_weight: u64) -> u64 {
        if weight == 0 || total_weight == 0 {
            return 0;
        }
        let c = (self.factor * (total_load as f64 + 1.0) * f64::from(weight) / total_weight as f64).ceil();
        (c as u64).max(1)
    }

    /// The first node of `ranking` that is eligible and under capacity.
    ///
    /// The mean is taken over the eligible live nodes. If the ranking ends before a node with room
    /// (it only can when it does not list every eligible node), the least loaded node it listed,
    /// relative to weight, is returned.
    pub fn pick<I, L>(&self, ranking: I, nodes: &NodeSet, loads: &L, eligible: impl Fn(usize) -> bool) -> Option<Choice>
    where
        I: IntoIterator<Item = usize>,
        L: LoadView + ?Sized,
    {
        let mut total_load = 0u64;
        let mut total_weight = 0u64;
        for &i in nodes.live() {
            let i = i as usize;
            if eligible(i) {
                total_load += loads.load(i);
                total_weight += u64::from(nodes.nodes()[i].weight());
            }
        }
        let mut fallback: Option<(Choice, u64, u32)> = None;
        let mut rank = 0;
        for node in ranking {
            if !eligible(node) {
                continue;
            }
            let weight = nodes.get(node).map_or(0, |n| n.weight());
            if weight == 0 {
                continue;
            }
            let load = loads.load(node);
            if load < self.capacity(total_load, weight, total_weight) {
                return Some(Choice { node, rank });
            }
            let better = fallback
                .is_none_or(|(_, fl, fw)| u128::from(load) * u128::from(fw) < u128::from(fl) * u128::from(weight));
            if better {
                fallback = Some((Choice { node, rank }, load, weight));
            }
            rank += 1;
        }
        fallback.map(|(c, _, _)| c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_full_nodes_in_ranking_order() {
        let nodes = NodeSet::parse("a,b,c,d").expect("valid");
        let b = BoundedLoad::try_new(0.0).expect("ok");
        // total 8 (+1) over 4 nodes: capacity ceil(9/4) = 3.
        let loads = [5u64, 3, 0, 0];
        let c = b.pick([0, 1, 2, 3], &nodes, &loads[..], |_| true).expect("some");
        assert_eq!(c, Choice { node: 2, rank: 2 });
        // With `a` ineligible, mean is over b, c, d: 3 + 1 over 3, capacity ceil(4/3) = 2.
        let c = b.pick([0, 1, 3, 2], &nodes, &loads[..], |i| i != 0).expect("some");
        assert_eq!(c, Choice { node: 3, rank: 1 });
    }

    #[test]
    fn weights_scale_capacity() {
        let b = BoundedLoad::try_new(0.25).expect("ok");
        assert_eq!(b.capacity(9, 3, 4), 10); // 1.25 * 10 * 3/4 = 9.375
        assert_eq!(b.capacity(9, 0, 4), 0);
        assert_eq!(b.capacity(0, 1, 1000), 1);
    }

    #[test]
    fn partial_ranking_falls_back_to_least_relative_load() {
        let nodes = NodeSet::parse("a,b:weight=2,c").expect("valid");
        let b = BoundedLoad::try_new(0.0).expect("ok");
        let loads = [10u64, 12, 0];
        let c = b.pick([0, 1], &nodes, &loads[..], |_| true).expect("some");
        assert_eq!(c.node, 1);
    }
}

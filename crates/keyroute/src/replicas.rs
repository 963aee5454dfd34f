//! Replication to the next distinct nodes, zone aware.
//!
//! # The rule
//!
//! A key with replication factor `k` lives on the first `k` distinct nodes of its ranking: on a ring,
//! the distinct nodes met walking clockwise from the key (Dynamo's *preference list*, DeCandia et
//! al. 2007); with rendezvous, the `k` highest scores. Copies on one machine protect from nothing,
//! so the ranking skips repeats; and copies in one rack or zone fail together, so real systems also
//! skip nodes whose zone is already used, while other zones remain (Cassandra's
//! `NetworkTopologyStrategy` fills distinct racks first, then goes back for the skipped nodes).
//!
//! [`ZoneAware`] does exactly that over any ranking: it yields the ranking's nodes, deferring a node
//! whose zone is already used until every zone has one; then it yields the deferred nodes in their
//! ranking order, then the rest. So the first `min(k, zones)` replicas are in distinct zones, the
//! list is still a permutation of the ranking (every node once), and a node's position only depends
//! on the nodes ranked before it, so adding or removing a node disturbs lists only where it appears.
//!
//! # Cost
//!
//! Lazy: yielding `k` replicas reads the ranking only as far as needed to find `k` zone-distinct
//! nodes. No allocation for up to 256 nodes, except a small deferred list when a zone repeats.

/// A set of node indices: inline up to 256, on the heap above.
#[derive(Clone, Debug)]
pub(crate) struct BitSet {
    inline: [u64; 4],
    heap: Vec<u64>,
}

impl BitSet {
    pub(crate) fn new(capacity: usize) -> Self {
        let heap = if capacity > 256 { vec![0; capacity.div_ceil(64)] } else { Vec::new() };
        BitSet { inline: [0; 4], heap }
    }

    /// Inserts `i`; returns whether it was absent.
    #[inline]
    pub(crate) fn insert(&mut self, i: usize) -> bool {
        let words: &mut [u64] = if self.heap.is_empty() { &mut self.inline } else { &mut self.heap };
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let Some(word) = words.get_mut(w) else { return false };
        let absent = *word & b == 0;
        *word |= b;
        absent
    }
}

/// A zone-aware view of a ranking: nodes in zones not used yet first. See the
/// [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, Ranking, Rendezvous, ZoneAware};
/// let set = NodeSet::parse("a:zone=x,b:zone=x,c:zone=y,d:zone=y")?;
/// let table = Rendezvous::new(set.clone());
/// let replicas: Vec<usize> = ZoneAware::new(table.ranked(b"k"), &set).take(2).collect();
/// let zones: Vec<_> = replicas.iter().map(|&i| set.nodes()[i].zone()).collect();
/// assert_ne!(zones[0], zones[1]);
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ZoneAware<'a, I> {
    inner: I,
    zone_ids: &'a [u32],
    zones_left: usize,
    used: BitSet,
    deferred: Vec<usize>,
    draining: usize,
}

impl<'a, I: Iterator<Item = usize>> ZoneAware<'a, I> {
    /// Wraps `ranking` (node indices of `nodes`).
    pub fn new(ranking: I, nodes: &'a crate::NodeSet) -> Self {
        ZoneAware {
            inner: ranking,
            zone_ids: nodes.zone_ids(),
            zones_left: nodes.zone_count(),
            used: BitSet::new(nodes.zone_count()),
            deferred: Vec::new(),
            draining: 0,
        }
    }
}

impl<I: Iterator<Item = usize>> Iterator for ZoneAware<'_, I> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.zones_left > 0 {
            match self.inner.next() {
                Some(node) => {
                    let zone = self.zone_ids.get(node).copied().unwrap_or(u32::MAX) as usize;
                    if self.used.insert(zone) {
                        self.zones_left -= 1;
                        return Some(node);
                    }
                    self.deferred.push(node);
                }
                // The ranking ran out before every zone was used (some zones hold no live node).
                None => self.zones_left = 0,
            }
        }
        if self.draining < self.deferred.len() {
            self.draining += 1;
            return Some(self.deferred[self.draining - 1]);
        }
        self.inner.next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeSet;

    #[test]
    fn zone_aware_prefers_new_zones_then_returns_the_skipped_in_order() {
        let set = NodeSet::parse("a:zone=x,b:zone=x,c:zone=x,d:zone=y,e:zone=z").expect("valid");
        let order: Vec<usize> = ZoneAware::new([0, 1, 2, 3, 4].into_iter(), &set).collect();
        assert_eq!(order, vec![0, 3, 4, 1, 2]);
        let order: Vec<usize> = ZoneAware::new([1, 0, 3, 2].into_iter(), &set).collect();
        // Zone z has no node in this ranking: the skipped nodes follow once the ranking runs out.
        assert_eq!(order, vec![1, 3, 0, 2]);
    }

    #[test]
    fn bitset_spills_to_the_heap() {
        let mut s = BitSet::new(1000);
        assert!(s.insert(999));
        assert!(!s.insert(999));
        assert!(s.insert(3));
        let mut s = BitSet::new(10);
        assert!(s.insert(9) && !s.insert(9) && !s.insert(5000));
    }
}

//! Hash mod N: the baseline every other strategy is measured against.
//!
//! # The algorithm
//!
//! `node = hash(key) mod N`. With weights, node `i` appears `w_i` times in the list of slots, and
//! `slot = hash(key) mod sum(w)`.
//!
//! # Guarantees and their absence
//!
//! Perfect balance in expectation, no table, every client computes the same answer. But changing
//! `N` changes the remainder of almost every key: going from `N` to `N + 1` nodes keeps a key in
//! place only when both remainders agree, about `1/(N + 1)` of keys, so about `N/(N + 1)` move
//! (75% from 3 to 4 nodes; the consistent-hashing note measured 7,538 of 10,000). For a cache that
//! is a mass miss at the worst moment. The tests measure it.
//!
//! # Cost
//!
//! One hash and one division: `O(1)`; `O(sum(w))` memory for weighted slots.
//!
//! # When to choose it
//!
//! A fixed set of nodes that never changes (or a full rehash that is acceptable when it does), or as
//! the control in an experiment. Otherwise use [`Rendezvous`] or
//! [`HashRing`](crate::HashRing).
//!
//! The remainders are numbered in the canonical order of the names ([`NodeSet::canonical`]), not in
//! the order the nodes are listed, so the table is a function of the member set.

use crate::hash::KeyHasher;
use crate::rendezvous::Fallback;
use crate::{Error, ErrorKind, NodeSet, Placement, Ranking, Rendezvous};

/// The largest total weight a modulo table expands (one slot per unit of weight).
pub const MAX_SLOTS: u64 = 1 << 24;

/// A hash-mod-N table. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{Modulo, NodeSet, Placement};
/// let t = Modulo::new(NodeSet::parse("a,b,c")?)?;
/// let i = t.pick_index(b"user:42").expect("non-empty");
/// assert_eq!(i as u64, keyroute::hash::xxh3_64(b"user:42") % 3);
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Modulo {
    nodes: NodeSet,
    hasher: KeyHasher,
    /// One entry per unit of weight in canonical order, or empty when every weight is 1 and the
    /// nodes are listed in canonical order (then remainder `i` is node `i`).
    slots: Box<[u32]>,
    fallback: Rendezvous,
}

impl Modulo {
    /// A modulo table with the default key hash.
    ///
    /// # Errors
    ///
    /// As [`Modulo::with_hasher`].
    pub fn new(nodes: NodeSet) -> Result<Self, Error> {
        Self::with_hasher(nodes, KeyHasher::default())
    }

    /// A modulo table with the given key hash.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::TooLarge`] if the total weight is above [`MAX_SLOTS`].
    pub fn with_hasher(nodes: NodeSet, hasher: KeyHasher) -> Result<Self, Error> {
        if nodes.total_weight() > MAX_SLOTS {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!("modulo over a total weight of {} is above the limit of {MAX_SLOTS}", nodes.total_weight()),
            ));
        }
        let plain = nodes.nodes().iter().all(|n| n.weight() == 1) && nodes.is_canonical();
        let slots = if plain {
            Vec::new()
        } else {
            nodes
                .canonical_indices()
                .into_iter()
                .flat_map(|i| std::iter::repeat_n(i, nodes.nodes()[i as usize].weight() as usize))
                .collect()
        };
        let fallback = Rendezvous::with_hasher(nodes.clone(), hasher);
        Ok(Modulo { nodes, hasher, slots: slots.into(), fallback })
    }
}

impl Placement for Modulo {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    #[inline]
    fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    #[inline]
    fn pick_hash(&self, hash: u64) -> Option<usize> {
        if self.slots.is_empty() {
            let n = self.nodes.len() as u64;
            (n > 0 && self.nodes.live_count() > 0).then(|| (hash % n) as usize)
        } else {
            Some(self.slots[(hash % self.slots.len() as u64) as usize] as usize)
        }
    }
}

impl Ranking for Modulo {
    type Ranked<'a> = Fallback<'a>;

    fn ranked_hash(&self, hash: u64) -> Fallback<'_> {
        Fallback::new(self.pick_hash(hash), &self.fallback, hash)
    }
}

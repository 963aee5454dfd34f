//! Jump consistent hash (Lamping and Veach, *A Fast, Minimal Memory, Consistent Hash Algorithm*,
//! 2014).
//!
//! # The algorithm
//!
//! Buckets are numbered `0..n`. A key's bucket is computed by following the key's pseudo-random
//! sequence of "jumps": from bucket `b`, the next bucket it would move to as buckets are added is
//! drawn so that, when going from `n` to `n + 1` buckets, each key moves to the new bucket with
//! probability exactly `1/(n + 1)`. The loop runs `O(ln n)` times and needs no table at all.
//!
//! # Guarantees
//!
//! - **Perfect balance in expectation** and minimal movement when buckets are **added at the end**:
//!   going from `n` to `n + 1` buckets moves exactly the keys that go to bucket `n`, `1/(n + 1)` of
//!   them, and nothing else.
//! - **Only the last bucket can go.** Buckets are positions, not names: removing bucket `i < n - 1`
//!   renumbers every later bucket and moves most keys. So a node that fails in the middle must be
//!   handled by failover, not by removal: keyroute keeps a drained node (weight 0) in its position
//!   and sends its keys on along the key's fallback ranking, moving only that node's keys.
//! - **A function of the set.** Bucket `b` is the `b`-th node in the canonical order of the names
//!   ([`NodeSet::canonical`]: by name, numbers compared as numbers), not in listing order, so
//!   `shard-0, ..., shard-10` are buckets 0 to 10 however they are listed, and a new shard that
//!   sorts last is the new last bucket.
//! - **No weights.** Jump hashing has no notion of weight; nodes must have weight 1 (or 0, drained).
//!
//! # Cost
//!
//! `O(ln n)` time (about 5 iterations at 100 buckets), `O(1)` memory: the cheapest lookup there is.
//!
//! # When to choose it
//!
//! Sharded stores whose shards are numbered and only ever grow (or shrink from the end), where
//! memory and speed matter and names do not. Not for a fleet whose members come and go at random.

use crate::hash::KeyHasher;
use crate::rendezvous::Fallback;
use crate::{Error, ErrorKind, NodeSet, Placement, Ranking, Rendezvous};

/// The jump consistent hash function, exactly as the paper's reference code: the bucket in
/// `0..buckets` of a 64-bit key. Returns 0 when `buckets` is 0 or 1.
///
/// # Examples
///
/// ```
/// // Values from the reference C++ implementation.
/// assert_eq!(keyroute::jump::jump_consistent_hash(0, 1), 0);
/// assert_eq!(keyroute::jump::jump_consistent_hash(1, 2), 0);
/// assert_eq!(keyroute::jump::jump_consistent_hash(256, 1024), 520);
/// ```
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1i64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b.max(0) as u32
}

/// A jump-hash table over a node set: bucket `b` is the `b`-th node in canonical name order. See the
/// [module documentation](self).
///
/// A node of weight 0 keeps its bucket, but its keys go on to the next node of the key's fallback
/// ranking (weighted rendezvous over the other live nodes), so draining a node moves only its keys.
///
/// # Examples
///
/// ```
/// use keyroute::{JumpHash, NodeSet, Placement};
/// let before = JumpHash::new(NodeSet::parse("a,b,c")?)?;
/// let after = JumpHash::new(NodeSet::parse("a,b,c,d")?)?;
/// let (x, y) = (before.pick_index(b"k"), after.pick_index(b"k"));
/// assert!(x == y || y == Some(3)); // a key either stays or moves to the new last bucket
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct JumpHash {
    nodes: NodeSet,
    hasher: KeyHasher,
    /// Bucket -> node index, or empty when the nodes are listed in canonical order (identity).
    order: Box<[u32]>,
    fallback: Rendezvous,
}

impl JumpHash {
    /// Builds a jump table with the default key hash.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] if a node has a weight other than 0 or 1.
    pub fn new(nodes: NodeSet) -> Result<Self, Error> {
        Self::with_hasher(nodes, KeyHasher::default())
    }

    /// Builds a jump table with the given key hash.
    ///
    /// # Errors
    ///
    /// As [`JumpHash::new`].
    pub fn with_hasher(nodes: NodeSet, hasher: KeyHasher) -> Result<Self, Error> {
        if let Some(n) = nodes.nodes().iter().find(|n| n.weight() > 1) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "jump hash cannot weight buckets: node '{}' has weight {} (use 1, or 0 to drain; or choose rendezvous or ring for weights)",
                    n.name(),
                    n.weight()
                ),
            ));
        }
        let order = if nodes.is_canonical() { Vec::new() } else { nodes.canonical_indices() };
        let fallback = Rendezvous::with_hasher(nodes.clone(), hasher);
        Ok(JumpHash { nodes, hasher, order: order.into(), fallback })
    }
}

impl Placement for JumpHash {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    #[inline]
    fn key_hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash(key)
    }

    #[inline]
    fn pick_hash(&self, hash: u64) -> Option<usize> {
        if self.nodes.is_empty() {
            return None;
        }
        let mut b = jump_consistent_hash(hash, self.nodes.len() as u32) as usize;
        if let Some(&i) = self.order.get(b) {
            b = i as usize;
        }
        if self.nodes.nodes()[b].is_live() {
            return Some(b);
        }
        self.fallback.ranked_without(hash, b).next()
    }
}

impl Ranking for JumpHash {
    type Ranked<'a> = Fallback<'a>;

    fn ranked_hash(&self, hash: u64) -> Fallback<'_> {
        Fallback::new(self.pick_hash(hash), &self.fallback, hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_above_one_are_refused() {
        let err = JumpHash::new(NodeSet::parse("a,b:weight=2").expect("valid")).expect_err("weighted");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.to_string().contains("'b' has weight 2"));
    }

    #[test]
    fn zero_buckets_do_not_panic() {
        assert_eq!(jump_consistent_hash(42, 0), 0);
        let t = JumpHash::new(NodeSet::try_new([]).expect("valid")).expect("ok");
        assert_eq!(t.pick_hash(1), None);
        let t = JumpHash::new(NodeSet::parse("a:weight=0").expect("valid")).expect("ok");
        assert_eq!(t.pick_hash(1), None);
    }
}

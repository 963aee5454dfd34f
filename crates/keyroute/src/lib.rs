//! # keyroute: which of N nodes gets this key?
//!
//! Every request or key must go to one of N nodes: a cache server, a shard, a thumbnail worker.
//! keyroute answers with every strategy worth knowing, each with its published guarantee proven by
//! tests, deterministic across processes and platforms, and fast.
//!
//! The answer depends on what the chooser may know. A counter knows nothing ([`RoundRobin`]); a hash
//! knows the key, so the same key finds the same node and its warm cache ([`Rendezvous`],
//! [`HashRing`], ...); a load-aware rule knows the nodes ([`PowerOfChoices`]); and the hybrids know
//! both ([`BoundedLoad`], [`choices::affinity`]).
//!
//! ## Which strategy when
//!
//! | name | type | guarantee | lookup | choose it for |
//! |---|---|---|---|---|
//! | `rendezvous` | [`Rendezvous`] | minimal movement; best balance; weights by the log method; ranked list | `O(n)`, ~0.5 ns/node | cache-affine fleets up to a few hundred nodes (the default) |
//! | `ring` | [`HashRing`] | minimal movement; balance `~1/sqrt(V)`; preference list | `O(1)` (bucket index) | thousands of nodes; ring-compatible clients; replication |
//! | `maglev` | [`Maglev`] | near-perfect balance; small excess movement | `O(1)`, one read | lookup-heavy balancers, connection hashing |
//! | `jump` | [`JumpHash`] | perfect balance; minimal movement if only the last bucket (in name order) changes | `O(ln n)`, no memory | numbered shards that only grow |
//! | `slots` | [`SlotTable`] | rendezvous over 16,384 slots, no node above `s + 3 sqrt(s)`; explicit move plans | `O(1)` | sharded stores; Redis Cluster |
//! | `modulo` | [`Modulo`] | balance; **no** stability (`N/(N+1)` of keys move) | `O(1)` | fixed fleets; the control in experiments |
//! | `bounded-ring`, `bounded-rendezvous` | [`BoundedLoad`] | no node above `ceil((1+e) x mean)` while any has room | ranking walk | hot keys on a cache-affine fleet |
//! | `affinity` | [`choices::affinity`] | less loaded of the key's top two | two scores | locality and load at once |
//! | `p2c` | [`PowerOfChoices`] | max load `~ln ln n` (vs `ln n / ln ln n`) | `O(1)` | work any node can do; slow-node avoidance |
//! | `least-loaded` | [`LeastLoaded`] | optimal with one fresh view; herds with several stale ones | `O(n)` | a single balancer with exact counts |
//! | hot keys | [`hot`] | a key above a rate gets the least loaded of its top `ceil(rate / per_replica)` owners, with hysteresis; Space-Saving error `<= N / k` | ~5 ns/request to detect | a key that one node cannot serve alone |
//! | warm-up | [`warm`] | a newcomer's keys reach it as a trickle (a share `p` of them, a growing set); nobody else's move | one mix | scale-out and recovery without a cold cache |
//! | steering | [`steer`] | hot replicas, then handoff, then slow start, then the strategy: one pure rule for gateway and simulator | the strategy's, plus one mix for a warming owner | whatever the fleet runs: it is how the others combine |
//! | `round-robin`, `weighted-round-robin` | [`RoundRobin`], [`SmoothWeighted`] | equal (weighted) turns, smoothly interleaved | `O(1)`, `O(n)` | cheap uniform requests, stateless nodes |
//! | `nginx`, `twemproxy`, `libketama`, `redis-cluster`, `guava`, `haproxy`, `envoy-ring-hash`, `envoy-maglev`, `groupcache` | [`compat`] | every key where the named system puts it (checked against the real programs) | the original's | moving a fleet over with no key moving |
//!
//! ## The model
//!
//! - A [`Node`] has a name (its identity for hashing), a weight (0 = drained: owns nothing) and an
//!   optional zone; a [`NodeSet`] is a validated set of them.
//! - Each hash strategy is an **immutable table** built from a node set, and a **function of the
//!   set alone**: the same names and weights give the same placement whatever order they are
//!   listed in or history they came from, on every process (tested through random join, leave and
//!   reweight histories). A membership or weight
//!   change builds a new table, and whoever serves lookups swaps it in atomically (never edit a
//!   table that others read). Builds are fast enough to run on every change.
//! - Lookups are **total**: an empty set, or one whose nodes are all drained, answers `None`.
//! - [`Placement::pick`] gives a key's node; [`Ranking::ranked`] gives the distinct live nodes in
//!   the key's preference order, lazily, the first always equal to the pick: failover goes to the
//!   second, replicas live on the first `k`. [`ZoneAware`] spreads those across zones.
//! - The key hash and every node hash are a public contract ([`hash`]), locked by golden vectors.
//! - No I/O, no clock, no operating-system randomness: randomness is injected
//!   ([`hash::RandomSource`]), so everything here is reproducible.
//!
//! ## Example
//!
//! ```
//! use keyroute::{NodeSet, Placement, Ranking, Rendezvous, ZoneAware};
//!
//! let nodes = NodeSet::parse("w1:zone=a,w2:zone=a,w3:zone=b,w4:weight=2:zone=c")?;
//! let table = Rendezvous::new(nodes.clone());
//!
//! let owner = table.pick(b"cat.jpg:200x200").expect("non-empty");
//! // Three replicas in three zones.
//! let replicas: Vec<&str> = ZoneAware::new(table.ranked(b"cat.jpg:200x200"), &nodes)
//!     .take(3)
//!     .map(|i| nodes.nodes()[i].name())
//!     .collect();
//! assert_eq!(replicas[0], owner.name());
//! # Ok::<(), keyroute::Error>(())
//! ```

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod error;
pub mod node;
mod strategy;

pub mod bounded;
pub mod choices;
pub mod compat;
pub mod hash;
pub mod hot;
pub mod jump;
pub mod key;
pub mod maglev;
pub mod modulo;
pub mod rendezvous;
pub mod replicas;
pub mod ring;
pub mod round_robin;
pub mod slots;
pub mod steer;
pub mod warm;

pub use bounded::{BoundedLoad, Choice};
pub use choices::{LeastLoaded, LoadView, PowerOfChoices};
pub use error::{Error, ErrorKind};
pub use jump::JumpHash;
pub use maglev::Maglev;
pub use modulo::Modulo;
pub use node::{Node, NodeSet};
pub use rendezvous::Rendezvous;
pub use replicas::ZoneAware;
pub use ring::{HashRing, HashRingBuilder, RingScheme};
pub use round_robin::{RoundRobin, SmoothWeighted};
pub use slots::{MovePlan, SlotMove, SlotTable};
pub use strategy::{AnyRanked, Decision, Options, Policy, Spill, Strategy, Table};

/// A table that places keys on nodes: the one required capability of every hash strategy.
pub trait Placement {
    /// The node set the table was built from; indices returned by the table index into it.
    fn nodes(&self) -> &NodeSet;

    /// The key's hash as this table computes it (see [`hash`] for the contract).
    fn key_hash(&self, key: &[u8]) -> u64;

    /// The index of the node owning a pre-hashed key, or `None` if no node is live.
    fn pick_hash(&self, hash: u64) -> Option<usize>;

    /// The index of the node owning `key`.
    #[inline]
    fn pick_index(&self, key: &[u8]) -> Option<usize> {
        self.pick_hash(self.key_hash(key))
    }

    /// The node owning `key`.
    #[inline]
    fn pick(&self, key: &[u8]) -> Option<&Node> {
        self.pick_index(key).and_then(|i| self.nodes().get(i))
    }
}

/// A table that can rank every live node for a key: the preference list.
///
/// The ranking yields distinct node indices, lazily, the first always equal to
/// [`Placement::pick_hash`]. Strategies without a natural ranking (modulo, jump, Maglev, slots)
/// continue after their pick with the key's weighted rendezvous order over the other live nodes, so
/// failover along the list moves only the failed node's keys.
pub trait Ranking: Placement {
    /// The ranking iterator.
    type Ranked<'a>: Iterator<Item = usize>
    where
        Self: 'a;

    /// The ranking of a pre-hashed key.
    fn ranked_hash(&self, hash: u64) -> Self::Ranked<'_>;

    /// The ranking of `key`.
    #[inline]
    fn ranked(&self, key: &[u8]) -> Self::Ranked<'_> {
        self.ranked_hash(self.key_hash(key))
    }

    /// The first `k` distinct nodes of `key`'s ranking: where a key with `k` replicas lives.
    fn preference_list(&self, key: &[u8], k: usize) -> Vec<&Node> {
        let nodes = self.nodes();
        self.ranked(key).take(k).filter_map(|i| nodes.get(i)).collect()
    }
}

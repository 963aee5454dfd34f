//! Strategies by name, and [`Policy`]: one strategy, built over a node set, ready to decide.
//!
//! The CLI, the simulator and the gateway all choose a strategy by the same name (the table in the
//! [crate documentation](crate)), and all decide through [`Policy::decide`], so a simulated fleet
//! and a real one route the same request to the same node.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use crate::hash::{KeyHasher, RandomSource};
use crate::{
    BoundedLoad, Error, HashRing, JumpHash, LeastLoaded, LoadView, Maglev, Modulo, NodeSet, Placement, PowerOfChoices,
    Ranking, Rendezvous, RingScheme, RoundRobin, SlotTable, SmoothWeighted,
};

/// Every strategy keyroute implements, by its one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// `modulo`: hash mod N ([`Modulo`]).
    Modulo,
    /// `ring`: consistent hash ring with virtual nodes ([`HashRing`]).
    Ring,
    /// `rendezvous`: highest random weight ([`Rendezvous`]).
    Rendezvous,
    /// `jump`: jump consistent hash ([`JumpHash`]).
    Jump,
    /// `maglev`: Maglev lookup table ([`Maglev`]).
    Maglev,
    /// `slots`: Redis Cluster's 16,384 slots ([`SlotTable`]).
    Slots,
    /// `bounded-ring`: the ring's ranking with bounded loads ([`BoundedLoad`]).
    BoundedRing,
    /// `bounded-rendezvous`: the rendezvous ranking with bounded loads.
    BoundedRendezvous,
    /// `round-robin`: plain round robin ([`RoundRobin`]).
    RoundRobin,
    /// `weighted-round-robin`: NGINX's smooth weighted round robin ([`SmoothWeighted`]).
    WeightedRoundRobin,
    /// `p2c`: power of two random choices on load ([`PowerOfChoices`]).
    P2c,
    /// `least-loaded`: always the least loaded node ([`LeastLoaded`]).
    LeastLoaded,
    /// `affinity`: two choices among the key's top-2 rendezvous owners ([`affinity`](crate::choices::affinity)).
    Affinity,
    /// A compatibility mode, by the mode's name (`nginx`, `haproxy`, ...): placement exactly as
    /// a deployed system does it ([`crate::compat`]).
    Compat(crate::compat::Mode),
}

impl Strategy {
    /// All strategies, in the order of the documentation.
    pub const ALL: [Strategy; 13] = [
        Strategy::Modulo,
        Strategy::Ring,
        Strategy::Rendezvous,
        Strategy::Jump,
        Strategy::Maglev,
        Strategy::Slots,
        Strategy::BoundedRing,
        Strategy::BoundedRendezvous,
        Strategy::RoundRobin,
        Strategy::WeightedRoundRobin,
        Strategy::P2c,
        Strategy::LeastLoaded,
        Strategy::Affinity,
    ];

    /// The strategy's name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Compat(mode) => mode.name(),
            Strategy::Modulo => "modulo",
            Strategy::Ring => "ring",
            Strategy::Rendezvous => "rendezvous",
            Strategy::Jump => "jump",
            Strategy::Maglev => "maglev",
            Strategy::Slots => "slots",
            Strategy::BoundedRing => "bounded-ring",
            Strategy::BoundedRendezvous => "bounded-rendezvous",
            Strategy::RoundRobin => "round-robin",
            Strategy::WeightedRoundRobin => "weighted-round-robin",
            Strategy::P2c => "p2c",
            Strategy::LeastLoaded => "least-loaded",
            Strategy::Affinity => "affinity",
        }
    }

    /// Whether the strategy places by key (and so has an owner per key and caches affinity).
    pub fn uses_key(self) -> bool {
        !matches!(self, Strategy::RoundRobin | Strategy::WeightedRoundRobin | Strategy::P2c | Strategy::LeastLoaded)
    }

    /// Whether the strategy places this key by its hash: it places by key, and the key is not one
    /// its original does not hash (nginx and HAProxy send an empty key round robin).
    pub fn hashes_key(self, key: &[u8]) -> bool {
        self.uses_key() && !(key.is_empty() && matches!(self, Strategy::Compat(m) if !m.hashes_empty_key()))
    }

    /// Whether the strategy reads loads.
    pub fn uses_load(self) -> bool {
        matches!(
            self,
            Strategy::BoundedRing
                | Strategy::BoundedRendezvous
                | Strategy::P2c
                | Strategy::LeastLoaded
                | Strategy::Affinity
        )
    }

    /// Whether key placement is a pure function of the key and the node set (no load involved), so
    /// that "keys moved" on a membership change is well defined.
    pub fn is_pure_hash(self) -> bool {
        self.uses_key() && !self.uses_load()
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = Error;

    /// # Errors
    ///
    /// An unknown name gives an error listing every valid one.
    fn from_str(s: &str) -> Result<Self, Error> {
        let alias = match s {
            "hash" | "mod" => "modulo",
            "consistent" | "ketama" => "ring",
            "hrw" => "rendezvous",
            "rr" => "round-robin",
            "wrr" | "swrr" => "weighted-round-robin",
            "least-conn" | "least-request" => "least-loaded",
            other => other,
        };
        if let Some(mode) = crate::compat::Mode::ALL.into_iter().find(|m| m.name() == alias) {
            return Ok(Strategy::Compat(mode));
        }
        Strategy::ALL.into_iter().find(|st| st.name() == alias).ok_or_else(|| {
            let names: Vec<&str> = Strategy::ALL.iter().map(|st| st.name()).collect();
            let modes: Vec<&str> = crate::compat::Mode::ALL.iter().map(|m| m.name()).collect();
            Error::invalid_parameter(format!(
                "unknown strategy '{s}' (valid: {}; compatibility modes: {})",
                names.join(", "),
                modes.join(", ")
            ))
        })
    }
}

/// The knobs of every strategy, with their defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Key hash (default XXH3-64, seed 0).
    pub hasher: KeyHasher,
    /// Ring points per unit of weight (default 160).
    pub vnodes: u32,
    /// Ring point scheme (default [`RingScheme::Xxh3`]).
    pub scheme: RingScheme,
    /// Maglev table size (default 65,537).
    pub maglev_size: u32,
    /// Bounded-load epsilon: capacity is `(1 + e)` times the mean (default 0.25).
    pub epsilon: f64,
    /// Choices for `p2c` (default 2) and candidates for `affinity` (the key's top `d`).
    pub choices: usize,
    /// The parameters of the compatibility modes.
    pub compat: crate::compat::CompatOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hasher: KeyHasher::default(),
            vnodes: crate::ring::DEFAULT_VNODES,
            scheme: RingScheme::default(),
            maglev_size: crate::maglev::DEFAULT_TABLE_SIZE,
            epsilon: 0.25,
            choices: 2,
            compat: crate::compat::CompatOptions::default(),
        }
    }
}

/// One of the hash tables, chosen at run time.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Table {
    /// [`Modulo`].
    Modulo(Modulo),
    /// [`HashRing`].
    Ring(HashRing),
    /// [`Rendezvous`].
    Rendezvous(Rendezvous),
    /// [`JumpHash`].
    Jump(JumpHash),
    /// [`Maglev`].
    Maglev(Maglev),
    /// [`SlotTable`].
    Slots(SlotTable),
    /// A compatibility mode ([`crate::compat::CompatTable`]).
    Compat(crate::compat::CompatTable),
}

macro_rules! each_table {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            Table::Modulo($t) => $e,
            Table::Ring($t) => $e,
            Table::Rendezvous($t) => $e,
            Table::Jump($t) => $e,
            Table::Maglev($t) => $e,
            Table::Slots($t) => $e,
            Table::Compat($t) => $e,
        }
    };
}

impl Table {
    /// Builds the hash table a strategy ranks keys with (`ring` for `bounded-ring`, `rendezvous` for
    /// `bounded-rendezvous` and `affinity`); `None` for strategies that ignore keys.
    ///
    /// # Errors
    ///
    /// The table's own construction errors.
    pub fn build(strategy: Strategy, nodes: NodeSet, options: &Options) -> Result<Option<Table>, Error> {
        let table = match strategy {
            Strategy::Modulo => Table::Modulo(Modulo::with_hasher(nodes, options.hasher)?),
            Strategy::Ring | Strategy::BoundedRing => Table::Ring(
                HashRing::builder()
                    .vnodes(options.vnodes)
                    .scheme(options.scheme)
                    .hasher(options.hasher)
                    .build(nodes)?,
            ),
            Strategy::Rendezvous | Strategy::BoundedRendezvous | Strategy::Affinity => {
                Table::Rendezvous(Rendezvous::with_hasher(nodes, options.hasher))
            }
            Strategy::Jump => Table::Jump(JumpHash::with_hasher(nodes, options.hasher)?),
            Strategy::Maglev => Table::Maglev(Maglev::with_size(nodes, options.maglev_size, options.hasher)?),
            Strategy::Slots => Table::Slots(SlotTable::new(nodes)),
            Strategy::Compat(mode) => Table::Compat(crate::compat::CompatTable::build(mode, nodes, &options.compat)?),
            _ => return Ok(None),
        };
        Ok(Some(table))
    }

    /// The table of the same strategy and options for a changed node set. Every table is a function
    /// of its node set, so this is a fresh build: the result does not depend on this table.
    ///
    /// # Errors
    ///
    /// The table's own construction errors.
    pub fn rebuild(&self, nodes: NodeSet, options: &Options) -> Result<Table, Error> {
        let strategy = match self {
            Table::Slots(_) => Strategy::Slots,
            Table::Modulo(_) => Strategy::Modulo,
            Table::Ring(_) => Strategy::Ring,
            Table::Rendezvous(_) => Strategy::Rendezvous,
            Table::Jump(_) => Strategy::Jump,
            Table::Maglev(_) => Strategy::Maglev,
            Table::Compat(t) => Strategy::Compat(t.mode()),
        };
        Table::build(strategy, nodes, options)?.ok_or_else(|| Error::invalid_parameter("not a hash strategy"))
    }

    /// The key's ranking: distinct live nodes, owner first.
    pub fn ranked_hash(&self, hash: u64) -> AnyRanked<'_> {
        match self {
            Table::Modulo(t) => AnyRanked::Fallback(t.ranked_hash(hash)),
            Table::Ring(t) => AnyRanked::Ring(t.ranked_hash(hash)),
            Table::Rendezvous(t) => AnyRanked::Rendezvous(t.ranked_hash(hash)),
            Table::Jump(t) => AnyRanked::Fallback(t.ranked_hash(hash)),
            Table::Maglev(t) => AnyRanked::Fallback(t.ranked_hash(hash)),
            Table::Slots(t) => AnyRanked::Fallback(t.ranked_hash(hash)),
            Table::Compat(t) => AnyRanked::Compat(t.ranked_hash(hash)),
        }
    }
}

impl Placement for Table {
    fn nodes(&self) -> &NodeSet {
        each_table!(self, t => t.nodes())
    }

    fn key_hash(&self, key: &[u8]) -> u64 {
        each_table!(self, t => t.key_hash(key))
    }

    fn pick_hash(&self, hash: u64) -> Option<usize> {
        each_table!(self, t => t.pick_hash(hash))
    }
}

impl Ranking for Table {
    type Ranked<'a> = AnyRanked<'a>;

    fn ranked_hash(&self, hash: u64) -> AnyRanked<'_> {
        Table::ranked_hash(self, hash)
    }
}

/// The ranking iterator of a [`Table`].
#[derive(Clone, Debug)]
pub enum AnyRanked<'a> {
    /// A ring walk.
    Ring(crate::ring::RingRanked<'a>),
    /// A rendezvous ranking.
    Rendezvous(crate::rendezvous::RendezvousRanked<'a>),
    /// A pick followed by the rendezvous order of the rest.
    Fallback(crate::rendezvous::Fallback<'a>),
    /// A compatibility mode's ranking.
    Compat(crate::compat::CompatRanked<'a>),
}

impl Iterator for AnyRanked<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        match self {
            AnyRanked::Ring(r) => r.next(),
            AnyRanked::Rendezvous(r) => r.next(),
            AnyRanked::Fallback(r) => r.next(),
            AnyRanked::Compat(r) => r.next(),
        }
    }
}

/// Why a request did not go to its key's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Spill {
    /// The owner was not eligible (unhealthy, ejected, draining, already tried).
    Unavailable,
    /// The owner was over its bounded-load capacity, or (affinity) more loaded than the runner-up.
    Overloaded,
    /// A hot key served by one of its other replicas ([`crate::hot`]): less loaded than the owner.
    Replica,
    /// The owner is warming up and the key is not admitted to it yet ([`crate::warm`]).
    Warming,
}

/// A placement decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The chosen node.
    pub node: usize,
    /// The key's owner, for strategies that place by key (whether or not it was chosen).
    pub owner: Option<usize>,
    /// Why the chosen node is not the owner, if it is not.
    pub spill: Option<Spill>,
}

/// One strategy over one node set, with its state (round-robin counters): what a gateway pool or a
/// simulated gateway holds, rebuilt and swapped whole when membership or weights change.
#[derive(Debug)]
pub struct Policy {
    strategy: Strategy,
    options: Options,
    nodes: NodeSet,
    /// Shared by the forks of one build ([`Policy::fork`]): a table is immutable.
    table: Option<std::sync::Arc<Table>>,
    rr: RoundRobin,
    wrr: Mutex<SmoothWeighted>,
    bounded: BoundedLoad,
    choices: PowerOfChoices,
}

impl Policy {
    /// Builds the strategy over `nodes`.
    ///
    /// # Errors
    ///
    /// Invalid options (epsilon, choices, vnodes, Maglev size) or the table's construction errors.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyroute::{NodeSet, Options, Policy, Strategy, hash::SplitMix64};
    /// let nodes = NodeSet::parse("a,b,c")?;
    /// let policy = Policy::build(Strategy::BoundedRendezvous, nodes, &Options::default())?;
    /// let hash = policy.key_hash(b"cat.jpg");
    /// let loads = [0u64, 0, 0];
    /// let d = policy.decide(Some(hash), &loads[..], |_| true, &mut SplitMix64::new(1)).expect("a node");
    /// assert_eq!(Some(d.node), d.owner);
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn build(strategy: Strategy, nodes: NodeSet, options: &Options) -> Result<Self, Error> {
        let bounded = BoundedLoad::try_new(options.epsilon)?;
        let choices = PowerOfChoices::new(options.choices)?;
        // A compatibility mode's original refuses a set with no weight (twemproxy, libketama,
        // `redis-cli --cluster create`...), and so does its table. A policy over such a set is
        // a pool whose members are still to come (a membership source that has not answered, a
        // fleet drained to nothing): it places nothing, as every other strategy's empty policy.
        let table = match strategy {
            Strategy::Compat(_) if nodes.live_count() == 0 => None,
            _ => Table::build(strategy, nodes.clone(), options)?.map(std::sync::Arc::new),
        };
        Ok(Policy {
            strategy,
            options: *options,
            rr: RoundRobin::new(&nodes),
            wrr: Mutex::new(SmoothWeighted::new(&nodes)),
            nodes,
            table,
            bounded,
            choices,
        })
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The options it was built with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The node set.
    pub fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// The hash table, for strategies that place by key.
    pub fn table(&self) -> Option<&Table> {
        self.table.as_deref()
    }

    /// The same policy with its own round-robin state and the same table, shared (not copied):
    /// what many gateways over one member set hold, at the memory of one table.
    pub fn fork(&self) -> Policy {
        Policy {
            strategy: self.strategy,
            options: self.options,
            nodes: self.nodes.clone(),
            table: self.table.clone(),
            rr: RoundRobin::new(&self.nodes),
            wrr: Mutex::new(SmoothWeighted::new(&self.nodes)),
            bounded: self.bounded,
            choices: self.choices,
        }
    }

    /// The key's hash as the strategy's table computes it (XXH3 of the key without a table).
    pub fn key_hash(&self, key: &[u8]) -> u64 {
        match &self.table {
            Some(t) => t.key_hash(key),
            None => self.options.hasher.hash(key),
        }
    }

    /// The policy of the same strategy and options for a changed node set (a fresh build: see
    /// [`Table::rebuild`]).
    ///
    /// # Errors
    ///
    /// As [`Policy::build`].
    pub fn rebuild(&self, nodes: NodeSet) -> Result<Policy, Error> {
        Policy::build(self.strategy, nodes, &self.options)
    }

    /// The key's owner: the first node of its ranking, ignoring health and load.
    pub fn owner(&self, hash: u64) -> Option<usize> {
        self.table.as_ref()?.pick_hash(hash)
    }

    /// The key's full ranking (owner first), ignoring health and load; empty for strategies that
    /// ignore keys.
    pub fn ranked(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        self.table.iter().flat_map(move |t| t.ranked_hash(hash))
    }

    /// Chooses a node for a request.
    ///
    /// - `hash`: the key's hash ([`Policy::key_hash`]), or `None` when the request has no key, in
    ///   which case key strategies fall back to power of two choices.
    /// - `loads`: the current load per node (in-flight requests), read by load-aware strategies.
    /// - `eligible`: whether a node may be used now (healthy, not draining, not already tried).
    /// - `rng`: randomness for p2c and least-loaded tie breaks.
    ///
    /// Returns `None` only if no live node is eligible.
    pub fn decide<L, R>(
        &self,
        hash: Option<u64>,
        loads: &L,
        eligible: impl Fn(usize) -> bool,
        rng: &mut R,
    ) -> Option<Decision>
    where
        L: LoadView + ?Sized,
        R: RandomSource + ?Sized,
    {
        let plain = |node: usize| Decision { node, owner: None, spill: None };
        let candidates =
            || -> Vec<u32> { self.nodes.live().iter().copied().filter(|&i| eligible(i as usize)).collect() };
        match (self.strategy, hash, &self.table) {
            (Strategy::RoundRobin, _, _) => self.rr.pick_among(&eligible).map(plain),
            (Strategy::WeightedRoundRobin, _, _) => {
                let mut wrr = self.wrr.lock().unwrap_or_else(|e| e.into_inner());
                wrr.next_among(&eligible).map(plain)
            }
            (Strategy::LeastLoaded, _, _) => LeastLoaded.pick(&self.nodes, &candidates(), loads, rng).map(plain),
            (Strategy::P2c, _, _) | (_, None, _) | (_, _, None) => {
                self.choices.pick(&self.nodes, &candidates(), loads, rng).map(plain)
            }
            (strategy, Some(h), Some(table)) => {
                let owner = table.pick_hash(h);
                let choice = match strategy {
                    Strategy::BoundedRing | Strategy::BoundedRendezvous => {
                        self.bounded.pick(table.ranked_hash(h), &self.nodes, loads, &eligible)?
                    }
                    Strategy::Affinity => crate::choices::affinity(
                        table.ranked_hash(h),
                        self.options.choices,
                        &self.nodes,
                        loads,
                        &eligible,
                    )?,
                    _ => {
                        // The owner is the ranking's first: take it without ranking the rest
                        // (a rendezvous pick is one pass; its ranking is more).
                        let node = match owner {
                            Some(o) if eligible(o) => o,
                            _ => table.ranked_hash(h).find(|&i| eligible(i))?,
                        };
                        crate::Choice { node, rank: 0 }
                    }
                };
                Some(Decision::spilled(choice.node, owner, &eligible, Spill::Overloaded))
            }
        }
    }
}

impl Decision {
    /// The decision for `node` when the key's owner is `owner`: no spill when they are the same;
    /// `passed_over` (overloaded, or a replica chosen) when the owner was eligible; unavailable
    /// otherwise.
    fn spilled(node: usize, owner: Option<usize>, eligible: impl Fn(usize) -> bool, passed_over: Spill) -> Self {
        let spill = if Some(node) == owner {
            None
        } else if owner.is_some_and(eligible) {
            Some(passed_over)
        } else {
            Some(Spill::Unavailable)
        };
        Decision { node, owner, spill }
    }
}

impl Policy {
    /// Chooses a node for a hot key with `replicas` replicas ([`crate::hot::pick_replica`]): the
    /// least loaded eligible node of the first `replicas` of its ranking. Falls back to
    /// [`Policy::decide`] for strategies that do not place by key, or for `replicas <= 1`.
    pub fn decide_replicated<L, R>(
        &self,
        hash: u64,
        replicas: usize,
        loads: &L,
        eligible: impl Fn(usize) -> bool,
        rng: &mut R,
    ) -> Option<Decision>
    where
        L: LoadView + ?Sized,
        R: RandomSource + ?Sized,
    {
        let Some(table) = self.table.as_ref().filter(|_| replicas > 1 && self.strategy.uses_key()) else {
            return self.decide(Some(hash), loads, eligible, rng);
        };
        let owner = table.pick_hash(hash);
        let choice = crate::hot::pick_replica(table.ranked_hash(hash), replicas, &self.nodes, loads, &eligible)?;
        // An eligible owner is first of the replicas, so a choice past them means it was not.
        Some(Decision::spilled(choice.node, owner, &eligible, Spill::Replica))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;

    #[test]
    fn names_round_trip_and_unknown_lists_all() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>().expect("parses"), s);
        }
        let err = "fastest".parse::<Strategy>().expect_err("unknown");
        for s in Strategy::ALL {
            assert!(err.to_string().contains(s.name()), "{err}");
        }
    }

    #[test]
    fn every_strategy_decides_and_respects_eligibility() {
        let nodes = NodeSet::parse("a,b,c,d:weight=0").expect("valid");
        let mut rng = SplitMix64::new(1);
        let loads = [0u64; 4];
        for s in Strategy::ALL {
            let p = Policy::build(s, nodes.clone(), &Options::default()).expect("builds");
            for k in 0..200u32 {
                let h = p.key_hash(&k.to_be_bytes());
                let d = p.decide(Some(h), &loads[..], |i| i != 1, &mut rng).expect("a node");
                assert!(d.node == 0 || d.node == 2, "{s}: {d:?}");
                if s.uses_key() {
                    assert!(d.owner.is_some(), "{s}");
                    assert_eq!(d.spill.is_some(), d.owner != Some(d.node), "{s}");
                }
            }
            assert_eq!(p.decide(Some(1), &loads[..], |_| false, &mut rng), None, "{s}");
        }
    }

    #[test]
    fn nginx_and_haproxy_modes_do_not_hash_an_empty_key() {
        use crate::compat::Mode;
        assert!(!Strategy::Compat(Mode::Nginx).hashes_key(b""));
        assert!(!Strategy::Compat(Mode::Haproxy).hashes_key(b""));
        assert!(Strategy::Compat(Mode::Haproxy).hashes_key(b"k"));
        assert!(Strategy::Compat(Mode::Twemproxy).hashes_key(b""));
        assert!(Strategy::Rendezvous.hashes_key(b""));
        assert!(!Strategy::P2c.hashes_key(b"k"));
    }

    #[test]
    fn an_empty_pool_decides_nothing() {
        let mut rng = SplitMix64::new(1);
        for s in Strategy::ALL {
            let p = Policy::build(s, NodeSet::empty(), &Options::default()).expect("builds");
            assert_eq!(p.decide(Some(7), &[0u64; 0][..], |_| true, &mut rng), None, "{s}");
            assert_eq!(p.decide(None, &[0u64; 0][..], |_| true, &mut rng), None, "{s}");
        }
    }

    /// Issue 31 (10): a compatibility mode's policy over no weighted member places nothing
    /// instead of failing, as every other strategy's (a pool whose members come from etcd
    /// starts empty); its table alone still refuses the set, as the original does.
    #[test]
    fn an_empty_compat_policy_places_nothing() {
        for mode in [
            crate::compat::Mode::Twemproxy,
            crate::compat::Mode::Libketama,
            crate::compat::Mode::RedisCluster,
            crate::compat::Mode::Nginx,
            crate::compat::Mode::Haproxy,
        ] {
            let empty = NodeSet::parse("").expect("empty");
            let policy = Policy::build(Strategy::Compat(mode), empty, &Options::default()).expect("an empty policy");
            let hash = policy.key_hash(b"k");
            assert!(policy.decide(Some(hash), &[0u64; 0][..], |_| true, &mut SplitMix64::new(1)).is_none());
            assert_eq!(policy.owner(hash), None);
        }
        assert!(
            Table::build(
                Strategy::Compat(crate::compat::Mode::Twemproxy),
                NodeSet::parse("").expect("empty"),
                &Options::default()
            )
            .is_err()
        );
    }
}

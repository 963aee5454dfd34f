//! What a request reads from its pool: one immutable value holding the configuration, the
//! placement table over the members (and so their weights), and the members themselves.

use std::fmt;
use std::sync::Arc;

use keyroute::hash::SplitMix64;
use keyroute::steer::{Steering, steer};
use keyroute::warm::{Handoff, admitted};
use keyroute::{Decision, Node, Policy};
use tokio::time::Instant;

use super::endpoint::{State, WorkerState};
use crate::config::PoolConfig;

/// Why no worker could take a request: the true reason of a 503.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// The pool has no members.
    NoWorkers,
    /// Every member has weight 0.
    AllDrained,
    /// Every member with weight is in this state (or was already tried, for `Healthy`).
    All(State),
    /// Members with weight are in several states: how many in each.
    Mixed {
        /// (state, count), for the states present.
        states: Vec<(State, usize)>,
    },
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoWorkers => f.write_str("the pool has no workers"),
            Unavailable::AllDrained => f.write_str("every worker has weight 0"),
            Unavailable::All(State::Healthy) => f.write_str("every available worker was tried"),
            Unavailable::All(s) => write!(f, "every worker is {}", s.name()),
            Unavailable::Mixed { states } => {
                let parts: Vec<String> = states.iter().map(|(s, n)| format!("{n} {}", s.name())).collect();
                write!(f, "no worker is available ({})", parts.join(", "))
            }
        }
    }
}

impl Unavailable {
    /// The public reason class of a 503.
    pub fn reason(&self) -> &'static str {
        match self {
            Unavailable::NoWorkers => "pool_empty",
            Unavailable::AllDrained => "all_weights_zero",
            Unavailable::All(state) => match state {
                State::Unhealthy => "all_unhealthy",
                State::Ejected => "all_ejected",
                State::Draining => "all_draining",
                State::Stalled => "all_stalled",
                State::Healthy => "all_tried",
                State::Loop => "all_loop",
            },
            Unavailable::Mixed { .. } => "all_unavailable",
        }
    }
}

/// How many times the pool's own table a what-if's may be: a change that doubles a pool's
/// capacity is a question worth answering; one that makes it a thousand times larger is not a
/// change anyone applies.
pub const WHAT_IF_GROWTH: u64 = 4;

/// The entries a what-if's table may have whatever the pool's own size: a pool of a few workers
/// can be asked about one of any weight it could sensibly get (a ring of 160 points per unit of
/// weight: 400 units).
pub const WHAT_IF_FLOOR: u64 = 65_536;

/// A hypothetical change of a pool's members (see [`Snapshot::what_if`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhatIf {
    /// Workers to add, with their weights.
    pub add: Vec<(String, u32)>,
    /// Workers to remove.
    pub remove: Vec<String>,
    /// Workers to give a new weight.
    pub reweight: Vec<(String, u32)>,
}

impl WhatIf {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty() && self.reweight.is_empty()
    }
}

/// Everything a request needs from its pool, swapped atomically.
#[derive(Debug)]
pub struct Snapshot {
    /// Incremented by every change.
    pub(crate) generation: u64,
    /// The pool's configuration (its worker list is the configured one; `workers` is current).
    pub(crate) config: Arc<PoolConfig>,
    /// The placement policy over `workers`: its node set holds each member's weight.
    pub(crate) policy: Policy,
    /// The members, in the policy's node order.
    pub(crate) workers: Vec<Arc<WorkerState>>,
    /// The pool's hot keys, when `hot_keys` is on (the same state across membership changes).
    pub(crate) hot: Option<Arc<crate::pool::hot::HotKeysState>>,
    /// Previous-owner handoff for the workers that joined within the `handoff` window.
    pub(crate) warm: Option<Warm>,
}

/// The handoff of a snapshot: the table without the workers that joined within the window, and
/// when each of them joined.
#[derive(Debug)]
pub(crate) struct Warm {
    pub(crate) handoff: Handoff,
    /// (member index, when it joined).
    pub(crate) since: Vec<(usize, Instant)>,
    pub(crate) window: std::time::Duration,
}

impl Warm {
    /// Member `i`'s handoff progress at `now`: the share of its keys it takes, 0 to 1 over the window.
    pub fn progress(&self, i: usize, now: Instant) -> f64 {
        let Some(&(_, since)) = self.since.iter().find(|(j, _)| *j == i) else { return 1.0 };
        let t = now.saturating_duration_since(since);
        if t >= self.window { 1.0 } else { t.as_secs_f64() / self.window.as_secs_f64() }
    }
}

impl Snapshot {
    /// Incremented by every change of the pool.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The pool's settings (its worker list is the configured one; [`Snapshot::workers`] is
    /// current).
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The placement table over the members.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The members, in the table's node order.
    pub fn workers(&self) -> &[Arc<WorkerState>] {
        &self.workers
    }

    /// The pool's hot keys, when `hot_keys` is on.
    pub fn hot(&self) -> Option<&Arc<crate::pool::hot::HotKeysState>> {
        self.hot.as_ref()
    }

    /// The member that owns `key` by the table alone (whether it is available is not asked), or
    /// `None` when the strategy does not place by key or the pool is empty.
    pub fn owner_of(&self, key: &[u8]) -> Option<&Arc<WorkerState>> {
        if !self.policy.strategy().hashes_key(key) {
            return None;
        }
        self.policy.owner(self.policy.key_hash(key)).and_then(|i| self.workers.get(i))
    }

    /// The member named `name`.
    pub fn worker(&self, name: &str) -> Option<(usize, &Arc<WorkerState>)> {
        self.workers.iter().enumerate().find(|(_, w)| w.name == name)
    }

    /// The members as a membership source would give them (configured weights, draining, at
    /// this gateway): what an edit of the member set starts from.
    pub fn members(&self) -> Vec<super::Member> {
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let state = w.state();
                super::Member {
                    worker: crate::config::WorkerConfig {
                        name: w.name.clone(),
                        address: w.address,
                        weight: self.weight(i),
                        zone: w.zone.clone(),
                        id: w.id,
                    },
                    draining: state == State::Draining,
                    at_this_gateway: state == State::Loop,
                }
            })
            .collect()
    }

    /// The table this pool would build after `change`, and its members' names in the table's
    /// order: the simulator's `whatif` for one pool, over its live table. Built like the pool's
    /// own (canonical name order, or the configured order for a static compatibility pool), and
    /// refused past the pool's table size limit.
    ///
    /// # Errors
    ///
    /// A name to remove or reweight that is not a member, one to add that is, or a set the
    /// strategy refuses, as text for the operator.
    pub fn what_if(&self, change: &WhatIf) -> Result<(Policy, Vec<String>), String> {
        let mut members: Vec<(String, u32, Option<String>, Option<u32>)> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), self.weight(i), w.zone.clone(), w.id))
            .collect();
        let position = |members: &[(String, u32, Option<String>, Option<u32>)], name: &str| {
            members.iter().position(|m| m.0 == name).ok_or_else(|| format!("no worker named '{}'", name.escape_debug()))
        };
        for name in &change.remove {
            let i = position(&members, name)?;
            members.remove(i);
        }
        for (name, weight) in &change.reweight {
            let i = position(&members, name)?;
            members[i].1 = *weight;
        }
        for (name, weight) in &change.add {
            if position(&members, name).is_ok() {
                return Err(format!("a worker named '{}' is already a member", name.escape_debug()));
            }
            members.push((name.clone(), *weight, None, None));
        }
        let keeps_order = matches!(self.config.strategy, keyroute::Strategy::Compat(_))
            && self.config.membership == crate::config::MembershipConfig::Static;
        if !keeps_order {
            members.sort_by(|a, b| keyroute::node::canonical_cmp(&a.0, &b.0));
        }
        let nodes = crate::table::node_set(members.iter().map(|(n, w, z, id)| (n.as_str(), *w, z.as_deref(), *id)))
            .map_err(|e| e.to_string())?;
        crate::table::check_table_size(self.config.strategy, &self.config.options, &nodes)
            .map_err(|e| e.to_string())?;
        self.check_what_if_size(&nodes)?;
        let policy = Policy::build(self.config.strategy, nodes, &self.config.options).map_err(|e| e.to_string())?;
        Ok((policy, members.into_iter().map(|m| m.0).collect()))
    }

    /// Refuses a what-if whose table would be more than [`WHAT_IF_GROWTH`] times this one's (or
    /// [`WHAT_IF_FLOOR`] entries, if more): a question about a change is answered from a table of
    /// the pool's own size, and nobody asking may make the gateway build one of millions
    /// (issue 31, defect 16: `add=big:24996` built 4,000,000 points for a pool of 480).
    fn check_what_if_size(&self, nodes: &keyroute::node::NodeSet) -> Result<(), String> {
        let (strategy, options) = (self.config.strategy, &self.config.options);
        let now = crate::table::table_entries(strategy, options, self.policy.nodes());
        let then = crate::table::table_entries(strategy, options, nodes);
        let limit = now.saturating_mul(WHAT_IF_GROWTH).max(WHAT_IF_FLOOR);
        if then > limit {
            return Err(format!(
                "the what-if's table would have {then} entries, more than {limit} ({WHAT_IF_GROWTH} times the pool's {now}); ask with lower weights"
            ));
        }
        Ok(())
    }

    /// Member `i`'s weight.
    pub fn weight(&self, i: usize) -> u32 {
        self.policy.nodes().get(i).map_or(0, Node::weight)
    }

    /// Member `i`'s routing state at `now`, with the pool's stall window.
    pub fn state(&self, i: usize, now: Instant) -> State {
        self.workers.get(i).map_or(State::Draining, |w| w.state_with(now, self.config.passive.stall))
    }

    /// Chooses a worker for a key hash (or none, for p2c), skipping unavailable workers and those in
    /// `tried`. Stalled workers are skipped too, unless no other worker is available: a stall
    /// steers traffic away, it never empties a pool.
    ///
    /// The moment's steering for `hash` is the core's one rule ([`keyroute::steer`]): hot replicas,
    /// then the handoff, then slow start, then the strategy, over the workers in state `want`.
    pub fn decide(&self, hash: Option<u64>, tried: &[usize], now: Instant) -> Option<Decision> {
        let replicas = match (hash, &self.hot) {
            (Some(h), Some(hot)) => hot.replicas(h),
            _ => 0,
        };
        self.steer(hash, replicas, tried, now)
    }

    /// [`Snapshot::decide`] for a request that must reach the key's owner even when the key is
    /// hot: a write of a store (or of a cache whose replicas hold copies), or a read whose answer
    /// differs by server (memcached's `gets` carries its server's CAS). The same rule, without
    /// hot-key replicas: the owner, or past it the handoff, slow start and failover as for any key.
    pub fn decide_owner(&self, hash: Option<u64>, tried: &[usize], now: Instant) -> Option<Decision> {
        self.steer(hash, 0, tried, now)
    }

    fn steer(&self, hash: Option<u64>, replicas: usize, tried: &[usize], now: Instant) -> Option<Decision> {
        let loads = |i: usize| self.workers.get(i).map_or(0, |w| w.in_flight());
        let progress = |i: usize| self.warm.as_ref().map_or(1.0, |w| w.progress(i, now));
        let held = |i: usize| hash.is_some_and(|h| self.held_back(i, h, now));
        let steering = Steering {
            replicas,
            handoff: self.warm.as_ref().map(|w| (&w.handoff, &progress as &dyn Fn(usize) -> f64)),
            held: self.config.slow_start.is_some().then_some(&held as &dyn Fn(usize) -> bool),
        };
        let pick = |want: State| {
            let eligible = |i: usize| !tried.contains(&i) && self.state(i, now) == want;
            RNG.with(|rng| steer(&self.policy, hash, &steering, &loads, eligible, &mut *rng.borrow_mut()))
        };
        pick(State::Healthy).or_else(|| pick(State::Stalled))
    }

    /// Whether slow start holds member `i` back for the key `hash` at `now`: it is warming, and the
    /// key is not admitted at its progress.
    fn held_back(&self, i: usize, hash: u64, now: Instant) -> bool {
        let (Some(ss), Some(w)) = (&self.config.slow_start, self.workers.get(i)) else { return false };
        let Some(elapsed) = w.warming_for(now) else { return false };
        if elapsed >= ss.ramp.window {
            return false;
        }
        let progress = if ss.by_hit_rate {
            let (hits, reports) = w.warm_reports();
            ss.ramp.progress_with_hits(elapsed, hits, reports, self.pool_hit_rate())
        } else {
            ss.ramp.progress(elapsed)
        };
        !admitted(hash, progress)
    }

    /// The pool's `X-Cache` hit rate over its members' lives (0 when none reports).
    fn pool_hit_rate(&self) -> f64 {
        let (hits, reports) =
            self.workers.iter().map(|w| w.cache_reports()).fold((0u64, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        if reports == 0 { 0.0 } else { hits as f64 / reports as f64 }
    }

    /// A replicated pool's copies of the key `hash` at `now`, in order: the first `n` healthy
    /// members of its ranking, or the stalled ones when none is healthy (a member down, ejected or
    /// draining passes its place to the next, so that reads and writes find the same servers).
    pub fn copies(&self, hash: u64, n: usize, now: Instant) -> Vec<usize> {
        let pick = |want: State| -> Vec<usize> {
            self.policy.ranked(hash).filter(|&i| self.state(i, now) == want).take(n).collect()
        };
        let healthy = pick(State::Healthy);
        if healthy.is_empty() { pick(State::Stalled) } else { healthy }
    }

    /// A cache pool's warm route for a key placed on `node`: when `node` joined within the
    /// handoff window (and is still warming at `now`) and the key's owner before it joined was
    /// another member, that member. A miss on `node` is then read there and filled into `node`
    /// (mcrouter's warm-up route), and a write invalidates the copy there.
    pub fn warm_source(&self, hash: u64, node: usize, now: Instant) -> Option<usize> {
        let w = self.warm.as_ref()?;
        if !w.handoff.is_warming(node) || w.progress(node, now) >= 1.0 {
            return None;
        }
        w.handoff.previous_owner(hash).filter(|&p| p != node)
    }

    /// A store's handoff for a key (the Redis listener's): when the key's owner on the whole
    /// table joined within the handoff window and the key was another member's before, that
    /// owner and that previous member. A store's key lives in one place, so it goes to its new
    /// owner at once (no gradual admission), after it is moved from the previous one.
    pub fn store_handoff(&self, hash: u64, now: Instant) -> Option<(usize, usize)> {
        // Asked for every command of a Redis listener: without a handoff running, no lookup.
        self.warm.as_ref()?;
        let owner = self.policy.owner(hash)?;
        self.warm_source(hash, owner, now).map(|previous| (owner, previous))
    }

    /// Member `i`'s warm-up progress at `now` (1 when it is not warming), for reports: the handoff's
    /// and slow start's, whichever holds it back more.
    pub fn warm_progress(&self, i: usize, now: Instant) -> f64 {
        let mut p: f64 = 1.0;
        if let Some(w) = &self.warm {
            p = p.min(w.progress(i, now));
        }
        if let (Some(ss), Some(w)) = (&self.config.slow_start, self.workers.get(i))
            && let Some(elapsed) = w.warming_for(now)
        {
            p = p.min(ss.ramp.progress(elapsed));
        }
        p
    }

    /// Whether a worker other than `node` (and those in `tried`) could take a request now.
    pub fn has_other(&self, tried: &[usize], node: usize, now: Instant) -> bool {
        (0..self.workers.len())
            .any(|i| i != node && !tried.contains(&i) && self.weight(i) > 0 && self.state(i, now) == State::Healthy)
    }

    /// Whether passive ejection may take out one more worker: at most half the pool, since past
    /// that a failure is more likely the request's (or the network's) than every worker's.
    pub fn may_eject(&self) -> bool {
        let now = Instant::now();
        let ejected = (0..self.workers.len()).filter(|&i| self.state(i, now) == State::Ejected).count();
        ejected < self.workers.len() / 2
    }

    /// Why [`Snapshot::decide`] found nothing, with no worker tried.
    pub fn why_unavailable(&self, now: Instant) -> Unavailable {
        if self.workers.is_empty() {
            return Unavailable::NoWorkers;
        }
        let weighted: Vec<usize> = (0..self.workers.len()).filter(|&i| self.weight(i) > 0).collect();
        if weighted.is_empty() {
            return Unavailable::AllDrained;
        }
        let mut states: Vec<(State, usize)> = Vec::new();
        for i in weighted {
            let s = self.state(i, now);
            match states.iter_mut().find(|(t, _)| *t == s) {
                Some((_, n)) => *n += 1,
                None => states.push((s, 1)),
            }
        }
        if states.len() == 1 { Unavailable::All(states[0].0) } else { Unavailable::Mixed { states } }
    }
}

thread_local! {
    /// Randomness for p2c and tie breaks, seeded per thread from the OS's random source
    /// (`getrandom`; should the OS refuse, from the thread's id and the clock: p2c needs spread,
    /// not secrecy). Placement by key never uses it.
    static RNG: std::cell::RefCell<SplitMix64> = std::cell::RefCell::new(SplitMix64::new(
        getrandom::u64().unwrap_or_else(|_| {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            std::thread::current().id().hash(&mut h);
            std::time::SystemTime::now().hash(&mut h);
            h.finish()
        }),
    ));
}

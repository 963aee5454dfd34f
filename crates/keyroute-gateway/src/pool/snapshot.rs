//! What a request reads from its pool: one immutable value holding the configuration, the
//! placement table over the members (and so their weights), and the members themselves.

use std::fmt;
use std::sync::Arc;

use keyroute::hash::SplitMix64;
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
            },
            Unavailable::Mixed { .. } => "all_unavailable",
        }
    }
}

/// Everything a request needs from its pool, swapped atomically.
#[derive(Debug)]
pub struct Snapshot {
    /// Incremented by every change.
    pub generation: u64,
    /// The pool's configuration (its worker list is the configured one; `workers` is current).
    pub config: Arc<PoolConfig>,
    /// The placement policy over `workers`: its node set holds each member's weight.
    pub policy: Policy,
    /// The members, in the policy's node order.
    pub workers: Vec<Arc<WorkerState>>,
}

impl Snapshot {
    /// The member named `name`.
    pub fn worker(&self, name: &str) -> Option<(usize, &Arc<WorkerState>)> {
        self.workers.iter().enumerate().find(|(_, w)| w.name == name)
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
    pub fn decide(&self, hash: Option<u64>, tried: &[usize], now: Instant) -> Option<Decision> {
        let loads = |i: usize| self.workers.get(i).map_or(0, |w| w.in_flight());
        let pick = |ok: &dyn Fn(State) -> bool| {
            let eligible = |i: usize| !tried.contains(&i) && ok(self.state(i, now));
            RNG.with(|rng| {
                let mut rng = rng.borrow_mut();
                self.policy.decide(hash, &loads, eligible, &mut *rng)
            })
        };
        pick(&|s| s == State::Healthy).or_else(|| pick(&|s| s == State::Stalled))
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
    /// Randomness for p2c and tie breaks, seeded per thread from the OS (via the std hasher's keys).
    /// Placement by key never uses it.
    static RNG: std::cell::RefCell<SplitMix64> = std::cell::RefCell::new(SplitMix64::new({
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x6b72);
        h.finish()
    }));
}

//! A pool: its workers, its placement, and one atomic snapshot of both.
//!
//! Each pool publishes a [`Snapshot`] through an `ArcSwap`: the pool's configuration, the placement
//! policy (the keyroute table built over the current members), the members in table order, and a
//! generation number. A membership or weight change builds a whole new snapshot and swaps it in;
//! requests that already loaded the old one finish with it. So a request never sees a table built
//! for one set of workers and a member list of another.
//!
//! Health and load are not in the snapshot: they change on every request and probe. They live in
//! each worker's [`WorkerState`], which the snapshot holds by `Arc`, so they travel with the worker
//! across snapshots (a worker keeps its in-flight count, health and ejection through a weight
//! change) and can never belong to a different worker than the one the table names. Unhealthy,
//! ejected or draining workers stay in the table; decisions skip them, so their keys fail over to
//! the next worker of each key's ranking and nothing else moves.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use keyroute::hash::SplitMix64;
use keyroute::{Decision, Node, NodeSet, Options, Policy, Strategy};
use tokio::time::Instant;

use crate::config::{PoolConfig, WorkerConfig};
use crate::health::{Ejector, HealthMachine, Transition};
use crate::metrics::{PoolMetrics, WorkerMetrics};

/// A worker's state for routing, as reported by the admin API and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Taking traffic.
    Healthy,
    /// Failing its active health checks.
    Unhealthy,
    /// Ejected after consecutive failures, until its ejection ends.
    Ejected,
    /// Leaving: takes no new requests, finishes those it holds.
    Draining,
    /// Holding requests that wait for response headers, and answering none of them for the
    /// pool's stall window: hung, or as good as hung. Back to healthy at its next response.
    Stalled,
}

impl State {
    /// The state's name, as in metrics and the admin API.
    pub fn name(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Unhealthy => "unhealthy",
            State::Ejected => "ejected",
            State::Draining => "draining",
            State::Stalled => "stalled",
        }
    }
}

const HEALTHY: u8 = 0;
const UNHEALTHY: u8 = 1;
const DRAINING: u8 = 3;

/// One worker: its identity, health, load and counters. Shared by every snapshot that lists it.
///
/// Its weight is not here: a weight is part of the member set, so it lives in the snapshot's
/// node set (one owner per fact), and a weight change is a new snapshot.
#[derive(Debug)]
pub struct WorkerState {
    /// The worker's name: its identity for placement.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its zone.
    pub zone: Option<String>,
    in_flight: AtomicU64,
    /// Pooled keep-alive connections to this worker.
    pub upstream: crate::upstream::Upstream,
    /// `HEALTHY`, `UNHEALTHY` or `DRAINING` (ejection is separate, by time).
    state: AtomicU8,
    /// Milliseconds since the gateway's epoch until which the worker is ejected; 0 if not.
    ejected_until_ms: AtomicU64,
    machines: Mutex<(HealthMachine, Ejector)>,
    epoch: Instant,
    /// Tries waiting for this worker's response headers.
    awaiting: AtomicU64,
    /// Milliseconds since the epoch of the worker's last sign of life: response headers, or the
    /// moment a try started waiting on an idle worker.
    progress_ms: AtomicU64,
    /// Set by a response cut short, cleared by a complete one (to log a change once).
    truncating: AtomicBool,
    /// Counters.
    pub metrics: WorkerMetrics,
}

impl WorkerState {
    /// A new worker, healthy.
    pub fn new(config: &WorkerConfig, pool: &PoolConfig, epoch: Instant) -> Self {
        WorkerState {
            name: config.name.clone(),
            address: config.address,
            zone: config.zone.clone(),
            upstream: crate::upstream::Upstream::new(config.address, pool.connect_timeout),
            in_flight: AtomicU64::new(0),
            state: AtomicU8::new(HEALTHY),
            ejected_until_ms: AtomicU64::new(0),
            machines: Mutex::new((
                HealthMachine::new(pool.health.rise, pool.health.fall),
                Ejector::new(pool.passive.consecutive_failures, pool.passive.base_ejection, pool.passive.max_ejection),
            )),
            epoch,
            awaiting: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            truncating: AtomicBool::new(false),
            metrics: WorkerMetrics::default(),
        }
    }

    /// Requests in flight (sent and not yet answered to the end of the body).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The routing state at `now`, with no stall window (see [`WorkerState::state_with`]).
    pub fn state(&self) -> State {
        self.state_with(Instant::now(), Duration::ZERO)
    }

    /// The routing state at `now`; `stall` is the pool's stall window (zero: never stalled).
    pub fn state_with(&self, now: Instant, stall: Duration) -> State {
        match self.state.load(Relaxed) {
            DRAINING => State::Draining,
            UNHEALTHY => State::Unhealthy,
            // Read the clock only for a worker that has been ejected at some point.
            _ if self.ejected_until_ms.load(Relaxed) != 0 && self.ejected_until_ms.load(Relaxed) > self.ms(now) => {
                State::Ejected
            }
            _ if self.stalled(now, stall) => State::Stalled,
            _ => State::Healthy,
        }
    }

    /// Whether the worker holds tries waiting for headers and has answered none for `stall`
    /// (zero disables).
    pub fn stalled(&self, now: Instant, stall: Duration) -> bool {
        !stall.is_zero()
            && self.awaiting.load(Relaxed) > 0
            && self.ms(now).saturating_sub(self.progress_ms.load(Relaxed)) > stall.as_millis() as u64
    }

    /// Counts a try waiting for headers until the returned guard drops.
    pub fn await_headers(self: &Arc<Self>, now: Instant) -> Awaiting {
        if self.awaiting.fetch_add(1, Relaxed) == 0 {
            // An idle worker's stall clock starts with its first waiting try.
            self.progress_ms.store(self.ms(now), Relaxed);
        }
        Awaiting(Arc::clone(self))
    }

    /// The worker sent response headers: a sign of life.
    pub fn headers_arrived(&self, now: Instant) {
        self.progress_ms.store(self.ms(now), Relaxed);
    }

    /// Notes a response cut short; true if the previous complete response was not (the first of
    /// a run, worth a log line).
    pub(crate) fn note_truncation(&self) -> bool {
        !self.truncating.swap(true, Relaxed)
    }

    /// Feeds an active probe result; returns the transition.
    pub fn observe_probe(&self, ok: bool) -> Transition {
        let mut m = self.machines.lock().unwrap_or_else(|e| e.into_inner());
        let t = m.0.observe(ok);
        match t {
            Transition::Down => {
                let _ = self.state.compare_exchange(HEALTHY, UNHEALTHY, Relaxed, Relaxed);
            }
            Transition::Up => {
                let _ = self.state.compare_exchange(UNHEALTHY, HEALTHY, Relaxed, Relaxed);
            }
            Transition::None => {}
        }
        t
    }

    /// Feeds a request outcome (`ok` = a complete response that is not a 5xx); returns the
    /// ejection length if this outcome ejects the worker. Outcomes of requests that were in
    /// flight while the worker is ejected are ignored, and `may_eject = false` (the pool's
    /// ejection cap is reached) keeps counting without ejecting.
    pub fn observe_request(&self, ok: bool, may_eject: bool) -> Option<Duration> {
        let now = Instant::now();
        if ok {
            self.truncating.store(false, Relaxed);
        }
        if self.state_with(now, Duration::ZERO) == State::Ejected {
            return None;
        }
        let ejection = {
            let mut m = self.machines.lock().unwrap_or_else(|e| e.into_inner());
            m.1.observe(ok)
        }?;
        if !may_eject {
            return None;
        }
        self.ejected_until_ms.store(self.ms(now) + ejection.as_millis() as u64, Relaxed);
        self.metrics.ejections.fetch_add(1, Relaxed);
        Some(ejection)
    }

    /// Applies a reloaded pool's health, ejection and connect settings, keeping the current state.
    fn retune(&self, pool: &PoolConfig) {
        let mut m = self.machines.lock().unwrap_or_else(|e| e.into_inner());
        m.0 = m.0.retuned(pool.health.rise, pool.health.fall);
        m.1 =
            Ejector::retuned(pool.passive.consecutive_failures, pool.passive.base_ejection, pool.passive.max_ejection);
        self.upstream.set_connect_timeout(pool.connect_timeout);
    }

    /// Marks the worker as draining (irreversible for this worker object).
    pub fn drain(&self) {
        self.state.store(DRAINING, Relaxed);
    }
}

/// A try waiting for a worker's response headers; see [`WorkerState::await_headers`].
#[derive(Debug)]
pub struct Awaiting(Arc<WorkerState>);

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0.awaiting.fetch_sub(1, Relaxed);
    }
}

/// Counts a request in flight on a worker until dropped: held by the response body, so it is
/// released when the body ends (or the client goes away), not when the headers arrive.
#[derive(Debug)]
pub struct InFlight(Arc<WorkerState>);

impl InFlight {
    /// Starts counting.
    pub fn new(worker: Arc<WorkerState>) -> Self {
        worker.in_flight.fetch_add(1, Relaxed);
        InFlight(worker)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

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
    /// `tried`.
    pub fn decide(&self, hash: Option<u64>, tried: &[usize], now: Instant) -> Option<Decision> {
        let loads = |i: usize| self.workers.get(i).map_or(0, |w| w.in_flight());
        let eligible = |i: usize| !tried.contains(&i) && self.state(i, now) == State::Healthy;
        RNG.with(|rng| {
            let mut rng = rng.borrow_mut();
            self.policy.decide(hash, &loads, eligible, &mut *rng)
        })
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

/// The node set of a list of workers (names, weights, zones).
///
/// # Errors
///
/// Empty or duplicate names.
pub fn node_set(workers: &[WorkerConfig]) -> Result<NodeSet, keyroute::Error> {
    nodes(workers.iter().map(|w| (w.name.as_str(), w.weight, w.zone.as_deref())))
}

fn nodes<'a>(it: impl Iterator<Item = (&'a str, u32, Option<&'a str>)>) -> Result<NodeSet, keyroute::Error> {
    let nodes = it
        .map(|(name, weight, zone)| {
            let n = Node::try_new(name)?.with_weight(weight);
            Ok(match zone {
                Some(z) => n.with_zone(z),
                None => n,
            })
        })
        .collect::<Result<Vec<_>, keyroute::Error>>()?;
    NodeSet::try_new(nodes)
}

/// The most entries (ring points, modulo slots, Maglev entries) a pool's table may have: about
/// 50 MB while a ring of this size is built, and a build of a few hundred milliseconds on one
/// core. A weight change that would go past it is refused, so that no admin call or reload can
/// make the gateway build a table of gigabytes.
pub const MAX_TABLE_ENTRIES: u64 = 4_000_000;

/// The number of entries the table of `strategy` over `nodes` would have, when it grows with
/// the weights (rings and weighted modulo), or with the configured Maglev size.
pub fn table_entries(strategy: Strategy, options: &Options, nodes: &NodeSet) -> u64 {
    let total = nodes.total_weight();
    match strategy {
        Strategy::Ring | Strategy::BoundedRing => total.saturating_mul(u64::from(options.vnodes)),
        Strategy::Modulo => total,
        Strategy::Maglev => u64::from(options.maglev_size),
        _ => nodes.len() as u64,
    }
}

/// Refuses a table above [`MAX_TABLE_ENTRIES`], with a message that says what to lower.
///
/// # Errors
///
/// The message, when the table is too large.
pub fn check_table_size(strategy: Strategy, options: &Options, nodes: &NodeSet) -> Result<(), String> {
    let entries = table_entries(strategy, options, nodes);
    if entries <= MAX_TABLE_ENTRIES {
        return Ok(());
    }
    let what = match strategy {
        Strategy::Ring | Strategy::BoundedRing => format!(
            "the ring would have {entries} points ({} vnodes x total weight {}); lower vnodes or the weights",
            options.vnodes,
            nodes.total_weight()
        ),
        Strategy::Modulo => format!("modulo would expand a total weight of {entries}; lower the weights"),
        _ => format!("the table would have {entries} entries; lower maglev_size"),
    };
    Err(format!("{what} (the limit is {MAX_TABLE_ENTRIES})"))
}

/// Recently seen key hashes: a fixed sample that tells what share of live keys a membership change
/// remaps (the table alone cannot say which keys exist).
#[derive(Debug)]
struct RecentKeys {
    slots: Vec<AtomicU64>,
    next: AtomicU64,
}

const RECENT: usize = 4096;

impl RecentKeys {
    fn new() -> Self {
        RecentKeys { slots: (0..RECENT).map(|_| AtomicU64::new(0)).collect(), next: AtomicU64::new(0) }
    }

    fn record(&self, hash: u64) {
        let i = self.next.fetch_add(1, Relaxed) as usize % RECENT;
        self.slots[i].store(hash, Relaxed);
    }

    fn sample(&self) -> Vec<u64> {
        let n = (self.next.load(Relaxed) as usize).min(RECENT);
        let mut v: Vec<u64> = self.slots[..n].iter().map(|s| s.load(Relaxed)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// A membership change the pool refused.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// No worker has that name.
    #[error("no worker named '{worker}' in pool '{pool}'")]
    UnknownWorker {
        /// The name asked for.
        worker: String,
        /// The pool.
        pool: String,
    },
    /// A worker with that name exists.
    #[error("a worker named '{worker}' is already in pool '{pool}'")]
    Duplicate {
        /// The name.
        worker: String,
        /// The pool.
        pool: String,
    },
    /// The table would be too large.
    #[error("pool '{pool}': {message}")]
    TooLarge {
        /// The pool.
        pool: String,
        /// What is too large, and what to lower.
        message: String,
    },
    /// The placement library refused the new set (for example a weight for jump hashing).
    #[error("pool '{pool}': {source}")]
    Placement {
        /// The pool.
        pool: String,
        /// Why.
        source: keyroute::Error,
    },
}

/// A pool of workers. See the [module documentation](self).
///
/// Changes are synchronous and may take a while for a large table (a ring of millions of points
/// takes hundreds of milliseconds to build): call them off the request path, as the admin API
/// and reloads do (`spawn_blocking`). Readers never wait for them.
#[derive(Debug)]
pub struct Pool {
    /// The pool's name.
    pub name: String,
    snapshot: ArcSwap<Snapshot>,
    recent: RecentKeys,
    /// Serialises changes (readers never wait).
    change: Mutex<()>,
    /// Counters.
    pub metrics: PoolMetrics,
    epoch: Instant,
}

/// A member list with weights: what a change proposes, before it is built.
type Members = Vec<(Arc<WorkerState>, u32)>;

impl Pool {
    /// A pool from its configuration.
    ///
    /// # Errors
    ///
    /// The placement library refuses the workers, or the table is too large (validated
    /// configurations never fail here).
    pub fn new(config: PoolConfig, epoch: Instant) -> Result<Self, MembershipError> {
        let members: Members =
            config.workers.iter().map(|w| (Arc::new(WorkerState::new(w, &config, epoch)), w.weight)).collect();
        let name = config.name.clone();
        let snapshot = build(Arc::new(config), members, 1, None)?;
        Ok(Pool {
            name,
            snapshot: ArcSwap::from_pointee(snapshot),
            recent: RecentKeys::new(),
            change: Mutex::new(()),
            metrics: PoolMetrics::default(),
            epoch,
        })
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Notes a key hash in the recent sample.
    pub fn record_key(&self, hash: u64) {
        self.recent.record(hash);
    }

    /// Adds a worker.
    ///
    /// # Errors
    ///
    /// A duplicate name, or a set the strategy refuses.
    pub fn add_worker(&self, config: WorkerConfig) -> Result<u64, MembershipError> {
        self.change(|snap| {
            if snap.worker(&config.name).is_some() {
                return Err(MembershipError::Duplicate { worker: config.name.clone(), pool: self.name.clone() });
            }
            let mut members = members_of(snap);
            members.push((Arc::new(WorkerState::new(&config, &snap.config, self.epoch)), config.weight));
            Ok(members)
        })
    }

    /// Removes a worker now (requests it holds still finish).
    ///
    /// # Errors
    ///
    /// No such worker.
    pub fn remove_worker(&self, name: &str) -> Result<u64, MembershipError> {
        self.remove_where(name, |w| w.name == name)
    }

    /// Removes this very worker object, if it is still a member: what a finished drain does, so that
    /// a worker re-added (or kept by a reload) under the same name meanwhile is not removed.
    ///
    /// # Errors
    ///
    /// It is no longer a member.
    pub fn remove_exact(&self, worker: &Arc<WorkerState>) -> Result<u64, MembershipError> {
        self.remove_where(&worker.name, |w| Arc::ptr_eq(w, worker))
    }

    fn remove_where(&self, name: &str, hit: impl Fn(&Arc<WorkerState>) -> bool) -> Result<u64, MembershipError> {
        self.change(|snap| {
            let mut members = members_of(snap);
            let before = members.len();
            members.retain(|(w, _)| !hit(w));
            if members.len() == before {
                return Err(MembershipError::UnknownWorker { worker: name.to_owned(), pool: self.name.clone() });
            }
            Ok(members)
        })
    }

    /// Sets a worker's weight (0 drains its share to the others). Nothing changes unless the new
    /// table builds.
    ///
    /// # Errors
    ///
    /// No such worker, or a weight the strategy refuses, or a table too large.
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<u64, MembershipError> {
        self.change(|snap| {
            let Some((i, _)) = snap.worker(name) else {
                return Err(MembershipError::UnknownWorker { worker: name.to_owned(), pool: self.name.clone() });
            };
            let mut members = members_of(snap);
            members[i].1 = weight;
            Ok(members)
        })
    }

    /// Replaces the configuration and members (a reload): workers with the same name, address and
    /// zone keep their state; others are new. Nothing shared changes unless the new table builds.
    ///
    /// # Errors
    ///
    /// A set the strategy refuses, or a table too large.
    pub fn reconfigure(&self, config: PoolConfig) -> Result<u64, MembershipError> {
        let _guard = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snapshot();
        let mut kept = Vec::new();
        let members: Members = config
            .workers
            .iter()
            .map(|w| match old.worker(&w.name) {
                // The same worker: it keeps its health, load and counters, under the new settings.
                Some((_, s)) if s.address == w.address && s.zone == w.zone && s.state() != State::Draining => {
                    kept.push(Arc::clone(s));
                    (Arc::clone(s), w.weight)
                }
                _ => (Arc::new(WorkerState::new(w, &config, self.epoch)), w.weight),
            })
            .collect();
        let next = build(Arc::new(config), members, old.generation + 1, Some(&old))?;
        for w in &kept {
            w.retune(&next.config);
        }
        self.publish(&old, next)
    }

    fn change(&self, edit: impl FnOnce(&Snapshot) -> Result<Members, MembershipError>) -> Result<u64, MembershipError> {
        let _guard = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snapshot();
        let members = edit(&old)?;
        let next = build(Arc::clone(&old.config), members, old.generation + 1, Some(&old))?;
        self.publish(&old, next)
    }

    fn publish(&self, old: &Snapshot, next: Snapshot) -> Result<u64, MembershipError> {
        // What share of the recently seen keys changes owner?
        let sample = self.recent.sample();
        let owner = |s: &Snapshot, h: u64| s.policy.owner(h).map(|i| s.workers[i].name.clone());
        let moved = sample.iter().filter(|&&h| owner(old, h) != owner(&next, h)).count();
        let ratio = if sample.is_empty() { 0.0 } else { moved as f64 / sample.len() as f64 };
        self.metrics.membership_changes.fetch_add(1, Relaxed);
        self.metrics.remapped_keys.fetch_add(moved as u64, Relaxed);
        self.metrics.last_remapped_ratio.store(ratio.to_bits(), Relaxed);
        let generation = next.generation;
        tracing::info!(
            pool = %self.name,
            generation,
            workers = next.workers.len(),
            sampled_keys = sample.len(),
            remapped = moved,
            "membership changed"
        );
        self.snapshot.store(Arc::new(next));
        Ok(generation)
    }
}

fn members_of(snap: &Snapshot) -> Members {
    snap.workers.iter().enumerate().map(|(i, w)| (Arc::clone(w), snap.weight(i))).collect()
}

/// Whether a pool configuration's members can be placed (for example, jump hashing refuses
/// weights): checked for every pool before a reload changes any.
///
/// # Errors
///
/// As [`Pool::new`].
pub fn check(config: &PoolConfig) -> Result<(), MembershipError> {
    let placement = |source| MembershipError::Placement { pool: config.name.clone(), source };
    let nodes = node_set(&config.workers).map_err(placement)?;
    check_table_size(config.strategy, &config.options, &nodes)
        .map_err(|message| MembershipError::TooLarge { pool: config.name.clone(), message })?;
    Policy::build(config.strategy, nodes, &config.options).map_err(placement)?;
    Ok(())
}

fn build(
    config: Arc<PoolConfig>,
    members: Members,
    generation: u64,
    previous: Option<&Snapshot>,
) -> Result<Snapshot, MembershipError> {
    let placement = |source| MembershipError::Placement { pool: config.name.clone(), source };
    let nodes =
        nodes(members.iter().map(|(w, weight)| (w.name.as_str(), *weight, w.zone.as_deref()))).map_err(placement)?;
    check_table_size(config.strategy, &config.options, &nodes)
        .map_err(|message| MembershipError::TooLarge { pool: config.name.clone(), message })?;
    let policy = match previous {
        // Rebuild from the previous policy when the strategy is unchanged, so that slot tables
        // rebalance instead of reassigning from scratch.
        Some(prev) if prev.policy.strategy() == config.strategy && *prev.policy.options() == config.options => {
            prev.policy.rebuild(nodes)
        }
        _ => Policy::build(config.strategy, nodes, &config.options),
    }
    .map_err(placement)?;
    let workers = members.into_iter().map(|(w, _)| w).collect();
    Ok(Snapshot { generation, config, policy, workers })
}

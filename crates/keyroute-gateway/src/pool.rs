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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use keyroute::hash::SplitMix64;
use keyroute::{Decision, Node, NodeSet, Policy};
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
}

const HEALTHY: u8 = 0;
const UNHEALTHY: u8 = 1;
const DRAINING: u8 = 3;

/// One worker: its configuration, health, load and counters. Shared by every snapshot that lists it.
#[derive(Debug)]
pub struct WorkerState {
    /// The worker's name: its identity for placement.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its zone.
    pub zone: Option<String>,
    weight: AtomicU32,
    in_flight: AtomicU64,
    /// Pooled keep-alive connections to this worker.
    pub upstream: crate::upstream::Upstream,
    /// `HEALTHY`, `UNHEALTHY` or `DRAINING` (ejection is separate, by time).
    state: AtomicU8,
    /// Milliseconds since the gateway's epoch until which the worker is ejected; 0 if not.
    ejected_until_ms: AtomicU64,
    machines: Mutex<(HealthMachine, Ejector)>,
    epoch: Instant,
    /// Counters.
    pub metrics: WorkerMetrics,
}

impl WorkerState {
    /// A new worker, healthy.
    pub fn new(config: WorkerConfig, pool: &PoolConfig, epoch: Instant) -> Self {
        WorkerState {
            name: config.name,
            address: config.address,
            zone: config.zone,
            weight: AtomicU32::new(config.weight),
            upstream: crate::upstream::Upstream::new(config.address, pool.connect_timeout),
            in_flight: AtomicU64::new(0),
            state: AtomicU8::new(HEALTHY),
            ejected_until_ms: AtomicU64::new(0),
            machines: Mutex::new((
                HealthMachine::new(pool.health.rise, pool.health.fall),
                Ejector::new(pool.passive.consecutive_failures, pool.passive.base_ejection, pool.passive.max_ejection),
            )),
            epoch,
            metrics: WorkerMetrics::default(),
        }
    }

    /// The weight in use.
    pub fn weight(&self) -> u32 {
        self.weight.load(Relaxed)
    }

    /// Requests in flight (sent and not yet answered to the end of the body).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    fn now_ms(&self) -> u64 {
        Instant::now().saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The routing state now.
    pub fn state(&self) -> State {
        match self.state.load(Relaxed) {
            DRAINING => State::Draining,
            UNHEALTHY => State::Unhealthy,
            // Read the clock only for a worker that has been ejected at some point.
            _ if self.ejected_until_ms.load(Relaxed) != 0 && self.ejected_until_ms.load(Relaxed) > self.now_ms() => {
                State::Ejected
            }
            _ => State::Healthy,
        }
    }

    /// Whether new requests may go to this worker.
    pub fn available(&self) -> bool {
        self.state() == State::Healthy
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

    /// Feeds a request outcome (`ok` = neither a connect error nor a 5xx); returns the ejection
    /// length if this outcome ejects the worker. Outcomes of requests that were in flight while
    /// the worker is ejected are ignored, and `may_eject = false` (the pool's ejection cap is
    /// reached) keeps counting without ejecting.
    pub fn observe_request(&self, ok: bool, may_eject: bool) -> Option<Duration> {
        if self.state() == State::Ejected {
            return None;
        }
        let ejection = {
            let mut m = self.machines.lock().unwrap_or_else(|e| e.into_inner());
            m.1.observe(ok)
        }?;
        if !may_eject {
            return None;
        }
        self.ejected_until_ms.store(self.now_ms() + ejection.as_millis() as u64, Relaxed);
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

/// Everything a request needs from its pool, swapped atomically.
#[derive(Debug)]
pub struct Snapshot {
    /// Incremented by every change.
    pub generation: u64,
    /// The pool's configuration (its worker list is the configured one; `workers` is current).
    pub config: Arc<PoolConfig>,
    /// The placement policy over `workers`.
    pub policy: Policy,
    /// The members, in the policy's node order.
    pub workers: Vec<Arc<WorkerState>>,
}

impl Snapshot {
    /// The member named `name`.
    pub fn worker(&self, name: &str) -> Option<(usize, &Arc<WorkerState>)> {
        self.workers.iter().enumerate().find(|(_, w)| w.name == name)
    }

    /// Chooses a worker for a key hash (or none, for p2c), skipping unavailable workers and those in
    /// `tried`.
    pub fn decide(&self, hash: Option<u64>, tried: &[usize]) -> Option<Decision> {
        let loads = |i: usize| self.workers.get(i).map_or(0, |w| w.in_flight());
        let eligible = |i: usize| !tried.contains(&i) && self.workers.get(i).is_some_and(|w| w.available());
        RNG.with(|rng| {
            let mut rng = rng.borrow_mut();
            self.policy.decide(hash, &loads, eligible, &mut *rng)
        })
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
    #[error("no worker named '{0}' in pool '{1}'")]
    UnknownWorker(String, String),
    /// A worker with that name exists.
    #[error("a worker named '{0}' is already in pool '{1}'")]
    Duplicate(String, String),
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

impl Pool {
    /// A pool from its configuration.
    ///
    /// # Errors
    ///
    /// The placement library refuses the workers (validated configurations never fail here).
    pub fn new(config: PoolConfig, epoch: Instant) -> Result<Self, MembershipError> {
        let workers: Vec<Arc<WorkerState>> =
            config.workers.iter().map(|w| Arc::new(WorkerState::new(w.clone(), &config, epoch))).collect();
        let name = config.name.clone();
        let snapshot = build(Arc::new(config), workers, 1, None)?;
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
        self.change(|snap, workers| {
            if snap.worker(&config.name).is_some() {
                return Err(MembershipError::Duplicate(config.name.clone(), self.name.clone()));
            }
            workers.push(Arc::new(WorkerState::new(config.clone(), &snap.config, self.epoch)));
            Ok(())
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
        self.change(|_, workers| {
            let before = workers.len();
            workers.retain(|w| !hit(w));
            if workers.len() == before {
                return Err(MembershipError::UnknownWorker(name.to_owned(), self.name.clone()));
            }
            Ok(())
        })
    }

    /// Sets a worker's weight (0 drains its share to the others).
    ///
    /// # Errors
    ///
    /// No such worker, or a weight the strategy refuses.
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<u64, MembershipError> {
        let mut previous = None;
        let result = self.change(|snap, _| {
            let Some((_, w)) = snap.worker(name) else {
                return Err(MembershipError::UnknownWorker(name.to_owned(), self.name.clone()));
            };
            previous = Some((Arc::clone(w), w.weight.swap(weight, Relaxed)));
            Ok(())
        });
        // A weight the strategy refuses leaves the old weight in place.
        if let (Err(_), Some((w, old))) = (&result, previous) {
            w.weight.store(old, Relaxed);
        }
        result
    }

    /// Replaces the configuration and members (a reload): workers with the same name and address
    /// keep their state; others are new.
    ///
    /// # Errors
    ///
    /// A set the strategy refuses.
    pub fn reconfigure(&self, config: PoolConfig) -> Result<u64, MembershipError> {
        let _guard = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snapshot();
        let workers: Vec<Arc<WorkerState>> = config
            .workers
            .iter()
            .map(|w| match old.worker(&w.name) {
                // The same worker: it keeps its health, load and counters, under the new settings.
                Some((_, s)) if s.address == w.address && s.zone == w.zone && s.state() != State::Draining => {
                    s.weight.store(w.weight, Relaxed);
                    s.retune(&config);
                    Arc::clone(s)
                }
                _ => Arc::new(WorkerState::new(w.clone(), &config, self.epoch)),
            })
            .collect();
        let next = build(Arc::new(config), workers, old.generation + 1, Some(&old))?;
        self.publish(&old, next)
    }

    fn change(
        &self,
        edit: impl FnOnce(&Snapshot, &mut Vec<Arc<WorkerState>>) -> Result<(), MembershipError>,
    ) -> Result<u64, MembershipError> {
        let _guard = self.change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.snapshot();
        let mut workers = old.workers.clone();
        edit(&old, &mut workers)?;
        let next = build(Arc::clone(&old.config), workers, old.generation + 1, Some(&old))?;
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

/// Whether a pool configuration's members can be placed (for example, jump hashing refuses
/// weights): checked for every pool before a reload changes any.
///
/// # Errors
///
/// As [`Pool::new`].
pub fn check(config: &PoolConfig) -> Result<(), MembershipError> {
    let placement = |source| MembershipError::Placement { pool: config.name.clone(), source };
    let nodes = node_set(&config.workers).map_err(placement)?;
    Policy::build(config.strategy, nodes, &config.options).map_err(placement)?;
    Ok(())
}

fn build(
    config: Arc<PoolConfig>,
    workers: Vec<Arc<WorkerState>>,
    generation: u64,
    previous: Option<&Snapshot>,
) -> Result<Snapshot, MembershipError> {
    let placement = |source| MembershipError::Placement { pool: config.name.clone(), source };
    let nodes = nodes(workers.iter().map(|w| (w.name.as_str(), w.weight(), w.zone.as_deref()))).map_err(placement)?;
    let policy = match previous {
        // Rebuild from the previous policy when the strategy is unchanged, so that slot tables
        // rebalance instead of reassigning from scratch.
        Some(prev) if prev.policy.strategy() == config.strategy && *prev.policy.options() == config.options => {
            prev.policy.rebuild(nodes)
        }
        _ => Policy::build(config.strategy, nodes, &config.options),
    }
    .map_err(placement)?;
    Ok(Snapshot { generation, config, policy, workers })
}

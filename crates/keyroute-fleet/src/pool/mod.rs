//! A pool: its workers, its placement, and one atomic snapshot of both.
//!
//! Each pool publishes a [`Snapshot`] through an `ArcSwap`: the pool's configuration, the placement
//! policy (the keyroute table built over the current members), the members in table order (the
//! canonical order of their names, so the table depends on the member set alone), and a
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

//!
//! - [`endpoint`]: one worker's live state ([`WorkerState`]), and the RAII counts of its load.
//! - [`snapshot`]: the immutable value requests read ([`Snapshot`]), and why it may have no worker.
//! - here: [`Pool`], which applies a change by building a whole new snapshot (off the request
//!   path) and only then swapping it in; nothing shared is edited before a build that can fail.

pub mod endpoint;
pub mod hot;
mod snapshot;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use arc_swap::ArcSwap;
use keyroute::Policy;
use tokio::time::Instant;

pub use self::endpoint::{Awaiting, InFlight, InFlightBatch, State, WorkerState};
pub use self::snapshot::{Snapshot, Unavailable, WHAT_IF_FLOOR, WHAT_IF_GROWTH, WhatIf};
use crate::config::{MembershipConfig, PoolConfig, WorkerConfig};
use crate::metrics::{PoolMetrics, SourceMetrics};
use crate::table::{check_table_size, node_set};

/// A protocol's active check of one worker.
pub trait Check: Send + Sync + std::fmt::Debug {
    /// Probes `worker` once; `true` when it is healthy. The prober bounds it by the pool's
    /// `[pool.health] timeout_ms` (a probe still running then fails).
    fn check<'a>(&'a self, worker: &'a Arc<WorkerState>) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
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

    /// The distinct hashes seen recently (at most [`RECENT`]), sorted.
    fn sample(&self) -> Vec<u64> {
        let n = (self.next.load(Relaxed) as usize).min(RECENT);
        let mut v: Vec<u64> = self.slots[..n].iter().map(|s| s.load(Relaxed)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

/// One membership change as the dashboard shows it: when, what changed, and the share of the
/// recently seen keys it remapped.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ChangeRecord {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The generation it published.
    pub generation: u64,
    /// Members after it.
    pub workers: usize,
    /// Names that joined.
    pub added: Vec<String>,
    /// Names that left.
    pub removed: Vec<String>,
    /// Names whose weight changed.
    pub reweighted: Vec<String>,
    /// Of the recently seen keys, the share whose owner changed.
    pub remapped: f64,
    /// How many recently seen keys that share is of.
    pub sampled_keys: usize,
}

/// Changes kept in a pool's log.
const CHANGE_LOG: usize = 32;

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
    #[error("pool '{pool}': {source}")]
    TooLarge {
        /// The pool.
        pool: String,
        /// What is too large, and what to lower.
        source: crate::table::TooLarge,
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
pub struct Pool {
    /// The pool's name.
    pub name: String,
    snapshot: ArcSwap<Snapshot>,
    recent: RecentKeys,
    /// The last [`CHANGE_LOG`] membership changes, oldest first.
    changes: Mutex<std::collections::VecDeque<ChangeRecord>>,
    /// Serialises changes (readers never wait).
    change: Mutex<()>,
    /// Counters.
    pub metrics: PoolMetrics,
    /// The membership source's state (etcd-backed pools).
    pub source: SourceMetrics,
    /// Notified when a reload changes the pool's membership source, so that its task restarts.
    pub reconfigured: tokio::sync::Notify,
    /// Woken whenever the membership source has applied a revision (`source.revision`).
    pub applied: tokio::sync::Notify,
    epoch: Instant,
    /// The active check of the protocol that serves the pool (see [`Pool::set_check`]).
    check: Mutex<Option<Arc<dyn Check>>>,
    /// The state of the protocol that serves the pool (see [`Pool::protocol_or`]).
    protocol: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("name", &self.name).field("snapshot", &self.snapshot()).finish_non_exhaustive()
    }
}

/// A reload's new snapshot for one pool, built and not yet published; the pool's change lock is
/// held meanwhile.
#[derive(Debug)]
pub struct Prepared<'a> {
    _guard: parking_lot::MutexGuard<'a, ()>,
    old: Arc<Snapshot>,
    next: Snapshot,
    kept: Vec<Arc<WorkerState>>,
}

/// A member as a membership source gives it: the worker, and whether it is draining.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The worker.
    pub worker: WorkerConfig,
    /// Whether it is draining.
    pub draining: bool,
    /// Its address is one of this gateway's own (a record written for another gateway's view, or
    /// by mistake): it keeps its place in the table, as on every other gateway, but this gateway
    /// never sends to it (its state is `loop`).
    pub at_this_gateway: bool,
}

/// A member [`Pool::admissible`] refused.
#[derive(Debug)]
pub struct Refused {
    /// Its name.
    pub name: String,
    /// Why the table refuses it.
    pub error: MembershipError,
    /// It fits alone, but not with the members before it (in name order).
    pub with_others: bool,
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
            changes: Mutex::new(std::collections::VecDeque::new()),
            change: Mutex::new(()),
            metrics: PoolMetrics::default(),
            source: SourceMetrics::default(),
            reconfigured: tokio::sync::Notify::new(),
            applied: tokio::sync::Notify::new(),
            epoch,
            check: Mutex::new(None),
            protocol: std::sync::OnceLock::new(),
        })
    }

    /// What the protocol that serves this pool keeps for it across its snapshots (the cache
    /// proxy: where hot keys have copies), made by `init` on first use; `None` when the slot
    /// holds another type.
    pub fn protocol_or<T: std::any::Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.protocol.get_or_init(|| Box::new(init())).downcast_ref()
    }

    /// What the protocol that serves this pool keeps for it, if it made it and it is a `T`.
    pub fn protocol<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.protocol.get()?.downcast_ref()
    }

    /// Sets the active check of the protocol that serves the pool (an HTTP `GET`, memcached's
    /// `version`, Redis's `PING`): its prober uses it from its next round, when the pool's
    /// `[pool.health]` is on.
    pub fn set_check(&self, check: Option<Arc<dyn Check>>) {
        *self.check.lock() = check;
    }

    /// The pool's active check, if it has one.
    pub fn check(&self) -> Option<Arc<dyn Check>> {
        self.check.lock().clone()
    }

    /// The gateway's epoch, which the source's timestamps count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Replaces every member at once with those of the membership source (the etcd task, and
    /// through [`Pool::edit`] the admin API): see [`Pool::carry`]. Nothing is published when
    /// nothing changed. Returns the generation in force.
    ///
    /// # Errors
    ///
    /// A set the strategy refuses, or a table too large: the current members stay.
    pub fn set_members(&self, incoming: &[Member]) -> Result<u64, MembershipError> {
        let guard = self.change.lock();
        let old = self.snapshot();
        let config = Arc::clone(&old.config);
        let (members, kept, same) = self.carry(&old, &config, incoming, true);
        if same {
            // Nothing to build, nothing to publish.
            return Ok(old.generation);
        }
        let next = build(config, members, old.generation + 1, Some(&old))?;
        Ok(self.commit(Prepared { _guard: guard, old, next, kept }))
    }

    /// An edit of the current member set, applied whole like a source's (the admin API of a
    /// static pool: add, remove, weight). The edit sees the snapshot it edits, under the pool's
    /// change lock, so two edits never lose one another.
    ///
    /// # Errors
    ///
    /// The edit's own, a set the strategy refuses, or a table too large.
    pub fn edit(
        &self,
        edit: impl FnOnce(&Snapshot, &mut Vec<Member>) -> Result<(), MembershipError>,
    ) -> Result<u64, MembershipError> {
        let guard = self.change.lock();
        let old = self.snapshot();
        let mut members = old.members();
        edit(&old, &mut members)?;
        let config = Arc::clone(&old.config);
        let (members, kept, same) = self.carry(&old, &config, &members, true);
        if same {
            // Nothing to build, nothing to publish.
            return Ok(old.generation);
        }
        let next = build(config, members, old.generation + 1, Some(&old))?;
        Ok(self.commit(Prepared { _guard: guard, old, next, kept }))
    }

    /// The one way a member set becomes the pool's, whatever its source (the configuration file
    /// through [`Pool::prepare`], the admin API through [`Pool::edit`], etcd through
    /// [`Pool::set_members`]): the members for `incoming` under `config`, the workers kept, and
    /// (when `may_be_same`, for unchanged settings) whether nothing changes at all, in which case
    /// the caller builds and publishes nothing.
    ///
    /// **The same worker keeps its state**: a member with a current worker's name, address, zone
    /// and id is that worker, and keeps its health, ejection, load, connections and counters
    /// (under the new settings, if `config` changes them). A draining worker stays draining: a
    /// member that is not draining under its name is a new worker object. A member whose record
    /// says draining is drained; one at this gateway's own address is marked
    /// [`State::Loop`] (kept in the table, never sent to).
    fn carry(
        &self,
        old: &Snapshot,
        config: &PoolConfig,
        incoming: &[Member],
        may_be_same: bool,
    ) -> (Members, Vec<Arc<WorkerState>>, bool) {
        let mut same = may_be_same && incoming.len() == old.workers.len();
        let mut kept = Vec::new();
        let members: Members = incoming
            .iter()
            .map(|m| {
                let w = &m.worker;
                let state = match old.worker(&w.name).filter(|(_, s)| same_worker(s, m)) {
                    Some((i, s)) => {
                        same &= old.weight(i) == w.weight && (s.state() == State::Draining) == m.draining;
                        kept.push(Arc::clone(s));
                        Arc::clone(s)
                    }
                    None => {
                        same = false;
                        let state = Arc::new(WorkerState::new(w, config, self.epoch));
                        if m.at_this_gateway {
                            state.mark_loop();
                        }
                        state
                    }
                };
                if m.draining {
                    state.drain();
                }
                (state, w.weight)
            })
            .collect();
        (members, kept, same)
    }

    /// Splits a member set (from etcd) into the members a table can be built from and those
    /// refused, each with the reason: one bad record (a weight that would pass the table limit, a
    /// weight the strategy refuses, an id that collides) is refused alone and the rest applies.
    /// The set is tried whole first; then each member alone; then, if the set still fails,
    /// members are added one at a time in the given order (canonical name order from
    /// `membership::record::members_of`), and each that would break the table is refused.
    /// A function of the set alone, so every gateway refuses the same records.
    pub fn admissible(&self, incoming: Vec<Member>) -> (Vec<Member>, Vec<Refused>) {
        let config = Arc::clone(&self.snapshot().config);
        let fits = |ms: &[&Member]| -> Result<(), MembershipError> {
            let placement = |source| MembershipError::Placement { pool: self.name.clone(), source };
            let nodes = node_set(ms.iter().map(|m| {
                let w = &m.worker;
                (w.name.as_str(), w.weight, w.zone.as_deref(), w.id)
            }))
            .map_err(placement)?;
            check_table_size(config.strategy, &config.options, &nodes)
                .map_err(|source| MembershipError::TooLarge { pool: self.name.clone(), source })?;
            Policy::build(config.strategy, nodes, &config.options).map(drop).map_err(placement)
        };
        if fits(&incoming.iter().collect::<Vec<_>>()).is_ok() {
            return (incoming, Vec::new());
        }
        let mut refused = Vec::new();
        let mut alone_ok = Vec::new();
        for m in incoming {
            match fits(&[&m]) {
                Ok(()) => alone_ok.push(m),
                Err(error) => refused.push(Refused { name: m.worker.name.clone(), error, with_others: false }),
            }
        }
        if fits(&alone_ok.iter().collect::<Vec<_>>()).is_ok() {
            return (alone_ok, refused);
        }
        let mut kept: Vec<Member> = Vec::new();
        for m in alone_ok {
            let mut with: Vec<&Member> = kept.iter().collect();
            with.push(&m);
            match fits(&with) {
                Ok(()) => kept.push(m),
                Err(error) => refused.push(Refused { name: m.worker.name.clone(), error, with_others: true }),
            }
        }
        (kept, refused)
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The distinct key hashes seen recently (up to 4,096), sorted.
    pub fn recent_keys(&self) -> Vec<u64> {
        self.recent.sample()
    }

    /// The last membership changes, oldest first.
    pub fn changes(&self) -> Vec<ChangeRecord> {
        self.changes.lock().iter().cloned().collect()
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
        self.edit(|snap, members| {
            if snap.worker(&config.name).is_some() {
                return Err(MembershipError::Duplicate { worker: config.name.clone(), pool: self.name.clone() });
            }
            members.push(Member { worker: config, draining: false, at_this_gateway: false });
            Ok(())
        })
    }

    /// Removes a worker now (requests it holds still finish).
    ///
    /// # Errors
    ///
    /// No such worker.
    pub fn remove_worker(&self, name: &str) -> Result<u64, MembershipError> {
        self.remove_where(name, |_| true)
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
        self.edit(|snap, members| {
            match snap.worker(name) {
                Some((_, w)) if hit(w) => members.retain(|m| m.worker.name != name),
                _ => return Err(MembershipError::UnknownWorker { worker: name.to_owned(), pool: self.name.clone() }),
            }
            Ok(())
        })
    }

    /// Sets a worker's weight (0 drains its share to the others). Nothing changes unless the new
    /// table builds.
    ///
    /// # Errors
    ///
    /// No such worker, or a weight the strategy refuses, or a table too large.
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<u64, MembershipError> {
        self.edit(|_, members| match members.iter_mut().find(|m| m.worker.name == name) {
            Some(m) => {
                m.worker.weight = weight;
                Ok(())
            }
            None => Err(MembershipError::UnknownWorker { worker: name.to_owned(), pool: self.name.clone() }),
        })
    }

    /// A reload's change: new settings, and for a static pool the configured members (an
    /// etcd-backed pool keeps its source's). Builds the snapshot a reload would publish by
    /// [`Pool::carry`], holding the pool's change lock until it is committed (or dropped, which
    /// changes nothing): a reload prepares every pool first, then commits them all.
    ///
    /// # Errors
    ///
    /// A set the strategy refuses, or a table too large.
    pub fn prepare(&self, config: PoolConfig) -> Result<Prepared<'_>, MembershipError> {
        let guard = self.change.lock();
        let old = self.snapshot();
        let members = match config.membership {
            MembershipConfig::Static => config
                .workers
                .iter()
                .map(|w| Member { worker: w.clone(), draining: false, at_this_gateway: false })
                .collect(),
            // The members are the source's: a reload changes only the pool's settings.
            MembershipConfig::Etcd(_) | MembershipConfig::Dns(_) => old.members(),
        };
        let config = Arc::new(config);
        let (members, kept, _) = self.carry(&old, &config, &members, false);
        let next = build(config, members, old.generation + 1, Some(&old))?;
        Ok(Prepared { _guard: guard, old, next, kept })
    }

    /// Publishes a prepared snapshot; returns its generation.
    pub fn commit(&self, prepared: Prepared<'_>) -> u64 {
        let Prepared { _guard, old, next, kept } = prepared;
        if !Arc::ptr_eq(&old.config, &next.config) {
            for w in &kept {
                w.retune(&next.config);
            }
        }
        self.publish(&old, next)
    }

    fn publish(&self, old: &Snapshot, next: Snapshot) -> u64 {
        // What share of the recently seen keys changes owner?
        let sample = self.recent.sample();
        let owner = |s: &Snapshot, h: u64| s.policy.owner(h).map(|i| s.workers[i].name.clone());
        let moved = sample.iter().filter(|&&h| owner(old, h) != owner(&next, h)).count();
        let ratio = if sample.is_empty() { 0.0 } else { moved as f64 / sample.len() as f64 };
        self.metrics.membership_changes.fetch_add(1, Relaxed);
        self.metrics.remapped_keys.fetch_add(moved as u64, Relaxed);
        self.metrics.last_remapped_ratio.store(ratio.to_bits(), Relaxed);
        let generation = next.generation;
        fn weights(s: &Snapshot) -> std::collections::HashMap<&str, u32> {
            s.workers.iter().enumerate().map(|(i, w)| (w.name.as_str(), s.weight(i))).collect()
        }
        let (before, after) = (weights(old), weights(&next));
        let names = |f: &dyn Fn(&str) -> bool, from: &std::collections::HashMap<&str, u32>| {
            let mut v: Vec<String> = from.keys().filter(|n| f(n)).map(|n| (*n).to_owned()).collect();
            v.sort_by(|a, b| keyroute::node::canonical_cmp(a, b));
            v
        };
        let record = ChangeRecord {
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            generation,
            workers: next.workers.len(),
            added: names(&|n| !before.contains_key(n), &after),
            removed: names(&|n| !after.contains_key(n), &before),
            reweighted: names(&|n| before.get(n).is_some_and(|w| after.get(n) != Some(w)), &before),
            remapped: ratio,
            sampled_keys: sample.len(),
        };
        {
            let mut log = self.changes.lock();
            if log.len() == CHANGE_LOG {
                log.pop_front();
            }
            log.push_back(record);
        }
        tracing::info!(
            pool = %self.name,
            generation,
            workers = next.workers.len(),
            sampled_keys = sample.len(),
            remapped = moved,
            "membership changed"
        );
        self.snapshot.store(Arc::new(next));
        generation
    }
}

/// Whether `member` is the worker `state` (see [`Pool::carry`]): the same name, address, zone and
/// id, and not a draining worker coming back active.
fn same_worker(state: &WorkerState, member: &Member) -> bool {
    let w = &member.worker;
    state.name == w.name
        && state.address == w.address
        && state.zone == w.zone
        && state.id == w.id
        && (state.state() != State::Draining || member.draining)
}

/// Builds a snapshot. With the snapshot it replaces (`old`), workers that were not in it have
/// joined: they start warming (slow start), and, with a handoff window, the snapshot carries the
/// table without them (and without those that joined earlier within the window).
fn build(
    config: Arc<PoolConfig>,
    mut members: Members,
    generation: u64,
    old: Option<&Snapshot>,
) -> Result<Snapshot, MembershipError> {
    // Canonical order (by name, numbers as numbers): the table, and so every placement, is a
    // function of the member set alone, whatever order or history the members came in. A
    // compatibility strategy over a static pool keeps the order of the configuration instead, as
    // the system it reproduces does (Guava's buckets, `redis-cli --cluster create`'s masters,
    // HAProxy's automatic ids and Envoy's running sums follow the list order).
    let keeps_order = matches!(config.strategy, keyroute::Strategy::Compat(_))
        && config.membership == crate::config::MembershipConfig::Static;
    if !keeps_order {
        members.sort_by(|a, b| keyroute::node::canonical_cmp(&a.0.name, &b.0.name));
    }
    let placement = |source| MembershipError::Placement { pool: config.name.clone(), source };
    let nodes = node_set(members.iter().map(|(w, weight)| (w.name.as_str(), *weight, w.zone.as_deref(), w.id)))
        .map_err(placement)?;
    check_table_size(config.strategy, &config.options, &nodes)
        .map_err(|source| MembershipError::TooLarge { pool: config.name.clone(), source })?;
    let policy = Policy::build(config.strategy, nodes, &config.options).map_err(placement)?;
    let workers: Vec<Arc<WorkerState>> = members.into_iter().map(|(w, _)| w).collect();
    let now = Instant::now();
    let hot = match (old.and_then(|o| o.hot.as_ref()), &config.hot_keys) {
        (Some(h), Some(c)) if h.config == *c => Some(Arc::clone(h)),
        (_, Some(c)) => crate::pool::hot::HotKeysState::new(c.clone(), now).map(Arc::new),
        _ => None,
    };
    // A pool that had no worker takes its first ones at once: there is nowhere else to warm from.
    let old = old.filter(|o| !o.workers.is_empty());
    // A worker joins when its name was not a member: one that comes back under its name with a
    // new address or zone replaces itself, and no other worker holds its keys warm (their owner
    // in the set without it would be a third, cold, worker).
    let joined = |w: &Arc<WorkerState>| old.is_some_and(|o| !o.workers.iter().any(|x| x.name == w.name));
    if config.slow_start.is_some() {
        for w in workers.iter().filter(|w| joined(w)) {
            w.start_warming(now);
        }
    }
    let warm = match (config.handoff, old) {
        (Some(window), Some(old)) => warm_for(&policy, &workers, old, window, now),
        _ => None,
    };
    Ok(Snapshot { generation, config, policy, workers, hot, warm })
}

/// The handoff of a new snapshot: its workers whose names were not in `old`, and those of `old`'s
/// handoff still within the window.
fn warm_for(
    policy: &Policy,
    workers: &[Arc<WorkerState>],
    old: &Snapshot,
    window: std::time::Duration,
    now: Instant,
) -> Option<snapshot::Warm> {
    let mut since = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        match old.workers.iter().position(|x| x.name == w.name) {
            None => since.push((i, now)),
            Some(j) => {
                if let Some(ow) = &old.warm
                    && let Some(&(_, t)) = ow.since.iter().find(|(k, _)| *k == j)
                    && now.saturating_duration_since(t) < window
                {
                    since.push((i, t));
                }
            }
        }
    }
    if since.is_empty() || since.len() == workers.len() {
        return None;
    }
    let warming: Vec<usize> = since.iter().map(|(i, _)| *i).collect();
    match keyroute::warm::Handoff::new(policy, &warming) {
        Ok(Some(handoff)) => Some(snapshot::Warm { handoff, since, window }),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "no handoff: the table without the new workers cannot be built");
            None
        }
    }
}

/// One steering rule for gateway and simulator (issue 19): one sequence of events (four workers,
/// a fifth joins, time passes through its warm-up window) driven through the gateway's snapshot
/// and through the simulator's decision, with the same decisions for every key at every moment.
#[cfg(test)]
mod steering_equals_the_simulators {
    use std::time::Duration;

    use keyroute::hash::SplitMix64;
    use keyroute::warm::Handoff;
    use keyroute::{Node, NodeSet, Options, Policy, Strategy};
    use keyroute_sim::fleet::{Moment, SimWarmup, decide_at};
    use tokio::time::Instant;

    use super::Pool;
    use crate::config::{PoolConfig, SlowStartConfig, WorkerConfig};

    fn pool(edit: impl FnOnce(&mut PoolConfig)) -> Pool {
        let worker = |i: u16| WorkerConfig {
            name: format!("w{i}"),
            address: ([127, 0, 0, 1], 9000 + i).into(),
            weight: 1,
            zone: None,
            id: None,
        };
        let mut config = PoolConfig::new("p", Strategy::Rendezvous, (1..=4).map(worker).collect());
        edit(&mut config);
        Pool::new(config, Instant::now()).expect("pool")
    }

    /// Hot keys with replicas, for [`compare`]: every key under `/thumb/hot-` is made hot (up to
    /// three replicas) and the workers get distinct loads, so that the replica choice (the least
    /// loaded of a key's first `r`) is decided by load, not by order.
    const HOT: usize = 200;

    fn hot_keys(c: &mut PoolConfig) {
        c.hot_keys = Some(crate::config::HotKeysConfig {
            rule: keyroute::hot::HotKeyConfig {
                threshold: keyroute::hot::Threshold::Rate(1.0),
                per_replica: 2.0,
                max_replicas: 3,
                hold: Duration::ZERO,
                confidence: 0.0,
            },
            window: Duration::from_secs(1),
            counters: 4 * HOT,
            sample_every: 1,
            show_keys: false,
        });
    }

    async fn compare(edit: impl FnOnce(&mut PoolConfig), warmup: SimWarmup) {
        compare_with(edit, warmup, false).await;
    }

    async fn compare_with(edit: impl FnOnce(&mut PoolConfig), warmup: SimWarmup, hot: bool) {
        let p = pool(|c| {
            edit(c);
            if hot {
                hot_keys(c);
            }
        });
        let w5 = WorkerConfig {
            name: "w5".into(),
            address: "127.0.0.1:9005".parse().expect("addr"),
            weight: 1,
            zone: None,
            id: None,
        };
        p.add_worker(w5).expect("join");
        // The simulator's own table over the same members (a function of the set alone).
        let names = ["w1", "w2", "w3", "w4", "w5"];
        let sim_policy = Policy::build(
            Strategy::Rendezvous,
            NodeSet::try_new(names.iter().map(|n| Node::new_unchecked(n))).expect("nodes"),
            &Options::default(),
        )
        .expect("policy");
        let newcomer =
            (0..names.len()).find(|&i| sim_policy.nodes().get(i).is_some_and(|n| n.name() == "w5")).expect("w5");
        let handoff = Handoff::new(&sim_policy, &[newcomer]).expect("handoff");
        let mut warming_seen = 0;
        let (mut replicated_seen, mut off_owner_seen) = (0, 0);
        // Distinct loads, the same on both sides (by name): w1 3, w2 0, w3 5, w4 1, w5 2.
        let load_of = |name: &str| match name {
            "w1" => 3,
            "w3" => 5,
            "w4" => 1,
            "w5" => 2,
            _ => 0,
        };
        let _held: Vec<super::endpoint::InFlight> = if hot {
            let snap = p.snapshot();
            snap.workers()
                .iter()
                .flat_map(|w| (0..load_of(&w.name)).map(|_| super::endpoint::InFlight::new(std::sync::Arc::clone(w))))
                .collect()
        } else {
            Vec::new()
        };
        for step in 0..=12u64 {
            let elapsed = Duration::from_millis(step * 1000);
            let snap = p.snapshot();
            let now = Instant::now();
            let moment = Moment {
                handoff: handoff.as_ref(),
                newcomer,
                elapsed,
                warmup,
                newcomer_reports: (0, 0),
                pool_hit_rate: 0.0,
            };
            let mut rng = SplitMix64::new(1);
            if let Some(hot) = snap.hot() {
                // The hot keys, seen often enough in the window that ends now to get replicas.
                for k in 0..HOT {
                    let key = format!("/thumb/hot-{k}.jpg");
                    let h = snap.policy.key_hash(key.as_bytes());
                    for _ in 0..(2 + k % 5) {
                        hot.observe(h, &key);
                    }
                }
                hot.tick(now);
            }
            let sim_loads = |i: usize| sim_policy.nodes().get(i).map_or(0, |n| load_of(n.name()));
            for k in 0..3000 {
                let key = if hot && k < HOT { format!("/thumb/hot-{k}.jpg") } else { format!("/thumb/img-{k}.jpg") };
                let h = snap.policy.key_hash(key.as_bytes());
                assert_eq!(h, sim_policy.key_hash(key.as_bytes()));
                let g = snap.decide(Some(h), &[], now).expect("a worker");
                // The simulator is told the replica count the gateway's detector gave the key.
                let replicas = snap.hot().map_or(0, |hot| hot.replicas(h));
                replicated_seen += usize::from(replicas > 1);
                let s = decide_at(&sim_policy, h, replicas, &sim_loads, &mut rng, Some(&moment)).expect("a worker");
                off_owner_seen += usize::from(g.spill == Some(keyroute::Spill::Replica));
                let name = |pol: &Policy, i: usize| pol.nodes().get(i).map(|n| n.name().to_owned());
                assert_eq!(
                    (name(&snap.policy, g.node), name(&snap.policy, g.owner.unwrap_or(usize::MAX)), g.spill),
                    (name(&sim_policy, s.node), name(&sim_policy, s.owner.unwrap_or(usize::MAX)), s.spill),
                    "key {key} at {elapsed:?}"
                );
                warming_seen += usize::from(g.spill == Some(keyroute::Spill::Warming));
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        // The comparison covered warm-up decisions, not only the plain strategy; with hot keys,
        // replicated keys, some served off their owner by load.
        assert!(warming_seen > 1000, "{warming_seen}");
        if hot {
            eprintln!("{replicated_seen} replicated decisions, {off_owner_seen} off the owner, {warming_seen} warming");
            assert!(
                replicated_seen > 1000 && off_owner_seen > 300,
                "{replicated_seen} replicated, {off_owner_seen} off their owner"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn hot_keys_with_replicas_by_load() {
        compare_with(|c| c.handoff = Some(Duration::from_secs(10)), SimWarmup::Handoff { window_ms: 10_000.0 }, true)
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn handoff() {
        compare(|c| c.handoff = Some(Duration::from_secs(10)), SimWarmup::Handoff { window_ms: 10_000.0 }).await;
    }

    #[tokio::test(start_paused = true)]
    async fn slow_start() {
        let ramp = keyroute::warm::Ramp::try_new(Duration::from_secs(10), 0.1).expect("ramp");
        compare(
            |c| c.slow_start = Some(SlowStartConfig { ramp, by_hit_rate: false }),
            SimWarmup::SlowStart { window_ms: 10_000.0, min_share: 0.1 },
        )
        .await;
    }
}

//! # keyroute-fleet: pools of workers, whatever protocol serves them
//!
//! The part of keyroute's server that every listener shares: the HTTP gateway, the memcached and
//! Redis proxy and the admin API all place keys on, and fail over between, the same pools. A pool
//! is a set of workers and one atomic snapshot of it; nothing here speaks a protocol.
//!
//! - **Members and snapshots** ([`pool`]): a [`Pool`] publishes one [`pool::Snapshot`] at a time
//!   (its settings, the placement table over its members, the members), built off the request
//!   path and swapped whole. Every member set is applied by one function, whatever its source (the
//!   configuration file, the admin API, etcd): the same worker keeps its state.
//! - **Workers** ([`pool::WorkerState`]): health, ejection, stall, warm-up and load, each owned
//!   once, shared by every snapshot that lists the worker. A protocol keeps its own per-worker state
//!   (the HTTP gateway's connections) in the worker's protocol slot.
//! - **The one steering rule** ([`pool::Snapshot::decide`], over [`keyroute::steer`]): hot-key
//!   replicas, the handoff, slow start, the strategy, and failover along the key's ranking past
//!   unavailable workers; the same for HTTP, the cache protocols and the simulator.
//! - **Health** ([`health`], [`prober`]): pure machines (rise and fall; passive ejection) fed by
//!   observations, and the prober task that runs a protocol's [`prober::Check`].
//! - **Membership from etcd** ([`membership`]): a task per pool reads and watches a prefix.
//! - **Settings** ([`config`]): a pool's, validated; one worker's validation.
//! - **Counters** ([`metrics`]): plain atomics owned by what they count.
//! - **Idle connections** ([`idle`]): what a client connection waits for besides its next bytes
//!   (a deadline, the server's stop), held by its thread for all of them.
//!
//! [`Fleet`] holds a running server's pools and starts their background tasks.
//!
//! Time comes in as `now` where a decision depends on it; tables depend on the member set alone.

pub mod config;
pub mod health;
pub mod idle;
pub mod membership;
pub mod metrics;
pub mod pool;
pub mod prober;
pub mod table;

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

pub use crate::config::{PoolConfig, WorkerConfig};
pub use crate::pool::{Member, MembershipError, Pool};

/// A running server's pools: the list every listener reads (swapped whole by a reload), what the
/// server is (its own addresses, which no worker may be), and the background tasks of each pool
/// (its prober, its membership source).
#[derive(Debug)]
pub struct Fleet {
    pools: ArcSwap<Vec<Arc<Pool>>>,
    epoch: Instant,
    own: Vec<SocketAddr>,
    admin: SocketAddr,
    shutdown: watch::Receiver<bool>,
    stopping: watch::Receiver<bool>,
    /// Pools whose prober task runs.
    pub(crate) probers: Mutex<Vec<String>>,
    /// Pools whose membership source task runs.
    pub(crate) sources: Mutex<Vec<String>>,
}

impl Fleet {
    /// The fleet of `pools`, for a server that listens at `own` (its listeners and its admin API
    /// at `admin`), whose clocks count from `epoch`. `shutdown` says the server stops (membership
    /// sources end, the server's announcement is revoked); `stopping`, that its listeners no longer
    /// accept (probers end).
    pub fn new(
        pools: Vec<Arc<Pool>>,
        epoch: Instant,
        own: Vec<SocketAddr>,
        admin: SocketAddr,
        shutdown: watch::Receiver<bool>,
        stopping: watch::Receiver<bool>,
    ) -> Arc<Fleet> {
        Arc::new(Fleet {
            pools: ArcSwap::from_pointee(pools),
            epoch,
            own,
            admin,
            shutdown,
            stopping,
            probers: Mutex::new(Vec::new()),
            sources: Mutex::new(Vec::new()),
        })
    }

    /// The pools, in configuration order.
    pub fn pools(&self) -> Arc<Vec<Arc<Pool>>> {
        self.pools.load_full()
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<Arc<Pool>> {
        self.pools.load().iter().find(|p| p.name == name).cloned()
    }

    /// Replaces the pools (a reload), and starts the tasks of those new or changed: a pool that
    /// left stops its prober and its source.
    pub fn replace(self: &Arc<Self>, pools: Vec<Arc<Pool>>) {
        let names: Vec<String> = pools.iter().map(|p| p.name.clone()).collect();
        self.pools.store(Arc::new(pools));
        self.probers.lock().retain(|n| names.contains(n));
        self.start();
    }

    /// Starts every pool's prober and membership source that is not running.
    pub fn start(self: &Arc<Self>) {
        prober::spawn_probers(self);
        membership::source::spawn_sources(self);
        membership::dns::spawn_sources(self);
    }

    /// What the server's clocks count from.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Every address the server listens at: no worker may be one of them.
    pub fn own_addrs(&self) -> &[SocketAddr] {
        &self.own
    }

    /// The admin API's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// A receiver of the server's stop.
    pub fn shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Whether the listeners no longer accept.
    pub fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Ends every pool's hot-key window that is due at `now` ([`pool::hot::HotKeysState::tick`]).
    pub fn tick(&self, now: Instant) {
        for pool in self.pools.load().iter() {
            if let Some(hot) = pool.snapshot().hot() {
                hot.tick(now);
            }
        }
    }

    /// Whether every pool has a worker that takes traffic at `now` (healthy or stalled, with
    /// weight): what `/readyz` adds to the server's own state.
    pub fn ready(&self, now: Instant) -> bool {
        self.pools.load().iter().all(|p| {
            let s = p.snapshot();
            (0..s.workers().len())
                .any(|i| s.weight(i) > 0 && matches!(s.state(i, now), pool::State::Healthy | pool::State::Stalled))
        })
    }
}

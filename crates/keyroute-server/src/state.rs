//! What the running server's tasks share: the pools, the HTTP request path's [`Front`], the
//! admin API, the listeners and their counters, and the shutdown signals.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::ListenerConfig;
use keyroute_fleet::metrics::{ListenerMetrics, ThreadMetrics};
use keyroute_gateway::proxy::Front;

/// State shared by every connection, the admin API and background tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The pools, every listener's: members, placement, health, and their tasks.
    pub(crate) fleet: Arc<keyroute_fleet::Fleet>,
    /// What the HTTP request path reads: routes and pools, the Via entry, request ids, draining.
    pub(crate) front: Arc<Front>,
    /// The admin API.
    pub(crate) admin: Arc<keyroute_admin::Admin>,
    pub(crate) epoch: Instant,
    pub(crate) listeners: Vec<ListenerConfig>,
    pub(crate) listener_metrics: Vec<Arc<ListenerMetrics>>,
    /// The admin listener's connection counts.
    pub(crate) admin_metrics: Arc<ListenerMetrics>,
    /// Client connections accepted by each runtime thread (the index is the thread's), as
    /// Envoy counts per worker: shows how the kernel spreads connections over the threads.
    pub(crate) threads: Arc<Mutex<Vec<Arc<ThreadMetrics>>>>,
    /// Each listener's connection limit in force.
    pub(crate) connection_limits: Vec<usize>,
    /// Each listener's connection permits: one semaphore shared by every thread accepting on it.
    pub(crate) connection_permits: Vec<Arc<tokio::sync::Semaphore>>,
    /// Each listener's threads: the connections each serves, and where a busy one hands a new
    /// connection over.
    pub(crate) balance: Vec<crate::balance::Balance>,
    /// Each TLS listener's certificates, which a reload replaces.
    pub(crate) certificates: Vec<Option<Arc<keyroute_gateway::tls::Certificates>>>,
    pub(crate) admin_listen: SocketAddr,
    /// SIGTERM received: `/readyz` says not ready.
    pub(crate) not_ready: Arc<AtomicBool>,
    /// Set by a shutdown request.
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set when the listeners stop accepting (after the shutdown delay).
    pub(crate) stop_accepting: watch::Sender<bool>,
    /// Set when the gateway has stopped (the grace period is over): extra runtime threads end.
    pub(crate) finished: watch::Sender<bool>,
    /// Woken whenever a client or admin connection closes (the shutdown waits on it).
    pub(crate) closed: Arc<tokio::sync::Notify>,
    /// The shutdown delay and grace period in milliseconds (a reload may change them).
    pub(crate) delay_ms: AtomicU64,
    pub(crate) grace_ms: AtomicU64,
    /// Serialises reloads.
    pub(crate) reload: Mutex<()>,
}

impl Shared {
    /// Runtime thread `thread`'s connection counters (made on first use).
    pub(crate) fn thread_metrics(&self, thread: usize) -> Arc<ThreadMetrics> {
        let mut v = self.threads.lock();
        while v.len() <= thread {
            v.push(Arc::default());
        }
        Arc::clone(&v[thread])
    }

    /// Every address the gateway listens at: no worker may be one of them.
    pub(crate) fn own_addrs(&self) -> Vec<SocketAddr> {
        let mut v: Vec<SocketAddr> = self.listeners.iter().map(|l| l.listen).collect();
        v.push(self.admin_listen);
        v
    }
}

/// Until `rx` says stop (the guard `wait_for` returns is dropped here, not held in a `select!`
/// across awaits, which would make the future not `Send`).
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Shared {
    /// Client and admin connections open now.
    pub(crate) fn open_connections(&self) -> u64 {
        self.listener_metrics.iter().chain(std::iter::once(&self.admin_metrics)).map(|m| m.open.load(Relaxed)).sum()
    }
}

/// See [`crate::GatewayHandle::ready`].
pub(crate) fn ready(shared: &Shared) -> bool {
    shared.admin.ready()
}

//! The active health checks: one task per pool probes every worker at once and feeds the results
//! to each worker's health machine ([`crate::health::HealthMachine`], rise and fall).
//!
//! What a probe is belongs to the protocol that serves the pool, as Envoy's health checkers sit
//! beside their codecs: an HTTP `GET` of the pool's health path on a fresh connection, memcached's
//! `version`, Redis's `PING` (after `AUTH`). Each is a [`Check`], set on the pool
//! ([`crate::pool::Pool::set_check`]); here are the schedule, the bound on each probe, the states
//! and the log lines, the same for every protocol.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::Fleet;
use crate::health::Transition;
pub use crate::pool::Check;
use crate::pool::{Pool, State};

/// Starts a prober for every pool that has none.
pub(crate) fn spawn_probers(fleet: &Arc<Fleet>) {
    let pools = fleet.pools();
    let mut running = fleet.probers.lock();
    for pool in pools.iter() {
        if running.contains(&pool.name) {
            continue;
        }
        running.push(pool.name.clone());
        tokio::spawn(probe_loop(Arc::downgrade(pool), Arc::downgrade(fleet)));
    }
}

/// Probes one pool's workers, round after round, until the pool or the fleet goes away or the
/// listeners stop.
async fn probe_loop(pool: Weak<Pool>, fleet: Weak<Fleet>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        let snap = p.snapshot();
        let health = snap.config().health.clone();
        let check = p.check().filter(|_| health.active);
        let Some(check) = check else {
            drop((p, snap));
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        // A worker at this gateway's own address is never sent to, nor probed (a probe would come
        // back through this gateway's own listener).
        let probes = snap.workers().iter().filter(|w| w.state() != State::Loop).map(|w| {
            let (w, check, pool_name) = (Arc::clone(w), Arc::clone(&check), p.name.clone());
            async move {
                let ok = matches!(tokio::time::timeout(health.timeout, check.check(&w)).await, Ok(true));
                match w.observe_probe(ok) {
                    Transition::Down => {
                        tracing::warn!(pool = %pool_name, worker = %w.name, "worker failed its health checks")
                    }
                    Transition::Up => {
                        // Back with whatever its cache kept: slow start (if on) ramps it up again.
                        w.start_warming(tokio::time::Instant::now());
                        tracing::info!(pool = %pool_name, worker = %w.name, "worker passed its health checks")
                    }
                    Transition::None => {}
                }
            }
        });
        // Probe every worker at once: one slow or dead worker must not delay the others' checks.
        let mut running = tokio::task::JoinSet::new();
        for f in probes {
            running.spawn(f);
        }
        drop(snap);
        drop(p);
        while running.join_next().await.is_some() {}
        if fleet.upgrade().is_none_or(|f| f.stopping()) {
            return;
        }
        tokio::time::sleep(health.interval).await;
    }
}

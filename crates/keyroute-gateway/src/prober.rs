//! The active health checks: one task per pool probes every worker at once, each on a fresh
//! connection, and feeds the results to each worker's health machine.

use std::sync::{Arc, Weak};
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;

use crate::health::Transition;
use crate::pool::Pool;
use crate::state::Shared;

/// Starts a prober for every pool that has none.
pub(crate) fn spawn_probers(shared: &Arc<Shared>) {
    let routing = shared.front.routing.load();
    let mut running = shared.probers.lock();
    for pool in &routing.pools {
        if running.contains(&pool.name) {
            continue;
        }
        running.push(pool.name.clone());
        let weak = Arc::downgrade(pool);
        let shared = Arc::downgrade(shared);
        tokio::spawn(probe_loop(weak, shared));
    }
}

/// Probes one pool's workers forever (until the pool or the gateway goes away).
async fn probe_loop(pool: Weak<Pool>, shared: Weak<Shared>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        let snap = p.snapshot();
        let health = snap.config().health.clone();
        let Some(path) = health.path.clone() else {
            drop((p, snap));
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        // A worker at this gateway's own address is never sent to, nor probed (a probe would come
        // back through this gateway's own listener).
        let probes = snap.workers().iter().filter(|w| w.state() != crate::pool::State::Loop).map(|w| {
            let w = Arc::clone(w);
            let path = path.clone();
            let pool_name = p.name.clone();
            async move {
                let ok = probe(&w, &path, health.timeout).await;
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
        if shared.upgrade().is_none_or(|s| *s.stop_accepting.borrow()) {
            return;
        }
        tokio::time::sleep(health.interval).await;
    }
}

/// One active check, on a fresh connection (as HAProxy checks): a worker that stops accepting
/// connections fails its checks even while pooled keep-alive connections still work.
async fn probe(worker: &crate::pool::WorkerState, path: &str, timeout: Duration) -> bool {
    let Ok(uri) = http::Uri::try_from(path) else { return false };
    let mut req = Request::new(crate::body::empty());
    *req.uri_mut() = uri;
    if let Ok(host) = http::HeaderValue::try_from(worker.address.to_string()) {
        req.headers_mut().insert(http::header::HOST, host);
    }
    req.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    let fut = async {
        let (parts, body) = req.into_parts();
        let resp = worker.upstream.send(&parts, body, false).await.ok()?;
        let ok = resp.status().is_success();
        resp.into_body().collect().await.ok()?;
        Some(ok)
    };
    matches!(tokio::time::timeout(timeout, fut).await, Ok(Some(true)))
}

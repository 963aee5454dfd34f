//! The respond stage: what the client gets. The worker's response (its head without hop-by-hop
//! headers and with the worker header; stored in the cache when this request led a hot key's
//! miss); a tunnel, after a 101; or, when no try succeeded, an error with a reason class and the
//! request id only (the detail is in the log under the same id).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::header::HeaderValue;
use http::{Response, StatusCode};
use tokio::time::Instant;

use super::attempt::Failure;
use super::cache::{Caching, X_CACHE};
use super::{Route, tunnel};
use crate::body::{self, ProxyBody};
use crate::cache::HotCache;
use crate::head::{Answer, ReqHead};
use keyroute_fleet::pool::{InFlight, Pool, Snapshot, WorkerState};

/// The request lacks a part of its key, and the pool rejects such requests.
pub(super) fn missing_key(pool: &Pool, missing: &crate::key::MissingPart, id: &str) -> Response<ProxyBody> {
    tracing::debug!(request_id = %id, pool = %pool.name, part = %missing.0, "key part missing");
    body::error(StatusCode::BAD_REQUEST, "the request lacks a part of its key", "missing_key", id)
}

/// A worker answered: an unsafe method's success invalidates what the cache holds for its URL
/// (RFC 9111 §4.4); a request that leads a hot key's miss stores the answer; one that waited for
/// another's miss in vain says so.
pub(super) async fn answered(
    cache: Option<&HotCache>,
    head: &ReqHead,
    mut resp: Answer,
    caching: Option<Caching>,
    waited: bool,
) -> Answer {
    if !head.method.is_safe()
        && let Some(c) = cache
    {
        c.store.invalidate(&head.to_parts(), resp.head.status);
    }
    match caching {
        // The cache keeps heads as maps.
        Some(c) => c.store(resp.into_response()).await.into(),
        None => {
            if waited {
                resp.head.fields.insert(X_CACHE, HeaderValue::from_static("miss"));
            }
            resp
        }
    }
}

/// The worker switched protocols: the 101 goes back, carrying the tunnel that the client's
/// connection starts once it has written it ([`tunnel::Pending`]); the tunnel holds the worker's
/// in-flight count until it closes. With an access log, the request's line waits for the
/// tunnel's end.
pub(super) fn upgraded(
    mut resp: Answer,
    worker_side: crate::upstream::Upgraded,
    in_flight: InFlight,
    worker: &Arc<WorkerState>,
    route: &Route<'_>,
    id: &str,
    logged: bool,
) -> Answer {
    let end = logged.then(|| {
        let (tx, rx) = tokio::sync::oneshot::channel();
        resp.head.extensions.insert(crate::access::TunnelLine::new(rx));
        tx
    });
    let t = tunnel::Tunnel {
        request_id: id.to_owned(),
        worker: worker.name.clone(),
        idle: route.tunnel.map_or(Duration::from_secs(60), |t| t.0),
        in_flight,
        end,
        metrics: route.tunnel.map(|t| Arc::clone(&t.1)),
    };
    resp.head.extensions.insert(tunnel::Pending::new(worker_side, t));
    resp
}

/// No try succeeded: why, as the client may know it.
pub(super) fn failed(pool: &Pool, snap: &Snapshot, last: Option<Failure>, id: &str) -> Response<ProxyBody> {
    match last {
        None => {
            pool.metrics.no_worker.fetch_add(1, Relaxed);
            let why = snap.why_unavailable(Instant::now());
            tracing::warn!(request_id = %id, pool = %pool.name, workers = snap.workers().len(), reason = why.reason(), detail = %why, "no available worker");
            body::error(StatusCode::SERVICE_UNAVAILABLE, "no worker is available", why.reason(), id)
        }
        Some(Failure::Timeout) => {
            body::error(StatusCode::GATEWAY_TIMEOUT, "the worker did not answer in time", "upstream_timeout", id)
        }
        Some(Failure::Stalled) => {
            body::error(StatusCode::GATEWAY_TIMEOUT, "the worker did not answer in time", "upstream_stalled", id)
        }
        Some(Failure::Connect(_)) => {
            body::error(StatusCode::BAD_GATEWAY, "no worker could be reached", "upstream_connect", id)
        }
        Some(Failure::Upstream(_) | Failure::Unoffered) => {
            body::error(StatusCode::BAD_GATEWAY, "the worker's response failed", "upstream_failed", id)
        }
    }
}

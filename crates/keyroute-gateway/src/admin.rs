//! The admin API, on its own listener (loopback by default; a bearer token is required when it is
//! bound elsewhere, and enforced whenever one is configured).
//!
//! | method and path | what |
//! |---|---|
//! | `GET /healthz` | the gateway process is up (no token needed) |
//! | `GET /readyz` | every pool has an available worker (no token needed) |
//! | `GET /metrics` | Prometheus text |
//! | `GET /workers[?pool=P]` | each pool's workers: state, weight, in flight, counts |
//! | `POST /workers[?pool=P]` | add a worker: `{"name", "address", "weight"?, "zone"?}` |
//! | `DELETE /workers/NAME[?pool=P&drain=true]` | remove now, or drain (no new requests) then remove |
//! | `PATCH /workers/NAME[?pool=P]` | `{"weight": W}` |
//! | `GET /placement?key=K[&pool=P]` | the key's ranking and where it would go now |
//!
//! `?pool=` may be omitted when there is one pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;

use crate::config::WorkerConfig;
use crate::key::{percent_decode, query_value};
use crate::metrics::{CLASSES, Exposition};
use crate::pool::{Pool, State};
use crate::proxy::{ProxyBody, json_error};
use crate::server::Shared;

fn json(status: StatusCode, value: serde_json::Value) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(value.to_string() + "\n"))
            .map_err(|never: std::convert::Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body)).map_err(|never: std::convert::Infallible| match never {}).boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    resp
}

/// Compares in time independent of where the inputs differ (lengths are not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorized(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(token) = &shared.admin_token else { return true };
    let given = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    constant_time_eq(given.as_bytes(), token.as_bytes())
}

fn param(req: &Request<Incoming>, name: &str) -> Option<String> {
    query_value(req.uri().query().unwrap_or(""), name).map(percent_decode)
}

/// Handles one admin request.
pub(crate) async fn handle(shared: &Arc<Shared>, req: Request<Incoming>, remote: SocketAddr) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "text/plain", "ok\n".into()),
        (&Method::GET, "/readyz") => {
            let handle_ready =
                shared.routing.load().pools.iter().all(|p| p.snapshot().workers.iter().any(|w| w.available()));
            return if handle_ready {
                text(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: a pool has no available worker\n".into(),
                )
            };
        }
        _ => {}
    }
    if !authorized(shared, &req) {
        tracing::warn!(%remote, %path, "admin request without a valid token");
        let mut resp = json_error(StatusCode::UNAUTHORIZED, "a valid bearer token is required", serde_json::json!({}));
        resp.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        return resp;
    }
    let routing = shared.routing.load_full();
    let pool_name = param(&req, "pool");
    // The pool named by `?pool=` (or the only one), or a 404 response naming the choices.
    macro_rules! pool_or_404 {
        () => {
            match routing.pool(pool_name.as_deref()) {
                Ok(p) => Arc::clone(p),
                Err(e) => return json_error(StatusCode::NOT_FOUND, &e, serde_json::json!({})),
            }
        };
    }
    let bad = |msg: String| json_error(StatusCode::BAD_REQUEST, &msg, serde_json::json!({}));
    let worker_name = path.strip_prefix("/workers/").map(percent_decode).filter(|n| !n.is_empty());
    match (&method, path.as_str(), worker_name) {
        (&Method::GET, "/metrics", _) => text(StatusCode::OK, "text/plain; version=0.0.4", metrics(&routing.pools)),
        (&Method::GET, "/workers", _) => {
            let pools: Vec<Arc<Pool>> = match &pool_name {
                Some(_) => vec![pool_or_404!()],
                None => routing.pools.clone(),
            };
            json(StatusCode::OK, serde_json::json!({ "pools": pools.iter().map(|p| describe(p)).collect::<Vec<_>>() }))
        }
        (&Method::POST, "/workers", _) => {
            let pool = pool_or_404!();
            let body: serde_json::Value = match read_json(req).await {
                Ok(v) => v,
                Err(e) => return bad(e),
            };
            let name = body["name"].as_str().unwrap_or("").to_owned();
            if name.is_empty() {
                return bad("\"name\" is required".into());
            }
            let Some(address) = body["address"].as_str().and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return bad("\"address\" must be an ip:port".into());
            };
            let weight = match &body["weight"] {
                serde_json::Value::Null => 1,
                w => match w.as_u64().and_then(|w| u32::try_from(w).ok()) {
                    Some(w) => w,
                    None => return bad("\"weight\" must be an integer in 0..=4294967295".into()),
                },
            };
            let zone = body["zone"].as_str().map(str::to_owned).filter(|z| !z.is_empty());
            match pool.add_worker(WorkerConfig { name: name.clone(), address, weight, zone }) {
                Ok(generation) => json(
                    StatusCode::CREATED,
                    serde_json::json!({ "added": name, "pool": pool.name, "generation": generation }),
                ),
                Err(e) => json_error(StatusCode::CONFLICT, &e.to_string(), serde_json::json!({})),
            }
        }
        (&Method::DELETE, _, Some(name)) => {
            let pool = pool_or_404!();
            if param(&req, "drain").as_deref() == Some("true") {
                let Some((_, w)) = pool.snapshot().worker(&name).map(|(i, w)| (i, Arc::clone(w))) else {
                    return json_error(
                        StatusCode::NOT_FOUND,
                        &format!("no worker named '{name}'"),
                        serde_json::json!({}),
                    );
                };
                w.drain();
                let pool_name = pool.name.clone();
                tokio::spawn(async move {
                    let until = tokio::time::Instant::now() + Duration::from_secs(300);
                    while w.in_flight() > 0 && tokio::time::Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    match pool.remove_exact(&w) {
                        Ok(g) => {
                            tracing::info!(pool = %pool.name, worker = %w.name, generation = g, "drained and removed")
                        }
                        Err(e) => {
                            tracing::warn!(pool = %pool.name, worker = %w.name, error = %e, "drain finished but removal failed")
                        }
                    }
                });
                json(StatusCode::ACCEPTED, serde_json::json!({ "draining": name, "pool": pool_name }))
            } else {
                match pool.remove_worker(&name) {
                    Ok(generation) => json(
                        StatusCode::OK,
                        serde_json::json!({ "removed": name, "pool": pool.name, "generation": generation }),
                    ),
                    Err(e) => json_error(StatusCode::NOT_FOUND, &e.to_string(), serde_json::json!({})),
                }
            }
        }
        (&Method::PATCH, _, Some(name)) => {
            let pool = pool_or_404!();
            let body: serde_json::Value = match read_json(req).await {
                Ok(v) => v,
                Err(e) => return bad(e),
            };
            let Some(weight) = body["weight"].as_u64().and_then(|w| u32::try_from(w).ok()) else {
                return bad("\"weight\" must be an integer in 0..=4294967295".into());
            };
            match pool.set_weight(&name, weight) {
                Ok(generation) => json(
                    StatusCode::OK,
                    serde_json::json!({ "worker": name, "weight": weight, "generation": generation }),
                ),
                Err(e @ crate::pool::MembershipError::UnknownWorker(..)) => {
                    json_error(StatusCode::NOT_FOUND, &e.to_string(), serde_json::json!({}))
                }
                Err(e) => json_error(StatusCode::UNPROCESSABLE_ENTITY, &e.to_string(), serde_json::json!({})),
            }
        }
        (&Method::GET, "/placement", _) => {
            let pool = pool_or_404!();
            let Some(key) = param(&req, "key") else { return bad("?key= is required".into()) };
            let snap = pool.snapshot();
            let hash = snap.policy.key_hash(key.as_bytes());
            let ranking: Vec<serde_json::Value> = snap
                .policy
                .ranked(hash)
                .map(|i| {
                    let w = &snap.workers[i];
                    serde_json::json!({ "name": w.name, "state": w.state(), "in_flight": w.in_flight(), "weight": w.weight() })
                })
                .collect();
            let now = snap.decide(snap.policy.strategy().uses_key().then_some(hash), &[]);
            json(
                StatusCode::OK,
                serde_json::json!({
                    "pool": pool.name,
                    "strategy": snap.policy.strategy().name(),
                    "generation": snap.generation,
                    "key": key,
                    "hash": format!("{hash:016x}"),
                    "owner": snap.policy.owner(hash).map(|i| snap.workers[i].name.clone()),
                    "ranking": ranking,
                    "would_go_to": now.map(|d| snap.workers[d.node].name.clone()),
                }),
            )
        }
        _ => json_error(StatusCode::NOT_FOUND, "no such admin endpoint", serde_json::json!({ "path": path })),
    }
}

async fn read_json(req: Request<Incoming>) -> Result<serde_json::Value, String> {
    let body =
        Limited::new(req.into_body(), 64 * 1024).collect().await.map_err(|e| format!("reading the body: {e}"))?;
    serde_json::from_slice(&body.to_bytes()).map_err(|e| format!("the body is not JSON: {e}"))
}

fn describe(p: &Pool) -> serde_json::Value {
    let snap = p.snapshot();
    let workers: Vec<serde_json::Value> = snap
        .workers
        .iter()
        .map(|w| {
            let responses: serde_json::Map<String, serde_json::Value> = CLASSES
                .iter()
                .zip(&w.metrics.responses)
                .map(|(c, n)| ((*c).to_owned(), n.load(Relaxed).into()))
                .collect();
            serde_json::json!({
                "name": w.name,
                "address": w.address.to_string(),
                "weight": w.weight(),
                "zone": w.zone,
                "state": w.state(),
                "in_flight": w.in_flight(),
                "requests": w.metrics.total(),
                "responses": responses,
                "retries": w.metrics.retries.load(Relaxed),
                "ejections": w.metrics.ejections.load(Relaxed),
            })
        })
        .collect();
    serde_json::json!({
        "pool": p.name,
        "strategy": snap.policy.strategy().name(),
        "key": snap.config.key.as_str(),
        "generation": snap.generation,
        "workers": workers,
    })
}

fn metrics(pools: &[Arc<Pool>]) -> String {
    let mut e = Exposition::default();
    for p in pools {
        let snap = p.snapshot();
        let pool = p.name.as_str();
        e.family(
            "keyroute_pool_requests_total",
            "counter",
            "Placements by outcome: served by the key's owner, or spilled and why.",
        );
        for (i, outcome) in ["owner", "unavailable", "overloaded", "retry", "unkeyed"].iter().enumerate() {
            e.sample(
                "keyroute_pool_requests_total",
                &[("pool", pool), ("outcome", outcome)],
                p.metrics.outcomes[i].load(Relaxed),
            );
        }
        e.family("keyroute_pool_no_worker_total", "counter", "Requests answered 503: no available worker.");
        e.sample("keyroute_pool_no_worker_total", &[("pool", pool)], p.metrics.no_worker.load(Relaxed));
        e.family("keyroute_pool_missing_key_total", "counter", "Requests whose key template could not be rendered.");
        e.sample("keyroute_pool_missing_key_total", &[("pool", pool)], p.metrics.missing_key.load(Relaxed));
        e.family("keyroute_pool_membership_changes_total", "counter", "Membership or weight changes.");
        e.sample(
            "keyroute_pool_membership_changes_total",
            &[("pool", pool)],
            p.metrics.membership_changes.load(Relaxed),
        );
        e.family(
            "keyroute_pool_remapped_keys_total",
            "counter",
            "Recently seen keys whose owner changed, over all membership changes.",
        );
        e.sample("keyroute_pool_remapped_keys_total", &[("pool", pool)], p.metrics.remapped_keys.load(Relaxed));
        e.family(
            "keyroute_pool_last_remapped_ratio",
            "gauge",
            "Share of recently seen keys remapped by the last membership change.",
        );
        e.sample(
            "keyroute_pool_last_remapped_ratio",
            &[("pool", pool)],
            f64::from_bits(p.metrics.last_remapped_ratio.load(Relaxed)),
        );
        e.family("keyroute_pool_generation", "gauge", "The pool snapshot's generation.");
        e.sample("keyroute_pool_generation", &[("pool", pool)], snap.generation);
        for w in &snap.workers {
            let labels = [("pool", pool), ("worker", w.name.as_str())];
            e.family(
                "keyroute_worker_responses_total",
                "counter",
                "Upstream responses by status class (error: no response).",
            );
            for (i, class) in CLASSES.iter().enumerate() {
                let mut l = labels.to_vec();
                l.push(("class", class));
                e.sample("keyroute_worker_responses_total", &l, w.metrics.responses[i].load(Relaxed));
            }
            e.family("keyroute_worker_in_flight", "gauge", "Requests in flight, until their response bodies end.");
            e.sample("keyroute_worker_in_flight", &labels, w.in_flight());
            e.family("keyroute_worker_weight", "gauge", "The weight in use.");
            e.sample("keyroute_worker_weight", &labels, w.weight());
            e.family("keyroute_worker_healthy", "gauge", "1 when the worker takes new requests.");
            e.sample("keyroute_worker_healthy", &labels, u8::from(w.state() == State::Healthy));
            e.family("keyroute_worker_state", "gauge", "The worker's state (1 for the current one).");
            for st in [State::Healthy, State::Unhealthy, State::Ejected, State::Draining] {
                let name =
                    serde_json::to_value(st).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
                let mut l = labels.to_vec();
                l.push(("state", &name));
                e.sample("keyroute_worker_state", &l, u8::from(w.state() == st));
            }
            e.family("keyroute_worker_retries_total", "counter", "Failed tries that were retried on another worker.");
            e.sample("keyroute_worker_retries_total", &labels, w.metrics.retries.load(Relaxed));
            e.family("keyroute_worker_ejections_total", "counter", "Passive ejections.");
            e.sample("keyroute_worker_ejections_total", &labels, w.metrics.ejections.load(Relaxed));
            e.family("keyroute_worker_connect_errors_total", "counter", "Connection failures.");
            e.sample("keyroute_worker_connect_errors_total", &labels, w.metrics.connect_errors.load(Relaxed));
            e.family("keyroute_worker_latency_seconds", "histogram", "Time to the upstream response headers.");
            e.histogram("keyroute_worker_latency_seconds", &labels, &w.metrics);
        }
    }
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"secret-token-123", b"secret-token-123"));
        assert!(!constant_time_eq(b"secret-token-123", b"secret-token-124"));
        assert!(!constant_time_eq(b"short", b"longer"));
    }
}

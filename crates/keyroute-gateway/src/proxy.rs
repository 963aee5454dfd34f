//! Forwarding one request: route, key, decide, send, retry on the next-ranked worker, stream back.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use keyroute::Spill;
use tokio::time::Instant;

use crate::config::MissingKey;
use crate::metrics::Outcome;
use crate::pool::{InFlight, Pool, Snapshot, WorkerState};
use crate::upstream::{Conn, SendError};

/// The body type the gateway sends and returns.
pub type ProxyBody = UnsyncBoxBody<Bytes, hyper::Error>;

fn empty() -> ProxyBody {
    Empty::<Bytes>::new().map_err(|never: Infallible| match never {}).boxed_unsync()
}

/// A small JSON error response.
pub fn json_error(status: StatusCode, error: &str, detail: serde_json::Value) -> Response<ProxyBody> {
    let mut body = serde_json::json!({ "error": error, "status": status.as_u16() });
    if let (Some(map), serde_json::Value::Object(extra)) = (body.as_object_mut(), detail) {
        map.extend(extra);
    }
    let bytes = Bytes::from(body.to_string() + "\n");
    let mut resp = Response::new(Full::new(bytes).map_err(|never: Infallible| match never {}).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1) are not forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the (few) headers, instead of a hash lookup per hop-by-hop name.
    let mut drop: Vec<HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        if HOP_BY_HOP.contains(name) || name == header::TRANSFER_ENCODING {
            drop.push(name.clone());
            if name == header::CONNECTION {
                let listed = value.to_str().ok().into_iter().flat_map(|v| v.split(','));
                // `Connection: host` must not strip the Host header an HTTP/1.1 request needs.
                drop.extend(listed.filter_map(|n| HeaderName::try_from(n.trim()).ok()).filter(|n| n != header::HOST));
            }
        }
    }
    for name in &drop {
        headers.remove(name);
    }
}

/// What a connection's requests share: the client's address, and the forwarding headers' values
/// for it, rendered once per connection.
#[derive(Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    xff: HeaderValue,
    forwarded: String,
}

impl Peer {
    /// The forwarding values for a client address.
    pub fn new(addr: SocketAddr) -> Self {
        let ip = addr.ip().to_string();
        let node = if addr.is_ipv6() { format!("\"[{ip}]\"") } else { ip.clone() };
        Peer {
            addr,
            xff: HeaderValue::try_from(ip).unwrap_or_else(|_| HeaderValue::from_static("unknown")),
            forwarded: format!("for={node};proto=http"),
        }
    }
}

/// Adds `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`.
fn add_forwarded(headers: &mut HeaderMap, peer: &Peer) {
    match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => {
            if let Ok(v) = HeaderValue::try_from(format!("{prev}, {}", peer.addr.ip())) {
                headers.insert("x-forwarded-for", v);
            }
        }
        None => {
            headers.insert("x-forwarded-for", peer.xff.clone());
        }
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
    let host = headers.get(header::HOST).cloned();
    let mut fwd = peer.forwarded.clone();
    if let Some(h) = host {
        if let Ok(text) = h.to_str()
            && text.bytes().all(|b| b.is_ascii_graphic() && b != b'"')
        {
            fwd.push_str(";host=\"");
            fwd.push_str(text);
            fwd.push('"');
        }
        headers.insert("x-forwarded-host", h);
    }
    let value = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {fwd}"),
        None => fwd,
    };
    if let Ok(v) = HeaderValue::try_from(value) {
        headers.insert(header::FORWARDED, v);
    }
}

/// A response body that holds its worker's in-flight count until it ends, and then gives the
/// connection back to the worker's pool.
struct Guarded {
    inner: Incoming,
    guard: Option<InFlight>,
    conn: Option<(Arc<WorkerState>, Conn)>,
}

impl Guarded {
    /// The response has been read to the end: release the load and pool the connection.
    fn finish(&mut self) {
        self.guard = None;
        if let Some((worker, conn)) = self.conn.take() {
            worker.upstream.checkin(conn);
        }
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        match &poll {
            // The server stops polling once `is_end_stream` says so, so finish on the last frame.
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.finish(),
            Poll::Ready(Some(Err(_))) => {
                self.guard = None;
                self.conn = None;
            }
            _ => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
}

/// Why the last try failed.
enum Failure {
    Connect(String),
    Timeout,
    Other(String),
}

/// Proxies a request to `pool`. Never fails: every error becomes a response.
pub async fn forward(pool: &Arc<Pool>, req: Request<Incoming>, peer: &Peer) -> Response<ProxyBody> {
    let snap = pool.snapshot();
    let started = Instant::now();
    let (mut parts, body) = req.into_parts();

    // The key.
    let mut key = String::new();
    let hash = if snap.policy.strategy().uses_key() {
        match snap.config.key.render(&parts, peer.addr.ip(), &mut key) {
            Ok(()) => {
                let h = snap.policy.key_hash(key.as_bytes());
                pool.record_key(h);
                Some(h)
            }
            Err(missing) => {
                pool.metrics.missing_key.fetch_add(1, Relaxed);
                if snap.config.on_missing_key == MissingKey::Reject {
                    tracing::debug!(pool = %pool.name, part = %missing.0, "key part missing");
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        "missing key part",
                        serde_json::json!({ "pool": pool.name, "missing": missing.0, "template": snap.config.key.as_str() }),
                    );
                }
                None
            }
        }
    } else {
        None
    };

    // The upstream request's fixed parts.
    strip_hop_by_hop(&mut parts.headers);
    add_forwarded(&mut parts.headers, peer);
    // Origin form: the path and query, whatever form the client used.
    let target: Uri = match parts.uri.path_and_query() {
        Some(pq) if parts.uri.scheme().is_some() => Uri::from(pq.clone()),
        Some(_) => parts.uri.clone(),
        None => Uri::from_static("/"),
    };
    let replayable = body.is_end_stream();
    let retry = &snap.config.retry;
    let attempts = if replayable { retry.attempts } else { 1 };
    let deadline = started + retry.deadline;
    let mut body = Some(body.boxed_unsync());
    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<Failure> = None;
    // Passive ejection may take out at most half the pool: past that, a failure is more likely
    // the request's (or the network's) than every worker's.
    let max_ejected = snap.workers.len() / 2;

    for attempt in 0..attempts {
        let now = Instant::now();
        if now >= deadline {
            last = last.or(Some(Failure::Timeout));
            break;
        }
        let Some(decision) = snap.decide(hash, &tried) else {
            break;
        };
        let worker = Arc::clone(&snap.workers[decision.node]);
        pool.metrics.outcome(match (attempt, hash.is_some() && decision.owner.is_some(), decision.spill) {
            (a, _, _) if a > 0 => Outcome::Retry,
            (_, false, _) => Outcome::Unkeyed,
            (_, true, None) => Outcome::Owner,
            (_, true, Some(Spill::Unavailable)) => Outcome::Unavailable,
            (_, true, Some(_)) => Outcome::Overloaded,
        });
        let per_try = retry.per_try_timeout.min(deadline - now);
        let may_eject =
            || snap.workers.iter().filter(|w| w.state() == crate::pool::State::Ejected).count() < max_ejected;
        let guard = InFlight::new(Arc::clone(&worker));
        let sent = Instant::now();
        // One more try on a fresh connection to the same worker when a pooled connection failed
        // under a replayable, idempotent request: the worker may just have closed it as idle.
        let mut fresh_retry = replayable && idempotent(&parts.method);
        let result = loop {
            let mut upstream = Request::new(body.take().unwrap_or_else(empty));
            *upstream.method_mut() = parts.method.clone();
            *upstream.uri_mut() = target.clone();
            *upstream.headers_mut() = parts.headers.clone();
            if !upstream.headers().contains_key(header::HOST)
                && let Ok(v) = HeaderValue::try_from(worker.address.to_string())
            {
                upstream.headers_mut().insert(header::HOST, v);
            }
            let r = tokio::time::timeout(per_try, worker.upstream.send(upstream)).await;
            match r {
                Ok(Err(SendError::Request { reused: true, .. })) if fresh_retry => fresh_retry = false,
                r => break r,
            }
        };
        let latency = sent.elapsed();
        match result {
            Ok(Ok((resp, conn))) => {
                let status = resp.status();
                worker.metrics.record(Some(status.as_u16()), latency);
                // The ejection cap is only looked at when this outcome is a failure.
                let ok = !status.is_server_error();
                if worker.observe_request(ok, !ok && may_eject()).is_some() {
                    tracing::warn!(pool = %pool.name, worker = %worker.name, status = status.as_u16(), "worker ejected after consecutive 5xx");
                }
                return respond(&snap, &worker, resp, conn, guard, &key, decision.node, attempt);
            }
            Ok(Err(e)) => {
                let connect = matches!(e, SendError::Connect(_));
                worker.metrics.record(None, latency);
                if connect {
                    worker.metrics.connect_errors.fetch_add(1, Relaxed);
                }
                if worker.observe_request(false, may_eject()).is_some() {
                    tracing::warn!(pool = %pool.name, worker = %worker.name, "worker ejected after consecutive failures");
                }
                let reason = e.to_string();
                tracing::warn!(pool = %pool.name, worker = %worker.name, attempt, connect, error = %reason, "upstream request failed");
                last = Some(if connect { Failure::Connect(reason) } else { Failure::Other(reason) });
            }
            Err(_) => {
                worker.metrics.record(None, latency);
                worker.observe_request(false, may_eject());
                tracing::warn!(pool = %pool.name, worker = %worker.name, attempt, timeout_ms = per_try.as_millis() as u64, "upstream timed out");
                last = Some(Failure::Timeout);
            }
        }
        tried.push(decision.node);
        drop(guard);
        // A request that may have reached the worker is retried only if idempotent.
        let sent_maybe = !matches!(last, Some(Failure::Connect(_)));
        if attempt + 1 == attempts || (sent_maybe && !idempotent(&parts.method)) {
            break;
        }
        worker.metrics.retries.fetch_add(1, Relaxed);
    }
    match last {
        None => {
            pool.metrics.no_worker.fetch_add(1, Relaxed);
            let states: Vec<serde_json::Value> =
                snap.workers.iter().map(|w| serde_json::json!({ "name": w.name, "state": w.state() })).collect();
            tracing::warn!(pool = %pool.name, workers = snap.workers.len(), "no available worker");
            json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "no available worker",
                serde_json::json!({
                    "pool": pool.name,
                    "reason": if snap.workers.is_empty() { "the pool has no workers" } else { "every worker is unhealthy, ejected or draining" },
                    "workers": states,
                }),
            )
        }
        Some(Failure::Timeout) => json_error(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream timed out",
            serde_json::json!({ "pool": pool.name, "tries": tried.len().max(1) }),
        ),
        Some(Failure::Connect(reason)) => json_error(
            StatusCode::BAD_GATEWAY,
            "cannot connect to a worker",
            serde_json::json!({ "pool": pool.name, "tries": tried.len(), "reason": reason }),
        ),
        Some(Failure::Other(reason)) => json_error(
            StatusCode::BAD_GATEWAY,
            "upstream request failed",
            serde_json::json!({ "pool": pool.name, "tries": tried.len(), "reason": reason }),
        ),
    }
}

#[allow(clippy::too_many_arguments)]
fn respond(
    snap: &Snapshot,
    worker: &Arc<WorkerState>,
    resp: Response<Incoming>,
    conn: Conn,
    guard: InFlight,
    key: &str,
    node: usize,
    attempt: u32,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(h) = &snap.config.worker_header
        && let Ok(v) = HeaderValue::try_from(worker.name.as_str())
    {
        parts.headers.insert(h.clone(), v);
    }
    tracing::trace!(worker = %worker.name, node, attempt, key, status = parts.status.as_u16(), "proxied");
    let mut guarded = Guarded { inner: body, guard: Some(guard), conn: Some((Arc::clone(worker), conn)) };
    if guarded.inner.is_end_stream() {
        // No body at all (HEAD, 204, 304, an empty 200): nothing will be polled.
        guarded.finish();
    }
    Response::from_parts(parts, guarded.boxed_unsync())
}

//! Forwarding one request, as a service that tests (and fuzzers) can call without a socket.
//!
//! The steps, each a function below:
//!
//! 1. **head** ([`headers`]): request id, loop check (`Via`), one unambiguous Host, a normalised
//!    path; a bad head is the client's error (400), never a worker's.
//! 2. **route**: listener, host and path prefix to a pool.
//! 3. **key**: the pool's key template over the request; a missing part is rejected (400) or
//!    placed by power of two choices, as configured.
//! 4. **attempts**: the key's ranking, skipping unavailable workers and those already tried; one
//!    try per worker, each bounded by the per-try timeout and the deadline, and abandoned early
//!    when its worker has stalled (see [`crate::pool::WorkerState::stalled`]).
//! 5. **classify**: whose failure it was. A client's broken upload is the client's (400/408, never
//!    counted against the worker, never retried); connect errors, timeouts, stalls and 5xx are the
//!    worker's and feed passive ejection. A request that may have reached a worker is retried only
//!    if it is idempotent and has no body.
//! 6. **respond**: the worker's response, its body guarded ([`guarded`]), or an error response
//!    carrying a reason class and the request id (the detail goes to the log).

pub(crate) mod guarded;
pub(crate) mod headers;
pub(crate) mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Body;
use keyroute::Spill;
use tokio::time::Instant;

use self::guarded::{ClientBody, Guarded, Upload};
pub(crate) use self::headers::{Peer, REQUEST_ID};
use crate::access::{AccessLog, Placed};
use crate::body::{self, BoxError, ProxyBody};
use crate::config::MissingKey;
use crate::metrics::Outcome;
use crate::pool::{InFlight, Pool, Snapshot, WorkerState};
use crate::routing::Routing;
use crate::upstream::SendError;

/// What the request path shares with the rest of the gateway.
#[derive(Debug)]
pub(crate) struct Front {
    /// Pools and routes, swapped whole by a reload.
    pub(crate) routing: ArcSwap<Routing>,
    /// This gateway's `Via` entry.
    pub(crate) via: headers::Via,
    /// Request ids are made from this counter.
    pub(crate) next_request: AtomicU64,
    /// The listeners have closed: responses say `Connection: close`.
    pub(crate) draining: AtomicBool,
    /// Each listener's access log, if it has one.
    pub(crate) access_logs: Vec<Option<Arc<AccessLog>>>,
    /// Each listener's tunnel idle timeout and counters.
    pub(crate) tunnels: Vec<(Duration, Arc<crate::metrics::ListenerMetrics>)>,
}

/// What a route gives the request path beyond its pool.
struct Route<'a> {
    /// The upgrades it tunnels.
    upgrades: &'a [String],
    /// The listener's tunnel idle timeout and counters.
    tunnel: Option<&'a (Duration, Arc<crate::metrics::ListenerMetrics>)>,
}

/// The gateway's request path for one listener, callable without a socket.
#[derive(Clone, Debug)]
pub struct ProxyService {
    pub(crate) front: Arc<Front>,
    pub(crate) listener: usize,
}

impl ProxyService {
    /// Handles one request from `remote` as the listener would. Never fails: every error is a
    /// response.
    pub async fn call<B>(&self, req: Request<B>, remote: SocketAddr) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<BoxError>,
    {
        handle(&self.front, self.listener, req, &Peer::new(remote)).await
    }
}

/// Steps 1 and 2, then [`forward`]; with an access log, what happened goes in the response's
/// extensions ([`Placed`]).
pub(crate) async fn handle<B>(shared: &Front, listener: usize, req: Request<B>, peer: &Peer) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let id = headers::request_id(&parts.headers, || shared.next_request.fetch_add(1, Relaxed));
    let log = shared.access_logs.get(listener).and_then(Option::as_ref);
    let mut placed =
        log.map(|l| Placed { request_id: id.clone(), key: l.wants_key().then(String::new), ..Placed::default() });
    let mut resp = route_and_forward(shared, listener, &mut parts, body, peer, &id, placed.as_mut()).await;
    if shared.draining.load(Relaxed) {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(p) = placed {
        resp.extensions_mut().insert(p);
    }
    resp
}

async fn route_and_forward<B>(
    shared: &Front,
    listener: usize,
    parts: &mut Parts,
    body: B,
    peer: &Peer,
    id: &str,
    placed: Option<&mut Placed>,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    if shared.via.looped(&parts.headers) {
        tracing::warn!(request_id = %id, client = %peer.addr, "request looped back to this gateway");
        return body::error(StatusCode::LOOP_DETECTED, "the request looped back to this gateway", "loop", id);
    }
    // The listener's parser has checked the framing already; a caller of `ProxyService::call`
    // may not have.
    if !headers::framing_ok(&parts.headers, body.size_hint().exact()) {
        return body::error(StatusCode::BAD_REQUEST, "the Content-Length is invalid", "invalid_content_length", id);
    }
    if let Err(bad) = headers::canonicalize(parts.version, &mut parts.uri, &mut parts.headers) {
        tracing::debug!(request_id = %id, client = %peer.addr, reason = bad.reason(), "bad request head");
        return body::error(StatusCode::BAD_REQUEST, bad.message(), bad.reason(), id);
    }
    let routing = shared.routing.load_full();
    let Some((route, pool)) = routing.route(listener, headers::host_of(&parts.headers), parts.uri.path()) else {
        return body::error(StatusCode::NOT_FOUND, "no route for this host and path", "no_route", id);
    };
    let route = Route { upgrades: &route.upgrades, tunnel: shared.tunnels.get(listener) };
    forward(shared, pool, route, parts, body, peer, id, placed).await
}

fn idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
}

/// Why a try failed, with the detail for the log.
#[derive(Debug)]
enum Failure {
    /// No connection: the worker never saw the request.
    Connect(String),
    /// No response headers within the try's time.
    Timeout,
    /// The worker answered nothing at all for the stall window; the try was abandoned.
    Stalled,
    /// The connection failed after the request may have been sent.
    Upstream(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(why) => write!(f, "connect: {why}"),
            Failure::Timeout => f.write_str("no response headers in time"),
            Failure::Stalled => f.write_str("the worker stalled; try abandoned"),
            Failure::Upstream(why) => write!(f, "upstream: {why}"),
        }
    }
}

impl Failure {
    fn may_have_reached_worker(&self) -> bool {
        !matches!(self, Failure::Connect(_))
    }
}

/// One try's result.
enum Try {
    Answered(Response<ProxyBody>),
    /// The worker switched protocols (101): the response to send, and the worker's side of the
    /// tunnel with the in-flight count that lasts as long as it does.
    Upgraded(Response<ProxyBody>, hyper::upgrade::OnUpgrade, InFlight),
    Failed(Failure),
    /// Not the worker's fault (the client's upload failed or stalled, or the gateway ran out of
    /// resources): answered without blaming the worker, and not retried.
    ClientFault(Response<ProxyBody>),
}

/// Steps 3 to 6 for a routed request.
#[allow(clippy::too_many_arguments)]
async fn forward<B>(
    shared: &Front,
    pool: &Arc<Pool>,
    route: Route<'_>,
    parts: &mut Parts,
    body: B,
    peer: &Peer,
    id: &str,
    mut placed: Option<&mut Placed>,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let snap = pool.snapshot();
    let started = Instant::now();
    let mut key = String::new();
    let hash = match key_hash(pool, &snap, parts, peer, &mut key) {
        Ok(h) => h,
        Err(missing) => {
            tracing::debug!(request_id = %id, pool = %pool.name, part = %missing, "key part missing");
            return body::error(StatusCode::BAD_REQUEST, "the request lacks a part of its key", "missing_key", id);
        }
    };

    if let Some(p) = placed.as_deref_mut() {
        p.pool = Some(Arc::from(pool.name.as_str()));
        p.key_hash = hash;
        if let Some(k) = &mut p.key {
            k.clone_from(&key);
        }
    }
    // Hot keys: every keyed request is counted; a hot one may be answered from the gateway's
    // cache, or wait for a concurrent miss of the same URL instead of going upstream too.
    let mut caching: Option<Caching> = None;
    // Whether this request waited for another's miss (its first try then reads the clock anew).
    let mut waited = false;
    if let (Some(h), Some(hot)) = (hash, &snap.hot) {
        hot.observe(h, &key);
        if hot.replicas(h) > 0 {
            hot.metrics.hot_requests.fetch_add(1, Relaxed);
            // A request with a body (a GET may carry one) is not a cache's to answer by URL.
            if let Some(cache) = hot.cache.as_ref().filter(|_| body.is_end_stream())
                && let Some(ck) = cache.request_key(parts).map(|k| {
                    let k = k.with_scheme(if peer.tls { "https" } else { "http" });
                    if snap.config.key.reads_beyond_url() { k.varying_on(&key) } else { k }
                })
            {
                let wait = hot
                    .config
                    .cache
                    .as_ref()
                    .map_or(Duration::ZERO, |c| c.coalesce_timeout)
                    .min(snap.config.retry.deadline);
                let worker_header = snap.config.worker_header.as_ref();
                match consult(Arc::clone(hot), ck, parts, id, wait, worker_header).await {
                    Consulted::Hit(resp) => {
                        if let Some(p) = placed.as_deref_mut() {
                            p.decision = "cache";
                        }
                        return resp;
                    }
                    Consulted::Lead(c) => caching = Some(*c),
                    Consulted::Pass => waited = true,
                }
            }
        }
    }
    // An upgrade (WebSocket...) keeps its Upgrade and Connection headers, and the client's side of
    // the tunnel is taken now (HTTP/1.1 only).
    let upgrade = headers::upgrade_of(parts.version, &parts.headers, route.upgrades);
    let mut client_side = upgrade.as_ref().and_then(|_| parts.extensions.remove::<hyper::upgrade::OnUpgrade>());
    // The upstream request's fixed parts.
    headers::strip_hop_by_hop(&mut parts.headers);
    if let Some(u) = &upgrade {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, u.clone());
    }
    // A body whose length is not known (it came chunked) goes on chunked: hyper would otherwise
    // send a GET or HEAD without it.
    if !body.is_end_stream() && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        parts.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    headers::add_forwarded(&mut parts.headers, peer);
    shared.via.append(&mut parts.headers);
    if let Ok(v) = HeaderValue::try_from(id) {
        parts.headers.insert(REQUEST_ID.clone(), v);
    }
    let replayable = body.is_end_stream();
    let upload = Arc::new(Upload::default());
    let retry = &snap.config.retry;
    // A request that waited for another's miss in vain has spent its patience: one try, never
    // abandoned (forty followers of a slow worker must not become forty times the retries).
    let attempts = if replayable && !waited { retry.attempts } else { 1 };
    let deadline = started + retry.deadline;
    let mut body = Some(ClientBody::new(body, Arc::clone(&upload)).boxed_unsync());
    let mut tried: Vec<usize> = Vec::new();
    let mut last: Option<Failure> = None;

    for attempt in 0..attempts {
        let now = if attempt == 0 && !waited { started } else { Instant::now() };
        if now >= deadline {
            last = last.or(Some(Failure::Timeout));
            break;
        }
        let Some(decision) = snap.decide(hash, &tried, now) else { break };
        let worker = Arc::clone(&snap.workers[decision.node]);
        let outcome = match (attempt, hash.is_some() && decision.owner.is_some(), decision.spill) {
            (a, _, _) if a > 0 => Outcome::Retry,
            (_, false, _) => Outcome::Unkeyed,
            (_, true, None) => Outcome::Owner,
            (_, true, Some(Spill::Unavailable)) => Outcome::Unavailable,
            (_, true, Some(Spill::Replica)) => Outcome::Replica,
            (_, true, Some(Spill::Warming)) => Outcome::Warming,
            (_, true, Some(_)) => Outcome::Overloaded,
        };
        pool.metrics.outcome(outcome);
        if let Some(p) = placed.as_deref_mut() {
            p.attempts = attempt + 1;
            p.worker = Some(Arc::from(worker.name.as_str()));
            if attempt == 0 {
                p.decision = crate::metrics::OUTCOMES[outcome as usize];
            }
        }
        let ctx = TryCtx {
            snap: &snap,
            worker: &worker,
            parts,
            per_try: retry.per_try_timeout.min(deadline - now),
            replayable,
            upload: &upload,
            id,
            may_abandon: replayable && idempotent(&parts.method) && attempt + 1 < attempts,
            // Abandon a stalled worker only when there is somewhere else to go (asked only then).
            elsewhere: &|| snap.has_other(&tried, decision.node, Instant::now()),
        };
        match try_once(ctx, &mut body).await {
            Try::Answered(resp) => {
                tracing::trace!(request_id = %id, worker = %worker.name, attempt, key = %key, "proxied");
                // An unsafe method's success invalidates what the cache holds for its URL (RFC 9111 §4.4).
                if !parts.method.is_safe()
                    && let Some(c) = snap.hot.as_ref().and_then(|h| h.cache.as_ref())
                {
                    c.invalidate(parts, resp.status());
                }
                return match caching.take() {
                    Some(c) => c.store(resp).await,
                    None if waited => {
                        let mut resp = resp;
                        resp.headers_mut().insert(X_CACHE, HeaderValue::from_static("miss"));
                        resp
                    }
                    None => resp,
                };
            }
            Try::Upgraded(resp, worker_side, in_flight) => {
                let Some(client) = client_side.take() else {
                    // Only a caller without a connection (`ProxyService::call`) has no client
                    // side to join: the worker's side closes.
                    return resp;
                };
                let mut resp = resp;
                // With an access log, the line waits for the tunnel to close.
                let end = placed.is_some().then(|| {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    resp.extensions_mut().insert(crate::access::TunnelLine::new(rx));
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
                tunnel::spawn(client, worker_side, t);
                return resp;
            }
            Try::ClientFault(resp) => return resp,
            Try::Failed(f) => {
                tracing::warn!(request_id = %id, pool = %pool.name, worker = %worker.name, attempt, failure = %f, "try failed");
                let stop = f.may_have_reached_worker() && !idempotent(&parts.method);
                last = Some(f);
                tried.push(decision.node);
                if attempt + 1 == attempts || stop {
                    break;
                }
                worker.metrics.retries.fetch_add(1, Relaxed);
            }
        }
    }
    match last {
        None => {
            pool.metrics.no_worker.fetch_add(1, Relaxed);
            let why = snap.why_unavailable(Instant::now());
            tracing::warn!(request_id = %id, pool = %pool.name, workers = snap.workers.len(), reason = why.reason(), detail = %why, "no available worker");
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
        Some(Failure::Upstream(_)) => {
            body::error(StatusCode::BAD_GATEWAY, "the worker's response failed", "upstream_failed", id)
        }
    }
}

/// The gateway cache's response header: `hit`, `coalesced` (served from the cache after waiting
/// for a concurrent miss of the same URL) or `miss`.
pub(crate) const X_CACHE: header::HeaderName = header::HeaderName::from_static("x-keyroute-cache");

/// A hot key's request that leads its flight: what it needs to store the response.
struct Caching {
    hot: Arc<crate::pool::hot::HotKeysState>,
    key: crate::cache::CacheKey,
    /// The client's request head as it arrived (the cache's rules and `Vary` read it, not the
    /// upstream request's).
    request: Parts,
    id: String,
    /// The URL's flight, which this request leads (none for a request that refused stored
    /// answers: it may refresh the entry, but nobody waits for it).
    _flight: Option<crate::cache::LeaderGuard>,
}

enum Consulted {
    Hit(Response<ProxyBody>),
    Lead(Box<Caching>),
    Pass,
}

fn head_copy(parts: &Parts) -> Parts {
    let mut r = Request::new(());
    *r.method_mut() = parts.method.clone();
    *r.uri_mut() = parts.uri.clone();
    *r.version_mut() = parts.version;
    *r.headers_mut() = parts.headers.clone();
    r.into_parts().0
}

fn cached_response(
    c: crate::cache::Cached,
    how: &'static str,
    id: &str,
    worker_header: Option<&header::HeaderName>,
) -> Response<ProxyBody> {
    let mut resp = Response::new(body::full(c.body));
    *resp.status_mut() = c.status;
    *resp.headers_mut() = c.headers;
    // No worker served this one.
    if let Some(h) = worker_header {
        resp.headers_mut().remove(h);
    }
    resp.headers_mut().insert(X_CACHE, HeaderValue::from_static(how));
    if let Ok(v) = HeaderValue::try_from(id) {
        resp.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    resp
}

/// Looks a hot key's request up in the gateway cache; on a miss, leads the URL's flight or waits
/// (up to `wait`: the coalescing timeout, within the retry deadline) for the one in the air and
/// looks up again, as NGINX's `proxy_cache_lock` does. A request that refuses stored answers
/// (`no-cache`, `max-age=0`) neither looks up nor waits: it goes upstream, and may refresh the
/// entry.
async fn consult(
    hot: Arc<crate::pool::hot::HotKeysState>,
    key: crate::cache::CacheKey,
    parts: &Parts,
    id: &str,
    wait: Duration,
    worker_header: Option<&header::HeaderName>,
) -> Consulted {
    let Some(cache) = hot.cache.as_ref() else { return Consulted::Pass };
    if !crate::cache::HttpCache::may_serve(parts) {
        hot.metrics.cache_misses.fetch_add(1, Relaxed);
        let request = head_copy(parts);
        return Consulted::Lead(Box::new(Caching {
            hot: Arc::clone(&hot),
            key,
            request,
            id: id.to_owned(),
            _flight: None,
        }));
    }
    let now = std::time::SystemTime::now();
    if let Some(c) = cache.lookup(&key, parts, now) {
        hot.metrics.cache_hits.fetch_add(1, Relaxed);
        return Consulted::Hit(cached_response(c, "hit", id, worker_header));
    }
    if crate::cache::HttpCache::only_if_cached(parts) {
        // RFC 9111 §5.2.1.7: nothing stored, so no upstream request either.
        return Consulted::Hit(body::error(
            StatusCode::GATEWAY_TIMEOUT,
            "not in the gateway's cache",
            "only_if_cached",
            id,
        ));
    }
    match cache.join(&key) {
        crate::cache::Flight::Leader(guard) => {
            hot.metrics.cache_misses.fetch_add(1, Relaxed);
            let request = head_copy(parts);
            Consulted::Lead(Box::new(Caching {
                hot: Arc::clone(&hot),
                key,
                request,
                id: id.to_owned(),
                _flight: Some(guard),
            }))
        }
        crate::cache::Flight::Follower(mut f) => {
            let _ = tokio::time::timeout(wait, f.wait()).await;
            match cache.lookup(&key, parts, std::time::SystemTime::now()) {
                Some(c) => {
                    hot.metrics.coalesced.fetch_add(1, Relaxed);
                    Consulted::Hit(cached_response(c, "coalesced", id, worker_header))
                }
                None => {
                    hot.metrics.cache_misses.fetch_add(1, Relaxed);
                    Consulted::Pass
                }
            }
        }
    }
}

impl Caching {
    /// Stores a storable response (its whole body read first, up to the object limit) and returns
    /// it; any other response passes through as it is. The flight ends (followers wake) on return.
    async fn store(self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let (mut head, incoming) = resp.into_parts();
        head.headers.insert(X_CACHE, HeaderValue::from_static("miss"));
        let now = std::time::SystemTime::now();
        let Some(cache) = self.hot.cache.as_ref() else { return Response::from_parts(head, incoming) };
        let token = match cache.storable(&self.request, &head, now) {
            // Only a body of known length is buffered: anything else streams through unstored.
            Ok(t) if head.headers.contains_key(header::CONTENT_LENGTH) => t,
            Ok(_) => return Response::from_parts(head, incoming),
            Err(why) => {
                tracing::trace!(request_id = %self.id, reason = why.as_str(), "hot key's response not stored");
                return Response::from_parts(head, incoming);
            }
        };
        let limit = cache.config().max_object_bytes;
        match buffer(incoming, limit).await {
            Some(bytes) => {
                if cache.store(self.key.clone(), token, &self.request, &head, bytes.clone(), now) {
                    self.hot.metrics.cache_stores.fetch_add(1, Relaxed);
                }
                Response::from_parts(head, body::full(bytes))
            }
            None => body::error(StatusCode::BAD_GATEWAY, "the worker's response failed", "upstream_failed", &self.id),
        }
    }
}

/// A whole body, if it ends without error within `limit` bytes (its Content-Length was checked
/// against the limit already).
async fn buffer(mut body: ProxyBody, limit: u64) -> Option<Bytes> {
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            tracing::debug!("a hot key's response body failed while buffered for the cache");
            return None;
        };
        if let Ok(data) = frame.into_data() {
            if (out.len() + data.len()) as u64 > limit {
                return None;
            }
            out.extend_from_slice(&data);
        }
    }
    Some(out.freeze())
}

/// Step 3: the key's hash, `None` when the strategy does not place by key or the key is missing
/// and the pool falls back to p2c.
fn key_hash(pool: &Pool, snap: &Snapshot, parts: &Parts, peer: &Peer, key: &mut String) -> Result<Option<u64>, String> {
    if !snap.policy.strategy().uses_key() {
        return Ok(None);
    }
    let rendered = snap.config.key.render(&crate::key::HttpRequest::new(parts, peer.addr.ip()), key).and_then(|()| {
        // nginx and HAProxy do not hash an empty key (they go round robin): neither does their mode.
        match snap.policy.strategy().hashes_key(key.as_bytes()) {
            true => Ok(()),
            false => Err(crate::key::MissingPart("an empty key".into())),
        }
    });
    match rendered {
        Ok(()) => {
            let h = snap.policy.key_hash(key.as_bytes());
            pool.record_key(h);
            Ok(Some(h))
        }
        Err(missing) => {
            pool.metrics.missing_key.fetch_add(1, Relaxed);
            match snap.config.on_missing_key {
                MissingKey::Reject => Err(missing.0),
                MissingKey::P2c => Ok(None),
            }
        }
    }
}

struct TryCtx<'a> {
    snap: &'a Arc<Snapshot>,
    worker: &'a Arc<WorkerState>,
    parts: &'a Parts,
    per_try: Duration,
    replayable: bool,
    upload: &'a Arc<Upload>,
    id: &'a str,
    may_abandon: bool,
    elsewhere: &'a (dyn Fn() -> bool + Sync),
}

/// Steps 4 to 6 for one worker.
async fn try_once(ctx: TryCtx<'_>, body: &mut Option<ProxyBody>) -> Try {
    let TryCtx { snap, worker, parts, per_try, replayable, upload, id, may_abandon, elsewhere } = ctx;
    let guard = InFlight::new(Arc::clone(worker));
    // Only a request without a body waits on the worker alone from the start; one with a body may
    // be waiting on its client's upload, which must never make the worker look stalled.
    let sent = Instant::now();
    let waiting = replayable.then(|| worker.await_headers(sent));
    let stall = if may_abandon { snap.config.passive.stall } else { Duration::ZERO };
    // One more try on a fresh connection to the same worker when a pooled connection failed
    // under a replayable, idempotent request: the worker may just have closed it as idle.
    let mut fresh_retry = replayable && idempotent(&parts.method);
    let mut fresh = false;
    let until = sent + per_try;
    let result = loop {
        let mut upstream = Request::new(body.take().unwrap_or_else(body::empty));
        *upstream.method_mut() = parts.method.clone();
        *upstream.uri_mut() = parts.uri.clone();
        *upstream.headers_mut() = parts.headers.clone();
        if !upstream.headers().contains_key(header::HOST)
            && let Ok(v) = HeaderValue::try_from(worker.address.to_string())
        {
            upstream.headers_mut().insert(header::HOST, v);
        }
        let send = worker.upstream.send(upstream, !fresh);
        tokio::pin!(send);
        let r = loop {
            // Wake at the try's deadline, or when the worker would have stalled (re-read after
            // each wake: any response from it moves that moment on).
            let wake = if stall.is_zero() { until } else { worker.stall_deadline(stall).min(until) };
            tokio::select! {
                r = &mut send => break Ok(r),
                _ = tokio::time::sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= until {
                        break Err(Failure::Timeout);
                    }
                    if worker.stalled(now, stall) && elsewhere() {
                        break Err(Failure::Stalled);
                    }
                }
            }
        };
        match r {
            Ok(Err(SendError::Request { reused: true, .. })) if fresh_retry => {
                fresh_retry = false;
                fresh = true;
            }
            r => break r,
        }
    };
    drop(waiting);
    let arrived = Instant::now();
    let latency = arrived.saturating_duration_since(sent);
    let failure = match result {
        Ok(Ok((mut resp, conn)))
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS && parts.headers.contains_key(header::UPGRADE) =>
        {
            worker.headers_arrived(arrived);
            worker.metrics.record_latency(latency);
            worker.metrics.record_class(Some(101));
            let asked = parts.headers.get(header::UPGRADE).map(HeaderValue::as_bytes).unwrap_or_default();
            let chosen = resp.headers().get(header::UPGRADE).map(HeaderValue::as_bytes).unwrap_or_default();
            let offered = |p: &[u8]| asked.split(|&b| b == b',').any(|a| a.trim_ascii().eq_ignore_ascii_case(p));
            if !offered(chosen.trim_ascii()) {
                // RFC 9110 §7.8: a server switches only to a protocol the client offered.
                drop(conn);
                return Try::Failed(Failure::Upstream("switched to a protocol that was not offered".into()));
            }
            worker.observe_success();
            let worker_side = hyper::upgrade::on(&mut resp);
            // The connection is the tunnel's now: never back to the pool.
            drop(conn);
            let (mut head, _) = resp.into_parts();
            let protocol = head.headers.get(header::UPGRADE).cloned();
            headers::strip_hop_by_hop(&mut head.headers);
            head.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            if let Some(p) = protocol {
                head.headers.insert(header::UPGRADE, p);
            }
            if let Some(h) = &snap.config.worker_header
                && let Ok(v) = HeaderValue::try_from(worker.name.as_str())
            {
                head.headers.insert(h.clone(), v);
            }
            return Try::Upgraded(Response::from_parts(head, body::empty()), worker_side, guard);
        }
        Ok(Ok((resp, conn))) => {
            worker.headers_arrived(arrived);
            let status = resp.status();
            // The worker's own cache result, when it reports one: slow start reads it.
            if let Some(v) = resp.headers().get("x-cache").map(HeaderValue::as_bytes) {
                let word = |w: &[u8]| v.len() >= w.len() && v[..w.len()].eq_ignore_ascii_case(w);
                if word(b"hit") {
                    worker.note_cache(true);
                } else if word(b"miss") {
                    worker.note_cache(false);
                }
            }
            worker.metrics.record_latency(latency);
            if status.is_server_error() {
                // A 5xx is complete as a failure now; a success is settled when its body ends.
                if worker.observe_failure(snap.may_eject(), arrived).is_some() {
                    tracing::warn!(worker = %worker.name, status = status.as_u16(), "worker ejected after consecutive failures (5xx)");
                }
            }
            let (mut head, incoming) = resp.into_parts();
            headers::strip_hop_by_hop(&mut head.headers);
            if let Some(h) = &snap.config.worker_header
                && let Ok(v) = HeaderValue::try_from(worker.name.as_str())
            {
                head.headers.insert(h.clone(), v);
            }
            let guarded = Guarded::new(
                incoming,
                guard,
                conn,
                Arc::clone(worker),
                Arc::clone(snap),
                status.as_u16(),
                Arc::clone(upload),
            );
            return Try::Answered(Response::from_parts(head, guarded.boxed_unsync()));
        }
        // The client's upload broke: its fault, whatever the connection then reported.
        _ if upload.failed() => {
            tracing::debug!(request_id = %id, worker = %worker.name, "the client's request body failed");
            return Try::ClientFault(body::error(
                StatusCode::BAD_REQUEST,
                "the request body is invalid or incomplete",
                "bad_request_body",
                id,
            ));
        }
        // Still uploading at the timeout, because the client was slow to send (not because the
        // worker stopped reading): the client's fault.
        Err(Failure::Timeout) if !replayable && !upload.done() && upload.waiting_on_client() => {
            tracing::debug!(request_id = %id, worker = %worker.name, "the client's upload was still incomplete at the timeout");
            return Try::ClientFault(body::error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
                "request_body_timeout",
                id,
            ));
        }
        // The gateway is out of descriptors or memory: nobody's fault but its own.
        Ok(Err(SendError::Local(why))) => {
            tracing::error!(request_id = %id, worker = %worker.name, error = %why, "cannot open an upstream connection");
            return Try::ClientFault(body::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway is out of resources",
                "gateway_overloaded",
                id,
            ));
        }
        Ok(Err(e)) => {
            worker.metrics.record_class(None);
            match e {
                SendError::Connect(why) => {
                    worker.metrics.connect_errors.fetch_add(1, Relaxed);
                    Failure::Connect(why)
                }
                e => Failure::Upstream(e.to_string()),
            }
        }
        Err(f) => {
            worker.metrics.record_class(None);
            f
        }
    };
    worker.metrics.record_latency(latency);
    if let Some(ejection) = worker.observe_failure(snap.may_eject(), arrived) {
        tracing::warn!(worker = %worker.name, ejection_ms = ejection.as_millis() as u64, failure = %failure, "worker ejected after consecutive failures");
    }
    Try::Failed(failure)
}

//! The cache stage, for hot keys only: a hot key's request may be answered from the gateway's
//! cache ([`crate::cache`], RFC 9111), or wait for a concurrent miss of the same URL instead of
//! going upstream too (coalescing, as NGINX's `proxy_cache_lock`); the request that leads a miss
//! stores what the worker answers.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;

use super::Exchange;
use super::headers::REQUEST_ID;
use crate::body::{self, ProxyBody};
use crate::cache::HotCache;
use crate::head::ReqHead;
use crate::routing::HttpPool;
use keyroute_fleet::pool::Snapshot;

/// What the cache stage found for a request.
pub(super) enum Looked {
    /// Answered from the cache (or a 504 for `only-if-cached`).
    Hit(Response<ProxyBody>),
    /// A hot key's miss that this request leads: it stores the worker's answer.
    Lead(Box<Caching>),
    /// It waited for another request's miss, in vain: it goes upstream itself.
    Waited,
    /// Not a cache's to answer (not hot, no cache, a body, not cacheable).
    Skip,
}

/// Counts a keyed request for hot-key detection and, for a hot key of a pool with a cache, looks
/// it up ([`consult`]). `body_end`: the request has no body (one with a body, even a GET, is not
/// answered by URL). When the pool's key reads more than the URL, the entry varies on the key.
pub(super) async fn look_up(
    cx: &Exchange<'_>,
    hp: &HttpPool,
    snap: &Snapshot,
    hash: Option<u64>,
    key: &str,
    head: &ReqHead,
    body_end: bool,
) -> Looked {
    let (http, id) = (&*hp.http, cx.id);
    let (Some(h), Some(hot)) = (hash, snap.hot()) else { return Looked::Skip };
    hot.observe(h, key);
    if hot.replicas(h) == 0 {
        return Looked::Skip;
    }
    hot.metrics.hot_requests.fetch_add(1, Relaxed);
    let Some(cache) = hp.cache.as_ref().filter(|_| body_end) else { return Looked::Skip };
    // The cache keeps heads as maps: made here, for hot keys only.
    let parts = head.to_parts();
    let Some(ck) = cache.store.request_key(&parts) else { return Looked::Skip };
    let ck = ck.with_scheme(if cx.peer.tls { "https" } else { "http" });
    let ck = if http.key.reads_beyond_url() { ck.varying_on(key) } else { ck };
    let wait = cache.settings.coalesce_timeout.min(snap.config().retry.deadline);
    match consult(Arc::clone(cache), ck, &parts, id, wait, http.worker_header.as_ref()).await {
        Consulted::Hit(resp) => Looked::Hit(resp),
        Consulted::Lead(c) => Looked::Lead(c),
        Consulted::Pass => Looked::Waited,
    }
}

/// The gateway cache's response header: `hit`, `coalesced` (served from the cache after waiting
/// for a concurrent miss of the same URL) or `miss`.
pub(crate) const X_CACHE: header::HeaderName = header::HeaderName::from_static("x-keyroute-cache");

/// A hot key's request that leads its flight: what it needs to store the response.
pub(super) struct Caching {
    cache: Arc<HotCache>,
    key: crate::cache::CacheKey,
    /// The client's request head as it arrived (the cache's rules and `Vary` read it, not the
    /// upstream request's).
    request: Parts,
    id: String,
    /// The URL's flight, which this request leads (none for a request that refused stored
    /// answers: it may refresh the entry, but nobody waits for it).
    _flight: Option<crate::cache::LeaderGuard>,
}

pub(super) enum Consulted {
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
pub(super) async fn consult(
    hot: Arc<HotCache>,
    key: crate::cache::CacheKey,
    parts: &Parts,
    id: &str,
    wait: Duration,
    worker_header: Option<&header::HeaderName>,
) -> Consulted {
    let cache = &hot.store;
    if !crate::cache::HttpCache::may_serve(parts) {
        hot.metrics.misses.fetch_add(1, Relaxed);
        let request = head_copy(parts);
        return Consulted::Lead(Box::new(Caching {
            cache: Arc::clone(&hot),
            key,
            request,
            id: id.to_owned(),
            _flight: None,
        }));
    }
    let now = std::time::SystemTime::now();
    if let Some(c) = cache.lookup(&key, parts, now) {
        hot.metrics.hits.fetch_add(1, Relaxed);
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
            hot.metrics.misses.fetch_add(1, Relaxed);
            let request = head_copy(parts);
            Consulted::Lead(Box::new(Caching {
                cache: Arc::clone(&hot),
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
                    hot.metrics.misses.fetch_add(1, Relaxed);
                    Consulted::Pass
                }
            }
        }
    }
}

impl Caching {
    /// Stores a storable response (its whole body read first, up to the object limit) and returns
    /// it; any other response passes through as it is. The flight ends (followers wake) on return.
    pub(super) async fn store(self, resp: Response<ProxyBody>) -> Response<ProxyBody> {
        let (mut head, incoming) = resp.into_parts();
        head.headers.insert(X_CACHE, HeaderValue::from_static("miss"));
        let now = std::time::SystemTime::now();
        let cache = &self.cache.store;
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
                    self.cache.metrics.stores.fetch_add(1, Relaxed);
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

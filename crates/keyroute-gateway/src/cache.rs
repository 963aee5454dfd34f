//! A small shared HTTP cache (RFC 9111) in front of the workers, for hot keys only.
//!
//! The hot-key detector decides which keys are hot; for those, and only those, the proxy consults
//! this cache before placing the request, and offers it the response on the way back. Everything
//! else never touches it. The module is sans-IO: no sockets, no tasks, no clock. Every function
//! that needs the time takes `now`, and the caller buffers the body (up to
//! [`CacheConfig::max_object_bytes`]) before [`HttpCache::store`].
//!
//! The request path, as the proxy is expected to wire it:
//!
//! 1. [`HttpCache::request_key`]: `None` means the request bypasses the cache altogether.
//! 2. [`HttpCache::lookup`]: a fresh stored response, or a miss.
//! 3. On a miss, [`HttpCache::join`]: the leader goes upstream; followers wait (with a timeout of
//!    the caller's choice), then look up again, and on a second miss go upstream themselves.
//! 4. With the response head, [`HttpCache::storable`]; if it is, buffer the body, then
//!    [`HttpCache::store`]; then drop the [`LeaderGuard`] (dropping it on failure too).
//! 5. For any request with an unsafe method, whatever its key's hotness,
//!    [`HttpCache::invalidate`] once the response status is known.
//!
//! ## What it implements (RFC 9111)
//!
//! - **Storing (§3)**: only responses to `GET` (a `HEAD` request uses the `GET` entry, and its
//!   response is never stored), with a status cacheable by default (RFC 9110 §15.1: 200, 203,
//!   204, 300, 301, 308, 404, 405, 410, 414, 501; 206 is left out, as this cache does not do
//!   ranges) and explicit freshness. Not stored: a request with `Cache-Control: no-store`
//!   (§5.2.1.5); a response with `no-store` (§5.2.2.5), `private` (§5.2.2.7, qualified or not),
//!   `no-cache` (§5.2.2.4, qualified or not: see below) or `Vary: *` (§4.1); a response with
//!   `Set-Cookie`, unless [`CacheConfig::cache_set_cookie`]; a response larger than
//!   [`CacheConfig::max_object_bytes`], by its `Content-Length` or by its body.
//! - **Authorization (§3.5, made stricter)**: a request with `Authorization` bypasses the cache
//!   altogether (never answered from it, its response never stored) unless
//!   [`CacheConfig::cache_authorized`] is set, even when the response says `public`: the cache is
//!   there for hot keys, not for users' own pages. (A session carried in a cookie is not seen:
//!   a response that depends on one must say `private` or `Vary: Cookie`.)
//! - **Stored headers (§3.1)**: the hop-by-hop headers (RFC 9110 §7.6.1: `Connection`,
//!   `Keep-Alive`, `Proxy-Connection`, `Proxy-Authenticate`, `Proxy-Authorization`, `TE`,
//!   `Trailer`, `Transfer-Encoding`, `Upgrade`, and the headers `Connection` names) are dropped.
//!   So are `Set-Cookie` (when `cache_set_cookie` lets such a response be stored, its cookie is
//!   still never replayed to another client) and `Age` (recomputed on every hit).
//!   `Content-Length` is set to the stored body's length (except on 204).
//! - **Keys and variants (§4.1, §2)**: the primary key is the scheme (when known), the authority
//!   (the target's, else `Host`) and the path and query. A response's `Vary` names the request
//!   headers whose values are stored with it; a later request must carry the same values
//!   (normalised: list members trimmed, empty members dropped, runs of spaces collapsed; a header
//!   absent never matches one present, even empty). A key holds several variants; among those
//!   that match, the most recently stored is used.
//! - **Freshness (§4.2.1)**: `s-maxage`, else `max-age`, else `Expires` minus `Date` (`Date`
//!   absent or invalid: the time the response arrived). Computed once, when the response is
//!   offered. An invalid `max-age` or `s-maxage` makes the response stale; an invalid `Expires`
//!   (`0`, say) means already expired (§5.3). A response with no explicit freshness is not
//!   stored.
//! - **Age (§4.2.3)**: `corrected_initial_age = max(apparent_age, age_value)`, with `apparent_age =
//!   max(0, response_time - date_value)` and `age_value` the response's `Age`; `current_age =
//!   corrected_initial_age + (now - response_time)`. The request time is not known here, so the
//!   response delay is taken as zero. A hit carries `Age: current_age`. An entry is fresh while
//!   its lifetime is greater than its current age; a stale entry is removed when a lookup finds it.
//! - **Request directives (§5.2.1)**: `no-cache`, `max-age=0` and, without `Cache-Control`,
//!   `Pragma: no-cache` (§5.4) force a miss; `max-age=N` refuses an entry older than `N`;
//!   `min-fresh=N` one with less than `N` seconds of freshness left. An invalid value for either
//!   forces a miss. [`HttpCache::only_if_cached`] tells the proxy to answer 504 on a miss.
//! - **Invalidation (§4.4)**: a non-error response to an unsafe method removes the target URI's
//!   entries (not those of `Location` or `Content-Location`).
//! - **Parsing**: `Cache-Control` directive names are case-insensitive; values may be quoted;
//!   duplicates: the first one counts; delta-seconds saturate (`u64`). No header value can make
//!   this module panic.
//!
//! ## What it deliberately does not do
//!
//! - **No revalidation**: no conditional requests (`ETag`/`If-None-Match`,
//!   `Last-Modified`/`If-Modified-Since`), no 304 handling. So a response with `no-cache` (which
//!   may only be reused after revalidation) is not stored at all, and neither is one with a
//!   qualified `no-cache="field"` or `private="field"`.
//! - **No heuristic freshness** (§4.2.2): no explicit freshness, no storing.
//! - **No stale responses**: no `stale-while-revalidate`, `stale-if-error` or request `max-stale`.
//! - No `Range` requests, no partial content, no storing of statuses outside the default list
//!   even with explicit freshness.
//!
//! ## Why not `http-cache-semantics`
//!
//! The `http-cache-semantics` crate (2.x, RFC 7234) was evaluated for this policy and not taken:
//!
//! - its rules are a shared cache's by the letter of RFC 7234, and this cache is stricter on
//!   purpose: a response to a request with `Authorization` is never stored unless the pool says
//!   so (RFC 7234 allows it with `public` or `s-maxage`), `Set-Cookie` is stripped or the response
//!   refused, and freshness is never heuristic (the crate computes heuristic lifetimes);
//! - coalescing, the implicit `Vary` on the pool key and the size bounds are this module's either
//!   way, and the crate's per-entry `CachePolicy` (serialisable, with the whole request and
//!   response heads) is larger than what an entry keeps here;
//! - the tests of this module and `tests/hotkeys.rs` pin each rule to RFC 9111's text, which a
//!   swap would have to re-establish.
//!
//! ## Cost and bounds
//!
//! One mutex over the entries (this cache holds hot keys only: hundreds of entries, not
//! millions). A lookup is one hash lookup, a scan of the key's (few) variants, and on a hit a
//! clone of the stored header map (the body is a reference-counted [`Bytes`]). The total size,
//! estimated as the body plus each stored header as HPACK counts it (name + value + 32, RFC 7541
//! §4.1), plus the key and the stored `Vary` values, is kept at or below
//! [`CacheConfig::max_bytes`] by evicting the least recently used entries (a lookup hit counts as
//! a use); an object that alone exceeds the bound is not stored.
//!
//! ## Coalescing
//!
//! [`HttpCache::join`] makes the first caller for a key the [`Flight::Leader`]: it goes upstream,
//! stores (or not) and drops its [`LeaderGuard`]. Callers for the same key while the guard lives
//! are [`Flight::Follower`]s; [`Follower::wait`] returns once the guard is dropped, whatever the
//! leader's outcome (stored, not storable, upstream failure, cancelled). Followers then look up
//! again, and on a miss go upstream themselves (or `join` again). The wait has no timeout of its
//! own: the caller bounds it, and a follower that times out simply goes upstream. Once the guard
//! is dropped the next `join` for the key starts a new flight.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, request, response};
use tokio::sync::watch;

/// What bounds the cache and which responses it may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// The bound on the total estimated size of the entries (bodies, headers, keys), in bytes.
    pub max_bytes: u64,
    /// The largest body stored, in bytes (by `Content-Length`, and by the body itself).
    pub max_object_bytes: u64,
    /// Store, and serve, responses to requests with `Authorization`; otherwise such requests
    /// bypass the cache (for deployments where `Authorization` does not identify a user, e.g. a
    /// gateway-wide token).
    pub cache_authorized: bool,
    /// Store responses that carry `Set-Cookie` (the cookie itself is stripped from the stored
    /// headers and never served from the cache).
    pub cache_set_cookie: bool,
}

/// The primary cache key of a request: scheme (when known), authority and path-and-query. `GET`
/// and `HEAD` share it. When the pool's key reads more of the request than its URL (a header, a
/// cookie, the client's address), the rendered key is part of it too: an implicit `Vary` on what
/// placed the request, so that two users' answers for one URL never mix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct CacheKey {
    scheme: String,
    authority: String,
    path_and_query: String,
    /// The rendered pool key, when it reads beyond the URL; empty otherwise.
    varies_on: String,
}

impl CacheKey {
    /// The key with its scheme set (lowercased) to the listener's, e.g. `https`. HTTP/1.1
    /// requests in origin form carry no scheme; without this, an `http` and an `https` listener
    /// in front of the same pool share entries (a cached redirect to `https` would then loop).
    pub(crate) fn with_scheme(mut self, scheme: &str) -> Self {
        self.scheme = scheme.to_ascii_lowercase();
        self
    }

    /// The key that also varies on the request's rendered pool key (see [`CacheKey`]).
    pub(crate) fn varying_on(mut self, pool_key: &str) -> Self {
        pool_key.clone_into(&mut self.varies_on);
        self
    }

    /// The scheme, lowercased, or `""` when the request did not carry one.
    #[cfg(test)]
    pub(crate) fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The authority, lowercased (the request target's, else the `Host` header's).
    #[cfg(test)]
    pub(crate) fn authority(&self) -> &str {
        &self.authority
    }

    /// The path and query, as the request carried them (`/` when empty).
    #[cfg(test)]
    pub(crate) fn path_and_query(&self) -> &str {
        &self.path_and_query
    }

    /// Bytes this key counts for in the size estimate.
    fn size(&self) -> u64 {
        len64(self.scheme.len()) + len64(self.authority.len()) + len64(self.path_and_query.len())
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.scheme.is_empty() {
            write!(f, "{}:", self.scheme)?;
        }
        write!(f, "//{}{}", self.authority, self.path_and_query)
    }
}

/// A response the cache may store, as [`HttpCache::storable`] found it: what [`HttpCache::store`]
/// needs of its head, computed once (freshness lifetime, age on arrival). Only `storable` makes
/// one; it belongs to the response it was made for.
#[derive(Debug, Clone)]
pub(crate) struct Storable {
    lifetime: u64,
    initial_age: u64,
    response_time: SystemTime,
    vary: Vec<HeaderName>,
}

impl Storable {
    /// The freshness lifetime, in seconds (RFC 9111 §4.2.1).
    #[cfg(test)]
    pub(crate) fn freshness_lifetime(&self) -> u64 {
        self.lifetime
    }

    /// The corrected initial age, in seconds (RFC 9111 §4.2.3).
    #[cfg(test)]
    pub(crate) fn initial_age(&self) -> u64 {
        self.initial_age
    }
}

/// Why a response may not be stored (for metrics and debugging).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub(crate) enum NotStorable {
    /// The request's method is not `GET` (`HEAD` responses are never stored).
    #[error("the request method is not GET")]
    Method,
    /// The request has `Cache-Control: no-store`.
    #[error("the request has Cache-Control: no-store")]
    RequestNoStore,
    /// The status is not cacheable by default.
    #[error("the status is not cacheable by default")]
    Status,
    /// The response has `Cache-Control: no-store`.
    #[error("the response has Cache-Control: no-store")]
    NoStore,
    /// The response has `Cache-Control: private`.
    #[error("the response has Cache-Control: private")]
    Private,
    /// The response has `Cache-Control: no-cache` (this cache never revalidates).
    #[error("the response has Cache-Control: no-cache")]
    NoCache,
    /// The response has `Vary: *`.
    #[error("the response has Vary: *")]
    VaryStar,
    /// The response's `Vary` names something that is not a header name.
    #[error("the response's Vary is invalid")]
    InvalidVary,
    /// The response has `Set-Cookie` and the cache does not store those.
    #[error("the response has Set-Cookie")]
    SetCookie,
    /// The request has `Authorization` (and the pool does not cache those).
    #[error("the request has Authorization")]
    Authorization,
    /// The response has no explicit freshness (`s-maxage`, `max-age`, `Expires`).
    #[error("the response has no explicit freshness")]
    NoFreshness,
    /// The response is stale already (expired, invalid freshness, or older than its lifetime).
    #[error("the response is already stale")]
    Stale,
    /// The response is larger than the cache takes.
    #[error("the response is too large")]
    TooLarge,
}

impl NotStorable {
    /// A short name, for a metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Method => "method",
            Self::RequestNoStore => "request_no_store",
            Self::Status => "status",
            Self::NoStore => "no_store",
            Self::Private => "private",
            Self::NoCache => "no_cache",
            Self::VaryStar => "vary_star",
            Self::InvalidVary => "invalid_vary",
            Self::SetCookie => "set_cookie",
            Self::Authorization => "authorization",
            Self::NoFreshness => "no_freshness",
            Self::Stale => "stale",
            Self::TooLarge => "too_large",
        }
    }
}

/// A response served from the cache: the stored status, headers (with `Age` set) and body (empty
/// for a `HEAD` request, whose headers keep the `GET` body's `Content-Length`).
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    /// The stored status.
    pub status: StatusCode,
    /// The stored headers, with `Age` set to the entry's current age.
    pub headers: HeaderMap,
    /// The stored body (empty for `HEAD`).
    pub body: Bytes,
}

/// The outcome of [`HttpCache::join`].
#[derive(Debug)]
pub(crate) enum Flight {
    /// No request for the key was in flight: this caller goes upstream, and its guard's drop
    /// wakes the followers.
    Leader(LeaderGuard),
    /// A leader is in flight for the key: wait for it, then look up again.
    Follower(Follower),
}

/// The leader's side of a flight: dropping it (after [`HttpCache::store`], or on any failure)
/// ends the flight and wakes every follower.
pub(crate) struct LeaderGuard {
    key: CacheKey,
    id: u64,
    flights: Arc<Mutex<Flights>>,
    // Dropped after `Drop::drop` has taken the flight out of the map: closing the channel is the
    // followers' wake-up.
    _done: watch::Sender<()>,
}

impl LeaderGuard {
    /// The key this flight is for.
    #[cfg(test)]
    pub(crate) fn key(&self) -> &CacheKey {
        &self.key
    }
}

impl fmt::Debug for LeaderGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderGuard").field("key", &self.key).field("id", &self.id).finish_non_exhaustive()
    }
}

impl Drop for LeaderGuard {
    fn drop(&mut self) {
        let mut flights = self.flights.lock();
        if flights.map.get(&self.key).is_some_and(|(id, _)| *id == self.id) {
            flights.map.remove(&self.key);
        }
    }
}

/// A follower's side of a flight.
#[derive(Debug)]
pub(crate) struct Follower {
    done: watch::Receiver<()>,
}

impl Follower {
    /// Returns once the leader's guard is dropped (at once if it already was). No timeout of its
    /// own: wrap it in one. Cancel safe, and may be called again after a timeout.
    pub(crate) async fn wait(&mut self) {
        // The leader never sends: the only way out is the channel closing.
        while self.done.changed().await.is_ok() {}
    }
}

/// The flights in the air, by key, each with its id (so that a guard removes only its own).
#[derive(Debug, Default)]
struct Flights {
    next: u64,
    map: HashMap<CacheKey, (u64, watch::Receiver<()>)>,
}

/// One stored response, for one set of `Vary`'d request header values.
#[derive(Debug)]
struct Variant {
    /// Store order, unique: larger is newer.
    id: u64,
    /// Recency: this variant's key in [`Inner::lru`].
    tick: u64,
    /// The `Vary`'d request headers and their normalised values (`None`: absent).
    vary: Vec<(HeaderName, Option<Vec<u8>>)>,
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    response_time: SystemTime,
    initial_age: u64,
    lifetime: u64,
    /// What the variant counts for in [`Inner::bytes`].
    size: u64,
}

impl Variant {
    /// The current age in seconds (RFC 9111 §4.2.3).
    fn age(&self, now: SystemTime) -> u64 {
        self.initial_age.saturating_add(secs_between(now, self.response_time))
    }

    fn fresh(&self, now: SystemTime) -> bool {
        self.lifetime > self.age(now)
    }

    fn matches(&self, headers: &HeaderMap) -> bool {
        self.vary.iter().all(|(name, value)| normalised(headers, name) == *value)
    }
}

/// The entries, their recency index and their byte count.
#[derive(Debug, Default)]
struct Inner {
    map: HashMap<CacheKey, Vec<Variant>>,
    /// Recency tick → (key, variant id); the first entry is the least recently used. Its own
    /// index, not the worker's (`keyroute-worker`'s disk cache) nor the `lru` crate's: it orders
    /// Vary variants of a key, evicts by bytes, and is checked against `map` by the invariant test
    /// below; the two crates share nothing but the placement core, where a cache index does not
    /// belong, and a BTreeMap of ticks costs O(log n) with no unsafe code.
    lru: BTreeMap<u64, (CacheKey, u64)>,
    bytes: u64,
    entries: usize,
    /// The last tick or id handed out.
    counter: u64,
}

impl Inner {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn insert(&mut self, key: CacheKey, mut variant: Variant) {
        let tick = self.next();
        variant.tick = tick;
        self.lru.insert(tick, (key.clone(), variant.id));
        self.bytes = self.bytes.saturating_add(variant.size);
        self.entries += 1;
        self.map.entry(key).or_default().push(variant);
    }

    fn remove(&mut self, key: &CacheKey, id: u64) -> Option<Variant> {
        let variants = self.map.get_mut(key)?;
        let at = variants.iter().position(|v| v.id == id)?;
        let variant = variants.swap_remove(at);
        if variants.is_empty() {
            self.map.remove(key);
        }
        self.lru.remove(&variant.tick);
        self.bytes = self.bytes.saturating_sub(variant.size);
        self.entries = self.entries.saturating_sub(1);
        Some(variant)
    }

    /// Removes the key's variants that `select` selects; returns how many.
    fn remove_where(&mut self, key: &CacheKey, select: impl Fn(&Variant) -> bool) -> usize {
        let ids: Vec<u64> =
            self.map.get(key).map(|vs| vs.iter().filter(|v| select(v)).map(|v| v.id).collect()).unwrap_or_default();
        let mut removed = 0;
        for id in ids {
            if self.remove(key, id).is_some() {
                removed += 1;
            }
        }
        removed
    }

    /// Marks the variant most recently used.
    fn touch(&mut self, key: &CacheKey, id: u64) {
        let tick = self.next();
        if let Some(variant) = self.map.get_mut(key).and_then(|vs| vs.iter_mut().find(|v| v.id == id)) {
            self.lru.remove(&variant.tick);
            variant.tick = tick;
            self.lru.insert(tick, (key.clone(), id));
        }
    }

    /// Evicts least recently used variants until the total is within `max_bytes`.
    fn evict_to(&mut self, max_bytes: u64) {
        while self.bytes > max_bytes {
            let Some((_, (key, id))) = self.lru.pop_first() else { break };
            if let Some(variant) = self.remove(&key, id) {
                tracing::debug!(%key, bytes = variant.size, "cache: evicted");
            }
        }
    }
}

/// A pool's response cache for hot keys (`[pool.hot_keys.cache]`): the store, its settings and
/// its counters. It lives as long as the pool's cache settings do: a reload that keeps them keeps
/// it, one that changes them starts over.
#[derive(Debug)]
pub struct HotCache {
    /// The entries.
    pub store: HttpCache,
    /// The settings it was made with.
    pub settings: crate::config::CacheSettings,
    /// Counters.
    pub metrics: HotCacheMetrics,
}

/// Counters of a pool's response cache.
#[derive(Debug, Default)]
pub struct HotCacheMetrics {
    /// Responses served from the cache.
    pub hits: std::sync::atomic::AtomicU64,
    /// Cacheable requests for hot keys that went upstream.
    pub misses: std::sync::atomic::AtomicU64,
    /// Responses stored.
    pub stores: std::sync::atomic::AtomicU64,
    /// Requests that waited for a concurrent miss of the same key instead of going upstream.
    pub coalesced: std::sync::atomic::AtomicU64,
}

impl HotCache {
    /// An empty cache with these settings.
    pub fn new(settings: crate::config::CacheSettings) -> Self {
        let store = HttpCache::new(CacheConfig {
            max_bytes: settings.max_bytes,
            max_object_bytes: settings.max_object_bytes,
            cache_authorized: settings.cache_authorized,
            cache_set_cookie: settings.cache_set_cookie,
        });
        HotCache { store, settings, metrics: HotCacheMetrics::default() }
    }
}

/// The cache. `Sync`: share it in an `Arc`. See the [module documentation](self).
pub struct HttpCache {
    config: CacheConfig,
    inner: Mutex<Inner>,
    flights: Arc<Mutex<Flights>>,
}

impl fmt::Debug for HttpCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpCache")
            .field("config", &self.config)
            .field("bytes", &self.bytes())
            .field("entries", &self.entries())
            .finish_non_exhaustive()
    }
}

impl HttpCache {
    /// An empty cache.
    pub fn new(config: CacheConfig) -> Self {
        Self { config, inner: Mutex::new(Inner::default()), flights: Arc::new(Mutex::new(Flights::default())) }
    }

    /// The configuration the cache was made with.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The request's primary cache key, or `None` when the request bypasses the cache: a method
    /// other than `GET` or `HEAD` (`HEAD` gets `GET`'s key), `Cache-Control: no-store`, or no
    /// authority (neither in the target nor in one `Host` header), or `Authorization` unless
    /// [`CacheConfig::cache_authorized`] (stricter than RFC 9111 §3.5).
    pub(crate) fn request_key(&self, req: &request::Parts) -> Option<CacheKey> {
        if req.method != Method::GET && req.method != Method::HEAD {
            return None;
        }
        if Directives::parse(&req.headers).has(b"no-store") {
            return None;
        }
        // Stricter than RFC 9111 §3.5: a request with credentials is neither answered from nor
        // stored in this cache unless the pool says so (`cache_authorized`), whatever the
        // response allows: the cache sits in front of hot keys, not of users.
        if req.headers.contains_key(header::AUTHORIZATION) && !self.config.cache_authorized {
            return None;
        }
        key_of(req)
    }

    /// Whether the request has `Cache-Control: only-if-cached` (RFC 9111 §5.2.1.7): on a miss the
    /// proxy answers 504 instead of going upstream.
    pub(crate) fn only_if_cached(req: &request::Parts) -> bool {
        Directives::parse(&req.headers).has(b"only-if-cached")
    }

    /// A fresh stored response for the request, or `None`. The variant is the most recently
    /// stored one whose `Vary`'d header values match the request's. The request's `no-cache`,
    /// `max-age=0` or (without `Cache-Control`) `Pragma: no-cache` force a miss; its `max-age=N`
    /// refuses an entry older than `N` seconds, its `min-fresh=N` one fresh for less than `N`
    /// more. A request with `Authorization` is never served, unless
    /// [`CacheConfig::cache_authorized`]. Stale variants of the key are removed. A hit counts as
    /// a use for eviction, and carries `Age` (RFC 9111 §4.2.3); for `HEAD` its body is empty.
    pub(crate) fn lookup(&self, key: &CacheKey, req: &request::Parts, now: SystemTime) -> Option<Cached> {
        let limits = RequestLimits::of(&req.headers)?;
        let authorized = req.headers.contains_key(header::AUTHORIZATION) && !self.config.cache_authorized;
        let mut inner = self.inner.lock();
        inner.remove_where(key, |v| !v.fresh(now));
        let variant = inner.map.get(key)?.iter().filter(|v| v.matches(&req.headers)).max_by_key(|v| v.id)?;
        // Stricter than RFC 9111 §3.5 (see `request_key`): credentials never get a stored answer
        // unless the pool allows it.
        if authorized {
            return None;
        }
        let age = variant.age(now);
        if limits.max_age.is_some_and(|max| age > max)
            || limits.min_fresh.is_some_and(|min| variant.lifetime.saturating_sub(age) < min)
        {
            return None;
        }
        let mut headers = variant.headers.clone();
        // RFC 9111 §5.1: an age past 2^31 is sent as 2^31.
        headers.insert(header::AGE, HeaderValue::from(age.min(1 << 31)));
        let body = if req.method == Method::HEAD { Bytes::new() } else { variant.body.clone() };
        let (status, id) = (variant.status, variant.id);
        inner.touch(key, id);
        Some(Cached { status, headers, body })
    }

    /// Whether the response (its head: before its body is read) may be stored, as the answer to
    /// `req`, `now` being when the head arrived. See the [module documentation](self) for the
    /// rules; the first that fails is the reason returned.
    pub(crate) fn storable(
        &self,
        req: &request::Parts,
        resp: &response::Parts,
        now: SystemTime,
    ) -> Result<Storable, NotStorable> {
        if req.method != Method::GET {
            return Err(NotStorable::Method);
        }
        if Directives::parse(&req.headers).has(b"no-store") {
            return Err(NotStorable::RequestNoStore);
        }
        if !cacheable_status(resp.status) {
            return Err(NotStorable::Status);
        }
        let cc = Directives::parse(&resp.headers);
        if cc.has(b"no-store") {
            return Err(NotStorable::NoStore);
        }
        if cc.has(b"private") {
            return Err(NotStorable::Private);
        }
        if cc.has(b"no-cache") {
            return Err(NotStorable::NoCache);
        }
        let vary = vary_names(&resp.headers)?;
        if resp.headers.contains_key(header::SET_COOKIE) && !self.config.cache_set_cookie {
            return Err(NotStorable::SetCookie);
        }
        // Stricter than RFC 9111 §3.5 (see `request_key`): `public` is not enough.
        if req.headers.contains_key(header::AUTHORIZATION) && !self.config.cache_authorized {
            return Err(NotStorable::Authorization);
        }
        if content_length(&resp.headers)
            .is_some_and(|len| len > self.config.max_object_bytes || len > self.config.max_bytes)
        {
            return Err(NotStorable::TooLarge);
        }
        // RFC 9110 §6.6.1: a Date that is absent or invalid is replaced by the time of receipt.
        let date = first_date(&resp.headers, &header::DATE).flatten().unwrap_or(now);
        let lifetime = freshness_lifetime(&cc, &resp.headers, date)?;
        let initial_age = secs_between(now, date).max(age_value(&resp.headers));
        if lifetime <= initial_age {
            return Err(NotStorable::Stale);
        }
        Ok(Storable { lifetime, initial_age, response_time: now, vary })
    }

    /// Stores the response with its whole body, under `key` (the request's
    /// [`request_key`](Self::request_key)) and the request's values of the headers the response's
    /// `Vary` names. `token` is what [`storable`](Self::storable) returned for this response.
    /// Replaces the key's variants that this request would have been served; evicts least
    /// recently used entries to stay within [`CacheConfig::max_bytes`]. Returns whether the
    /// response was stored: not if its body is larger than `max_object_bytes`, its estimated size
    /// larger than `max_bytes`, its body shorter or longer than its `Content-Length` (cut short),
    /// or it is stale by `now`.
    pub(crate) fn store(
        &self,
        key: CacheKey,
        token: Storable,
        req: &request::Parts,
        resp: &response::Parts,
        body: Bytes,
        now: SystemTime,
    ) -> bool {
        let body_len = len64(body.len());
        if body_len > self.config.max_object_bytes {
            return false;
        }
        let chunked = resp.headers.contains_key(header::TRANSFER_ENCODING);
        if !chunked && content_length(&resp.headers).is_some_and(|len| len != body_len) {
            return false;
        }
        let vary: Vec<(HeaderName, Option<Vec<u8>>)> =
            token.vary.iter().map(|name| (name.clone(), normalised(&req.headers, name))).collect();
        let headers = stored_headers(&resp.headers, resp.status, body_len);
        let size = entry_size(&key, &vary, &headers, body_len);
        if size > self.config.max_bytes {
            return false;
        }
        let mut inner = self.inner.lock();
        let variant = Variant {
            id: inner.next(),
            tick: 0,
            vary,
            status: resp.status,
            headers,
            body,
            response_time: token.response_time,
            initial_age: token.initial_age,
            lifetime: token.lifetime,
            size,
        };
        if !variant.fresh(now) {
            return false;
        }
        inner.remove_where(&key, |v| !v.fresh(now) || v.matches(&req.headers));
        inner.insert(key, variant);
        inner.evict_to(self.config.max_bytes);
        true
    }

    /// RFC 9111 §4.4: after a non-error (2xx or 3xx) response to a request with an unsafe method
    /// (`POST`, `PUT`, `DELETE`, ...), removes every variant stored for the request's target.
    /// Returns how many. Call it for every such request, hot key or not (it is one hash lookup).
    pub(crate) fn invalidate(&self, req: &request::Parts, status: StatusCode) -> usize {
        if req.method.is_safe() || !(status.is_success() || status.is_redirection()) {
            return 0;
        }
        let Some(key) = key_of(req) else { return 0 };
        // The stored keys carry the scheme the listener served (`with_scheme`), which an
        // origin-form request does not: the target is removed under every scheme.
        let mut inner = self.inner.lock();
        ["", "http", "https"].iter().map(|s| inner.remove_where(&key.clone().with_scheme(s), |_| true)).sum()
    }

    /// Whether the request accepts a stored answer at all: not with `no-cache`, `max-age=0` or
    /// (without `Cache-Control`) `Pragma: no-cache`. A request that does not should not wait for
    /// another's miss either.
    pub(crate) fn may_serve(req: &request::Parts) -> bool {
        RequestLimits::of(&req.headers).is_some()
    }

    /// Removes every entry that is stale at `now`; returns how many. Optional (lookups remove the
    /// stale entries they meet, and eviction the rest): for a periodic sweep.
    pub fn purge_expired(&self, now: SystemTime) -> usize {
        let mut inner = self.inner.lock();
        let keys: Vec<CacheKey> = inner.map.keys().cloned().collect();
        keys.iter().map(|key| inner.remove_where(key, |v| !v.fresh(now))).sum()
    }

    /// The total estimated size of the entries, in bytes.
    pub fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// The number of stored responses (variants, over all keys).
    pub fn entries(&self) -> usize {
        self.inner.lock().entries
    }

    /// The number of flights (keys with a leader upstream).
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.flights.lock().map.len()
    }

    /// Joins the flight for `key`: the first caller becomes its [`Flight::Leader`], later callers,
    /// while the leader's guard lives, [`Flight::Follower`]s. See the
    /// [module documentation](self#coalescing).
    pub(crate) fn join(&self, key: &CacheKey) -> Flight {
        let mut flights = self.flights.lock();
        if let Some((_, done)) = flights.map.get(key) {
            return Flight::Follower(Follower { done: done.clone() });
        }
        flights.next += 1;
        let id = flights.next;
        let (tx, rx) = watch::channel(());
        flights.map.insert(key.clone(), (id, rx));
        Flight::Leader(LeaderGuard { key: key.clone(), id, flights: Arc::clone(&self.flights), _done: tx })
    }
}

fn len64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// Whole seconds from `earlier` to `later`, 0 if `later` is not later.
fn secs_between(later: SystemTime, earlier: SystemTime) -> u64 {
    later.duration_since(earlier).map(|d| d.as_secs()).unwrap_or(0)
}

/// The key of any request (whatever its method): scheme, authority, path and query.
fn key_of(req: &request::Parts) -> Option<CacheKey> {
    let authority = match req.uri.authority() {
        Some(authority) => authority.as_str().to_ascii_lowercase(),
        None => {
            let mut hosts = req.headers.get_all(header::HOST).iter();
            let (Some(host), None) = (hosts.next(), hosts.next()) else { return None };
            let host = host.to_str().ok()?.trim();
            if host.is_empty() {
                return None;
            }
            host.to_ascii_lowercase()
        }
    };
    let path_and_query = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let path_and_query = if path_and_query.is_empty() { "/" } else { path_and_query }.to_owned();
    let scheme = req.uri.scheme_str().unwrap_or("").to_ascii_lowercase();
    Some(CacheKey { scheme, authority, path_and_query, varies_on: String::new() })
}

/// Statuses cacheable by default (RFC 9110 §15.1), less 206 (no ranges here).
fn cacheable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 200 | 203 | 204 | 300 | 301 | 308 | 404 | 405 | 410 | 414 | 501)
}

/// `Cache-Control` directives, in order, names lowercased, values unquoted.
#[derive(Debug, Default)]
struct Directives(Vec<(Vec<u8>, Option<Vec<u8>>)>);

impl Directives {
    /// Every `Cache-Control` line of `headers`, as one list.
    fn parse(headers: &HeaderMap) -> Self {
        let mut out = Vec::new();
        for value in headers.get_all(header::CACHE_CONTROL) {
            parse_directives(value.as_bytes(), &mut out);
        }
        Self(out)
    }

    fn has(&self, name: &[u8]) -> bool {
        self.0.iter().any(|(n, _)| n == name)
    }

    /// The first occurrence of a directive: `None` if absent, `Some(None)` if it has no value.
    fn get(&self, name: &[u8]) -> Option<Option<&[u8]>> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_deref())
    }

    /// The first occurrence's value as delta-seconds: `None` if absent, `Some(None)` if invalid.
    fn seconds(&self, name: &[u8]) -> Option<Option<u64>> {
        self.get(name).map(|value| value.and_then(parse_delta))
    }
}

/// Parses one `Cache-Control` field line: `name[=token|"quoted"]` members, comma-separated.
fn parse_directives(b: &[u8], out: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>) {
    let is_space = |c: u8| c == b' ' || c == b'\t';
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && (is_space(b[i]) || b[i] == b',') {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && b[i] != b',' {
            i += 1;
        }
        let name = b[start..i].trim_ascii().to_ascii_lowercase();
        let mut value = None;
        if i < b.len() && b[i] == b'=' {
            i += 1;
            while i < b.len() && is_space(b[i]) {
                i += 1;
            }
            if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = Vec::new();
                while i < b.len() {
                    match b[i] {
                        b'\\' if i + 1 < b.len() => {
                            v.push(b[i + 1]);
                            i += 2;
                        }
                        b'"' => {
                            i += 1;
                            break;
                        }
                        c => {
                            v.push(c);
                            i += 1;
                        }
                    }
                }
                // Anything between the closing quote and the next comma is ignored.
                while i < b.len() && b[i] != b',' {
                    i += 1;
                }
                value = Some(v);
            } else {
                let start = i;
                while i < b.len() && b[i] != b',' {
                    i += 1;
                }
                value = Some(b[start..i].trim_ascii().to_vec());
            }
        }
        if !name.is_empty() {
            out.push((name, value));
        }
    }
}

/// delta-seconds (RFC 9111 §1.2.2): one or more digits, saturating.
fn parse_delta(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
}

/// What a request's directives allow of a hit, or `None` when they force a miss.
#[derive(Debug)]
struct RequestLimits {
    max_age: Option<u64>,
    min_fresh: Option<u64>,
}

impl RequestLimits {
    fn of(headers: &HeaderMap) -> Option<Self> {
        if !headers.contains_key(header::CACHE_CONTROL) {
            // RFC 9111 §5.4: Pragma: no-cache, when there is no Cache-Control.
            let pragma_no_cache = headers
                .get_all(header::PRAGMA)
                .iter()
                .any(|v| v.as_bytes().split(|&c| c == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"no-cache")));
            return if pragma_no_cache { None } else { Some(Self { max_age: None, min_fresh: None }) };
        }
        let cc = Directives::parse(headers);
        if cc.has(b"no-cache") {
            return None;
        }
        // An invalid value (`Some(None)`) or max-age=0 forces a miss.
        let max_age = match cc.seconds(b"max-age") {
            Some(None | Some(0)) => return None,
            Some(n) => n,
            None => None,
        };
        let min_fresh = match cc.seconds(b"min-fresh") {
            Some(None) => return None,
            Some(n) => n,
            None => None,
        };
        Some(Self { max_age, min_fresh })
    }
}

/// The freshness lifetime (RFC 9111 §4.2.1): s-maxage, else max-age, else Expires minus Date.
fn freshness_lifetime(cc: &Directives, headers: &HeaderMap, date: SystemTime) -> Result<u64, NotStorable> {
    for name in [&b"s-maxage"[..], b"max-age"] {
        if let Some(seconds) = cc.seconds(name) {
            return seconds.ok_or(NotStorable::Stale);
        }
    }
    match first_date(headers, &header::EXPIRES) {
        None => Err(NotStorable::NoFreshness),
        // RFC 9111 §5.3: an invalid Expires (e.g. "0") is a time in the past.
        Some(None) => Err(NotStorable::Stale),
        Some(Some(expires)) => Ok(secs_between(expires, date)),
    }
}

/// The first value of a date header: `None` if absent, `Some(None)` if invalid.
fn first_date(headers: &HeaderMap, name: &HeaderName) -> Option<Option<SystemTime>> {
    let value = headers.get(name)?;
    Some(value.to_str().ok().and_then(|s| httpdate::parse_http_date(s.trim()).ok()))
}

/// The response's `Age` in seconds (RFC 9111 §5.1: the first member; an invalid value is ignored).
fn age_value(headers: &HeaderMap) -> u64 {
    let Some(value) = headers.get(header::AGE) else { return 0 };
    let first = value.as_bytes().split(|&c| c == b',').next().unwrap_or_default();
    parse_delta(first.trim_ascii()).unwrap_or(0)
}

/// The `Content-Length`, when every value is the same valid number.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut len = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        for member in value.as_bytes().split(|&c| c == b',') {
            let n = parse_delta(member.trim_ascii())?;
            if len.is_some_and(|l| l != n) {
                return None;
            }
            len = Some(n);
        }
    }
    len
}

/// The header names `Vary` lists, lowercased and deduplicated.
fn vary_names(headers: &HeaderMap) -> Result<Vec<HeaderName>, NotStorable> {
    let mut names: Vec<HeaderName> = Vec::new();
    for value in headers.get_all(header::VARY) {
        for member in value.as_bytes().split(|&c| c == b',').map(<[u8]>::trim_ascii) {
            if member.is_empty() {
                continue;
            }
            if member == b"*" {
                return Err(NotStorable::VaryStar);
            }
            let name = HeaderName::from_bytes(member).map_err(|_| NotStorable::InvalidVary)?;
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    Ok(names)
}

/// A request header's values, normalised for `Vary` matching: all lines as one comma list,
/// members trimmed, empty members dropped, runs of spaces and tabs inside a member collapsed to
/// one space. `None` when the header is absent (distinct from `Some(empty)`).
fn normalised(headers: &HeaderMap, name: &HeaderName) -> Option<Vec<u8>> {
    let mut values = headers.get_all(name).iter().peekable();
    values.peek()?;
    let mut out = Vec::new();
    for value in values {
        for member in value.as_bytes().split(|&c| c == b',').map(<[u8]>::trim_ascii) {
            if member.is_empty() {
                continue;
            }
            if !out.is_empty() {
                out.push(b',');
            }
            let mut space = false;
            for &c in member {
                if c == b' ' || c == b'\t' {
                    space = true;
                    continue;
                }
                if space {
                    out.push(b' ');
                    space = false;
                }
                out.push(c);
            }
        }
    }
    Some(out)
}

/// The headers stored with a response: without hop-by-hop headers (and those `Connection`
/// names), `Set-Cookie` and `Age`; with `Content-Length` set to the stored body's (none on 204).
fn stored_headers(src: &HeaderMap, status: StatusCode, body_len: u64) -> HeaderMap {
    let mut headers = src.clone();
    let named: Vec<HeaderName> = src
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&c| c == b','))
        .filter_map(|n| HeaderName::from_bytes(n.trim_ascii()).ok())
        .collect();
    // Hop-by-hop headers (RFC 9110 §7.6.1) are never stored, nor the cookie and the age.
    for name in crate::hop::HOP_BY_HOP.iter().chain(&named).chain([
        &header::TRANSFER_ENCODING,
        &header::SET_COOKIE,
        &header::AGE,
    ]) {
        headers.remove(name);
    }
    if status == StatusCode::NO_CONTENT {
        headers.remove(header::CONTENT_LENGTH);
    } else {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    headers
}

/// A header's size as HPACK counts it (RFC 7541 §4.1): name + value + 32.
fn header_size(name: &HeaderName, value_len: usize) -> u64 {
    len64(name.as_str().len()).saturating_add(len64(value_len)).saturating_add(32)
}

/// An entry's estimated size: body, stored headers, key and `Vary`'d values.
fn entry_size(key: &CacheKey, vary: &[(HeaderName, Option<Vec<u8>>)], headers: &HeaderMap, body_len: u64) -> u64 {
    let headers: u64 = headers.iter().map(|(n, v)| header_size(n, v.len())).sum();
    let vary: u64 = vary.iter().map(|(n, v)| header_size(n, v.as_ref().map_or(0, Vec::len))).sum();
    body_len.saturating_add(headers).saturating_add(vary).saturating_add(key.size())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn config() -> CacheConfig {
        CacheConfig { max_bytes: 1 << 20, max_object_bytes: 1 << 16, cache_authorized: false, cache_set_cookie: false }
    }

    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn at(secs: u64) -> SystemTime {
        t0() + Duration::from_secs(secs)
    }

    fn date(t: SystemTime) -> String {
        httpdate::fmt_http_date(t)
    }

    fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) && !uri.contains("://") {
            b = b.header("host", "a.example");
        }
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("head").into_parts().0
    }

    fn get(uri: &str) -> request::Parts {
        req("GET", uri, &[])
    }

    fn resp(status: u16, headers: &[(&str, &str)]) -> response::Parts {
        let mut b = http::Response::builder().status(status);
        for (n, v) in headers {
            b = b.header(*n, *v);
        }
        b.body(()).expect("head").into_parts().0
    }

    /// The lifetime `storable` computes, or why not.
    fn lifetime(headers: &[(&str, &str)]) -> Result<u64, NotStorable> {
        HttpCache::new(config()).storable(&get("/x"), &resp(200, headers), t0()).map(|s| s.freshness_lifetime())
    }

    /// request_key + storable + store, at `now`.
    fn put(cache: &HttpCache, rq: &request::Parts, rs: &response::Parts, body: &'static [u8], now: SystemTime) -> bool {
        let key = cache.request_key(rq).expect("cacheable request");
        let token = cache.storable(rq, rs, now).expect("storable response");
        cache.store(key, token, rq, rs, Bytes::from_static(body), now)
    }

    fn hit(cache: &HttpCache, rq: &request::Parts, now: SystemTime) -> Option<Cached> {
        let key = cache.request_key(rq)?;
        cache.lookup(&key, rq, now)
    }

    fn age_of(c: &Cached) -> u64 {
        c.headers[header::AGE].to_str().expect("ascii").parse().expect("age")
    }

    /// The byte count and the entry count agree with the entries, and the LRU index with both.
    fn check_accounting(cache: &HttpCache) {
        let inner = cache.inner.lock();
        let variants: Vec<(&CacheKey, &Variant)> =
            inner.map.iter().flat_map(|(k, vs)| vs.iter().map(move |v| (k, v))).collect();
        let recomputed: u64 =
            variants.iter().map(|(k, v)| entry_size(k, &v.vary, &v.headers, len64(v.body.len()))).sum();
        assert_eq!(inner.bytes, recomputed);
        assert_eq!(inner.bytes, variants.iter().map(|(_, v)| v.size).sum::<u64>());
        assert_eq!(inner.entries, variants.len());
        assert_eq!(inner.lru.len(), variants.len());
        for (tick, (key, id)) in &inner.lru {
            assert!(inner.map[key].iter().any(|v| v.id == *id && v.tick == *tick));
        }
        assert!(inner.map.values().all(|vs| !vs.is_empty()));
    }

    // --- Freshness ---

    #[test]
    fn max_age_gives_the_lifetime() {
        assert_eq!(lifetime(&[("cache-control", "max-age=60")]), Ok(60));
        assert_eq!(lifetime(&[("cache-control", "public, Max-Age=\"120\"")]), Ok(120));
    }

    #[test]
    fn s_maxage_takes_precedence_over_max_age_and_expires() {
        let expires = date(at(1000));
        let h = [("cache-control", "max-age=60, s-maxage=300"), ("expires", &expires), ("date", &date(t0()))];
        assert_eq!(lifetime(&h), Ok(300));
        let h = [("cache-control", "max-age=60"), ("expires", &expires), ("date", &date(t0()))];
        assert_eq!(lifetime(&h), Ok(60));
    }

    #[test]
    fn expires_minus_date_gives_the_lifetime() {
        // Date 100 s before the response arrives, Expires 400 s after Date: lifetime 400, initial age 100.
        let (d, e) = (date(t0() - Duration::from_secs(100)), date(at(300)));
        let token = HttpCache::new(config()).storable(&get("/x"), &resp(200, &[("date", &d), ("expires", &e)]), t0());
        let token = token.expect("storable");
        assert_eq!(token.freshness_lifetime(), 400);
        assert_eq!(token.initial_age(), 100);
        // Other formats of HTTP-date: RFC 850 and asctime.
        let h = [("date", "Sunday, 06-Nov-94 08:49:37 GMT"), ("expires", "Sun Nov  6 08:50:37 1994")];
        let cache = HttpCache::new(config());
        let token = cache
            .storable(&get("/x"), &resp(200, &h), httpdate::parse_http_date(h[0].1).expect("date"))
            .expect("storable");
        assert_eq!(token.freshness_lifetime(), 60);
    }

    #[test]
    fn expires_without_date_counts_from_now() {
        assert_eq!(lifetime(&[("expires", &date(at(90)))]), Ok(90));
        // An invalid Date is replaced by the time of receipt too.
        assert_eq!(lifetime(&[("date", "yesterday"), ("expires", &date(at(90)))]), Ok(90));
    }

    #[test]
    fn invalid_or_past_expires_is_already_expired() {
        assert_eq!(lifetime(&[("expires", "0")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("expires", "not a date")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("expires", &date(t0() - Duration::from_secs(1)))]), Err(NotStorable::Stale));
        // max-age wins over an invalid Expires.
        assert_eq!(lifetime(&[("cache-control", "max-age=10"), ("expires", "0")]), Ok(10));
    }

    #[test]
    fn invalid_max_age_is_stale_and_missing_freshness_is_not_stored() {
        assert_eq!(lifetime(&[("cache-control", "max-age=ten")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("cache-control", "max-age=-1")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("cache-control", "max-age")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("cache-control", "s-maxage=x, max-age=60")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("cache-control", "max-age=0")]), Err(NotStorable::Stale));
        assert_eq!(lifetime(&[("cache-control", "public")]), Err(NotStorable::NoFreshness));
        assert_eq!(lifetime(&[]), Err(NotStorable::NoFreshness));
    }

    #[test]
    fn duplicate_directives_take_the_first_and_values_saturate() {
        assert_eq!(lifetime(&[("cache-control", "max-age=30"), ("cache-control", "max-age=90")]), Ok(30));
        assert_eq!(lifetime(&[("cache-control", "max-age=99999999999999999999999999")]), Ok(u64::MAX));
    }

    #[test]
    fn age_on_arrival_shortens_freshness() {
        // Age 50 of max-age 60: fresh for 10 more seconds; Age 60: stale already.
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("age", "50")]);
        assert!(put(&cache, &get("/x"), &rs, b"x", t0()));
        assert_eq!(age_of(&hit(&cache, &get("/x"), at(9)).expect("hit")), 59);
        assert!(hit(&cache, &get("/x"), at(10)).is_none());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("age", "60")]);
        assert_eq!(cache.storable(&get("/x"), &rs, t0()).expect_err("not storable"), NotStorable::Stale);
    }

    #[test]
    fn initial_age_is_the_larger_of_apparent_age_and_age_header() {
        let cache = HttpCache::new(config());
        let d = date(t0() - Duration::from_secs(10));
        let token = cache.storable(&get("/x"), &resp(200, &[("cache-control", "max-age=60"), ("date", &d)]), t0());
        assert_eq!(token.expect("storable").initial_age(), 10);
        let h = [("cache-control", "max-age=60"), ("date", d.as_str()), ("age", "25")];
        assert_eq!(cache.storable(&get("/x"), &resp(200, &h), t0()).expect("storable").initial_age(), 25);
        let h = [("cache-control", "max-age=60"), ("date", d.as_str()), ("age", "5")];
        assert_eq!(cache.storable(&get("/x"), &resp(200, &h), t0()).expect("storable").initial_age(), 10);
        // A Date in the future counts as no apparent age; an invalid Age is ignored.
        let h = [("cache-control", "max-age=60"), ("date", &date(at(30))), ("age", "x")];
        assert_eq!(cache.storable(&get("/x"), &resp(200, &h), t0()).expect("storable").initial_age(), 0);
    }

    // --- Response storability ---

    #[test]
    fn no_store_private_no_cache_and_vary_star_are_refused() {
        let cases = [
            ("max-age=60, no-store", NotStorable::NoStore),
            ("max-age=60, PRIVATE", NotStorable::Private),
            ("max-age=60, private=\"x-user, x-id\"", NotStorable::Private),
            ("no-cache, max-age=60", NotStorable::NoCache),
            ("max-age=60, no-cache=\"set-cookie\"", NotStorable::NoCache),
        ];
        for (cc, why) in cases {
            assert_eq!(lifetime(&[("cache-control", cc)]), Err(why), "{cc}");
        }
        assert_eq!(lifetime(&[("cache-control", "max-age=60"), ("vary", "accept, *")]), Err(NotStorable::VaryStar));
        assert_eq!(lifetime(&[("cache-control", "max-age=60"), ("vary", "a b")]), Err(NotStorable::InvalidVary));
        // A quoted comma does not split a directive: this is one private directive, no max-age.
        assert_eq!(lifetime(&[("cache-control", "private=\"a, max-age=60\"")]), Err(NotStorable::Private));
        assert_eq!(lifetime(&[("cache-control", "community=\"no-store, x\", max-age=60")]), Ok(60));
    }

    #[test]
    fn only_default_cacheable_statuses_and_get_are_stored() {
        let cache = HttpCache::new(config());
        for status in [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501] {
            assert!(cache.storable(&get("/x"), &resp(status, &[("cache-control", "max-age=9")]), t0()).is_ok());
        }
        for status in [201, 206, 302, 304, 307, 500, 503] {
            let r = cache.storable(&get("/x"), &resp(status, &[("cache-control", "max-age=9")]), t0());
            assert_eq!(r.expect_err("not storable"), NotStorable::Status, "{status}");
        }
        let rs = resp(200, &[("cache-control", "max-age=9")]);
        assert_eq!(cache.storable(&req("HEAD", "/x", &[]), &rs, t0()).expect_err("not storable"), NotStorable::Method);
        assert_eq!(cache.storable(&req("POST", "/x", &[]), &rs, t0()).expect_err("not storable"), NotStorable::Method);
        let rq = req("GET", "/x", &[("cache-control", "no-store")]);
        assert_eq!(cache.storable(&rq, &rs, t0()).expect_err("not storable"), NotStorable::RequestNoStore);
    }

    #[test]
    fn set_cookie_refused_unless_configured_and_never_served() {
        let rs = resp(200, &[("cache-control", "max-age=60"), ("set-cookie", "sid=secret")]);
        let cache = HttpCache::new(config());
        assert_eq!(cache.storable(&get("/x"), &rs, t0()).expect_err("not storable"), NotStorable::SetCookie);

        let cache = HttpCache::new(CacheConfig { cache_set_cookie: true, ..config() });
        assert!(put(&cache, &get("/x"), &rs, b"body", t0()));
        let c = hit(&cache, &get("/x"), at(1)).expect("hit");
        assert!(!c.headers.contains_key(header::SET_COOKIE));
        assert_eq!(c.body, "body");
    }

    #[test]
    fn authorization_needs_a_sharing_directive_or_cache_authorized() {
        let rq = req("GET", "/x", &[("authorization", "Bearer t")]);
        let cache = HttpCache::new(config());
        let plain = resp(200, &[("cache-control", "max-age=60")]);
        assert_eq!(cache.storable(&rq, &plain, t0()).expect_err("not storable"), NotStorable::Authorization);
        // Stricter than RFC 9111 §3.5: even a response that allows sharing is not stored.
        for cc in ["max-age=60, public", "s-maxage=60", "max-age=60, must-revalidate"] {
            let e = cache.storable(&rq, &resp(200, &[("cache-control", cc)]), t0()).expect_err("not storable");
            assert_eq!(e, NotStorable::Authorization, "{cc}");
        }
        let cache = HttpCache::new(CacheConfig { cache_authorized: true, ..config() });
        assert!(cache.storable(&rq, &plain, t0()).is_ok());
        assert!(put(&cache, &rq, &plain, b"b", t0()));
        assert!(hit(&cache, &rq, at(1)).is_some());
    }

    #[test]
    fn authorized_request_is_served_only_shareable_entries() {
        let cache = HttpCache::new(config());
        let authed = req("GET", "/x", &[("authorization", "Bearer t")]);
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=60")]), b"anon", t0()));
        assert!(hit(&cache, &get("/x"), at(1)).is_some());
        assert!(hit(&cache, &authed, at(1)).is_none());
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=60, public")]), b"pub", t0()));
        assert!(hit(&cache, &authed, at(1)).is_none(), "not even a public entry");
        let open = HttpCache::new(CacheConfig { cache_authorized: true, ..config() });
        assert!(put(&open, &get("/x"), &resp(200, &[("cache-control", "max-age=60")]), b"anon", t0()));
        assert_eq!(hit(&open, &authed, at(1)).expect("hit").body, "anon");
    }

    #[test]
    fn content_length_above_max_object_bytes_is_refused() {
        let cache = HttpCache::new(CacheConfig { max_object_bytes: 10, ..config() });
        let rs = resp(200, &[("cache-control", "max-age=60"), ("content-length", "11")]);
        assert_eq!(cache.storable(&get("/x"), &rs, t0()).expect_err("not storable"), NotStorable::TooLarge);
        let rs = resp(200, &[("cache-control", "max-age=60"), ("content-length", "10")]);
        assert!(cache.storable(&get("/x"), &rs, t0()).is_ok());
        // Without Content-Length (chunked), the body itself is checked at store time.
        let rs = resp(200, &[("cache-control", "max-age=60"), ("transfer-encoding", "chunked")]);
        let token = cache.storable(&get("/x"), &rs, t0()).expect("storable");
        let key = cache.request_key(&get("/x")).expect("key");
        assert!(!cache.store(key.clone(), token.clone(), &get("/x"), &rs, Bytes::from_static(b"01234567890"), t0()));
        assert_eq!(cache.entries(), 0);
        assert!(cache.store(key, token, &get("/x"), &rs, Bytes::from_static(b"0123456789"), t0()));
        assert_eq!(cache.entries(), 1);
    }

    #[test]
    fn object_larger_than_max_bytes_or_cut_short_is_not_stored() {
        let cache = HttpCache::new(CacheConfig { max_bytes: 200, ..config() });
        let rs = resp(200, &[("cache-control", "max-age=60")]);
        assert!(put(&cache, &get("/small"), &rs, b"ok", t0()));
        // Body under max_object_bytes but body + headers over max_bytes: refused, nothing evicted.
        assert!(!put(&cache, &get("/big"), &rs, &[b'x'; 150], t0()));
        assert_eq!(cache.entries(), 1);
        assert!(hit(&cache, &get("/small"), t0()).is_some());
        // A body shorter than its Content-Length was cut short.
        let rs = resp(200, &[("cache-control", "max-age=60"), ("content-length", "5")]);
        assert!(!put(&cache, &get("/cut"), &rs, b"abc", t0()));
        assert!(hit(&cache, &get("/cut"), t0()).is_none());
        check_accounting(&cache);
    }

    // --- Requests ---

    #[test]
    fn request_keys_share_get_and_head_and_bypass_the_rest() {
        let cache = HttpCache::new(config());
        let k = cache.request_key(&get("/p?q=1")).expect("key");
        assert_eq!((k.authority(), k.path_and_query(), k.scheme()), ("a.example", "/p?q=1", ""));
        assert_eq!(cache.request_key(&req("HEAD", "/p?q=1", &[])), Some(k.clone()));
        assert_ne!(cache.request_key(&get("/p?q=2")), Some(k.clone()));
        assert_ne!(cache.request_key(&req("GET", "/p?q=1", &[("host", "b.example")])), Some(k.clone()));
        assert_eq!(cache.request_key(&req("GET", "/p?q=1", &[("host", "A.Example")])), Some(k.clone()));
        assert_eq!(cache.request_key(&req("GET", "http://a.example/p?q=1", &[])), Some(k.clone().with_scheme("HTTP")));
        assert_ne!(k.clone().with_scheme("https"), k.clone().with_scheme("http"));
        for m in ["POST", "PUT", "DELETE", "OPTIONS"] {
            assert_eq!(cache.request_key(&req(m, "/p?q=1", &[])), None, "{m}");
        }
        assert_eq!(cache.request_key(&req("GET", "/p", &[("cache-control", "No-Store")])), None);
        assert_eq!(cache.request_key(&req("GET", "/p", &[("authorization", "Bearer x")])), None, "credentials bypass");
        let open = HttpCache::new(CacheConfig { cache_authorized: true, ..config() });
        assert!(open.request_key(&req("GET", "/p", &[("authorization", "Bearer x")])).is_some());
        let mut no_host = get("/p");
        no_host.headers.remove(header::HOST);
        assert_eq!(cache.request_key(&no_host), None);
    }

    #[test]
    fn request_no_cache_max_age_zero_and_pragma_force_a_miss() {
        let cache = HttpCache::new(config());
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=60")]), b"b", t0()));
        assert!(hit(&cache, &get("/x"), at(1)).is_some());
        for (n, v) in [
            ("cache-control", "no-cache"),
            ("cache-control", "MAX-AGE=0"),
            ("cache-control", "max-age=soon"),
            ("pragma", "no-cache"),
        ] {
            assert!(hit(&cache, &req("GET", "/x", &[(n, v)]), at(1)).is_none(), "{n}: {v}");
        }
        // Pragma is ignored when Cache-Control is present (RFC 9111 §5.4).
        let rq = req("GET", "/x", &[("pragma", "no-cache"), ("cache-control", "max-stale")]);
        assert!(hit(&cache, &rq, at(1)).is_some());
        // A forced miss does not remove the entry.
        assert_eq!(cache.entries(), 1);
    }

    #[test]
    fn request_max_age_and_min_fresh_limit_hits() {
        let cache = HttpCache::new(config());
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=60")]), b"b", t0()));
        let max_age_10 = req("GET", "/x", &[("cache-control", "max-age=10")]);
        assert!(hit(&cache, &max_age_10, at(10)).is_some());
        assert!(hit(&cache, &max_age_10, at(11)).is_none());
        let min_fresh_20 = req("GET", "/x", &[("cache-control", "min-fresh=20")]);
        assert!(hit(&cache, &min_fresh_20, at(40)).is_some());
        assert!(hit(&cache, &min_fresh_20, at(41)).is_none());
        assert!(hit(&cache, &get("/x"), at(41)).is_some());
        assert!(HttpCache::only_if_cached(&req("GET", "/x", &[("cache-control", "only-if-cached")])));
        assert!(!HttpCache::only_if_cached(&get("/x")));
    }

    // --- Variants ---

    #[test]
    fn vary_keeps_one_variant_per_header_value() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("vary", "Accept")]);
        let webp = req("GET", "/img", &[("accept", "image/webp")]);
        let png = req("GET", "/img", &[("accept", "image/png")]);
        let none = get("/img");
        let empty = req("GET", "/img", &[("accept", "")]);
        assert!(put(&cache, &webp, &rs, b"webp", t0()));
        assert!(hit(&cache, &png, at(1)).is_none());
        assert!(hit(&cache, &none, at(1)).is_none());
        assert!(put(&cache, &png, &rs, b"png", t0()));
        assert!(put(&cache, &none, &rs, b"none", t0()));
        assert_eq!(cache.entries(), 3);
        assert!(hit(&cache, &empty, at(1)).is_none(), "an empty header is not an absent one");
        assert!(put(&cache, &empty, &rs, b"empty", t0()));
        assert_eq!(cache.entries(), 4);
        assert_eq!(hit(&cache, &webp, at(1)).expect("hit").body, "webp");
        assert_eq!(hit(&cache, &png, at(1)).expect("hit").body, "png");
        assert_eq!(hit(&cache, &none, at(1)).expect("hit").body, "none");
        assert_eq!(hit(&cache, &empty, at(1)).expect("hit").body, "empty");
        check_accounting(&cache);
    }

    #[test]
    fn vary_values_are_normalised() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("vary", "accept-encoding")]);
        assert!(put(&cache, &req("GET", "/x", &[("accept-encoding", " gzip,  br ")]), &rs, b"b", t0()));
        for v in ["gzip, br", "gzip,br", "gzip ,, br"] {
            assert!(hit(&cache, &req("GET", "/x", &[("accept-encoding", v)]), at(1)).is_some(), "{v}");
        }
        let two_lines = req("GET", "/x", &[("accept-encoding", "gzip"), ("accept-encoding", "br")]);
        assert!(hit(&cache, &two_lines, at(1)).is_some());
        assert!(hit(&cache, &req("GET", "/x", &[("accept-encoding", "br, gzip")]), at(1)).is_none());
    }

    #[test]
    fn storing_the_same_variant_replaces_it() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("vary", "accept")]);
        let webp = req("GET", "/img", &[("accept", "image/webp")]);
        assert!(put(&cache, &webp, &rs, b"first", t0()));
        let one = cache.bytes();
        assert!(put(&cache, &webp, &rs, b"again", at(1)));
        assert_eq!((cache.entries(), cache.bytes()), (1, one));
        assert_eq!(hit(&cache, &webp, at(2)).expect("hit").body, "again");
        assert!(put(&cache, &webp, &rs, b"longer body", at(1)));
        // Six more bytes of body, one more digit of Content-Length.
        assert_eq!((cache.entries(), cache.bytes()), (1, one + 6 + 1));
        check_accounting(&cache);
    }

    // --- Hits ---

    #[test]
    fn age_on_hits_grows_with_now() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("date", &date(t0() - Duration::from_secs(3)))]);
        assert!(put(&cache, &get("/x"), &rs, b"b", t0()));
        let ages: Vec<u64> =
            [0, 1, 10, 56].iter().map(|s| age_of(&hit(&cache, &get("/x"), at(*s)).expect("hit"))).collect();
        assert_eq!(ages, [3, 4, 13, 59]);
        let c = hit(&cache, &get("/x"), at(2)).expect("hit");
        assert_eq!(c.status, StatusCode::OK);
        assert_eq!(c.headers.get_all(header::AGE).iter().count(), 1);
    }

    #[test]
    fn entries_expire_after_their_lifetime_and_are_removed() {
        let cache = HttpCache::new(config());
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=30")]), b"b", t0()));
        assert!(put(&cache, &get("/y"), &resp(200, &[("cache-control", "max-age=90")]), b"b", t0()));
        assert!(hit(&cache, &get("/x"), at(29)).is_some());
        assert_eq!(cache.entries(), 2);
        assert!(hit(&cache, &get("/x"), at(30)).is_none());
        assert_eq!(cache.entries(), 1);
        check_accounting(&cache);
        assert_eq!(cache.purge_expired(at(89)), 0);
        assert_eq!(cache.purge_expired(at(90)), 1);
        assert_eq!((cache.entries(), cache.bytes()), (0, 0));
        // A response that went stale while its body was read is not stored.
        let rs = resp(200, &[("cache-control", "max-age=5")]);
        let token = cache.storable(&get("/z"), &rs, t0()).expect("storable");
        let key = cache.request_key(&get("/z")).expect("key");
        assert!(!cache.store(key, token, &get("/z"), &rs, Bytes::new(), at(5)));
    }

    #[test]
    fn head_is_served_from_the_get_entry_without_a_body() {
        let cache = HttpCache::new(config());
        assert!(put(&cache, &get("/x"), &resp(200, &[("cache-control", "max-age=60")]), b"hello", t0()));
        let c = hit(&cache, &req("HEAD", "/x", &[]), at(1)).expect("hit");
        assert_eq!(c.status, StatusCode::OK);
        assert!(c.body.is_empty());
        assert_eq!(c.headers[header::CONTENT_LENGTH], "5");
        assert_eq!(hit(&cache, &get("/x"), at(1)).expect("hit").body, "hello");
    }

    #[test]
    fn hop_by_hop_headers_are_not_stored() {
        let cache = HttpCache::new(config());
        let rs = resp(
            200,
            &[
                ("cache-control", "max-age=60"),
                ("connection", "keep-alive, x-hop"),
                ("keep-alive", "timeout=5"),
                ("proxy-connection", "keep-alive"),
                ("te", "trailers"),
                ("trailer", "x-sum"),
                ("transfer-encoding", "chunked"),
                ("upgrade", "h2c"),
                ("x-hop", "1"),
                ("x-kept", "2"),
                ("age", "1"),
                ("content-type", "text/plain"),
            ],
        );
        assert!(put(&cache, &get("/x"), &rs, b"abc", t0()));
        let c = hit(&cache, &get("/x"), at(2)).expect("hit");
        let mut names: Vec<&str> = c.headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["age", "cache-control", "content-length", "content-type", "x-kept"]);
        assert_eq!(c.headers[header::CONTENT_LENGTH], "3");
        assert_eq!(c.headers[header::AGE], "3");
    }

    // --- Bytes and eviction ---

    #[test]
    fn byte_accounting_is_exact() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60")]);
        assert!(put(&cache, &get("/x"), &rs, &[b'x'; 1000], t0()));
        // body 1000 + "cache-control: max-age=60" (13 + 10 + 32) + "content-length: 1000" (14 + 4 + 32)
        // + key "a.example" "/x" (11).
        assert_eq!(cache.bytes(), 1000 + 55 + 50 + 11);
        let rs = resp(200, &[("cache-control", "max-age=60"), ("vary", "accept")]);
        assert!(put(&cache, &req("GET", "/y", &[("accept", "a/b")]), &rs, b"", t0()));
        // + "vary: accept" (4 + 6 + 32), "content-length: 0" (14 + 1 + 32), the Vary'd value (6 + 3 + 32).
        assert_eq!(cache.bytes(), 1116 + 55 + 42 + 47 + 41 + 11);
        check_accounting(&cache);
        assert!(hit(&cache, &get("/x"), at(60)).is_none());
        assert_eq!(cache.bytes(), 55 + 42 + 47 + 41 + 11);
        check_accounting(&cache);
    }

    #[test]
    fn eviction_is_least_recently_used_and_a_hit_protects() {
        let rs = resp(200, &[("cache-control", "max-age=600")]);
        let probe = HttpCache::new(config());
        assert!(put(&probe, &get("/a"), &rs, &[0; 100], t0()));
        let each = probe.bytes();
        // Room for three entries, not four.
        let cache = HttpCache::new(CacheConfig { max_bytes: 3 * each + each / 2, ..config() });
        for p in ["/a", "/b", "/c"] {
            assert!(put(&cache, &get(p), &rs, &[0; 100], t0()));
        }
        assert_eq!((cache.entries(), cache.bytes()), (3, 3 * each));
        // Touch /a: /b is now the least recently used.
        assert!(hit(&cache, &get("/a"), at(1)).is_some());
        assert!(put(&cache, &get("/d"), &rs, &[0; 100], at(2)));
        assert_eq!((cache.entries(), cache.bytes()), (3, 3 * each));
        assert!(hit(&cache, &get("/b"), at(3)).is_none());
        // Then /c, the oldest untouched.
        assert!(put(&cache, &get("/e"), &rs, &[0; 100], at(4)));
        assert!(hit(&cache, &get("/c"), at(5)).is_none());
        for p in ["/a", "/d", "/e"] {
            assert!(hit(&cache, &get(p), at(5)).is_some(), "{p}");
        }
        check_accounting(&cache);
        // A larger object evicts as many as it needs.
        assert!(put(&cache, &get("/big"), &rs, &[0; 250], at(6)));
        assert_eq!(cache.entries(), 2);
        assert!(cache.bytes() <= 3 * each + each / 2);
        check_accounting(&cache);
    }

    #[test]
    fn unsafe_methods_invalidate_the_target() {
        let cache = HttpCache::new(config());
        let rs = resp(200, &[("cache-control", "max-age=60"), ("vary", "accept")]);
        assert!(put(&cache, &req("GET", "/x", &[("accept", "a")]), &rs, b"a", t0()));
        assert!(put(&cache, &req("GET", "/x", &[("accept", "b")]), &rs, b"b", t0()));
        assert!(put(&cache, &get("/y"), &rs, b"y", t0()));
        assert_eq!(cache.invalidate(&req("GET", "/x", &[]), StatusCode::OK), 0);
        assert_eq!(cache.invalidate(&req("POST", "/x", &[]), StatusCode::INTERNAL_SERVER_ERROR), 0);
        assert_eq!(cache.invalidate(&req("POST", "/x", &[]), StatusCode::CREATED), 2);
        assert_eq!(cache.entries(), 1);
        check_accounting(&cache);
        // Stored under the listener's scheme (as the proxy stores), invalidated by an origin-form
        // request, which carries none.
        let rq = get("/z");
        let key = cache.request_key(&rq).expect("key").with_scheme("https");
        let token = cache.storable(&rq, &rs, t0()).expect("storable");
        assert!(cache.store(key.clone(), token, &rq, &rs, Bytes::from_static(b"z"), t0()));
        assert!(cache.lookup(&key, &rq, at(1)).is_some());
        assert_eq!(cache.invalidate(&req("PUT", "/z", &[]), StatusCode::NO_CONTENT), 1);
        assert!(cache.lookup(&key, &rq, at(1)).is_none());
        assert!(!HttpCache::may_serve(&req("GET", "/z", &[("cache-control", "no-cache")])));
        assert!(HttpCache::may_serve(&get("/z")));
    }

    #[test]
    fn hostile_header_values_do_not_panic() {
        let cache = HttpCache::new(config());
        let weird: &[&[u8]] = &[b"", b",", b"=", b"\"", b"max-age=\"", b"max-age=\"\\", b"\xff\xfe=\x80", b"a=b=c,,=,"];
        for v in weird {
            let mut rs = resp(200, &[]);
            let mut rq = get("/x");
            for name in [header::CACHE_CONTROL, header::EXPIRES, header::DATE, header::AGE, header::VARY] {
                let value = HeaderValue::from_bytes(v).expect("value");
                rs.headers.append(name.clone(), value.clone());
                rq.headers.append(name, value);
            }
            rs.headers.append(header::CONTENT_LENGTH, HeaderValue::from_bytes(v).expect("value"));
            rs.headers.append(header::CONNECTION, HeaderValue::from_bytes(v).expect("value"));
            let _ = cache.storable(&rq, &rs, t0());
            if let Some(key) = cache.request_key(&rq) {
                let _ = cache.lookup(&key, &rq, t0());
            }
            let mut rs = resp(200, &[("cache-control", "max-age=60")]);
            rs.headers.append(header::AGE, HeaderValue::from_bytes(v).expect("value"));
            let mut rq = get("/x");
            rq.headers.append(header::ACCEPT, HeaderValue::from_bytes(v).expect("value"));
            rs.headers.append(header::VARY, HeaderValue::from_static("accept"));
            if let Ok(token) = cache.storable(&rq, &rs, t0()) {
                cache.store(cache.request_key(&rq).expect("storable"), token, &rq, &rs, Bytes::new(), t0());
                assert!(hit(&cache, &rq, at(1)).is_some());
            }
        }
        check_accounting(&cache);
    }

    // --- Coalescing ---

    fn key(cache: &HttpCache) -> CacheKey {
        cache.request_key(&get("/hot")).expect("key")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_joins_make_one_leader_and_the_followers_wake_to_a_hit() {
        let cache = Arc::new(HttpCache::new(config()));
        let barrier = Arc::new(tokio::sync::Barrier::new(50));
        let (leaders, woken) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (cache, barrier, leaders, woken) = (cache.clone(), barrier.clone(), leaders.clone(), woken.clone());
            tasks.push(tokio::spawn(async move {
                let k = key(&cache);
                match cache.join(&k) {
                    Flight::Leader(guard) => {
                        leaders.fetch_add(1, Ordering::SeqCst);
                        // Every task has joined before the leader finishes.
                        barrier.wait().await;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        assert!(put(&cache, &get("/hot"), &resp(200, &[("cache-control", "max-age=60")]), b"v", t0()));
                        drop(guard);
                    }
                    Flight::Follower(mut follower) => {
                        barrier.wait().await;
                        tokio::time::timeout(Duration::from_secs(10), follower.wait()).await.expect("woken");
                        assert_eq!(hit(&cache, &get("/hot"), at(1)).expect("a hit after the leader").body, "v");
                        woken.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(leaders.load(Ordering::SeqCst), 1);
        assert_eq!(woken.load(Ordering::SeqCst), 49);
        assert_eq!(cache.in_flight(), 0);
    }

    #[tokio::test]
    async fn followers_wait_while_the_leader_is_in_flight() {
        let cache = HttpCache::new(config());
        let Flight::Leader(guard) = cache.join(&key(&cache)) else { panic!("first join leads") };
        let Flight::Follower(mut follower) = cache.join(&key(&cache)) else { panic!("second join follows") };
        assert!(tokio::time::timeout(Duration::from_millis(50), follower.wait()).await.is_err());
        // Another key is a flight of its own.
        assert!(matches!(cache.join(&cache.request_key(&get("/other")).expect("key")), Flight::Leader(_)));
        assert_eq!(cache.in_flight(), 1);
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), follower.wait()).await.expect("woken by the drop");
        // Waiting again after the flight returns at once.
        tokio::time::timeout(Duration::from_secs(5), follower.wait()).await.expect("at once");
    }

    #[tokio::test]
    async fn a_second_flight_gets_a_new_leader() {
        let cache = HttpCache::new(config());
        let first = cache.join(&key(&cache));
        assert!(matches!(first, Flight::Leader(_)));
        assert!(matches!(cache.join(&key(&cache)), Flight::Follower(_)));
        drop(first);
        assert_eq!(cache.in_flight(), 0);
        let Flight::Leader(second) = cache.join(&key(&cache)) else { panic!("a new flight leads") };
        assert_eq!(second.key(), &key(&cache));
        let Flight::Follower(mut f) = cache.join(&key(&cache)) else { panic!("follows the second") };
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), f.wait()).await.expect("woken by the second leader");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_dropped_without_storing_wakes_followers_to_a_miss() {
        let cache = Arc::new(HttpCache::new(config()));
        let Flight::Leader(guard) = cache.join(&key(&cache)) else { panic!("first join leads") };
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let Flight::Follower(mut f) = cache.join(&key(&cache)) else { panic!("follows") };
            let cache = cache.clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(10), f.wait()).await.expect("woken");
                hit(&cache, &get("/hot"), at(1)).is_none()
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(tasks.iter().all(|t| !t.is_finished()), "followers wait for the leader");
        drop(guard); // upstream failed: nothing stored
        for t in tasks {
            assert!(t.await.expect("task"), "a miss after a failed flight");
        }
        // The next one to try goes upstream as a new leader.
        assert!(matches!(cache.join(&key(&cache)), Flight::Leader(_)));
    }
}

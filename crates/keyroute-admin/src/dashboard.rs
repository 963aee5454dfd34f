//! The operator's dashboard: `GET /dashboard`, one self-contained page (its script and style
//! inline, nothing loaded from elsewhere), and `GET /events`, the server-sent-event feed it reads.
//! Both sit behind the admin API's rules ([`super::guard`] and the token); a browser sends the
//! token as the password of HTTP Basic authentication (any user name), which it asks for once and
//! then sends with the feed's requests too.
//!
//! ## Cost
//!
//! Nothing is sampled while nobody watches: the sampler task starts with the first subscriber of
//! `/events` and ends at the first tick with none left (its history goes with it). While someone
//! watches, one snapshot is built a second, from the counters the gateway keeps anyway (atomics
//! read, never written), and the same bytes go to every subscriber through a queue of
//! [`QUEUE`] frames each: a subscriber that reads nothing misses frames instead of holding memory.
//! At most [`MAX_VIEWERS`] subscribe at once (503 beyond), [`MAX_VIEWERS_PER_CLIENT`] of them from one
//! client address (429 beyond).
//!
//! ## The feed (version 1; a contract: fields are added, never renamed or removed)
//!
//! `text/event-stream`, `retry: 2000` (an `EventSource` reconnects by itself after 2 s, as when
//! the gateway restarts). On connect, one `event: history` whose data is
//! `{"version": 1, "pools": {POOL: [AFFINITY, ...]}}`, the per-second affinity of the last
//! [`HISTORY`] seconds sampled; then one unnamed event a second whose data is the snapshot:
//!
//! ```text
//! { "version": 1, "time": UNIX_MS, "interval_ms": 1000,
//!   "gateway": { "version", "uptime_s", "ready", "viewers" },
//!   "listeners": [ { "name", "address", "tls", "admin", "open", "limit", "accepted", "accepts_per_s",
//!                    "limited", "tls_errors", "h2_connections", "upgrades", "header_timeouts",
//!                    "send_timeouts", "log_written", "log_dropped" } ],
//!   "pools": [ { "name", "strategy", "key", "generation",
//!     "source": { "kind": "static" | "etcd", "up", "revision", "age_s", "rejected", "lost" },
//!     "workers": [ { "name", "address", "zone", "weight",
//!                    "state": "healthy" | "warming" | "unhealthy" | "ejected" | "draining" | "stalled" | "loop",
//!                    "warm_up" (0..1), "in_flight", "rps", "error_rate" (0..1, last 10 s),
//!                    "p99_ms" (last 10 s, null without requests), "requests", "errors",
//!                    "ejections", "retries", "key_share", "request_share" } ],
//!     "affinity": AFFINITY, "affinity_total": AFFINITY-without-t,
//!     "balance": { "sampled_keys", "keys_max_over_mean", "requests_max_over_mean" },
//!     "hot_keys": (as GET /hotkeys gives a pool), "changes": [ CHANGE ], "remapped_keys" } ] }
//!
//! AFFINITY = { "t": UNIX_MS, "owner", "replica", "unavailable", "overloaded", "retry", "warming",
//!              "unkeyed", "no_worker" }   (requests in that second, by where they went and why)
//! CHANGE   = { "at_ms", "generation", "workers", "added", "removed", "reweighted",
//!              "remapped" (share of the recently seen keys whose owner changed), "sampled_keys" }
//! ```
//!
//! `key_share` is the share of the pool's recently seen keys (up to 4,096 distinct) that the
//! worker owns now; `request_share` its share of the pool's responses over the last 10 s.
//! `state` is `warming` for a healthy worker still ramping up (slow start or handoff), with
//! `warm_up` its progress.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::Admin;
use crate::feed::{Full, Limits};
use keyroute_fleet::metrics::{LATENCY_BUCKETS, ListenerMetrics, OUTCOMES};
use keyroute_fleet::pool::{Pool, State};
use keyroute_gateway::body::{BoxError, ProxyBody};

/// Subscribers at once.
pub(crate) const MAX_VIEWERS: usize = 64;

/// Subscribers at once from one client address ([`crate::client_key`]): an operator's few
/// tabs, and room for other addresses whatever one of them holds (issue 31, defect 17).
pub(crate) const MAX_VIEWERS_PER_CLIENT: usize = 8;

/// Frames queued per subscriber.
const QUEUE: usize = 4;

/// Seconds of affinity kept for a new subscriber.
const HISTORY: usize = 300;

/// Seconds over which error rates, p99 and request shares are measured.
const WINDOW: usize = 10;

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// `GET /dashboard`: the page, with a content security policy that lets it run only its own
/// inline script (by a nonce made for this response) and talk only to this origin.
pub(crate) fn page() -> Response<ProxyBody> {
    let Some(nonce) = nonce() else {
        tracing::error!("the OS gave no random bytes for the dashboard's script nonce");
        return keyroute_gateway::body::text(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the dashboard is unavailable: no random source\n",
        );
    };
    let html = PAGE.replace("{{NONCE}}", &nonce);
    let mut resp = keyroute_gateway::body::text(StatusCode::OK, "text/html; charset=utf-8", html);
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::try_from(csp) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    resp
}

/// 128 bits for a script nonce, from the OS's random source (`getrandom`); `None` if the OS
/// refuses (the page is then not served: a guessable nonce would let an injected script run).
fn nonce() -> Option<String> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `GET /events`: subscribes, starting the sampler if it is not running.
pub(crate) fn events(shared: &Arc<Admin>, client: std::net::IpAddr) -> Response<ProxyBody> {
    let limits = Limits { total: MAX_VIEWERS, per_client: MAX_VIEWERS_PER_CLIENT };
    let sub = match shared.dashboard.subscribe(crate::client_key(client), limits, QUEUE) {
        Ok(sub) => sub,
        Err(Full::Total) => return super::fail(StatusCode::SERVICE_UNAVAILABLE, "too many dashboard viewers"),
        Err(Full::Client) => {
            return super::fail(StatusCode::TOO_MANY_REQUESTS, "too many dashboard viewers from this address");
        }
    };
    if sub.start_sampler {
        tokio::spawn(run(Arc::clone(shared)));
    }
    let body = EventBody { first: Some(sub.first), rx: sub.rx };
    let mut resp = Response::new(body.boxed_unsync());
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    resp
}

/// A subscriber's stream: what it is sent first, then a frame per snapshot until the sampler
/// ends (shutdown) or the client goes.
struct EventBody {
    first: Option<Bytes>,
    rx: mpsc::Receiver<Bytes>,
}

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        self.rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// The sampler: a snapshot a second while anyone subscribes.
async fn run(shared: Arc<Admin>) {
    let mut sampler = Sampler::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut shutdown = shared.shutdown.clone();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // The streams end, so their connections can close.
            _ = shutdown.wait_for(|s| *s) => return shared.dashboard.close(),
        }
        let Some(viewers) = shared.dashboard.watched() else { return };
        let (snapshot, affinity) = sampler.sample(&shared, viewers, Instant::now());
        shared.dashboard.publish(Bytes::from(format!("data: {snapshot}\n\n")), affinity, HISTORY);
    }
}

/// A worker's counters at one tick.
#[derive(Clone, Copy, Debug)]
struct Counters {
    total: u64,
    errors: u64,
    buckets: [u64; 15],
}

/// What the sampler remembers between ticks: the last [`WINDOW`] ticks of each worker's
/// counters, and the last tick's of each pool and listener.
#[derive(Debug, Default)]
struct Sampler {
    workers: HashMap<(String, String), VecDeque<Counters>>,
    outcomes: HashMap<String, [u64; 8]>,
    accepted: HashMap<String, u64>,
    last: Option<Instant>,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Sampler {
    /// One snapshot, and each pool's affinity point for the history.
    fn sample(
        &mut self,
        shared: &Admin,
        viewers: usize,
        now: Instant,
    ) -> (serde_json::Value, Vec<(String, serde_json::Value)>) {
        let elapsed = self.last.map_or(1.0, |l| now.saturating_duration_since(l).as_secs_f64().max(0.001));
        self.last = Some(now);
        let t = unix_ms();
        let fleet = shared.fleet.pools();
        let routing = shared.front.routing.load();
        let mut seen = std::collections::HashSet::new();
        let mut pools = Vec::new();
        let mut affinity = Vec::new();
        for pool in fleet.iter() {
            let (json, point) = self.pool(pool, routing.http_pool(&pool.name), elapsed, t, now, &mut seen);
            affinity.push((pool.name.clone(), point));
            pools.push(json);
        }
        self.workers.retain(|k, _| seen.contains(k));
        self.outcomes.retain(|k, _| fleet.iter().any(|p| &p.name == k));
        let mut listeners: Vec<serde_json::Value> = shared
            .server
            .listeners
            .iter()
            .map(|l| self.listener(&l.name, l.listen, l.tls, false, &l.metrics, Some(l.limit), elapsed))
            .collect();
        listeners.push(self.listener("admin", shared.listen, false, true, &shared.metrics, None, elapsed));
        let snapshot = serde_json::json!({
            "version": 1,
            "time": t,
            "interval_ms": 1000,
            "gateway": {
                "version": env!("CARGO_PKG_VERSION"),
                "uptime_s": now.saturating_duration_since(shared.epoch).as_secs(),
                "ready": shared.ready(),
                "viewers": viewers,
            },
            "listeners": listeners,
            "pools": pools,
        });
        (snapshot, affinity)
    }

    #[allow(clippy::too_many_arguments)]
    fn listener(
        &mut self,
        name: &str,
        address: std::net::SocketAddr,
        tls: bool,
        admin: bool,
        m: &ListenerMetrics,
        limit: Option<usize>,
        elapsed: f64,
    ) -> serde_json::Value {
        let accepted = m.accepted.load(Relaxed);
        let before = self.accepted.insert(name.to_owned(), accepted).unwrap_or(accepted);
        serde_json::json!({
            "name": name,
            "address": address.to_string(),
            "tls": tls,
            "admin": admin,
            "open": m.open.load(Relaxed),
            "limit": limit,
            "accepted": accepted,
            "accepts_per_s": round2(accepted.saturating_sub(before) as f64 / elapsed),
            "limited": m.limited.load(Relaxed),
            "tls_errors": m.tls_errors.load(Relaxed),
            "h2_connections": m.h2_connections.load(Relaxed),
            "upgrades": m.upgrades.load(Relaxed),
            "header_timeouts": m.header_timeouts.load(Relaxed),
            "send_timeouts": m.send_timeouts.load(Relaxed),
            "log_written": m.log_written.load(Relaxed),
            "log_dropped": m.log_dropped.load(Relaxed),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn pool(
        &mut self,
        pool: &Pool,
        http: Option<&keyroute_gateway::routing::HttpPool>,
        elapsed: f64,
        t: u64,
        now: Instant,
        seen: &mut std::collections::HashSet<(String, String)>,
    ) -> (serde_json::Value, serde_json::Value) {
        let snap = pool.snapshot();
        let workers = snap.workers();
        // Each worker's share of the recently seen keys, by their owner now.
        let sample = pool.recent_keys();
        let mut owned = vec![0u64; workers.len()];
        for h in &sample {
            if let Some(i) = snap.policy().owner(*h) {
                owned[i] += 1;
            }
        }
        let mut rows = Vec::with_capacity(workers.len());
        let mut window_totals = Vec::with_capacity(workers.len());
        for (i, w) in workers.iter().enumerate() {
            let m = &w.metrics;
            let buckets: [u64; 15] = std::array::from_fn(|b| m.latency_buckets[b].load(Relaxed));
            let now_counters = Counters {
                total: m.total(),
                errors: m.responses[4].load(Relaxed) + m.responses[5].load(Relaxed),
                buckets,
            };
            let key = (pool.name.clone(), w.name.clone());
            let window = self.workers.entry(key.clone()).or_default();
            // A worker replaced under its name starts its counters again.
            if window.back().is_some_and(|b| b.total > now_counters.total) {
                window.clear();
            }
            window.push_back(now_counters);
            while window.len() > WINDOW + 1 {
                window.pop_front();
            }
            seen.insert(key);
            let oldest = window.front().copied().unwrap_or(now_counters);
            let previous = window.len().checked_sub(2).and_then(|j| window.get(j)).copied().unwrap_or(now_counters);
            let total = now_counters.total - oldest.total;
            let errors = now_counters.errors.saturating_sub(oldest.errors);
            let delta: [u64; 15] = std::array::from_fn(|b| now_counters.buckets[b].saturating_sub(oldest.buckets[b]));
            window_totals.push(total);
            let state = snap.state(i, now);
            let warm_up = snap.warm_progress(i, now);
            let state_name = if state == State::Healthy && warm_up < 1.0 { "warming" } else { state.name() };
            rows.push(serde_json::json!({
                "name": w.name,
                "address": w.address.to_string(),
                "zone": w.zone,
                "weight": snap.weight(i),
                "state": state_name,
                "warm_up": round2(warm_up),
                "in_flight": w.in_flight(),
                "rps": round2((now_counters.total - previous.total) as f64 / elapsed),
                "error_rate": if total == 0 { 0.0 } else { round4(errors as f64 / total as f64) },
                "p99_ms": p99_ms(&delta),
                "requests": now_counters.total,
                "errors": now_counters.errors,
                "ejections": m.ejections.load(Relaxed),
                "retries": m.retries.load(Relaxed),
                "key_share": if sample.is_empty() { 0.0 } else { round4(owned[i] as f64 / sample.len() as f64) },
                "request_share": 0.0,
            }));
        }
        let all: u64 = window_totals.iter().sum();
        if all > 0 {
            for (row, n) in rows.iter_mut().zip(&window_totals) {
                row["request_share"] = round4(*n as f64 / all as f64).into();
            }
        }
        let weighted: Vec<usize> = (0..workers.len()).filter(|&i| snap.weight(i) > 0).collect();
        let max_over_mean = |v: &dyn Fn(usize) -> u64| -> Option<f64> {
            let sum: u64 = weighted.iter().map(|&i| v(i)).sum();
            let max = weighted.iter().map(|&i| v(i)).max()?;
            (sum > 0).then(|| round2(max as f64 * weighted.len() as f64 / sum as f64))
        };
        // This second's placements, by outcome, and the 503s for want of a worker.
        let m = &pool.metrics;
        let counts: [u64; 8] = std::array::from_fn(|k| match k {
            7 => m.no_worker.load(Relaxed),
            k => m.outcomes[k].load(Relaxed),
        });
        let before = self.outcomes.insert(pool.name.clone(), counts).unwrap_or(counts);
        let per_second = |k: usize| (counts[k].saturating_sub(before[k]) as f64 / elapsed).round() as u64;
        let mut point = serde_json::Map::new();
        let mut total = serde_json::Map::new();
        point.insert("t".into(), t.into());
        for (k, name) in OUTCOMES.iter().chain(std::iter::once(&"no_worker")).enumerate() {
            point.insert((*name).into(), per_second(k).into());
            total.insert((*name).into(), counts[k].into());
        }
        let point = serde_json::Value::Object(point);
        let source = match snap.config().membership {
            keyroute_fleet::config::MembershipConfig::Static => serde_json::json!({ "kind": "static" }),
            ref m @ (keyroute_fleet::config::MembershipConfig::Etcd(_)
            | keyroute_fleet::config::MembershipConfig::Dns(_)) => {
                let kind = if matches!(m, keyroute_fleet::config::MembershipConfig::Dns(_)) { "dns" } else { "etcd" };
                let s = &pool.source;
                let now_ms = now.saturating_duration_since(pool.epoch()).as_millis() as u64;
                let current = s.current_at_ms.load(Relaxed);
                serde_json::json!({
                    "kind": kind,
                    "up": s.up.load(Relaxed) == 1,
                    "revision": s.revision.load(Relaxed),
                    "age_s": (current > 0).then(|| round2(now_ms.saturating_sub(current) as f64 / 1000.0)),
                    "rejected": s.rejected.load(Relaxed),
                    "lost": s.lost.load(Relaxed),
                })
            }
        };
        let json = serde_json::json!({
            "name": pool.name,
            "strategy": snap.policy().strategy().name(),
            "key": http.map(|h| h.http.key.as_str()),
            "generation": snap.generation(),
            "source": source,
            "workers": rows,
            "affinity": point,
            "affinity_total": total,
            "balance": {
                "sampled_keys": sample.len(),
                "keys_max_over_mean": max_over_mean(&|i| owned[i]),
                "requests_max_over_mean": max_over_mean(&|i| window_totals[i]),
            },
            "hot_keys": super::hot_keys(pool, http),
            "changes": pool.changes(),
            "remapped_keys": m.remapped_keys.load(Relaxed),
        });
        (json, point)
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The 99th percentile of a latency histogram (non-cumulative counts over
/// [`LATENCY_BUCKETS`] and an overflow bucket), in milliseconds, interpolated within its bucket;
/// the last bound for the overflow bucket; `None` without any count.
fn p99_ms(buckets: &[u64; 15]) -> Option<f64> {
    let n: u64 = buckets.iter().sum();
    if n == 0 {
        return None;
    }
    let rank = (n as f64 * 0.99).ceil().max(1.0);
    let mut below = 0u64;
    for (b, &count) in buckets.iter().enumerate() {
        if count > 0 && (below + count) as f64 >= rank {
            let Some(&hi) = LATENCY_BUCKETS.get(b) else { return Some(LATENCY_BUCKETS[13] * 1000.0) };
            let lo = if b == 0 { 0.0 } else { LATENCY_BUCKETS[b - 1] };
            let within = (rank - below as f64) / count as f64;
            return Some(round2((lo + (hi - lo) * within) * 1000.0));
        }
        below += count;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_interpolates_within_its_bucket() {
        let mut b = [0u64; 15];
        assert_eq!(p99_ms(&b), None);
        // 100 requests under 0.5 ms: the 99th is 0.495 ms, given to a hundredth.
        b[0] = 100;
        assert_eq!(p99_ms(&b), Some(0.5));
        // 1,000 between 5 and 10 ms, 9 between 10 and 25 ms, one over 10 s: the 99th of 1,010
        // is the 1,000th (ceil 999.9), the last of the 5-10 ms bucket: 10 ms.
        let mut c = [0u64; 15];
        c[4] = 1000;
        c[5] = 9;
        c[14] = 1;
        assert_eq!(p99_ms(&c), Some(10.0));
        // 98 fast, 2 between 10 and 25 ms: the 99th is halfway into that bucket.
        b[0] = 98;
        b[5] = 2;
        assert_eq!(p99_ms(&b), Some(17.5));
        // Past the last bound.
        b[5] = 0;
        b[14] = 2;
        assert_eq!(p99_ms(&b), Some(10_000.0));
    }

    #[test]
    fn nonces_differ() {
        let (a, b) = (nonce().expect("random"), nonce().expect("random"));
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }
}

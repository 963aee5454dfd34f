//! One worker as the gateway sees it: identity, routing state, load and counters; shared by every
//! snapshot that lists it, so its health, ejection and in-flight count survive membership changes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{PoolConfig, WorkerConfig};
use crate::health::{Ejector, HealthMachine, Transition};
use crate::metrics::WorkerMetrics;

/// A worker's state for routing, as reported by the admin API and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Taking traffic.
    Healthy,
    /// Failing its active health checks.
    Unhealthy,
    /// Ejected after consecutive failures, until its ejection ends.
    Ejected,
    /// Leaving: takes no new requests, finishes those it holds.
    Draining,
    /// Its address is this gateway's own: a request to it would come back here. It keeps its
    /// place in the table (so every gateway's placement is the same) and is never sent to.
    Loop,
    /// Holding requests that wait for response headers, and answering none of them for the
    /// pool's stall window: hung, or as good as hung. Back to healthy at its next response.
    Stalled,
}

impl State {
    /// The state's name, as in metrics and the admin API.
    pub(crate) fn name(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Unhealthy => "unhealthy",
            State::Ejected => "ejected",
            State::Draining => "draining",
            State::Stalled => "stalled",
            State::Loop => "loop",
        }
    }
}

const HEALTHY: u8 = 0;
const UNHEALTHY: u8 = 1;
const DRAINING: u8 = 3;
/// See [`State::Loop`]; set once, at creation, and never left (health checks compare-and-swap
/// between healthy and unhealthy only).
const LOOP: u8 = 4;

/// One worker: its identity, and its state by concern (health, progress, warm-up, load),
/// shared by every snapshot that lists it.
///
/// Its weight is not here: a weight is part of the member set, so it lives in the snapshot's
/// node set (one owner per fact), and a weight change is a new snapshot.
#[derive(Debug)]
pub(crate) struct WorkerState {
    /// The worker's name: its identity for placement.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its zone.
    pub zone: Option<String>,
    /// Its numeric id (the `haproxy` placement's server id).
    pub id: Option<u32>,
    /// Pooled keep-alive connections to this worker.
    pub upstream: crate::upstream::Upstream,
    /// Requests in flight (sent and not yet answered to the end of the body).
    in_flight: AtomicU64,
    health: Health,
    progress: Progress,
    warmup: Warmup,
    /// What the millisecond clocks above count from.
    epoch: Instant,
    /// Counters.
    pub metrics: WorkerMetrics,
}

/// Whether the worker may be sent to: the one owner of healthy, unhealthy, draining and loop,
/// and of the ejection, with the machines that move them.
#[derive(Debug)]
struct Health {
    /// `HEALTHY`, `UNHEALTHY`, `DRAINING` or `LOOP` (ejection is separate, by time).
    state: AtomicU8,
    /// Milliseconds since the epoch until which the worker is ejected; 0 if never ejected.
    ejected_until_ms: AtomicU64,
    /// The active checks' streak and the passive ejection's.
    machines: Mutex<(HealthMachine, Ejector)>,
}

/// Whether the worker is answering: the stall window's clock, and cut-short responses.
#[derive(Debug, Default)]
struct Progress {
    /// Tries waiting for this worker's response headers.
    awaiting: AtomicU64,
    /// Milliseconds since the epoch of the worker's last sign of life: response headers, or the
    /// moment a try started waiting on an idle worker.
    at_ms: AtomicU64,
    /// Set by a response cut short, cleared by a complete one (to log a change once).
    truncating: AtomicBool,
}

/// The worker's own cache, as its `X-Cache` reports tell: since it started warming up (slow
/// start by hit rate) and over its life.
#[derive(Debug, Default)]
struct Warmup {
    /// Milliseconds since the epoch, plus 1, at which the worker started warming up (it joined,
    /// or recovered); 0 if it never did.
    since_ms: AtomicU64,
    /// (hits, reports) since the warm-up started.
    hits: AtomicU64,
    reports: AtomicU64,
    /// (hits, reports) over the worker's life.
    life_hits: AtomicU64,
    life_reports: AtomicU64,
}

impl WorkerState {
    /// A new worker, healthy.
    pub(crate) fn new(config: &WorkerConfig, pool: &PoolConfig, epoch: Instant) -> Self {
        WorkerState {
            name: config.name.clone(),
            address: config.address,
            zone: config.zone.clone(),
            id: config.id,
            upstream: crate::upstream::Upstream::new(config.address, pool.connect_timeout),
            in_flight: AtomicU64::new(0),
            health: Health {
                state: AtomicU8::new(HEALTHY),
                ejected_until_ms: AtomicU64::new(0),
                machines: Mutex::new(machines(pool)),
            },
            progress: Progress::default(),
            warmup: Warmup::default(),
            epoch,
            metrics: WorkerMetrics::default(),
        }
    }

    /// Requests in flight (sent and not yet answered to the end of the body).
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The routing state at `now`, with no stall window (see [`WorkerState::state_with`]).
    pub(crate) fn state(&self) -> State {
        self.state_with(Instant::now(), Duration::ZERO)
    }

    /// The routing state at `now`; `stall` is the pool's stall window (zero: never stalled).
    pub(crate) fn state_with(&self, now: Instant, stall: Duration) -> State {
        let ejected_until = self.health.ejected_until_ms.load(Relaxed);
        match self.health.state.load(Relaxed) {
            DRAINING => State::Draining,
            UNHEALTHY => State::Unhealthy,
            LOOP => State::Loop,
            // Read the clock only for a worker that has been ejected at some point.
            _ if ejected_until != 0 && ejected_until > self.ms(now) => State::Ejected,
            _ if self.stalled(now, stall) => State::Stalled,
            _ => State::Healthy,
        }
    }

    /// Whether the worker holds tries waiting for headers and has answered none for `stall`
    /// (zero disables).
    pub(crate) fn stalled(&self, now: Instant, stall: Duration) -> bool {
        !stall.is_zero()
            && self.progress.awaiting.load(Relaxed) > 0
            && self.ms(now).saturating_sub(self.progress.at_ms.load(Relaxed)) > stall.as_millis() as u64
    }

    /// When the worker will count as stalled if nothing arrives from it meanwhile (1 ms past the
    /// window, as [`WorkerState::stalled`] needs more than the window).
    pub(crate) fn stall_deadline(&self, stall: Duration) -> Instant {
        self.epoch + Duration::from_millis(self.progress.at_ms.load(Relaxed)) + stall + Duration::from_millis(1)
    }

    /// Counts a try waiting for headers until the returned guard drops.
    pub(crate) fn await_headers(self: &Arc<Self>, now: Instant) -> Awaiting {
        if self.progress.awaiting.fetch_add(1, Relaxed) == 0 {
            // An idle worker's stall clock starts with its first waiting try.
            self.progress.at_ms.store(self.ms(now), Relaxed);
        }
        Awaiting(Arc::clone(self))
    }

    /// The worker sent response headers: a sign of life.
    pub(crate) fn headers_arrived(&self, now: Instant) {
        self.progress.at_ms.store(self.ms(now), Relaxed);
    }

    /// Notes a response cut short; true if the previous complete response was not (the first of
    /// a run, worth a log line).
    pub(crate) fn note_truncation(&self) -> bool {
        !self.progress.truncating.swap(true, Relaxed)
    }

    /// Feeds an active probe result; returns the transition.
    pub(crate) fn observe_probe(&self, ok: bool) -> Transition {
        let mut m = self.health.machines.lock();
        let healthy = self.health.state.load(Relaxed) != UNHEALTHY;
        let t = m.0.observe(healthy, ok);
        let state = &self.health.state;
        match t {
            Transition::Down => {
                let _ = state.compare_exchange(HEALTHY, UNHEALTHY, Relaxed, Relaxed);
            }
            Transition::Up => {
                let _ = state.compare_exchange(UNHEALTHY, HEALTHY, Relaxed, Relaxed);
            }
            Transition::None => {}
        }
        t
    }

    /// Feeds a failure at `now` (a connect error, a timeout, a stall, a 5xx, a body cut short);
    /// returns the ejection length if it ejects the worker. Failures of requests that were in
    /// flight while the worker is ejected are ignored, and `may_eject = false` (the pool's
    /// ejection cap is reached) keeps counting without ejecting. Successes go to
    /// [`WorkerState::observe_success`].
    pub(crate) fn observe_failure(&self, may_eject: bool, now: Instant) -> Option<Duration> {
        if self.state_with(now, Duration::ZERO) == State::Ejected {
            return None;
        }
        let ejection = self.health.machines.lock().1.observe(false)?;
        if !may_eject {
            return None;
        }
        self.health.ejected_until_ms.store(self.ms(now).saturating_add(ejection.as_millis() as u64), Relaxed);
        self.metrics.ejections.fetch_add(1, Relaxed);
        Some(ejection)
    }

    /// A complete response that is not a 5xx: the failure streak starts over (no clock needed).
    pub(crate) fn observe_success(&self) {
        if self.progress.truncating.load(Relaxed) {
            self.progress.truncating.store(false, Relaxed);
        }
        self.health.machines.lock().1.observe(true);
    }

    /// Applies a reloaded pool's health, ejection and connect settings, keeping the current state
    /// (the streaks start over).
    pub(crate) fn retune(&self, pool: &PoolConfig) {
        *self.health.machines.lock() = machines(pool);
        self.upstream.set_connect_timeout(pool.connect_timeout);
    }

    /// Starts the worker's warm-up at `now` (it joined, or recovered): slow start ramps its share
    /// from here, and its hit rate counts from here.
    pub(crate) fn start_warming(&self, now: Instant) {
        self.warmup.hits.store(0, Relaxed);
        self.warmup.reports.store(0, Relaxed);
        self.warmup.since_ms.store(self.ms(now) + 1, Relaxed);
    }

    /// How long ago the worker started warming up, if it ever did.
    pub(crate) fn warming_for(&self, now: Instant) -> Option<Duration> {
        match self.warmup.since_ms.load(Relaxed) {
            0 => None,
            since => Some(Duration::from_millis(self.ms(now).saturating_sub(since - 1))),
        }
    }

    /// Notes the worker's own cache result for a response (its `X-Cache: HIT` or `MISS`).
    pub(crate) fn note_cache(&self, hit: bool) {
        let w = &self.warmup;
        w.life_reports.fetch_add(1, Relaxed);
        w.reports.fetch_add(1, Relaxed);
        if hit {
            w.life_hits.fetch_add(1, Relaxed);
            w.hits.fetch_add(1, Relaxed);
        }
    }

    /// `X-Cache` (hits, reports) since the warm-up started.
    pub(crate) fn warm_reports(&self) -> (u64, u64) {
        (self.warmup.hits.load(Relaxed), self.warmup.reports.load(Relaxed))
    }

    /// `X-Cache` (hits, reports) over the worker's life.
    pub(crate) fn cache_reports(&self) -> (u64, u64) {
        (self.warmup.life_hits.load(Relaxed), self.warmup.life_reports.load(Relaxed))
    }

    /// Marks the worker as draining (irreversible for this worker object).
    pub(crate) fn drain(&self) {
        self.health.state.store(DRAINING, Relaxed);
    }

    /// Marks a worker whose address is this gateway's own ([`State::Loop`]).
    pub(crate) fn mark_loop(&self) {
        self.health.state.store(LOOP, Relaxed);
    }
}

/// A pool's active-check and ejection machines, with no streak.
fn machines(pool: &PoolConfig) -> (HealthMachine, Ejector) {
    let p = &pool.passive;
    (
        HealthMachine::new(pool.health.rise, pool.health.fall),
        Ejector::new(p.consecutive_failures, p.base_ejection, p.max_ejection),
    )
}

/// A try waiting for a worker's response headers; see [`WorkerState::await_headers`].
#[derive(Debug)]
pub(crate) struct Awaiting(Arc<WorkerState>);

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0.progress.awaiting.fetch_sub(1, Relaxed);
    }
}

/// Counts a request in flight on a worker until dropped: held by the response body, so it is
/// released when the body ends (or the client goes away), not when the headers arrive.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<WorkerState>);

impl InFlight {
    /// Starts counting.
    pub(crate) fn new(worker: Arc<WorkerState>) -> Self {
        worker.in_flight.fetch_add(1, Relaxed);
        InFlight(worker)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn worker(pool_extra: &str) -> (Arc<WorkerState>, PoolConfig) {
        let text = format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\n[[pool]]\nname = \"p\"\n{pool_extra}\n[[pool.worker]]\nname = \"w\"\naddress = \"127.0.0.1:9\"\n"
        );
        let config = Config::parse(&text, "t.toml").expect("valid");
        let pool = config.pools[0].clone();
        (Arc::new(WorkerState::new(&pool.workers[0], &pool, Instant::now())), pool)
    }

    #[tokio::test(start_paused = true)]
    async fn ejection_lasts_its_cooldown_and_doubles_on_the_clock() {
        let (w, _) =
            worker("[pool.passive]\nconsecutive_failures = 2\nbase_ejection_ms = 1000\nmax_ejection_ms = 5000");
        let now = Instant::now();
        assert_eq!(w.observe_failure(true, now), None);
        assert_eq!(w.observe_failure(true, now), Some(Duration::from_secs(1)));
        assert_eq!(w.state_with(now, Duration::ZERO), State::Ejected);
        // Outcomes of requests still in flight while ejected are ignored.
        assert_eq!(w.observe_failure(true, now), None);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(w.state_with(Instant::now(), Duration::ZERO), State::Ejected);
        tokio::time::advance(Duration::from_millis(2)).await;
        let now = Instant::now();
        assert_eq!(w.state_with(now, Duration::ZERO), State::Healthy);
        w.observe_failure(true, now);
        assert_eq!(w.observe_failure(true, now), Some(Duration::from_secs(2)), "the second ejection in a row doubles");
        // The pool's cap: counted, not ejected.
        tokio::time::advance(Duration::from_secs(3)).await;
        let now = Instant::now();
        w.observe_failure(false, now);
        assert_eq!(w.observe_failure(false, now), None);
        assert_eq!(w.state_with(now, Duration::ZERO), State::Healthy);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_stalls_when_it_answers_nothing_for_the_window() {
        let (w, pool) = worker("");
        let stall = pool.passive.stall;
        assert_eq!(stall, Duration::from_secs(2), "the default window");
        assert!(!w.stalled(Instant::now(), stall), "idle is not stalled");
        let first = w.await_headers(Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        let second = w.await_headers(Instant::now());
        tokio::time::advance(Duration::from_millis(600)).await;
        // 2.1 s since the worker went from idle to waiting, with no response since.
        assert!(w.stalled(Instant::now(), stall));
        assert_eq!(w.state_with(Instant::now(), stall), State::Stalled);
        assert!(!w.stalled(Instant::now(), Duration::ZERO), "a zero window disables it");
        w.headers_arrived(Instant::now());
        assert!(!w.stalled(Instant::now(), stall), "a response is a sign of life");
        drop((first, second));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!w.stalled(Instant::now(), stall), "nothing waiting, nothing stalled");
    }
}

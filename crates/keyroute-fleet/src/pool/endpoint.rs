//! One worker as a pool sees it: identity, routing state, load and counters; shared by every
//! snapshot that lists it, so its health, ejection and in-flight count survive membership changes.
//! Nothing here is a protocol's: a protocol keeps what it needs per worker (the HTTP gateway's
//! connection pool) in the worker's protocol slot ([`WorkerState::protocol_or`]).

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
pub enum State {
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
    pub fn name(self) -> &'static str {
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
pub struct WorkerState {
    /// The worker's name: its identity for placement.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its zone.
    pub zone: Option<String>,
    /// Its numeric id (the `haproxy` placement's server id).
    pub id: Option<u32>,
    /// The state of the protocol that serves this worker (see [`WorkerState::protocol_or`]).
    protocol: std::sync::OnceLock<Box<dyn std::any::Any + Send + Sync>>,
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

impl std::fmt::Debug for WorkerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerState")
            .field("name", &self.name)
            .field("address", &self.address)
            .field("state", &self.state())
            .field("in_flight", &self.in_flight())
            .finish_non_exhaustive()
    }
}

impl WorkerState {
    /// A new worker, healthy.
    pub fn new(config: &WorkerConfig, pool: &PoolConfig, epoch: Instant) -> Self {
        WorkerState {
            name: config.name.clone(),
            address: config.address,
            zone: config.zone.clone(),
            id: config.id,
            protocol: std::sync::OnceLock::new(),
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
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// The routing state at `now`, with no stall window (see [`WorkerState::state_with`]).
    pub fn state(&self) -> State {
        self.state_with(Instant::now(), Duration::ZERO)
    }

    /// The routing state at `now`; `stall` is the pool's stall window (zero: never stalled).
    pub fn state_with(&self, now: Instant, stall: Duration) -> State {
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
    pub fn stalled(&self, now: Instant, stall: Duration) -> bool {
        !stall.is_zero()
            && self.progress.awaiting.load(Relaxed) > 0
            && self.ms(now).saturating_sub(self.progress.at_ms.load(Relaxed)) > stall.as_millis() as u64
    }

    /// When the worker will count as stalled if nothing arrives from it meanwhile (1 ms past the
    /// window, as [`WorkerState::stalled`] needs more than the window).
    pub fn stall_deadline(&self, stall: Duration) -> Instant {
        self.epoch + Duration::from_millis(self.progress.at_ms.load(Relaxed)) + stall + Duration::from_millis(1)
    }

    /// What the protocol that serves this worker keeps for it (the HTTP gateway: its pooled
    /// connections), made by `init` on first use. One protocol serves a worker: `None` when the
    /// slot holds another type.
    pub fn protocol_or<T: std::any::Any + Send + Sync>(&self, init: impl FnOnce(&WorkerState) -> T) -> Option<&T> {
        self.protocol.get_or_init(|| Box::new(init(self))).downcast_ref()
    }

    /// Counts a try waiting for the worker's answer (an HTTP response's headers, a cache server's
    /// reply) until the returned guard drops.
    pub fn awaiting(self: &Arc<Self>, now: Instant) -> Awaiting {
        if self.progress.awaiting.fetch_add(1, Relaxed) == 0 {
            // An idle worker's stall clock starts with its first waiting try.
            self.progress.at_ms.store(self.ms(now), Relaxed);
        }
        Awaiting(Arc::clone(self))
    }

    /// The worker answered: a sign of life.
    pub fn answered(&self, now: Instant) {
        self.progress.at_ms.store(self.ms(now), Relaxed);
    }

    /// Notes a response cut short; true if the previous complete response was not (the first of
    /// a run, worth a log line).
    pub fn note_truncation(&self) -> bool {
        !self.progress.truncating.swap(true, Relaxed)
    }

    /// Feeds an active probe result; returns the transition.
    pub fn observe_probe(&self, ok: bool) -> Transition {
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
    pub fn observe_failure(&self, may_eject: bool, now: Instant) -> Option<Duration> {
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
    pub fn observe_success(&self) {
        if self.progress.truncating.load(Relaxed) {
            self.progress.truncating.store(false, Relaxed);
        }
        self.health.machines.lock().1.observe(true);
    }

    /// Applies a reloaded pool's health and ejection settings, keeping the current state (the
    /// streaks start over).
    pub fn retune(&self, pool: &PoolConfig) {
        *self.health.machines.lock() = machines(pool);
    }

    /// Starts the worker's warm-up at `now` (it joined, or recovered): slow start ramps its share
    /// from here, and its hit rate counts from here.
    pub fn start_warming(&self, now: Instant) {
        self.warmup.hits.store(0, Relaxed);
        self.warmup.reports.store(0, Relaxed);
        self.warmup.since_ms.store(self.ms(now) + 1, Relaxed);
    }

    /// How long ago the worker started warming up, if it ever did.
    pub fn warming_for(&self, now: Instant) -> Option<Duration> {
        match self.warmup.since_ms.load(Relaxed) {
            0 => None,
            since => Some(Duration::from_millis(self.ms(now).saturating_sub(since - 1))),
        }
    }

    /// Notes the worker's own cache result for an answer (an HTTP worker's `X-Cache: HIT` or
    /// `MISS`): slow start by hit rate reads it.
    pub fn note_cache(&self, hit: bool) {
        let w = &self.warmup;
        w.life_reports.fetch_add(1, Relaxed);
        w.reports.fetch_add(1, Relaxed);
        if hit {
            w.life_hits.fetch_add(1, Relaxed);
            w.hits.fetch_add(1, Relaxed);
        }
    }

    /// `X-Cache` (hits, reports) since the warm-up started.
    pub fn warm_reports(&self) -> (u64, u64) {
        (self.warmup.hits.load(Relaxed), self.warmup.reports.load(Relaxed))
    }

    /// `X-Cache` (hits, reports) over the worker's life.
    pub fn cache_reports(&self) -> (u64, u64) {
        (self.warmup.life_hits.load(Relaxed), self.warmup.life_reports.load(Relaxed))
    }

    /// Marks the worker as draining (irreversible for this worker object).
    pub fn drain(&self) {
        self.health.state.store(DRAINING, Relaxed);
    }

    /// Marks a worker whose address is this gateway's own ([`State::Loop`]).
    pub fn mark_loop(&self) {
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

/// A try waiting for a worker's answer; see [`WorkerState::awaiting`].
#[derive(Debug)]
pub struct Awaiting(Arc<WorkerState>);

impl Drop for Awaiting {
    fn drop(&mut self) {
        self.0.progress.awaiting.fetch_sub(1, Relaxed);
    }
}

/// Counts a request in flight on a worker until dropped: held by the response body, so it is
/// released when the body ends (or the client goes away), not when the headers arrive.
#[derive(Debug)]
pub struct InFlight(Arc<WorkerState>);

impl InFlight {
    /// Starts counting.
    pub fn new(worker: Arc<WorkerState>) -> Self {
        worker.in_flight.fetch_add(1, Relaxed);
        InFlight(worker)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

/// Requests in flight on workers, counted one by one as they are sent and released together
/// when dropped: a cache proxy's batch, whose answers are all read before it ends. One atomic
/// add per request and one subtraction per worker, where an [`InFlight`] per request would take
/// two each and a reference count.
#[derive(Debug, Default)]
pub struct InFlightBatch {
    counts: Vec<(Arc<WorkerState>, u64)>,
}

impl InFlightBatch {
    /// Counts one more request in flight on `worker`.
    pub fn add(&mut self, worker: &Arc<WorkerState>) {
        worker.in_flight.fetch_add(1, Relaxed);
        match self.counts.iter_mut().find(|(w, _)| Arc::ptr_eq(w, worker)) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((Arc::clone(worker), 1)),
        }
    }

    /// Releases every request counted (they were answered, or will never be).
    pub fn release(&mut self) {
        for (w, n) in self.counts.drain(..) {
            w.in_flight.fetch_sub(n, Relaxed);
        }
    }
}

impl Drop for InFlightBatch {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PassiveConfig, WorkerConfig};

    fn worker(passive: PassiveConfig) -> (Arc<WorkerState>, PoolConfig) {
        let w = WorkerConfig { name: "w".into(), address: ([127, 0, 0, 1], 9).into(), weight: 1, zone: None, id: None };
        let mut pool = PoolConfig::new("p", keyroute::Strategy::Rendezvous, vec![w]);
        pool.passive = passive;
        (Arc::new(WorkerState::new(&pool.workers[0], &pool, Instant::now())), pool)
    }

    /// The protocol slot holds one protocol's state, made once.
    #[test]
    fn the_protocol_slot_is_made_once_and_typed() {
        let (w, _) = worker(PassiveConfig::default());
        let made = std::sync::atomic::AtomicU32::new(0);
        for _ in 0..3 {
            let got = w.protocol_or(|w| {
                made.fetch_add(1, Relaxed);
                w.address.port()
            });
            assert_eq!(got, Some(&9));
        }
        assert_eq!(made.load(Relaxed), 1);
        assert_eq!(w.protocol_or(|_| "another type"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn ejection_lasts_its_cooldown_and_doubles_on_the_clock() {
        let (w, _) = worker(PassiveConfig {
            consecutive_failures: 2,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(5),
            ..PassiveConfig::default()
        });
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
        let (w, pool) = worker(PassiveConfig::default());
        let stall = pool.passive.stall;
        assert_eq!(stall, Duration::from_secs(2), "the default window");
        assert!(!w.stalled(Instant::now(), stall), "idle is not stalled");
        let first = w.awaiting(Instant::now());
        tokio::time::advance(Duration::from_millis(1500)).await;
        let second = w.awaiting(Instant::now());
        tokio::time::advance(Duration::from_millis(600)).await;
        // 2.1 s since the worker went from idle to waiting, with no response since.
        assert!(w.stalled(Instant::now(), stall));
        assert_eq!(w.state_with(Instant::now(), stall), State::Stalled);
        assert!(!w.stalled(Instant::now(), Duration::ZERO), "a zero window disables it");
        w.answered(Instant::now());
        assert!(!w.stalled(Instant::now(), stall), "a response is a sign of life");
        drop((first, second));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!w.stalled(Instant::now(), stall), "nothing waiting, nothing stalled");
    }
}

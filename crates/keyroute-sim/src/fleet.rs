//! The fleet model: the first source document's thumbnail service, as a discrete-event simulation.
//!
//! # The model
//!
//! - **Requests** arrive open-loop (a Poisson process at `rate` per second, so a slow fleet does not
//!   slow the arrivals down), each for one of `keys` thumbnails chosen by a Zipf(`zipf`) law, each at
//!   one of `gateways` gateways chosen uniformly.
//! - **Gateways** decide with [`keyroute::Policy`], exactly as the real gateway does, each with its
//!   own random stream and round-robin counter. The load they see is requests in flight per worker
//!   (queued or in service). With `refresh_ms = 0` that view is exact; otherwise each gateway sees a
//!   snapshot of the fleet's counts taken every `refresh_ms` (plus, with `count_own`, the requests it
//!   sent itself since): the stale view of several gateways that the document warns about.
//! - **Workers** serve `concurrency` requests at a time, first come first served, the rest queued.
//!   Each has an LRU cache of `cache_entries` thumbnails: a hit costs `hit_ms`, a miss `miss_ms` (the
//!   resize), each times a uniform jitter in `[1 - jitter, 1 + jitter]` and the worker's slowdown; a
//!   miss caches the thumbnail when it completes.
//! - **Timed events** at a fraction of the run: add a worker, remove one, make one `k` times slower,
//!   or make one new key take a share of all traffic (a hot image).
//!
//! Everything is a function of the configuration and `seed`: two runs print the same numbers.
//! Time is integer nanoseconds; there is no clock and no thread.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::VecDeque;

use std::collections::HashMap;
use std::time::Duration;

use keyroute::hash::{RandomSource, SplitMix64};
use keyroute::hot::{HotKeyConfig, HotKeyDetector, HotKeys, HotSet, Threshold};
use keyroute::steer::Steering;
use keyroute::warm::{Handoff, Ramp, admitted};
use keyroute::{Decision, Node, NodeSet, Options, Policy, Strategy};
use serde::Serialize;

use crate::hist::{Histogram, LatencySummary};
use crate::{Lru, SimError, Zipf};

/// A timed change to the fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Change {
    /// A new worker joins (named `w{N+1}`).
    AddWorker,
    /// The last worker leaves gracefully (finishes what it holds, gets nothing new).
    RemoveWorker,
    /// Worker `worker` (0-based) becomes `factor` times slower.
    SlowWorker {
        /// Which worker.
        worker: usize,
        /// The slowdown.
        factor: f64,
    },
    /// A new key (a viral image) arrives on top of the existing traffic and takes `share` of all
    /// requests from now on: the arrival rate grows by `1 / (1 - share)`.
    HotKey {
        /// Its share of traffic, in (0, 1).
        share: f64,
    },
    /// The members become exactly these (by name and weight), and with `strategy`, the gateways
    /// switch to it: what `sim whatif` asks. Workers that stay keep their caches; new names join
    /// cold; the others leave gracefully.
    SetMembers {
        /// The members after the change, in order.
        members: Vec<(String, u32)>,
        /// The strategy after the change, if it changes.
        #[serde(skip)]
        strategy: Option<Strategy>,
    },
    /// A flash crowd: a new key's share of all requests rises from 0 to `share` over `rise_s`
    /// seconds, stays there for `hold_s`, and falls back to 0 over `rise_s`.
    FlashCrowd {
        /// Its peak share of traffic, in (0, 1).
        share: f64,
        /// Seconds to rise (and to fall).
        rise_s: f64,
        /// Seconds at the peak.
        hold_s: f64,
    },
}

/// Hot-key replication ([`keyroute::hot`]) as each simulated gateway runs it: its own detector
/// and rule, measuring only the requests it receives.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimHotKeys {
    /// A key is hot at this share of the gateway's requests.
    pub threshold_share: f64,
    /// The rate one replica should stay under (requests per second at one gateway).
    pub per_replica: f64,
    /// The most replicas.
    pub max_replicas: usize,
    /// Hold time, ms.
    pub hold_ms: f64,
    /// Measurement window, ms.
    pub window_ms: f64,
    /// One request in this many is sampled.
    pub sample_every: u32,
    /// Detector counters.
    pub counters: usize,
}

/// Warm-up of a worker that joins ([`keyroute::warm`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum SimWarmup {
    /// Previous-owner handoff over this many ms.
    Handoff {
        /// The window, ms.
        window_ms: f64,
    },
    /// Slow start over this many ms from `min_share`, slowed by the newcomer's hit rate.
    SlowStart {
        /// The window, ms.
        window_ms: f64,
        /// The share at the start.
        min_share: f64,
    },
}

/// A change and when it happens, as a fraction of the run's requests (0.5 = halfway).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimedChange {
    /// When, in `[0, 1]` of the requests.
    pub at: f64,
    /// What.
    pub change: Change,
}

/// Everything a fleet run depends on. See the [module documentation](self).
#[derive(Clone, Debug, Serialize)]
pub struct FleetConfig {
    /// The scenario's name (for reports).
    pub scenario: String,
    /// The routing strategy.
    #[serde(serialize_with = "ser_strategy")]
    pub strategy: Strategy,
    /// Its options (vnodes, epsilon, ...).
    #[serde(skip)]
    pub options: Options,
    /// Workers at the start.
    pub workers: usize,
    /// Gateways.
    pub gateways: usize,
    /// How often each gateway's view of the loads is refreshed; 0 = always exact.
    pub refresh_ms: f64,
    /// Whether a gateway adds its own sends since the last refresh to its view.
    pub count_own: bool,
    /// Requests a worker serves at once.
    pub concurrency: u32,
    /// Service time of a cache hit.
    pub hit_ms: f64,
    /// Service time of a cache miss (the resize).
    pub miss_ms: f64,
    /// Service times are multiplied by a uniform factor in `[1 - jitter, 1 + jitter]`.
    pub jitter: f64,
    /// Thumbnails each worker's cache holds.
    pub cache_entries: usize,
    /// Distinct thumbnails.
    pub keys: usize,
    /// Zipf exponent of key popularity.
    pub zipf: f64,
    /// Arrivals per second.
    pub rate: f64,
    /// Requests to simulate.
    pub requests: u64,
    /// The seed of every random choice.
    pub seed: u64,
    /// Timed changes.
    pub changes: Vec<TimedChange>,
    /// Hot-key replication at each gateway, if on.
    pub hot_keys: Option<SimHotKeys>,
    /// The gateways' response cache for hot keys (with request coalescing): how long a response
    /// stays fresh, ms; `None`: no cache.
    pub gateway_cache_ttl_ms: Option<f64>,
    /// Warm-up of workers that join, if on.
    pub warmup: Option<SimWarmup>,
    /// The workers at the start by name and weight (`None`: `w1`..`wN` of weight 1); `workers`
    /// is their number.
    pub members: Option<Vec<(String, u32)>>,
    /// A request log to replay instead of synthetic arrivals: its times and keys, and its
    /// service times when it has them ([`crate::trace`]). `keys` and `requests` are then the
    /// log's, and `rate` its mean.
    #[serde(skip)]
    pub trace: Option<std::sync::Arc<crate::trace::Trace>>,
}

impl FleetConfig {
    /// The run's label: the strategy, and `+replicas`, `+cache`, `+handoff` or `+slow-start` for
    /// the hot-key and warm-up features it runs with.
    pub fn label(&self) -> String {
        let mut l = self.strategy.name().to_owned();
        if self.hot_keys.is_some() {
            l.push_str("+replicas");
        }
        if self.gateway_cache_ttl_ms.is_some() {
            l.push_str("+cache");
        }
        match self.warmup {
            Some(SimWarmup::Handoff { .. }) => l.push_str("+handoff"),
            Some(SimWarmup::SlowStart { .. }) => l.push_str("+slow-start"),
            None => {}
        }
        l
    }
}

fn ser_strategy<S: serde::Serializer>(s: &Strategy, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.name())
}

impl FleetConfig {
    /// Checks every parameter's range.
    ///
    /// # Errors
    ///
    /// [`SimError::Invalid`] naming the parameter.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |what: &str| Err(SimError::Invalid(what.to_owned()));
        let pos = |x: f64| x.is_finite() && x > 0.0;
        if self.workers == 0 || self.workers > 10_000 {
            return bad("workers must be in 1..=10000");
        }
        if self.gateways == 0 || self.gateways > 1000 {
            return bad("gateways must be in 1..=1000");
        }
        if !(self.refresh_ms.is_finite() && self.refresh_ms >= 0.0) {
            return bad("refresh-ms must be >= 0");
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1");
        }
        if !pos(self.hit_ms) || !pos(self.miss_ms) {
            return bad("hit-ms and miss-ms must be > 0");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return bad("jitter must be in [0, 1)");
        }
        if self.cache_entries > 100_000_000 {
            return bad("cache-entries must be at most 100000000");
        }
        if self.keys == 0 || self.keys > 50_000_000 {
            return bad("keys must be in 1..=50000000");
        }
        if !(self.zipf.is_finite() && self.zipf >= 0.0) {
            return bad("zipf must be >= 0");
        }
        if !pos(self.rate) {
            return bad("rate must be > 0");
        }
        if self.requests == 0 {
            return bad("requests must be at least 1");
        }
        for c in &self.changes {
            if !(0.0..=1.0).contains(&c.at) {
                return bad("a change's time must be in [0, 1]");
            }
            match c.change {
                Change::SlowWorker { worker, factor }
                    if worker >= self.workers || !(factor.is_finite() && factor >= 1.0) =>
                {
                    return bad("slow-worker needs an existing worker and a factor >= 1");
                }
                Change::HotKey { share } if !(share > 0.0 && share < 1.0) => {
                    return bad("hot-key share must be in (0, 1)");
                }
                Change::FlashCrowd { share, rise_s, hold_s }
                    if !(share > 0.0
                        && share < 1.0
                        && rise_s > 0.0
                        && rise_s.is_finite()
                        && hold_s >= 0.0
                        && hold_s.is_finite()) =>
                {
                    return bad("flash-crowd needs a share in (0, 1), rise > 0 s and hold >= 0 s");
                }
                Change::SetMembers { ref members, .. } => {
                    let mut names = std::collections::HashSet::new();
                    if members.iter().all(|(_, w)| *w == 0)
                        || !members.iter().all(|(n, _)| names.insert(n.as_str()))
                        || members.len() > 10_000
                        || members.iter().any(|(n, _)| n.is_empty())
                    {
                        return bad("a member change needs at most 10000 distinct names and a member with weight");
                    }
                }
                _ => {}
            }
        }
        if let Some(h) = &self.hot_keys {
            if !(h.threshold_share > 0.0 && h.threshold_share <= 1.0 && pos(h.per_replica)) || h.max_replicas == 0 {
                return bad("hot keys need a threshold share in (0, 1], per-replica > 0 and max-replicas >= 1");
            }
            if !(pos(h.window_ms) && h.hold_ms >= 0.0) || h.sample_every == 0 || h.counters == 0 {
                return bad("hot keys need window > 0, hold >= 0, sample_every >= 1 and counters >= 1");
            }
        }
        if self.gateway_cache_ttl_ms.is_some_and(|t| !pos(t)) {
            return bad("gateway-cache ttl must be > 0 ms");
        }
        if self.gateway_cache_ttl_ms.is_some() && self.hot_keys.is_none() {
            return bad("the gateway cache holds hot keys only: it needs hot keys on");
        }
        match self.warmup {
            Some(SimWarmup::Handoff { window_ms }) | Some(SimWarmup::SlowStart { window_ms, .. })
                if !pos(window_ms) =>
            {
                return bad("a warm-up window must be > 0 ms");
            }
            Some(SimWarmup::SlowStart { min_share, .. }) if !(0.0..=1.0).contains(&min_share) => {
                return bad("slow-start min share must be in [0, 1]");
            }
            _ => {}
        }
        if (self.hot_keys.is_some() || self.warmup.is_some()) && !self.strategy.uses_key() {
            return bad("hot keys and warm-up need a strategy that places by key");
        }
        if let Some(m) = &self.members {
            if m.len() != self.workers {
                return bad("members and workers disagree");
            }
            if m.iter().all(|(_, w)| *w == 0) {
                return bad("every member has weight 0");
            }
        }
        if let Some(t) = &self.trace
            && (t.len() as u64 != self.requests || t.catalogue.len() != self.keys)
        {
            return bad("a trace's requests and keys are the run's");
        }
        Ok(())
    }
}

/// One worker's figures.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    /// Its name.
    pub name: String,
    /// Requests it served.
    pub requests: u64,
    /// Its share of all requests.
    pub share: f64,
    /// Cache hit rate of its requests.
    pub hit_rate: f64,
    /// Busy time over capacity while it was a member.
    pub utilisation: f64,
    /// The longest its queue got (requests waiting, not in service).
    pub max_queue: u64,
    /// The most requests it held at once (queued and in service).
    pub max_in_flight: u64,
    /// Requests for the hot key it served.
    pub hot_requests: u64,
    /// Requests it held on average while a member (queued and in service; Little's law).
    pub mean_in_flight: f64,
}

/// A membership change and the keys it remapped.
#[derive(Clone, Debug, Serialize)]
pub struct RemapEvent {
    /// Simulated time, seconds.
    pub at_s: f64,
    /// What changed.
    pub change: String,
    /// Keys (of all `keys`) whose owner changed; `None` for strategies that do not place by key.
    /// Above [`REMAP_SAMPLE`] keys, estimated from an even sample of that many.
    pub keys_moved: Option<u64>,
    /// `keys_moved / keys`.
    pub moved_share: Option<f64>,
}

/// Per-worker requests in flight over time, for charts.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Series {
    /// Sample times, seconds.
    pub times_s: Vec<f64>,
    /// `in_flight[w][i]`: worker `w` at sample `i`.
    pub in_flight: Vec<Vec<u32>>,
    /// The worker cache hit rate of the requests served since the previous sample (`None` when
    /// none were).
    pub hit_rate: Vec<Option<f64>>,
}

/// The outcome of a fleet run.
#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    /// The configuration.
    pub config: FleetConfig,
    /// Requests that got a response.
    pub completed: u64,
    /// Requests no worker could take.
    pub errors: u64,
    /// Simulated seconds from the first arrival to the last completion.
    pub duration_s: f64,
    /// Completed requests per simulated second.
    pub throughput: f64,
    /// Worker cache hits over the requests workers served (a gateway cache's answers are not
    /// in it: see `gateway_cache_hits`).
    pub hit_rate: f64,
    /// Latency (arrival to completion).
    pub latency: LatencySummary,
    /// The busiest worker's utilisation.
    pub max_utilisation: f64,
    /// Mean utilisation.
    pub mean_utilisation: f64,
    /// The busiest worker's requests over the mean.
    pub max_over_mean_requests: f64,
    /// The busiest worker's mean in-flight requests over the fleet's mean: the load bounded loads
    /// caps at `1 + e`.
    pub max_over_mean_load: f64,
    /// The most requests any worker held at once.
    pub max_in_flight: u64,
    /// The longest queue of any worker.
    pub max_queue: u64,
    /// For strategies that place by key: requests served by the key's owner.
    pub owner_share: Option<f64>,
    /// Requests for the hot key, and how many workers served at least 1% of them.
    pub hot_key_requests: u64,
    /// Workers that served at least 1% of the hot key's requests.
    pub hot_key_workers: usize,
    /// The most keys hot at once at any gateway (with hot keys on).
    pub hot_keys_max: usize,
    /// The most replicas any hot key had.
    pub replicas_max: usize,
    /// Requests answered by a gateway's cache (coalesced waits included), and their share.
    pub gateway_cache_hits: u64,
    /// Worker cache hit rate of the requests that arrived in the minute after the first membership
    /// change (`None` without one).
    pub hit_rate_after_change: Option<f64>,
    /// The same over the 10 s after it.
    pub hit_rate_10s_after_change: Option<f64>,
    /// Membership changes.
    pub remaps: Vec<RemapEvent>,
    /// Per worker.
    pub workers: Vec<WorkerReport>,
    /// Load over time.
    pub series: Series,
    /// Latency CDF points `(ms, fraction)`.
    pub latency_cdf: Vec<(f64, f64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival,
    Completion { worker: u32, request: u32 },
    Refresh { gateway: u32 },
    Sample,
}

#[derive(Clone, Copy, Debug)]
struct Request {
    key: u32,
    gateway: u32,
    arrived: u64,
    /// It leads its gateway's cache flight for its key.
    leads: bool,
    /// Its worker had it cached (set when service starts).
    hit: bool,
    /// Its miss service time from the trace, ms (0: the model's).
    service_ms: f32,
}

struct Worker {
    name: String,
    weight: u32,
    cache: Lru,
    queue: VecDeque<u32>,
    busy: u32,
    in_flight: u64,
    slowdown: f64,
    member: bool,
    joined: u64,
    left: Option<u64>,
    busy_ns: u128,
    requests: u64,
    hits: u64,
    max_queue: u64,
    max_in_flight: u64,
    hot: u64,
    held_ns: u128,
    hits_at_join: u64,
    requests_at_join: u64,
}

struct Gateway {
    rng: SplitMix64,
    snapshot: Vec<u64>,
    own_since: Vec<i64>,
    hot: Option<(HotKeyDetector, HotKeys, HotSet, u64)>,
    /// Cached hot keys: fresh until (ns).
    cached: HashMap<u32, u64>,
    /// Keys with a miss in flight: the arrival times of the requests waiting for it.
    flights: HashMap<u32, Vec<u64>>,
}

/// Keys examined for the keys moved by a membership change: all of them up to this many, else an
/// even sample of this many.
pub const REMAP_SAMPLE: usize = 1_000_000;

/// Runs the simulation. `progress` is called now and then with the number of requests that arrived.
///
/// # Errors
///
/// An invalid configuration, or a policy that cannot be built.
pub fn run(config: &FleetConfig, progress: &mut dyn FnMut(u64)) -> Result<FleetReport, SimError> {
    config.validate()?;
    let mut sim = Sim::new(config)?;
    while let Some(Reverse((t, _, event))) = sim.events.heap.pop() {
        sim.now = t;
        match event {
            Event::Arrival => {
                sim.apply_due_changes()?;
                sim.arrived += 1;
                if sim.arrived.is_multiple_of(65_536) {
                    progress(sim.arrived);
                }
                sim.arrive();
                if sim.arrived < config.requests {
                    let at = sim.next_arrival();
                    sim.events.push(at, Event::Arrival);
                }
            }
            Event::Completion { worker, request } => sim.complete(worker, request),
            Event::Refresh { gateway } => sim.refresh(gateway),
            Event::Sample => sim.sample(),
        }
    }
    Ok(sim.report())
}

/// Owners by key, for strategies whose decision is the owner: not computed yet.
const UNKNOWN: u32 = u32::MAX;
/// Owners by key: the pool has no owner for it.
const NO_OWNER: u32 = u32::MAX - 1;

/// The event queue: by time, then by the order events were pushed (so a run is deterministic).
struct Events {
    heap: Heap,
    seq: u64,
}

impl Events {
    fn push(&mut self, t: u64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, e)));
    }
}

/// Worker cache hits of the requests that arrived after the first membership change.
#[derive(Default)]
struct AfterChange {
    /// When it happened (ns).
    at: Option<u64>,
    /// (hits, all) in the minute after it, and in the 10 s after it.
    minute: (u64, u64),
    ten_s: (u64, u64),
}

/// One run's state: the fleet (workers, members, tables, gateways), the traffic (the arrival
/// process, timed changes), the event queue, and the counters the report is made from. `run` is
/// its event loop; each event is one method.
struct Sim<'a> {
    config: &'a FleetConfig,
    trace: Option<&'a crate::trace::Trace>,
    rng: SplitMix64,
    zipf: Zipf,
    /// An extra key, hot only after a `HotKey` change.
    hot_key: u32,
    workers: Vec<Worker>,
    /// Members in node order: node index -> worker id.
    members: Vec<usize>,
    /// One table per gateway (forks of one: the same member set, counters of their own).
    policies: Vec<Policy>,
    /// Every key's hash as the tables compute it, the hot key last.
    hashes: Vec<u64>,
    gateways: Vec<Gateway>,
    /// Warm-up after the last join: the handoff table (for handoff), the newcomer's node index
    /// and when it joined.
    warm: Option<(Option<Handoff>, usize, u64)>,
    /// Owners by key, for strategies whose decision is the owner (pure hash, and in the simulator
    /// every worker is eligible): filled as keys are requested, cleared when the members change.
    owners: Vec<u32>,
    after: AfterChange,
    hot_keys_max: usize,
    replicas_max: usize,
    gateway_cache_hits: u64,
    window_ns: u64,
    ttl_ns: Option<u64>,
    mean_gap: f64,
    sample_every: u64,
    refresh: u64,
    events: Events,
    changes: Vec<TimedChange>,
    next_change: usize,
    hot_share: f64,
    /// A flash crowd: (start ns, peak share, rise ns, hold ns).
    flash: Option<(u64, f64, u64, u64)>,
    requests: Vec<Request>,
    free: Vec<u32>,
    arrived: u64,
    completed: u64,
    errors: u64,
    owner_hits: u64,
    keyed: u64,
    hot_total: u64,
    latency: Histogram,
    remaps: Vec<RemapEvent>,
    series: Series,
    /// Worker cache hits and requests served at the last sample of the series.
    sampled_served: (u64, u64),
    now: u64,
    last_completion: u64,
}

fn ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

fn key_bytes(k: u32) -> String {
    format!("thumb/{k}.jpg")
}

/// The node set of `members` (worker ids), with their names and weights.
fn node_set(members: &[usize], workers: &[Worker]) -> Result<NodeSet, SimError> {
    NodeSet::try_new(
        members
            .iter()
            .map(|&w| Node::try_new(&workers[w].name).map(|n| n.with_weight(workers[w].weight)))
            .collect::<Result<Vec<_>, _>>()?,
    )
    .map_err(SimError::from)
}

impl<'a> Sim<'a> {
    fn new(config: &'a FleetConfig) -> Result<Sim<'a>, SimError> {
        let trace = config.trace.as_deref();
        // A trace brings its own keys: no popularity law to sample.
        let zipf = if trace.is_none() { Zipf::new(config.keys, config.zipf) } else { Zipf::new(1, 0.0) };
        let mut sim = Sim {
            config,
            trace,
            rng: SplitMix64::new(config.seed),
            zipf,
            hot_key: config.keys as u32,
            workers: Vec::new(),
            members: (0..config.workers).collect(),
            policies: Vec::new(),
            hashes: Vec::new(),
            gateways: Vec::new(),
            warm: None,
            owners: Vec::new(),
            after: AfterChange::default(),
            hot_keys_max: 0,
            replicas_max: 0,
            gateway_cache_hits: 0,
            window_ns: config.hot_keys.map_or(u64::MAX, |h| ns(h.window_ms).max(1)),
            ttl_ns: config.gateway_cache_ttl_ms.map(ns),
            mean_gap: 1e9 / config.rate,
            sample_every: 0,
            refresh: ns(config.refresh_ms),
            events: Events { heap: BinaryHeap::new(), seq: 0 },
            changes: config.changes.clone(),
            next_change: 0,
            hot_share: 0.0,
            flash: None,
            requests: Vec::new(),
            free: Vec::new(),
            arrived: 0,
            completed: 0,
            errors: 0,
            owner_hits: 0,
            keyed: 0,
            hot_total: 0,
            latency: Histogram::default(),
            remaps: Vec::new(),
            series: Series::default(),
            sampled_served: (0, 0),
            now: 0,
            last_completion: 0,
        };
        sim.workers = (0..config.workers).map(|i| sim.new_worker(i, 0)).collect();
        // One table for all gateways (they see one member set); each has its own counters.
        let base = Policy::build(config.strategy, node_set(&sim.members, &sim.workers)?, &config.options)?;
        sim.policies = (0..config.gateways).map(|_| base.fork()).collect();
        drop(base);
        sim.hashes = sim.hash_all(&sim.policies[0]);
        sim.gateways = (0..config.gateways).map(|g| Gateway::new(config, g)).collect::<Result<_, _>>()?;
        sim.owners = if sim.memo(&sim.policies[0]) { vec![UNKNOWN; config.keys + 1] } else { Vec::new() };
        let expected_end = (config.requests as f64 * sim.mean_gap) as u64;
        sim.sample_every = (expected_end / 400).max(1);
        sim.changes.sort_by(|a, b| a.at.total_cmp(&b.at));
        sim.events.push(0, Event::Arrival);
        sim.events.push(0, Event::Sample);
        if sim.refresh > 0 {
            for g in 0..config.gateways {
                let at = sim.refresh * g as u64 / config.gateways as u64;
                sim.events.push(at, Event::Refresh { gateway: g as u32 });
            }
        }
        Ok(sim)
    }

    /// Worker `i`'s name: the configured member's, or for a newcomer `w{N+1}` (`new-{N+1}` if the
    /// members have that name already).
    fn name(&self, i: usize) -> String {
        match &self.config.members {
            Some(m) if i < m.len() => m[i].0.clone(),
            Some(m) if m.iter().any(|(n, _)| *n == format!("w{}", i + 1)) => format!("new-{}", i + 1),
            _ => format!("w{}", i + 1),
        }
    }

    fn new_worker(&self, i: usize, now: u64) -> Worker {
        Worker {
            name: self.name(i),
            weight: self.config.members.as_ref().and_then(|m| m.get(i)).map_or(1, |(_, w)| *w),
            cache: Lru::new(self.config.cache_entries),
            queue: VecDeque::new(),
            busy: 0,
            in_flight: 0,
            slowdown: 1.0,
            member: true,
            joined: now,
            left: None,
            busy_ns: 0,
            requests: 0,
            hits: 0,
            max_queue: 0,
            max_in_flight: 0,
            hot: 0,
            held_ns: 0,
            hits_at_join: 0,
            requests_at_join: 0,
        }
    }

    /// Whether a table's decisions are its owners, memoised per key.
    fn memo(&self, p: &Policy) -> bool {
        p.strategy().is_pure_hash() && self.config.warmup.is_none()
    }

    /// Every key's hash as a policy's table computes it (strategies differ: slots and the
    /// compatibility modes hash keys their own way), the hot key last.
    fn hash_all(&self, p: &Policy) -> Vec<u64> {
        let hot = std::iter::once(p.key_hash(key_bytes(self.hot_key).as_bytes()));
        match self.trace {
            Some(t) => t.catalogue.iter().map(|k| p.key_hash(k)).chain(hot).collect(),
            None => (0..=self.config.keys as u32).map(|k| p.key_hash(key_bytes(k).as_bytes())).collect(),
        }
    }

    /// The next arrival after `arrived` requests: the trace's time, or a Poisson gap (shorter by
    /// the hot key's share, whose requests come on top).
    fn next_arrival(&mut self) -> u64 {
        match self.trace {
            Some(t) => t.times_ns.get(self.arrived as usize).copied().unwrap_or(self.now).max(self.now),
            None => self.now + ((-self.rng.unit_open().ln() * self.mean_gap * (1.0 - self.hot_share)) as u64).max(1),
        }
    }

    /// The timed changes due at this point of the run.
    fn apply_due_changes(&mut self) -> Result<(), SimError> {
        while self.next_change < self.changes.len()
            && self.arrived as f64 >= self.changes[self.next_change].at * self.config.requests as f64
        {
            let change = self.changes[self.next_change].change.clone();
            self.next_change += 1;
            match change {
                Change::SlowWorker { worker, factor } => {
                    if let Some(w) = self.workers.get_mut(worker) {
                        w.slowdown = factor;
                    }
                }
                Change::HotKey { share } => self.hot_share = share,
                Change::FlashCrowd { share, rise_s, hold_s } => {
                    self.flash = Some((self.now, share, ns(rise_s * 1e3).max(1), ns(hold_s * 1e3)));
                }
                Change::AddWorker | Change::RemoveWorker | Change::SetMembers { .. } => self.change_members(&change)?,
            }
        }
        Ok(())
    }

    /// A membership change: the members after it, the tables over them, the keys it moves, and
    /// the newcomer's warm-up.
    fn change_members(&mut self, change: &Change) -> Result<(), SimError> {
        let now = self.now;
        let (next_members, newcomer, next_strategy, label) = self.next_members(change);
        for g in &mut self.gateways {
            g.snapshot.resize(self.workers.len(), 0);
            g.own_since.resize(self.workers.len(), 0);
        }
        let set = node_set(&next_members, &self.workers)?;
        let current = self.policies[0].strategy();
        let base = if next_strategy == current {
            self.policies[0].rebuild(set)?
        } else {
            Policy::build(next_strategy, set, &self.config.options)?
        };
        let next: Vec<Policy> = (0..self.config.gateways).map(|_| base.fork()).collect();
        // Every key up to a million; beyond, every `step`-th key, scaled (an estimate within
        // about 0.1 point of the share).
        let keys = self.config.keys;
        let step = keys.div_ceil(REMAP_SAMPLE).max(1);
        let keyed = current.uses_key() && next_strategy.uses_key();
        // A new strategy may hash keys another way.
        let next_hashes = (next_strategy != current).then(|| self.hash_all(&next[0]));
        let moved = keyed.then(|| {
            let after_hashes = next_hashes.as_ref().unwrap_or(&self.hashes);
            let sampled = (0..keys)
                .step_by(step)
                .filter(|&k| {
                    let before = self.policies[0].owner(self.hashes[k]).map(|i| self.members[i]);
                    let after = next[0].owner(after_hashes[k]).map(|i| next_members[i]);
                    before != after
                })
                .count() as u64;
            (sampled * step as u64).min(keys as u64)
        });
        if let Some(h) = next_hashes {
            self.hashes = h;
        }
        self.remaps.push(RemapEvent {
            at_s: now as f64 / 1e9,
            change: label,
            keys_moved: moved,
            moved_share: moved.map(|m| m as f64 / keys as f64),
        });
        self.after.at.get_or_insert(now);
        self.warm = None;
        if let (Some(idx), Some(w)) = (newcomer, self.config.warmup) {
            let handoff = match w {
                SimWarmup::Handoff { .. } => Handoff::new(&next[0], &[idx])?,
                SimWarmup::SlowStart { .. } => None,
            };
            self.warm = Some((handoff, idx, now));
        }
        self.owners = if self.memo(&next[0]) { vec![UNKNOWN; keys + 1] } else { Vec::new() };
        self.policies = next;
        self.members = next_members;
        Ok(())
    }

    /// The members after a change (worker ids in node order), the newcomer's node index (for
    /// warm-up), the strategy after it, and what to call the change. Workers that join are added,
    /// those that leave marked so.
    fn next_members(&mut self, change: &Change) -> (Vec<usize>, Option<usize>, Strategy, String) {
        let now = self.now;
        let mut next_members = self.members.clone();
        let mut newcomer = None;
        let mut next_strategy = self.policies[0].strategy();
        let label = match change {
            Change::AddWorker => {
                let id = self.workers.len();
                let mut w = self.new_worker(id, now);
                if self.workers.iter().any(|x| x.name == w.name) {
                    w.name = format!("new-{}", id + 1);
                }
                self.workers.push(w);
                next_members.push(id);
                newcomer = Some(next_members.len() - 1);
                format!("add {}", self.workers[id].name)
            }
            Change::RemoveWorker => match next_members.len() > 1 {
                true => {
                    let gone = next_members.pop().unwrap_or_default();
                    self.workers[gone].member = false;
                    self.workers[gone].left = Some(now);
                    format!("remove {}", self.workers[gone].name)
                }
                false => "remove - (the last worker stays)".to_owned(),
            },
            Change::SetMembers { members: to, strategy } => {
                next_members.clear();
                let mut reweighted = Vec::new();
                for (name, weight) in to {
                    let id = match self.workers.iter().position(|w| w.name == *name) {
                        Some(id) => id,
                        None => {
                            let id = self.workers.len();
                            let mut w = self.new_worker(id, now);
                            w.name.clone_from(name);
                            self.workers.push(w);
                            // The first newcomer warms up (warm-up follows one).
                            newcomer = newcomer.or(Some(next_members.len()));
                            id
                        }
                    };
                    let w = &mut self.workers[id];
                    if w.member && w.weight != *weight {
                        reweighted.push(format!("{name}={weight}"));
                    }
                    w.weight = *weight;
                    if !w.member {
                        // A worker that comes back: its span restarts now.
                        w.member = true;
                        w.left = None;
                        w.joined = now;
                        w.busy_ns = 0;
                        w.held_ns = 0;
                    }
                    next_members.push(id);
                }
                for &m in &self.members {
                    if !next_members.contains(&m) {
                        self.workers[m].member = false;
                        self.workers[m].left = Some(now);
                    }
                }
                if let Some(s) = strategy {
                    next_strategy = *s;
                }
                describe_members(&self.members, &next_members, &self.workers, reweighted, *strategy)
            }
            _ => String::new(),
        };
        (next_members, newcomer, next_strategy, label)
    }

    /// The hot key's share now, on a flash crowd's curve (up, hold, down).
    fn flash_share(&mut self) {
        let Some((start, peak, rise, hold)) = self.flash else { return };
        let t = self.now.saturating_sub(start);
        self.hot_share = if t < rise {
            peak * t as f64 / rise as f64
        } else if t < rise + hold {
            peak
        } else if t < 2 * rise + hold {
            peak * (2 * rise + hold - t) as f64 / rise as f64
        } else {
            0.0
        };
    }

    /// One request arrives (the `arrived`-th): its key and gateway, the gateway's hot keys and
    /// cache, its decision, and its worker (served now, or queued).
    fn arrive(&mut self) {
        self.flash_share();
        let index = (self.arrived - 1) as usize;
        let key = if self.hot_share > 0.0 && self.rng.unit_open() < self.hot_share {
            self.hot_key
        } else {
            match self.trace {
                Some(t) => t.keys[index],
                None => self.zipf.sample(&mut self.rng) as u32,
            }
        };
        let service_ms = self.trace.and_then(|t| t.service_ms.as_ref()).map_or(0.0, |s| s[index]);
        let gateway = self.rng.below(self.config.gateways as u64) as usize;
        let hash = self.hashes[key as usize];
        let replicas = self.hot_keys(gateway, hash);
        let mut leads = false;
        if replicas > 0
            && let Some(ttl) = self.ttl_ns
        {
            let (now, g) = (self.now, &mut self.gateways[gateway]);
            if g.cached.get(&key).is_some_and(|&until| until > now) {
                self.gateway_cache_hits += 1;
                self.completed += 1;
                self.latency.record(1);
                return;
            }
            if let Some(waiting) = g.flights.get_mut(&key) {
                waiting.push(now);
                return;
            }
            g.flights.insert(key, Vec::new());
            leads = ttl > 0;
        }
        match self.decide(gateway, key, hash, replicas) {
            None => {
                self.errors += 1;
                if leads {
                    // The waiting requests fail with their leader.
                    self.errors += self.gateways[gateway].flights.remove(&key).map_or(0, |w| w.len() as u64);
                }
            }
            Some(d) => {
                if d.owner.is_some() {
                    self.keyed += 1;
                    self.owner_hits += u64::from(d.owner == Some(d.node));
                }
                let w = self.members[d.node];
                self.gateways[gateway].own_since[w] += 1;
                let req = Request { key, gateway: gateway as u32, arrived: self.now, leads, hit: false, service_ms };
                let id = match self.free.pop() {
                    Some(id) => {
                        self.requests[id as usize] = req;
                        id
                    }
                    None => {
                        self.requests.push(req);
                        (self.requests.len() - 1) as u32
                    }
                };
                let worker = &mut self.workers[w];
                worker.in_flight += 1;
                worker.max_in_flight = worker.max_in_flight.max(worker.in_flight);
                if worker.busy < self.config.concurrency {
                    start(
                        worker,
                        w as u32,
                        id,
                        &mut self.requests,
                        self.now,
                        self.config,
                        &mut self.rng,
                        &mut self.events,
                    );
                } else {
                    worker.queue.push_back(id);
                    worker.max_queue = worker.max_queue.max(worker.queue.len() as u64);
                }
            }
        }
    }

    /// Hot keys at `gateway`: it measures `hash`, ends its window when due; the key's replicas.
    fn hot_keys(&mut self, gateway: usize, hash: u64) -> usize {
        let now = self.now;
        let Some((det, rule, set, next_tick)) = &mut self.gateways[gateway].hot else { return 0 };
        det.observe(hash);
        if now >= *next_tick {
            if *next_tick > 0 {
                *set = rule.tick(Duration::from_nanos(now), &det.take_window());
                self.hot_keys_max = self.hot_keys_max.max(set.len());
                self.replicas_max = self.replicas_max.max(set.iter().map(|(_, r)| r).max().unwrap_or(0));
            } else {
                det.take_window();
                rule.start(Duration::from_nanos(now));
            }
            *next_tick = now + self.window_ns;
        }
        set.replicas(hash)
    }

    /// `gateway`'s decision for a key: the steering rule over its view of the loads, or, for a
    /// pure hash strategy with every worker eligible, the key's owner (a function of the member
    /// set, computed once per key and member set).
    fn decide(&mut self, gateway: usize, key: u32, hash: u64, replicas: usize) -> Option<Decision> {
        let (config, workers, members) = (self.config, &self.workers, &self.members);
        let Gateway { rng, snapshot, own_since, .. } = &mut self.gateways[gateway];
        let view = |node: usize| -> u64 {
            let w = members[node];
            if self.refresh == 0 {
                workers[w].in_flight
            } else if config.count_own {
                (snapshot[w] as i64 + own_since[w]).max(0) as u64
            } else {
                snapshot[w]
            }
        };
        let policy = &self.policies[gateway];
        if self.owners.is_empty() || replicas > 1 || self.warm.is_some() {
            return steer(policy, hash, replicas, &view, rng, self.warm.as_ref(), self.now, config, workers, members);
        }
        let o = &mut self.owners[key as usize];
        if *o == UNKNOWN {
            *o = policy.owner(hash).map_or(NO_OWNER, |n| n as u32);
        }
        (*o != NO_OWNER).then_some(Decision { node: *o as usize, owner: Some(*o as usize), spill: None })
    }

    /// A worker finishes a request: its cache keeps the key, the gateway's cache and the requests
    /// coalesced on it are answered, and its next queued request starts.
    fn complete(&mut self, worker: u32, request: u32) {
        let now = self.now;
        let r = self.requests[request as usize];
        let w = &mut self.workers[worker as usize];
        w.busy -= 1;
        w.in_flight -= 1;
        w.requests += 1;
        if r.key == self.hot_key {
            w.hot += 1;
            self.hot_total += 1;
        }
        if !w.cache.touch(r.key) {
            w.cache.insert(r.key);
        }
        self.gateways[r.gateway as usize].own_since[worker as usize] -= 1;
        self.latency.record(now - r.arrived);
        w.held_ns += u128::from(now - r.arrived);
        if let Some(t0) = self.after.at
            && r.arrived >= t0
        {
            let hit = u64::from(r.hit);
            if r.arrived < t0 + 60_000_000_000 {
                self.after.minute = (self.after.minute.0 + hit, self.after.minute.1 + 1);
            }
            if r.arrived < t0 + 10_000_000_000 {
                self.after.ten_s = (self.after.ten_s.0 + hit, self.after.ten_s.1 + 1);
            }
        }
        if r.leads {
            let g = &mut self.gateways[r.gateway as usize];
            if let Some(ttl) = self.ttl_ns {
                g.cached.insert(r.key, now + ttl);
            }
            for t in g.flights.remove(&r.key).unwrap_or_default() {
                self.latency.record(now - t);
                self.completed += 1;
                self.gateway_cache_hits += 1;
            }
        }
        self.completed += 1;
        self.last_completion = now;
        self.free.push(request);
        if let Some(next) = w.queue.pop_front() {
            start(w, worker, next, &mut self.requests, now, self.config, &mut self.rng, &mut self.events);
        }
    }

    /// Whether the run still has requests to come or to finish.
    fn running(&self) -> bool {
        self.arrived < self.config.requests || self.completed + self.errors < self.arrived
    }

    /// A gateway refreshes its view of the workers' loads.
    fn refresh(&mut self, gateway: u32) {
        let g = &mut self.gateways[gateway as usize];
        for (w, worker) in self.workers.iter().enumerate() {
            g.snapshot[w] = worker.in_flight;
            g.own_since[w] = 0;
        }
        if self.running() {
            self.events.push(self.now + self.refresh, Event::Refresh { gateway });
        }
    }

    /// A point of the load series.
    fn sample(&mut self) {
        self.series.times_s.push(self.now as f64 / 1e9);
        self.series.in_flight.resize(self.workers.len(), Vec::new());
        let samples = self.series.times_s.len();
        for (w, worker) in self.workers.iter().enumerate() {
            let s = &mut self.series.in_flight[w];
            s.resize(samples - 1, 0);
            s.push(worker.in_flight.min(u64::from(u32::MAX)) as u32);
        }
        let (hits, served) = self.workers.iter().fold((0, 0), |a, w| (a.0 + w.hits, a.1 + w.requests));
        let (h0, s0) = self.sampled_served;
        self.series.hit_rate.push((served > s0).then(|| hits.saturating_sub(h0) as f64 / (served - s0) as f64));
        self.sampled_served = (hits, served);
        if self.running() {
            self.events.push(self.now + self.sample_every, Event::Sample);
        }
    }

    fn report(self) -> FleetReport {
        let config = self.config;
        let hits_total: u64 = self.workers.iter().map(|w| w.hits).sum();
        let end = self.last_completion.max(self.now).max(1);
        // Requests a worker served: the completed ones less those a gateway's cache answered.
        let served = self.completed - self.gateway_cache_hits;
        let wr: Vec<WorkerReport> = self
            .workers
            .iter()
            .map(|w| {
                let span = w.left.unwrap_or(end).saturating_sub(w.joined).max(1) as f64;
                WorkerReport {
                    name: w.name.clone(),
                    requests: w.requests,
                    share: ratio(w.requests, served),
                    hit_rate: ratio(w.hits, w.requests),
                    utilisation: w.busy_ns as f64 / (span * f64::from(config.concurrency)),
                    max_queue: w.max_queue,
                    max_in_flight: w.max_in_flight,
                    hot_requests: w.hot,
                    mean_in_flight: w.held_ns as f64 / span,
                }
            })
            .collect();
        let active: Vec<&WorkerReport> = wr.iter().filter(|w| w.requests > 0).collect();
        let mean_req = served as f64 / active.len().max(1) as f64;
        let mean_load = active.iter().map(|w| w.mean_in_flight).sum::<f64>() / active.len().max(1) as f64;
        let hot_total = self.hot_total;
        let first_change = self.after.at;
        FleetReport {
            config: config.clone(),
            completed: self.completed,
            errors: self.errors,
            duration_s: end as f64 / 1e9,
            throughput: self.completed as f64 / (end as f64 / 1e9),
            hit_rate: ratio(hits_total, served),
            latency: self.latency.summary(),
            max_utilisation: wr.iter().map(|w| w.utilisation).fold(0.0, f64::max),
            mean_utilisation: wr.iter().map(|w| w.utilisation).sum::<f64>() / wr.len().max(1) as f64,
            max_over_mean_requests: active.iter().map(|w| w.requests as f64).fold(0.0, f64::max) / mean_req.max(1e-9),
            max_over_mean_load: active.iter().map(|w| w.mean_in_flight).fold(0.0, f64::max) / mean_load.max(1e-12),
            max_in_flight: wr.iter().map(|w| w.max_in_flight).max().unwrap_or(0),
            max_queue: wr.iter().map(|w| w.max_queue).max().unwrap_or(0),
            owner_share: (self.keyed > 0).then(|| ratio(self.owner_hits, self.keyed)),
            hot_key_requests: hot_total,
            hot_key_workers: wr.iter().filter(|w| hot_total > 0 && w.hot_requests * 100 >= hot_total).count(),
            hot_keys_max: self.hot_keys_max,
            replicas_max: self.replicas_max,
            gateway_cache_hits: self.gateway_cache_hits,
            hit_rate_after_change: first_change.map(|_| ratio(self.after.minute.0, self.after.minute.1)),
            hit_rate_10s_after_change: first_change.map(|_| ratio(self.after.ten_s.0, self.after.ten_s.1)),
            remaps: self.remaps,
            workers: wr,
            series: self.series,
            latency_cdf: self.latency.cdf_points(200),
        }
    }
}

impl Gateway {
    fn new(config: &FleetConfig, g: usize) -> Result<Gateway, SimError> {
        let hot = match config.hot_keys {
            Some(h) => {
                let rule = HotKeyConfig {
                    threshold: Threshold::Share(h.threshold_share),
                    per_replica: h.per_replica,
                    max_replicas: h.max_replicas,
                    hold: Duration::from_secs_f64(h.hold_ms / 1e3),
                    confidence: 2.0,
                };
                Some((
                    HotKeyDetector::try_new(h.counters, h.sample_every)?,
                    HotKeys::try_new(rule)?,
                    HotSet::default(),
                    0u64,
                ))
            }
            None => None,
        };
        Ok(Gateway {
            rng: SplitMix64::new(config.seed ^ (0x9e37 + g as u64).wrapping_mul(0x1000_0001)),
            snapshot: vec![0; config.workers],
            own_since: vec![0; config.workers],
            hot,
            cached: HashMap::new(),
            flights: HashMap::new(),
        })
    }
}

/// Runs every configuration, on up to `threads` threads at once (each run is one thread: a run is
/// sequential). The reports come back in the order of `configs`, and each is the one [`run`] gives
/// alone: runs share nothing, so the thread count changes the time taken and nothing else.
/// `progress` is called with the requests that arrived since its last call, from any thread.
///
/// # Errors
///
/// The first configuration (in order) that fails.
pub fn run_all(
    configs: &[FleetConfig],
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Vec<FleetReport>, SimError> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<FleetReport, SimError>>>> =
        Mutex::new((0..configs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, configs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = configs.get(i) else { return };
                    let mut last = 0;
                    let r = run(c, &mut |n| {
                        progress(n - last);
                        last = n;
                    });
                    progress(c.requests.saturating_sub(last));
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(SimError::Invalid("a run did not finish".into()))))
        .collect()
}

/// The node set of members given by name and weight, in their order.
///
/// # Errors
///
/// Empty or duplicate names.
pub fn member_set(members: &[(String, u32)]) -> Result<NodeSet, SimError> {
    let nodes =
        members.iter().map(|(n, w)| Node::try_new(n).map(|n| n.with_weight(*w))).collect::<Result<Vec<_>, _>>()?;
    Ok(NodeSet::try_new(nodes)?)
}

/// What the strategy's decision costs per request at the configuration's size, measured now on
/// this machine (nanoseconds, the median of 5 rounds of 20,000 decisions over idle workers): the
/// price of a choice of strategy, next to what it does. Not part of the deterministic report.
///
/// # Errors
///
/// The policy cannot be built.
pub fn placement_cost_ns(config: &FleetConfig) -> Result<f64, SimError> {
    let default: Vec<(String, u32)>;
    let members = match &config.members {
        Some(m) => m,
        None => {
            default = (1..=config.workers).map(|i| (format!("w{i}"), 1)).collect();
            &default
        }
    };
    let nodes = member_set(members)?;
    let policy = Policy::build(config.strategy, nodes, &config.options)?;
    let loads = vec![0u64; config.workers];
    let mut rng = SplitMix64::new(config.seed);
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            let mut sum = 0usize;
            for _ in 0..20_000 {
                let h = rng.next_u64();
                sum += policy.decide(Some(h), &loads[..], |_| true, &mut rng).map_or(0, |d| d.node);
            }
            std::hint::black_box(sum);
            t.elapsed().as_nanos() as f64 / 20_000.0
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    Ok(rounds[2])
}

type Heap = BinaryHeap<Reverse<(u64, u64, Event)>>;

#[allow(clippy::too_many_arguments)]
fn start(
    w: &mut Worker,
    worker: u32,
    request: u32,
    requests: &mut [Request],
    now: u64,
    config: &FleetConfig,
    rng: &mut SplitMix64,
    events: &mut Events,
) {
    let key = requests[request as usize].key;
    let hit = w.cache.touch(key);
    requests[request as usize].hit = hit;
    w.hits += u64::from(hit);
    let traced = f64::from(requests[request as usize].service_ms);
    let base = if hit {
        config.hit_ms
    } else if traced > 0.0 {
        traced
    } else {
        config.miss_ms
    };
    let jitter = 1.0 + config.jitter * (2.0 * rng.unit_open() - 1.0);
    let service = (base * 1e6 * jitter * w.slowdown).max(1.0) as u64;
    w.busy += 1;
    w.busy_ns += u128::from(service);
    events.push(now + service, Event::Completion { worker, request });
}

/// A gateway's decision, as the simulation makes it: its moment (the last join's handoff or slow
/// start, at `now`) read from the fleet, then [`decide_at`].
#[allow(clippy::too_many_arguments)]
fn steer(
    policy: &Policy,
    hash: u64,
    replicas: usize,
    loads: &dyn Fn(usize) -> u64,
    rng: &mut SplitMix64,
    warm: Option<&(Option<Handoff>, usize, u64)>,
    now: u64,
    config: &FleetConfig,
    workers: &[Worker],
    members: &[usize],
) -> Option<Decision> {
    let moment = match (warm, config.warmup) {
        (Some((handoff, newcomer, joined)), Some(warmup)) => {
            let nw = &workers[members[*newcomer]];
            let (hits, all) = workers.iter().fold((0, 0), |a, w| (a.0 + w.hits, a.1 + w.requests));
            Some(Moment {
                handoff: handoff.as_ref(),
                newcomer: *newcomer,
                elapsed: Duration::from_nanos(now.saturating_sub(*joined)),
                warmup,
                newcomer_reports: (nw.hits - nw.hits_at_join, nw.requests - nw.requests_at_join),
                pool_hit_rate: ratio(hits, all),
            })
        }
        _ => None,
    };
    decide_at(policy, hash, replicas, loads, rng, moment.as_ref())
}

/// A simulated gateway's warm-up at one moment: what [`decide_at`] reads besides the table.
#[derive(Clone, Copy, Debug)]
pub struct Moment<'a> {
    /// The last join's handoff (the table without the newcomer), for [`SimWarmup::Handoff`].
    pub handoff: Option<&'a Handoff>,
    /// The newcomer's index in the table.
    pub newcomer: usize,
    /// Since it joined.
    pub elapsed: Duration,
    /// How it warms.
    pub warmup: SimWarmup,
    /// The newcomer's cache hits and requests since it joined (slow start by hit rate).
    pub newcomer_reports: (u64, u64),
    /// The pool's hit rate.
    pub pool_hit_rate: f64,
}

/// One simulated gateway's decision for a key: the core's one steering rule
/// ([`keyroute::steer`]) fed with the simulated moment, every member eligible. Public so that
/// the gateway's decisions can be checked against the simulator's (they must be equal).
pub fn decide_at(
    policy: &Policy,
    hash: u64,
    replicas: usize,
    loads: &dyn Fn(usize) -> u64,
    rng: &mut SplitMix64,
    moment: Option<&Moment<'_>>,
) -> Option<Decision> {
    let (mut handoff_of, mut progress, mut slow) = (None, 0.0, None);
    if let Some(m) = moment {
        match (m.warmup, m.handoff) {
            (SimWarmup::Handoff { window_ms }, Some(h)) => {
                progress = (m.elapsed.as_secs_f64() * 1e3 / window_ms).min(1.0);
                handoff_of = Some(h);
            }
            (SimWarmup::SlowStart { window_ms, min_share }, _) => {
                let ramp = Ramp { window: Duration::from_secs_f64(window_ms / 1e3), min_share };
                let (hits, reports) = m.newcomer_reports;
                slow = Some((m.newcomer, ramp.progress_with_hits(m.elapsed, hits, reports, m.pool_hit_rate)));
            }
            _ => {}
        }
    }
    let by_node = |_: usize| progress;
    let held = |i: usize| slow.is_some_and(|(newcomer, p)| i == newcomer && !admitted(hash, p));
    let steering = Steering {
        replicas,
        handoff: handoff_of.map(|h| (h, &by_node as &dyn Fn(usize) -> f64)),
        held: slow.is_some().then_some(&held as &dyn Fn(usize) -> bool),
    };
    keyroute::steer::steer(policy, Some(hash), &steering, &|i: usize| loads(i), |_| true, rng)
}

/// `+w9 -w3 w2=3 strategy=ring`: what a [`Change::SetMembers`] changed.
fn describe_members(
    before: &[usize],
    after: &[usize],
    workers: &[Worker],
    reweighted: Vec<String>,
    strategy: Option<Strategy>,
) -> String {
    let mut parts: Vec<String> = Vec::new();
    for &a in after {
        if !before.contains(&a) {
            parts.push(format!("+{}", workers[a].name));
        }
    }
    for &b in before {
        if !after.contains(&b) {
            parts.push(format!("-{}", workers[b].name));
        }
    }
    parts.extend(reweighted);
    if let Some(s) = strategy {
        parts.push(format!("strategy={s}"));
    }
    if parts.is_empty() {
        parts.push("no change".into());
    }
    parts.join(" ")
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

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
use keyroute::warm::{Handoff, Ramp, admitted};
use keyroute::{Decision, Node, NodeSet, Options, Policy, Spill, Strategy};
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
}

struct Worker {
    name: String,
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

/// Runs the simulation. `progress` is called now and then with the number of requests that arrived.
///
/// # Errors
///
/// An invalid configuration, or a policy that cannot be built.
pub fn run(config: &FleetConfig, progress: &mut dyn FnMut(u64)) -> Result<FleetReport, SimError> {
    config.validate()?;
    let mut rng = SplitMix64::new(config.seed);
    let zipf = Zipf::new(config.keys, config.zipf);
    let hot_key = config.keys as u32; // an extra key, hot only after a HotKey change
    let total_keys = config.keys + 1;
    let name = |i: usize| format!("w{}", i + 1);
    let mut workers: Vec<Worker> = Vec::new();
    let new_worker = |i: usize, now: u64| Worker {
        name: name(i),
        cache: Lru::new(total_keys, config.cache_entries),
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
    };
    for i in 0..config.workers {
        workers.push(new_worker(i, 0));
    }
    // Members in node order: node index -> worker id.
    let mut members: Vec<usize> = (0..config.workers).collect();
    let node_set = |members: &[usize], workers: &[Worker]| {
        NodeSet::try_new(members.iter().map(|&w| Node::new_unchecked(&workers[w].name))).map_err(SimError::from)
    };
    let mut policies: Vec<Policy> = (0..config.gateways)
        .map(|_| Policy::build(config.strategy, node_set(&members, &workers)?, &config.options).map_err(SimError::from))
        .collect::<Result<_, _>>()?;
    let key_bytes = |k: u32| format!("thumb/{k}.jpg");
    let hashes: Vec<u64> = (0..total_keys as u32).map(|k| policies[0].key_hash(key_bytes(k).as_bytes())).collect();
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    let hot_rule = config.hot_keys.map(|h| HotKeyConfig {
        threshold: Threshold::Share(h.threshold_share),
        per_replica: h.per_replica,
        max_replicas: h.max_replicas,
        hold: Duration::from_secs_f64(h.hold_ms / 1e3),
        confidence: 2.0,
    });
    let mut gateways: Vec<Gateway> = (0..config.gateways)
        .map(|g| -> Result<Gateway, SimError> {
            let hot = match (config.hot_keys, hot_rule) {
                (Some(h), Some(rule)) => Some((
                    HotKeyDetector::try_new(h.counters, h.sample_every)?,
                    HotKeys::try_new(rule)?,
                    HotSet::default(),
                    0u64,
                )),
                _ => None,
            };
            Ok(Gateway {
                rng: SplitMix64::new(config.seed ^ (0x9e37 + g as u64).wrapping_mul(0x1000_0001)),
                snapshot: vec![0; config.workers],
                own_since: vec![0; config.workers],
                hot,
                cached: HashMap::new(),
                flights: HashMap::new(),
            })
        })
        .collect::<Result<_, _>>()?;
    // Warm-up after the last join: the handoff table (for handoff), the newcomer's node index and
    // when it joined, and its (hits, requests) since.
    let mut warm: Option<(Option<Handoff>, usize, u64)> = None;
    let mut first_change: Option<u64> = None;
    let (mut after_hits, mut after_all, mut after10_hits, mut after10_all) = (0u64, 0u64, 0u64, 0u64);
    let (mut hot_keys_max, mut replicas_max, mut gateway_cache_hits) = (0usize, 0usize, 0u64);
    let window_ns = config.hot_keys.map_or(u64::MAX, |h| ns(h.window_ms).max(1));
    let ttl_ns = config.gateway_cache_ttl_ms.map(ns);

    let mean_gap = 1e9 / config.rate;
    let expected_end = (config.requests as f64 * mean_gap) as u64;
    let sample_every = (expected_end / 400).max(1);
    let refresh = ns(config.refresh_ms);

    let mut heap: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(u64, u64, Event)>>, t: u64, e: Event| {
        seq += 1;
        heap.push(Reverse((t, seq, e)));
    };
    push(&mut heap, 0, Event::Arrival);
    push(&mut heap, 0, Event::Sample);
    if refresh > 0 {
        for g in 0..config.gateways {
            push(&mut heap, refresh * g as u64 / config.gateways as u64, Event::Refresh { gateway: g as u32 });
        }
    }

    let mut changes: Vec<TimedChange> = config.changes.clone();
    changes.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut next_change = 0;
    let mut hot_share = 0.0;
    // A flash crowd: (start ns, peak share, rise ns, hold ns).
    let mut flash: Option<(u64, f64, u64, u64)> = None;

    let mut requests: Vec<Request> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut arrived = 0u64;
    let (mut completed, mut errors, mut owner_hits, mut keyed) = (0u64, 0u64, 0u64, 0u64);
    let mut hits_total = 0u64;
    let mut hot_total = 0u64;
    let mut latency = Histogram::default();
    let mut remaps = Vec::new();
    let mut series = Series::default();
    let mut now = 0u64;
    let mut last_completion = 0u64;

    while let Some(Reverse((t, _, event))) = heap.pop() {
        now = t;
        match event {
            Event::Arrival => {
                // Timed changes due at this point of the run.
                while next_change < changes.len() && arrived as f64 >= changes[next_change].at * config.requests as f64
                {
                    let change = changes[next_change].change.clone();
                    next_change += 1;
                    match change {
                        Change::SlowWorker { worker, factor } => {
                            if let Some(w) = workers.get_mut(worker) {
                                w.slowdown = factor;
                            }
                        }
                        Change::HotKey { share } => hot_share = share,
                        Change::FlashCrowd { share, rise_s, hold_s } => {
                            flash = Some((now, share, ns(rise_s * 1e3).max(1), ns(hold_s * 1e3)));
                        }
                        Change::AddWorker | Change::RemoveWorker => {
                            let mut next_members = members.clone();
                            if change == Change::AddWorker {
                                let id = workers.len();
                                workers.push(new_worker(id, now));
                                next_members.push(id);
                                for g in &mut gateways {
                                    g.snapshot.push(0);
                                    g.own_since.push(0);
                                }
                            } else if next_members.len() > 1
                                && let Some(gone) = next_members.pop()
                            {
                                workers[gone].member = false;
                                workers[gone].left = Some(now);
                            }
                            let set = node_set(&next_members, &workers)?;
                            let next: Vec<Policy> =
                                policies.iter().map(|p| p.rebuild(set.clone())).collect::<Result<_, _>>()?;
                            let moved = config.strategy.uses_key().then(|| {
                                (0..config.keys)
                                    .filter(|&k| {
                                        let before = policies[0].owner(hashes[k]).map(|i| members[i]);
                                        let after = next[0].owner(hashes[k]).map(|i| next_members[i]);
                                        before != after
                                    })
                                    .count() as u64
                            });
                            remaps.push(RemapEvent {
                                at_s: now as f64 / 1e9,
                                change: match change {
                                    Change::AddWorker => {
                                        format!("add {}", workers[next_members[next_members.len() - 1]].name)
                                    }
                                    _ => {
                                        format!("remove {}", members.last().map_or("-", |&w| workers[w].name.as_str()))
                                    }
                                },
                                keys_moved: moved,
                                moved_share: moved.map(|m| m as f64 / config.keys as f64),
                            });
                            first_change.get_or_insert(now);
                            warm = None;
                            if change == Change::AddWorker
                                && let Some(w) = config.warmup
                            {
                                let idx = next_members.len() - 1;
                                let handoff = match w {
                                    SimWarmup::Handoff { .. } => Handoff::new(&next[0], &[idx])?,
                                    SimWarmup::SlowStart { .. } => None,
                                };
                                warm = Some((handoff, idx, now));
                            }
                            policies = next;
                            members = next_members;
                        }
                    }
                }
                arrived += 1;
                if arrived.is_multiple_of(65_536) {
                    progress(arrived);
                }
                if let Some((start, peak, rise, hold)) = flash {
                    let t = now.saturating_sub(start);
                    hot_share = if t < rise {
                        peak * t as f64 / rise as f64
                    } else if t < rise + hold {
                        peak
                    } else if t < 2 * rise + hold {
                        peak * (2 * rise + hold - t) as f64 / rise as f64
                    } else {
                        0.0
                    };
                }
                let key =
                    if hot_share > 0.0 && rng.unit_open() < hot_share { hot_key } else { zipf.sample(&mut rng) as u32 };
                let gateway = rng.below(config.gateways as u64) as usize;
                let hash = hashes[key as usize];
                let Gateway { rng: grng, snapshot, own_since, hot, cached, flights } = &mut gateways[gateway];
                // Hot keys: the gateway measures, ends its window when due, and may answer from its
                // cache or join a miss in flight.
                let mut replicas = 0;
                if let Some((det, rule, set, next_tick)) = hot {
                    det.observe(hash);
                    if now >= *next_tick {
                        if *next_tick > 0 {
                            *set = rule.tick(Duration::from_nanos(now), &det.take_window());
                            hot_keys_max = hot_keys_max.max(set.len());
                            replicas_max = replicas_max.max(set.iter().map(|(_, r)| r).max().unwrap_or(0));
                        } else {
                            det.take_window();
                            rule.start(Duration::from_nanos(now));
                        }
                        *next_tick = now + window_ns;
                    }
                    replicas = set.replicas(hash);
                }
                let mut leads = false;
                if replicas > 0
                    && let Some(ttl) = ttl_ns
                {
                    if cached.get(&key).is_some_and(|&until| until > now) {
                        gateway_cache_hits += 1;
                        completed += 1;
                        latency.record(1);
                        if arrived < config.requests {
                            let gap = (-rng.unit_open().ln() * mean_gap * (1.0 - hot_share)) as u64;
                            push(&mut heap, now + gap.max(1), Event::Arrival);
                        }
                        continue;
                    }
                    if let Some(waiting) = flights.get_mut(&key) {
                        waiting.push(now);
                        if arrived < config.requests {
                            let gap = (-rng.unit_open().ln() * mean_gap * (1.0 - hot_share)) as u64;
                            push(&mut heap, now + gap.max(1), Event::Arrival);
                        }
                        continue;
                    }
                    flights.insert(key, Vec::new());
                    leads = ttl > 0;
                }
                let decision = {
                    let (snapshot, own_since) = (&*snapshot, &*own_since);
                    let view = |node: usize| -> u64 {
                        let w = members[node];
                        if refresh == 0 {
                            workers[w].in_flight
                        } else if config.count_own {
                            (snapshot[w] as i64 + own_since[w]).max(0) as u64
                        } else {
                            snapshot[w]
                        }
                    };
                    let policy = &policies[gateway];
                    steer(policy, hash, replicas, &view, grng, warm.as_ref(), now, config, &workers, &members)
                };
                match decision {
                    None => {
                        errors += 1;
                        if leads {
                            // The waiting requests fail with their leader.
                            errors += flights.remove(&key).map_or(0, |w| w.len() as u64);
                        }
                    }
                    Some(d) => {
                        if d.owner.is_some() {
                            keyed += 1;
                            owner_hits += u64::from(d.owner == Some(d.node));
                        }
                        let w = members[d.node];
                        own_since[w] += 1;
                        let req = Request { key, gateway: gateway as u32, arrived: now, leads, hit: false };
                        let id = match free.pop() {
                            Some(id) => {
                                requests[id as usize] = req;
                                id
                            }
                            None => {
                                requests.push(req);
                                (requests.len() - 1) as u32
                            }
                        };
                        let worker = &mut workers[w];
                        worker.in_flight += 1;
                        worker.max_in_flight = worker.max_in_flight.max(worker.in_flight);
                        if worker.busy < config.concurrency {
                            start(worker, w as u32, id, &mut requests, now, config, &mut rng, &mut heap, &mut push);
                        } else {
                            worker.queue.push_back(id);
                            worker.max_queue = worker.max_queue.max(worker.queue.len() as u64);
                        }
                    }
                }
                if arrived < config.requests {
                    let gap = (-rng.unit_open().ln() * mean_gap * (1.0 - hot_share)) as u64;
                    push(&mut heap, now + gap.max(1), Event::Arrival);
                }
            }
            Event::Completion { worker, request } => {
                let r = requests[request as usize];
                let w = &mut workers[worker as usize];
                w.busy -= 1;
                w.in_flight -= 1;
                w.requests += 1;
                if r.key == hot_key {
                    w.hot += 1;
                    hot_total += 1;
                }
                if !w.cache.touch(r.key) {
                    w.cache.insert(r.key);
                }
                gateways[r.gateway as usize].own_since[worker as usize] -= 1;
                latency.record(now - r.arrived);
                w.held_ns += u128::from(now - r.arrived);
                if let Some(t0) = first_change
                    && r.arrived >= t0
                {
                    let hit = r.hit;
                    if r.arrived < t0 + 60_000_000_000 {
                        after_all += 1;
                        after_hits += u64::from(hit);
                    }
                    if r.arrived < t0 + 10_000_000_000 {
                        after10_all += 1;
                        after10_hits += u64::from(hit);
                    }
                }
                if r.leads {
                    let g = &mut gateways[r.gateway as usize];
                    if let Some(ttl) = ttl_ns {
                        g.cached.insert(r.key, now + ttl);
                    }
                    for t in g.flights.remove(&r.key).unwrap_or_default() {
                        latency.record(now - t);
                        completed += 1;
                        gateway_cache_hits += 1;
                    }
                }
                completed += 1;
                last_completion = now;
                free.push(request);
                if let Some(next) = w.queue.pop_front() {
                    start(w, worker, next, &mut requests, now, config, &mut rng, &mut heap, &mut push);
                }
            }
            Event::Refresh { gateway } => {
                let g = &mut gateways[gateway as usize];
                for (w, worker) in workers.iter().enumerate() {
                    g.snapshot[w] = worker.in_flight;
                    g.own_since[w] = 0;
                }
                if arrived < config.requests || completed + errors < arrived {
                    push(&mut heap, now + refresh, Event::Refresh { gateway });
                }
            }
            Event::Sample => {
                series.times_s.push(now as f64 / 1e9);
                series.in_flight.resize(workers.len(), Vec::new());
                let samples = series.times_s.len();
                for (w, worker) in workers.iter().enumerate() {
                    let s = &mut series.in_flight[w];
                    s.resize(samples - 1, 0);
                    s.push(worker.in_flight.min(u64::from(u32::MAX)) as u32);
                }
                if arrived < config.requests || completed + errors < arrived {
                    push(&mut heap, now + sample_every, Event::Sample);
                }
            }
        }
    }
    for w in &workers {
        hits_total += w.hits;
    }
    let end = last_completion.max(now).max(1);
    // Requests a worker served: the completed ones less those a gateway's cache answered.
    let served = completed - gateway_cache_hits;
    let wr: Vec<WorkerReport> = workers
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
    Ok(FleetReport {
        config: config.clone(),
        completed,
        errors,
        duration_s: end as f64 / 1e9,
        throughput: completed as f64 / (end as f64 / 1e9),
        hit_rate: ratio(hits_total, served),
        latency: latency.summary(),
        max_utilisation: wr.iter().map(|w| w.utilisation).fold(0.0, f64::max),
        mean_utilisation: wr.iter().map(|w| w.utilisation).sum::<f64>() / wr.len().max(1) as f64,
        max_over_mean_requests: active.iter().map(|w| w.requests as f64).fold(0.0, f64::max) / mean_req.max(1e-9),
        max_over_mean_load: active.iter().map(|w| w.mean_in_flight).fold(0.0, f64::max) / mean_load.max(1e-12),
        max_in_flight: wr.iter().map(|w| w.max_in_flight).max().unwrap_or(0),
        max_queue: wr.iter().map(|w| w.max_queue).max().unwrap_or(0),
        owner_share: (keyed > 0).then(|| ratio(owner_hits, keyed)),
        hot_key_requests: hot_total,
        hot_key_workers: wr.iter().filter(|w| hot_total > 0 && w.hot_requests * 100 >= hot_total).count(),
        hot_keys_max,
        replicas_max,
        gateway_cache_hits,
        hit_rate_after_change: first_change.map(|_| ratio(after_hits, after_all)),
        hit_rate_10s_after_change: first_change.map(|_| ratio(after10_hits, after10_all)),
        remaps,
        workers: wr,
        series,
        latency_cdf: latency.cdf_points(200),
    })
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
    heap: &mut Heap,
    push: &mut impl FnMut(&mut Heap, u64, Event),
) {
    let key = requests[request as usize].key;
    let hit = w.cache.touch(key);
    requests[request as usize].hit = hit;
    w.hits += u64::from(hit);
    let base = if hit { config.hit_ms } else { config.miss_ms };
    let jitter = 1.0 + config.jitter * (2.0 * rng.unit_open() - 1.0);
    let service = (base * 1e6 * jitter * w.slowdown).max(1.0) as u64;
    w.busy += 1;
    w.busy_ns += u128::from(service);
    push(heap, now + service, Event::Completion { worker, request });
}

/// A gateway's decision: a hot key goes to the least loaded of its top replicas; a key whose
/// owner joined within the warm-up window and is not admitted yet goes to its previous owner
/// (handoff) or its next node (slow start); the rest as the strategy says.
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
    if replicas > 1 {
        return policy.decide_replicated(hash, replicas, &|i| loads(i), |_| true, rng);
    }
    if let (Some((handoff, newcomer, joined)), Some(w)) = (warm, config.warmup) {
        let elapsed = Duration::from_nanos(now.saturating_sub(*joined));
        match (w, handoff) {
            (SimWarmup::Handoff { window_ms }, Some(h)) => {
                let p = (elapsed.as_secs_f64() * 1e3 / window_ms).min(1.0);
                if let Some(owner) = policy.owner(hash)
                    && owner == *newcomer
                    && !admitted(hash, p)
                    && let Some(prev) = h.previous_owner(hash)
                {
                    return Some(Decision { node: prev, owner: Some(owner), spill: Some(Spill::Warming) });
                }
            }
            (SimWarmup::SlowStart { window_ms, min_share }, _) => {
                let ramp = Ramp { window: Duration::from_secs_f64(window_ms / 1e3), min_share };
                let nw = &workers[members[*newcomer]];
                let (hits, all) = workers.iter().fold((0, 0), |a, w| (a.0 + w.hits, a.1 + w.requests));
                let pool = ratio(hits, all);
                let p = ramp.progress_with_hits(
                    elapsed,
                    nw.hits - nw.hits_at_join,
                    nw.requests - nw.requests_at_join,
                    pool,
                );
                if !admitted(hash, p)
                    && let Some(d) = policy.decide(Some(hash), &|i| loads(i), |i| i != *newcomer, rng)
                {
                    return Some(d);
                }
            }
            _ => {}
        }
    }
    policy.decide(Some(hash), &|i| loads(i), |_| true, rng)
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

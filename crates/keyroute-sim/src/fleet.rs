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

use keyroute::hash::{RandomSource, SplitMix64};
use keyroute::{Node, NodeSet, Options, Policy, Strategy};
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
                _ => {}
            }
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
    /// Cache hits over completed requests.
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
}

struct Gateway {
    rng: SplitMix64,
    snapshot: Vec<u64>,
    own_since: Vec<i64>,
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
    let mut gateways: Vec<Gateway> = (0..config.gateways)
        .map(|g| Gateway {
            rng: SplitMix64::new(config.seed ^ (0x9e37 + g as u64).wrapping_mul(0x1000_0001)),
            snapshot: vec![0; config.workers],
            own_since: vec![0; config.workers],
        })
        .collect();

    let ns = |ms: f64| (ms * 1e6).round() as u64;
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
                            policies = next;
                            members = next_members;
                        }
                    }
                }
                arrived += 1;
                if arrived.is_multiple_of(65_536) {
                    progress(arrived);
                }
                let key =
                    if hot_share > 0.0 && rng.unit_open() < hot_share { hot_key } else { zipf.sample(&mut rng) as u32 };
                let gateway = rng.below(config.gateways as u64) as usize;
                let Gateway { rng: grng, snapshot, own_since } = &mut gateways[gateway];
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
                    policies[gateway].decide(Some(hashes[key as usize]), &view, |_| true, grng)
                };
                match decision {
                    None => errors += 1,
                    Some(d) => {
                        if d.owner.is_some() {
                            keyed += 1;
                            owner_hits += u64::from(d.owner == Some(d.node));
                        }
                        let w = members[d.node];
                        own_since[w] += 1;
                        let id = match free.pop() {
                            Some(id) => {
                                requests[id as usize] = Request { key, gateway: gateway as u32, arrived: now };
                                id
                            }
                            None => {
                                requests.push(Request { key, gateway: gateway as u32, arrived: now });
                                (requests.len() - 1) as u32
                            }
                        };
                        let worker = &mut workers[w];
                        worker.in_flight += 1;
                        worker.max_in_flight = worker.max_in_flight.max(worker.in_flight);
                        if worker.busy < config.concurrency {
                            start(worker, w as u32, id, &requests, now, config, &mut rng, &mut heap, &mut push);
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
                completed += 1;
                last_completion = now;
                free.push(request);
                if let Some(next) = w.queue.pop_front() {
                    start(w, worker, next, &requests, now, config, &mut rng, &mut heap, &mut push);
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
    let wr: Vec<WorkerReport> = workers
        .iter()
        .map(|w| {
            let span = w.left.unwrap_or(end).saturating_sub(w.joined).max(1) as f64;
            WorkerReport {
                name: w.name.clone(),
                requests: w.requests,
                share: ratio(w.requests, completed),
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
    let mean_req = completed as f64 / active.len().max(1) as f64;
    let mean_load = active.iter().map(|w| w.mean_in_flight).sum::<f64>() / active.len().max(1) as f64;
    Ok(FleetReport {
        config: config.clone(),
        completed,
        errors,
        duration_s: end as f64 / 1e9,
        throughput: completed as f64 / (end as f64 / 1e9),
        hit_rate: ratio(hits_total, completed),
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
    requests: &[Request],
    now: u64,
    config: &FleetConfig,
    rng: &mut SplitMix64,
    heap: &mut Heap,
    push: &mut impl FnMut(&mut Heap, u64, Event),
) {
    let key = requests[request as usize].key;
    let hit = w.cache.touch(key);
    w.hits += u64::from(hit);
    let base = if hit { config.hit_ms } else { config.miss_ms };
    let jitter = 1.0 + config.jitter * (2.0 * rng.unit_open() - 1.0);
    let service = (base * 1e6 * jitter * w.slowdown).max(1.0) as u64;
    w.busy += 1;
    w.busy_ns += u128::from(service);
    push(heap, now + service, Event::Completion { worker, request });
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

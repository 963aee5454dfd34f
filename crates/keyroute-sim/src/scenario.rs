//! Named scenarios: the first source document's story, one situation each, with documented defaults.
//!
//! Every scenario starts from the same fleet (the **base**), and changes one thing:
//!
//! | scenario | what happens |
//! |---|---|
//! | `steady` | the base: 8 workers, one gateway, exact in-flight counts |
//! | `scale-out` | a ninth worker joins halfway through |
//! | `slow-worker` | worker 1 is 8x slower from the start (garbage collection, a noisy neighbour) |
//! | `hot-key` | from 30% of the run on, a viral image arrives on top of the usual traffic: 85% of all requests (2,550 a second, more than one worker can serve even from its cache) |
//! | `flash-crowd` | from 30% of the run on, a new image's share of all requests rises from 0 to 90% in one second, stays there 30 s and falls back in one second |
//! | `stale-gateways` | work any worker does equally fast (20 ms, no cache effect) at 75% load, through 8 gateways that see the workers' in-flight counts from load reports every 500 ms |
//!
//! The base: 100,000 distinct thumbnails with Zipf(0.9) popularity; each worker serves 4 requests
//! at a time and caches 5,000 thumbnails; a miss (a resize) takes 100 ms and a hit 2 ms, each +-20%;
//! 600 requests per second arrive; 400,000 requests are simulated (about 11 simulated minutes).
//! At that rate a fleet that hashes keys runs at about a third of its capacity and one that does not
//! (its caches each warming from an eighth of the traffic) at about two thirds.

use keyroute::{Options, Strategy};

use crate::fleet::{Change, FleetConfig, TimedChange};

/// The names of the scenarios.
pub const SCENARIOS: [&str; 6] = ["steady", "scale-out", "slow-worker", "hot-key", "flash-crowd", "stale-gateways"];

/// The variants a strategy name may carry (`rendezvous+replicas+cache`): hot-key replication,
/// the gateway cache (with replication), previous-owner handoff, slow start.
pub const VARIANTS: [&str; 4] = ["replicas", "cache", "handoff", "slow-start"];

/// The strategies a scenario compares by default: the first document's eight, and for the
/// scenarios the features answer, the features.
pub fn default_strategies(scenario: &str) -> Vec<&'static str> {
    let mut v =
        vec!["round-robin", "modulo", "ring", "rendezvous", "bounded-rendezvous", "p2c", "least-loaded", "affinity"];
    match scenario {
        "hot-key" | "flash-crowd" => v.extend(["rendezvous+replicas", "rendezvous+replicas+cache"]),
        "scale-out" => v.extend(["rendezvous+handoff", "rendezvous+slow-start"]),
        _ => {}
    }
    v
}

/// Turns on a variant (one of [`VARIANTS`]) with its defaults, sized from the configuration:
///
/// - `replicas`: a key is hot at 5% of a gateway's requests; each replica should stay under half
///   of what one worker serves from its cache (`concurrency / hit_ms`), shared by the gateways; at
///   most 8 replicas; windows of 1 s, a hold of 5 s, one request in 16 sampled, 64 counters.
/// - `cache` (implies `replicas`): responses for hot keys stay fresh 1 s at each gateway.
/// - `handoff`: a newcomer's keys reach it over 60 s.
/// - `slow-start`: over 60 s from 10%, slowed by the newcomer's hit rate.
///
/// Returns false for an unknown variant.
pub fn apply_variant(c: &mut FleetConfig, variant: &str) -> bool {
    use crate::fleet::{SimHotKeys, SimWarmup};
    let replicas = |c: &FleetConfig| SimHotKeys {
        threshold_share: 0.05,
        per_replica: 0.5 * f64::from(c.concurrency) * 1e3 / c.hit_ms / c.gateways as f64,
        max_replicas: 8,
        hold_ms: 5_000.0,
        window_ms: 1_000.0,
        sample_every: 16,
        counters: 64,
    };
    match variant {
        "replicas" => c.hot_keys = Some(replicas(c)),
        "cache" => {
            if c.hot_keys.is_none() {
                c.hot_keys = Some(replicas(c));
            }
            c.gateway_cache_ttl_ms = Some(1_000.0);
        }
        "handoff" => c.warmup = Some(SimWarmup::Handoff { window_ms: 60_000.0 }),
        "slow-start" => c.warmup = Some(SimWarmup::SlowStart { window_ms: 60_000.0, min_share: 0.1 }),
        _ => return false,
    }
    true
}

/// The base configuration (the `steady` scenario) for a strategy.
pub fn base(strategy: Strategy) -> FleetConfig {
    FleetConfig {
        scenario: "steady".into(),
        strategy,
        options: Options::default(),
        workers: 8,
        gateways: 1,
        refresh_ms: 0.0,
        count_own: true,
        concurrency: 4,
        hit_ms: 2.0,
        miss_ms: 100.0,
        jitter: 0.2,
        cache_entries: 5_000,
        keys: 100_000,
        zipf: 0.9,
        rate: 450.0,
        requests: 400_000,
        seed: 1,
        changes: Vec::new(),
        hot_keys: None,
        gateway_cache_ttl_ms: None,
        warmup: None,
        members: None,
        trace: None,
    }
}

/// A named scenario for a strategy, or `None` for an unknown name.
pub fn scenario(name: &str, strategy: Strategy) -> Option<FleetConfig> {
    let mut c = base(strategy);
    c.scenario = name.to_owned();
    match name {
        "steady" => {}
        "scale-out" => c.changes.push(TimedChange { at: 0.5, change: Change::AddWorker }),
        "slow-worker" => c.changes.push(TimedChange { at: 0.0, change: Change::SlowWorker { worker: 0, factor: 8.0 } }),
        "hot-key" => c.changes.push(TimedChange { at: 0.3, change: Change::HotKey { share: 0.85 } }),
        "flash-crowd" => c
            .changes
            .push(TimedChange { at: 0.3, change: Change::FlashCrowd { share: 0.9, rise_s: 1.0, hold_s: 30.0 } }),
        "stale-gateways" => {
            // Work any worker can do equally well (a hit costs what a miss does), at 75% of the
            // fleet's capacity, spread over 8 gateways that learn the workers' in-flight counts
            // from load reports every 500 ms.
            c.gateways = 8;
            c.refresh_ms = 500.0;
            c.count_own = false;
            c.hit_ms = 20.0;
            c.miss_ms = 20.0;
            c.rate = 1200.0;
        }
        _ => return None,
    }
    Some(c)
}

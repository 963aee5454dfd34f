//! What the simulator must show (issue #3), on the named scenarios with fewer requests than the
//! defaults so the suite stays quick. The README's figures come from the full-size runs.

use keyroute::Strategy;
use keyroute_sim::fleet::{self, FleetReport};
use keyroute_sim::scenario;

fn run(name: &str, strategy: Strategy, requests: u64) -> FleetReport {
    let mut c = scenario::scenario(name, strategy).expect("known scenario");
    c.requests = requests;
    fleet::run(&c, &mut |_| {}).expect("runs")
}

#[test]
fn runs_are_deterministic() {
    let a = run("hot-key", Strategy::Affinity, 30_000);
    let b = run("hot-key", Strategy::Affinity, 30_000);
    assert_eq!(serde_json::to_string(&a).expect("json"), serde_json::to_string(&b).expect("json"));
}

#[test]
fn hashing_keeps_the_caches_warm() {
    let rr = run("steady", Strategy::RoundRobin, 150_000);
    for s in [Strategy::Ring, Strategy::Rendezvous, Strategy::Modulo] {
        let r = run("steady", s, 150_000);
        assert!(r.hit_rate > rr.hit_rate + 0.15, "{s}: {} vs round robin {}", r.hit_rate, rr.hit_rate);
        assert!(r.latency.p50_ms < rr.latency.p50_ms, "{s}");
        assert_eq!(r.owner_share, Some(1.0));
        assert_eq!(r.errors, 0);
    }
}

#[test]
fn scale_out_remaps_eight_ninths_with_modulo_and_one_ninth_with_consistent_hashing() {
    let modulo = run("scale-out", Strategy::Modulo, 60_000);
    let moved = modulo.remaps[0].moved_share.expect("keyed");
    assert!((moved - 8.0 / 9.0).abs() < 0.02, "modulo moved {moved}");
    for s in [Strategy::Ring, Strategy::Rendezvous, Strategy::Jump, Strategy::Maglev] {
        let r = run("scale-out", s, 60_000);
        let moved = r.remaps[0].moved_share.expect("keyed");
        assert!((moved - 1.0 / 9.0).abs() < 0.025, "{s} moved {moved}");
    }
    let p2c = run("scale-out", Strategy::P2c, 60_000);
    assert_eq!(p2c.remaps[0].keys_moved, None);
}

#[test]
fn stale_gateways_herd_least_loaded_but_not_p2c() {
    let p2c = run("stale-gateways", Strategy::P2c, 200_000);
    let ll = run("stale-gateways", Strategy::LeastLoaded, 200_000);
    assert!(
        ll.max_queue as f64 >= 2.5 * p2c.max_queue as f64,
        "least-loaded {} vs p2c {}",
        ll.max_queue,
        p2c.max_queue
    );
    assert!(ll.latency.p99_ms > 2.0 * p2c.latency.p99_ms, "{} vs {}", ll.latency.p99_ms, p2c.latency.p99_ms);
}

#[test]
fn load_aware_strategies_route_around_a_slow_worker() {
    let rr = run("slow-worker", Strategy::RoundRobin, 100_000);
    for s in [Strategy::P2c, Strategy::Affinity, Strategy::BoundedRendezvous] {
        let r = run("slow-worker", s, 100_000);
        assert!(
            r.latency.p99_ms * 20.0 < rr.latency.p99_ms,
            "{s}: p99 {} vs round robin {}",
            r.latency.p99_ms,
            rr.latency.p99_ms
        );
    }
}

#[test]
fn hot_keys_overload_one_owner_bounded_loads_cap_it_and_affinity_splits_it() {
    let requests = 150_000;
    let hrw = run("hot-key", Strategy::Rendezvous, requests);
    let ring = run("hot-key", Strategy::Ring, requests);
    for r in [&hrw, &ring] {
        assert!(r.max_over_mean_load > 3.0, "{}: {}", r.config.strategy, r.max_over_mean_load);
        assert_eq!(r.hot_key_workers, 1);
    }
    let bounded = run("hot-key", Strategy::BoundedRendezvous, requests);
    // Capacity is ceil(1.25 x mean) in flight at every decision; averaged over time the busiest
    // worker stays within it.
    assert!(bounded.max_over_mean_load <= 1.25, "bounded: {}", bounded.max_over_mean_load);
    assert!(bounded.hit_rate >= 0.9 * hrw.hit_rate, "bounded hit {} vs {}", bounded.hit_rate, hrw.hit_rate);
    let affinity = run("hot-key", Strategy::Affinity, requests);
    assert_eq!(affinity.hot_key_workers, 2);
    assert!(affinity.max_over_mean_load < hrw.max_over_mean_load / 2.0);
}

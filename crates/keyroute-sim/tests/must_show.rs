//! What the simulator must show (issue #3), on the named scenarios with fewer requests than the
//! defaults so the suite stays quick. The README's figures come from the full-size runs.

use keyroute::{NodeSet, Options, Placement, Strategy, Table};
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

/// The keys a strategy moves when `w9` joins `w1..w8`, counted directly on keyroute's tables (the
/// simulator names workers `w1`, `w2`, ... and keys `thumb/0.jpg` to `thumb/99999.jpg`), and the
/// count the law expects, with its standard deviation (binomial over the keys).
fn moved_directly(strategy: Strategy, keys: u32) -> (u64, f64, f64) {
    let set = |n: usize| NodeSet::parse(&(1..=n).map(|i| format!("w{i}")).collect::<Vec<_>>().join(",")).expect("v");
    let (before, after) = (set(8), set(9));
    let opts = Options::default();
    let b = Table::build(strategy, before.clone(), &opts).expect("ok").expect("keyed");
    let a = Table::build(strategy, after.clone(), &opts).expect("ok").expect("keyed");
    let owner = |t: &Table, set: &NodeSet, h: u64| t.pick_hash(h).map(|i| set.nodes()[i].name().to_owned());
    let moved = (0..keys)
        .filter(|k| {
            let key = format!("thumb/{k}.jpg");
            owner(&b, &before, b.key_hash(key.as_bytes())) != owner(&a, &after, a.key_hash(key.as_bytes()))
        })
        .count() as u64;
    // The share of uniform hashes that move: modulo keeps a key iff h mod 8 = h mod 9 (1 in 9);
    // rendezvous and jump move a key to the newcomer with probability 1/9; the ring moves the keys
    // on w9's arcs; Maglev the keys on the entries that change owner (each entry e is hit by the
    // hash ceil(e 2^64 / M)).
    let p = match (&b, &a) {
        (_, Table::Ring(r)) => r.shares()[8],
        (Table::Maglev(_), Table::Maglev(_)) => {
            let m = u128::from(opts.maglev_size);
            let changed = (0..m)
                .filter(|e| {
                    let h = ((e << 64).div_ceil(m)) as u64;
                    owner(&b, &before, h) != owner(&a, &after, h)
                })
                .count();
            changed as f64 / m as f64
        }
        (Table::Modulo(_), _) => 8.0 / 9.0,
        _ => 1.0 / 9.0,
    };
    let k = f64::from(keys);
    (moved, k * p, (k * p * (1.0 - p)).sqrt())
}

#[test]
fn scale_out_remaps_eight_ninths_with_modulo_and_one_ninth_with_consistent_hashing() {
    // Which keys move depends only on the keys and the two node sets, not on the traffic, so the
    // counts are exact and the same as the README's full-size run (modulo 88.8%, the ring 10.7%,
    // rendezvous 11.1%). Each is also the simulator's own count redone on keyroute's tables, and
    // within 6 standard deviations (about 600 keys for modulo, 600 for the others) of the law.
    let keys = 100_000u32;
    for (s, pinned) in [
        (Strategy::Modulo, 88_788),
        (Strategy::Ring, 10_682),
        (Strategy::Rendezvous, 11_126),
        (Strategy::Jump, 11_105),
        (Strategy::Maglev, 11_264),
    ] {
        let r = run("scale-out", s, 60_000);
        let moved = r.remaps[0].keys_moved.expect("keyed");
        assert_eq!(r.remaps[0].change, "add w9");
        assert_eq!(r.remaps[0].moved_share, Some(moved as f64 / f64::from(keys)), "{s}");
        let (direct, expected, sigma) = moved_directly(s, keys);
        assert_eq!(moved, direct, "{s}: the simulator's count and a direct count differ");
        assert!((moved as f64 - expected).abs() <= 6.0 * sigma, "{s} moved {moved}, law {expected:.0} +- {sigma:.0}");
        assert_eq!(moved, pinned, "{s}");
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

fn run_variant(name: &str, strategy: Strategy, variants: &[&str], requests: u64) -> FleetReport {
    let mut c = scenario::scenario(name, strategy).expect("known scenario");
    c.requests = requests;
    for v in variants {
        assert!(scenario::apply_variant(&mut c, v), "{v}");
    }
    c.validate().expect("valid");
    fleet::run(&c, &mut |_| {}).expect("runs")
}

/// Issue 11: replication spreads the hot key over no more workers than its rate needs, keeps
/// rendezvous's hit rate (bounded loads gives some up), and ends the overload; the gateway cache
/// takes most of the hot key's requests off the workers.
#[test]
fn replication_spreads_a_hot_key_over_its_top_owners_at_rendezvous_hit_rate() {
    let requests = 150_000;
    let hrw = run("hot-key", Strategy::Rendezvous, requests);
    let bounded = run("hot-key", Strategy::BoundedRendezvous, requests);
    let repl = run_variant("hot-key", Strategy::Rendezvous, &["replicas"], requests);
    // The hot key: 2,550 req/s; each replica should carry under 1,000 (half of 4 slots / 2 ms).
    assert_eq!(repl.replicas_max, 3, "ceil(2550 / 1000)");
    assert!(repl.hot_key_workers <= 3, "{}", repl.hot_key_workers);
    assert!(bounded.hot_key_workers > repl.hot_key_workers, "{} vs {}", bounded.hot_key_workers, repl.hot_key_workers);
    assert!((repl.hit_rate - hrw.hit_rate).abs() < 0.03, "{} vs {}", repl.hit_rate, hrw.hit_rate);
    assert!(repl.hit_rate > bounded.hit_rate, "{} vs bounded {}", repl.hit_rate, bounded.hit_rate);
    assert!(repl.latency.p99_ms < hrw.latency.p99_ms / 10.0, "{} vs {}", repl.latency.p99_ms, hrw.latency.p99_ms);
    assert_eq!(repl.errors, 0);
    let cached = run_variant("hot-key", Strategy::Rendezvous, &["replicas", "cache"], requests);
    assert!(cached.gateway_cache_hits as f64 > 0.5 * cached.completed as f64, "{}", cached.gateway_cache_hits);
    assert!(
        cached.hot_key_requests * 2 < repl.hot_key_requests,
        "{} vs {}",
        cached.hot_key_requests,
        repl.hot_key_requests
    );
}

/// A flash crowd: the key turns hot within its rise and gets replicas, and the overload of its
/// owner is over (the queue stays a tenth of plain rendezvous's).
#[test]
fn a_flash_crowd_is_replicated_and_the_overload_ends() {
    let requests = 150_000;
    let hrw = run("flash-crowd", Strategy::Rendezvous, requests);
    let repl = run_variant("flash-crowd", Strategy::Rendezvous, &["replicas"], requests);
    assert!(repl.replicas_max >= 3, "{}", repl.replicas_max);
    assert!(repl.max_queue * 10 < hrw.max_queue, "{} vs {}", repl.max_queue, hrw.max_queue);
    assert!((repl.hit_rate - hrw.hit_rate).abs() < 0.03);
}

/// Scale-out with handoff and slow start: the newcomer warms from a trickle, so the hit rate in
/// the 10 s after the join is higher than plain rendezvous's.
#[test]
fn handoff_and_slow_start_keep_the_hit_rate_up_after_a_join() {
    let requests = 200_000;
    let plain = run("scale-out", Strategy::Rendezvous, requests);
    let handoff = run_variant("scale-out", Strategy::Rendezvous, &["handoff"], requests);
    let slow = run_variant("scale-out", Strategy::Rendezvous, &["slow-start"], requests);
    let after = |r: &FleetReport| r.hit_rate_10s_after_change.expect("a change");
    assert!(after(&handoff) > after(&plain) + 0.02, "{} vs {}", after(&handoff), after(&plain));
    assert!(after(&slow) > after(&plain) + 0.02, "{} vs {}", after(&slow), after(&plain));
    assert_eq!(handoff.errors + slow.errors, 0);
}

//! Hot keys: the Space-Saving error bound on every item, sampled rates, the hysteresis of the
//! replication rule, and replicas that are the key's top nodes for every strategy.

use std::collections::HashMap;
use std::time::Duration;

use keyroute::hash::{SplitMix64, mix64};
use keyroute::hot::{Counted, HotKeyConfig, HotKeyDetector, HotKeys, SpaceSaving, Threshold, Window};
use keyroute::{NodeSet, Options, Policy, Strategy};

/// A Zipf(s) sampler over `n` items by inversion of the CDF.
fn zipf(n: usize, s: f64) -> impl FnMut(&mut SplitMix64) -> u64 {
    use keyroute::hash::RandomSource;
    let w: Vec<f64> = (1..=n).map(|i| (i as f64).powf(-s)).collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let cdf: Vec<f64> = w
        .iter()
        .map(|x| {
            acc += x / total;
            acc
        })
        .collect();
    move |rng: &mut SplitMix64| {
        let u = rng.unit_open();
        mix64(cdf.partition_point(|&c| c < u).min(n - 1) as u64)
    }
}

#[test]
fn space_saving_keeps_its_error_bound_on_every_item() {
    for (seed, k, s, n) in
        [(1u64, 16usize, 1.1, 50_000u64), (2, 64, 0.8, 200_000), (3, 64, 1.0, 100_000), (4, 256, 0.6, 100_000)]
    {
        let mut rng = SplitMix64::new(seed);
        let mut next = zipf(20_000, s);
        let mut summary = SpaceSaving::try_new(k).expect("valid");
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for _ in 0..n {
            let h = next(&mut rng);
            summary.offer(h);
            *truth.entry(h).or_default() += 1;
        }
        assert_eq!(summary.total(), n);
        let bound = n / k as u64;
        let top = summary.top();
        assert_eq!(top.len(), k);
        for c in &top {
            let t = truth.get(&c.hash).copied().unwrap_or(0);
            assert!(c.guaranteed() <= t && t <= c.count, "k={k}: {c:?} true {t}");
            assert!(c.error <= bound, "k={k}: error {} > N/k {bound}", c.error);
        }
        let mut frequent = 0;
        for (&h, &t) in &truth {
            if t > bound {
                frequent += 1;
                assert!(summary.get(h).is_some(), "k={k}: an item of count {t} > N/k {bound} is not monitored");
            }
        }
        assert!(frequent > 0, "the stream has frequent items");
        // Counts sum to the items offered (a counter taken over carries its floor).
        assert_eq!(top.iter().map(|c| c.count).sum::<u64>(), n);
    }
}

#[test]
fn a_sampled_detector_estimates_a_hot_keys_rate() {
    // A key at 5% of 200,000 requests, one in 16 sampled, over a Zipf(0.9) background.
    let mut rng = SplitMix64::new(7);
    let mut next = zipf(50_000, 0.9);
    let mut det = HotKeyDetector::try_new(64, 16).expect("valid");
    use keyroute::hash::RandomSource;
    let hot = 0xdead_beef_u64;
    let mut true_hot = 0u64;
    for _ in 0..200_000 {
        let h = if rng.unit_open() < 0.05 {
            true_hot += 1;
            hot
        } else {
            next(&mut rng)
        };
        det.observe(h);
    }
    let w = det.take_window();
    assert_eq!(w.requests, 200_000);
    let c = w.items.iter().find(|c| c.hash == hot).expect("the hot key is found");
    let est = c.guaranteed() as f64;
    // Binomial error of a 1/16 sample of 10,000: sd sqrt(10,000 * 16) = 400, about 4%; allow 3 sd
    // plus the summary's error.
    assert!((est - true_hot as f64).abs() < 0.12 * true_hot as f64 + (16 * 12_500 / 64) as f64, "{est} vs {true_hot}");
    assert_eq!(w.items[0].hash, hot, "the hot key is the top item");
    // The window starts over.
    assert_eq!(det.seen(), 0);
    assert!(det.summary().top().is_empty());
}

/// Determinism: two detectors and rules (two gateways) fed the same request sequence, each a
/// fresh instance, reach the same hot sets second by second. (Gateways that see different shares of
/// the traffic are not claimed to agree: replicas follow each one's own rate.)
#[test]
fn two_gateways_fed_the_same_request_sequence_reach_the_same_hot_sets() {
    let cfg = HotKeyConfig {
        threshold: Threshold::Share(0.02),
        per_replica: 500.0,
        max_replicas: 4,
        hold: Duration::from_secs(3),
        confidence: 0.0,
    };
    let run = || {
        let mut rng = SplitMix64::new(99);
        let mut next = zipf(10_000, 1.0);
        let mut det = HotKeyDetector::try_new(64, 8).expect("valid");
        let mut rule = HotKeys::try_new(cfg).expect("valid");
        let mut sets = Vec::new();
        for sec in 1..=10u64 {
            for _ in 0..20_000 {
                det.observe(next(&mut rng));
            }
            sets.push(rule.tick(Duration::from_secs(sec), &det.take_window()));
        }
        sets
    };
    let a = run();
    assert_eq!(a, run());
    assert!(a.last().is_some_and(|s| !s.is_empty()), "Zipf(1.0) has keys above 2%");
}

#[test]
fn merged_windows_keep_the_bounds() {
    let mut rng = SplitMix64::new(5);
    let mut next = zipf(5_000, 1.0);
    let mut a = SpaceSaving::try_new(32).expect("valid");
    let mut b = SpaceSaving::try_new(32).expect("valid");
    let mut truth: HashMap<u64, u64> = HashMap::new();
    for i in 0..60_000 {
        let h = next(&mut rng);
        if i % 3 == 0 {
            a.offer(h)
        } else {
            b.offer(h)
        }
        *truth.entry(h).or_default() += 1;
    }
    let to_window = |s: &SpaceSaving| Window { requests: s.total(), items: s.top(), sample_every: 1 };
    let mut w = to_window(&a);
    w.merge(&to_window(&b));
    assert_eq!(w.requests, 60_000);
    for c in &w.items {
        let t = truth.get(&c.hash).copied().unwrap_or(0);
        assert!(c.guaranteed() <= t && t <= c.count, "{c:?} true {t}");
    }
}

fn tick_at(rule: &mut HotKeys, sec: u64, rate: u64) -> usize {
    let w = Window { requests: 10_000, items: vec![Counted { hash: 42, count: rate, error: 0 }], sample_every: 1 };
    rule.tick(Duration::from_secs(sec), &w).replicas(42)
}

#[test]
fn replicas_follow_the_rate_with_hysteresis_and_a_hold_time() {
    let cfg = HotKeyConfig {
        threshold: Threshold::Rate(100.0),
        per_replica: 100.0,
        max_replicas: 6,
        hold: Duration::from_secs(5),
        confidence: 0.0,
    };
    let mut rule = HotKeys::try_new(cfg).expect("valid");
    let mut sec = 0;
    let mut at = |rule: &mut HotKeys, rate: u64| {
        sec += 1;
        tick_at(rule, sec, rate)
    };
    // Below the threshold: not hot.
    assert_eq!(at(&mut rule, 99), 0);
    // Enters at T, with the replicas its rate needs.
    assert_eq!(at(&mut rule, 250), 3);
    // Swinging between 0.6 T and 2.9 x per_replica: never leaves, never shrinks below 3.
    let mut seen = Vec::new();
    for r in [60u64, 290, 150, 280, 70, 260, 120] {
        seen.push(at(&mut rule, r));
    }
    assert!(seen.iter().all(|&r| r == 3), "{seen:?}");
    // Grows at once when each of 3 replicas would carry more than per_replica.
    assert_eq!(at(&mut rule, 420), 5);
    // Capped at max_replicas.
    assert_eq!(at(&mut rule, 5_000), 6);
    // A drop right after a change is held.
    assert_eq!(at(&mut rule, 150), 6);
    for _ in 0..3 {
        assert_eq!(at(&mut rule, 150), 6, "held for 5 s");
    }
    // Past the hold, the smoothed rate decides: it falls towards 150, and the replicas shrink one
    // hold at a time while the remaining ones would each carry under half of per_replica: to 4
    // (3 would carry exactly half each), never below.
    let mut later = Vec::new();
    for _ in 0..12 {
        later.push(at(&mut rule, 150));
    }
    assert!(later.windows(2).all(|w| w[1] <= w[0]), "shrinks monotonically: {later:?}");
    assert_eq!(*later.last().expect("some"), 4, "{later:?}");
    // Below T/2, after the hold: leaves.
    let mut gone = None;
    for i in 0..20 {
        if at(&mut rule, 30) == 0 {
            gone = Some(i);
            break;
        }
    }
    assert!(gone.is_some_and(|i| i >= 1), "leaves below T/2 once held: {gone:?}");
}

#[test]
fn a_key_just_under_the_exit_threshold_leaves_only_after_the_hold() {
    let cfg = HotKeyConfig {
        threshold: Threshold::Rate(100.0),
        per_replica: 1_000.0,
        max_replicas: 4,
        hold: Duration::from_secs(10),
        confidence: 0.0,
    };
    let mut rule = HotKeys::try_new(cfg).expect("valid");
    assert_eq!(tick_at(&mut rule, 1, 100), 1);
    // 49 req/s (below T/2) from second 2 on: still hot until 10 s after it entered.
    for sec in 2..11 {
        assert_eq!(tick_at(&mut rule, sec, 49), 1, "second {sec}");
    }
    assert_eq!(tick_at(&mut rule, 11, 49), 0);
    // And 51 req/s (above T/2) never lets it leave.
    let mut rule = HotKeys::try_new(cfg).expect("valid");
    assert_eq!(tick_at(&mut rule, 1, 100), 1);
    for sec in 2..40 {
        assert_eq!(tick_at(&mut rule, sec, 51), 1, "second {sec}");
    }
}

#[test]
fn a_hot_key_is_served_only_by_its_top_replicas_for_every_strategy() {
    let nodes = NodeSet::parse("w1,w2:weight=2,w3,w4,w5,w6:weight=3,w7,w8").expect("valid");
    let mut rng = SplitMix64::new(3);
    use keyroute::hash::RandomSource;
    for s in Strategy::ALL.into_iter().filter(|s| s.uses_key()) {
        let nodes =
            if s == Strategy::Jump { NodeSet::parse("w1,w2,w3,w4,w5,w6,w7,w8").expect("valid") } else { nodes.clone() };
        let p = Policy::build(s, nodes, &Options::default()).expect("builds");
        for key in 0..300u64 {
            let h = mix64(key);
            let r = 2 + (key % 3) as usize;
            let loads: Vec<u64> = (0..8).map(|_| rng.below(20)).collect();
            let top: Vec<usize> = p.ranked(h).take(r).collect();
            let d = p.decide_replicated(h, r, &loads[..], |_| true, &mut rng).expect("a node");
            assert!(top.contains(&d.node), "{s}: {d:?} not in {top:?}");
            assert_eq!(d.owner, p.owner(h), "{s}");
            let per_weight = |i: usize| loads[i] as f64 / f64::from(p.nodes().nodes()[i].weight());
            let best = top.iter().map(|&i| per_weight(i)).fold(f64::INFINITY, f64::min);
            assert_eq!(per_weight(d.node), best, "{s}: not the least loaded of the top {r}");
            // The owner is down: still one of the top r when another is up.
            let o = top[0];
            let d = p.decide_replicated(h, r, &loads[..], |i| i != o, &mut rng).expect("a node");
            assert!(top[1..].contains(&d.node), "{s}: {d:?}");
            // Every replica down: ordinary failover to the first node after them.
            let d = p.decide_replicated(h, r, &loads[..], |i| !top.contains(&i), &mut rng).expect("a node");
            assert_eq!(Some(d.node), p.ranked(h).nth(r), "{s}");
        }
    }
}

#[test]
fn confidence_keeps_lucky_windows_from_making_keys_hot_or_adding_replicas() {
    // A key at a true 45 req/s against a threshold of 60, in windows of 0.5 s: Poisson counts of
    // mean 22.5, one window in ten above 28 (56 req/s), about one in fifty above 31 (62 req/s).
    use keyroute::hash::RandomSource;
    let poisson = |rng: &mut SplitMix64, mean: f64| -> u64 {
        // Knuth's method: fine for means this small.
        let l = (-mean).exp();
        let (mut k, mut p) = (0u64, 1.0);
        loop {
            p *= rng.unit_open();
            if p <= l {
                return k;
            }
            k += 1;
        }
    };
    let run = |z: f64, mean: f64| -> (usize, usize) {
        let cfg = HotKeyConfig {
            threshold: Threshold::Rate(60.0),
            per_replica: 60.0,
            max_replicas: 8,
            hold: Duration::from_secs(5),
            confidence: z,
        };
        let mut rule = HotKeys::try_new(cfg).expect("valid");
        let mut rng = SplitMix64::new(17);
        let (mut hot_windows, mut max_r) = (0, 0);
        for i in 1..=400u64 {
            let c = poisson(&mut rng, mean);
            let w = Window { requests: 10_000, items: vec![Counted { hash: 9, count: c, error: 0 }], sample_every: 1 };
            let r = rule.tick(Duration::from_millis(500 * i), &w).replicas(9);
            hot_windows += usize::from(r > 0);
            max_r = max_r.max(r);
        }
        (hot_windows, max_r)
    };
    let (noisy, _) = run(0.0, 22.5);
    let (sure, _) = run(2.0, 22.5);
    assert!(noisy > 0, "without confidence a 45 req/s key turns hot on lucky windows");
    assert_eq!(sure, 0, "with z = 2 it never does");
    // A key at a true 144 req/s (72 per window) needs ceil(144 / 60) = 3; lucky windows would add a
    // fourth without confidence, never with it.
    let (_, noisy_r) = run(0.0, 72.0);
    let (hot, sure_r) = run(2.0, 72.0);
    assert!(noisy_r >= 4, "{noisy_r}");
    assert!(hot > 390 && (2..=3).contains(&sure_r), "{hot} {sure_r}");
}

/// The first window is as long as it really was once the rule is started: a 100 ms window with 20
/// requests for a key is 200 req/s, not 20 (a gateway that counted it as a second detected a hot
/// key one window late).
#[test]
fn a_started_rule_measures_its_first_window_at_its_length() {
    let cfg = HotKeyConfig {
        threshold: Threshold::Rate(100.0),
        per_replica: 100.0,
        max_replicas: 4,
        hold: Duration::from_secs(1),
        confidence: 0.0,
    };
    let w = Window { requests: 100, items: vec![Counted { hash: 5, count: 20, error: 0 }], sample_every: 1 };
    let mut started = HotKeys::try_new(cfg).expect("valid");
    started.start(Duration::from_secs(3));
    assert_eq!(started.tick(Duration::from_millis(3_100), &w).replicas(5), 2);
    let mut unstarted = HotKeys::try_new(cfg).expect("valid");
    assert_eq!(unstarted.tick(Duration::from_millis(3_100), &w).replicas(5), 0, "counted as one second");
}

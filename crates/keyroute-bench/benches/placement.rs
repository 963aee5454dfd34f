//! Placement speed: keyroute against the most-used peer crates at the same configuration, in one run.
//!
//! Names are hierarchical: `lookup/<strategy>/n=<nodes>` (pre-hashed key), `lookup-keyed/...`
//! (hashing a 10-byte key included), `ranked/<strategy>-top3/n=80`, `build/<strategy>/...`.
//! Peers appear as `<strategy>/<crate>` in the same group. Every loop asserts on its result.
//!
//! `cargo bench -p keyroute-bench --bench placement` (see BENCHMARKS.md for the figures).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use keyroute::hash::{RandomSource, SplitMix64};
use keyroute::{HashRing, JumpHash, Maglev, MovePlan, Node, NodeSet, Placement, Ranking, Rendezvous, SlotTable};

const SIZES: [usize; 3] = [8, 80, 1000];

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("10.0.{}.{}:8080", i / 256, i % 256)).collect()
}

fn node_set(n: usize, weighted: bool) -> NodeSet {
    NodeSet::try_new(names(n).iter().enumerate().map(|(i, name)| {
        let w = if weighted { 1 + (i % 4) as u32 } else { 1 };
        Node::new_unchecked(name).with_weight(w)
    }))
    .expect("unique")
}

fn addrs(n: usize) -> Vec<SocketAddr> {
    (0..n).map(|i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, (i / 256) as u8, (i % 256) as u8)), 8080)).collect()
}

/// 4096 keys like `user:1234567` and their XXH3 hashes.
fn keys() -> (Vec<String>, Vec<u64>) {
    let mut rng = SplitMix64::new(2024);
    let keys: Vec<String> = (0..4096).map(|_| format!("user:{:07}", rng.below(10_000_000))).collect();
    let hashes = keys.iter().map(|k| keyroute::hash::xxh3_64(k.as_bytes())).collect();
    (keys, hashes)
}

#[derive(Hash, PartialEq, Eq, Clone, Debug)]
struct VNode {
    node: usize,
    replica: u32,
}

#[derive(Hash, PartialEq, Eq, Clone, Debug)]
struct Peer(usize);
impl hrw_hash::HrwNode for Peer {}

fn lookup(c: &mut Criterion) {
    let (keys, hashes) = keys();
    let mask = keys.len() - 1;
    let mut g = c.benchmark_group("lookup");
    for n in SIZES {
        let set = node_set(n, false);
        let ring = HashRing::new(set.clone()).expect("ring");
        let hrw = Rendezvous::new(set.clone());
        let mag = Maglev::new(set.clone()).expect("maglev");
        let jump = JumpHash::new(set.clone()).expect("jump");
        let slots = SlotTable::new(set.clone());
        let mut i = 0usize;
        let mut bench = |name: &str, f: &dyn Fn(u64) -> Option<usize>| {
            g.bench_function(BenchmarkId::new(name, format!("n={n}")), |b| {
                b.iter(|| {
                    i = (i + 1) & mask;
                    let r = f(black_box(hashes[i]));
                    assert!(r.is_some());
                    r
                })
            });
        };
        bench("ring", &|h| ring.pick_hash(h));
        bench("rendezvous", &|h| hrw.pick_hash(h));
        bench("maglev", &|h| mag.pick_hash(h));
        bench("jump", &|h| jump.pick_hash(h));
        bench("slots", &|h| slots.pick_hash(h));
        if n == 80 {
            let weighted = Rendezvous::new(node_set(n, true));
            bench("rendezvous-weighted", &|h| weighted.pick_hash(h));
        }
    }
    g.finish();
}

fn lookup_keyed(c: &mut Criterion) {
    let (keys, _) = keys();
    let mask = keys.len() - 1;
    let mut g = c.benchmark_group("lookup-keyed");
    for n in SIZES {
        let set = node_set(n, false);
        let mut i = 0usize;
        let mut bench = |name: &str, f: &dyn Fn(&str) -> bool| {
            g.bench_function(BenchmarkId::new(name, format!("n={n}")), |b| {
                b.iter(|| {
                    i = (i + 1) & mask;
                    assert!(f(black_box(&keys[i])));
                })
            });
        };
        // Rings: 160 points per node.
        let ring = HashRing::new(set.clone()).expect("ring");
        bench("ring/keyroute", &|k| ring.pick(k.as_bytes()).is_some());
        let buckets: Vec<pingora_ketama::Bucket> =
            addrs(n).into_iter().map(|a| pingora_ketama::Bucket::new(a, 1)).collect();
        let ketama = pingora_ketama::Continuum::new(&buckets);
        bench("ring/pingora-ketama", &|k| ketama.node(k.as_bytes()).is_some());
        let mut hashring: hashring::HashRing<VNode> = hashring::HashRing::new();
        for node in 0..n {
            for replica in 0..160 {
                hashring.add(VNode { node, replica });
            }
        }
        bench("ring/hashring", &|k| hashring.get(&k).is_some());
        // Rendezvous.
        let hrw = Rendezvous::new(set.clone());
        bench("rendezvous/keyroute", &|k| hrw.pick(k.as_bytes()).is_some());
        let peer = hrw_hash::HrwNodes::new((0..n).map(Peer));
        bench("rendezvous/hrw-hash", &|k| peer.sorted(&k).next().is_some());
        let mut rz: rendezvous_hash::RendezvousNodes<rendezvous_hash::IdNode<usize>, _> =
            rendezvous_hash::RendezvousNodes::default();
        for node in 0..n {
            rz.insert(rendezvous_hash::IdNode::new(node));
        }
        bench("rendezvous/rendezvous_hash", &|k| rz.calc_candidates(&k).next().is_some());
        // Maglev, M = 65537.
        let mag = Maglev::new(set.clone()).expect("maglev");
        bench("maglev/keyroute", &|k| mag.pick(k.as_bytes()).is_some());
        let peer_mag = maglev::Maglev::new((0..n).collect::<Vec<usize>>());
        bench("maglev/maglev", &|k| maglev::ConsistentHasher::get(&peer_mag, &k).is_some());
        // Jump.
        let jump = JumpHash::new(set.clone()).expect("jump");
        bench("jump/keyroute", &|k| jump.pick(k.as_bytes()).is_some());
        let jh = jumphash::JumpHasher::new();
        bench("jump/jumphash", &|k| jh.slot(&k, n as u32) < n as u32);
    }
    g.finish();
}

fn ranked(c: &mut Criterion) {
    let (keys, hashes) = keys();
    let mask = keys.len() - 1;
    let mut g = c.benchmark_group("ranked");
    let n = 80;
    let set = node_set(n, false);
    let hrw = Rendezvous::new(set.clone());
    let weighted = Rendezvous::new(node_set(n, true));
    let ring = HashRing::new(set.clone()).expect("ring");
    let peer = hrw_hash::HrwNodes::new((0..n).map(Peer));
    let mut rz: rendezvous_hash::RendezvousNodes<rendezvous_hash::IdNode<usize>, _> =
        rendezvous_hash::RendezvousNodes::default();
    for node in 0..n {
        rz.insert(rendezvous_hash::IdNode::new(node));
    }
    let mut hashring: hashring::HashRing<usize> = hashring::HashRing::new();
    for node in 0..n {
        hashring.add(node);
    }
    let mut i = 0usize;
    let mut bench = |name: &str, f: &dyn Fn(usize) -> usize| {
        g.bench_function(BenchmarkId::new(name, format!("n={n}")), |b| {
            b.iter(|| {
                i = (i + 1) & mask;
                assert_eq!(f(black_box(i)), 3);
            })
        });
    };
    bench("rendezvous-top3", &|i| hrw.ranked_hash(hashes[i]).take(3).count());
    bench("rendezvous-weighted-top3", &|i| weighted.ranked_hash(hashes[i]).take(3).count());
    bench("ring-top3", &|i| ring.ranked_hash(hashes[i]).take(3).count());
    bench("rendezvous-top3-keyed/keyroute", &|i| hrw.ranked(keys[i].as_bytes()).take(3).count());
    bench("rendezvous-top3-keyed/hrw-hash", &|i| peer.sorted(&keys[i]).take(3).count());
    bench("rendezvous-top3-keyed/rendezvous_hash", &|i| rz.calc_candidates(&keys[i]).take(3).count());
    bench("ring-top3-keyed/hashring", &|i| hashring.get_with_replicas(&keys[i], 2).map_or(0, |v| v.len()));
    g.finish();
}

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("build");
    g.sample_size(20);
    let set = node_set(1000, false);
    g.bench_function("ring/n=1000,v=160", |b| {
        b.iter(|| {
            let r = HashRing::new(black_box(set.clone())).expect("ring");
            assert_eq!(r.point_count(), 160_000);
        })
    });
    let buckets: Vec<pingora_ketama::Bucket> =
        addrs(1000).into_iter().map(|a| pingora_ketama::Bucket::new(a, 1)).collect();
    g.bench_function("ring/n=1000,v=160/pingora-ketama", |b| {
        b.iter(|| {
            let r = pingora_ketama::Continuum::new(black_box(&buckets));
            assert!(r.node(b"k").is_some());
        })
    });
    g.bench_function("maglev/n=1000,m=65537", |b| {
        b.iter(|| {
            let m = Maglev::new(black_box(set.clone())).expect("maglev");
            assert_eq!(m.size(), 65_537);
        })
    });
    g.bench_function("maglev/n=1000,m=65537/maglev", |b| {
        b.iter(|| {
            let m = maglev::Maglev::with_capacity((0..1000usize).collect::<Vec<_>>(), 65_537);
            assert_eq!(maglev::ConsistentHasher::capacity(&m), 65_537);
        })
    });
    g.bench_function("rendezvous/n=1000", |b| {
        b.iter(|| {
            let r = Rendezvous::new(black_box(set.clone()));
            assert_eq!(r.live_count(), 1000);
        })
    });
    let slots = SlotTable::new(node_set(100, false));
    let grown = node_set(101, false);
    g.bench_function("slots/n=8", |b| {
        let set = node_set(8, false);
        b.iter(|| SlotTable::new(black_box(set.clone())))
    });
    g.bench_function("slots-plan/n=100->101", |b| {
        b.iter(|| {
            let plan = MovePlan::between(&slots, &SlotTable::new(black_box(grown.clone())));
            assert!(!plan.is_empty());
        })
    });
    g.finish();
}

/// The hot-key detector's cost per request: a Zipf(1.0) stream of 4,096 key hashes with a hot key
/// at 10% of it, `k = 64` counters, one request in 16 sampled. `observe` is the library's
/// single-owner detector; `observe-shared` is the gateway's path (a per-thread counter, and a
/// mutex taken only for the sampled request).
fn hot(c: &mut Criterion) {
    use keyroute::hot::{HotKeyDetector, SpaceSaving};
    use std::sync::Mutex;
    let mut rng = SplitMix64::new(11);
    // Zipf(1.0) over 4,096 keys by inversion of the harmonic CDF, plus a hot key at 10%.
    let n = 4096usize;
    let h: Vec<f64> = (1..=n).map(|i| 1.0 / i as f64).collect();
    let total: f64 = h.iter().sum();
    let mut cdf = Vec::with_capacity(n);
    let mut acc = 0.0;
    for x in &h {
        acc += x / total;
        cdf.push(acc);
    }
    let stream: Vec<u64> = (0..65_536)
        .map(|_| {
            if rng.unit_open() < 0.1 {
                return u64::MAX;
            }
            let u = rng.unit_open();
            let i = cdf.partition_point(|&c| c < u).min(n - 1);
            keyroute::hash::mix64(i as u64)
        })
        .collect();
    let mask = stream.len() - 1;
    let mut g = c.benchmark_group("hot");
    let mut det = HotKeyDetector::try_new(64, 16).expect("valid");
    let mut i = 0usize;
    g.bench_function("observe/k=64,s=16", |b| {
        b.iter(|| {
            i = (i + 1) & mask;
            det.observe(black_box(stream[i]));
        })
    });
    let shared = Mutex::new(SpaceSaving::try_new(64).expect("valid"));
    let mut seen = 0u64;
    g.bench_function("observe-shared/k=64,s=16", |b| {
        b.iter(|| {
            i = (i + 1) & mask;
            seen += 1;
            if seen.is_multiple_of(16)
                && let Ok(mut s) = shared.try_lock()
            {
                s.offer(black_box(stream[i]));
            }
        })
    });
    let mut ss = SpaceSaving::try_new(64).expect("valid");
    g.bench_function("offer/k=64", |b| {
        b.iter(|| {
            i = (i + 1) & mask;
            ss.offer(black_box(stream[i]));
        })
    });
    let window = det.take_window();
    let mut rule = keyroute::hot::HotKeys::try_new(keyroute::hot::HotKeyConfig {
        threshold: keyroute::hot::Threshold::Share(0.05),
        per_replica: 100.0,
        max_replicas: 4,
        hold: Duration::from_secs(5),
        confidence: 2.0,
    })
    .expect("valid");
    let set = rule.tick(Duration::from_secs(1), &window);
    g.bench_function("hotset-lookup/miss", |b| {
        b.iter(|| {
            i = (i + 1) & mask;
            black_box(set.replicas(black_box(stream[i] ^ 1)))
        })
    });
    g.finish();
}

/// Compatibility modes: each mode's pick of a 12-byte key (its own key hash included) and its
/// build, over 80 addresses, next to keyroute's native ring and rendezvous and, for nginx's scheme,
/// pingora-ketama. Redis Cluster's keyslot alone too.
fn compat(c: &mut Criterion) {
    use keyroute::compat::redis::key_slot;
    use keyroute::compat::{CompatOptions, CompatTable, Mode};
    let (keys, _) = keys();
    let mask = keys.len() - 1;
    let mut g = c.benchmark_group("compat");
    let mut i = 0usize;
    g.bench_function("redis-keyslot", |b| {
        b.iter(|| {
            i = (i + 1) & mask;
            let s = key_slot(black_box(keys[i].as_bytes()));
            assert!(s < 16_384);
            s
        })
    });
    let set = node_set(80, false);
    let options = CompatOptions::default();
    let mut pick = |name: &str, f: &dyn Fn(&str) -> bool| {
        g.bench_function(format!("{name}/pick-keyed/n=80"), |b| {
            b.iter(|| {
                i = (i + 1) & mask;
                assert!(f(black_box(&keys[i])));
            })
        });
    };
    for mode in Mode::ALL {
        let t = CompatTable::build(mode, set.clone(), &options).expect("valid");
        pick(mode.name(), &|k| t.pick(k.as_bytes()).is_some());
    }
    let buckets: Vec<pingora_ketama::Bucket> =
        addrs(80).into_iter().map(|a| pingora_ketama::Bucket::new(a, 1)).collect();
    let ketama = pingora_ketama::Continuum::new(&buckets);
    // Like for like: pingora-ketama reproduces nginx's scheme, so both place every key alike.
    let nginx = CompatTable::build(Mode::Nginx, set.clone(), &options).expect("valid");
    for k in &keys {
        let ours = nginx.pick(k.as_bytes()).map(|n| n.name().to_owned());
        assert_eq!(ours, ketama.node(k.as_bytes()).map(|a| a.to_string()), "key {k}");
    }
    pick("nginx/pingora-ketama", &|k| ketama.node(k.as_bytes()).is_some());
    let ring = HashRing::new(set.clone()).expect("ring");
    pick("native-ring", &|k| ring.pick(k.as_bytes()).is_some());
    let hrw = Rendezvous::new(set.clone());
    pick("native-rendezvous", &|k| hrw.pick(k.as_bytes()).is_some());
    g.sample_size(20);
    for mode in Mode::ALL {
        g.bench_function(format!("{}/build/n=80", mode.name()), |b| {
            b.iter(|| CompatTable::build(mode, black_box(set.clone()), &options).expect("valid"))
        });
    }
    g.bench_function("nginx/pingora-ketama/build/n=80", |b| {
        b.iter(|| pingora_ketama::Continuum::new(black_box(&buckets)))
    });
    g.bench_function("native-ring/build/n=80", |b| b.iter(|| HashRing::new(black_box(set.clone())).expect("ring")));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2)).sample_size(30);
    targets = lookup, lookup_keyed, ranked, build, hot, compat
}
criterion_main!(benches);

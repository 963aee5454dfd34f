//! A tight loop over one placement operation, for `perf` and quick comparisons (criterion's
//! harness and the peers' set-up dominate a profile of the benchmark binary).
//!
//! `cargo run --release -p keyroute-bench --example placement_loop -- [OPERATION] [NODES] [SECONDS]`,
//! OPERATION one of `rendezvous`, `rendezvous-keyed`, `rendezvous-weighted`, `top3`, `top3-weighted`,
//! `ring`, `ring-keyed`, `ring-build`. Prints the best of five rounds in ns per operation.

use std::hint::black_box;
use std::time::{Duration, Instant};

use keyroute::hash::{RandomSource, SplitMix64};
use keyroute::{HashRing, Node, NodeSet, Placement, Ranking, Rendezvous};

fn node_set(n: usize, weighted: bool) -> NodeSet {
    NodeSet::try_new((0..n).map(|i| {
        let w = if weighted { 1 + (i % 4) as u32 } else { 1 };
        Node::new_unchecked(&format!("10.0.{}.{}:8080", i / 256, i % 256)).with_weight(w)
    }))
    .expect("unique names")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let op = args.next().unwrap_or_else(|| "rendezvous".into());
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(80);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let mut rng = SplitMix64::new(2024);
    let keys: Vec<String> = (0..4096).map(|_| format!("user:{:07}", rng.below(10_000_000))).collect();
    let hashes: Vec<u64> = keys.iter().map(|k| keyroute::hash::xxh3_64(k.as_bytes())).collect();
    let weighted = op.ends_with("weighted");
    let set = node_set(n, weighted);
    let hrw = Rendezvous::new(set.clone());
    let ring = HashRing::new(set.clone()).expect("ring");
    let one: Box<dyn Fn(usize) -> usize> = match op.as_str() {
        "rendezvous" | "rendezvous-weighted" => Box::new(|i| hrw.pick_hash(hashes[i]).unwrap_or(0)),
        "rendezvous-keyed" => Box::new(|i| hrw.pick(keys[i].as_bytes()).map_or(0, |_| 1)),
        "top3" | "top3-weighted" => Box::new(|i| hrw.ranked_hash(hashes[i]).take(3).sum()),
        "ring" => Box::new(|i| ring.pick_hash(hashes[i]).unwrap_or(0)),
        "ring-keyed" => Box::new(|i| ring.pick(keys[i].as_bytes()).map_or(0, |_| 1)),
        "ring-build" => Box::new(|_| HashRing::new(black_box(set.clone())).map_or(0, |r| r.point_count())),
        other => {
            eprintln!("unknown operation {other}");
            std::process::exit(2);
        }
    };
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let mut ops = 0u64;
        let mut sink = 0usize;
        while start.elapsed() < Duration::from_secs_f64(secs / 5.0) {
            for i in 0..256 {
                sink = sink.wrapping_add(one(black_box((ops as usize + i) & 4095)));
            }
            ops += 256;
        }
        black_box(sink);
        best = best.min(start.elapsed().as_nanos() as f64 / ops as f64);
    }
    println!("{op} n={n}: {best:.2} ns/op");
}

//! Builds the same 1000-node ring (160 points a node) with keyroute and with pingora-ketama, in
//! alternating rounds in one process, so both see the same machine: prints each round's times and
//! the ratio of the medians. Criterion runs the two one after the other, and on a noisy machine
//! that alone moves their ratio by 20%.
//!
//! `cargo run --release -p keyroute-bench --example ring_build_pair -- [ROUNDS] [NODES]`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use keyroute::{HashRing, Node, NodeSet};

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(15);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let addrs: Vec<SocketAddr> = (0..n)
        .map(|i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, (i / 256) as u8, (i % 256) as u8)), 8080))
        .collect();
    let set = NodeSet::try_new(addrs.iter().map(|a| Node::new_unchecked(&a.to_string()))).expect("unique");
    let buckets: Vec<pingora_ketama::Bucket> = addrs.iter().map(|&a| pingora_ketama::Bucket::new(a, 1)).collect();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = Instant::now();
        let ring = HashRing::new(black_box(set.clone())).expect("ring");
        let a = t.elapsed().as_secs_f64() * 1e3;
        assert_eq!(ring.point_count(), 160 * n);
        drop(ring);
        let t = Instant::now();
        let c = pingora_ketama::Continuum::new(black_box(&buckets));
        let b = t.elapsed().as_secs_f64() * 1e3;
        assert!(c.node(b"k").is_some());
        drop(c);
        // The first round of each warms the allocator and the caches.
        if round > 0 {
            ours.push(a);
            theirs.push(b);
        }
        println!("round {round}: keyroute {a:.3} ms, pingora-ketama {b:.3} ms, ratio {:.3}", a / b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (a, b) = (median(&mut ours), median(&mut theirs));
    println!("median: keyroute {a:.3} ms, pingora-ketama {b:.3} ms, ratio {:.3}", a / b);
}

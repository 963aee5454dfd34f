//! Compatibility modes against golden vectors from the real programs (`testdata/compat/`, each
//! directory with the script that regenerates it and the version it ran).

use keyroute::compat::redis::{RedisCluster, key_slot};
use keyroute::{Node, NodeSet, Placement};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty())
}

#[test]
fn redis_keyslots_equal_redis_server() {
    let text = include_str!("../testdata/compat/redis/keyslots.tsv");
    let mut n = 0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (hex, slot) = line.split_once('\t').expect("two fields");
        let key = unhex(hex);
        assert_eq!(u32::from(key_slot(&key)), slot.parse::<u32>().expect("slot"), "key {key:?}");
        n += 1;
    }
    assert!(n >= 5_000, "{n} keys");
}

#[test]
fn redis_cluster_layouts_equal_redis_cli_create() {
    let text = include_str!("../testdata/compat/redis/layouts.tsv");
    let mut cases = 0;
    for line in lines(text) {
        let (names, slots) = line.split_once('\t').expect("two fields");
        let names: Vec<&str> = names.split(',').collect();
        let nodes = NodeSet::try_new(names.iter().map(|n| Node::new_unchecked(n))).expect("unique");
        let cluster = RedisCluster::new(nodes).expect("3 or more masters");
        let mut mine: Vec<String> = vec![String::new(); names.len()];
        for (range, node) in cluster.ranges() {
            mine[node] = format!("{}-{}", range.start(), range.end());
        }
        let real: Vec<&str> = slots.split(';').collect();
        assert_eq!(mine, real, "{names:?}");
        // And every slot's owner through the Placement trait.
        for (i, r) in real.iter().enumerate() {
            let (a, b) = r.split_once('-').expect("a range");
            for slot in [a.parse::<u64>().expect("slot"), b.parse::<u64>().expect("slot")] {
                assert_eq!(cluster.pick_hash(slot), Some(i), "slot {slot} of {names:?}");
            }
        }
        cases += 1;
    }
    assert!(cases >= 9, "{cases} layouts");
}

#[test]
fn groupcache_equals_golang_groupcache() {
    use keyroute::compat::groupcache::GroupcacheRing;
    let text = include_str!("../testdata/compat/groupcache/golden.tsv");
    let mut ring: Option<(GroupcacheRing, Vec<String>)> = None;
    let (mut keys, mut cases) = (0, 0);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some(case) = line.strip_prefix("case ") {
            let (replicas, names) = case.split_once('\t').expect("two fields");
            let names: Vec<String> = names.split(',').map(str::to_owned).collect();
            let nodes = NodeSet::try_new(names.iter().map(|n| Node::new_unchecked(n))).expect("unique");
            ring = Some((GroupcacheRing::new(nodes, replicas.parse().expect("replicas")).expect("valid"), names));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let (r, names) = ring.as_ref().expect("a case first");
        let got = r.pick(&unhex(hex)).map(|n| n.name().to_owned());
        assert_eq!(got.as_deref(), Some(want), "key {hex} on {names:?}");
        keys += 1;
    }
    assert_eq!((cases, keys), (6, 24_000));
}

#[test]
fn guava_consistent_hash_equals_guava() {
    use keyroute::compat::guava::{GuavaInput, consistent_hash, key_input};
    let text = include_str!("../testdata/compat/guava/golden.txt");
    let mut n = 0;
    for line in lines(text) {
        let f: Vec<&str> = line.split(' ').collect();
        let buckets: u32 = f[2].parse().expect("buckets");
        let want: u32 = f[3].parse().expect("bucket");
        let key = || if f[1] == "-" { Vec::new() } else { unhex(f[1]) };
        let input = match f[0] {
            "murmur3" => key_input(&key(), GuavaInput::Murmur3_128),
            "md5" => key_input(&key(), GuavaInput::Md5),
            _ => f[1].parse::<i64>().expect("a long"),
        };
        assert_eq!(consistent_hash(input, buckets), want, "{line}");
        n += 1;
    }
    assert!(n >= 13_000, "{n} lines");
}

#[test]
fn libketama_equals_libketama() {
    use keyroute::compat::libketama::Libketama;
    let text = include_str!("../testdata/compat/libketama/golden.tsv");
    let mut ring: Option<Libketama> = None;
    let (mut keys, mut cases) = (0, 0);
    for line in lines(text) {
        if let Some(case) = line.strip_prefix("case ") {
            let nodes = NodeSet::try_new(case.split(',').map(|s| {
                let (addr, w) = s.rsplit_once(':').expect("ADDR:WEIGHT");
                Node::new_unchecked(addr).with_weight(w.parse().expect("weight"))
            }))
            .expect("unique");
            ring = Some(Libketama::new(nodes).expect("valid"));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let r = ring.as_ref().expect("a case first");
        assert_eq!(r.pick(&unhex(hex)).map(Node::name), Some(want), "key {hex}, case {cases}");
        keys += 1;
    }
    assert_eq!((cases, keys), (8, 24_000));
}

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

#[test]
fn twemproxy_equals_nutcracker() {
    use keyroute::compat::twemproxy::Twemproxy;
    let text = include_str!("../testdata/compat/twemproxy/golden.tsv");
    let mut table: Option<(Twemproxy, Vec<String>)> = None;
    let (mut keys, mut cases, mut ejected) = (0, 0, 0);
    for line in lines(text) {
        if let Some(case) = line.strip_prefix("case ") {
            let mut rest = case;
            let mut tag = None;
            let mut eject = None;
            while let Some((word, after)) = rest.split_once(' ') {
                if let Some(t) = word.strip_prefix("hash_tag=") {
                    tag = Some(<[u8; 2]>::try_from(t.as_bytes()).expect("two tag bytes"));
                } else if let Some(e) = word.strip_prefix("eject=") {
                    eject = Some(e.to_owned());
                } else {
                    break;
                }
                rest = after;
            }
            // `host:port:weight [name]`: the node is the name when given, else `host:port`.
            let servers: Vec<String> = rest.split(',').map(str::to_owned).collect();
            let nodes = NodeSet::try_new(servers.iter().map(|s| {
                let (addr, name) = s.split_once(' ').map_or((s.as_str(), None), |(a, n)| (a, Some(n)));
                let (hostport, weight) = addr.rsplit_once(':').expect("host:port:weight");
                Node::new_unchecked(name.unwrap_or(hostport)).with_weight(weight.parse().expect("weight"))
            }))
            .expect("unique");
            let mut t = Twemproxy::new(nodes, tag).expect("valid");
            if let Some(e) = eject {
                let dead = servers.iter().position(|s| *s == e).expect("the ejected server is listed");
                t = t.ejecting(&[dead]).expect("servers left");
                ejected += 1;
            }
            table = Some((t, servers));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let (t, servers) = table.as_ref().expect("a case first");
        let got = t.pick_hash(t.key_hash(&unhex(hex))).map(|i| servers[i].as_str());
        assert_eq!(got, Some(want), "key {hex} on {servers:?}");
        keys += 1;
    }
    assert_eq!((cases, ejected), (12, 1));
    assert!(keys >= 12 * 4_900, "{keys} keys");
}

#[test]
fn haproxy_equals_haproxy() {
    use keyroute::compat::haproxy::{HaproxyHash, HaproxyRing, first_value};
    let text = include_str!("../testdata/compat/haproxy/golden.tsv");
    let mut ring: Option<(HaproxyRing, bool, String)> = None;
    let (mut keys, mut cases) = (0, 0);
    for line in lines(text) {
        if let Some(case) = line.strip_prefix("case ") {
            let (first, case) = match case.strip_prefix("first-value ") {
                Some(rest) => (true, rest),
                None => (false, case),
            };
            let mut words = case.split(' ');
            let function = words.next().expect("a function");
            let avalanche = words.next().expect("avalanche or plain");
            let servers = words.next().expect("servers");
            let words = if avalanche == "avalanche" { format!("{function} avalanche") } else { function.to_owned() };
            let hash = HaproxyHash::parse(&words).expect("a known function");
            let nodes = NodeSet::try_new(servers.split(',').map(|s| {
                let (id, weight) = s.split_once(':').expect("id:weight");
                Node::new_unchecked(&format!("s{id}"))
                    .with_id(id.parse().expect("id"))
                    .with_weight(weight.parse().expect("weight"))
            }))
            .expect("unique");
            ring = Some((HaproxyRing::new(nodes, hash).expect("valid"), first, case.to_owned()));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let (r, first, case) = ring.as_ref().expect("a case first");
        let value = unhex(hex);
        let key = if *first { first_value(&value) } else { &value[..] };
        let got = r.pick_hash(r.key_hash(key)).map(|i| r.ids()[i].to_string());
        assert_eq!(got.as_deref(), Some(want), "key {hex} on {case}");
        keys += 1;
    }
    assert_eq!(cases, 64);
    assert!(keys >= 9 * 5_000, "{keys} keys");
}

#[test]
fn nginx_equals_nginx() {
    use keyroute::compat::nginx::NginxHash;
    let text = include_str!("../testdata/compat/nginx/golden.tsv");
    let mut ring: Option<NginxHash> = None;
    let (mut keys, mut cases) = (0, 0);
    for line in lines(text) {
        if let Some(case) = line.strip_prefix("case ") {
            let nodes = NodeSet::try_new(case.split(' ').map(|s| {
                let (text, weight) = s.rsplit_once('=').expect("TEXT=WEIGHT");
                Node::new_unchecked(text).with_weight(weight.parse().expect("weight"))
            }))
            .expect("unique");
            ring = Some(NginxHash::new(nodes).expect("valid"));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let r = ring.as_ref().expect("a case first");
        let got = r.pick(&unhex(hex)).map(Node::name);
        assert_eq!(got, Some(want), "key {hex}");
        keys += 1;
    }
    assert_eq!((cases, keys), (10, 10 * 5_358));
}

/// Envoy cannot run here: these vectors are keyroute's own (see `testdata/compat/envoy/`), a lock
/// against regressions, not a proof of equality with Envoy. The reference figures of the
/// specification (ring sizes, Maglev entries) are checked in the module's unit tests.
#[test]
fn envoy_modes_keep_their_regression_vectors() {
    use keyroute::compat::{CompatOptions, CompatTable, Mode};
    let text = include_str!("../testdata/compat/envoy/golden.tsv");
    let mut table: Option<CompatTable> = None;
    let (mut keys, mut cases) = (0, 0);
    for line in lines(text) {
        if let Some(case) = line.strip_prefix("case ") {
            let (mode, servers) = case.split_once(' ').expect("mode and servers");
            let nodes = NodeSet::try_new(servers.split(',').map(|s| {
                let (name, weight) = s.rsplit_once('=').expect("NAME=WEIGHT");
                Node::new_unchecked(name).with_weight(weight.parse().expect("weight"))
            }))
            .expect("unique");
            let mode: Mode = mode.parse().expect("a mode");
            table = Some(CompatTable::build(mode, nodes, &CompatOptions::default()).expect("valid"));
            cases += 1;
            continue;
        }
        let (hex, want) = line.split_once('\t').expect("two fields");
        let got = table.as_ref().expect("a case first").pick(&unhex(hex)).map(Node::name);
        assert_eq!(got, Some(want), "key {hex}");
        keys += 1;
    }
    assert_eq!((cases, keys), (12, 12 * 1_804));
}

//! Golden vectors: the placement contract, checked against values produced by independent
//! implementations (`testdata/generate.py`: Python's xxhash and hashlib, the paper's C++ jump hash,
//! the Java sketch of the consistent-hashing note). See `testdata/README.md`.

use keyroute::hash::{self, KeyHasher};
use keyroute::jump::jump_consistent_hash;
use keyroute::slots::{crc16, hash_tag, key_slot};
use keyroute::{HashRing, Maglev, NodeSet, Placement, Ranking, Rendezvous, RingScheme};

const HASH: &str = include_str!("../testdata/hash.tsv");
const SLOTS: &str = include_str!("../testdata/slots.tsv");
const PLACEMENT: &str = include_str!("../testdata/placement.tsv");
const JUMP: &str = include_str!("../testdata/jump.tsv");
const JAVA: &str = include_str!("../testdata/java_sketch.out");

fn rows(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').collect())
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn hex64(s: &str) -> u64 {
    u64::from_str_radix(s, 16).expect("hex")
}

#[test]
fn key_hashes() {
    let mut n = 0;
    for r in rows(HASH) {
        let key = unhex(r[0]);
        assert_eq!(hash::xxh3_64(&key), hex64(r[1]), "xxh3 of {:?}", r[0]);
        assert_eq!(KeyHasher::default().hash(&key), hex64(r[1]));
        assert_eq!(hash::xxh3_64_with_seed(&key, hash::NODE_SEED), hex64(r[2]));
        assert_eq!(hash::md5_64(&key), hex64(r[3]));
        assert_eq!(KeyHasher::Md5.hash(&key), hex64(r[3]));
        assert_eq!(hash::mix64(hash::xxh3_64(&key)), hex64(r[4]));
        n += 1;
    }
    assert!(n > 60);
}

#[test]
fn redis_slots() {
    for r in rows(SLOTS) {
        let key = unhex(r[0]);
        assert_eq!(crc16(hash_tag(&key)), u16::from_str_radix(r[1], 16).expect("hex"));
        assert_eq!(key_slot(&key).to_string(), r[2]);
    }
}

#[test]
fn jump_matches_the_reference_code() {
    let mut n = 0;
    for r in rows(JUMP) {
        let key: u64 = r[0].parse().expect("u64");
        let buckets: u32 = r[1].parse().expect("u32");
        assert_eq!(jump_consistent_hash(key, buckets).to_string(), r[2], "key {key} buckets {buckets}");
        n += 1;
    }
    assert!(n > 300);
}

#[test]
fn placements_and_rankings() {
    let mut checked = 0;
    for r in rows(PLACEMENT) {
        let (strategy, spec, key, expected) = (r[0], r[1], unhex(r[2]), r.get(3).copied().unwrap_or(""));
        let nodes = NodeSet::parse(spec).expect("valid spec");
        let names = |it: &mut dyn Iterator<Item = usize>| {
            it.map(|i| nodes.nodes()[i].name().to_owned()).collect::<Vec<_>>().join(",")
        };
        let got = match strategy {
            "rendezvous" => names(&mut Rendezvous::new(nodes.clone()).ranked(&key)),
            "ring" => names(&mut HashRing::new(nodes.clone()).expect("ok").ranked(&key)),
            "ring-java-md5-100" => names(
                &mut HashRing::builder()
                    .vnodes(100)
                    .scheme(RingScheme::JavaMd5)
                    .build(nodes.clone())
                    .expect("ok")
                    .ranked(&key),
            ),
            "maglev" => names(&mut Maglev::new(nodes.clone()).expect("ok").pick_index(&key).into_iter()),
            other => panic!("unknown strategy {other} in placement.tsv"),
        };
        assert_eq!(got, expected, "{strategy} on {spec} for key {}", r[2]);
        checked += 1;
    }
    assert!(checked > 1000);
}

#[test]
fn java_sketch_preference_lists() {
    // `nodesFor(key, 3)` of the note's Java sketch on A, B, C, D with 100 virtual nodes, as printed
    // by running it (testdata/java/Figures.java).
    let ring = HashRing::builder()
        .vnodes(100)
        .scheme(RingScheme::JavaMd5)
        .build(NodeSet::parse("A,B,C,D").expect("v"))
        .expect("ok");
    let mut n = 0;
    for line in JAVA.lines().filter(|l| l.starts_with("user:")) {
        let (key, list) = line.split_once(' ').expect("key and list");
        let expected = list.trim_matches(['[', ']']).replace(' ', "");
        let got: Vec<&str> = ring.preference_list(key.as_bytes(), 3).iter().map(|n| n.name()).collect();
        assert_eq!(got.join(","), expected, "{key}");
        n += 1;
    }
    assert_eq!(n, 20);
}

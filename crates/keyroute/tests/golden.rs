//! Golden vectors: the placement contract, checked against values produced by independent
//! implementations (`testdata/generate.py`: Python's xxhash and hashlib, the paper's C++ jump hash,
//! the Java sketch of the consistent-hashing note). See `testdata/README.md`.

use std::collections::HashMap;

use keyroute::hash::{self, KeyHasher};
use keyroute::jump::jump_consistent_hash;
use keyroute::slots::{crc16, hash_tag, key_slot};
use keyroute::{HashRing, Maglev, NodeSet, Placement, Ranking, Rendezvous, RingScheme, SlotTable};

const HASH: &str = include_str!("../testdata/hash.tsv");
const SLOTS: &str = include_str!("../testdata/slots.tsv");
const PLACEMENT: &str = include_str!("../testdata/placement.tsv");
const JUMP: &str = include_str!("../testdata/jump.tsv");
const JAVA: &str = include_str!("../testdata/java_sketch.out");
const PLACEMENT_LARGE: &str = include_str!("../testdata/placement_large.tsv");
const SLOT_TABLE: &str = include_str!("../testdata/slot_table.tsv");

/// The data rows of a golden file, each with exactly `columns` tab-separated fields. Every test
/// also checks how many rows it compared: an empty or truncated file must fail, not pass.
fn rows(text: &str, columns: usize) -> impl Iterator<Item = Vec<&str>> {
    text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(move |l| {
        let r: Vec<&str> = l.split('\t').collect();
        assert_eq!(r.len(), columns, "a golden row with {} fields, expected {columns}: {l:?}", r.len());
        r
    })
}

/// `generate.py`'s keys: seven special ones and `user:0` to `user:59`.
const KEYS: usize = 7 + 60;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn hex64(s: &str) -> u64 {
    u64::from_str_radix(s, 16).expect("hex")
}

#[test]
fn key_hashes() {
    let mut n = 0;
    for r in rows(HASH, 5) {
        let key = unhex(r[0]);
        assert_eq!(hash::xxh3_64(&key), hex64(r[1]), "xxh3 of {:?}", r[0]);
        assert_eq!(KeyHasher::default().hash(&key), hex64(r[1]));
        assert_eq!(hash::xxh3_64_with_seed(&key, hash::NODE_SEED), hex64(r[2]));
        assert_eq!(hash::md5_64(&key), hex64(r[3]));
        assert_eq!(KeyHasher::Md5.hash(&key), hex64(r[3]));
        assert_eq!(hash::mix64(hash::xxh3_64(&key)), hex64(r[4]));
        n += 1;
    }
    assert_eq!(n, KEYS);
}

#[test]
fn redis_slots() {
    let mut n = 0;
    for r in rows(SLOTS, 3) {
        let key = unhex(r[0]);
        assert_eq!(crc16(hash_tag(&key)), u16::from_str_radix(r[1], 16).expect("hex"));
        assert_eq!(key_slot(&key).to_string(), r[2]);
        n += 1;
    }
    assert_eq!(n, KEYS + 6); // and six hash-tag cases
}

#[test]
fn jump_matches_the_reference_code() {
    let mut n = 0;
    for r in rows(JUMP, 3) {
        let key: u64 = r[0].parse().expect("u64");
        let buckets: u32 = r[1].parse().expect("u32");
        assert_eq!(jump_consistent_hash(key, buckets).to_string(), r[2], "key {key} buckets {buckets}");
        n += 1;
    }
    assert_eq!(n, 5 + 40 * 8);
}

#[test]
fn slot_tables_match_the_reference() {
    let mut sets = 0;
    let mut capped = 0;
    for r in rows(SLOT_TABLE, 3) {
        let (spec, bumped, owners) = (r[0], r[1].parse::<usize>().expect("a count"), r[2].as_bytes());
        let nodes = NodeSet::parse(spec).expect("valid spec");
        let width = if nodes.len() <= 36 { 1 } else { 2 };
        assert_eq!(owners.len(), 16384 * width, "{spec}: one owner per slot");
        let digit = |b: u8| char::from(b).to_digit(36).expect("base 36") as usize;
        // Listed in another order, the table must be the same: compare by name.
        let reversed = NodeSet::try_new(nodes.nodes().iter().rev().cloned()).expect("valid");
        let (t, tr) = (SlotTable::new(nodes.clone()), SlotTable::new(reversed));
        for slot in 0..16384u16 {
            let at = usize::from(slot) * width;
            let want = owners[at..at + width].iter().fold(0, |acc, &b| acc * 36 + digit(b));
            let want = nodes.nodes()[want].name();
            assert_eq!(t.slot_owner_name(slot), Some(want), "{spec}: slot {slot}");
            assert_eq!(tr.slot_owner_name(slot), Some(want), "{spec} reversed: slot {slot}");
        }
        sets += 1;
        capped += usize::from(bumped > 0);
    }
    assert_eq!(sets, 6);
    // At least one golden set exercises the caps.
    assert!(capped >= 1);
}

#[test]
fn placements_and_rankings() {
    let mut checked: HashMap<&str, usize> = HashMap::new();
    for r in rows(PLACEMENT, 4) {
        let (strategy, spec, key, expected) = (r[0], r[1], unhex(r[2]), r[3]);
        assert!(!expected.is_empty(), "every golden set has live nodes: {r:?}");
        let nodes = NodeSet::parse(spec).expect("valid spec");
        let names = |it: &mut dyn Iterator<Item = usize>| {
            it.map(|i| nodes.nodes()[i].name().to_owned()).collect::<Vec<_>>().join(",")
        };
        let got = match strategy {
            "rendezvous" => {
                let t = Rendezvous::new(nodes.clone());
                let owner = t.pick(&key).map(|n| n.name());
                assert_eq!(owner, expected.split(',').next(), "rendezvous pick on {spec} for key {}", r[2]);
                names(&mut t.ranked(&key))
            }
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
        *checked.entry(strategy).or_default() += 1;
    }
    // Four node sets, every key, four strategies.
    let per_strategy = 4 * KEYS;
    for s in ["rendezvous", "ring", "ring-java-md5-100", "maglev"] {
        assert_eq!(checked.get(s).copied(), Some(per_strategy), "{s} rows in placement.tsv");
    }
    assert_eq!(checked.values().sum::<usize>(), 4 * per_strategy);
}

/// One of the large golden sets and its tables.
struct Large {
    nodes: NodeSet,
    hrw: Rendezvous,
    ring: HashRing,
    maglev: Maglev,
}

fn position(s: &str) -> usize {
    s.parse().expect("a node position")
}

#[test]
fn large_sets_rankings_and_picks() {
    // 32 and 200 nodes, equal and weighted: weight groups of 16 or more, which the rendezvous pick
    // scores eight at a time where the CPU allows (AVX-512). Sizes that are not multiples of 8
    // exercise the partial last block.
    let mut sets: Vec<(&str, Large)> = Vec::new();
    let (mut ranked, mut picked) = (0usize, 0usize);
    for r in PLACEMENT_LARGE.lines().filter(|l| l.starts_with("set\t")) {
        let r: Vec<&str> = r.split('\t').collect();
        assert_eq!(r.len(), 3, "{r:?}");
        let nodes = NodeSet::parse(r[2]).expect("valid spec");
        let large = Large {
            hrw: Rendezvous::new(nodes.clone()),
            ring: HashRing::new(nodes.clone()).expect("ok"),
            maglev: Maglev::new(nodes.clone()).expect("ok"),
            nodes,
        };
        sets.push((r[1], large));
    }
    let sizes: Vec<(&str, usize, usize)> =
        sets.iter().map(|(n, l)| (*n, l.nodes.len(), l.nodes.live_count())).collect();
    assert_eq!(
        sizes,
        [("equal-32", 32, 32), ("weighted-32", 32, 29), ("equal-200", 200, 200), ("weighted-200", 200, 171)]
    );
    let set = |name: &str| &sets.iter().find(|(n, _)| *n == name).expect("a set declared in the file").1;
    for l in PLACEMENT_LARGE.lines().filter(|l| !l.starts_with('#') && !l.starts_with("set\t")) {
        let r: Vec<&str> = l.split('\t').collect();
        match r[0] {
            "rendezvous" => {
                assert_eq!(r.len(), 4, "{l:?}");
                let (t, key) = (set(r[1]), unhex(r[2]));
                let expected: Vec<usize> = r[3].split(',').map(position).collect();
                assert_eq!(expected.len(), t.nodes.live_count(), "a full ranking lists every live node");
                let got: Vec<usize> = t.hrw.ranked(&key).collect();
                assert_eq!(got, expected, "rendezvous ranking on {} for key {}", r[1], r[2]);
                assert_eq!(t.hrw.pick_index(&key), Some(expected[0]), "rendezvous pick on {} for key {}", r[1], r[2]);
                ranked += 1;
            }
            "pick" => {
                assert_eq!(r.len(), 6, "{l:?}");
                let (t, key) = (set(r[1]), unhex(r[2]));
                let what = format!("on {} for key {}", r[1], r[2]);
                assert_eq!(t.hrw.pick_index(&key), Some(position(r[3])), "rendezvous {what}");
                assert_eq!(t.ring.pick_index(&key), Some(position(r[4])), "ring {what}");
                assert_eq!(t.maglev.pick_index(&key), Some(position(r[5])), "maglev {what}");
                picked += 1;
            }
            other => panic!("unknown row kind {other} in placement_large.tsv"),
        }
    }
    assert_eq!(ranked, 4 * KEYS);
    assert_eq!(picked, 4 * 300);
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

#[test]
fn java_sketch_counts_and_moves() {
    // The sketch's own printout of the figures `document_figures.rs` pins: the owner counts of
    // `user:0` to `user:9999` on A, B, C, and the keys that move when D joins.
    let ring = |spec: &str| {
        HashRing::builder().vnodes(100).scheme(RingScheme::JavaMd5).build(NodeSet::parse(spec).expect("v")).expect("ok")
    };
    let (abc, abcd) = (ring("A,B,C"), ring("A,B,C,D"));
    let mut counts = [0u32; 3];
    let mut moved = 0u32;
    for i in 0..10_000 {
        let key = format!("user:{i}");
        let before = abc.pick_index(key.as_bytes()).expect("owner");
        counts[before] += 1;
        if abcd.pick(key.as_bytes()).map(|n| n.name()) != Some(abc.nodes().nodes()[before].name()) {
            moved += 1;
        }
    }
    let lines: Vec<&str> = JAVA.lines().filter(|l| !l.starts_with("user:")).collect();
    assert_eq!(
        lines,
        [
            format!("counts {{A={}, B={}, C={}}}", counts[0], counts[1], counts[2]),
            format!("moved {moved} to {{D={moved}}}"),
        ]
    );
}

//! Warm-up: previous-owner handoff and slow start move only the newcomer's keys, each at most
//! once, in a share that follows the progress, for every strategy that places by key.

use keyroute::hash::mix64;
use keyroute::warm::{Handoff, admitted};
use keyroute::{NodeSet, Options, Policy, Strategy};

#[test]
fn handoff_sends_only_the_newcomers_keys_to_their_previous_owner() {
    for s in Strategy::ALL.into_iter().filter(|s| s.uses_key()) {
        let before_set = NodeSet::parse("w1,w2,w3,w4,w5,w6,w7,w8").expect("valid");
        let after_set = NodeSet::parse("w1,w2,w3,w4,w5,w6,w7,w8,w9").expect("valid");
        let before = Policy::build(s, before_set, &Options::default()).expect("builds");
        let after = Policy::build(s, after_set, &Options::default()).expect("builds");
        let w9 = 8;
        let h = Handoff::new(&after, &[w9]).expect("builds").expect("a handoff");
        let keys = 50_000u64;
        let mut moved = 0u64;
        let mut last_admitted = vec![false; keys as usize];
        for p in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let mut to_new = 0u64;
            for k in 0..keys {
                let hash = mix64(k ^ 0x5eed);
                let owner = after.owner(hash).expect("owner");
                let old = before.owner(hash).expect("owner");
                let got = h.route(hash, owner, |_| p);
                if owner != w9 {
                    assert_eq!(got, owner, "{s}: a key that stays is untouched");
                    continue;
                }
                if p == 0.0 {
                    moved += 1;
                }
                // The previous owner is the owner before the join, exactly.
                assert_eq!(h.previous_owner(hash), Some(old), "{s}");
                assert!(got == w9 || got == old, "{s}: {got}");
                if got == w9 {
                    to_new += 1;
                    last_admitted[k as usize] = true;
                } else {
                    assert!(!last_admitted[k as usize], "{s}: a key went back to its old owner");
                }
            }
            let share = to_new as f64 / moved.max(1) as f64;
            assert!((share - p).abs() < 0.03, "{s}: at progress {p} the newcomer has {share} of its keys");
        }
        assert!(moved > keys / 20, "{s}: the newcomer owns keys");
    }
}

#[test]
fn admitted_keys_are_the_same_for_every_caller() {
    for k in 0..10_000u64 {
        let hash = mix64(k);
        assert_eq!(admitted(hash, 0.37), admitted(hash, 0.37));
    }
}

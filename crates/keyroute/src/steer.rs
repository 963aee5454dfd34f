//! The steering rule: where one request for a key goes, given the moment's hot set and warm-up,
//! written once for the gateway and the simulator, so that the simulator's answer is the gateway's.
//!
//! # The rule
//!
//! In this order, each step only for what the step before left:
//!
//! 1. **Hot replicas** ([`crate::hot`]): a key with `r > 1` replicas goes to the least loaded
//!    eligible node among the first `r` of its ranking ([`Policy::decide_replicated`]).
//! 2. **Handoff** ([`crate::warm::Handoff`]): a key whose owner joined within the handoff window
//!    and is not yet admitted to it at the owner's progress goes to its previous owner, if that
//!    one is eligible (the decision says [`Spill::Warming`]).
//! 3. **Slow start**: nodes held back for this key (warming, and the key not admitted at their
//!    progress) are skipped, as unavailable ones are; a key whose owner was skipped so is marked
//!    [`Spill::Warming`] rather than as an overload or a failure.
//! 4. **The strategy** ([`Policy::decide`]): the owner, or the next eligible node of the ranking,
//!    or the strategy's own load rule.
//!
//! # Guarantees
//!
//! - **A pure function.** Time enters only through the progress and hold functions the caller
//!   passes (computed at its `now`), and randomness only through `rng`: the same inputs give the
//!   same decision, on a gateway thread or in a seeded simulation. `tests/steer.rs` of the
//!   gateway drives one sequence of events through the gateway's snapshot and through the
//!   simulator's view and compares every decision.
//! - **Only warming owners' keys move.** Steps 2 and 3 touch a key only when its owner (step 2) or
//!   a node of its ranking (step 3) is warming; every other key is placed as step 4 places it.
//!
//! # Cost
//!
//! A replica-count lookup done by the caller; for a warming owner one admission mix and one
//! lookup in the handoff's table; otherwise exactly the strategy's decision.

use crate::choices::LoadView;
use crate::hash::RandomSource;
use crate::strategy::{Decision, Policy, Spill};
use crate::warm::{Handoff, admitted};

/// What the moment adds to the strategy for one key: see the [module documentation](self).
#[derive(Clone, Copy)]
pub struct Steering<'a> {
    /// The key's replica count in the hot set (0 or 1: not replicated).
    pub replicas: usize,
    /// The handoff of the last join, with each node's handoff progress now (0 to 1).
    pub handoff: Option<(&'a Handoff, &'a dyn Fn(usize) -> f64)>,
    /// Slow start: whether node `i` is held back for this key now.
    pub held: Option<&'a dyn Fn(usize) -> bool>,
}

impl std::fmt::Debug for Steering<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("replicas", &self.replicas)
            .field("handoff", &self.handoff.map(|(h, _)| h.warming()))
            .field("slow_start", &self.held.is_some())
            .finish()
    }
}

impl Steering<'_> {
    /// Nothing but the strategy.
    pub const NONE: Steering<'static> = Steering { replicas: 0, handoff: None, held: None };
}

/// The node for a request: `hash` is its key's (`None` for a request without a key), `loads` the
/// nodes' loads, `eligible` whether a node may take it (healthy, not tried yet).
///
/// # Examples
///
/// ```
/// use keyroute::hash::SplitMix64;
/// use keyroute::steer::{Steering, steer};
/// use keyroute::{Node, NodeSet, Options, Policy, Strategy};
///
/// let nodes = NodeSet::try_new((1..=4).map(|i| Node::new_unchecked(&format!("w{i}"))))?;
/// let policy = Policy::build(Strategy::Rendezvous, nodes, &Options::default())?;
/// let mut rng = SplitMix64::new(1);
/// let hash = policy.key_hash(b"/thumb/cat.jpg");
/// let d = steer(&policy, Some(hash), &Steering::NONE, &|_| 0, |_| true, &mut rng).expect("a node");
/// assert_eq!(Some(d.node), policy.owner(hash));
/// # Ok::<(), keyroute::Error>(())
/// ```
pub fn steer<L, R>(
    policy: &Policy,
    hash: Option<u64>,
    steering: &Steering<'_>,
    loads: &L,
    eligible: impl Fn(usize) -> bool,
    rng: &mut R,
) -> Option<Decision>
where
    L: LoadView + ?Sized,
    R: RandomSource + ?Sized,
{
    let Some(h) = hash else { return policy.decide(None, loads, eligible, rng) };
    if steering.replicas > 1 {
        return policy.decide_replicated(h, steering.replicas, loads, eligible, rng);
    }
    if let Some((handoff, progress)) = steering.handoff
        && let Some(owner) = policy.owner(h)
        && handoff.is_warming(owner)
        && !admitted(h, progress(owner))
        && let Some(prev) = handoff.previous_owner(h)
        && eligible(prev)
    {
        return Some(Decision { node: prev, owner: Some(owner), spill: Some(Spill::Warming) });
    }
    if let Some(held) = steering.held {
        let d = policy.decide(hash, loads, |i| eligible(i) && !held(i), rng);
        if let Some(mut d) = d {
            if d.spill.is_some() && d.owner.is_some_and(|o| eligible(o) && held(o)) {
                d.spill = Some(Spill::Warming);
            }
            return Some(d);
        }
    }
    policy.decide(hash, loads, eligible, rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::SplitMix64;
    use crate::{Node, NodeSet, Options, Strategy};

    fn policy(n: usize) -> Policy {
        let nodes = NodeSet::try_new((1..=n).map(|i| Node::new_unchecked(&format!("w{i}")))).expect("nodes");
        Policy::build(Strategy::Rendezvous, nodes, &Options::default()).expect("policy")
    }

    #[test]
    fn each_step_in_its_order() {
        let p = policy(5);
        let mut rng = SplitMix64::new(7);
        let handoff = Handoff::new(&p, &[4]).expect("handoff").expect("a node warms");
        let none = |_: usize| 0.0;
        let mut moved = 0;
        for k in 0..2000u64 {
            let h = crate::hash::mix64(k);
            let owner = p.owner(h).expect("owner");
            let plain = steer(&p, Some(h), &Steering::NONE, &|_| 0, |_| true, &mut rng).expect("node");
            assert_eq!(plain.node, owner);
            // Handoff at progress 0: every key of the newcomer goes to its previous owner.
            let s = Steering { replicas: 0, handoff: Some((&handoff, &none)), held: None };
            let d = steer(&p, Some(h), &s, &|_| 0, |_| true, &mut rng).expect("node");
            if owner == 4 {
                moved += 1;
                assert_eq!((Some(d.node), d.spill), (handoff.previous_owner(h), Some(Spill::Warming)));
            } else {
                assert_eq!(d.node, owner, "only the newcomer's keys move");
            }
            // Slow start holding the newcomer: its keys go down their ranking, marked warming.
            let held = |i: usize| i == 4;
            let s = Steering { replicas: 0, handoff: None, held: Some(&held) };
            let d = steer(&p, Some(h), &s, &|_| 0, |_| true, &mut rng).expect("node");
            assert_ne!(d.node, 4);
            if owner == 4 {
                assert_eq!((Some(d.node), d.spill), (p.ranked(h).nth(1), Some(Spill::Warming)));
            }
            // Replicas come first, whatever warms.
            let s = Steering { replicas: 3, handoff: Some((&handoff, &none)), held: Some(&held) };
            let d = steer(&p, Some(h), &s, &|i| if i == owner { 10 } else { 0 }, |_| true, &mut rng).expect("node");
            assert!(p.ranked(h).take(3).any(|i| i == d.node) && d.node != owner);
        }
        assert!(moved > 250, "{moved}");
    }
}

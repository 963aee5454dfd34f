//! The steer stage: the worker for one try, by the core's one steering rule
//! ([`keyroute::steer`], through [`keyroute_fleet::pool::Snapshot::decide`]: hot replicas, handoff, slow
//! start, the strategy), skipping the workers already tried; and how the try was placed, for the
//! pool's metrics and the access log.

use std::sync::Arc;

use keyroute::Decision;
use tokio::time::Instant;

use crate::access::Placed;
use keyroute_fleet::metrics::{OUTCOMES, Outcome};
use keyroute_fleet::pool::{Pool, Snapshot};

/// The decision for try `attempt` (0 is the first) of a request for `hash`, counted in the
/// pool's outcomes and noted in `placed`; `None` when no worker is left to try.
pub(super) fn place(
    pool: &Pool,
    snap: &Snapshot,
    hash: Option<u64>,
    tried: &[usize],
    now: Instant,
    attempt: u32,
    placed: Option<&mut Placed>,
) -> Option<Decision> {
    let decision = snap.decide(hash, tried, now)?;
    let outcome = Outcome::of(attempt, hash.is_some() && decision.owner.is_some(), decision.spill);
    pool.metrics.outcome(outcome);
    if let Some(p) = placed {
        p.attempts = attempt + 1;
        p.worker = snap.workers().get(decision.node).map(|w| Arc::from(w.name.as_str()));
        if attempt == 0 {
            p.decision = OUTCOMES[outcome as usize];
        }
    }
    Some(decision)
}

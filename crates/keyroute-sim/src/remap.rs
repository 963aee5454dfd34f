//! `sim remap`: what moves when the node set changes.
//!
//! For every key, its owner before and after the change (each table a function of its node set
//! alone, as every gateway builds it). Reported:
//! the keys that moved and where (the from -> to matrix), the ideal (the least any placement must
//! move: the total variation between the weight shares before and after, e.g. `1/(n+1)` when a node
//! joins `n` equal ones), and with a traffic log, the share of *requests* whose key moved, which is
//! what a cache really loses.
//!
//! The two sides may use different strategies or compatibility modes ([`remap_between`]): the
//! plan for moving from, say, nginx's placement to rendezvous, per node, before doing it.

use std::collections::BTreeMap;

use keyroute::{NodeSet, Options, Placement, Strategy, Table};
use serde::Serialize;

use crate::{KeySet, SimError};

/// What a membership change moves.
#[derive(Clone, Debug, Serialize)]
pub struct RemapReport {
    /// The strategy (`FROM -> TO` when they differ).
    pub strategy: String,
    /// The strategy before the change.
    pub from: String,
    /// The strategy after the change.
    pub to: String,
    /// Keys examined.
    pub keys: u64,
    /// Keys whose owner changed.
    pub moved: u64,
    /// `moved / keys`.
    pub moved_share: f64,
    /// The least share any placement must move for this change.
    pub ideal_share: f64,
    /// Keys per `(from, to)` pair, for pairs that differ.
    pub matrix: Vec<Move>,
    /// Keys per node before the change.
    pub before: Vec<NodeCount>,
    /// Keys per node after the change.
    pub after: Vec<NodeCount>,
    /// With a traffic log: the requests whose key moved.
    pub traffic: Option<TrafficMoved>,
}

/// Keys that moved from one node to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    /// The previous owner.
    pub from: String,
    /// The new owner.
    pub to: String,
    /// How many keys.
    pub keys: u64,
}

/// A node and how many keys it owns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeCount {
    /// The node.
    pub node: String,
    /// Its weight.
    pub weight: u32,
    /// Keys it owns.
    pub keys: u64,
    /// Before the change: its keys that move to another node; after: the keys it receives.
    pub moved: u64,
    /// With a traffic log: the requests of those moved keys.
    pub moved_requests: Option<u64>,
}

/// The requests whose key moved.
#[derive(Clone, Debug, Serialize)]
pub struct TrafficMoved {
    /// Requests in the log.
    pub requests: u64,
    /// Requests whose key changed owner.
    pub moved: u64,
    /// `moved / requests`: the share of traffic that misses on a cache-affine fleet.
    pub moved_share: f64,
}

/// Runs the remap analysis for one strategy over two node sets.
///
/// # Errors
///
/// A strategy that does not place by key (round robin, p2c, least-loaded), or a table that cannot
/// be built from the node sets.
pub fn remap(
    strategy: Strategy,
    options: &Options,
    before: &NodeSet,
    after: &NodeSet,
    keys: &KeySet,
) -> Result<RemapReport, SimError> {
    remap_between((strategy, before), (strategy, after), options, keys)
}

/// Runs the remap analysis from one strategy (or compatibility mode) over one node set to another
/// strategy over another (or the same) node set. Nodes are matched by name.
///
/// # Errors
///
/// A strategy that does not place by key (round robin, p2c, least-loaded), or a table that cannot
/// be built from the node sets.
pub fn remap_between(
    (from, before): (Strategy, &NodeSet),
    (to, after): (Strategy, &NodeSet),
    options: &Options,
    keys: &KeySet,
) -> Result<RemapReport, SimError> {
    let Some(b) = Table::build(from, before.clone(), options)? else {
        return Err(SimError::NotByKey(from));
    };
    let Some(a) = Table::build(to, after.clone(), options)? else {
        return Err(SimError::NotByKey(to));
    };
    let mut matrix: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut before_counts = vec![0u64; before.len()];
    let mut after_counts = vec![0u64; after.len()];
    let mut left = vec![0u64; before.len()];
    let mut arrived = vec![0u64; after.len()];
    let mut left_requests = vec![0u64; before.len()];
    let mut arrived_requests = vec![0u64; after.len()];
    let (mut moved, mut moved_requests) = (0u64, 0u64);
    for (i, key) in keys.keys().iter().enumerate() {
        let x = b.pick_index(key);
        let y = a.pick_index(key);
        if let Some(x) = x {
            before_counts[x] += 1;
        }
        if let Some(y) = y {
            after_counts[y] += 1;
        }
        let xn = x.map(|x| before.nodes()[x].name());
        let yn = y.map(|y| after.nodes()[y].name());
        if xn != yn {
            let requests = keys.requests().map_or(0, |r| r[i]);
            moved += 1;
            moved_requests += requests;
            if let Some(x) = x {
                left[x] += 1;
                left_requests[x] += requests;
            }
            if let Some(y) = y {
                arrived[y] += 1;
                arrived_requests[y] += requests;
            }
            *matrix.entry((xn.unwrap_or("-").to_owned(), yn.unwrap_or("-").to_owned())).or_default() += 1;
        }
    }
    let traffic = keys.requests().is_some();
    let counts = |set: &NodeSet, c: &[u64], m: &[u64], mr: &[u64]| {
        set.nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| NodeCount {
                node: n.name().to_owned(),
                weight: n.weight(),
                keys: c[i],
                moved: m[i],
                moved_requests: traffic.then_some(mr[i]),
            })
            .collect()
    };
    let total = keys.len() as u64;
    let strategy = if from == to { from.name().to_owned() } else { format!("{from} -> {to}") };
    Ok(RemapReport {
        strategy,
        from: from.name().to_owned(),
        to: to.name().to_owned(),
        keys: total,
        moved,
        moved_share: share(moved, total),
        ideal_share: ideal(before, after),
        matrix: matrix.into_iter().map(|((from, to), keys)| Move { from, to, keys }).collect(),
        before: counts(before, &before_counts, &left, &left_requests),
        after: counts(after, &after_counts, &arrived, &arrived_requests),
        traffic: keys.requests().map(|r| {
            let requests = r.iter().sum();
            TrafficMoved { requests, moved: moved_requests, moved_share: share(moved_requests, requests) }
        }),
    })
}

pub(crate) fn share(part: u64, total: u64) -> f64 {
    if total == 0 { 0.0 } else { part as f64 / total as f64 }
}

/// The total variation distance between the weight shares of the two sets (by node name).
fn ideal(before: &NodeSet, after: &NodeSet) -> f64 {
    let shares = |set: &NodeSet| -> BTreeMap<String, f64> {
        let w = set.total_weight().max(1) as f64;
        set.nodes().iter().map(|n| (n.name().to_owned(), f64::from(n.weight()) / w)).collect()
    };
    let (b, a) = (shares(before), shares(after));
    b.iter().map(|(name, &sb)| (sb - a.get(name).copied().unwrap_or(0.0)).max(0.0)).sum()
}

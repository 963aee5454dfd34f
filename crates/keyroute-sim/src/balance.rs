//! `sim balance`: how evenly a strategy spreads keys over nodes, relative to their weights.

use keyroute::{NodeSet, Options, Placement, Strategy, Table};
use serde::Serialize;

use crate::{KeySet, SimError};

/// Keys per node and the spread.
#[derive(Clone, Debug, Serialize)]
pub struct BalanceReport {
    /// The strategy.
    pub strategy: String,
    /// Keys examined.
    pub keys: u64,
    /// Per node: keys, share, and the share its weight asks for.
    pub nodes: Vec<NodeShare>,
    /// The busiest node's load over its fair load (1.0 is perfect).
    pub peak_over_mean: f64,
    /// The idlest live node's load over its fair load.
    pub min_over_mean: f64,
    /// Standard deviation of `load / fair load` over live nodes.
    pub relative_stddev: f64,
}

/// One node's keys.
#[derive(Clone, Debug, Serialize)]
pub struct NodeShare {
    /// The node.
    pub node: String,
    /// Its weight.
    pub weight: u32,
    /// Keys it owns.
    pub keys: u64,
    /// Its share of keys.
    pub share: f64,
    /// Its share of weight.
    pub expected_share: f64,
}

/// Runs the balance analysis.
///
/// # Errors
///
/// A strategy that does not place by key, or a table that cannot be built.
pub fn balance(
    strategy: Strategy,
    options: &Options,
    nodes: &NodeSet,
    keys: &KeySet,
) -> Result<BalanceReport, SimError> {
    let Some(t) = Table::build(strategy, nodes.clone(), options)? else {
        return Err(SimError::NotByKey(strategy));
    };
    let mut counts = vec![0u64; nodes.len()];
    for k in keys.keys() {
        if let Some(i) = t.pick_index(k) {
            counts[i] += 1;
        }
    }
    let total = keys.len() as u64;
    let tw = nodes.total_weight().max(1) as f64;
    let shares: Vec<NodeShare> = nodes
        .nodes()
        .iter()
        .zip(&counts)
        .map(|(n, &k)| NodeShare {
            node: n.name().to_owned(),
            weight: n.weight(),
            keys: k,
            share: crate::remap::share(k, total),
            expected_share: f64::from(n.weight()) / tw,
        })
        .collect();
    let rel: Vec<f64> =
        shares.iter().filter(|s| s.weight > 0 && total > 0).map(|s| s.share / s.expected_share).collect();
    let n = rel.len().max(1) as f64;
    let mean = rel.iter().sum::<f64>() / n;
    Ok(BalanceReport {
        strategy: strategy.name().to_owned(),
        keys: total,
        peak_over_mean: rel.iter().copied().fold(0.0, f64::max),
        min_over_mean: if rel.is_empty() { 0.0 } else { rel.iter().copied().fold(f64::INFINITY, f64::min) },
        relative_stddev: (rel.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt(),
        nodes: shares,
    })
}

//! The placement table a member set builds: the node set, and the size limit that keeps a weight
//! change from building a table of gigabytes.

use keyroute::{Node, NodeSet, Options, Strategy};

/// The node set of members given as (name, weight, zone, id), in their order.
///
/// # Errors
///
/// Empty or duplicate names.
pub fn node_set<'a>(
    it: impl Iterator<Item = (&'a str, u32, Option<&'a str>, Option<u32>)>,
) -> Result<NodeSet, keyroute::Error> {
    let nodes = it
        .map(|(name, weight, zone, id)| {
            let mut n = Node::try_new(name)?.with_weight(weight);
            if let Some(z) = zone {
                n = n.with_zone(z);
            }
            if let Some(id) = id {
                n = n.with_id(id);
            }
            Ok(n)
        })
        .collect::<Result<Vec<_>, keyroute::Error>>()?;
    NodeSet::try_new(nodes)
}

/// The most entries (ring points, modulo slots, Maglev entries) a pool's table may have: about
/// 50 MB while a ring of this size is built, and a build of a few hundred milliseconds on one
/// core. A weight change that would go past it is refused, so that no admin call or reload can
/// make the gateway build a table of gigabytes.
pub const MAX_TABLE_ENTRIES: u64 = 4_000_000;

/// The number of entries the table of `strategy` over `nodes` would have, when it grows with
/// the weights (rings and weighted modulo), or with the configured Maglev size.
pub fn table_entries(strategy: Strategy, options: &Options, nodes: &NodeSet) -> u64 {
    let total = nodes.total_weight();
    match strategy {
        Strategy::Ring | Strategy::BoundedRing => total.saturating_mul(u64::from(options.vnodes)),
        Strategy::Modulo => total,
        Strategy::Maglev => u64::from(options.maglev_size),
        Strategy::Compat(mode) => options.compat.table_entries(mode, nodes),
        _ => nodes.len() as u64,
    }
}

/// A table above the gateway's limit on table entries (points, slots, expanded weights): how
/// large it would be, and what to lower.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} (the limit is {MAX_TABLE_ENTRIES})", self.describe())]
pub struct TooLarge {
    strategy: Strategy,
    entries: u64,
    vnodes: u32,
    total_weight: u64,
}

impl TooLarge {
    fn describe(&self) -> String {
        let entries = self.entries;
        match self.strategy {
            Strategy::Ring | Strategy::BoundedRing => format!(
                "the ring would have {entries} points ({} vnodes x total weight {}); lower vnodes or the weights",
                self.vnodes, self.total_weight
            ),
            Strategy::Modulo => format!("modulo would expand a total weight of {entries}; lower the weights"),
            Strategy::Compat(mode) => {
                format!("the {mode} table would have {entries} entries; lower the weights or its sizes")
            }
            _ => format!("the table would have {entries} entries; lower maglev_size"),
        }
    }
}

/// Refuses a table above [`MAX_TABLE_ENTRIES`], saying what to lower.
///
/// # Errors
///
/// [`TooLarge`], when the table is too large.
pub fn check_table_size(strategy: Strategy, options: &Options, nodes: &NodeSet) -> Result<(), TooLarge> {
    let entries = table_entries(strategy, options, nodes);
    if entries <= MAX_TABLE_ENTRIES {
        return Ok(());
    }
    Err(TooLarge { strategy, entries, vnodes: options.vnodes, total_weight: nodes.total_weight() })
}

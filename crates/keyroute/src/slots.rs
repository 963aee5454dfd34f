//! Fixed slot tables: Redis Cluster's 16,384 hash slots.
//!
//! # The mechanism
//!
//! The key space is cut into a fixed number of slots, `slot = CRC16(key) mod 16384`, and a table says
//! which node owns each slot. Rebalancing moves whole slots, and the table is explicit: the move
//! plan *is* the list of slots that change hands (Redis Cluster specification, "Keys distribution
//! model"). Keys that must live together share a **hash tag**: if the key contains `{...}` with at
//! least one byte between the first `{` and the next `}`, only those bytes are hashed, so
//! `{user1}.following` and `{user1}.followers` land in one slot.
//!
//! # Guarantees
//!
//! - **Balance within one slot.** Each node owns `floor` or `ceil` of its exact weighted share of
//!   16,384 slots (largest remainder rounding; ties by name).
//! - **Minimal move plans.** [`SlotTable::rebalance`] moves the fewest slots that bring every node
//!   within that range: adding a node moves slots only to it, removing one moves only its slots,
//!   a weight change moves slots only to or from the reweighted node (when the table was balanced
//!   before), and nothing else moves. The plan lists every move, `(slot, from, to)`.
//!
//! # Cost
//!
//! Lookup: CRC16 of the key (table driven) and one array read. 64 KiB of table.
//!
//! # When to choose it
//!
//! When data really moves (a sharded store) and an operator wants to see, schedule and throttle each
//! move; or to talk to Redis Cluster. The slot count caps the useful node count (16,384 nodes).

use crate::rendezvous::Fallback;
use crate::{Error, ErrorKind, NodeSet, Placement, Ranking, Rendezvous};

/// The number of slots: 16,384, as in Redis Cluster.
pub const SLOT_COUNT: usize = 16_384;

const UNOWNED: u32 = u32::MAX;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection, no final xor): the CRC Redis
/// Cluster uses.
///
/// # Examples
///
/// ```
/// assert_eq!(keyroute::slots::crc16(b"123456789"), 0x31C3);
/// ```
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from(((crc >> 8) as u8) ^ b)];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The Redis Cluster slot of a key, honouring hash tags.
///
/// # Examples
///
/// ```
/// use keyroute::slots::key_slot;
/// assert_eq!(key_slot(b"somekey"), 11058);
/// assert_eq!(key_slot(b"{user1}.following"), key_slot(b"user1"));
/// assert_eq!(key_slot(b"{}.x"), keyroute::slots::crc16(b"{}.x") % 16384); // empty tag: whole key
/// ```
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT as u16
}

/// The bytes of a key that are hashed: the first non-empty `{tag}`, or the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// One slot changing owner in a [`MovePlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotMove {
    /// The slot.
    pub slot: u16,
    /// The previous owner's name (`None` if the slot had no owner).
    pub from: Option<String>,
    /// The new owner's name.
    pub to: String,
}

/// The slots that change owner between two tables, in slot order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MovePlan {
    /// Every move.
    pub moves: Vec<SlotMove>,
}

impl MovePlan {
    /// The number of slots that move.
    pub fn len(&self) -> usize {
        self.moves.len()
    }

    /// Whether nothing moves.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }
}

/// A table of 16,384 slots and their owners. See the [module documentation](self).
///
/// # Examples
///
/// ```
/// use keyroute::{NodeSet, Placement, SlotTable};
/// let t = SlotTable::new(NodeSet::parse("a,b,c")?);
/// let (t2, plan) = t.rebalance(NodeSet::parse("a,b,c,d")?);
/// assert_eq!(plan.len(), 4096);
/// assert!(plan.moves.iter().all(|m| m.to == "d"));
/// assert!(t2.pick(b"somekey").is_some());
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SlotTable {
    nodes: NodeSet,
    owners: Box<[u32]>,
    fallback: Rendezvous,
}

impl SlotTable {
    /// A balanced table: each node a contiguous range of slots, in listing order, sized by weight.
    pub fn new(nodes: NodeSet) -> Self {
        let empty = SlotTable {
            owners: vec![UNOWNED; SLOT_COUNT].into(),
            fallback: Rendezvous::new(NodeSet::empty()),
            nodes: NodeSet::empty(),
        };
        empty.rebalance(nodes).0
    }

    /// A table with an explicit owner per slot (for example from Redis's `CLUSTER SLOTS`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidParameter`] if `owners` does not have 16,384 entries, or names a node index
    /// out of range or with weight 0.
    pub fn from_owners(nodes: NodeSet, owners: &[usize]) -> Result<Self, Error> {
        if owners.len() != SLOT_COUNT {
            return Err(Error::invalid_parameter(format!(
                "a slot table needs {SLOT_COUNT} owners, got {}",
                owners.len()
            )));
        }
        for (slot, &o) in owners.iter().enumerate() {
            if nodes.get(o).is_none_or(|n| !n.is_live()) {
                return Err(Error::new(
                    ErrorKind::InvalidParameter,
                    format!("slot {slot} is assigned to node index {o}, which is absent or drained"),
                ));
            }
        }
        let owners = owners.iter().map(|&o| o as u32).collect();
        let fallback = Rendezvous::new(nodes.clone());
        Ok(SlotTable { nodes, owners, fallback })
    }

    /// The owner of a slot (`None` if the table has no live node).
    pub fn slot_owner(&self, slot: u16) -> Option<usize> {
        self.owners.get(usize::from(slot)).filter(|&&o| o != UNOWNED).map(|&o| o as usize)
    }

    /// How many slots each node owns, indexed like the node set.
    pub fn slot_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for &o in self.owners.iter() {
            if let Some(c) = counts.get_mut(o as usize) {
                *c += 1;
            }
        }
        counts
    }

    /// The balanced table for a new node set, and the minimal plan of slot moves to get there.
    ///
    /// Nodes are matched by name. Each node ends with `floor` or `ceil` of its exact weighted share;
    /// within those bounds, every node keeps as many of its slots as it can. A node that gives up
    /// slots gives its highest-numbered ones; receivers take freed slots in ascending order, in
    /// listing order.
    pub fn rebalance(&self, nodes: NodeSet) -> (SlotTable, MovePlan) {
        let n = nodes.len();
        // Current owner of each slot, as an index into the new set (UNOWNED if gone or none).
        let map: Vec<u32> =
            self.nodes.nodes().iter().map(|node| nodes.position(node.name()).map_or(UNOWNED, |i| i as u32)).collect();
        let mut owners: Vec<u32> =
            self.owners.iter().map(|&o| if o == UNOWNED { UNOWNED } else { map[o as usize] }).collect();
        let targets = targets(&nodes, &owners);
        let mut counts = vec![0usize; n];
        for &o in &owners {
            if o != UNOWNED {
                counts[o as usize] += 1;
            }
        }
        // Givers release their highest slots.
        let mut excess: Vec<usize> = (0..n).map(|i| counts[i].saturating_sub(targets[i])).collect();
        for slot in (0..SLOT_COUNT).rev() {
            let o = owners[slot];
            if o != UNOWNED && excess[o as usize] > 0 {
                excess[o as usize] -= 1;
                owners[slot] = UNOWNED;
            }
        }
        // Receivers take freed slots in ascending order.
        let mut need: Vec<usize> = (0..n).map(|i| targets[i].saturating_sub(counts[i])).collect();
        let mut receiver = 0;
        for owner in owners.iter_mut() {
            if *owner != UNOWNED {
                continue;
            }
            while receiver < n && need[receiver] == 0 {
                receiver += 1;
            }
            if receiver == n {
                break;
            }
            *owner = receiver as u32;
            need[receiver] -= 1;
        }
        let moves = (0..SLOT_COUNT)
            .filter_map(|slot| {
                let old = self.owners[slot];
                let new = owners[slot];
                let old_name = (old != UNOWNED).then(|| self.nodes.nodes()[old as usize].name());
                let new_name = (new != UNOWNED).then(|| nodes.nodes()[new as usize].name());
                (old_name != new_name).then(|| SlotMove {
                    slot: slot as u16,
                    from: old_name.map(str::to_owned),
                    to: new_name.unwrap_or_default().to_owned(),
                })
            })
            .filter(|m| !m.to.is_empty())
            .collect();
        let fallback = Rendezvous::new(nodes.clone());
        (SlotTable { nodes, owners: owners.into(), fallback }, MovePlan { moves })
    }
}

/// Each node's slot count after a rebalance: within `[floor, ceil]` of its exact share, as close to
/// its current count as the total allows.
fn targets(nodes: &NodeSet, owners: &[u32]) -> Vec<usize> {
    let n = nodes.len();
    let total_w = nodes.total_weight();
    if total_w == 0 {
        return vec![0; n];
    }
    let mut current = vec![0usize; n];
    for &o in owners {
        if o != UNOWNED {
            current[o as usize] += 1;
        }
    }
    let s = SLOT_COUNT as u64;
    let lo: Vec<usize> = nodes.nodes().iter().map(|x| (s * u64::from(x.weight()) / total_w) as usize).collect();
    let frac: Vec<u64> = nodes.nodes().iter().map(|x| s * u64::from(x.weight()) % total_w).collect();
    let hi: Vec<usize> = (0..n).map(|i| lo[i] + usize::from(frac[i] > 0)).collect();
    let mut t: Vec<usize> = (0..n).map(|i| current[i].clamp(lo[i], hi[i])).collect();
    let sum: usize = t.iter().sum();
    let ranks = nodes.name_ranks();
    if sum < SLOT_COUNT {
        // Raise nodes below their ceiling: largest fractional share first, then by name.
        let mut order: Vec<usize> = (0..n).filter(|&i| t[i] < hi[i]).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(frac[i]), ranks[i]));
        for &i in order.iter().take(SLOT_COUNT - sum) {
            t[i] += 1;
        }
    } else if sum > SLOT_COUNT {
        // Lower nodes above their floor: receivers first (lowering them costs no move), then the
        // smallest fractional share, then by name.
        let mut order: Vec<usize> = (0..n).filter(|&i| t[i] > lo[i]).collect();
        order.sort_by_key(|&i| (t[i] <= current[i], frac[i], ranks[i]));
        for &i in order.iter().take(sum - SLOT_COUNT) {
            t[i] -= 1;
        }
    }
    t
}

impl Placement for SlotTable {
    fn nodes(&self) -> &NodeSet {
        &self.nodes
    }

    /// The key's slot (see [`key_slot`]), as a `u64`.
    #[inline]
    fn key_hash(&self, key: &[u8]) -> u64 {
        u64::from(key_slot(key))
    }

    /// The owner of slot `hash mod 16384`.
    #[inline]
    fn pick_hash(&self, hash: u64) -> Option<usize> {
        self.slot_owner((hash % SLOT_COUNT as u64) as u16)
    }
}

impl Ranking for SlotTable {
    type Ranked<'a> = Fallback<'a>;

    /// The slot's owner, then the other live nodes in the slot's rendezvous order.
    fn ranked_hash(&self, hash: u64) -> Fallback<'_> {
        let slot = hash % SLOT_COUNT as u64;
        Fallback::new(self.pick_hash(slot), &self.fallback, crate::hash::mix64(slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_reference_values() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"{user1}.following"), 8106);
        assert_eq!(key_slot(b"key"), 12539);
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    }

    #[test]
    fn a_fresh_table_is_contiguous_and_balanced() {
        let t = SlotTable::new(NodeSet::parse("a,b,c").expect("valid"));
        assert_eq!(t.slot_counts(), vec![5462, 5461, 5461]);
        assert_eq!(t.slot_owner(0), Some(0));
        assert_eq!(t.slot_owner(5461), Some(0));
        assert_eq!(t.slot_owner(5462), Some(1));
        assert_eq!(t.slot_owner(16383), Some(2));
    }

    #[test]
    fn from_owners_validates() {
        let set = NodeSet::parse("a,b:weight=0").expect("valid");
        assert!(SlotTable::from_owners(set.clone(), &[0; 10]).is_err());
        assert!(SlotTable::from_owners(set.clone(), &[1; SLOT_COUNT]).is_err());
        assert!(SlotTable::from_owners(set.clone(), &[2; SLOT_COUNT]).is_err());
        assert!(SlotTable::from_owners(set, &[0; SLOT_COUNT]).is_ok());
    }

    #[test]
    fn no_live_node_owns_nothing() {
        let t = SlotTable::new(NodeSet::parse("a:weight=0").expect("valid"));
        assert_eq!(t.pick(b"k"), None);
        assert_eq!(t.ranked(b"k").count(), 0);
    }
}

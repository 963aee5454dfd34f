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
//! # Who owns a slot
//!
//! [`SlotTable::new`] assigns the slots from the node set alone, so every gateway, and one gateway
//! before and after a restart, builds the same table whatever order or history the nodes joined in:
//!
//! 1. Each slot goes to the top node of its weighted rendezvous ranking (the key hash of slot `s` is
//!    [`mix64`](crate::hash::mix64)`(s)`; the ranking is [`Rendezvous`]'s, weights by the log method).
//! 2. No node keeps more than its **cap**, `ceil(s + 3 sqrt(s))` slots where `s = 16384 w / W` is its
//!    exact weighted share: about three standard deviations of the binomial count above the mean. A
//!    node over its cap keeps the slots it scores highest on (ties by slot number); each other slot,
//!    in slot order, goes to the first node of its ranking that is under its own cap.
//!
//! Step 1 alone is rendezvous hashing over 16,384 keys: adding a node moves slots only to it,
//! removing one moves only its slots, a reweight moves slots only to or from that node, exactly.
//! Its counts are binomial, though (for 8 equal nodes, 2,048 slots each give or take 42), and the
//! rare node three deviations high would own 6.6% too much; step 2 cuts that tail. Because the cap
//! is three deviations out, it binds for about one node in a thousand, and then for a handful of
//! slots: those few slots are the only moves beyond the minimal ones, and the tests bound them at
//! 1% of the slots. (An exactly balanced table cannot also move minimally and be a function of the
//! set alone; the cap trades a few slots of balance for both of the other two.)
//!
//! # Guarantees
//!
//! - **A function of the set.** Names and weights decide the table; order and history do not.
//! - **Balance.** Every node's expected share is exactly its weight share; no node owns more than
//!   `ceil(s + 3 sqrt(s))` slots: peak/mean at most 1.067 for 8 equal nodes (measured over 1,000
//!   random name sets by the tests: see the test `slot_tables_balance_within_the_cap`).
//! - **Minimal movement**, up to the cap's few slots (see above): the move plan between two tables
//!   ([`MovePlan::between`]) lists every slot that changes hands, `(slot, from, to)`.
//!
//! [`SlotTable::from_owners`] takes an explicit map instead (for example from Redis's
//! `CLUSTER SLOTS`), and [`SlotTable::rebalance`] edits such a hand-managed map with the fewest
//! moves that bring every node within one slot of its share. A rebalanced table depends on the map
//! it started from, so it is not what the gateway or `keyroute place` use.
//!
//! # Cost
//!
//! Lookup: CRC16 of the key (table driven) and one array read. 64 KiB of table. Building: 16,384
//! rendezvous picks, `O(16384 n)` (0.67 ms at 8 nodes: `cargo bench -p keyroute-bench --bench placement -- build/slots`).
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

/// The bytes of a key that are hashed: what lies between its *first* `{` and the next `}`, if that
/// is not empty (`{}{a}` hashes the whole key), or else the whole key.
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
/// use keyroute::{MovePlan, NodeSet, Placement, SlotTable};
/// let before = SlotTable::new(NodeSet::parse("a,b,c")?);
/// let after = SlotTable::new(NodeSet::parse("c,b,a,d")?); // order does not matter
/// let plan = MovePlan::between(&before, &after);
/// assert!(plan.moves.iter().all(|m| m.to == "d")); // a join moves slots only to the newcomer
/// assert!(after.pick(b"somekey").is_some());
/// # Ok::<(), keyroute::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SlotTable {
    nodes: NodeSet,
    owners: Box<[u32]>,
    fallback: Rendezvous,
}

/// The key hash of slot `slot` in its rendezvous ranking.
#[inline]
fn slot_hash(slot: usize) -> u64 {
    crate::hash::mix64(slot as u64)
}

impl SlotTable {
    /// The table of a node set: each slot to its top weighted-rendezvous node, within every node's
    /// cap. A function of the set alone (see the [module documentation](self)).
    pub fn new(nodes: NodeSet) -> Self {
        let fallback = Rendezvous::new(nodes.clone());
        let mut owners = vec![UNOWNED; SLOT_COUNT];
        let n = nodes.len();
        if fallback.live_count() == 0 {
            return SlotTable { nodes, owners: owners.into(), fallback };
        }
        let caps = caps(&nodes);
        let mut counts = vec![0usize; n];
        for (slot, owner) in owners.iter_mut().enumerate() {
            if let Some(i) = fallback.pick_hash(slot_hash(slot)) {
                *owner = i as u32;
                counts[i] += 1;
            }
        }
        // Nodes over their cap keep the slots they score highest on.
        let mut bumped: Vec<usize> = Vec::new();
        for i in 0..n {
            if counts[i] <= caps[i] {
                continue;
            }
            let seed = nodes.seeds()[i];
            let mut mine: Vec<(u64, usize)> = (0..SLOT_COUNT)
                .filter(|&s| owners[s] == i as u32)
                .map(|s| (crate::hash::score(slot_hash(s), seed), s))
                .collect();
            // Highest score first, then lowest slot.
            mine.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            for &(_, s) in &mine[caps[i]..] {
                owners[s] = UNOWNED;
                bumped.push(s);
            }
            counts[i] = caps[i];
        }
        bumped.sort_unstable();
        for s in bumped {
            // The caps sum to at least 16,384, so some live node has room.
            if let Some(i) = fallback.ranked_hash(slot_hash(s)).find(|&i| counts[i] < caps[i]) {
                owners[s] = i as u32;
                counts[i] += 1;
            }
        }
        SlotTable { nodes, owners: owners.into(), fallback }
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

    /// The name of a slot's owner.
    pub fn slot_owner_name(&self, slot: u16) -> Option<&str> {
        self.slot_owner(slot).and_then(|i| self.nodes.get(i)).map(|n| n.name())
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

    /// Edits a **hand-managed** map (from [`SlotTable::from_owners`]) for a new node set with the
    /// fewest moves, and returns the plan.
    ///
    /// Nodes are matched by name. Each node ends with `floor` or `ceil` of its exact weighted share;
    /// within those bounds, every node keeps as many of its slots as it can. A node that gives up
    /// slots gives its highest-numbered ones; receivers take freed slots in ascending order, in
    /// listing order. The result depends on the map it starts from, not only on the node set: for a
    /// table that every process derives alike, build [`SlotTable::new`] for the new set and take
    /// [`MovePlan::between`] the two.
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
        let fallback = Rendezvous::new(nodes.clone());
        let table = SlotTable { nodes, owners: owners.into(), fallback };
        let plan = MovePlan::between(self, &table);
        (table, plan)
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

/// Each node's cap, `ceil(s + 3 sqrt(s))` for its exact share `s` (0 for a drained node).
fn caps(nodes: &NodeSet) -> Vec<usize> {
    let total = nodes.total_weight() as f64;
    nodes
        .nodes()
        .iter()
        .map(|node| {
            if !node.is_live() {
                return 0;
            }
            let share = SLOT_COUNT as f64 * f64::from(node.weight()) / total;
            // IEEE division and square root are exactly rounded: the same caps on every platform.
            ((share + 3.0 * share.sqrt()).ceil() as usize).min(SLOT_COUNT)
        })
        .collect()
}

impl MovePlan {
    /// The slots whose owner (by name) differs between two tables, in slot order: the plan that
    /// turns `from` into `to`.
    pub fn between(from: &SlotTable, to: &SlotTable) -> MovePlan {
        let moves = (0..SLOT_COUNT as u16)
            .filter_map(|slot| {
                let old = from.slot_owner_name(slot);
                let new = to.slot_owner_name(slot)?;
                (old != Some(new)).then(|| SlotMove { slot, from: old.map(str::to_owned), to: new.to_owned() })
            })
            .collect();
        MovePlan { moves }
    }
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
    fn a_table_is_each_slots_top_rendezvous_node_within_the_caps() {
        let set = NodeSet::parse("a,b,c").expect("valid");
        let t = SlotTable::new(set.clone());
        let hrw = Rendezvous::new(set.clone());
        let caps = caps(&set);
        assert_eq!(caps, vec![5684, 5684, 5684]); // 5461.33 + 3 x 73.90 = 5683.03, rounded up
        let counts = t.slot_counts();
        assert_eq!(counts.iter().sum::<usize>(), SLOT_COUNT);
        // Nobody reaches a cap here, so every slot is its top rendezvous node's.
        assert!(counts.iter().zip(&caps).all(|(c, cap)| c < cap));
        for slot in 0..SLOT_COUNT as u16 {
            assert_eq!(t.slot_owner(slot), hrw.pick_hash(slot_hash(usize::from(slot))));
        }
    }

    #[test]
    fn a_node_over_its_cap_keeps_its_strongest_slots() {
        // One node among many tiny ones: shares of a fraction of a slot have a cap of 1 to 4.
        let set = NodeSet::parse(&(0..5000).map(|i| format!("n{i}")).collect::<Vec<_>>().join(",")).expect("valid");
        let t = SlotTable::new(set.clone());
        let caps = caps(&set);
        let counts = t.slot_counts();
        assert!(counts.iter().zip(&caps).all(|(c, cap)| c <= cap));
        assert_eq!(counts.iter().sum::<usize>(), SLOT_COUNT);
        // Some node was capped (three slots each at most with a share of 3.3 is far too tight for
        // 5,000 binomial counts) and kept exactly its cap.
        assert!(counts.iter().zip(&caps).any(|(c, cap)| c == cap));
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

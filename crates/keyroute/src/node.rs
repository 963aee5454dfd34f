//! Node identity: a name, a weight and an optional zone, and the validated set a table is built from.
//!
//! A node's **name** is its identity for placement: every strategy hashes names, never addresses or
//! positions, so two gateways that list the same nodes place every key the same way. Two
//! primitives number their buckets by position instead, [`Modulo`](crate::Modulo) and
//! [`JumpHash`](crate::JumpHash); [`NodeSet::canonical`] orders a set by name (numbers in names
//! compared as numbers, so `shard-9` comes before `shard-10`), and
//! [`Table::build`](crate::Table::build) builds every native strategy from the canonical order, so
//! every such table is a function of the member set alone, whatever order or history the members
//! came in. The compatibility modes ([`crate::compat`]) are the exception, by necessity: they
//! follow the order their original follows (Guava's buckets, `redis-cli`'s masters, HAProxy's
//! automatic ids, Envoy's running sums), which is the order the nodes are given in.
//!
//! A **weight** is a non-negative integer; a node's share of keys is proportional to it. Weight 0
//! means *drained*: the node stays in the set (so its index is stable and it can come back) but owns
//! nothing and is never picked.
//!
//! A **zone** (rack, availability zone, ...) is used by zone-aware preference lists, which place
//! replicas in distinct zones when they can ([`ZoneAware`](crate::ZoneAware)).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::hash::node_seed;
use crate::{Error, ErrorKind};

/// One node: a name, a weight (0 = drained) and an optional zone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    name: Arc<str>,
    weight: u32,
    zone: Option<Arc<str>>,
    id: Option<u32>,
}

impl Node {
    /// A node of weight 1 and no zone.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::EmptyName`] if `name` is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// let n = keyroute::Node::try_new("cache-1")?.with_weight(2).with_zone("eu-west-1a");
    /// assert_eq!((n.name(), n.weight(), n.zone()), ("cache-1", 2, Some("eu-west-1a")));
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn try_new(name: impl AsRef<str>) -> Result<Self, Error> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(Error::new(ErrorKind::EmptyName, "a node name must not be empty"));
        }
        Ok(Node { name: Arc::from(name), weight: 1, zone: None, id: None })
    }

    /// A node from a name known to be valid, for literals and tests.
    ///
    /// # Panics
    ///
    /// If `name` is empty.
    pub fn new_unchecked(name: &str) -> Self {
        assert!(!name.is_empty(), "a node name must not be empty");
        Node { name: Arc::from(name), weight: 1, zone: None, id: None }
    }

    /// The same node with another weight (0 = drained).
    #[must_use]
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// The same node in a zone (an empty zone name means no zone).
    #[must_use]
    pub fn with_zone(mut self, zone: impl AsRef<str>) -> Self {
        let zone = zone.as_ref();
        self.zone = (!zone.is_empty()).then(|| Arc::from(zone));
        self
    }

    /// The same node with a numeric id: what placements that hash a number instead of a name read
    /// (HAProxy's server `id`, [`crate::compat::haproxy`]). Other strategies ignore it.
    #[must_use]
    pub fn with_id(mut self, id: u32) -> Self {
        self.id = Some(id);
        self
    }

    /// The node's numeric id, if it was given one ([`Node::with_id`]).
    pub fn id(&self) -> Option<u32> {
        self.id
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The node's zone, if it has one.
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// Whether the node can own keys (weight above 0).
    pub fn is_live(&self) -> bool {
        self.weight > 0
    }
}

impl fmt::Display for Node {
    /// The node in the specification syntax of [`NodeSet::parse`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if self.weight != 1 {
            write!(f, ":weight={}", self.weight)?;
        }
        if let Some(zone) = &self.zone {
            write!(f, ":zone={zone}")?;
        }
        if let Some(id) = self.id {
            write!(f, ":id={id}")?;
        }
        Ok(())
    }
}

/// A validated, immutable set of nodes: names non-empty and unique.
///
/// Cheap to clone (one `Arc`). Tables index nodes by their position in this set, and precompute
/// here what every strategy needs: each node's seed (see [`crate::hash`]), its rank in name order
/// (for deterministic tie breaks), and a dense zone id.
#[derive(Clone, Debug)]
pub struct NodeSet {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Node>,
    seeds: Vec<u64>,
    name_rank: Vec<u32>,
    zone_ids: Vec<u32>,
    zone_count: u32,
    total_weight: u64,
    live: Vec<u32>,
}

impl NodeSet {
    /// Validates and indexes a list of nodes. The order is kept: node `i` of the input is index `i`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::DuplicateName`] if two nodes share a name; [`ErrorKind::TooLarge`] above
    /// `u32::MAX - 1` nodes.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyroute::{Node, NodeSet};
    /// let set = NodeSet::try_new([Node::try_new("a")?, Node::try_new("b")?.with_weight(0)])?;
    /// assert_eq!((set.len(), set.live_count(), set.total_weight()), (2, 1, 1));
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn try_new(nodes: impl IntoIterator<Item = Node>) -> Result<Self, Error> {
        let nodes: Vec<Node> = nodes.into_iter().collect();
        if nodes.len() >= u32::MAX as usize {
            return Err(Error::new(ErrorKind::TooLarge, format!("{} nodes is too many", nodes.len())));
        }
        let mut seen: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
        for (i, node) in nodes.iter().enumerate() {
            if let Some(first) = seen.insert(node.name(), i) {
                return Err(Error::new(
                    ErrorKind::DuplicateName,
                    format!("duplicate node name '{}' (nodes {} and {})", node.name(), first + 1, i + 1),
                ));
            }
        }
        let seeds = nodes.iter().map(|n| node_seed(n.name())).collect();
        let mut by_name: Vec<u32> = (0..nodes.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| nodes[a as usize].name().cmp(nodes[b as usize].name()));
        let mut name_rank = vec![0u32; nodes.len()];
        for (rank, &i) in by_name.iter().enumerate() {
            name_rank[i as usize] = rank as u32;
        }
        // Dense zone ids; a node without a zone is a zone of its own.
        let mut zones: HashMap<&str, u32> = HashMap::new();
        let mut next = 0u32;
        let zone_ids = nodes
            .iter()
            .map(|n| {
                let id = match n.zone() {
                    Some(z) => *zones.entry(z).or_insert(next),
                    None => next,
                };
                if id == next {
                    next += 1;
                }
                id
            })
            .collect();
        let total_weight = nodes.iter().map(|n| u64::from(n.weight())).sum();
        let live = (0..nodes.len() as u32).filter(|&i| nodes[i as usize].is_live()).collect();
        Ok(NodeSet {
            inner: Arc::new(Inner { nodes, seeds, name_rank, zone_ids, zone_count: next, total_weight, live }),
        })
    }

    /// The empty set: every table built from it answers `None`.
    pub fn empty() -> Self {
        NodeSet {
            inner: Arc::new(Inner {
                nodes: Vec::new(),
                seeds: Vec::new(),
                name_rank: Vec::new(),
                zone_ids: Vec::new(),
                zone_count: 0,
                total_weight: 0,
                live: Vec::new(),
            }),
        }
    }

    /// Parses a comma-separated node specification: `a,b:weight=2,c:zone=eu,d:weight=0:zone=us`.
    ///
    /// Each token is a name followed by optional `:weight=N`, `:zone=Z` and `:id=N` attributes (in
    /// any order; `id` is HAProxy's numeric server id, read by [`crate::compat::haproxy`] only).
    /// Attributes are read from the right, so a name may itself contain `:` (`10.0.0.1:8080:weight=2`).
    /// Empty tokens are ignored, so a trailing comma is harmless.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSpec`] naming the offending token and its position, or the errors of
    /// [`NodeSet::try_new`].
    ///
    /// # Examples
    ///
    /// ```
    /// let set = keyroute::NodeSet::parse("a,b:weight=2,c:zone=eu")?;
    /// assert_eq!(set.get(1).map(|n| n.weight()), Some(2));
    /// assert!(keyroute::NodeSet::parse("a,b:weight=x").is_err());
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn parse(spec: &str) -> Result<Self, Error> {
        let mut nodes = Vec::new();
        for (i, token) in spec.split(',').enumerate() {
            let token = token.trim();
            if token.is_empty() {
                continue;
            }
            nodes.push(parse_node(token).map_err(|why| {
                Error::new(ErrorKind::InvalidSpec, format!("invalid node spec at token {} ('{token}'): {why}", i + 1))
            })?);
        }
        NodeSet::try_new(nodes)
    }

    /// The number of nodes, drained ones included.
    pub fn len(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Whether the set has no nodes at all.
    pub fn is_empty(&self) -> bool {
        self.inner.nodes.is_empty()
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[Node] {
        &self.inner.nodes
    }

    /// Node `index`, if in range.
    pub fn get(&self, index: usize) -> Option<&Node> {
        self.inner.nodes.get(index)
    }

    /// The index of the node with this name.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.inner.nodes.iter().position(|n| n.name() == name)
    }

    /// The indices of the nodes with weight above 0, in order.
    pub fn live(&self) -> &[u32] {
        &self.inner.live
    }

    /// The number of nodes with weight above 0.
    pub fn live_count(&self) -> usize {
        self.inner.live.len()
    }

    /// The sum of all weights.
    pub fn total_weight(&self) -> u64 {
        self.inner.total_weight
    }

    /// Each node's seed, `hash::node_seed(name)`.
    pub fn seeds(&self) -> &[u64] {
        &self.inner.seeds
    }

    /// Each node's rank in byte-wise name order: the deterministic tie break between equal scores.
    pub fn name_ranks(&self) -> &[u32] {
        &self.inner.name_rank
    }

    /// Each node's dense zone id (a node without a zone has a zone id of its own).
    pub fn zone_ids(&self) -> &[u32] {
        &self.inner.zone_ids
    }

    /// The number of distinct zone ids.
    pub fn zone_count(&self) -> usize {
        self.inner.zone_count as usize
    }

    /// The same nodes in canonical order: by name, with runs of digits compared as numbers
    /// ([`canonical_cmp`]). Free when the set is already in that order.
    ///
    /// Every strategy built from the canonical order is a function of the member set alone; this is
    /// the order [`Table::build`](crate::Table::build) uses.
    ///
    /// # Examples
    ///
    /// ```
    /// let set = keyroute::NodeSet::parse("shard-10,shard-9,b,a")?;
    /// assert_eq!(set.canonical().to_string(), "a,b,shard-9,shard-10");
    /// # Ok::<(), keyroute::Error>(())
    /// ```
    pub fn canonical(&self) -> NodeSet {
        if self.is_canonical() {
            return self.clone();
        }
        let mut nodes = self.nodes().to_vec();
        nodes.sort_by(|a, b| canonical_cmp(a.name(), b.name()));
        // The same names, reordered: still unique.
        NodeSet::try_new(nodes).unwrap_or_else(|_| self.clone())
    }

    /// The node indices in canonical order ([`NodeSet::canonical`]): position `b` of the result is
    /// the index of the `b`-th node by name. What positional strategies number their buckets by.
    pub fn canonical_indices(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        order.sort_by(|&a, &b| canonical_cmp(self.nodes()[a as usize].name(), self.nodes()[b as usize].name()));
        order
    }

    /// Whether the nodes are in canonical order ([`NodeSet::canonical`]).
    pub fn is_canonical(&self) -> bool {
        self.nodes().windows(2).all(|w| canonical_cmp(w[0].name(), w[1].name()).is_lt())
    }

    /// The same nodes plus `node` at the end.
    ///
    /// # Errors
    ///
    /// As [`NodeSet::try_new`].
    pub fn with_node(&self, node: Node) -> Result<Self, Error> {
        NodeSet::try_new(self.nodes().iter().cloned().chain(std::iter::once(node)))
    }

    /// The same nodes without the one named `name` (unchanged if absent).
    pub fn without(&self, name: &str) -> Self {
        let nodes: Vec<Node> = self.nodes().iter().filter(|n| n.name() != name).cloned().collect();
        // Removing a node from a valid set keeps it valid.
        NodeSet::try_new(nodes).unwrap_or_else(|_| self.clone())
    }

    /// The same nodes with `name`'s weight replaced (unchanged if absent).
    pub fn with_weight(&self, name: &str, weight: u32) -> Self {
        let nodes: Vec<Node> = self
            .nodes()
            .iter()
            .map(|n| if n.name() == name { n.clone().with_weight(weight) } else { n.clone() })
            .collect();
        NodeSet::try_new(nodes).unwrap_or_else(|_| self.clone())
    }
}

impl fmt::Display for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.nodes().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

/// The canonical order of node names: byte-wise, except that runs of ASCII digits compare as
/// numbers (`n2 < n10`); names equal as numbers (`n01`, `n1`) fall back to byte order. A total
/// order: distinct names never compare equal.
///
/// # Examples
///
/// ```
/// use keyroute::node::canonical_cmp;
/// use std::cmp::Ordering::*;
/// assert_eq!(canonical_cmp("w9", "w10"), Less);
/// assert_eq!(canonical_cmp("w10", "x1"), Less);
/// assert_eq!(canonical_cmp("w01", "w1"), Less);
/// ```
pub fn canonical_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        if x[i].is_ascii_digit() && y[j].is_ascii_digit() {
            let run = |s: &[u8], mut k: usize| {
                while k < s.len() && s[k] == b'0' {
                    k += 1;
                }
                let start = k;
                while k < s.len() && s[k].is_ascii_digit() {
                    k += 1;
                }
                (start, k)
            };
            let ((xs, xe), (ys, ye)) = (run(x, i), run(y, j));
            // Without leading zeros, a longer run is a larger number; equal lengths compare bytewise.
            let order = (xe - xs).cmp(&(ye - ys)).then_with(|| x[xs..xe].cmp(&y[ys..ye]));
            if order != Ordering::Equal {
                return order;
            }
            i = xe;
            j = ye;
        } else {
            match x[i].cmp(&y[j]) {
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
                other => return other,
            }
        }
    }
    (x.len() - i).cmp(&(y.len() - j)).then_with(|| x.cmp(y))
}

fn parse_node(token: &str) -> Result<Node, String> {
    let mut rest = token;
    let mut weight = None;
    let mut zone = None;
    let mut id = None;
    while let Some((head, attr)) = rest.rsplit_once(':') {
        if let Some(w) = attr.strip_prefix("weight=") {
            if weight.is_some() {
                return Err("weight given twice".into());
            }
            weight = Some(w.parse::<u32>().map_err(|_| format!("weight '{w}' is not an integer in 0..=4294967295"))?);
        } else if let Some(z) = attr.strip_prefix("zone=") {
            if zone.is_some() {
                return Err("zone given twice".into());
            }
            if z.is_empty() {
                return Err("zone must not be empty".into());
            }
            zone = Some(z);
        } else if let Some(v) = attr.strip_prefix("id=") {
            if id.is_some() {
                return Err("id given twice".into());
            }
            id = Some(v.parse::<u32>().map_err(|_| format!("id '{v}' is not an integer in 0..=4294967295"))?);
        } else if attr.contains('=') {
            let key = attr.split('=').next().unwrap_or(attr);
            return Err(format!("unknown attribute '{key}' (expected weight=, zone= or id=)"));
        } else {
            break;
        }
        rest = head;
    }
    let mut node = Node::try_new(rest).map_err(|e| e.to_string())?;
    if let Some(w) = weight {
        node = node.with_weight(w);
    }
    if let Some(z) = zone {
        node = node.with_zone(z);
    }
    if let Some(i) = id {
        node = node.with_id(i);
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_attributes_from_the_right() {
        let set = NodeSet::parse("10.0.0.1:8080:weight=3:zone=a, b:zone=x:weight=0,c,").expect("valid");
        let n: Vec<_> = set.nodes().iter().map(|n| (n.name(), n.weight(), n.zone())).collect();
        assert_eq!(n, vec![("10.0.0.1:8080", 3, Some("a")), ("b", 0, Some("x")), ("c", 1, None)]);
        assert_eq!(set.to_string(), "10.0.0.1:8080:weight=3:zone=a,b:weight=0:zone=x,c");
    }

    #[test]
    fn parse_errors_name_the_token() {
        for (spec, needle) in [
            ("a,b:weight=-1", "token 2 ('b:weight=-1')"),
            ("a,:weight=2", "must not be empty"),
            ("a,b:color=red", "unknown attribute 'color'"),
            ("a,b:zone=", "zone must not be empty"),
            ("a,b,a", "duplicate node name 'a'"),
        ] {
            let err = NodeSet::parse(spec).expect_err(spec);
            assert!(err.to_string().contains(needle), "{spec}: {err}");
        }
    }

    #[test]
    fn zone_ids_are_dense_and_zoneless_nodes_are_alone() {
        let set = NodeSet::parse("a:zone=x,b,c:zone=x,d:zone=y,e").expect("valid");
        assert_eq!(set.zone_ids(), &[0, 1, 0, 2, 3]);
        assert_eq!(set.zone_count(), 4);
    }

    #[test]
    fn canonical_order_is_total_and_numeric() {
        use std::cmp::Ordering::*;
        for (a, b, want) in [
            ("a", "b", Less),
            ("a", "a", Equal),
            ("w2", "w10", Less),
            ("w10", "w2", Greater),
            ("w007", "w7", Less),
            ("w7", "w007", Greater),
            ("w7x", "w7", Greater),
            ("10.0.0.2:80", "10.0.0.10:80", Less),
            ("", "0", Less),
            ("9", "a", Less),
        ] {
            assert_eq!(canonical_cmp(a, b), want, "{a} vs {b}");
        }
        let set = NodeSet::parse("w10,w9,w1,v").expect("valid");
        assert_eq!(set.canonical().to_string(), "v,w1,w9,w10");
        assert!(set.canonical().is_canonical());
        assert!(!set.is_canonical());
    }

    #[test]
    fn name_ranks_follow_byte_order() {
        let set = NodeSet::parse("c,a,b").expect("valid");
        assert_eq!(set.name_ranks(), &[2, 0, 1]);
    }
}

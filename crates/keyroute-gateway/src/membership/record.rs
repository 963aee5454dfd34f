//! The etcd layout of a pool's members: a public contract, like the hash.
//!
//! A pool's workers live under its prefix, one key per worker, the key's last segment being the
//! worker's name (its identity for placement):
//!
//! ```text
//! /keyroute/pools/thumbs/workers/w1  ->  {"address": "10.0.0.7:8080", "weight": 1, "zone": "eu-1a", "state": "active"}
//! ```
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `address` | string, required | `ip:port` or `host:port` the gateway connects to |
//! | `weight` | integer 1..=4294967295, default 1 | the worker's share of keys |
//! | `zone` | string, optional | for zone-aware replica lists |
//! | `state` | `"active"` (default) or `"draining"` | a draining worker keeps its place in the table, but gets no new requests: its keys go to the next worker of their ranking |
//!
//! Unknown fields are ignored (a newer keyroute may add some). A record that is not valid, a name
//! with a `/`, or an address another record already has (the one whose name sorts first keeps it)
//! is rejected on its own, with a log line naming its key: the other workers are applied. Every
//! gateway applies the same rules to the same records, so they agree on the members, and so on
//! every placement.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::validate_worker_with;
use crate::pool::Member;

/// A worker's record, as stored in etcd (see the [module documentation](self)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Where the worker listens.
    pub address: String,
    /// Its weight.
    #[serde(default = "one")]
    pub weight: i64,
    /// Its zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Its numeric id, for the `haproxy` placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Active or draining.
    #[serde(default)]
    pub state: RecordState,
}

fn one() -> i64 {
    1
}

/// Whether a worker takes new requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordState {
    /// It does.
    #[default]
    Active,
    /// It is leaving: no new requests.
    Draining,
}

impl WorkerRecord {
    /// The record's JSON.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A record that was not applied, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The key, as text (lossy for bytes that are not UTF-8).
    pub key: String,
    /// Why.
    pub reason: String,
}

/// The members a set of records gives, and the records rejected. Records are `(key, value)`;
/// keys outside `prefix` are ignored. A function of the records alone (their order does not
/// matter), so every gateway derives the same members from the same records. A record at one of
/// `own` (this gateway's addresses) is a member like any other, so that this gateway's table is
/// every other gateway's; it is marked [`Member::at_this_gateway`] and never sent to here.
pub fn members_of(
    prefix: &[u8],
    records: &[(Vec<u8>, Vec<u8>)],
    own: &[SocketAddr],
    resolve: impl Fn(&str) -> Option<SocketAddr>,
) -> (Vec<Member>, Vec<Rejected>) {
    let mut members = Vec::new();
    let mut rejected = Vec::new();
    for (key, value) in records {
        let Some(name) = key.strip_prefix(prefix) else { continue };
        let shown = String::from_utf8_lossy(key).into_owned();
        match member(name, value, own, &resolve) {
            Ok(m) => members.push(m),
            Err(reason) => rejected.push(Rejected { key: shown, reason }),
        }
    }
    // One worker per address: the name that sorts first keeps it.
    members.sort_by(|a: &Member, b: &Member| keyroute::node::canonical_cmp(&a.worker.name, &b.worker.name));
    let mut first: HashMap<SocketAddr, String> = HashMap::new();
    members.retain(|m| match first.get(&m.worker.address) {
        Some(holder) => {
            rejected.push(Rejected {
                key: format!("{}{}", String::from_utf8_lossy(prefix), m.worker.name),
                reason: format!("address {} is already worker '{holder}'s", m.worker.address),
            });
            false
        }
        None => {
            first.insert(m.worker.address, m.worker.name.clone());
            true
        }
    });
    rejected.sort_by(|a, b| a.key.cmp(&b.key));
    (members, rejected)
}

fn member(
    name: &[u8],
    value: &[u8],
    own: &[SocketAddr],
    resolve: &impl Fn(&str) -> Option<SocketAddr>,
) -> Result<Member, String> {
    let name =
        std::str::from_utf8(name).map_err(|_| "the worker name (the key's last segment) is not UTF-8".to_owned())?;
    if name.is_empty() || name.contains('/') {
        return Err("the worker name (the key after the prefix) must be one non-empty segment".into());
    }
    let record: WorkerRecord = serde_json::from_slice(value).map_err(|e| format!("not a worker record: {e}"))?;
    let weight = u32::try_from(record.weight).ok().filter(|&w| w > 0).ok_or_else(|| {
        format!("weight {} is not in 1..=4294967295 (drain with \"state\": \"draining\")", record.weight)
    })?;
    let mut worker = validate_worker_with(name, &record.address, weight, record.zone.as_deref(), &[], resolve)
        .map_err(|e| format!("{}: {}", e.field, e.message))?;
    if record.id == Some(0) {
        return Err("id: must be at least 1 (HAProxy's ids start at 1)".into());
    }
    worker.id = record.id;
    let at_this_gateway = own.iter().any(|o| crate::config::points_at(worker.address, *o));
    Ok(Member { worker, draining: record.state == RecordState::Draining, at_this_gateway })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(s: &str) -> Option<SocketAddr> {
        s.parse().ok()
    }

    fn rec(name: &str, json: &str) -> (Vec<u8>, Vec<u8>) {
        (format!("/p/{name}").into_bytes(), json.as_bytes().to_vec())
    }

    #[test]
    fn records_become_members_and_bad_ones_are_rejected_alone() {
        let records = vec![
            rec("w1", r#"{"address":"127.0.0.1:9001"}"#),
            rec("w2", r#"{"address":"127.0.0.1:9002","weight":3,"zone":"a","state":"draining","future":1}"#),
            rec("bad-json", "{"),
            rec("bad-state", r#"{"address":"127.0.0.1:9003","state":"sleeping"}"#),
            rec("zero", r#"{"address":"127.0.0.1:9004","weight":0}"#),
            rec("negative", r#"{"address":"127.0.0.1:9005","weight":-2}"#),
            rec("x-dup", r#"{"address":"127.0.0.1:9001"}"#),
            rec("a/b", r#"{"address":"127.0.0.1:9006"}"#),
            rec("self", r#"{"address":"127.0.0.1:8080"}"#),
            rec("noaddr", r#"{"weight":1}"#),
            (b"/other/x".to_vec(), b"junk".to_vec()),
        ];
        let own: Vec<SocketAddr> = vec!["127.0.0.1:8080".parse().expect("addr")];
        let (members, rejected) = members_of(b"/p/", &records, &own, resolve);
        let names: Vec<_> =
            members.iter().map(|m| (m.worker.name.as_str(), m.worker.weight, m.draining, m.at_this_gateway)).collect();
        // A record at this gateway's own address is a member (every gateway's table is the
        // same), marked so that this gateway never sends to it.
        assert_eq!(names, vec![("self", 1, false, true), ("w1", 1, false, false), ("w2", 3, true, false)]);
        assert_eq!(members[2].worker.zone.as_deref(), Some("a"));
        let why: Vec<_> = rejected.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(why, ["/p/a/b", "/p/bad-json", "/p/bad-state", "/p/negative", "/p/noaddr", "/p/x-dup", "/p/zero"]);
        assert!(rejected.iter().any(|r| r.key == "/p/x-dup" && r.reason.contains("worker 'w1'")), "{rejected:?}");
        assert!(rejected.iter().any(|r| r.key == "/p/zero" && r.reason.contains("weight 0")), "{rejected:?}");
    }

    #[test]
    fn the_members_do_not_depend_on_the_records_order() {
        let mut records = vec![
            rec("b", r#"{"address":"127.0.0.1:9001"}"#),
            rec("a", r#"{"address":"127.0.0.1:9001"}"#),
            rec("c", r#"{"address":"127.0.0.1:9002"}"#),
        ];
        let (m1, r1) = members_of(b"/p/", &records, &[], resolve);
        records.reverse();
        let (m2, r2) = members_of(b"/p/", &records, &[], resolve);
        assert_eq!((m1, r1), (m2.clone(), r2));
        assert_eq!(m2.iter().map(|m| m.worker.name.as_str()).collect::<Vec<_>>(), ["a", "c"]);
    }
}

//! The members a prefix's records give (the layout is [`keyroute_etcd::record`], a public
//! contract, like the hash).
//!
//! A record that is not valid, a name with a `/`, or an address another record already has (the
//! one whose name sorts first keeps it) is rejected on its own, with a log line naming its key:
//! the other workers are applied. Every gateway applies the same rules to the same records, so
//! they agree on the members, and so on every placement.

use std::collections::HashMap;
use std::net::SocketAddr;

use keyroute_etcd::record::{RecordState, WorkerRecord};

use crate::config::validate_worker_with;
use crate::pool::Member;

/// A record that was not applied, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// The key, as text (lossy for bytes that are not UTF-8).
    pub key: String,
    /// Why.
    pub reason: RecordError,
}

/// Why a record is not a member.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RecordError {
    /// The key's last segment is not UTF-8.
    #[error("the worker name (the key's last segment) is not UTF-8")]
    NameNotUtf8,
    /// The key after the prefix is empty or has a `/`.
    #[error("the worker name (the key after the prefix) must be one non-empty segment")]
    NameNotSegment,
    /// The value is not a record (the JSON parser's message).
    #[error("not a worker record: {0}")]
    NotARecord(String),
    /// A weight outside `1..=4294967295`.
    #[error("weight {0} is not in 1..=4294967295 (drain with \"state\": \"draining\")")]
    Weight(i64),
    /// A field a configuration file would refuse too.
    #[error("{field}: {message}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// An id of 0.
    #[error("id: must be at least 1 (HAProxy's ids start at 1)")]
    IdZero,
    /// Another record has the address (the name that sorts first keeps it).
    #[error("address {address} is already worker '{holder}'s")]
    AddressTaken {
        /// The address.
        address: SocketAddr,
        /// The worker that keeps it.
        holder: String,
    },
    /// The pool's table cannot take it (alone, or with the members before it in name order).
    #[error("{}{reason}", if *.with_others { "with the members before it: " } else { "" })]
    Table {
        /// Whether it fits alone but not with the members before it.
        with_others: bool,
        /// The table's reason.
        reason: String,
    },
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
                reason: RecordError::AddressTaken { address: m.worker.address, holder: holder.clone() },
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
) -> Result<Member, RecordError> {
    let name = std::str::from_utf8(name).map_err(|_| RecordError::NameNotUtf8)?;
    if name.is_empty() || name.contains('/') {
        return Err(RecordError::NameNotSegment);
    }
    let record: WorkerRecord = serde_json::from_slice(value).map_err(|e| RecordError::NotARecord(e.to_string()))?;
    let weight = u32::try_from(record.weight).ok().filter(|&w| w > 0).ok_or(RecordError::Weight(record.weight))?;
    let mut worker = validate_worker_with(name, &record.address, weight, record.zone.as_deref(), &[], resolve)
        .map_err(|e| RecordError::Field { field: e.field, message: e.message })?;
    if record.id == Some(0) {
        return Err(RecordError::IdZero);
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
        assert!(
            rejected.iter().any(|r| r.key == "/p/x-dup" && r.reason.to_string().contains("worker 'w1'")),
            "{rejected:?}"
        );
        assert!(
            rejected.iter().any(|r| r.key == "/p/zero" && r.reason.to_string().contains("weight 0")),
            "{rejected:?}"
        );
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

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
//! | `id` | integer 1..=4294967295, optional | the worker's server id, for the `haproxy` placement |
//! | `state` | `"active"` (default) or `"draining"` | a draining worker keeps its place in the table, but gets no new requests: its keys go to the next worker of their ranking |
//!
//! Unknown fields are ignored (a newer keyroute may add some). How a gateway turns a prefix's
//! records into members (and which records it rejects, each alone) is
//! `keyroute_fleet::membership::members_of`.

use serde::{Deserialize, Serialize};

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

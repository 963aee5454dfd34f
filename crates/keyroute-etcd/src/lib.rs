//! keyroute's fleet membership in etcd: what a worker's record looks like, and the small client
//! that reads, writes and watches records.
//!
//! Every gateway of a fleet watches a pool's prefix and builds its table from the records under
//! it; workers keep their own record alive with a lease; operators edit records (through a
//! gateway's admin API or `keyroute members`). This crate is the etcd side of that, and nothing
//! of the gateway: a program that only registers a worker, or only lists a pool, needs no proxy.
//!
//! | module | what it holds |
//! |---|---|
//! | [`record`] | the record layout under a pool's prefix (a public contract, like the hash) |
//! | [`client`] | an etcd v3 client over etcd's HTTP/JSON gateway (no gRPC, no `protoc`) |
//! | [`registry`] | a pool's records: list, add, remove, and compare-and-swap edits |
//! | [`gateways`] | the gateways of a fleet, announced with a lease, so that no record is put at one |
//! | [`register`] | a worker keeping its own record alive with a lease, and leaving gracefully |
//!
//! ```no_run
//! use keyroute_etcd::record::{RecordState, WorkerRecord};
//! use keyroute_etcd::registry::Registry;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = Registry::from_url("etcd://127.0.0.1:2379/keyroute/pools/thumbs/workers/")?;
//! let record = WorkerRecord {
//!     address: "10.0.0.7:8080".into(),
//!     weight: 1,
//!     zone: None,
//!     id: None,
//!     state: RecordState::Active,
//! };
//! pool.add("w1", &record, 0).await?;
//! let (revision, listed) = pool.list().await?;
//! println!("{} records at revision {revision}", listed.len());
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod client;
pub mod gateways;
pub mod record;
pub mod register;
pub mod registry;

pub use client::{Client, EtcdError};

/// Until `rx` says stop (the guard `wait_for` returns is dropped here, not held in a `select!`
/// across awaits, which would make the future not `Send`).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

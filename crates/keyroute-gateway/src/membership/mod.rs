//! Pool members from a membership source other than the configuration file: etcd.
//!
//! - [`record`]: the etcd layout of a pool's members (a public contract), and the members a set
//!   of records gives.
//! - [`registry`]: writing records (the admin API of an etcd-backed pool, `keyroute members`).
//! - [`register`]: a worker keeping its own record alive with a lease, and leaving gracefully.
//! - `source`: the task that reads and watches a pool's prefix and applies every change as one
//!   snapshot swap.
//! - `saved`: the last applied members on local disk, for a start while etcd is down.

pub mod record;
pub mod register;
pub mod registry;
pub(crate) mod saved;
pub(crate) mod source;

//! # keyroute-gateway: an HTTP reverse proxy that keeps cache affinity and still balances load
//!
//! The first source document's gateway, for real. Requests come in on listeners, are routed by host
//! and path prefix to a pool, and each pool places them on its workers with a keyroute strategy
//! over a key built from the request (`{path}?w={query.w}&h={query.h}` for the thumbnail service):
//!
//! - **Affinity with failover.** Hash strategies send a key to its owner; when the owner is
//!   unhealthy, ejected, draining or over its bounded-load capacity, to the next worker of the
//!   key's ranking (the document: "take the second entry in the ranking when the winner is down").
//!   Never a full rehash: other keys stay where they are.
//! - **Load.** Requests in flight per worker, counted by a guard that the response body holds until
//!   it ends. `p2c`, `least-loaded`, `affinity` and `bounded-*` read it.
//! - **Health.** Active HTTP checks with rise/fall, and passive ejection after consecutive connect
//!   errors or 5xx, for a doubling cooldown.
//! - **Retries** of connect errors and timeouts on the next-ranked worker, for requests that can be
//!   replayed (no body) and, once they may have reached a worker, only for idempotent methods.
//! - **Hot membership changes**, atomically, through the admin API or a configuration reload.
//! - **Metrics** in Prometheus text, and an admin API. See [`admin`] for the endpoints.
//!
//! One atomic snapshot per pool (configuration, placement table, members, generation) is swapped
//! on every change; see [`pool`] for why health and load live beside it rather than in it.

#![deny(missing_docs)]

pub mod admin;
pub mod body;
pub mod config;
mod error;
pub mod health;
pub mod key;
mod listener;
pub mod metrics;
pub mod pool;
pub mod proxy;
mod server;
pub mod upstream;

pub use config::{Config, ConfigError};
pub use error::{GatewayError, ReloadError};
pub use proxy::ProxyService;
pub use server::{Gateway, GatewayHandle};

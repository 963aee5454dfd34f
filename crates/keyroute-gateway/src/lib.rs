//! # keyroute-gateway: an HTTP reverse proxy that keeps cache affinity and still balances load
//!
//! The first source document's gateway, for real. Requests come in on listeners, are routed by host
//! and path prefix to a pool, and each pool places them on its workers with a keyroute strategy
//! over a key built from the request (`{path}?w={query.w}&h={query.h}` for the thumbnail service):
//!
//! - **Affinity with failover.** Hash strategies send a key to its owner; when the owner is
//!   unhealthy, ejected, stalled, draining or over its bounded-load capacity, to the next worker of
//!   the key's ranking (the document: "take the second entry in the ranking when the winner is
//!   down"). Never a full rehash: other keys stay where they are.
//! - **Load.** Requests in flight per worker, counted by a guard that the response body holds until
//!   it ends. `p2c`, `least-loaded`, `affinity` and `bounded-*` read it.
//! - **Health.** Active HTTP checks on fresh connections with rise/fall; passive ejection after
//!   consecutive connect errors, timeouts, 5xx or bodies cut short, for a doubling cooldown; and a
//!   *stalled* state for a worker that holds requests and answers none.
//! - **Retries** on the next-ranked worker, for requests that can be replayed (no body) and, once
//!   they may have reached a worker, only for idempotent methods. A client's broken upload is the
//!   client's error, never the worker's.
//! - **Hot membership changes**, atomically, through the admin API or a configuration reload, with
//!   tables built off the request threads; or **membership from etcd**, shared by every gateway
//!   on a prefix, with workers that register themselves (see [`membership`]).
//! - **Hardening**: one reading of Host and the path (RFC 9112), loop detection, connection and
//!   header limits (one connection limit per listener, across threads), head and send timeouts,
//!   idle tunnels closed, only the upgrades a route allows tunnelled (never h2c), public errors that
//!   carry a reason class and a request id only; an admin API that refuses requests through a
//!   gateway, foreign Hosts (DNS rebinding) and other origins (CSRF).
//! - **Metrics** in Prometheus text, and an admin API (`GET /workers`, `POST /workers`, `PATCH` and
//!   `DELETE /workers/NAME`, `GET /placement?key=`, `/metrics`, `/healthz`, `/readyz`).
//!
//! One atomic snapshot per pool (configuration, placement table with the members' weights,
//! members, generation) is swapped on every change; health and load live in each worker's state,
//! which the snapshot holds, so that they travel with the worker across snapshots.
//!
//! The public face is small: [`Config`] to load and validate a file, [`Gateway`] to bind and run,
//! [`GatewayHandle`] to reload, change membership, inspect and stop, and [`ProxyService`] to call the
//! request path without a socket. [`membership`] turns a prefix's etcd records into members; the
//! records' layout (a public contract), the etcd client, the registry that writes records and the
//! registrar a worker keeps itself registered with are the [`keyroute_etcd`] crate's.
//!
//! ## Layout
//!
//! Each module imports only those listed above it (no two modules import each other, directly or
//! in a circle):
//!
//! | module | what |
//! |---|---|
//! | `body` | the body type, and the responses the gateway makes itself |
//! | `hop` | the hop-by-hop headers (never forwarded, never stored) |
//! | [`key`] | key templates over HTTP requests: the core's key language ([`keyroute::key`]) |
//! | `table` | node sets and the table size limit |
//! | [`tls`] | certificates, their validity, and SNI selection (rustls, `ring`) |
//! | [`config`] | `raw` (serde structs), `validate` (one function per section), the validated types |
//! | `health` | pure machines: `machine` (rise/fall), `eject` (passive ejection) |
//! | `metrics` | counters owned by what they count |
//! | `access` | access log lines, queued to a writer thread that reopens its file on demand |
//! | `listener` | accepting within limits (connection limits, back-off, open files) |
//! | `upstream` | per-worker, per-thread pools of [`keyroute_http1`] client connections |
//! | `cache` | the RFC 9111 cache for hot keys, with request coalescing |
//! | `pool` | `endpoint` (a worker's live state, by concern: health, progress, warm-up, load), `hot` (a pool's hot keys: detector, set, cache), `snapshot` (what a request reads; its decision is the core's steering rule, [`keyroute::steer`]), the pool (every member set, from any source, applied by one function: build, then swap) |
//! | `error` | the errors of starting and reloading |
//! | `routing` | listeners' routes to pools |
//! | `proxy` | `headers`, `guarded` (the two bodies), `tunnel` (upgraded connections), the request path as a service |
//! | `exposition` | `/metrics` rendering |
//! | `feed` | who watches the dashboard: its subscribers, its sampler's flag and history |
//! | `state` | what the running gateway's tasks share |
//! | [`membership`] | `record` (the members a prefix's records give), `saved` (the last members on disk), `source` (the watch task) |
//! | `prober` | the active health check task (beside, not inside, `health`: it needs `pool`) |
//! | `admin` | `guard` (origin, Host and token rules), then the admin API's endpoints, and `dashboard` (the operator's page and its feed) |
//! | `backend` | a cache listener's side of its servers: batches, placement and accounting |
//! | `pipe` | the cache listeners' server connections, shared by a thread's clients (tickets and turns) |
//! | `memcache` | the memcached listener's connection loop (its codec: [`keyroute_cache_proto::memcache`]) |
//! | `resp` | the Redis listener's connection loop (its codec and command table: [`keyroute_cache_proto`]) |
//! | `relocate` | `keyroute move`: a store's keys moved after a membership change (planned, rate-limited, resumable, verified) |
//! | `connection` | one connection: TLS and ALPN, HTTP/1.1 on [`keyroute_http1`] (head and send timeouts, upgrades) or HTTP/2 on hyper |
//! | `server` | [`Gateway`] and [`GatewayHandle`]: accept loops, the hot-key ticker, reload, shutdown |

#![deny(missing_docs)]
#![warn(unreachable_pub)]

// Alphabetical; the order of their imports is the layout table above.
mod access;
mod admin;
mod body;
pub(crate) mod cache;
pub mod config;
pub mod connection;
mod error;
mod exposition;
mod feed;
mod hop;
pub mod key;
mod listener;
mod probe;
mod proxy;
mod routing;
mod server;
mod state;
pub mod tls;
mod upstream;

// The pools, their workers and their health are the fleet's (`keyroute-fleet`): named here as the
// modules they were, until each product has a crate of its own.
pub use keyroute_cacheproxy::relocate;
pub use keyroute_fleet::membership;
pub(crate) use keyroute_fleet::{metrics, pool, table};

pub use body::{BoxError, ProxyBody};
pub use config::{Config, ConfigError, WorkerConfig};
pub use error::{GatewayError, ReloadError};
pub use keyroute_fleet::pool::hot::HotKeyInfo;
pub use keyroute_fleet::pool::{Member, MembershipError};
pub use keyroute_fleet::table::TooLarge;
pub use proxy::ProxyService;
pub use server::{Gateway, GatewayHandle, Membership, Placements};

/// Entry points for the fuzz targets (`fuzz/`). Not part of the public API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::admin::fuzzing::{add_worker, patch_worker};
}

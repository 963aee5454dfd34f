//! # keyroute-gateway: an HTTP reverse proxy that keeps cache affinity and still balances load
//!
//! The first source document's gateway, for real, and only the HTTP part of keyroute's server:
//! requests come in on listeners, are routed by host and path prefix to a pool, and each pool
//! places them on its workers with a keyroute strategy over a key built from the request
//! (`{path}?w={query.w}&h={query.h}` for the thumbnail service). The pools themselves (members,
//! placement, health, load, the one steering rule) are [`keyroute_fleet`]'s; binding, running and
//! reloading the whole server are `keyroute-server`'s.
//!
//! - **Affinity with failover.** Hash strategies send a key to its owner; when the owner is
//!   unhealthy, ejected, stalled, draining or over its bounded-load capacity, to the next worker of
//!   the key's ranking (the document: "take the second entry in the ranking when the winner is
//!   down"). Never a full rehash: other keys stay where they are.
//! - **Load.** Requests in flight per worker, counted by a guard that the response body holds until
//!   it ends. `p2c`, `least-loaded`, `affinity` and `bounded-*` read it.
//! - **Health.** Active HTTP checks on fresh connections, or gRPC's health protocol ([`probe`]); passive ejection after
//!   consecutive connect errors, timeouts, 5xx or bodies cut short; a *stalled* state for a
//!   worker that holds requests and answers none.
//! - **Retries** on the next-ranked worker, for requests that can be replayed (no body) and, once
//!   they may have reached a worker, only for idempotent methods; a request with a body only while
//!   no connection has taken it. A client's broken upload is the client's error, never the worker's.
//! - **Every protocol a worker speaks**: HTTP/1.1 on keyroute's own engine, HTTP/2 (prior knowledge
//!   or ALPN) and TLS or mutual TLS through hyper's client ([`upstream`]); gRPC calls keep their
//!   trailers, deadlines and statuses (`proxy::grpc`).
//! - **Hardening**: one reading of Host and the path (RFC 9112), loop detection, head, send and
//!   read timeouts, idle tunnels closed, only the upgrades a route allows tunnelled (never h2c),
//!   public errors that carry a reason class and a request id only.
//!
//! ## Layout
//!
//! Each module imports only those listed above it (no two modules import each other, directly or
//! in a circle):
//!
//! | module | what |
//! |---|---|
//! | [`body`] | the body type, and the responses the gateway makes itself |
//! | `hop` | the hop-by-hop headers (never forwarded, never stored) |
//! | `arena` | per-request buffers the runtime thread keeps between requests (key text, small values) |
//! | `head` | a request's and a response's head: as received with the request path's edits (HTTP/1.1), or as a map |
//! | [`key`] | key templates over HTTP requests: the core's key language ([`keyroute::key`]) |
//! | [`tls`] | certificates, their validity, and SNI selection (rustls, `ring`) |
//! | [`upstream::tls`] | TLS to workers: a pool's client configuration (CA bundle or system roots, names, client certificate) |
//! | [`config`] | a pool's and a route's HTTP settings |
//! | [`access`] | access log lines, queued to a writer thread that reopens its file on demand |
//! | [`upstream`] | per-worker, per-thread pools of [`keyroute_http1`] client connections (in each worker's protocol slot), and `mux`: hyper's HTTP/2 and TLS connections |
//! | [`cache`] | the RFC 9111 cache for hot keys, with request coalescing |
//! | [`routing`] | listeners' routes to pools, and each pool's HTTP side ([`routing::HttpPool`]) |
//! | [`proxy`] | `headers`, `guarded` (the two bodies), `tunnel` (upgraded connections), `grpc` (deadlines, statuses), the request path as a service |
//! | [`probe`] | the HTTP active check, and gRPC's |
//! | [`connection`] | one connection: TLS and ALPN, HTTP/1.1 on [`keyroute_http1`] (head and send timeouts, upgrades) or HTTP/2 on hyper, serving the proxy or another [`connection::Service`] |

#![deny(missing_docs)]

pub mod access;
mod arena;
pub mod body;
pub mod cache;
pub mod config;
pub mod connection;
mod head;
mod hop;
pub mod key;
pub mod probe;
pub mod proxy;
pub mod routing;
pub mod tls;
pub mod upstream;

pub use body::{BoxError, ProxyBody};
pub use proxy::ProxyService;

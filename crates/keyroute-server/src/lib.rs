//! # keyroute-server: one process, every listener, one fleet
//!
//! `keyroute serve`: the configuration file, the listeners it names (HTTP, memcached, Redis, the
//! admin API), hot reload and graceful shutdown. The products themselves are crates of their own,
//! and this crate only assembles them around one [`keyroute_fleet::Fleet`] (the pools, their
//! members from a file, the admin API or etcd, their health and load):
//!
//! | crate | what it serves |
//! |---|---|
//! | [`keyroute_gateway`] | the HTTP data plane: routes, placement by a key from the request, failover, retries, the response cache, TLS, HTTP/1.1 and HTTP/2 |
//! | [`keyroute_cacheproxy`] | the memcached and Redis data planes on one batch driver, and `keyroute move` |
//! | [`keyroute_admin`] | the admin API, `/metrics` and the dashboard, on the gateway's HTTP engine |
//! | [`keyroute_fleet`] | the pools, membership, health checks and the one steering rule every listener places by |
//!
//! - **Hot membership changes**, atomically, through the admin API or a configuration reload, with
//!   tables built off the request threads; or **membership from etcd**, shared by every gateway on
//!   a prefix, with workers that register themselves (see [`membership`]).
//! - **Limits**: one connection limit per listener across threads, back-off when the process runs
//!   out of file descriptors, the soft open-file limit raised to the hard one at start.
//! - **Threads**: each accepts on a socket of its own (`SO_REUSEPORT`); a thread that accepts a
//!   connection while it serves two more than the least busy one hands it over, as HAProxy does.
//! - **Reload** (`SIGHUP` or [`GatewayHandle::reload`]): a new file is validated whole before any
//!   of it applies; what cannot change without a restart (a listener's address, the admin API's
//!   address) is refused with the reason, and the running configuration stays.
//! - **Shutdown** (`SIGTERM`, `SIGINT`): not ready first, a delay for load balancers to notice,
//!   listeners closed, then requests in flight finish within a grace period.
//!
//! The public face is small: [`Config`] to load and validate a file, [`Gateway`] to bind and run,
//! [`GatewayHandle`] to reload, change membership, inspect and stop, and [`ProxyService`] to call
//! the HTTP request path without a socket.
//!
//! ## Layout
//!
//! | module | what |
//! |---|---|
//! | [`config`] | `raw` (serde structs), `validate` (one function per section), `nutcracker` (twemproxy files converted), the validated [`Config`] |
//! | `error` | the errors of starting and reloading |
//! | `listener` | accepting within limits (connection limits, back-off, open files) |
//! | `balance` | a listener's connections spread over the threads by how many each serves (a busy thread hands a new one over) |
//! | `probe` | each pool's active check, in its protocol |
//! | `state` | what the running server's tasks share |
//! | `server` | [`Gateway`] and [`GatewayHandle`]: binding, accept loops, the ticker, reload, shutdown |

#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod balance;
pub mod config;
mod error;
mod listener;
mod probe;
mod server;
mod state;

pub use keyroute_cacheproxy::relocate;
pub use keyroute_fleet::membership;
pub use keyroute_gateway::{key, tls};

pub use config::{Config, ConfigError, WorkerConfig};
pub use error::{GatewayError, ReloadError};
pub use keyroute_fleet::pool::hot::HotKeyInfo;
pub use keyroute_fleet::pool::{Member, MembershipError};
pub use keyroute_fleet::table::TooLarge;
pub use keyroute_gateway::{BoxError, ProxyBody, ProxyService};
pub use server::{Gateway, GatewayHandle, Membership, Placements};

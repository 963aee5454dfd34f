//! The errors of each boundary: starting and reloading the gateway (here), a configuration file
//! ([`crate::ConfigError`]), a membership change ([`keyroute_fleet::pool::MembershipError`]). None is a
//! bare string, and none is told apart by its message.

use std::net::SocketAddr;

use crate::config::ConfigError;
use keyroute_fleet::pool::MembershipError;

/// Why the gateway could not start, apply a change or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The configuration is invalid.
    #[error("{0}")]
    Config(Box<ConfigError>),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A worker's address is one the gateway itself listens at: requests would loop.
    #[error("pool '{pool}': worker '{worker}' at {address} is the gateway's own listener {listener}")]
    SelfWorker {
        /// The pool.
        pool: String,
        /// The worker.
        worker: String,
        /// Its address.
        address: SocketAddr,
        /// The gateway's listener it points at.
        listener: SocketAddr,
    },
    /// An access log could not be opened.
    #[error("cannot open the access log {path}: {source}")]
    AccessLog {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A TLS configuration could not be built.
    #[error("TLS on {addr}: {message}")]
    Tls {
        /// The listener.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// No pool has this name.
    #[error("no pool named '{0}'")]
    UnknownPool(String),
    /// A pool refused its workers.
    #[error("{0}")]
    Membership(MembershipError),
    /// A reload cannot apply this change.
    #[error("reload refused: {0}")]
    Reload(ReloadError),
    /// A runtime thread of [`crate::Gateway::run_threads`] ended while it started.
    #[error("runtime thread {index} ended while it started")]
    Thread {
        /// The thread's index (1 is the first extra thread).
        index: usize,
    },
    /// The shutdown grace period ended with requests still in flight; they were cut.
    #[error("the shutdown grace period ended with {connections} connection(s) still open")]
    GraceExpired {
        /// Client connections still open at the end of the grace period.
        connections: u64,
    },
}

/// What a reload cannot change, or why it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// A listener's address or connection settings changed.
    #[error("listener addresses or connection settings changed; restart to apply them")]
    Listeners,
    /// The admin listener or its token changed.
    #[error("admin.listen or admin.token changed; restart to apply them")]
    Admin,
    /// The reload's task was cancelled or panicked.
    #[error("the reload did not complete")]
    Interrupted,
}

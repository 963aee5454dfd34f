//! # keyroute-cacheproxy: memcached and Redis in front of a pool, placed by keyroute
//!
//! A listener of a cache protocol places each key of each command on the pool's servers by the
//! same steering rule the HTTP gateway uses ([`keyroute_fleet`]), and answers as the server
//! would: twemproxy's request path, with keyroute's placement, hot keys, warm-up and moves.
//!
//! - [`driver`]: the one driver of a client connection, whatever its protocol: read, plan, send,
//!   frame, merge (twemproxy's parse, fragment and coalesce), in pipelined batches.
//! - `memcached`, `redis`: each protocol over the driver (the codecs are
//!   [`keyroute_cache_proto`]'s), with its active check.
//! - [`pipe`]: server connections shared by a thread's clients (tickets and turns).
//! - [`conn`]: the one connection type, for side exchanges, checks and moves.
//! - [`copies`]: where hot keys have copies, so that none is served older than the last write.
//! - `shadow`: a share of a pool's commands copied to another pool (`[pool.shadow]`).
//! - `cluster`: Redis Cluster behind a Redis listener (`[pool.cluster]`): the slot map, and
//!   redirections followed.
//! - `stash`: byte buffers lent by the runtime thread to the batch that needs one.
//! - [`relocate`]: `keyroute move`, a store's keys moved after a membership change, on the same
//!   codecs and connections.
//!
//! Layout: each module imports only those listed after it above... except that the protocols
//! are below the driver: `driver` is used by `memcached` and `redis`, and uses `servers`,
//! `pipe`, `conn` and `copies`, none of which use it.

mod cluster;
pub mod config;
pub mod conn;
pub mod copies;
mod driver;
mod memcached;
mod pipe;
mod redis;
pub mod relocate;
mod servers;
mod shadow;
mod stash;

use std::sync::Arc;

use keyroute_fleet::Fleet;
use keyroute_fleet::pool::{Check, Pool};
use tokio::net::TcpStream;
use tokio::sync::watch;

pub use crate::config::{CacheListener, CacheProtocol, KeyRoute};

/// What a cache listener's connections share with the server: the fleet (its pools), the pool the
/// listener serves, and the server's stop.
#[derive(Debug)]
pub struct Context {
    /// The server's pools.
    pub fleet: Arc<Fleet>,
    /// The listener's settings: its pool (found by name in every snapshot of the fleet: a reload
    /// may add pools before it) and its routes.
    pub listener: Arc<CacheListener>,
    /// Set when the server stops accepting: a client is served what it had sent, then closed.
    pub stop: watch::Receiver<bool>,
}

/// Serves one client connection of a cache listener to its end (it closes, sends `quit` or
/// `QUIT`, or the server stops: what it had sent is answered first), on a task of its own. `held`
/// is released when it ends (the server's connection count and limit).
///
/// The task is the protocol's driver itself, made here with its client: the task holds its
/// future for as long as the connection lives, and a wrapper around it would hold the
/// connection's values twice.
pub fn spawn<H: Send + 'static>(stream: TcpStream, ctx: Arc<Context>, held: H) {
    let client = driver::Client::new(stream, &ctx.stop);
    let listener = &ctx.listener;
    match listener.protocol {
        CacheProtocol::Memcached => {
            let proto = memcached::Memcached {
                max_item: listener.max_item_bytes,
                broadcast: listener.broadcast,
                class: 0,
                reask: false,
            };
            tokio::spawn(driver::serve(client, ctx, proto, held));
        }
        CacheProtocol::Redis => {
            let proto = redis::Redis::new(
                listener.max_item_bytes,
                listener.password.as_deref(),
                listener.server_password.as_deref(),
            );
            tokio::spawn(driver::serve(client, ctx, proto, held));
        }
    }
}

/// The active check of a pool `listener` serves: memcached's `version`, or Redis's `PING` (after
/// `AUTH` with the servers' password), each on a fresh connection made within the pool's
/// connect timeout.
pub fn check(listener: &CacheListener, pool: &Pool) -> Arc<dyn Check> {
    started();
    let connect = pool.snapshot().config().connect_timeout;
    match listener.protocol {
        CacheProtocol::Memcached => Arc::new(memcached::Check { connect }),
        CacheProtocol::Redis => Arc::new(redis::Check { connect, password: listener.server_password.clone() }),
    }
}

/// What the cache listeners keep for a pool across its snapshots (the pool's protocol slot):
/// where its hot keys have copies, and its shadow's queue.
#[derive(Default)]
pub(crate) struct PoolState {
    pub(crate) copies: copies::Copies,
    pub(crate) shadow: shadow::Shadow,
    pub(crate) cluster: cluster::Cluster,
}

/// The pool's [`PoolState`], made on first use. Only the cache listeners use a pool's slot (the
/// HTTP gateway keeps its per-pool state in its routes), so the fallback, a state of its own per
/// call, is never taken.
pub(crate) fn state(pool: &Pool) -> Arc<PoolState> {
    pool.protocol_or(|| Arc::new(PoolState::default())).map_or_else(|| Arc::new(PoolState::default()), Arc::clone)
}

/// When the proxy set up its first cache pool (the pools' checks are made as the server starts):
/// the `uptime` a memcached listener's `stats` gives.
pub(crate) fn started() -> std::time::Instant {
    static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(std::time::Instant::now)
}

/// Ends what expired in every pool's copies registry (the server's ticker, every second or so).
pub fn tick(fleet: &Fleet, now: tokio::time::Instant) {
    for pool in fleet.pools().iter() {
        if let Some(state) = pool.protocol::<Arc<PoolState>>() {
            state.copies.sweep(now);
        }
    }
}

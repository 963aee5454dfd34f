//! A cache listener's settings, validated (the file they come from is the server's).

/// A listener of a cache protocol: `protocol`, `pool` and `max_item_bytes` on `[[listener]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheListener {
    /// The protocol.
    pub protocol: CacheProtocol,
    /// The pool of cache servers, by name: what the listener finds its pool by, in every
    /// snapshot of the fleet (a reload may add pools before it).
    pub pool: String,
    /// The largest value taken (memcached's `-I`, 1 MiB by default; for Redis, each argument of a
    /// command, 16 MiB by default).
    pub max_item_bytes: usize,
    /// Redis: the password clients give with `AUTH` before any other command (none: no `AUTH`).
    pub password: Option<String>,
    /// Redis: the password the proxy gives each server with `AUTH` when it connects.
    pub server_password: Option<String>,
    /// memcached: the commands of every server (`flush_all`, `verbosity`, `stats`) are sent to
    /// each server of the pool and their answers joined (`broadcast = true`); otherwise refused.
    pub broadcast: bool,
}

/// A cache protocol a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheProtocol {
    /// memcached's text protocol (1.6, meta commands included).
    Memcached,
    /// Redis's RESP2 (and RESP3, after `HELLO 3`).
    Redis,
}

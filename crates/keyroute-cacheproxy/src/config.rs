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
    /// The pool the default route's reads go to instead of `pool` (`read_pool`), if any.
    pub read_pool: Option<String>,
    /// Routes by key prefix (`[[listener.prefix_route]]`): the longest prefix a key starts with
    /// chooses its pool; a key that starts with none goes to `pool` (or `read_pool`).
    pub routes: Vec<KeyRoute>,
}

/// A route by key prefix (mcrouter's PrefixSelectorRoute, Envoy's `prefix_routes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRoute {
    /// The prefix (not empty).
    pub prefix: Vec<u8>,
    /// The pool its keys' commands go to.
    pub pool: String,
    /// The pool its keys' reads go to instead, if any (writes stay on `pool`).
    pub read_pool: Option<String>,
}

impl CacheListener {
    /// Every pool the listener sends commands to: its own, then its routes' (a name may repeat).
    pub fn pools(&self) -> impl Iterator<Item = &str> {
        let own = std::iter::once(self.pool.as_str()).chain(self.read_pool.as_deref());
        own.chain(self.routes.iter().flat_map(|r| std::iter::once(r.pool.as_str()).chain(r.read_pool.as_deref())))
    }

    /// Whether commands are routed by key (the listener has prefix routes or a read pool).
    pub fn routed(&self) -> bool {
        !self.routes.is_empty() || self.read_pool.is_some()
    }

    /// The pool a command of `key` goes to (`read`: the command only reads): its longest
    /// matching prefix route's, else the listener's; a read goes to the route's `read_pool` when
    /// it has one.
    pub fn route(&self, key: &[u8], read: bool) -> &str {
        let route = self.routes.iter().filter(|r| key.starts_with(&r.prefix)).max_by_key(|r| r.prefix.len());
        let (pool, read_pool) = match route {
            Some(r) => (&r.pool, &r.read_pool),
            None => (&self.pool, &self.read_pool),
        };
        match read_pool {
            Some(p) if read => p,
            _ => pool,
        }
    }
}

/// A cache protocol a listener speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheProtocol {
    /// memcached's text protocol (1.6, meta commands included).
    Memcached,
    /// Redis's RESP2 (and RESP3, after `HELLO 3`).
    Redis,
}

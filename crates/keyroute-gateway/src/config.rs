//! A pool's and a route's HTTP settings, validated (the file they come from is the server's):
//! what the HTTP listeners need beyond the fleet's pool settings.

use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;

use crate::key::KeyTemplate;

/// A listener's access log: one line per request, written off the request path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogConfig {
    /// The file (appended to), or `-` for standard output.
    pub path: PathBuf,
    /// The line format.
    pub format: AccessLogFormat,
    /// Log the request's key itself (otherwise only its hash).
    pub key: bool,
    /// Lines held for the writer; past it, lines are dropped (and counted), never waited for.
    pub buffer: usize,
}

/// How an access log line is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object per line.
    Json,
    /// `key=value` pairs, space separated (logfmt).
    Logfmt,
}

/// A route: requests matching host and path prefix go to a pool.
#[derive(Clone, Debug)]
pub struct RouteConfig {
    /// The host to match (case-insensitive, port ignored); any host if `None`.
    pub host: Option<String>,
    /// The path prefix to match.
    pub path_prefix: String,
    /// The pool's index in [`Config::pools`].
    pub pool: usize,
    /// The protocols an HTTP/1.1 `Upgrade` may switch to on this route, lowercase (`websocket` by
    /// default). Other offers are removed and the request is served as HTTP/1.1; `h2c` is never
    /// tunnelled (its stream would bypass the routes).
    pub upgrades: Vec<String>,
}

/// What to do with a request whose key template cannot be rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// Route it by power of two choices instead.
    P2c,
    /// Answer 400 with the missing part named.
    Reject,
}

/// A pool's settings for the HTTP listeners that route to it (the fleet's are in
/// [`PoolConfig`]).
#[derive(Clone, Debug)]
pub struct HttpPoolConfig {
    /// The key template.
    pub key: KeyTemplate,
    /// When the key is missing.
    pub on_missing_key: MissingKey,
    /// A response header naming the worker that served, if set.
    pub worker_header: Option<HeaderName>,
    /// The path the active check `GET`s (`[pool.health] path`, `/healthz` by default).
    pub health_path: String,
    /// The longest wait for the next bytes of a worker's response body once its head has
    /// arrived (`read_timeout_ms`, 60 s as nginx's `proxy_read_timeout`): a body that stalls
    /// longer is cut (the client's response ends short) and counted as the worker's failure.
    pub read_timeout: Duration,
    /// The gateway's response cache for hot keys (`[pool.hot_keys.cache]`), if on.
    pub cache: Option<CacheSettings>,
}

/// `[pool.hot_keys.cache]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSettings {
    /// The most bytes it holds.
    pub max_bytes: u64,
    /// The largest response it stores.
    pub max_object_bytes: u64,
    /// Store responses to requests with `Authorization`.
    pub cache_authorized: bool,
    /// Store responses with `Set-Cookie` (the cookie itself is never served from the cache).
    pub cache_set_cookie: bool,
    /// How long a request waits for a concurrent miss of the same key before going upstream itself.
    pub coalesce_timeout: Duration,
}

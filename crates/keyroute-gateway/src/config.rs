//! An HTTP listener's, a route's and a pool's HTTP settings, validated (the file they come from is
//! the server's): what the HTTP listeners need beyond the fleet's pool settings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use crate::key::KeyTemplate;

/// What an HTTP listener serves and how (its name, address and connection limit are the
/// server's, shared with every kind of listener).
#[derive(Clone, Debug)]
pub struct HttpListenerConfig {
    /// Requests whose headers exceed this get 431.
    pub max_header_bytes: usize,
    /// Requests with more header fields than this get 431.
    pub max_headers: usize,
    /// A request head (after a connection opens, or after the previous response) that takes
    /// longer than this to arrive gets 408 and the connection is closed.
    pub header_timeout: Duration,
    /// Routes, tried in order.
    pub routes: Vec<RouteConfig>,
    /// TLS certificates (empty: plain TCP). SNI picks among them; the first is the default.
    pub tls: Vec<crate::tls::Certificate>,
    /// Offer HTTP/2 by ALPN on a TLS listener (on by default).
    pub http2: bool,
    /// Accept HTTP/2 with prior knowledge (h2c) on a plain listener (off by default).
    pub h2c: bool,
    /// Concurrent streams per HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// The access log, if any.
    pub access_log: Option<AccessLogConfig>,
    /// A response whose client reads nothing of it for this long is cut (NGINX `send_timeout`).
    pub send_timeout: Duration,
    /// An upgraded connection (WebSocket) that carries nothing either way for this long is
    /// closed (NGINX's `proxy_read_timeout` applies to WebSockets too).
    pub tunnel_idle_timeout: Duration,
}

impl HttpListenerConfig {
    /// Whether `other` differs only in what a reload may change (routes, certificate files):
    /// everything else is bound to the listener's sockets and connections.
    pub fn reloadable_to(&self, other: &HttpListenerConfig) -> bool {
        self.max_header_bytes == other.max_header_bytes
            && self.max_headers == other.max_headers
            && self.header_timeout == other.header_timeout
            && self.tls.is_empty() == other.tls.is_empty()
            && self.http2 == other.http2
            && self.h2c == other.h2c
            && self.max_concurrent_streams == other.max_concurrent_streams
            && self.access_log == other.access_log
            && self.send_timeout == other.send_timeout
            && self.tunnel_idle_timeout == other.tunnel_idle_timeout
    }
}

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
    /// The pool's index in the configuration's pools.
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
    /// The service a gRPC health check asks about (`[pool.health] grpc_service`; `""` is the
    /// whole server): when set, the active check is `grpc.health.v1.Health/Check`, not a `GET`.
    pub grpc_health: Option<String>,
    /// The longest wait for the next bytes of a worker's response body once its head has
    /// arrived (`read_timeout_ms`, 60 s as nginx's `proxy_read_timeout`): a body that stalls
    /// longer is cut (the client's response ends short) and counted as the worker's failure.
    pub read_timeout: Duration,
    /// The gateway's response cache for hot keys (`[pool.hot_keys.cache]`), if on.
    pub cache: Option<CacheSettings>,
    /// How the gateway talks to the workers (`[pool.upstream]`).
    pub upstream: Arc<UpstreamConfig>,
}

/// `[pool.upstream]`: the protocol spoken to a pool's workers, and TLS.
#[derive(Debug)]
pub struct UpstreamConfig {
    /// HTTP/1.1, HTTP/2, or (over TLS) whichever ALPN settles on.
    pub protocol: UpstreamProtocol,
    /// TLS to the workers, loaded; plain TCP if `None`.
    pub tls: Option<crate::upstream::tls::ClientTls>,
    /// HTTP/2: streams a connection carries before another connection to the same worker is
    /// opened (the worker's own `SETTINGS_MAX_CONCURRENT_STREAMS` still applies: past it, streams
    /// wait on their connection).
    pub max_streams: u32,
}

impl Default for UpstreamConfig {
    /// Plain HTTP/1.1; 100 streams an HTTP/2 connection.
    fn default() -> Self {
        UpstreamConfig { protocol: UpstreamProtocol::default(), tls: None, max_streams: 100 }
    }
}

/// The HTTP version spoken to workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 (`http1`, the default).
    #[default]
    Http1,
    /// HTTP/2 (`h2`): with prior knowledge over plain TCP, by ALPN over TLS.
    H2,
    /// Over TLS only: `h2` if the worker's ALPN picks it, else HTTP/1.1 (`auto`).
    Auto,
}

impl UpstreamProtocol {
    /// The ALPN protocols offered over TLS, most preferred first.
    pub fn alpn(self) -> &'static [&'static [u8]] {
        match self {
            UpstreamProtocol::Http1 => &[b"http/1.1"],
            UpstreamProtocol::H2 => &[b"h2"],
            UpstreamProtocol::Auto => &[b"h2", b"http/1.1"],
        }
    }
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

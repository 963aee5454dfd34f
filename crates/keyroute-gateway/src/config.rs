//! Configuration: a TOML file, parsed into raw structs that reject unknown fields, then validated
//! into the types the gateway runs with. Every error names the file, the line and the field.
//!
//! See `examples/keyroute.toml` at the repository root for an annotated example of every field.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use http::HeaderName;
use keyroute::hash::KeyHasher;
use keyroute::{Options, RingScheme, Strategy};
use serde::Deserialize;
use toml::Spanned;

use crate::key::KeyTemplate;

/// A configuration error: where, which field, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {field}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    /// The configuration file.
    pub file: String,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The field, as a dotted path (`pool.thumbs.strategy`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The admin API.
    pub admin: AdminConfig,
    /// Client-facing listeners, each with its routes.
    pub listeners: Vec<ListenerConfig>,
    /// Worker pools.
    pub pools: Vec<PoolConfig>,
    /// After SIGTERM, how long `/readyz` reports not ready while the listeners still accept (so
    /// that load balancers in front stop sending first).
    pub shutdown_delay: Duration,
    /// Then, how long the gateway waits for requests in flight before it cuts them.
    pub shutdown_grace: Duration,
    /// Settings that are valid but probably not what was meant (`serve --check` prints them,
    /// `serve` logs them).
    pub warnings: Vec<ConfigError>,
}

/// The admin listener.
#[derive(Clone, Debug)]
pub struct AdminConfig {
    /// Where it listens (loopback by default).
    pub listen: SocketAddr,
    /// The bearer token; required when `listen` is not a loopback address.
    pub token: Option<String>,
}

/// A client-facing listener.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    /// Its name (for logs).
    pub name: String,
    /// Where it listens.
    pub listen: SocketAddr,
    /// Requests whose headers exceed this get 431.
    pub max_header_bytes: usize,
    /// Requests with more header fields than this get 431.
    pub max_headers: usize,
    /// A request head (after a connection opens, or after the previous response) that takes
    /// longer than this to arrive gets 408 and the connection is closed.
    pub header_timeout: Duration,
    /// Connections held at once; past it the listener stops accepting until one closes (the
    /// kernel's backlog holds the rest). `None`: derived from the open-file limit at start.
    pub max_connections: Option<usize>,
    /// Routes, tried in order.
    pub routes: Vec<RouteConfig>,
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
}

/// What to do with a request whose key template cannot be rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// Route it by power of two choices instead.
    P2c,
    /// Answer 400 with the missing part named.
    Reject,
}

/// A pool of workers and how requests are placed on them.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Its name.
    pub name: String,
    /// The placement strategy.
    pub strategy: Strategy,
    /// The strategy's options.
    pub options: Options,
    /// The key template.
    pub key: KeyTemplate,
    /// When the key is missing.
    pub on_missing_key: MissingKey,
    /// A response header naming the worker that served, if set.
    pub worker_header: Option<HeaderName>,
    /// Active health checks.
    pub health: HealthConfig,
    /// Passive ejection.
    pub passive: PassiveConfig,
    /// Retries.
    pub retry: RetryConfig,
    /// Upstream timeouts.
    pub connect_timeout: Duration,
    /// The workers.
    pub workers: Vec<WorkerConfig>,
}

/// Active HTTP health checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// The path probed with GET (`None` disables active checks).
    pub path: Option<String>,
    /// Between probes of one worker.
    pub interval: Duration,
    /// A probe slower than this fails.
    pub timeout: Duration,
    /// Consecutive successes that make an unhealthy worker healthy.
    pub rise: u32,
    /// Consecutive failures that make a healthy worker unhealthy.
    pub fall: u32,
}

/// Passive ejection: consecutive connect errors or 5xx responses take a worker out for a while.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassiveConfig {
    /// Consecutive failures that eject (0 disables).
    pub consecutive_failures: u32,
    /// The first ejection's length; each further ejection in a row doubles it.
    pub base_ejection: Duration,
    /// The longest ejection.
    pub max_ejection: Duration,
    /// A worker that holds tries waiting for headers and answers none of them for this long is
    /// *stalled*: new requests go to the next worker of each key's ranking, and replayable
    /// idempotent tries waiting on it are abandoned and retried there (zero disables).
    pub stall: Duration,
}

/// Retries on the next worker of the key's ranking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Tries in all (1 = no retry).
    pub attempts: u32,
    /// Time to the response headers of one try.
    pub per_try_timeout: Duration,
    /// Time to the response headers over all tries.
    pub deadline: Duration,
}

/// One worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Its name: its identity for placement.
    pub name: String,
    /// Where it listens.
    pub address: SocketAddr,
    /// Its weight (0 = drained).
    pub weight: u32,
    /// Its zone.
    pub zone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    admin: Option<RawAdmin>,
    #[serde(default)]
    listener: Vec<RawListener>,
    #[serde(default)]
    pool: Vec<RawPool>,
    shutdown_grace_ms: Option<Spanned<u64>>,
    shutdown_delay_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<Spanned<String>>,
    token: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListener {
    name: Option<String>,
    listen: Spanned<String>,
    max_header_bytes: Option<Spanned<usize>>,
    max_headers: Option<Spanned<usize>>,
    header_timeout_ms: Option<Spanned<u64>>,
    max_connections: Option<Spanned<usize>>,
    #[serde(default)]
    route: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    host: Option<Spanned<String>>,
    path_prefix: Option<Spanned<String>>,
    pool: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: Spanned<String>,
    strategy: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    normalize: Option<Spanned<Vec<String>>>,
    on_missing_key: Option<Spanned<String>>,
    hash: Option<Spanned<String>>,
    scheme: Option<Spanned<String>>,
    vnodes: Option<Spanned<u32>>,
    maglev_size: Option<Spanned<u32>>,
    epsilon: Option<Spanned<f64>>,
    choices: Option<Spanned<usize>>,
    worker_header: Option<Spanned<String>>,
    connect_timeout_ms: Option<Spanned<u64>>,
    health: Option<RawHealth>,
    passive: Option<RawPassive>,
    retry: Option<RawRetry>,
    #[serde(default)]
    worker: Vec<RawWorker>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    path: Option<Spanned<String>>,
    interval_ms: Option<Spanned<u64>>,
    timeout_ms: Option<Spanned<u64>>,
    rise: Option<Spanned<u32>>,
    fall: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPassive {
    consecutive_failures: Option<u32>,
    base_ejection_ms: Option<Spanned<u64>>,
    max_ejection_ms: Option<Spanned<u64>>,
    stall_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<Spanned<u32>>,
    per_try_timeout_ms: Option<Spanned<u64>>,
    deadline_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorker {
    name: Spanned<String>,
    address: Spanned<String>,
    weight: Option<Spanned<u32>>,
    zone: Option<Spanned<String>>,
}

/// Errors carry the file and compute lines from byte offsets.
struct Ctx<'a> {
    file: String,
    src: &'a str,
    warnings: std::cell::RefCell<Vec<ConfigError>>,
}

impl Ctx<'_> {
    fn line(&self, offset: usize) -> usize {
        self.src.as_bytes()[..offset.min(self.src.len())].iter().filter(|&&b| b == b'\n').count() + 1
    }

    fn err<T>(
        &self,
        span: Option<std::ops::Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Result<T, ConfigError> {
        Err(ConfigError {
            file: self.file.clone(),
            line: span.map(|s| self.line(s.start)),
            field: field.into(),
            message: message.into(),
        })
    }

    /// Notes a setting that is valid but probably not what was meant.
    fn warn(&self, span: Option<std::ops::Range<usize>>, field: impl Into<String>, message: impl Into<String>) {
        self.warnings.borrow_mut().push(ConfigError {
            file: self.file.clone(),
            line: span.map(|s| self.line(s.start)),
            field: field.into(),
            message: message.into(),
        });
    }
}

fn ms(v: Option<&Spanned<u64>>, default: u64) -> Duration {
    Duration::from_millis(v.map_or(default, |s| *s.get_ref()))
}

/// A timeout field: at least 1 ms (a zero timeout would fail every request or probe).
fn timeout(ctx: &Ctx<'_>, v: Option<&Spanned<u64>>, default: u64, field: String) -> Result<Duration, ConfigError> {
    match v {
        Some(t) if *t.get_ref() == 0 => ctx.err(Some(t.span()), field, "must be at least 1 (milliseconds)"),
        _ => Ok(ms(v, default)),
    }
}

impl Config {
    /// Reads and validates a configuration file.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not valid TOML, has an unknown field, or a value is invalid.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            field: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        let src = std::str::from_utf8(&bytes).map_err(|e| ConfigError {
            file: file.clone(),
            line: Some(bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count() + 1),
            field: "(file)".into(),
            message: "not valid UTF-8".into(),
        })?;
        Config::parse(src, &file)
    }

    /// Validates configuration text (`file` names it in errors).
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn parse(src: &str, file: &str) -> Result<Config, ConfigError> {
        let ctx = Ctx { file: file.to_owned(), src, warnings: Default::default() };
        let raw: RawConfig = toml::from_str(src).map_err(|e| {
            let line = e.span().map(|s| ctx.line(s.start));
            // toml's message already quotes the offending key; keep its first line.
            let message = e.message().lines().next().unwrap_or("invalid TOML").to_owned();
            let mut field = e.span().map(|s| field_at(src, s.start)).unwrap_or_else(|| "(toml)".into());
            // "missing field `listen`" names the field the table lacks.
            if let Some(missing) = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()) {
                field = if field == "(toml)" { missing.to_owned() } else { format!("{field}.{missing}") };
            }
            ConfigError { file: file.to_owned(), line, field, message }
        })?;
        validate(&ctx, raw)
    }
}

/// The dotted field at a byte offset: the enclosing `[table]` or `[[array]]` header (the line
/// itself, if it is one), and the key on that line (`pool.worker.weight`).
fn field_at(src: &str, offset: usize) -> String {
    let offset = offset.min(src.len());
    let start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
    let line = src[start..end].trim();
    let header = |l: &str| l.starts_with('[').then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    if let Some(t) = header(line) {
        return t;
    }
    let key = line.split_once('=').map(|(k, _)| k.trim().trim_matches('"')).filter(|k| !k.is_empty());
    let table = src[..start].lines().rev().map(str::trim).find_map(header);
    match (table, key) {
        (Some(t), Some(k)) => format!("{t}.{k}"),
        (None, Some(k)) => k.to_owned(),
        (Some(t), None) => t,
        (None, None) => "(toml)".into(),
    }
}

/// Whether two listen addresses would collide (same port, and the same IP or either a wildcard).
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Whether `ip` is one of this machine's own addresses (loopback, a wildcard, or an address a
/// socket can bind to here).
fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Whether a worker at `worker` would be the gateway itself, listening at `own`.
pub(crate) fn points_at(worker: SocketAddr, own: SocketAddr) -> bool {
    worker.port() == own.port() && (worker.ip() == own.ip() || (own.ip().is_unspecified() && is_local(worker.ip())))
}

/// One field of a worker that failed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WorkerFieldError {
    /// `name`, `address`, `weight` or `zone`.
    pub(crate) field: &'static str,
    /// Why.
    pub(crate) message: String,
}

/// The longest worker name or zone, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

fn check_label(what: &'static str, text: &str) -> Result<(), WorkerFieldError> {
    let bad = |message: String| Err(WorkerFieldError { field: what, message });
    if text.is_empty() {
        return bad("must not be empty".into());
    }
    if text.len() > MAX_NAME_BYTES {
        return bad(format!("must be at most {MAX_NAME_BYTES} bytes (got {})", text.len()));
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("must not contain spaces or control characters".into());
    }
    Ok(())
}

/// Validates one worker, the same way for a configuration file and the admin API: a name and
/// zone of visible characters, an address (`ip:port`, or `host:port` resolved now) that is a
/// real unicast address and not one of the gateway's own listeners (`own`).
///
/// # Errors
///
/// The first field that is wrong.
pub(crate) fn validate_worker(
    name: &str,
    address: &str,
    weight: u32,
    zone: Option<&str>,
    own: &[SocketAddr],
) -> Result<WorkerConfig, WorkerFieldError> {
    let resolve = |a: &str| a.to_socket_addrs().ok().and_then(|mut it| it.next());
    validate_worker_with(name, address, weight, zone, own, resolve)
}

/// [`validate_worker`] with the name resolution passed in (the fuzz targets resolve nothing).
pub(crate) fn validate_worker_with(
    name: &str,
    address: &str,
    weight: u32,
    zone: Option<&str>,
    own: &[SocketAddr],
    resolve: impl Fn(&str) -> Option<SocketAddr>,
) -> Result<WorkerConfig, WorkerFieldError> {
    check_label("name", name)?;
    if let Some(z) = zone
        && !z.is_empty()
    {
        check_label("zone", z)?;
    }
    let bad_address = |message: String| WorkerFieldError { field: "address", message };
    let addr = match address.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => match resolve(address) {
            Some(a) => a,
            None => return Err(bad_address(format!("'{}' is not an address (host:port)", address.escape_debug()))),
        },
    };
    if addr.ip().is_unspecified() || addr.ip().is_multicast() || addr.port() == 0 {
        return Err(bad_address(format!("{addr} is not an address a worker can listen at")));
    }
    if let Some(o) = own.iter().find(|o| points_at(addr, **o)) {
        return Err(bad_address(format!("{addr} is the gateway's own listener {o}: requests would loop")));
    }
    let _ = weight;
    Ok(WorkerConfig {
        name: name.to_owned(),
        address: addr,
        weight,
        zone: zone.filter(|z| !z.is_empty()).map(str::to_owned),
    })
}

fn validate(ctx: &Ctx<'_>, raw: RawConfig) -> Result<Config, ConfigError> {
    let admin = match raw.admin {
        None => AdminConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9901)), token: None },
        Some(a) => {
            let listen = match &a.listen {
                None => SocketAddr::from(([127, 0, 0, 1], 9901)),
                Some(l) => parse_addr(ctx, l, "admin.listen")?,
            };
            let token = a.token.as_ref().map(|t| t.get_ref().clone());
            if let Some(t) = &a.token
                && t.get_ref().len() < 16
            {
                return ctx.err(Some(t.span()), "admin.token", "must be at least 16 characters");
            }
            if !listen.ip().is_loopback() && token.is_none() {
                return ctx.err(
                    a.listen.as_ref().map(Spanned::span),
                    "admin.listen",
                    format!("{listen} is not a loopback address, so admin.token is required"),
                );
            }
            AdminConfig { listen, token }
        }
    };
    if raw.listener.is_empty() {
        // A file-level error: name its first line (an empty file has one too).
        let line = if ctx.src.trim().is_empty() { 0 } else { ctx.src.len().saturating_sub(1) };
        return ctx.err(Some(line..line), "listener", "at least one [[listener]] is required");
    }
    // Every address the gateway itself listens at: no two may collide, and no worker may be one.
    let mut own: Vec<(SocketAddr, String, std::ops::Range<usize>)> = Vec::new();
    own.push((admin.listen, "admin.listen".into(), 0..0));
    for (i, l) in raw.listener.iter().enumerate() {
        let name = l.name.clone().unwrap_or_else(|| format!("listener-{}", i + 1));
        let field = format!("listener.{name}.listen");
        let listen = parse_addr(ctx, &l.listen, &field)?;
        if let Some((_, other, _)) = own.iter().find(|(a, _, _)| collide(*a, listen)) {
            return ctx.err(Some(l.listen.span()), field, format!("{listen} collides with {other}"));
        }
        own.push((listen, field, l.listen.span()));
    }
    let own_addrs: Vec<SocketAddr> = own.iter().map(|(a, _, _)| *a).collect();
    let mut pools = Vec::new();
    for p in &raw.pool {
        let name = p.name.get_ref().clone();
        if name.is_empty() {
            return ctx.err(Some(p.name.span()), "pool.name", "must not be empty");
        }
        if pools.iter().any(|q: &PoolConfig| q.name == name) {
            return ctx.err(Some(p.name.span()), "pool.name", format!("duplicate pool '{name}'"));
        }
        pools.push(validate_pool(ctx, p, &name, &own_addrs)?);
    }
    let mut listeners = Vec::new();
    for (i, l) in raw.listener.iter().enumerate() {
        let name = l.name.clone().unwrap_or_else(|| format!("listener-{}", i + 1));
        let field = |f: &str| format!("listener.{name}.{f}");
        let listen = own[i + 1].0;
        let max_header_bytes = match &l.max_header_bytes {
            None => 16 * 1024,
            Some(m) if (8192..=1 << 20).contains(m.get_ref()) => *m.get_ref(),
            Some(m) => return ctx.err(Some(m.span()), field("max_header_bytes"), "must be in 8192..=1048576"),
        };
        let max_headers = match &l.max_headers {
            None => 100,
            Some(m) if (1..=1000).contains(m.get_ref()) => *m.get_ref(),
            Some(m) => return ctx.err(Some(m.span()), field("max_headers"), "must be in 1..=1000"),
        };
        let header_timeout = timeout(ctx, l.header_timeout_ms.as_ref(), 10_000, field("header_timeout_ms"))?;
        let max_connections = match &l.max_connections {
            None => None,
            Some(m) if (1..=1_000_000).contains(m.get_ref()) => Some(*m.get_ref()),
            Some(m) => return ctx.err(Some(m.span()), field("max_connections"), "must be in 1..=1000000"),
        };
        let mut routes = Vec::new();
        for r in &l.route {
            let Some(pool) = pools.iter().position(|p| p.name == *r.pool.get_ref()) else {
                let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                return ctx.err(
                    Some(r.pool.span()),
                    field("route.pool"),
                    format!("no pool named '{}' (pools: {})", r.pool.get_ref(), known.join(", ")),
                );
            };
            let path_prefix = r.path_prefix.as_ref().map_or("/".to_owned(), |p| p.get_ref().clone());
            if !path_prefix.starts_with('/') {
                let span = r.path_prefix.as_ref().map(Spanned::span);
                return ctx.err(span, field("route.path_prefix"), "must start with '/'");
            }
            if let Some(h) = &r.host
                && (h.get_ref().is_empty() || h.get_ref().contains([':', '/']))
            {
                // Requests are matched on their host without the port.
                let msg = format!("'{}' must be a host name, without a port", h.get_ref());
                return ctx.err(Some(h.span()), field("route.host"), msg);
            }
            let host = r.host.as_ref().map(|h| h.get_ref().to_ascii_lowercase());
            routes.push(RouteConfig { host, path_prefix, pool });
        }
        if routes.is_empty() {
            if pools.len() == 1 {
                routes.push(RouteConfig { host: None, path_prefix: "/".into(), pool: 0 });
            } else {
                return ctx.err(
                    Some(l.listen.span()),
                    field("route"),
                    "a listener needs routes when there are several pools",
                );
            }
        }
        listeners.push(ListenerConfig {
            name,
            listen,
            max_header_bytes,
            max_headers,
            header_timeout,
            max_connections,
            routes,
        });
    }
    Ok(Config {
        admin,
        listeners,
        pools,
        shutdown_delay: ms(raw.shutdown_delay_ms.as_ref(), 0),
        shutdown_grace: ms(raw.shutdown_grace_ms.as_ref(), 10_000),
        warnings: ctx.warnings.take(),
    })
}

fn parse_addr(ctx: &Ctx<'_>, s: &Spanned<String>, field: &str) -> Result<SocketAddr, ConfigError> {
    let text = s.get_ref();
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    match text.to_socket_addrs().map(|mut it| it.next()) {
        Ok(Some(a)) => Ok(a),
        _ => ctx.err(Some(s.span()), field, format!("'{text}' is not an address (host:port)")),
    }
}

fn validate_pool(ctx: &Ctx<'_>, p: &RawPool, name: &str, own: &[SocketAddr]) -> Result<PoolConfig, ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    let strategy = match &p.strategy {
        None => Strategy::Rendezvous,
        Some(s) => match s.get_ref().parse::<Strategy>() {
            Ok(st) => st,
            Err(e) => return ctx.err(Some(s.span()), field("strategy"), e.to_string()),
        },
    };
    let mut options = Options::default();
    if let Some(h) = &p.hash {
        options.hasher = match h.get_ref().parse::<KeyHasher>() {
            Ok(h) => h,
            Err(e) => return ctx.err(Some(h.span()), field("hash"), e.to_string()),
        };
    }
    if let Some(s) = &p.scheme {
        options.scheme = match s.get_ref().parse::<RingScheme>() {
            Ok(s) => s,
            Err(e) => return ctx.err(Some(s.span()), field("scheme"), e.to_string()),
        };
    }
    if let Some(v) = &p.vnodes {
        if *v.get_ref() == 0 || *v.get_ref() > 10_000 {
            return ctx.err(Some(v.span()), field("vnodes"), "must be in 1..=10000");
        }
        options.vnodes = *v.get_ref();
    }
    if let Some(m) = &p.maglev_size {
        options.maglev_size = *m.get_ref();
    }
    if let Some(e) = &p.epsilon {
        if !(e.get_ref().is_finite() && *e.get_ref() >= 0.0) {
            return ctx.err(Some(e.span()), field("epsilon"), "must be finite and >= 0");
        }
        options.epsilon = *e.get_ref();
    }
    if let Some(c) = &p.choices {
        if *c.get_ref() == 0 || *c.get_ref() > 16 {
            return ctx.err(Some(c.span()), field("choices"), "must be in 1..=16");
        }
        options.choices = *c.get_ref();
    }
    let normalize = p.normalize.as_ref().map(|n| n.get_ref().clone()).unwrap_or_default();
    let key_text = p.key.as_ref().map_or("{uri}".to_owned(), |k| k.get_ref().clone());
    let key = match KeyTemplate::parse(&key_text, &normalize) {
        Ok(k) => k,
        Err(e) => {
            let (span, f) = if e.contains("normalisation") {
                (p.normalize.as_ref().map(Spanned::span), field("normalize"))
            } else {
                (p.key.as_ref().map(Spanned::span), field("key"))
            };
            return ctx.err(span, f, e);
        }
    };
    let on_missing_key = match p.on_missing_key.as_ref().map(|s| s.get_ref().as_str()) {
        None | Some("p2c") => MissingKey::P2c,
        Some("reject") => MissingKey::Reject,
        Some(other) => {
            return ctx.err(
                p.on_missing_key.as_ref().map(Spanned::span),
                field("on_missing_key"),
                format!("'{other}' is not one of: p2c, reject"),
            );
        }
    };
    let worker_header = match &p.worker_header {
        None => None,
        Some(h) => match HeaderName::try_from(h.get_ref().as_str()) {
            Ok(n) => Some(n),
            Err(_) => {
                return ctx.err(
                    Some(h.span()),
                    field("worker_header"),
                    format!("'{}' is not a header name", h.get_ref()),
                );
            }
        },
    };
    let health = match &p.health {
        None => HealthConfig {
            path: None,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        },
        Some(h) => {
            let path = h.path.as_ref().map(|p| p.get_ref().clone());
            if let (Some(p), Some(s)) = (&path, &h.path)
                && (!p.starts_with('/') || http::uri::PathAndQuery::try_from(p.as_str()).is_err())
            {
                return ctx.err(
                    Some(s.span()),
                    field("health.path"),
                    "must be a path starting with '/', without spaces",
                );
            }
            let rise = h.rise.as_ref().map_or(2, |r| *r.get_ref());
            let fall = h.fall.as_ref().map_or(3, |f| *f.get_ref());
            if rise == 0 {
                return ctx.err(h.rise.as_ref().map(Spanned::span), field("health.rise"), "must be at least 1");
            }
            if fall == 0 {
                return ctx.err(h.fall.as_ref().map(Spanned::span), field("health.fall"), "must be at least 1");
            }
            let interval = ms(h.interval_ms.as_ref(), 2000);
            if interval < Duration::from_millis(10) {
                return ctx.err(
                    h.interval_ms.as_ref().map(Spanned::span),
                    field("health.interval_ms"),
                    "must be at least 10",
                );
            }
            let probe_timeout = timeout(ctx, h.timeout_ms.as_ref(), 1000, field("health.timeout_ms"))?;
            if probe_timeout > interval {
                // Not wrong (probes never overlap: a round waits for its slowest probe), but a
                // dead worker is then probed every interval + timeout: say so.
                ctx.warn(
                    h.timeout_ms.as_ref().map(Spanned::span),
                    field("health.timeout_ms"),
                    format!(
                        "{} ms is above health.interval_ms ({} ms): a dead worker is probed every {} ms",
                        probe_timeout.as_millis(),
                        interval.as_millis(),
                        (probe_timeout + interval).as_millis()
                    ),
                );
            }
            HealthConfig { path: path.or(Some("/healthz".into())), interval, timeout: probe_timeout, rise, fall }
        }
    };
    let passive = {
        let x = p.passive.as_ref();
        let base_ejection = ms(x.and_then(|x| x.base_ejection_ms.as_ref()), 10_000);
        let max_ejection = ms(x.and_then(|x| x.max_ejection_ms.as_ref()), 300_000);
        if base_ejection > max_ejection {
            return ctx.err(
                x.and_then(|x| x.base_ejection_ms.as_ref().or(x.max_ejection_ms.as_ref())).map(Spanned::span),
                field("passive.base_ejection_ms"),
                format!(
                    "{} ms is above passive.max_ejection_ms ({} ms)",
                    base_ejection.as_millis(),
                    max_ejection.as_millis()
                ),
            );
        }
        PassiveConfig {
            consecutive_failures: x.and_then(|x| x.consecutive_failures).unwrap_or(5),
            base_ejection,
            max_ejection,
            stall: ms(x.and_then(|x| x.stall_ms.as_ref()), 2_000),
        }
    };
    let retry = {
        let r = p.retry.as_ref();
        let attempts = r.and_then(|r| r.attempts.as_ref());
        if let Some(a) = attempts
            && !(1..=10).contains(a.get_ref())
        {
            return ctx.err(Some(a.span()), field("retry.attempts"), "must be in 1..=10");
        }
        let per_try = r.and_then(|r| r.per_try_timeout_ms.as_ref());
        let per_try_timeout = timeout(ctx, per_try, 30_000, field("retry.per_try_timeout_ms"))?;
        let deadline = timeout(ctx, r.and_then(|r| r.deadline_ms.as_ref()), 60_000, field("retry.deadline_ms"))?;
        if per_try_timeout > deadline {
            return ctx.err(
                per_try.or(r.and_then(|r| r.deadline_ms.as_ref())).map(Spanned::span),
                field("retry.per_try_timeout_ms"),
                format!(
                    "{} ms is above retry.deadline_ms ({} ms): no try could use it",
                    per_try_timeout.as_millis(),
                    deadline.as_millis()
                ),
            );
        }
        RetryConfig { attempts: attempts.map_or(3, |a| *a.get_ref()), per_try_timeout, deadline }
    };
    let mut workers: Vec<WorkerConfig> = Vec::new();
    for w in &p.worker {
        let wname = w.name.get_ref().clone();
        let weight = w.weight.as_ref().map_or(1, |x| *x.get_ref());
        let zone = w.zone.as_ref().map(|z| z.get_ref().as_str());
        let worker = match validate_worker(&wname, w.address.get_ref(), weight, zone, own) {
            Ok(w) => w,
            Err(e) => {
                let (span, f) = match e.field {
                    "name" => (w.name.span(), field("worker.name")),
                    "zone" => {
                        (w.zone.as_ref().map_or(w.name.span(), Spanned::span), field(&format!("worker.{wname}.zone")))
                    }
                    _ => (w.address.span(), field(&format!("worker.{wname}.address"))),
                };
                return ctx.err(Some(span), f, e.message);
            }
        };
        if workers.iter().any(|x| x.name == wname) {
            return ctx.err(Some(w.name.span()), field("worker.name"), format!("duplicate worker '{wname}'"));
        }
        workers.push(worker);
    }
    if workers.is_empty() {
        return ctx.err(Some(p.name.span()), field("worker"), "a pool needs at least one [[pool.worker]]");
    }
    if workers.iter().all(|w| w.weight == 0) {
        return ctx.err(
            Some(p.name.span()),
            field("worker"),
            "every worker has weight 0: the pool could serve nothing",
        );
    }
    // Build the strategy once so that its errors (jump with weights, a Maglev size that is not a
    // prime...) surface now, with the pool named, instead of at the first request.
    let nodes = crate::pool::node_set(&workers).map_err(|e| ConfigError {
        file: ctx.file.clone(),
        line: Some(ctx.line(p.name.span().start)),
        field: field("worker"),
        message: e.to_string(),
    })?;
    if let Err(message) = crate::pool::check_table_size(strategy, &options, &nodes) {
        let span = p.vnodes.as_ref().map(Spanned::span).or(p.maglev_size.as_ref().map(Spanned::span));
        return ctx.err(span.or(Some(p.name.span())), field("worker"), message);
    }
    if let Err(e) = keyroute::Policy::build(strategy, nodes, &options) {
        return ctx.err(
            p.strategy.as_ref().map(Spanned::span).or(Some(p.name.span())),
            field("strategy"),
            e.to_string(),
        );
    }
    Ok(PoolConfig {
        name: name.to_owned(),
        strategy,
        options,
        key,
        on_missing_key,
        worker_header,
        health,
        passive,
        retry,
        connect_timeout: timeout(ctx, p.connect_timeout_ms.as_ref(), 2_000, field("connect_timeout_ms"))?,
        workers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[listener]]
listen = "127.0.0.1:0"

[[pool]]
name = "thumbs"
strategy = "rendezvous"
key = "{path}?w={query.w}"

[[pool.worker]]
name = "w1"
address = "127.0.0.1:9001"

[[pool.worker]]
name = "w2"
address = "127.0.0.1:9002"
weight = 2
"#;

    #[test]
    fn a_good_config_validates() {
        let c = Config::parse(GOOD, "k.toml").expect("valid");
        assert_eq!(c.pools[0].workers.len(), 2);
        assert_eq!(c.listeners[0].routes[0].pool, 0);
        assert!(c.admin.listen.ip().is_loopback());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        for (edit, line, field, needle) in [
            (
                GOOD.replace("strategy = \"rendezvous\"", "strategy = \"fastest\""),
                7,
                "pool.thumbs.strategy",
                "unknown strategy",
            ),
            (GOOD.replace("weight = 2", "weight = 2\ncolour = \"red\""), 18, "pool.worker.colour", "unknown field"),
            (GOOD.replace("127.0.0.1:9002", "nowhere"), 16, "pool.thumbs.worker.w2.address", "not an address"),
            (GOOD.replace("{path}?w={query.w}", "{path}?w={query.w"), 8, "pool.thumbs.key", "unclosed"),
            (GOOD.replace("name = \"w2\"", "name = \"w1\""), 15, "pool.thumbs.worker.name", "duplicate worker"),
            (GOOD.replace("weight = 2", "weight = -2"), 17, "pool.worker.weight", "invalid value: integer `-2`"),
        ] {
            let err = Config::parse(&edit, "k.toml").expect_err("invalid");
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}");
            assert!(err.message.contains(needle), "{err}");
            assert!(err.to_string().starts_with(&format!("k.toml:{line}: {field}: ")), "{err}");
        }
    }

    #[test]
    fn values_that_would_fail_every_request_are_refused() {
        let key = "key = \"{path}?w={query.w}\"";
        for (edit, field) in [
            (GOOD.replace(key, &format!("{key}\nconnect_timeout_ms = 0")), "pool.thumbs.connect_timeout_ms"),
            (
                GOOD.replace(key, &format!("{key}\n[pool.retry]\nper_try_timeout_ms = 0")),
                "pool.thumbs.retry.per_try_timeout_ms",
            ),
            (GOOD.replace(key, &format!("{key}\n[pool.health]\ntimeout_ms = 0")), "pool.thumbs.health.timeout_ms"),
            (GOOD.replace(key, &format!("{key}\n[pool.health]\npath = \"/health check\"")), "pool.thumbs.health.path"),
            (
                GOOD.replace(
                    "listen = \"127.0.0.1:0\"",
                    "listen = \"127.0.0.1:0\"\n[[listener.route]]\nhost = \"a.example:8080\"\npool = \"thumbs\"",
                ),
                "listener.listener-1.route.host",
            ),
        ] {
            let err = Config::parse(&edit, "k.toml").expect_err("refused");
            assert_eq!(err.field, field, "{err}");
        }
    }

    /// Issue 8, defect 7: errors on a table header named the previous table; empty files, files
    /// without a listener and invalid UTF-8 gave no line.
    #[test]
    fn file_level_errors_name_a_line_and_the_right_table() {
        let err = Config::parse("[admin]\nlisten = \"127.0.0.1:0\"\n[[listener]]\nname = \"x\"\n", "k.toml")
            .expect_err("no listen");
        assert_eq!((err.line, err.field.as_str()), (Some(3), "listener.listen"), "{err}");
        let err = Config::parse("", "k.toml").expect_err("empty");
        assert_eq!((err.line, err.field.as_str()), (Some(1), "listener"), "{err}");
        let err = Config::parse("[admin]\nlisten = \"127.0.0.1:0\"\n", "k.toml").expect_err("no listener");
        assert_eq!((err.line, err.field.as_str()), (Some(2), "listener"), "{err}");
        let dir = std::env::temp_dir().join(format!("keyroute-config-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("bad.toml");
        std::fs::write(&path, b"[[listener]]\nlisten = \"127.0.0.1:0\"\nname = \"\xff\"\n").expect("write");
        let err = Config::load(&path).expect_err("not UTF-8");
        assert_eq!((err.line, err.message.as_str()), (Some(3), "not valid UTF-8"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Issue 8, defect 7: settings accepted silently that can never work as written.
    #[test]
    fn contradictory_settings_are_refused() {
        let key = "key = \"{path}?w={query.w}\"";
        let workers = &GOOD[GOOD.find("[[pool.worker]]").expect("workers")..];
        let no_workers = GOOD.replace(workers, "");
        for (edit, field, needle) in [
            (no_workers, "pool.thumbs.worker", "at least one"),
            (
                GOOD.replace("weight = 2", "weight = 0")
                    .replace("address = \"127.0.0.1:9001\"", "address = \"127.0.0.1:9001\"\nweight = 0"),
                "pool.thumbs.worker",
                "every worker has weight 0",
            ),
            (
                GOOD.replace(key, &format!("{key}\n[pool.passive]\nbase_ejection_ms = 60000\nmax_ejection_ms = 1000")),
                "pool.thumbs.passive.base_ejection_ms",
                "above passive.max_ejection_ms",
            ),
            (
                GOOD.replace(key, &format!("{key}\n[pool.retry]\nper_try_timeout_ms = 5000\ndeadline_ms = 1000")),
                "pool.thumbs.retry.per_try_timeout_ms",
                "above retry.deadline_ms",
            ),
            (
                GOOD.replace(
                    "listen = \"127.0.0.1:0\"",
                    "listen = \"127.0.0.1:8080\"\n[[listener]]\nlisten = \"0.0.0.0:8080\"",
                ),
                "listener.listener-2.listen",
                "collides with listener.listener-1.listen",
            ),
            (
                format!("[admin]\nlisten = \"127.0.0.1:8080\"\n{}", GOOD.replace("127.0.0.1:0", "127.0.0.1:8080")),
                "listener.listener-1.listen",
                "collides with admin.listen",
            ),
            (
                GOOD.replace("127.0.0.1:9002", "0.0.0.0:9002"),
                "pool.thumbs.worker.w2.address",
                "not an address a worker can listen at",
            ),
            (GOOD.replace("name = \"w2\"", "name = \"w 2\""), "pool.thumbs.worker.name", "spaces"),
            (
                GOOD.replace(key, &format!("{key}\nstrategy = \"ring\"\nvnodes = 10000"))
                    .replace("strategy = \"rendezvous\"\n", "")
                    .replace("weight = 2", "weight = 500"),
                "pool.thumbs.worker",
                "points",
            ),
        ] {
            let err = Config::parse(&edit, "k.toml").expect_err(field);
            assert_eq!(err.field, field, "{err}");
            assert!(err.message.contains(needle), "{err}");
            assert!(err.line.is_some(), "{err}");
        }
        // Valid but probably not meant: a warning, not an error.
        let slow_probe = GOOD.replace(key, &format!("{key}\n[pool.health]\ninterval_ms = 100\ntimeout_ms = 500"));
        let c = Config::parse(&slow_probe, "k.toml").expect("valid");
        assert_eq!(c.warnings.len(), 1);
        assert_eq!(c.warnings[0].field, "pool.thumbs.health.timeout_ms", "{}", c.warnings[0]);
        assert!(Config::parse(GOOD, "k.toml").expect("valid").warnings.is_empty());
    }

    #[test]
    fn jump_with_weights_is_refused_at_load() {
        let err = Config::parse(&GOOD.replace("\"rendezvous\"", "\"jump\""), "k.toml").expect_err("weights");
        assert!(err.message.contains("jump hash cannot weight"), "{err}");
    }

    #[test]
    fn a_public_admin_listener_needs_a_token() {
        let with_admin = format!("[admin]\nlisten = \"0.0.0.0:9901\"\n{GOOD}");
        let err = Config::parse(&with_admin, "k.toml").expect_err("token");
        assert_eq!(err.field, "admin.listen");
        let ok = format!("[admin]\nlisten = \"0.0.0.0:9901\"\ntoken = \"0123456789abcdef\"\n{GOOD}");
        assert!(Config::parse(&ok, "k.toml").is_ok());
    }
}

//! From the raw file to the types the gateway runs with: one function per section, each error
//! naming the file, the line and the field.

use std::net::SocketAddr;
use std::time::Duration;

use http::HeaderName;
use keyroute::hash::KeyHasher;
use keyroute::{Options, RingScheme, Strategy};
use toml::Spanned;

use super::raw::{RawConfig, RawPool};
use super::*;
use keyroute_gateway::config::{UpstreamConfig, UpstreamProtocol};
use keyroute_gateway::key::KeyTemplate;

/// Errors carry the file and compute lines from byte offsets.
pub(super) struct Ctx<'a> {
    pub(super) file: String,
    pub(super) src: &'a str,
    pub(super) warnings: std::cell::RefCell<Vec<ConfigError>>,
}

impl Ctx<'_> {
    pub(super) fn line(&self, offset: usize) -> usize {
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

/// The HTTP active check's path when `[pool.health]` names none.
const DEFAULT_HEALTH_PATH: &str = "/healthz";

/// The longest key template, in bytes: a template names parts of a request (`{path}?w={query.w}`);
/// one of megabytes is a mistake, and would be copied into every key.
const MAX_KEY_TEMPLATE: usize = 4096;

/// The longest ejection or stall window a configuration may set, in milliseconds.
const DAY_MS: u64 = 86_400_000;

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

/// The dotted field at a byte offset: the enclosing `[table]` or `[[array]]` header (the line
/// itself, if it is one), and the key on that line (`pool.worker.weight`).
pub(super) fn field_at(src: &str, offset: usize) -> String {
    let offset = offset.min(src.len());
    let start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
    let line = src[start..end].trim();
    // `[table]` or `[[array]]`, maybe followed by a comment: the name is what the brackets hold.
    let header = |l: &str| {
        let inner = l.strip_prefix('[')?;
        let inner = inner.strip_prefix('[').unwrap_or(inner);
        let name = inner.split(']').next().unwrap_or("").trim();
        (!name.is_empty()).then(|| name.to_owned())
    };
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
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() != 0 && a.port() == b.port() && (x == y || x.is_unspecified() || y.is_unspecified())
}

/// A byte of an HTTP token (RFC 9110 §5.6.2), lowercase letters included, `/` for a version.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b)
}

/// A DNS name as `admin.hosts` takes it: labels of letters, digits and `-`, no port.
fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

pub(super) fn validate(ctx: &Ctx<'_>, raw: RawConfig) -> Result<Config, ConfigError> {
    let admin = validate_admin(ctx, raw.admin.as_ref())?;
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
        if pools.iter().any(|(q, _): &(PoolConfig, HttpPoolConfig)| q.name == name) {
            return ctx.err(Some(p.name.span()), "pool.name", format!("duplicate pool '{name}'"));
        }
        pools.push(validate_pool(ctx, p, &name, &own_addrs)?);
    }
    let (mut pools, http): (Vec<PoolConfig>, Vec<HttpPoolConfig>) = pools.into_iter().unzip();
    let mut listeners = Vec::new();
    for (i, l) in raw.listener.iter().enumerate() {
        listeners.push(validate_listener(ctx, l, i, own[i + 1].0, &pools)?);
    }
    let served: Vec<(usize, usize)> = listeners
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.cache().map(|c| (i, c)))
        .flat_map(|(i, c)| {
            c.pools().filter_map(|name| pools.iter().position(|p| p.name == name)).map(move |at| (i, at))
        })
        .collect();
    // A shadow pool is sent the listener's protocol too: checked and defaulted the same way.
    let shadows: Vec<(usize, usize)> = served
        .iter()
        .filter_map(|&(i, at)| {
            let target = pools[at].shadow.as_ref()?;
            pools.iter().position(|p| p.name == target.pool).map(|t| (i, t))
        })
        .collect();
    let served: Vec<(usize, usize)> = served.into_iter().chain(shadows).collect();
    for (i, at) in served {
        let (l, raw_listener) = (&listeners[i], &raw.listener[i]);
        let Some(cache) = l.cache() else { continue };
        let cache_pool = pools[at].name.clone();
        let raw_pool = &raw.pool[at];
        if let Some(path) = raw_pool.health.as_ref().and_then(|h| h.path.as_ref()) {
            // A cache pool's active check is its protocol's (memcached `version`, Redis `PING`).
            let msg = format!(
                "pool '{}' has an HTTP health path ([pool.health] path), which a cache server cannot answer: remove it (the pool is checked with the listener's protocol)",
                cache_pool
            );
            // Named where the listener names it as its pool, else (a route's, a shadow) where
            // the path is.
            if cache_pool == cache.pool {
                let at = raw_listener.pool.as_ref().map_or_else(|| raw_listener.listen.span(), Spanned::span);
                return ctx.err(Some(at), format!("listener.{}.pool", l.name), msg);
            }
            return ctx.err(Some(path.span()), format!("pool.{cache_pool}.health.path"), msg);
        }
        if let Some(u) = &raw_pool.upstream {
            // memcached and Redis servers are reached in their own protocols, never HTTP or TLS.
            let listener_at = raw_listener.pool.as_ref().map_or_else(|| raw_listener.listen.span(), Spanned::span);
            let at = u.protocol.as_ref().map(Spanned::span).or_else(|| u.tls.as_ref().map(Spanned::span));
            let at = at.unwrap_or(listener_at);
            let msg = format!(
                "pool '{}' has [pool.upstream] (HTTP and TLS to workers), which a cache listener does not use: remove it",
                cache_pool
            );
            return ctx.err(Some(at), format!("pool.{cache_pool}.upstream"), msg);
        }
        if cache.protocol == CacheProtocol::Redis {
            store_defaults(&mut pools[at], raw_pool);
        }
    }
    // A shadowed pool is a cache listener's, and its shadow a pool that speaks its protocol.
    for (at, pool) in pools.iter().enumerate() {
        let (Some(shadow), Some(raw_shadow)) = (&pool.shadow, raw.pool[at].shadow.as_ref()) else { continue };
        let field = format!("pool.{}.shadow.pool", pool.name);
        let target = pool_index(ctx, &pools, &raw_shadow.pool, field.clone())?;
        let served = |i: usize| {
            let mut cache = listeners.iter().filter_map(|l| l.cache());
            cache.find(|c| c.pools().any(|p| p == pools[i].name)).map(|c| c.protocol)
        };
        let http = |i: usize| listeners.iter().filter_map(|l| l.http()).any(|h| h.routes.iter().any(|r| r.pool == i));
        let msg = match (served(at), served(target)) {
            (None, _) => Some("only a memcached or Redis listener's pool is shadowed".to_owned()),
            (Some(a), Some(b)) if a != b => Some(format!(
                "pool '{}' is served in another protocol: its servers would not understand the copies",
                shadow.pool
            )),
            _ if http(target) => Some(format!("pool '{}' is an HTTP listener's", shadow.pool)),
            _ => None,
        };
        if let Some(msg) = msg {
            return ctx.err(Some(raw_shadow.pool.span()), field, msg);
        }
    }
    // A Redis Cluster pool is a Redis listener's only (and no pool's shadow: its copies would not
    // follow the cluster's redirections).
    for (at, pool) in pools.iter().enumerate() {
        if pool.cluster.is_none() {
            continue;
        }
        let at_span = raw.pool[at].cluster.as_ref().and_then(|c| c.refresh_ms.as_ref().map(Spanned::span));
        let at_span = at_span.unwrap_or_else(|| raw.pool[at].name.span());
        let other = served_otherwise(&listeners, (at, &pool.name), CacheProtocol::Redis);
        let shadowed = pools.iter().any(|p| p.shadow.as_ref().is_some_and(|s| s.pool == pool.name));
        let msg = match (other, shadowed) {
            (Some(l), _) => format!(
                "pool '{}' is a Redis Cluster, which only a Redis listener serves, and listener '{}' serves it otherwise",
                pool.name, l.name
            ),
            (None, true) => format!("pool '{}' is a Redis Cluster, which cannot be a shadow", pool.name),
            (None, false) => continue,
        };
        return ctx.err(Some(at_span), format!("pool.{}.cluster", pool.name), msg);
    }
    // A replicated pool is a memcached listener's: its writes to every copy are that
    // listener's doing, and anything else would reach one copy.
    for (at, pool) in pools.iter().enumerate() {
        let Some(r) = raw.pool[at].replication.as_ref().filter(|_| pool.replication.is_some()) else { continue };
        let other = served_otherwise(&listeners, (at, &pool.name), CacheProtocol::Memcached);
        if let Some(l) = other {
            let msg = format!(
                "pool '{}' is replicated, which only a memcached listener does, and listener '{}' serves it otherwise",
                pool.name, l.name
            );
            return ctx.err(Some(r.copies.span()), format!("pool.{}.replication", pool.name), msg);
        }
    }
    Ok(Config {
        admin,
        listeners,
        pools,
        http,
        shutdown_delay: ms(raw.shutdown_delay_ms.as_ref(), 0),
        shutdown_grace: ms(raw.shutdown_grace_ms.as_ref(), 10_000),
        warnings: ctx.warnings.take(),
    })
}

/// `[admin]`: where the admin API listens, its token and the host names it answers to.
fn validate_admin(ctx: &Ctx<'_>, admin: Option<&super::raw::RawAdmin>) -> Result<AdminConfig, ConfigError> {
    Ok(match admin {
        None => AdminConfig { listen: SocketAddr::from(([127, 0, 0, 1], 9901)), token: None, hosts: Vec::new() },
        Some(a) => {
            let listen = match &a.listen {
                None => SocketAddr::from(([127, 0, 0, 1], 9901)),
                Some(l) => parse_addr(ctx, l, "admin.listen")?,
            };
            let token = a.token.as_ref().map(|t| t.get_ref().clone());
            if let Some(t) = &a.token
                && (t.get_ref().len() < 16 || !t.get_ref().bytes().all(|b| b.is_ascii_graphic()))
            {
                // A token is sent in a header (`Bearer`, or Basic's password): visible ASCII, and
                // no blanks, which guess as easily as they type.
                return ctx.err(
                    Some(t.span()),
                    "admin.token",
                    "must be at least 16 characters of visible ASCII (no spaces)",
                );
            }
            if !listen.ip().is_loopback() && token.is_none() {
                return ctx.err(
                    a.listen.as_ref().map(Spanned::span),
                    "admin.listen",
                    format!("{listen} is not a loopback address, so admin.token is required"),
                );
            }
            let hosts = a.hosts.as_ref().map(|h| h.get_ref().clone()).unwrap_or_default();
            if let Some(h) = &a.hosts
                && let Some(bad) = h.get_ref().iter().find(|n| !valid_host_name(n))
            {
                return ctx.err(
                    Some(h.span()),
                    "admin.hosts",
                    format!("{:?} is not a host name (letters, digits, '-' and '.', no port)", bad),
                );
            }
            AdminConfig { listen, token, hosts }
        }
    })
}

/// One `[[listener]]`, the `i`-th, at `listen` (validated with the gateway's other addresses):
/// what every kind shares, then its `protocol`'s settings, and none of another kind's.
fn validate_listener(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    i: usize,
    listen: SocketAddr,
    pools: &[PoolConfig],
) -> Result<ListenerConfig, ConfigError> {
    let name = l.name.clone().unwrap_or_else(|| format!("listener-{}", i + 1));
    let field = |f: &str| format!("listener.{name}.{f}");
    let max_connections = match &l.max_connections {
        None => None,
        Some(m) if (1..=1_000_000).contains(m.get_ref()) => Some(*m.get_ref()),
        Some(m) => return ctx.err(Some(m.span()), field("max_connections"), "must be in 1..=1000000"),
    };
    let protocol = match &l.protocol {
        None => None,
        Some(p) => match p.get_ref().as_str() {
            "http" => None,
            "memcached" => Some(CacheProtocol::Memcached),
            "redis" => Some(CacheProtocol::Redis),
            other => {
                let msg =
                    format!("'{}' is not a protocol keyroute serves (http, memcached, redis)", other.escape_debug());
                return ctx.err(Some(p.span()), field("protocol"), msg);
            }
        },
    };
    let serves = match protocol {
        Some(protocol) => Serves::Cache(validate_cache_listener(ctx, l, &name, protocol, pools)?),
        None => Serves::Http(validate_http_listener(ctx, l, &name, pools)?),
    };
    let reuse_port = l.reuse_port.as_ref().is_some_and(|b| *b.get_ref());
    Ok(ListenerConfig { name, listen, max_connections, reuse_port, serves })
}

/// An HTTP listener's settings; a cache listener's are refused.
fn validate_http_listener(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    name: &str,
    pools: &[PoolConfig],
) -> Result<HttpListenerConfig, ConfigError> {
    let field = |f: &str| format!("listener.{name}.{f}");
    let cache_only: [(&str, Option<std::ops::Range<usize>>, &str); 7] = [
        ("pool", l.pool.as_ref().map(Spanned::span), "an HTTP listener chooses pools by its [[listener.route]]s"),
        (
            "max_item_bytes",
            l.max_item_bytes.as_ref().map(Spanned::span),
            "only a memcached or Redis listener takes max_item_bytes",
        ),
        ("password", l.password.as_ref().map(Spanned::span), "only a Redis listener takes passwords"),
        ("server_password", l.server_password.as_ref().map(Spanned::span), "only a Redis listener takes passwords"),
        ("broadcast", l.broadcast.as_ref().map(Spanned::span), "only a memcached listener broadcasts"),
        ("read_pool", l.read_pool.as_ref().map(Spanned::span), "only a memcached or Redis listener routes by key"),
        (
            "prefix_route",
            l.prefix_route.first().map(|r| r.prefix.span()),
            "only a memcached or Redis listener routes by key prefix (an HTTP listener: [[listener.route]])",
        ),
    ];
    if let Some((f, span, msg)) = cache_only.into_iter().find(|(_, s, _)| s.is_some()) {
        return ctx.err(span, field(f), msg);
    }
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
    let routes = validate_routes(ctx, l, name, pools)?;
    let flag = |v: &Option<Spanned<bool>>, default: bool| v.as_ref().map_or(default, |b| *b.get_ref());
    let tls = validate_tls(ctx, l, name)?;
    let h2c = flag(&l.h2c, false);
    if h2c && !tls.is_empty() {
        let span = l.h2c.as_ref().map(Spanned::span);
        return ctx.err(span, field("h2c"), "h2c is HTTP/2 without TLS; a TLS listener offers h2 by ALPN (http2)");
    }
    let max_concurrent_streams = match &l.max_concurrent_streams {
        None => 100,
        Some(m) if (1..=10_000).contains(m.get_ref()) => *m.get_ref(),
        Some(m) => return ctx.err(Some(m.span()), field("max_concurrent_streams"), "must be in 1..=10000"),
    };
    let access_log = validate_access_log(ctx, l, name)?;
    let send_timeout = timeout(ctx, l.send_timeout_ms.as_ref(), 60_000, field("send_timeout_ms"))?;
    let tunnel_idle_timeout = timeout(ctx, l.tunnel_idle_timeout_ms.as_ref(), 60_000, field("tunnel_idle_timeout_ms"))?;
    Ok(HttpListenerConfig {
        max_header_bytes,
        max_headers,
        header_timeout,
        routes,
        tls,
        http2: flag(&l.http2, true),
        h2c,
        max_concurrent_streams,
        access_log,
        send_timeout,
        tunnel_idle_timeout,
    })
}

/// A cache listener's `pool`, `max_item_bytes` and passwords; every HTTP setting is refused (a
/// memcached or Redis listener speaks no HTTP, so the setting would be silently ignored).
fn validate_cache_listener(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    name: &str,
    protocol: CacheProtocol,
    pools: &[PoolConfig],
) -> Result<CacheListener, ConfigError> {
    let field = |f: &str| format!("listener.{name}.{f}");
    let http_only: [(&str, Option<std::ops::Range<usize>>); 11] = [
        ("route", l.route.first().map(|r| r.pool.span())),
        ("tls", l.tls.as_ref().map(|_| l.listen.span())),
        ("access_log", l.access_log.as_ref().map(|a| a.path.span())),
        ("http2", l.http2.as_ref().map(Spanned::span)),
        ("h2c", l.h2c.as_ref().map(Spanned::span)),
        ("max_header_bytes", l.max_header_bytes.as_ref().map(Spanned::span)),
        ("max_headers", l.max_headers.as_ref().map(Spanned::span)),
        ("header_timeout_ms", l.header_timeout_ms.as_ref().map(Spanned::span)),
        ("max_concurrent_streams", l.max_concurrent_streams.as_ref().map(Spanned::span)),
        ("send_timeout_ms", l.send_timeout_ms.as_ref().map(Spanned::span)),
        ("tunnel_idle_timeout_ms", l.tunnel_idle_timeout_ms.as_ref().map(Spanned::span)),
    ];
    if let Some((f, span)) = http_only.into_iter().find(|(_, s)| s.is_some()) {
        return ctx.err(span, field(f), "a memcached or Redis listener speaks no HTTP: this setting does not apply");
    }
    let pool = match &l.pool {
        Some(p) => pool_index(ctx, pools, p, field("pool"))?,
        None if pools.len() == 1 => 0,
        None => {
            return ctx.err(
                Some(l.listen.span()),
                field("pool"),
                "a memcached or Redis listener needs pool = NAME when there are several pools",
            );
        }
    };
    let max_item_bytes = match &l.max_item_bytes {
        None if protocol == CacheProtocol::Redis => 16 << 20,
        None => 1 << 20,
        Some(m) if (1024..=1 << 30).contains(m.get_ref()) => *m.get_ref(),
        Some(m) => {
            return ctx.err(
                Some(m.span()),
                field("max_item_bytes"),
                "must be in 1024..=1073741824 (memcached's -I range)",
            );
        }
    };
    let mut passwords = [None, None];
    for (slot, (name, value)) in
        passwords.iter_mut().zip([("password", &l.password), ("server_password", &l.server_password)])
    {
        let Some(v) = value else { continue };
        if protocol != CacheProtocol::Redis {
            return ctx.err(Some(v.span()), field(name), "only a Redis listener takes passwords");
        }
        if v.get_ref().is_empty() || v.get_ref().contains(['\r', '\n']) {
            return ctx.err(Some(v.span()), field(name), "must be non-empty, on one line");
        }
        *slot = Some(v.get_ref().clone());
    }
    let [password, server_password] = passwords;
    let broadcast = match &l.broadcast {
        Some(b) if protocol != CacheProtocol::Memcached && *b.get_ref() => {
            return ctx.err(
                Some(b.span()),
                field("broadcast"),
                "only a memcached listener broadcasts (flush_all, verbosity, stats to every server)",
            );
        }
        b => b.as_ref().is_some_and(|b| *b.get_ref()),
    };
    let pool = pools[pool].name.clone();
    let pool_named = |p: &Spanned<String>, f: String| pool_index(ctx, pools, p, f).map(|i| pools[i].name.clone());
    let read_pool = l.read_pool.as_ref().map(|p| pool_named(p, field("read_pool"))).transpose()?;
    let mut routes: Vec<keyroute_cacheproxy::KeyRoute> = Vec::new();
    for (i, r) in l.prefix_route.iter().enumerate() {
        let f = |name: &str| field(&format!("prefix_route[{i}].{name}"));
        let prefix = r.prefix.get_ref();
        if prefix.is_empty() || prefix.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return ctx.err(
                Some(r.prefix.span()),
                f("prefix"),
                "must be non-empty, without spaces or control bytes (a key's start)",
            );
        }
        if routes.iter().any(|x| x.prefix == prefix.as_bytes()) {
            return ctx.err(Some(r.prefix.span()), f("prefix"), format!("a route for '{prefix}' comes before"));
        }
        let read_pool = r.read_pool.as_ref().map(|p| pool_named(p, f("read_pool"))).transpose()?;
        routes.push(keyroute_cacheproxy::KeyRoute {
            prefix: prefix.as_bytes().to_vec(),
            pool: pool_named(&r.pool, f("pool"))?,
            read_pool,
        });
    }
    Ok(CacheListener { protocol, pool, max_item_bytes, password, server_password, broadcast, read_pool, routes })
}

/// A listener's `[[listener.route]]`s (one to the only pool when it has none).
fn validate_routes(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    name: &str,
    pools: &[PoolConfig],
) -> Result<Vec<RouteConfig>, ConfigError> {
    let field = |f: &str| format!("listener.{name}.{f}");
    let mut routes = Vec::new();
    for r in &l.route {
        let pool = pool_index(ctx, pools, &r.pool, field("route.pool"))?;
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
        let upgrades = match &r.upgrades {
            None => vec!["websocket".to_owned()],
            Some(u) => {
                let list: Vec<String> = u.get_ref().iter().map(|p| p.to_ascii_lowercase()).collect();
                if let Some(bad) = list.iter().find(|p| p.is_empty() || !p.bytes().all(is_token_byte)) {
                    let msg = format!("{bad:?} is not a protocol name (an HTTP token)");
                    return ctx.err(Some(u.span()), field("route.upgrades"), msg);
                }
                if list.iter().any(|p| p == "h2c") {
                    let msg = "h2c is never tunnelled: its HTTP/2 streams would bypass the routes (use h2c = true on the listener for HTTP/2 without TLS)";
                    return ctx.err(Some(u.span()), field("route.upgrades"), msg);
                }
                list
            }
        };
        routes.push(RouteConfig { host, path_prefix, pool, upgrades });
    }
    if routes.is_empty() {
        if pools.len() == 1 {
            routes.push(RouteConfig {
                host: None,
                path_prefix: "/".into(),
                pool: 0,
                upgrades: vec!["websocket".to_owned()],
            });
        } else {
            return ctx.err(
                Some(l.listen.span()),
                field("route"),
                "a listener needs routes when there are several pools",
            );
        }
    }
    Ok(routes)
}

/// A listener's certificates, loaded (warnings for those expired or expiring soon).
fn validate_tls(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    name: &str,
) -> Result<Vec<keyroute_gateway::tls::Certificate>, ConfigError> {
    let field = |f: &str| format!("listener.{name}.{f}");
    let mut tls = Vec::new();
    if let Some(t) = &l.tls {
        if t.certificate.is_empty() {
            return ctx.err(
                Some(l.listen.span()),
                field("tls.certificate"),
                "a TLS listener needs at least one [[listener.tls.certificate]]",
            );
        }
        for c in &t.certificate {
            let (cert, key) = (relative_to(ctx, c.cert.get_ref()), relative_to(ctx, c.key.get_ref()));
            match keyroute_gateway::tls::Certificate::load(&cert, &key) {
                Ok(loaded) => {
                    if let Some(w) = loaded.warning(std::time::SystemTime::now()) {
                        ctx.warn(Some(c.cert.span()), field("tls.certificate.cert"), w);
                    }
                    tls.push(loaded);
                }
                Err(e) => {
                    let span = if e.field == "cert" { c.cert.span() } else { c.key.span() };
                    return ctx.err(Some(span), field(&format!("tls.certificate.{}", e.field)), e.message);
                }
            }
        }
    }
    Ok(tls)
}

/// A listener's `[listener.access_log]`.
fn validate_access_log(
    ctx: &Ctx<'_>,
    l: &super::raw::RawListener,
    name: &str,
) -> Result<Option<AccessLogConfig>, ConfigError> {
    let field = |f: &str| format!("listener.{name}.{f}");
    let flag = |v: &Option<Spanned<bool>>, default: bool| v.as_ref().map_or(default, |b| *b.get_ref());
    Ok(match &l.access_log {
        None => None,
        Some(a) => {
            let format = match a.format.as_ref().map(|f| f.get_ref().as_str()) {
                None | Some("json") => AccessLogFormat::Json,
                Some("logfmt") => AccessLogFormat::Logfmt,
                Some(other) => {
                    let span = a.format.as_ref().map(Spanned::span);
                    return ctx.err(
                        span,
                        field("access_log.format"),
                        format!("unknown format '{}' (json or logfmt)", other.escape_debug()),
                    );
                }
            };
            let buffer = match &a.buffer {
                None => 65_536,
                Some(b) if (1..=10_000_000).contains(b.get_ref()) => *b.get_ref(),
                Some(b) => return ctx.err(Some(b.span()), field("access_log.buffer"), "must be in 1..=10000000"),
            };
            let text = a.path.get_ref();
            if text.is_empty() {
                return ctx.err(
                    Some(a.path.span()),
                    field("access_log.path"),
                    "must not be empty (- is standard output)",
                );
            }
            let path = if text == "-" { PathBuf::from("-") } else { relative_to(ctx, text) };
            Some(AccessLogConfig { path, format, key: flag(&a.key, false), buffer })
        }
    })
}

/// A host name resolved now (the first address), for `host:port` values.
/// A path from the configuration: relative ones are relative to the file's directory.
fn relative_to(ctx: &Ctx<'_>, text: &str) -> PathBuf {
    let p = std::path::Path::new(text);
    match std::path::Path::new(&ctx.file).parent() {
        Some(dir) if p.is_relative() && !dir.as_os_str().is_empty() => dir.join(p),
        _ => p.to_owned(),
    }
}

fn parse_addr(ctx: &Ctx<'_>, s: &Spanned<String>, field: &str) -> Result<SocketAddr, ConfigError> {
    let text = s.get_ref();
    match socket_addr(text, resolve) {
        Some(a) => Ok(a),
        None => ctx.err(Some(s.span()), field, format!("'{text}' is not an address (host:port)")),
    }
}

/// One `[[pool]]`: the fleet's settings, and those of the HTTP listeners that route to it.
fn validate_pool(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    own: &[SocketAddr],
) -> Result<(PoolConfig, HttpPoolConfig), ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    let (strategy, options) = validate_placement(ctx, p, name)?;
    let (key, on_missing_key, worker_header) = validate_key(ctx, p, name)?;
    let workers = validate_workers(ctx, p, name, own)?;
    let membership = validate_membership(ctx, p, name)?;
    check_members(ctx, p, name, strategy, &options, &workers, &membership)?;
    let (health, health_path) = validate_health(ctx, p, name)?;
    let (hot_keys, cache) = validate_hot_keys(ctx, p, name, strategy)?.unzip();
    let pool = PoolConfig {
        name: name.to_owned(),
        strategy,
        options,
        health,
        passive: validate_passive(ctx, p, name)?,
        retry: validate_retry(ctx, p, name)?,
        connect_timeout: timeout(ctx, p.connect_timeout_ms.as_ref(), 2_000, field("connect_timeout_ms"))?,
        membership,
        workers,
        hot_keys,
        slow_start: validate_slow_start(ctx, p, name, strategy)?,
        handoff: validate_handoff(ctx, p, name, strategy)?,
        replication: validate_replication(ctx, p, name, strategy)?,
        slow_log: validate_slow_log(ctx, p, name)?,
        shadow: validate_shadow(ctx, p, name)?,
        cluster: validate_cluster(ctx, p, name)?,
    };
    let upstream = validate_upstream(ctx, p, name)?;
    let http = HttpPoolConfig {
        key,
        on_missing_key,
        worker_header,
        health_path,
        grpc_health: validate_grpc_health(ctx, p, name, upstream.protocol)?,
        read_timeout: timeout(ctx, p.read_timeout_ms.as_ref(), 60_000, field("read_timeout_ms"))?,
        cache: cache.flatten(),
        upstream: std::sync::Arc::new(upstream),
    };
    Ok((pool, http))
}

/// `[pool.health] grpc_service`: a gRPC health check, which needs HTTP/2 to the workers.
fn validate_grpc_health(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    protocol: UpstreamProtocol,
) -> Result<Option<String>, ConfigError> {
    let field = |f: &str| format!("pool.{name}.health.{f}");
    let Some(h) = &p.health else { return Ok(None) };
    let Some(service) = &h.grpc_service else { return Ok(None) };
    if let Some(path) = &h.path {
        return ctx.err(
            Some(path.span()),
            field("path"),
            "a gRPC health check asks a service, not a path: say one of them",
        );
    }
    if protocol == UpstreamProtocol::Http1 {
        let msg = "gRPC needs HTTP/2 to the workers: set [pool.upstream] protocol = \"h2\" (or \"auto\" over TLS)";
        return ctx.err(Some(service.span()), field("grpc_service"), msg);
    }
    if service.get_ref().len() > 1024 {
        return ctx.err(Some(service.span()), field("grpc_service"), "must be at most 1024 bytes");
    }
    Ok(Some(service.get_ref().clone()))
}

/// `[pool.upstream]`: HTTP/1.1 or HTTP/2 to the workers, and TLS (its files loaded now, so a
/// missing or bad one is an error naming its field).
fn validate_upstream(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<UpstreamConfig, ConfigError> {
    use keyroute_gateway::upstream::tls::{ClientTls, ClientTlsSettings, MinVersion, NameRule};
    let field = |f: &str| format!("pool.{name}.upstream.{f}");
    let Some(u) = &p.upstream else { return Ok(UpstreamConfig::default()) };
    let tls_on = u.tls.as_ref().is_some_and(|t| *t.get_ref());
    let protocol = match u.protocol.as_ref().map(|s| (s, s.get_ref().as_str())) {
        None | Some((_, "http1")) => UpstreamProtocol::Http1,
        Some((_, "h2")) => UpstreamProtocol::H2,
        Some((s, "auto")) if !tls_on => {
            let msg = "auto picks by ALPN, which needs TLS: set tls = true, or say http1 or h2";
            return ctx.err(Some(s.span()), field("protocol"), msg);
        }
        Some((_, "auto")) => UpstreamProtocol::Auto,
        Some((s, other)) => {
            let msg = format!("'{}' is not one of: http1, h2, auto", other.escape_debug());
            return ctx.err(Some(s.span()), field("protocol"), msg);
        }
    };
    let max_streams = match &u.max_streams {
        None => UpstreamConfig::default().max_streams,
        Some(m) if (1..=10_000).contains(m.get_ref()) => *m.get_ref(),
        Some(m) => return ctx.err(Some(m.span()), field("max_streams"), "must be in 1..=10000"),
    };
    let tls_fields = [
        ("ca_file", &u.ca_file),
        ("server_name", &u.server_name),
        ("client_cert", &u.client_cert),
        ("client_key", &u.client_key),
        ("min_version", &u.min_version),
    ];
    if !tls_on {
        if let Some((f, Some(v))) = tls_fields.iter().find(|(_, v)| v.is_some()) {
            return ctx.err(Some(v.span()), field(f), "a TLS setting without tls = true: say tls = true, or remove it");
        }
        return Ok(UpstreamConfig { protocol, tls: None, max_streams });
    }
    if let (Some(s), Some(m)) = (&u.server_name, &p.membership)
        && s.get_ref() == "{worker}"
        && m.source.get_ref() == "dns"
    {
        let template = m.worker_name.as_ref().map_or("{host}:{port}", |t| t.get_ref().as_str());
        if template.contains(':') || template.contains("{port}") {
            let msg = format!(
                "workers from DNS are named '{template}', with a port, which no certificate names: set [pool.membership] worker_name = \"{{host}}\", or a fixed server_name"
            );
            return ctx.err(Some(s.span()), field("server_name"), msg);
        }
    }
    let server_name = match &u.server_name {
        None => NameRule::Address,
        Some(s) => match NameRule::parse(s.get_ref()) {
            Some(n) => n,
            None => {
                let msg = format!(
                    "'{}' is not a DNS name or an IP address ({{worker}}: each worker's name)",
                    s.get_ref().escape_debug()
                );
                return ctx.err(Some(s.span()), field("server_name"), msg);
            }
        },
    };
    let min_version = match u.min_version.as_ref().map(|s| (s, s.get_ref().as_str())) {
        None | Some((_, "1.2")) => MinVersion::Tls12,
        Some((_, "1.3")) => MinVersion::Tls13,
        Some((s, other)) => {
            return ctx.err(
                Some(s.span()),
                field("min_version"),
                format!("'{}' is not one of: 1.2, 1.3", other.escape_debug()),
            );
        }
    };
    let client_cert = match (&u.client_cert, &u.client_key) {
        (None, None) => None,
        (Some(c), Some(k)) => Some((relative_to(ctx, c.get_ref()), relative_to(ctx, k.get_ref()))),
        (Some(c), None) => return ctx.err(Some(c.span()), field("client_key"), "client_cert needs client_key"),
        (None, Some(k)) => return ctx.err(Some(k.span()), field("client_cert"), "client_key needs client_cert"),
    };
    let settings = ClientTlsSettings {
        ca_file: u.ca_file.as_ref().map(|c| relative_to(ctx, c.get_ref())),
        client_cert,
        server_name,
        min_version,
    };
    match ClientTls::load(settings, protocol.alpn()) {
        Ok(tls) => {
            if let Some(w) = tls.client_cert.as_ref().and_then(|c| c.warning(std::time::SystemTime::now())) {
                ctx.warn(u.client_cert.as_ref().map(Spanned::span), field("client_cert"), w);
            }
            Ok(UpstreamConfig { protocol, tls: Some(tls), max_streams })
        }
        Err(e) => {
            let span = match e.field {
                "ca_file" => u.ca_file.as_ref(),
                "client_cert" => u.client_cert.as_ref(),
                "client_key" => u.client_key.as_ref(),
                _ => u.min_version.as_ref(),
            };
            let span = span.map(Spanned::span).or_else(|| u.tls.as_ref().map(Spanned::span));
            ctx.err(span, field(e.field), e.message)
        }
    }
}

/// The strategy and its options (`strategy`, `hash`, `scheme`, `vnodes`, `maglev_size`,
/// `epsilon`, `choices`, `[pool.compat]`).
fn validate_placement(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<(Strategy, Options), ConfigError> {
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
    if let Some(c) = &p.compat {
        options.compat = validate_compat(ctx, c, name, strategy, p)?;
    }
    Ok((strategy, options))
}

/// The key template, what to do without a key, and the header that names the worker.
fn validate_key(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
) -> Result<(KeyTemplate, MissingKey, Option<HeaderName>), ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    let normalize = p.normalize.as_ref().map(|n| n.get_ref().clone()).unwrap_or_default();
    let key_text = p.key.as_ref().map_or("{uri}".to_owned(), |k| k.get_ref().clone());
    if key_text.len() > MAX_KEY_TEMPLATE {
        let msg = format!("{} bytes is longer than {MAX_KEY_TEMPLATE}: a key names parts of a request", key_text.len());
        return ctx.err(p.key.as_ref().map(Spanned::span), field("key"), msg);
    }
    let key = match KeyTemplate::parse(&key_text, &normalize) {
        Ok(k) => k,
        Err(e) => {
            let (span, f) = match &e {
                keyroute_gateway::key::TemplateError::Normalize(_) => {
                    (p.normalize.as_ref().map(Spanned::span), field("normalize"))
                }
                keyroute_gateway::key::TemplateError::Template(_) => (p.key.as_ref().map(Spanned::span), field("key")),
            };
            return ctx.err(span, f, e.to_string());
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
    Ok((key, on_missing_key, worker_header))
}

/// `[pool.health]`: the active checks.
/// `[pool.health]`: the fleet's schedule, and the HTTP check's path (`/healthz` by default).
fn validate_health(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<(HealthConfig, String), ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    Ok(match &p.health {
        None => (HealthConfig::default(), DEFAULT_HEALTH_PATH.to_owned()),
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
            // The default timeout is never above the interval: 1 s, or the interval if shorter.
            let default_timeout = (interval.as_millis() as u64).min(1000);
            let probe_timeout = timeout(ctx, h.timeout_ms.as_ref(), default_timeout, field("health.timeout_ms"))?;
            if probe_timeout > interval {
                // A probe still waiting when the next is due: the checks would fall behind their
                // interval, and a dead worker be found every interval + timeout (issue 31, 27).
                return ctx.err(
                    h.timeout_ms.as_ref().map(Spanned::span),
                    field("health.timeout_ms"),
                    format!(
                        "{} ms is above health.interval_ms ({} ms): a probe must end before the next is due",
                        probe_timeout.as_millis(),
                        interval.as_millis(),
                    ),
                );
            }
            let check = HealthConfig { active: true, interval, timeout: probe_timeout, rise, fall };
            (check, path.unwrap_or_else(|| DEFAULT_HEALTH_PATH.to_owned()))
        }
    })
}

/// `[pool.passive]`: ejection and the stall window.
fn validate_passive(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<PassiveConfig, ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    let x = p.passive.as_ref();
    let base_ejection = ms(x.and_then(|x| x.base_ejection_ms.as_ref()), 10_000);
    let max_ejection = ms(x.and_then(|x| x.max_ejection_ms.as_ref()), 300_000);
    for (v, name) in [
        (x.and_then(|x| x.base_ejection_ms.as_ref()), "passive.base_ejection_ms"),
        (x.and_then(|x| x.max_ejection_ms.as_ref()), "passive.max_ejection_ms"),
        (x.and_then(|x| x.stall_ms.as_ref()), "passive.stall_ms"),
    ] {
        if let Some(v) = v
            && *v.get_ref() > DAY_MS
        {
            return ctx.err(Some(v.span()), field(name), format!("must be at most {DAY_MS} (a day)"));
        }
    }
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
    Ok(PassiveConfig {
        consecutive_failures: x.and_then(|x| x.consecutive_failures).unwrap_or(5),
        base_ejection,
        max_ejection,
        stall: ms(x.and_then(|x| x.stall_ms.as_ref()), 2_000),
    })
}

/// A store's failure defaults, for a pool a Redis listener serves (issue 31, defect 12), where
/// the file leaves them unset: a key is only ever sent to its owner. A store's key has one home:
/// a write sent to the next server while the owner is down, paused or slow lands where no later
/// read of the owner finds it, and is found again only by reads that fail over the same way (a
/// counter restarts from nothing there, a deleted key lives on). So a Redis pool neither ejects
/// (`consecutive_failures = 0`), nor routes around a stalled server (`stall_ms = 0`), nor tries
/// the next server when the owner cannot be reached (`attempts = 1`): the owner's commands fail
/// with an error the client sees until it is back, as nutcracker's default (`auto_eject_hosts:
/// false`) does. A memcached pool keeps the cache's defaults (eject after 5 failures, route around
/// a 2 s stall, 3 attempts): a cache's key moved to the next server costs a miss and a refill.
fn store_defaults(pool: &mut PoolConfig, raw: &RawPool) {
    let passive = raw.passive.as_ref();
    if passive.and_then(|x| x.consecutive_failures).is_none() {
        pool.passive.consecutive_failures = 0;
    }
    if passive.and_then(|x| x.stall_ms.as_ref()).is_none() {
        pool.passive.stall = Duration::ZERO;
    }
    if raw.retry.as_ref().and_then(|r| r.attempts.as_ref()).is_none() {
        pool.retry.attempts = 1;
    }
}

/// `[pool.retry]`: tries, and their timeouts.
fn validate_retry(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<RetryConfig, ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
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
    Ok(RetryConfig { attempts: attempts.map_or(3, |a| *a.get_ref()), per_try_timeout, deadline })
}

/// `[[pool.worker]]`: each worker as the admin API validates one, names and ids unique.
fn validate_workers(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    own: &[SocketAddr],
) -> Result<Vec<WorkerConfig>, ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    let mut workers: Vec<WorkerConfig> = Vec::new();
    for w in &p.worker {
        let wname = w.name.get_ref().clone();
        let weight = w.weight.as_ref().map_or(1, |x| *x.get_ref());
        let zone = w.zone.as_ref().map(|z| z.get_ref().as_str());
        let mut worker = match validate_worker(&wname, w.address.get_ref(), weight, zone, own) {
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
        if let Some(id) = &w.id {
            if *id.get_ref() == 0 {
                return ctx.err(
                    Some(id.span()),
                    field(&format!("worker.{wname}.id")),
                    "must be at least 1 (HAProxy's ids start at 1)",
                );
            }
            if let Some(other) = workers.iter().find(|x| x.id == Some(*id.get_ref())) {
                return ctx.err(
                    Some(id.span()),
                    field(&format!("worker.{wname}.id")),
                    format!("worker '{}' has id {} already", other.name, id.get_ref()),
                );
            }
            worker.id = Some(*id.get_ref());
        }
        workers.push(worker);
    }
    Ok(workers)
}

/// The members with the source: a static pool has workers, an etcd-backed one none; some
/// weight; and a table the strategy builds within the size limit.
fn check_members(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    strategy: Strategy,
    options: &Options,
    workers: &[WorkerConfig],
    membership: &MembershipConfig,
) -> Result<(), ConfigError> {
    let field = |f: &str| format!("pool.{name}.{f}");
    if *membership != MembershipConfig::Static {
        if let Some(w) = p.worker.first() {
            let msg = match membership {
                MembershipConfig::Dns(_) => {
                    "a DNS-backed pool takes its workers from DNS: remove its [[pool.worker]] entries (publish records instead)"
                }
                _ => {
                    "an etcd-backed pool takes its workers from etcd: remove its [[pool.worker]] entries (add them with `keyroute members add`)"
                }
            };
            return ctx.err(Some(w.name.span()), field("worker"), msg);
        }
    } else if workers.is_empty() {
        return ctx.err(Some(p.name.span()), field("worker"), "a pool needs at least one [[pool.worker]]");
    }
    if !workers.is_empty() && workers.iter().all(|w| w.weight == 0) {
        return ctx.err(
            Some(p.name.span()),
            field("worker"),
            "every worker has weight 0: the pool could serve nothing",
        );
    }
    // Build the strategy once so that its errors (jump with weights, a Maglev size that is not a
    // prime...) surface now, with the pool named, instead of at the first request.
    let nodes =
        keyroute_fleet::table::node_set(workers.iter().map(|w| (w.name.as_str(), w.weight, w.zone.as_deref(), w.id)))
            .map_err(|e| ConfigError {
            file: ctx.file.clone(),
            line: Some(ctx.line(p.name.span().start)),
            field: field("worker"),
            message: e.to_string(),
        })?;
    if let Err(too_large) = keyroute_fleet::table::check_table_size(strategy, options, &nodes) {
        let span = p.vnodes.as_ref().map(Spanned::span).or(p.maglev_size.as_ref().map(Spanned::span));
        return ctx.err(span.or(Some(p.name.span())), field("worker"), too_large.to_string());
    }
    // An etcd-backed pool starts empty: its table is built (and checked) as members arrive, since
    // some modes refuse an empty set (twemproxy, redis-cluster).
    if let Err(e) = keyroute::Policy::build(strategy, nodes, options)
        .map(drop)
        .or_else(|e| if *membership == MembershipConfig::Static { Err(e) } else { Ok(()) })
    {
        return ctx.err(
            p.strategy.as_ref().map(Spanned::span).or(Some(p.name.span())),
            field("strategy"),
            e.to_string(),
        );
    }
    Ok(())
}

/// `[pool.compat]`: the parameters of the compatibility strategies (checked again, with the
/// workers, when the table is built).
fn validate_compat(
    ctx: &Ctx<'_>,
    c: &super::raw::RawCompat,
    name: &str,
    strategy: Strategy,
    p: &RawPool,
) -> Result<keyroute::compat::CompatOptions, ConfigError> {
    use keyroute::compat::{CompatOptions, guava::GuavaInput, haproxy::HaproxyHash};
    let field = |f: &str| format!("pool.{name}.compat.{f}");
    if !matches!(strategy, Strategy::Compat(_)) {
        return ctx.err(
            p.strategy.as_ref().map(Spanned::span).or(Some(p.name.span())),
            format!("pool.{name}.compat"),
            format!(
                "[pool.compat] sets the parameters of a compatibility strategy (nginx, haproxy, ...); '{}' is not one",
                strategy.name()
            ),
        );
    }
    let mut o = CompatOptions::default();
    if let Some(h) = &c.haproxy_hash {
        o.haproxy_hash = match HaproxyHash::parse(h.get_ref()) {
            Ok(h) => h,
            Err(e) => return ctx.err(Some(h.span()), field("haproxy_hash"), e.to_string()),
        };
    }
    if let Some(t) = &c.hash_tag {
        o.twemproxy_hash_tag = match <[u8; 2]>::try_from(t.get_ref().as_bytes()) {
            Ok(t) => Some(t),
            Err(_) => return ctx.err(Some(t.span()), field("hash_tag"), "must be two bytes, such as \"{}\""),
        };
    }
    if let Some(r) = &c.groupcache_replicas {
        if !(1..=100_000).contains(r.get_ref()) {
            return ctx.err(Some(r.span()), field("groupcache_replicas"), "must be in 1..=100000");
        }
        o.groupcache_replicas = *r.get_ref();
    }
    if let Some(g) = &c.guava_input {
        o.guava_input = match g.get_ref().as_str() {
            "murmur3" => GuavaInput::Murmur3_128,
            "md5" => GuavaInput::Md5,
            other => return ctx.err(Some(g.span()), field("guava_input"), format!("'{other}' (valid: murmur3, md5)")),
        };
    }
    for (v, slot, f) in [
        (&c.envoy_min_ring_size, &mut o.envoy_min_ring_size, "envoy_min_ring_size"),
        (&c.envoy_max_ring_size, &mut o.envoy_max_ring_size, "envoy_max_ring_size"),
        (&c.envoy_table_size, &mut o.envoy_table_size, "envoy_table_size"),
    ] {
        if let Some(v) = v {
            if *v.get_ref() == 0 {
                return ctx.err(Some(v.span()), field(f), "must be at least 1");
            }
            *slot = *v.get_ref();
        }
    }
    Ok(o)
}

/// The index of the pool `name` names (at `field`), or the error that lists the pools.
fn pool_index(
    ctx: &Ctx<'_>,
    pools: &[PoolConfig],
    name: &Spanned<String>,
    field: String,
) -> Result<usize, ConfigError> {
    match pools.iter().position(|p| p.name == *name.get_ref()) {
        Some(i) => Ok(i),
        None => {
            let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            let msg = format!("no pool named '{}' (pools: {})", name.get_ref().escape_debug(), known.join(", "));
            ctx.err(Some(name.span()), field, msg)
        }
    }
}

/// The listener that sends to pool `at` (named `name`) in another way than a `protocol`
/// listener: a cache listener of another protocol, or an HTTP listener's route.
fn served_otherwise<'l>(
    listeners: &'l [ListenerConfig],
    (at, name): (usize, &str),
    protocol: CacheProtocol,
) -> Option<&'l ListenerConfig> {
    listeners.iter().find(|l| match (l.cache(), l.http()) {
        (Some(c), _) => c.pools().any(|p| p == name) && c.protocol != protocol,
        (_, Some(h)) => h.routes.iter().any(|route| route.pool == at),
        _ => false,
    })
}

/// A `u64` field within `lo..=hi`, or its default.
fn ranged(
    ctx: &Ctx<'_>,
    v: Option<&Spanned<u64>>,
    default: u64,
    lo: u64,
    hi: u64,
    field: String,
) -> Result<u64, ConfigError> {
    match v {
        Some(x) if !(lo..=hi).contains(x.get_ref()) => {
            ctx.err(Some(x.span()), field, format!("must be in {lo}..={hi}"))
        }
        Some(x) => Ok(*x.get_ref()),
        None => Ok(default),
    }
}

/// Hot keys, slow start and handoff steer keys among their owners: they need a strategy that
/// places by key.
fn needs_key(ctx: &Ctx<'_>, p: &RawPool, name: &str, strategy: Strategy, what: &str) -> Result<(), ConfigError> {
    if strategy.uses_key() {
        return Ok(());
    }
    ctx.err(
        p.strategy.as_ref().map(Spanned::span).or(Some(p.name.span())),
        format!("pool.{name}.{what}"),
        format!("{what} needs a strategy that places by key; '{}' does not", strategy.name()),
    )
}

fn validate_hot_keys(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    strategy: Strategy,
) -> Result<Option<(HotKeysConfig, Option<CacheSettings>)>, ConfigError> {
    use keyroute::hot::{HotKeyConfig, Threshold};
    let Some(h) = &p.hot_keys else { return Ok(None) };
    let field = |f: &str| format!("pool.{name}.hot_keys.{f}");
    needs_key(ctx, p, name, strategy, "hot_keys")?;
    let positive = |v: &Spanned<f64>, f: &str| -> Result<f64, ConfigError> {
        let x = *v.get_ref();
        if x.is_finite() && x > 0.0 { Ok(x) } else { ctx.err(Some(v.span()), field(f), "must be a number > 0") }
    };
    let threshold = match (&h.threshold, &h.threshold_share) {
        (Some(t), None) => Threshold::Rate(positive(t, "threshold")?),
        (None, Some(s)) => {
            let x = *s.get_ref();
            if !(x > 0.0 && x <= 1.0) {
                return ctx.err(Some(s.span()), field("threshold_share"), "must be in (0, 1]");
            }
            Threshold::Share(x)
        }
        (Some(t), Some(_)) => {
            return ctx.err(Some(t.span()), field("threshold"), "give threshold (req/s) or threshold_share, not both");
        }
        (None, None) => {
            return ctx.err(
                Some(p.name.span()),
                field("threshold"),
                "hot_keys needs threshold (requests per second) or threshold_share (of the pool's traffic)",
            );
        }
    };
    let per_replica = match (&h.per_worker, threshold) {
        (Some(v), _) => positive(v, "per_worker")?,
        (None, Threshold::Rate(t)) => t,
        (None, Threshold::Share(_)) => {
            return ctx.err(
                h.threshold_share.as_ref().map(Spanned::span),
                field("per_worker"),
                "with threshold_share, give per_worker: the rate (req/s) one replica of a hot key should stay under",
            );
        }
    };
    let max_replicas = match &h.max_replicas {
        Some(v) if !(1..=255).contains(v.get_ref()) => {
            return ctx.err(Some(v.span()), field("max_replicas"), "must be in 1..=255");
        }
        Some(v) => *v.get_ref() as usize,
        None => 4,
    };
    let hold = ranged(ctx, h.hold_ms.as_ref(), 10_000, 1, DAY_MS, field("hold_ms"))?;
    let window = ranged(ctx, h.window_ms.as_ref(), 1_000, 100, 60_000, field("window_ms"))?;
    let counters = ranged(ctx, h.counters.as_ref(), 64, 1, 4096, field("counters"))?;
    let sample_every = ranged(ctx, h.sample_every.as_ref(), 16, 1, 1024, field("sample_every"))?;
    // A rate threshold must be measurable: at least 2 sampled requests per window at it.
    if let Threshold::Rate(t) = threshold {
        let samples = t * window as f64 / 1e3 / sample_every as f64;
        if samples < 2.0 {
            return ctx.err(
                h.threshold.as_ref().map(Spanned::span),
                field("threshold"),
                format!(
                    "{t} req/s is {samples:.2} sampled requests per window (window_ms {window}, sample_every {sample_every}): at least 2 are needed to measure it; raise window_ms or lower sample_every"
                ),
            );
        }
    }
    let cache = match &h.cache {
        None => None,
        Some(c) => {
            let cf = |f: &str| format!("pool.{name}.hot_keys.cache.{f}");
            let max_bytes = ranged(ctx, c.max_bytes.as_ref(), 64 << 20, 1, 1 << 40, cf("max_bytes"))?;
            let max_object_bytes = ranged(
                ctx,
                c.max_object_bytes.as_ref(),
                (1 << 20).min(max_bytes),
                1,
                max_bytes,
                cf("max_object_bytes"),
            )?;
            let coalesce = ranged(ctx, c.coalesce_timeout_ms.as_ref(), 5_000, 1, 600_000, cf("coalesce_timeout_ms"))?;
            Some(CacheSettings {
                max_bytes,
                max_object_bytes,
                cache_authorized: c.cache_authorized.unwrap_or(false),
                cache_set_cookie: c.cache_set_cookie.unwrap_or(false),
                coalesce_timeout: Duration::from_millis(coalesce),
            })
        }
    };
    let confidence = match &h.confidence {
        Some(v) if !(v.get_ref().is_finite() && (0.0..=10.0).contains(v.get_ref())) => {
            return ctx.err(Some(v.span()), field("confidence"), "must be in [0, 10] (standard deviations)");
        }
        Some(v) => *v.get_ref(),
        None => 2.0,
    };
    let rule = HotKeyConfig { threshold, per_replica, max_replicas, hold: Duration::from_millis(hold), confidence };
    if let Err(e) = rule.validate() {
        return ctx.err(Some(p.name.span()), field("threshold"), e.to_string());
    }
    let hot = HotKeysConfig {
        rule,
        window: Duration::from_millis(window),
        counters: counters as usize,
        sample_every: sample_every as u32,
        show_keys: h.show_keys.unwrap_or(false),
    };
    Ok(Some((hot, cache)))
}

fn validate_slow_start(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    strategy: Strategy,
) -> Result<Option<SlowStartConfig>, ConfigError> {
    let Some(s) = &p.slow_start else { return Ok(None) };
    let field = |f: &str| format!("pool.{name}.slow_start.{f}");
    needs_key(ctx, p, name, strategy, "slow_start")?;
    let window = ranged(ctx, Some(&s.window_ms), 0, 1, DAY_MS, field("window_ms"))?;
    let min_share = match &s.min_share {
        Some(v) if !(0.0..=1.0).contains(v.get_ref()) => {
            return ctx.err(Some(v.span()), field("min_share"), "must be in [0, 1]");
        }
        Some(v) => *v.get_ref(),
        None => 0.1,
    };
    let ramp = match keyroute::warm::Ramp::try_new(Duration::from_millis(window), min_share) {
        Ok(r) => r,
        Err(e) => return ctx.err(Some(s.window_ms.span()), field("window_ms"), e.to_string()),
    };
    Ok(Some(SlowStartConfig { ramp, by_hit_rate: s.by_hit_rate.unwrap_or(true) }))
}

fn validate_handoff(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    strategy: Strategy,
) -> Result<Option<Duration>, ConfigError> {
    let Some(h) = &p.handoff else { return Ok(None) };
    needs_key(ctx, p, name, strategy, "handoff")?;
    let window = ranged(ctx, Some(&h.window_ms), 0, 1, DAY_MS, format!("pool.{name}.handoff.window_ms"))?;
    Ok(Some(Duration::from_millis(window)))
}

/// `[pool.replication]`: 2 to 8 copies of each key, placed by key; not with hot keys (whose
/// copies a replicated pool's writes would not know of) nor the handoff (whose warm-up moves a key
/// that a replicated pool keeps in several places). Which listener may serve the pool is checked
/// with the listeners.
fn validate_replication(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
    strategy: Strategy,
) -> Result<Option<keyroute_fleet::config::ReplicationConfig>, ConfigError> {
    let Some(r) = &p.replication else { return Ok(None) };
    let field = |f: &str| format!("pool.{name}.replication.{f}");
    needs_key(ctx, p, name, strategy, "replication")?;
    let copies = ranged(ctx, Some(&r.copies), 2, 2, 8, field("copies"))?;
    for (what, set) in [("hot_keys", p.hot_keys.is_some()), ("handoff", p.handoff.is_some())] {
        if set {
            let msg = format!(
                "a replicated pool keeps each key on {copies} servers, which [pool.{what}] would not know of: remove one of them"
            );
            return ctx.err(Some(r.copies.span()), field("copies"), msg);
        }
    }
    let repair = r.repair.as_ref().is_none_or(|b| *b.get_ref());
    Ok(Some(keyroute_fleet::config::ReplicationConfig { copies: copies as usize, repair }))
}

/// `[pool.cluster]`: its refresh (100 ms to 10 min, 5 s by default) and replica reads (`never` by
/// default; `hot` needs hot keys); not with what places keys by the pool's own table (the
/// handoff, replication) or copies them (a shadow). The listeners that may serve it are checked
/// with them.
fn validate_cluster(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
) -> Result<Option<keyroute_fleet::config::ClusterConfig>, ConfigError> {
    use keyroute_fleet::config::ReplicaReads;
    let Some(c) = &p.cluster else { return Ok(None) };
    let field = |f: &str| format!("pool.{name}.cluster.{f}");
    let refresh = ranged(ctx, c.refresh_ms.as_ref(), 5_000, 100, 600_000, field("refresh_ms"))?;
    let at = c.refresh_ms.as_ref().map_or_else(|| p.name.span(), Spanned::span);
    for (what, set) in [
        ("handoff", p.handoff.is_some()),
        ("replication", p.replication.is_some()),
        ("shadow", p.shadow.is_some()),
        // Its members are the cluster's nodes: another source would overwrite them.
        ("membership", p.membership.is_some()),
    ] {
        if set {
            let msg = format!(
                "a Redis Cluster places keys by its own slots, which [pool.{what}] would not follow: remove one of them"
            );
            return ctx.err(Some(at), format!("pool.{name}.cluster"), msg);
        }
    }
    let replica_reads = match c.replica_reads.as_ref().map(|v| (v, v.get_ref().as_str())) {
        // Stale reads are a choice: never by default, hot keys or not.
        None | Some((_, "never")) => ReplicaReads::Never,
        Some((_, "always")) => ReplicaReads::Always,
        Some((v, "hot")) if p.hot_keys.is_none() => {
            let msg = "\"hot\" spreads hot keys' reads: add [pool.hot_keys], or say \"never\" or \"always\"";
            return ctx.err(Some(v.span()), field("replica_reads"), msg);
        }
        Some((_, "hot")) => ReplicaReads::Hot,
        Some((v, other)) => {
            let msg = format!("'{}' is not one of never, hot, always", other.escape_debug());
            return ctx.err(Some(v.span()), field("replica_reads"), msg);
        }
    };
    Ok(Some(keyroute_fleet::config::ClusterConfig { refresh: Duration::from_millis(refresh), replica_reads }))
}

/// `[pool.shadow]`: its share and queue (the pool it names is checked with the listeners).
fn validate_shadow(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
) -> Result<Option<keyroute_fleet::config::ShadowConfig>, ConfigError> {
    let Some(s) = &p.shadow else { return Ok(None) };
    let field = |f: &str| format!("pool.{name}.shadow.{f}");
    let share = *s.share.get_ref();
    if !(share > 0.0 && share <= 1.0) {
        return ctx.err(Some(s.share.span()), field("share"), "must be in (0, 1]: the share of keys shadowed");
    }
    let queue = ranged(ctx, s.queue.as_ref(), 1024, 1, 1 << 20, field("queue"))?;
    if s.pool.get_ref() == name {
        return ctx.err(Some(s.pool.span()), field("pool"), "a pool cannot shadow itself");
    }
    Ok(Some(keyroute_fleet::config::ShadowConfig { pool: s.pool.get_ref().clone(), share, queue: queue as usize }))
}

/// `[pool.slow_log]`: a threshold of 0 to 60 s, 0 to 10,000 entries.
fn validate_slow_log(
    ctx: &Ctx<'_>,
    p: &RawPool,
    name: &str,
) -> Result<keyroute_fleet::config::SlowLogConfig, ConfigError> {
    let default = keyroute_fleet::config::SlowLogConfig::default();
    let Some(s) = &p.slow_log else { return Ok(default) };
    let field = |f: &str| format!("pool.{name}.slow_log.{f}");
    let threshold = ranged(ctx, s.threshold_ms.as_ref(), 10, 0, 60_000, field("threshold_ms"))?;
    let entries = ranged(ctx, s.entries.as_ref(), default.entries as u64, 0, 10_000, field("entries"))?;
    Ok(keyroute_fleet::config::SlowLogConfig {
        threshold: Duration::from_millis(threshold),
        entries: entries as usize,
        show_keys: s.show_keys.as_ref().is_some_and(|b| *b.get_ref()),
    })
}

fn validate_membership(ctx: &Ctx<'_>, p: &RawPool, name: &str) -> Result<MembershipConfig, ConfigError> {
    let field = |f: &str| format!("pool.{name}.membership.{f}");
    let Some(m) = &p.membership else { return Ok(MembershipConfig::Static) };
    let etcd_only = [
        (m.endpoints.as_ref().map(Spanned::span), "endpoints"),
        (m.prefix.as_ref().map(Spanned::span), "prefix"),
        (m.state_file.as_ref().map(Spanned::span), "state_file"),
        (m.debounce_ms.as_ref().map(Spanned::span), "debounce_ms"),
    ];
    let dns_only = [
        (m.name.as_ref().map(Spanned::span), "name"),
        (m.record.as_ref().map(Spanned::span), "record"),
        (m.port.as_ref().map(Spanned::span), "port"),
        (m.server.as_ref().map(Spanned::span), "server"),
        (m.ttl_floor_ms.as_ref().map(Spanned::span), "ttl_floor_ms"),
        (m.ttl_ceiling_ms.as_ref().map(Spanned::span), "ttl_ceiling_ms"),
        (m.timeout_ms.as_ref().map(Spanned::span), "timeout_ms"),
        (m.worker_name.as_ref().map(Spanned::span), "worker_name"),
        (m.srv_priority.as_ref().map(Spanned::span), "srv_priority"),
    ];
    #[derive(PartialEq)]
    enum Source {
        Static,
        Etcd,
        Dns,
    }
    let source = match m.source.get_ref().as_str() {
        "static" => Source::Static,
        "etcd" => Source::Etcd,
        "dns" => Source::Dns,
        other => {
            return ctx.err(
                Some(m.source.span()),
                field("source"),
                format!("unknown source '{}' (expected \"static\", \"etcd\" or \"dns\")", other.escape_debug()),
            );
        }
    };
    if source != Source::Etcd
        && let Some((Some(span), what)) = etcd_only.iter().find(|(s, _)| s.is_some())
    {
        return ctx.err(Some(span.clone()), field(what), "only an etcd source takes this (source = \"etcd\")");
    }
    if source != Source::Dns
        && let Some((Some(span), what)) = dns_only.iter().find(|(s, _)| s.is_some())
    {
        return ctx.err(Some(span.clone()), field(what), "only a DNS source takes this (source = \"dns\")");
    }
    match source {
        Source::Static => Ok(MembershipConfig::Static),
        Source::Dns => validate_dns(ctx, m, name).map(MembershipConfig::Dns),
        Source::Etcd => {
            let Some(endpoints) = &m.endpoints else {
                return ctx.err(
                    Some(m.source.span()),
                    field("endpoints"),
                    "an etcd source needs endpoints = [\"http://HOST:PORT\"]",
                );
            };
            if endpoints.get_ref().is_empty() {
                return ctx.err(Some(endpoints.span()), field("endpoints"), "must list at least one endpoint");
            }
            if let Err(e) = keyroute_etcd::Client::new(endpoints.get_ref()) {
                return ctx.err(Some(endpoints.span()), field("endpoints"), e.to_string());
            }
            let Some(prefix) = &m.prefix else {
                return ctx.err(
                    Some(m.source.span()),
                    field("prefix"),
                    format!("an etcd source needs a key prefix, for example \"/keyroute/pools/{name}/workers/\""),
                );
            };
            let text = prefix.get_ref();
            if !text.starts_with('/') || !text.ends_with('/') || text.len() < 2 {
                return ctx.err(
                    Some(prefix.span()),
                    field("prefix"),
                    format!(
                        "'{}' must start and end with '/' (each key under it is one worker's name)",
                        text.escape_debug()
                    ),
                );
            }
            let state_file = match &m.state_file {
                Some(f) => Some(std::path::PathBuf::from(f.get_ref())),
                None => {
                    // Beside the configuration file (a bare file name is in the working directory).
                    let dir = std::path::Path::new(&ctx.file)
                        .parent()
                        .map(|d| if d.as_os_str().is_empty() { std::path::Path::new(".") } else { d });
                    match dir {
                        Some(d) => Some(d.join(format!("{name}.members.json"))),
                        None => {
                            ctx.warn(
                                Some(m.source.span()),
                                field("state_file"),
                                "no state file: a gateway started while etcd is down will have no members",
                            );
                            None
                        }
                    }
                }
            };
            let debounce = ms(m.debounce_ms.as_ref(), 50);
            if debounce > Duration::from_secs(5) {
                return ctx.err(
                    m.debounce_ms.as_ref().map(Spanned::span),
                    field("debounce_ms"),
                    "must be at most 5000",
                );
            }
            Ok(MembershipConfig::Etcd(EtcdConfig {
                endpoints: endpoints.get_ref().clone(),
                prefix: text.clone(),
                state_file,
                debounce,
            }))
        }
    }
}

/// `[pool.membership] source = "dns"`: the name, its records, the resolver and the timing.
fn validate_dns(
    ctx: &Ctx<'_>,
    m: &super::raw::RawMembership,
    pool: &str,
) -> Result<keyroute_fleet::config::DnsConfig, ConfigError> {
    use keyroute_fleet::config::{DnsConfig, DnsRecord, SrvPriority};
    let field = |f: &str| format!("pool.{pool}.membership.{f}");
    let Some(name) = &m.name else {
        let msg =
            "a DNS source needs the name to resolve, for example name = \"_http._tcp.web.default.svc.cluster.local\"";
        return ctx.err(Some(m.source.span()), field("name"), msg);
    };
    // Names compare without case (answers come back lowercase).
    let lowered = name.get_ref().trim_end_matches('.').to_ascii_lowercase();
    let text = lowered.as_str();
    if keyroute_fleet::membership::dns::wire::query(0, text, 1).is_err() {
        return ctx.err(Some(name.span()), field("name"), format!("'{}' is not a DNS name", text.escape_debug()));
    }
    let record = match m.record.as_ref().map(|r| (r, r.get_ref().as_str())) {
        None if text.starts_with('_') => DnsRecord::Srv,
        None => DnsRecord::Address,
        Some((_, "srv")) => DnsRecord::Srv,
        Some((_, "a")) => DnsRecord::Address,
        Some((r, other)) => {
            return ctx.err(
                Some(r.span()),
                field("record"),
                format!("'{}' is not one of: srv, a", other.escape_debug()),
            );
        }
    };
    let port = match (record, &m.port) {
        (DnsRecord::Address, None) => {
            let msg = "address records carry no port: say the workers' port = N";
            return ctx.err(Some(name.span()), field("port"), msg);
        }
        (DnsRecord::Address, Some(p)) if *p.get_ref() == 0 => {
            return ctx.err(Some(p.span()), field("port"), "must be in 1..=65535");
        }
        (DnsRecord::Srv, Some(p)) => {
            return ctx.err(Some(p.span()), field("port"), "SRV records carry each worker's port: remove it");
        }
        (_, p) => p.as_ref().map(|p| *p.get_ref()),
    };
    let server = match &m.server {
        Some(s) => match s
            .get_ref()
            .parse::<SocketAddr>()
            .or_else(|_| s.get_ref().parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        {
            Ok(a) => a,
            Err(_) => {
                let msg = format!("'{}' is not an address (IP or IP:PORT)", s.get_ref().escape_debug());
                return ctx.err(Some(s.span()), field("server"), msg);
            }
        },
        None => match system_resolver() {
            Some(a) => a,
            None => {
                let msg = "no server given and no nameserver in /etc/resolv.conf: say server = \"IP:PORT\"";
                return ctx.err(Some(m.source.span()), field("server"), msg);
            }
        },
    };
    let ms = |v: &Option<Spanned<u64>>, default: u64, range: std::ops::RangeInclusive<u64>, f: &str| {
        let value = v.as_ref().map_or(default, |v| *v.get_ref());
        if range.contains(&value) {
            Ok(Duration::from_millis(value))
        } else {
            ctx.err(v.as_ref().map(Spanned::span), field(f), format!("must be in {}..={}", range.start(), range.end()))
        }
    };
    let ttl_floor = ms(&m.ttl_floor_ms, 1_000, 100..=3_600_000, "ttl_floor_ms")?;
    let ttl_ceiling = ms(&m.ttl_ceiling_ms, 60_000, 100..=86_400_000, "ttl_ceiling_ms")?;
    if ttl_ceiling < ttl_floor {
        let span = m.ttl_ceiling_ms.as_ref().or(m.ttl_floor_ms.as_ref()).map(Spanned::span);
        return ctx.err(span, field("ttl_ceiling_ms"), "must be at least ttl_floor_ms");
    }
    let timeout = ms(&m.timeout_ms, 2_000, 10..=60_000, "timeout_ms")?;
    let worker_name = match &m.worker_name {
        None if record == DnsRecord::Srv => "{host}:{port}".to_owned(),
        None => "{ip}:{port}".to_owned(),
        Some(t) => {
            let text = t.get_ref();
            let names_one = match record {
                DnsRecord::Srv => text.contains("{host}") || text.contains("{ip}"),
                DnsRecord::Address => text.contains("{ip}"),
            };
            if !names_one {
                let msg = match record {
                    DnsRecord::Srv => "must name each worker apart: use {host} or {ip} (and {port})",
                    DnsRecord::Address => "must name each address apart: use {ip}",
                };
                return ctx.err(Some(t.span()), field("worker_name"), msg);
            }
            let rest = text.replace("{host}", "").replace("{ip}", "").replace("{port}", "");
            if rest.contains('{') || rest.contains('}') {
                let msg = "only {host}, {ip} and {port} are known here";
                return ctx.err(Some(t.span()), field("worker_name"), msg);
            }
            text.clone()
        }
    };
    let priority = match (record, m.srv_priority.as_ref().map(|p| (p, p.get_ref().as_str()))) {
        (_, None) | (DnsRecord::Srv, Some((_, "lowest"))) => SrvPriority::Lowest,
        (DnsRecord::Srv, Some((_, "zone"))) => SrvPriority::Zone,
        (DnsRecord::Address, Some((p, _))) => {
            return ctx.err(Some(p.span()), field("srv_priority"), "only SRV records have a priority");
        }
        (_, Some((p, other))) => {
            let msg = format!("'{}' is not one of: lowest, zone", other.escape_debug());
            return ctx.err(Some(p.span()), field("srv_priority"), msg);
        }
    };
    Ok(DnsConfig {
        name: text.to_owned(),
        record,
        port,
        server,
        ttl_floor,
        ttl_ceiling,
        timeout,
        worker_name,
        priority,
    })
}

/// The first `nameserver` of `/etc/resolv.conf`, on port 53.
fn system_resolver() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().split('%').next()?.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31 (12): a pool a Redis listener serves sends a key only to its owner unless the
    /// file asks for failover; a memcached pool keeps the cache's defaults.
    #[test]
    fn a_store_fails_where_a_cache_fails_over() {
        let text = |protocol: &str, pool_extra: &str| {
            format!(
                "[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"{protocol}\"\n[[pool]]\nname = \"p\"\n{pool_extra}\n[[pool.worker]]\nname = \"a\"\naddress = \"127.0.0.1:7001\"\n"
            )
        };
        let pool = |protocol: &str, extra: &str| {
            let c = Config::parse(&text(protocol, extra), "t.toml").expect("valid");
            (c.pools[0].passive.clone(), c.pools[0].retry.attempts)
        };
        let (store, attempts) = pool("redis", "");
        assert_eq!((store.consecutive_failures, store.stall, attempts), (0, Duration::ZERO, 1));
        let (cache, attempts) = pool("memcached", "");
        assert_eq!((cache.consecutive_failures, cache.stall, attempts), (5, Duration::from_secs(2), 3));
        let asked = "[pool.retry]\nattempts = 2\n[pool.passive]\nconsecutive_failures = 3\nstall_ms = 500\n";
        let (store, attempts) = pool("redis", asked);
        assert_eq!((store.consecutive_failures, store.stall, attempts), (3, Duration::from_millis(500), 2));
    }

    #[test]
    fn wildcard_listen_addresses_collide_with_every_spelling() {
        assert!(collide("[::ffff:127.0.0.1]:8080".parse().expect("addr"), "127.0.0.1:8080".parse().expect("addr")));
        assert!(collide("0.0.0.0:8080".parse().expect("addr"), "127.0.0.1:8080".parse().expect("addr")));
        assert!(!collide("127.0.0.1:8080".parse().expect("addr"), "127.0.0.1:8081".parse().expect("addr")));
    }
}

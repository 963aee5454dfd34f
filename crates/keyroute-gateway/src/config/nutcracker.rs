//! A nutcracker (twemproxy) configuration, converted to keyroute's: `keyroute from-nutcracker`.
//!
//! Each pool of the YAML becomes a listener at the same `listen` address (`protocol =
//! "memcached"`, or `"redis"` for a pool with `redis: true`) and a pool with `strategy =
//! "twemproxy"` over the same servers, in the same order, with the same weights and names. keyroute's `twemproxy` mode reproduces nutcracker
//! 0.5.0's ketama continuum (`hash: md5`, `distribution: ketama`; `hash_tag` too), so every key
//! has the same server: switching loses no cache.
//!
//! | nutcracker | keyroute |
//! |---|---|
//! | `listen` | the listener's `listen` |
//! | `hash: md5`, `distribution: ketama` | `strategy = "twemproxy"` (any other pair is refused: its keys would move) |
//! | `hash_tag` | `[pool.compat] hash_tag` |
//! | `timeout` | `[pool.retry] per_try_timeout_ms`, and `connect_timeout_ms` |
//! | `auto_eject_hosts`, `server_failure_limit`, `server_retry_timeout` | `[pool.passive] consecutive_failures`, `base_ejection_ms` (0 failures when `auto_eject_hosts` is off) |
//! | `servers: - host:port:weight [name]` | `[[pool.worker]]`: `name` (the server's name, else `host:port`, the label twemproxy hashes), `address`, `weight` |
//! | `redis: true` | `protocol = "redis"` |
//! | `redis_auth` | the listener's `password` (clients `AUTH` first, as nutcracker asks) and `server_password` |
//! | `redis_db` | 0 only: keyroute serves database 0 (another would find the keys elsewhere) |
//!
//! Failover differs by design: an ejected server's keys walk to the next server of their
//! ranking, where nutcracker rebuilds its continuum over the live servers (moving other servers'
//! keys too). Settings of connection handling (`backlog`, `client_connections`, `preconnect`,
//! `server_connections`) have no counterpart and are listed in a comment.

use std::fmt::Write as _;
use std::net::SocketAddr;

use yaml_rust2::{Yaml, YamlLoader};

use super::ConfigError;

/// Settings that are read and have no keyroute counterpart.
const IGNORED: [&str; 4] = ["backlog", "client_connections", "preconnect", "server_connections"];

/// Settings converted.
const CONVERTED: [&str; 12] = [
    "redis",
    "redis_auth",
    "redis_db",
    "listen",
    "hash",
    "distribution",
    "hash_tag",
    "timeout",
    "auto_eject_hosts",
    "server_failure_limit",
    "server_retry_timeout",
    "servers",
];

/// The keyroute configuration (TOML) for nutcracker's `text` (read from `file`), with the admin
/// API at `admin`.
///
/// # Errors
///
/// The first setting that cannot be converted, with its file, line and field.
pub fn from_nutcracker(text: &str, file: &str, admin: SocketAddr) -> Result<String, ConfigError> {
    let err = |line: Option<usize>, field: String, message: String| ConfigError {
        file: file.to_owned(),
        line,
        field,
        message,
    };
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| err(Some(e.marker().line()), "yaml".into(), e.info().to_owned()))?;
    let Some(Yaml::Hash(pools)) = docs.first() else {
        return Err(err(None, "yaml".into(), "a nutcracker configuration is a mapping of pool names to pools".into()));
    };
    // Where a field is written: the first line, after its pool's, that starts with it.
    let lines: Vec<&str> = text.lines().collect();
    let line_of = |pool: &str, field: Option<&str>| -> Option<usize> {
        let start = lines
            .iter()
            .position(|l| l.trim_end().strip_suffix(':').is_some_and(|k| k.trim().trim_matches('"') == pool))?;
        let Some(field) = field else { return Some(start + 1) };
        lines[start + 1..]
            .iter()
            .position(|l| l.trim_start().strip_prefix(field).is_some_and(|r| r.trim_start().starts_with(':')))
            .map(|i| start + 2 + i)
    };
    let mut out = format!(
        "# Converted from {file} by `keyroute from-nutcracker`: each pool is a memcached (or Redis) listener\n\
         # and a pool placed exactly as nutcracker places it (strategy \"twemproxy\"), so no key moves.\n\n\
         [admin]\nlisten = \"{admin}\"\n"
    );
    let mut listeners = String::new();
    let mut pool_text = String::new();
    for (name, pool) in pools {
        let Some(name) = name.as_str() else {
            return Err(err(None, "yaml".into(), "pool names must be strings".into()));
        };
        let field = |f: &str| format!("{name}.{f}");
        let at = |f: &str| line_of(name, Some(f)).or_else(|| line_of(name, None));
        let Yaml::Hash(settings) = pool else {
            return Err(err(line_of(name, None), name.to_owned(), "a pool is a mapping of settings".into()));
        };
        let get = |k: &str| settings.get(&Yaml::String(k.to_owned()));
        if let Some((k, _)) = settings
            .iter()
            .filter_map(|(k, v)| Some((k.as_str()?, v)))
            .find(|(k, _)| !CONVERTED.contains(k) && !IGNORED.contains(k))
        {
            return Err(err(at(k), field(k), "not a nutcracker setting keyroute knows".into()));
        }
        let redis = match get("redis") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| err(at("redis"), field("redis"), "must be true or false".into()))?,
        };
        let text_of = |k: &str| -> Result<Option<String>, ConfigError> {
            match get(k) {
                None | Some(Yaml::Null) => Ok(None),
                Some(Yaml::String(s)) => Ok(Some(s.clone())),
                Some(Yaml::Integer(i)) => Ok(Some(i.to_string())),
                Some(Yaml::Boolean(b)) => Ok(Some(b.to_string())),
                Some(_) => Err(err(at(k), field(k), "must be a single value".into())),
            }
        };
        let number = |k: &str, default: u64| -> Result<u64, ConfigError> {
            match get(k) {
                None => Ok(default),
                Some(Yaml::Integer(i)) if *i >= 0 => Ok(*i as u64),
                Some(_) => Err(err(at(k), field(k), "must be a whole number, 0 or more".into())),
            }
        };
        let listen =
            text_of("listen")?.ok_or_else(|| err(line_of(name, None), field("listen"), "is required".into()))?;
        let listen: SocketAddr = listen.parse().map_err(|_| {
            err(
                at("listen"),
                field("listen"),
                format!("'{}' is not an ip:port (a unix socket or a name is not converted)", listen.escape_debug()),
            )
        })?;
        let auth = text_of("redis_auth")?;
        if !redis && auth.is_some() {
            return Err(err(at("redis_auth"), field("redis_auth"), "is for a pool with redis: true".into()));
        }
        if number("redis_db", 0)? != 0 {
            return Err(err(
                at("redis_db"),
                field("redis_db"),
                "keyroute serves database 0 only: the keys of another would not be found".into(),
            ));
        }
        let hash = text_of("hash")?.unwrap_or_else(|| "fnv1a_64".into());
        let distribution = text_of("distribution")?.unwrap_or_else(|| "ketama".into());
        if hash != "md5" || distribution != "ketama" {
            let f = if hash != "md5" { "hash" } else { "distribution" };
            return Err(err(
                at(f),
                field(f),
                format!(
                    "hash: {hash} with distribution: {distribution}: keyroute reproduces nutcracker's hash: md5 with distribution: ketama; with another pair every key would move"
                ),
            ));
        }
        let hash_tag = text_of("hash_tag")?;
        if let Some(t) = &hash_tag
            && t.len() != 2
        {
            return Err(err(at("hash_tag"), field("hash_tag"), "must be two characters, as \"{}\"".into()));
        }
        let timeout = number("timeout", 0)?;
        let eject = get("auto_eject_hosts").and_then(Yaml::as_bool).unwrap_or(false);
        let failures = number("server_failure_limit", 2)?;
        let retry = number("server_retry_timeout", 30_000)?;
        let Some(Yaml::Array(servers)) = get("servers") else {
            return Err(err(at("servers"), field("servers"), "a list of host:port:weight [name] is required".into()));
        };
        if servers.is_empty() {
            return Err(err(at("servers"), field("servers"), "nutcracker refuses a pool without servers".into()));
        }
        let _ = write!(
            listeners,
            "\n[[listener]]\nname = {}\nlisten = \"{listen}\"\nprotocol = \"{}\"\npool = {}\n",
            quote(name),
            if redis { "redis" } else { "memcached" },
            quote(name)
        );
        if let Some(a) = &auth {
            let _ = write!(listeners, "password = {}\nserver_password = {}\n", quote(a), quote(a));
        }
        let _ = write!(pool_text, "\n[[pool]]\nname = {}\nstrategy = \"twemproxy\"\n", quote(name));
        if timeout > 0 {
            let _ = writeln!(pool_text, "connect_timeout_ms = {timeout}");
        }
        if let Some(t) = &hash_tag {
            let _ = write!(pool_text, "[pool.compat]\nhash_tag = {}\n", quote(t));
        }
        if timeout > 0 {
            let _ = write!(pool_text, "[pool.retry]\nper_try_timeout_ms = {timeout}\n");
        }
        let _ = write!(
            pool_text,
            "[pool.passive]\n# auto_eject_hosts: {eject}, server_failure_limit: {failures}, server_retry_timeout: {retry}\nconsecutive_failures = {}\nbase_ejection_ms = {}\n",
            if eject { failures.max(1) } else { 0 },
            retry.max(1),
        );
        let ignored: Vec<&str> = IGNORED.iter().copied().filter(|k| get(k).is_some()).collect();
        if !ignored.is_empty() {
            let _ = writeln!(pool_text, "# not converted (no counterpart): {}", ignored.join(", "));
        }
        for s in servers {
            let Some(line) = s.as_str() else {
                return Err(err(
                    at("servers"),
                    field("servers"),
                    "each server is a string host:port:weight [name]".into(),
                ));
            };
            let bad = |m: &str| err(at("servers"), field("servers"), format!("'{}': {m}", line.escape_debug()));
            let (addr_weight, server_name) = match line.trim().split_once(' ') {
                Some((a, n)) => (a, Some(n.trim())),
                None => (line.trim(), None),
            };
            let (addr, weight) = addr_weight.rsplit_once(':').ok_or_else(|| bad("host:port:weight is expected"))?;
            let weight: u32 = weight.parse().map_err(|_| bad("the weight is not a number"))?;
            let address: SocketAddr = addr
                .parse()
                .map_err(|_| bad("the address is not ip:port (a unix socket or a name is not converted)"))?;
            // twemproxy hashes the server's name when it has one, else host:port (the 11211 rule
            // applies to that, inside the twemproxy mode).
            let label = server_name.filter(|n| !n.is_empty()).map_or_else(|| addr.to_owned(), str::to_owned);
            let _ = write!(
                pool_text,
                "[[pool.worker]]\nname = {}\naddress = \"{address}\"\nweight = {weight}\n",
                quote(&label)
            );
        }
    }
    out.push_str(&listeners);
    out.push_str(&pool_text);
    Ok(out)
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04X}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "127.0.0.1:9901";

    #[test]
    fn a_redis_pool_becomes_a_redis_listener_with_its_password() {
        let yml = "r:\n  listen: 127.0.0.1:22122\n  hash: md5\n  distribution: ketama\n  redis: true\n  redis_auth: s3cret\n  redis_db: 0\n  servers:\n   - 127.0.0.1:6379:1\n   - 127.0.0.1:6380:1\n";
        let toml = from_nutcracker(yml, "n.yml", ADMIN.parse().expect("addr")).expect("converted");
        let config = crate::Config::parse(&toml, "converted.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let cache = config.listeners[0].cache.as_ref().expect("a cache listener");
        assert_eq!(cache.protocol, crate::config::CacheProtocol::Redis);
        assert_eq!((cache.password.as_deref(), cache.server_password.as_deref()), (Some("s3cret"), Some("s3cret")));
        assert_eq!(config.pools[0].strategy.name(), "twemproxy");
    }

    #[test]
    fn a_pool_becomes_a_listener_and_a_twemproxy_pool() {
        let yml = "alpha:\n  listen: 127.0.0.1:22121\n  hash: md5\n  distribution: ketama\n  hash_tag: \"{}\"\n  timeout: 400\n  auto_eject_hosts: true\n  server_failure_limit: 3\n  server_retry_timeout: 2000\n  preconnect: true\n  servers:\n   - 127.0.0.1:11211:1\n   - 127.0.0.2:11212:2 cache-b\n";
        let toml = from_nutcracker(yml, "n.yml", ADMIN.parse().expect("addr")).expect("converted");
        let config = crate::Config::parse(&toml, "converted.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(config.listeners.len(), 1);
        assert_eq!(config.listeners[0].listen, "127.0.0.1:22121".parse().expect("addr"));
        assert!(config.listeners[0].cache.is_some());
        let pool = &config.pools[0];
        assert_eq!(pool.strategy.name(), "twemproxy");
        assert_eq!(pool.options.compat.twemproxy_hash_tag, Some(*b"{}"));
        let workers: Vec<(&str, u32)> = pool.workers.iter().map(|w| (w.name.as_str(), w.weight)).collect();
        assert_eq!(workers, [("127.0.0.1:11211", 1), ("cache-b", 2)]);
        assert_eq!(pool.passive.consecutive_failures, 3);
        assert_eq!(pool.retry.per_try_timeout, std::time::Duration::from_millis(400));
        assert!(toml.contains("# not converted (no counterpart): preconnect"));
    }

    #[test]
    fn what_cannot_be_converted_is_refused_with_its_line() {
        let cases = [
            ("a:\n  listen: 127.0.0.1:1\n  hash: fnv1a_64\n  servers:\n   - 127.0.0.1:2:1\n", Some(3), "a.hash"),
            (
                "a:\n  listen: 127.0.0.1:1\n  hash: md5\n  distribution: modula\n  servers:\n   - 127.0.0.1:2:1\n",
                Some(4),
                "a.distribution",
            ),
            (
                "a:\n  listen: 127.0.0.1:1\n  hash: md5\n  redis: true\n  redis_db: 3\n  servers:\n   - 127.0.0.1:2:1\n",
                Some(5),
                "a.redis_db",
            ),
            (
                "a:\n  listen: 127.0.0.1:1\n  hash: md5\n  redis_auth: pw\n  servers:\n   - 127.0.0.1:2:1\n",
                Some(4),
                "a.redis_auth",
            ),
            ("a:\n  listen: /tmp/sock\n  hash: md5\n  servers:\n   - 127.0.0.1:2:1\n", Some(2), "a.listen"),
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  servers:\n   - 127.0.0.1:2\n", Some(4), "a.servers"),
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  servers: []\n", Some(4), "a.servers"),
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  sevrers:\n   - 127.0.0.1:2:1\n", Some(4), "a.sevrers"),
            ("a: [1, 2\n", None, "yaml"),
            ("- a\n", None, "yaml"),
        ];
        for (yml, line, field) in cases {
            let e = from_nutcracker(yml, "n.yml", ADMIN.parse().expect("addr")).expect_err(yml);
            assert_eq!(e.field, field, "{yml}: {e}");
            if let Some(l) = line {
                assert_eq!(e.line, Some(l), "{yml}: {e}");
            }
            assert_eq!(e.file, "n.yml");
        }
    }
}

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
/// Every setting that cannot be converted, each with its file, line and field, in the file's
/// order (a pool with several problems lists them all).
pub fn from_nutcracker(text: &str, file: &str, admin: SocketAddr) -> Result<String, Vec<ConfigError>> {
    let err = |line: Option<usize>, field: String, message: String| ConfigError {
        file: file.to_owned(),
        line,
        field,
        message,
    };
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| vec![err(Some(e.marker().line()), "yaml".into(), e.info().to_owned())])?;
    let Some(Yaml::Hash(pools)) = docs.first() else {
        return Err(vec![err(
            None,
            "yaml".into(),
            "a nutcracker configuration is a mapping of pool names to pools".into(),
        )]);
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut out = format!(
        "# Converted from {file} by `keyroute from-nutcracker`: each pool is a memcached (or Redis) listener\n\
         # and a pool placed exactly as nutcracker places it (strategy \"twemproxy\"), so no key moves.\n\n\
         [admin]\nlisten = \"{admin}\"\n"
    );
    let mut listeners = String::new();
    let mut pool_text = String::new();
    let mut errors = Vec::new();
    for (name, pool) in pools {
        let Some(name) = name.as_str() else {
            errors.push(err(None, "yaml".into(), "pool names must be strings".into()));
            continue;
        };
        let block = Block::of(&lines, name);
        match convert_pool(name, pool, &block, &err) {
            Ok((listener, pool)) => {
                listeners.push_str(&listener);
                pool_text.push_str(&pool);
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        errors.sort_by_key(|e| e.line.unwrap_or(usize::MAX));
        return Err(errors);
    }
    out.push_str(&listeners);
    out.push_str(&pool_text);
    Ok(out)
}

/// Where a pool is written: the lines from its name to the next pool's (1-based numbers).
struct Block<'a> {
    lines: &'a [&'a str],
    /// The line of the pool's name, and the first line after the pool.
    start: Option<usize>,
    end: usize,
}

impl<'a> Block<'a> {
    fn of(lines: &'a [&'a str], pool: &str) -> Block<'a> {
        let is_pool = |l: &str| !l.starts_with([' ', '\t', '#', '-']) && !l.trim().is_empty();
        let start = lines.iter().position(|l| {
            is_pool(l) && l.trim_end().strip_suffix(':').is_some_and(|k| k.trim().trim_matches(['"', '\'']) == pool)
        });
        let end = start
            .map_or(lines.len(), |s| lines[s + 1..].iter().position(|l| is_pool(l)).map_or(lines.len(), |i| s + 1 + i));
        Block { lines, start, end }
    }

    /// The line of the pool's name.
    fn pool(&self) -> Option<usize> {
        self.start.map(|s| s + 1)
    }

    /// The line of `field` within the pool, else the pool's.
    fn field(&self, field: &str) -> Option<usize> {
        let start = self.start?;
        self.lines[start + 1..self.end]
            .iter()
            .position(|l| l.trim_start().strip_prefix(field).is_some_and(|r| r.trim_start().starts_with(':')))
            .map(|i| start + 2 + i)
            .or(self.pool())
    }

    /// The line of the list item `item` within the pool, else `servers:`'s.
    fn item(&self, item: &str) -> Option<usize> {
        let start = self.start?;
        self.lines[start + 1..self.end]
            .iter()
            .position(|l| {
                l.trim_start().strip_prefix('-').is_some_and(|r| r.trim().trim_matches(['"', '\'']) == item.trim())
            })
            .map(|i| start + 2 + i)
            .or_else(|| self.field("servers"))
    }
}

/// One pool's listener and pool (TOML), or every problem found in it.
fn convert_pool(
    name: &str,
    pool: &Yaml,
    block: &Block<'_>,
    err: &dyn Fn(Option<usize>, String, String) -> ConfigError,
) -> Result<(String, String), Vec<ConfigError>> {
    let field = |f: &str| format!("{name}.{f}");
    let at = |f: &str| block.field(f);
    let Yaml::Hash(settings) = pool else {
        return Err(vec![err(block.pool(), name.to_owned(), "a pool is a mapping of settings".into())]);
    };
    let mut errors = Vec::new();
    let get = |k: &str| settings.get(&Yaml::String(k.to_owned()));
    for (k, _) in settings
        .iter()
        .filter_map(|(k, v)| Some((k.as_str()?, v)))
        .filter(|(k, _)| !CONVERTED.contains(k) && !IGNORED.contains(k))
    {
        errors.push(err(at(k), field(k), "not a nutcracker setting keyroute knows".into()));
    }
    let redis = match get("redis") {
        None => false,
        Some(v) => v.as_bool().unwrap_or_else(|| {
            errors.push(err(at("redis"), field("redis"), "must be true or false".into()));
            false
        }),
    };
    let text_of = |k: &str, errors: &mut Vec<ConfigError>| -> Option<String> {
        match get(k) {
            None | Some(Yaml::Null) => None,
            Some(Yaml::String(s)) => Some(s.clone()),
            Some(Yaml::Integer(i)) => Some(i.to_string()),
            Some(Yaml::Boolean(b)) => Some(b.to_string()),
            Some(_) => {
                errors.push(err(at(k), field(k), "must be a single value".into()));
                None
            }
        }
    };
    let number = |k: &str, default: u64, errors: &mut Vec<ConfigError>| -> u64 {
        match get(k) {
            None => default,
            Some(Yaml::Integer(i)) if *i >= 0 => *i as u64,
            Some(_) => {
                errors.push(err(at(k), field(k), "must be a whole number, 0 or more".into()));
                default
            }
        }
    };
    let listen = match text_of("listen", &mut errors) {
        None => {
            errors.push(err(block.pool(), field("listen"), "is required".into()));
            None
        }
        Some(l) => match l.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(err(
                    at("listen"),
                    field("listen"),
                    format!("'{}' is not an ip:port (a unix socket or a name is not converted)", l.escape_debug()),
                ));
                None
            }
        },
    };
    let auth = text_of("redis_auth", &mut errors);
    if !redis && auth.is_some() {
        errors.push(err(at("redis_auth"), field("redis_auth"), "is for a pool with redis: true".into()));
    }
    if number("redis_db", 0, &mut errors) != 0 {
        errors.push(err(
            at("redis_db"),
            field("redis_db"),
            "keyroute serves database 0 only: the keys of another would not be found".into(),
        ));
    }
    // nutcracker's defaults: fnv1a_64 and ketama.
    let hash = text_of("hash", &mut errors).unwrap_or_else(|| "fnv1a_64".into());
    let distribution = text_of("distribution", &mut errors).unwrap_or_else(|| "ketama".into());
    if hash != "md5" || distribution != "ketama" {
        let f = if hash != "md5" { "hash" } else { "distribution" };
        // A pool without the field is reported at the pool's own line, saying so.
        let written = get(f).is_some();
        errors.push(err(
            if written { at(f) } else { block.pool() },
            field(f),
            format!(
                "hash: {hash}{} with distribution: {distribution}: keyroute reproduces nutcracker's hash: md5 with distribution: ketama; with another pair every key would move",
                if get("hash").is_none() { " (nutcracker's default)" } else { "" },
            ),
        ));
    }
    let hash_tag = text_of("hash_tag", &mut errors);
    if let Some(t) = &hash_tag
        && t.len() != 2
    {
        errors.push(err(at("hash_tag"), field("hash_tag"), "must be two characters, as \"{}\"".into()));
    }
    let timeout = number("timeout", 0, &mut errors);
    let eject = match get("auto_eject_hosts") {
        None => false,
        Some(v) => v.as_bool().unwrap_or_else(|| {
            errors.push(err(at("auto_eject_hosts"), field("auto_eject_hosts"), "must be true or false".into()));
            false
        }),
    };
    let failures = number("server_failure_limit", 2, &mut errors);
    let retry = number("server_retry_timeout", 30_000, &mut errors);
    let mut workers = String::new();
    match get("servers") {
        Some(Yaml::Array(servers)) if !servers.is_empty() => {
            for s in servers {
                match s.as_str() {
                    Some(line) => match server(line) {
                        Ok(w) => workers.push_str(&w),
                        Err(m) => errors.push(err(
                            block.item(line),
                            field("servers"),
                            format!("'{}': {m}", line.escape_debug()),
                        )),
                    },
                    None => errors.push(err(
                        at("servers"),
                        field("servers"),
                        "each server is a string host:port:weight [name]".into(),
                    )),
                }
            }
        }
        Some(Yaml::Array(_)) => {
            errors.push(err(at("servers"), field("servers"), "nutcracker refuses a pool without servers".into()))
        }
        _ => errors.push(err(at("servers"), field("servers"), "a list of host:port:weight [name] is required".into())),
    }
    let Some(listen) = listen.filter(|_| errors.is_empty()) else { return Err(errors) };
    let mut listener = format!(
        "\n[[listener]]\nname = {}\nlisten = \"{listen}\"\nprotocol = \"{}\"\npool = {}\n",
        quote(name),
        if redis { "redis" } else { "memcached" },
        quote(name)
    );
    if let Some(a) = &auth {
        let _ = write!(listener, "password = {}\nserver_password = {}\n", quote(a), quote(a));
    }
    let mut pool_text = format!("\n[[pool]]\nname = {}\nstrategy = \"twemproxy\"\n", quote(name));
    if timeout > 0 {
        let _ = writeln!(pool_text, "connect_timeout_ms = {timeout}");
    }
    if let Some(t) = &hash_tag {
        let _ = write!(pool_text, "[pool.compat]\nhash_tag = {}\n", quote(t));
    }
    // nutcracker sends a request to its key's server only, never to another when it fails (the
    // client gets the error); with `auto_eject_hosts`, a server that failed
    // `server_failure_limit` times in a row is left out for `server_retry_timeout`, and only
    // then do its keys go elsewhere. One attempt, and the same ejection, fail the same way.
    let _ = writeln!(pool_text, "[pool.retry]\n# nutcracker never retries a request on another server\nattempts = 1");
    if timeout > 0 {
        let _ = writeln!(pool_text, "per_try_timeout_ms = {timeout}");
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
    pool_text.push_str(&workers);
    Ok((listener, pool_text))
}

/// One server of a pool (`host:port:weight [name]`) as a `[[pool.worker]]`, or what is wrong.
fn server(line: &str) -> Result<String, String> {
    let (addr_weight, server_name) = match line.trim().split_once(' ') {
        Some((a, n)) => (a, Some(n.trim())),
        None => (line.trim(), None),
    };
    let (addr, weight) = match addr_weight.rsplit_once(':') {
        // `host:port` alone: its port would be read as the weight.
        Some((addr, _)) if addr.parse::<SocketAddr>().is_err() && addr_weight.parse::<SocketAddr>().is_ok() => {
            return Err("the weight is missing: nutcracker's servers are host:port:weight [name]".into());
        }
        Some(parts) => parts,
        None => return Err("host:port:weight is expected".into()),
    };
    let weight: u32 = weight.parse().map_err(|_| "the weight is not a number".to_owned())?;
    if weight == 0 {
        return Err("the weight must be 1 or more".into());
    }
    let address: SocketAddr =
        addr.parse().map_err(|_| "the address is not ip:port (a unix socket or a name is not converted)".to_owned())?;
    // twemproxy hashes the server's name when it has one, else host:port (the 11211 rule
    // applies to that, inside the twemproxy mode).
    let label = server_name.filter(|n| !n.is_empty()).map_or_else(|| addr.to_owned(), str::to_owned);
    Ok(format!("[[pool.worker]]\nname = {}\naddress = \"{address}\"\nweight = {weight}\n", quote(&label)))
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
        let cache = config.listeners[0].cache().expect("a cache listener");
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
        assert!(config.listeners[0].cache().is_some());
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
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  servers:\n   - 127.0.0.1:2\n", Some(5), "a.servers"),
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  servers: []\n", Some(4), "a.servers"),
            ("a:\n  listen: 127.0.0.1:1\n  hash: md5\n  sevrers:\n   - 127.0.0.1:2:1\n", Some(4), "a.sevrers"),
            ("a: [1, 2\n", None, "yaml"),
            ("- a\n", None, "yaml"),
        ];
        for (yml, line, field) in cases {
            let errors = from_nutcracker(yml, "n.yml", ADMIN.parse().expect("addr")).expect_err(yml);
            // The misspelt one also lacks `servers`: both are listed.
            let e = errors.iter().find(|e| e.field == field).unwrap_or_else(|| panic!("{yml}: {errors:?}"));
            if let Some(l) = line {
                assert_eq!(e.line, Some(l), "{yml}: {e}");
            }
            assert_eq!(e.file, "n.yml");
        }
    }

    /// Issue 31 (8): a pool without `hash:` is reported at its own line, a server without a
    /// weight says so, and every problem of a file is listed, in the file's order.
    #[test]
    fn every_problem_is_listed_at_its_own_line() {
        let yml = "first:\n  listen: 127.0.0.1:1\n  servers:\n   - 127.0.0.1:11211\n   - 127.0.0.1:11212:1\n   - 127.0.0.1:11213:x\n\nsecond:\n  listen: nowhere\n  hash: md5\n  distribution: ketama\n  timeout: -1\n  servers:\n   - 127.0.0.1:11214:1\n";
        let e = from_nutcracker(yml, "n.yml", ADMIN.parse().expect("addr")).expect_err("refused");
        let got: Vec<(Option<usize>, &str)> = e.iter().map(|e| (e.line, e.field.as_str())).collect();
        assert_eq!(
            got,
            [
                (Some(1), "first.hash"),
                (Some(4), "first.servers"),
                (Some(6), "first.servers"),
                (Some(9), "second.listen"),
                (Some(12), "second.timeout"),
            ],
            "{e:?}"
        );
        assert!(e[0].message.contains("fnv1a_64 (nutcracker's default)"), "{}", e[0]);
        assert!(e[1].message.contains("the weight is missing"), "{}", e[1]);
        assert!(e[2].message.contains("the weight is not a number"), "{}", e[2]);
    }

    /// Issue 31 (6): a converted pool places and fails as nutcracker does: one attempt (a request
    /// never goes to another server when its own fails), and with `auto_eject_hosts: false` no
    /// ejection, so a dead server's keys fail rather than land on a server that does not own them.
    #[test]
    fn a_converted_pool_never_retries_elsewhere() {
        for (eject, failures) in [("false", 0), ("true", 3)] {
            let yml = format!(
                "a:\n  listen: 127.0.0.1:1\n  hash: md5\n  distribution: ketama\n  auto_eject_hosts: {eject}\n  server_failure_limit: 3\n  servers:\n   - 127.0.0.1:2:1\n"
            );
            let toml = from_nutcracker(&yml, "n.yml", ADMIN.parse().expect("addr")).expect("converted");
            let config = crate::Config::parse(&toml, "converted.toml").unwrap_or_else(|e| panic!("{e}\n{toml}"));
            assert_eq!(config.pools[0].retry.attempts, 1, "{toml}");
            assert_eq!(config.pools[0].passive.consecutive_failures, failures, "{toml}");
        }
    }
}

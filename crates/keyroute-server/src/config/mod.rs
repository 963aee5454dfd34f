//! Configuration: a TOML file, parsed into raw structs that reject unknown fields, then validated
//! into the types the gateway runs with. Every error names the file, the line and the field.
//!
//! See `examples/keyroute.toml` at the repository root for an annotated example of every field.

mod nutcracker;
mod raw;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use self::nutcracker::from_nutcracker;
use self::validate::{Ctx, field_at, validate};
pub use keyroute_admin::AdminConfig;
pub use keyroute_cacheproxy::{CacheListener, CacheProtocol};
pub use keyroute_fleet::config::{
    EtcdConfig, HealthConfig, HotKeysConfig, MAX_NAME_BYTES, MembershipConfig, PassiveConfig, PoolConfig, RetryConfig,
    SlowStartConfig, WorkerConfig,
};
pub(crate) use keyroute_fleet::config::{points_at, resolve, socket_addr, validate_worker};
pub use keyroute_gateway::config::{
    AccessLogConfig, AccessLogFormat, CacheSettings, HttpListenerConfig, HttpPoolConfig, MissingKey, RouteConfig,
};

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
    /// Each pool's HTTP settings, in the order of `pools`.
    pub http: Vec<HttpPoolConfig>,
    /// After SIGTERM, how long `/readyz` reports not ready while the listeners still accept (so
    /// that load balancers in front stop sending first).
    pub shutdown_delay: Duration,
    /// Then, how long the gateway waits for requests in flight before it cuts them.
    pub shutdown_grace: Duration,
    /// Settings that are valid but probably not what was meant (`serve --check` prints them,
    /// `serve` logs them).
    pub warnings: Vec<ConfigError>,
}

/// A client-facing listener: what every kind shares, and what it serves.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    /// Its name (for logs).
    pub name: String,
    /// Where it listens.
    pub listen: SocketAddr,
    /// Connections held at once; past it the listener stops accepting until one closes (the
    /// kernel's backlog holds the rest). `None`: derived from the open-file limit at start.
    pub max_connections: Option<usize>,
    /// Let other processes bind the same address too (`SO_REUSEPORT` across processes, for
    /// seamless reloads as HAProxy and Envoy do). Off: a second gateway on the address fails
    /// with "address in use", as NGINX without `reuseport` does.
    pub reuse_port: bool,
    /// What it serves: one kind, chosen by `protocol`, with only that kind's settings.
    pub serves: Serves,
}

/// What a listener serves.
#[derive(Clone, Debug)]
pub enum Serves {
    /// HTTP (`protocol = "http"`, the default): routes to pools, TLS, HTTP/2.
    Http(HttpListenerConfig),
    /// A cache protocol (`protocol = "memcached"` or `"redis"`) in front of one pool.
    Cache(CacheListener),
}

impl ListenerConfig {
    /// Its HTTP settings, if it serves HTTP.
    pub fn http(&self) -> Option<&HttpListenerConfig> {
        match &self.serves {
            Serves::Http(h) => Some(h),
            Serves::Cache(_) => None,
        }
    }

    /// Its cache protocol settings, if it serves one.
    pub fn cache(&self) -> Option<&CacheListener> {
        match &self.serves {
            Serves::Cache(c) => Some(c),
            Serves::Http(_) => None,
        }
    }
}

impl Config {
    /// The listeners of a cache protocol (what `keyroute move` finds a pool's store by).
    pub fn cache_listeners(&self) -> impl Iterator<Item = &CacheListener> {
        self.listeners.iter().filter_map(ListenerConfig::cache)
    }

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
        let raw: raw::RawConfig = toml::from_str(src).map_err(|e| {
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
        assert_eq!(c.listeners[0].http().expect("http").routes[0].pool, 0);
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

    /// Issue 31 (27): what `serve --check` passed and should not have.
    #[test]
    fn blank_tokens_huge_keys_and_slow_probes_are_refused() {
        let admin = |token: &str| format!("[admin]\ntoken = \"{token}\"\n{GOOD}");
        for token in [" ".repeat(16), format!("{}\\t", "a".repeat(16)), "abcdefgh ijklmnop".to_owned()] {
            let err = Config::parse(&admin(&token), "k.toml").expect_err("refused");
            assert_eq!((err.line, err.field.as_str()), (Some(2), "admin.token"), "{token:?}: {err}");
        }
        Config::parse(&admin("s3cr3t-t0ken-0f-20+/="), "k.toml").expect("a visible token");
        let huge = GOOD.replace("{path}?w={query.w}", &format!("{{path}}{}", "x".repeat(10 << 20)));
        let err = Config::parse(&huge, "k.toml").expect_err("refused");
        assert_eq!((err.line, err.field.as_str()), (Some(8), "pool.thumbs.key"), "{err}");
        let health = |h: &str| GOOD.replacen("[[pool.worker]]", &format!("[pool.health]\n{h}\n\n[[pool.worker]]"), 1);
        let err = Config::parse(&health("interval_ms = 500\ntimeout_ms = 501"), "k.toml").expect_err("refused");
        assert_eq!(err.field, "pool.thumbs.health.timeout_ms", "{err}");
        assert!(err.message.contains("above health.interval_ms (500 ms)"), "{err}");
        // Left to their defaults, the timeout follows a short interval.
        let c = Config::parse(&health("interval_ms = 200"), "k.toml").expect("valid");
        assert_eq!(c.pools[0].health.timeout, Duration::from_millis(200));
        let c = Config::parse(&health("timeout_ms = 2000"), "k.toml").expect("valid");
        assert_eq!(
            (c.pools[0].health.interval, c.pools[0].health.timeout),
            (Duration::from_secs(2), Duration::from_secs(2))
        );
        // Issue 31 (24): the read timeout between a worker's body bytes, nginx's default.
        assert_eq!(Config::parse(GOOD, "k.toml").expect("valid").http[0].read_timeout, Duration::from_secs(60));
    }

    #[test]
    fn a_memcached_listener_takes_its_settings_and_refuses_http_ones() {
        let mc = |extra: &str| {
            GOOD.replace(
                "listen = \"127.0.0.1:0\"\n",
                &format!("listen = \"127.0.0.1:0\"\nprotocol = \"memcached\"\n{extra}"),
            )
        };
        let c = Config::parse(&mc("max_item_bytes = 2048\n"), "k.toml").expect("valid");
        let b = Config::parse(&mc("broadcast = true\n"), "k.toml").expect("valid");
        assert!(b.listeners[0].cache().is_some_and(|l| l.broadcast));
        assert_eq!(
            c.listeners[0].cache(),
            Some(&CacheListener {
                protocol: CacheProtocol::Memcached,
                pool: "thumbs".into(),
                max_item_bytes: 2048,
                password: None,
                server_password: None,
                broadcast: false,
                read_pool: None,
                routes: Vec::new(),
            })
        );
        assert!(c.listeners[0].http().is_none());
        for (edit, line, field, needle) in [
            (
                GOOD.replace("listen = \"127.0.0.1:0\"\n", "listen = \"127.0.0.1:0\"\nprotocol = \"gopher\"\n"),
                4,
                "listener.listener-1.protocol",
                "not a protocol",
            ),
            (mc("pool = \"nope\"\n"), 5, "listener.listener-1.pool", "no pool named 'nope'"),
            (mc("max_item_bytes = 10\n"), 5, "listener.listener-1.max_item_bytes", "1024..="),
            (mc("password = \"x\"\n"), 5, "listener.listener-1.password", "only a Redis listener"),
            (mc("h2c = true\n"), 5, "listener.listener-1.h2c", "speaks no HTTP"),
            (mc("read_pool = \"nope\"\n"), 5, "listener.listener-1.read_pool", "no pool named 'nope'"),
            (
                mc("[[listener.prefix_route]]\nprefix = \"\"\npool = \"thumbs\"\n"),
                6,
                "listener.listener-1.prefix_route[0].prefix",
                "non-empty",
            ),
            (
                mc("[[listener.prefix_route]]\nprefix = \"u:\"\npool = \"nope\"\n"),
                7,
                "listener.listener-1.prefix_route[0].pool",
                "no pool named 'nope'",
            ),
            (
                mc(
                    "[[listener.prefix_route]]\nprefix = \"u:\"\npool = \"thumbs\"\n[[listener.prefix_route]]\nprefix = \"u:\"\npool = \"thumbs\"\n",
                ),
                9,
                "listener.listener-1.prefix_route[1].prefix",
                "comes before",
            ),
            (
                GOOD.replace(
                    "listen = \"127.0.0.1:0\"\n",
                    "listen = \"127.0.0.1:0\"\n[[listener.prefix_route]]\nprefix = \"u:\"\npool = \"thumbs\"\n",
                ),
                5,
                "listener.listener-1.prefix_route",
                "only a memcached or Redis listener routes by key prefix",
            ),
            (
                mc("broadcast = true\n").replace("\"memcached\"", "\"redis\""),
                5,
                "listener.listener-1.broadcast",
                "only a memcached listener broadcasts",
            ),
            (
                GOOD.replace("listen = \"127.0.0.1:0\"\n", "listen = \"127.0.0.1:0\"\nbroadcast = true\n"),
                4,
                "listener.listener-1.broadcast",
                "only a memcached listener broadcasts",
            ),
            // Every HTTP setting, not only some: each would be silently ignored.
            (mc("header_timeout_ms = 500\n"), 5, "listener.listener-1.header_timeout_ms", "speaks no HTTP"),
            (mc("send_timeout_ms = 500\n"), 5, "listener.listener-1.send_timeout_ms", "speaks no HTTP"),
            (mc("max_headers = 50\n"), 5, "listener.listener-1.max_headers", "speaks no HTTP"),
            (mc("max_concurrent_streams = 5\n"), 5, "listener.listener-1.max_concurrent_streams", "speaks no HTTP"),
            (mc("tunnel_idle_timeout_ms = 500\n"), 5, "listener.listener-1.tunnel_idle_timeout_ms", "speaks no HTTP"),
            (mc("[[listener.route]]\npool = \"thumbs\"\n"), 6, "listener.listener-1.route", "speaks no HTTP"),
            (
                GOOD.replace("listen = \"127.0.0.1:0\"\n", "listen = \"127.0.0.1:0\"\npool = \"thumbs\"\n"),
                4,
                "listener.listener-1.pool",
                "listener.route",
            ),
            (
                mc("").replace("weight = 2", "weight = 2\n[pool.health]\npath = \"/\""),
                3,
                "listener.listener-1.pool",
                "HTTP health path",
            ),
        ] {
            let err = Config::parse(&edit, "k.toml").expect_err(&edit);
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}\n{edit}");
            assert!(err.message.contains(needle), "{err}");
        }
    }

    /// `[pool.replication]`: a memcached listener's pool, placed by key, without hot keys or the
    /// handoff; each mistake named by its line and field.
    #[test]
    fn a_replicated_pool_is_a_memcached_listeners() {
        let c = Config::parse(&listener("memcached", "[pool.replication]\ncopies = 2"), "k.toml").expect("valid");
        let r = c.pools[0].replication.expect("replicated");
        assert_eq!((r.copies, r.repair), (2, true));
        let c = Config::parse(&listener("memcached", "[pool.replication]\ncopies = 3\nrepair = false"), "k.toml")
            .expect("valid");
        assert_eq!(c.pools[0].replication.map(|r| (r.copies, r.repair)), Some((3, false)));
        for (text, line, field, needle) in [
            (listener("memcached", "[pool.replication]\ncopies = 1"), 12, "pool.thumbs.replication.copies", "2..=8"),
            (listener("memcached", "[pool.replication]\ncopies = 9"), 12, "pool.thumbs.replication.copies", "2..=8"),
            (
                listener("memcached", "[pool.replication]\nrepair = true"),
                11,
                "pool.replication.copies",
                "missing field",
            ),
            (
                listener("memcached", "[pool.replication]\ncopies = 2\n[pool.handoff]\nwindow_ms = 1000"),
                12,
                "pool.thumbs.replication.copies",
                "[pool.handoff]",
            ),
            (
                listener("memcached", "[pool.hot_keys]\nthreshold = 50\n[pool.replication]\ncopies = 2"),
                14,
                "pool.thumbs.replication.copies",
                "[pool.hot_keys]",
            ),
            (listener("redis", "[pool.replication]\ncopies = 2"), 12, "pool.thumbs.replication", "only a memcached"),
            (listener("http", "[pool.replication]\ncopies = 2"), 11, "pool.thumbs.replication", "only a memcached"),
        ] {
            let err = Config::parse(&text, "k.toml").expect_err(&text);
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}\n{text}");
            assert!(err.message.contains(needle), "{err}");
        }
    }

    /// `[pool.shadow]`: a cache listener's pool copying to another pool that speaks its protocol.
    #[test]
    fn a_shadow_is_a_cache_pool_of_the_same_protocol() {
        let two = |listener: &str, section: &str, second_listener: &str| {
            format!(
                "[[listener]]\nlisten = \"127.0.0.1:0\"\n{listener}\n[[pool]]\nname = \"a\"\nstrategy = \"rendezvous\"\n{section}\n[[pool.worker]]\nname = \"w1\"\naddress = \"127.0.0.1:9001\"\n\n[[pool]]\nname = \"b\"\nstrategy = \"rendezvous\"\n[[pool.worker]]\nname = \"w2\"\naddress = \"127.0.0.1:9002\"\n{second_listener}"
            )
        };
        let mc = "protocol = \"memcached\"\npool = \"a\"\n";
        let c = Config::parse(&two(mc, "[pool.shadow]\npool = \"b\"\nshare = 0.1", ""), "k.toml").expect("valid");
        let shadow = c.pools[0].shadow.clone().expect("shadowed");
        assert_eq!((shadow.pool.as_str(), shadow.share, shadow.queue), ("b", 0.1, 1024));
        let redis_b = "[[listener]]\nlisten = \"127.0.0.1:0\"\nprotocol = \"redis\"\npool = \"b\"\n";
        for (text, line, field, needle) in [
            (two(mc, "[pool.shadow]\npool = \"c\"\nshare = 0.1", ""), 10, "pool.a.shadow.pool", "no pool named 'c'"),
            (two(mc, "[pool.shadow]\npool = \"a\"\nshare = 0.1", ""), 10, "pool.a.shadow.pool", "itself"),
            (two(mc, "[pool.shadow]\npool = \"b\"\nshare = 0", ""), 11, "pool.a.shadow.share", "(0, 1]"),
            (two(mc, "[pool.shadow]\npool = \"b\"\nshare = 1.5", ""), 11, "pool.a.shadow.share", "(0, 1]"),
            (two(mc, "[pool.shadow]\npool = \"b\"\nshare = 0.5\nqueue = 0", ""), 12, "pool.a.shadow.queue", "1..="),
            (
                two(mc, "[pool.shadow]\npool = \"b\"\nshare = 0.5", redis_b),
                10,
                "pool.a.shadow.pool",
                "another protocol",
            ),
            // The shadow is sent memcached: it is checked in it, not over HTTP.
            (
                two(mc, "[pool.shadow]\npool = \"b\"\nshare = 0.5", "").replace(
                    "name = \"b\"\nstrategy = \"rendezvous\"\n",
                    "name = \"b\"\nstrategy = \"rendezvous\"\n[pool.health]\npath = \"/\"\n",
                ),
                20,
                "pool.b.health.path",
                "HTTP health path",
            ),
            (
                two("[[listener.route]]\npool = \"b\"", "[pool.shadow]\npool = \"b\"\nshare = 0.5", ""),
                9,
                "pool.a.shadow.pool",
                "only a memcached or Redis listener's pool",
            ),
        ] {
            let err = Config::parse(&text, "k.toml").expect_err(&text);
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}\n{text}");
            assert!(err.message.contains(needle), "{err}");
        }
    }

    /// `[pool.cluster]`: a Redis listener's pool, without what would place keys by the pool's own
    /// table.
    #[test]
    fn a_cluster_pool_is_a_redis_listeners() {
        let c = Config::parse(&listener("redis", "[pool.cluster]"), "k.toml").expect("valid");
        assert_eq!(c.pools[0].cluster.map(|c| c.refresh), Some(Duration::from_secs(5)));
        let c = Config::parse(&listener("redis", "[pool.cluster]\nrefresh_ms = 250"), "k.toml").expect("valid");
        assert_eq!(c.pools[0].cluster.map(|c| c.refresh), Some(Duration::from_millis(250)));
        // Replica reads: never by default, hot keys (which a cluster pool keeps) or not.
        use keyroute_fleet::config::ReplicaReads;
        let reads = |section: &str| {
            let c = Config::parse(&listener("redis", section), "k.toml").expect(section);
            c.pools[0].cluster.map(|c| c.replica_reads)
        };
        assert_eq!(reads("[pool.cluster]"), Some(ReplicaReads::Never));
        assert_eq!(reads("[pool.cluster]\nreplica_reads = \"always\""), Some(ReplicaReads::Always));
        let hot = "[pool.hot_keys]\nthreshold = 100\n";
        assert_eq!(reads(&format!("[pool.cluster]\n{hot}")), Some(ReplicaReads::Never));
        assert_eq!(reads(&format!("[pool.cluster]\nreplica_reads = \"hot\"\n{hot}")), Some(ReplicaReads::Hot));
        for (text, line, field, needle) in [
            (listener("redis", "[pool.cluster]\nrefresh_ms = 10"), 12, "pool.thumbs.cluster.refresh_ms", "100..="),
            (
                listener("memcached", "[pool.cluster]\nrefresh_ms = 1000"),
                12,
                "pool.thumbs.cluster",
                "only a Redis listener",
            ),
            (listener("http", "[pool.cluster]\nrefresh_ms = 1000"), 11, "pool.thumbs.cluster", "only a Redis listener"),
            (
                listener("redis", "[pool.cluster]\nrefresh_ms = 1000\n[pool.handoff]\nwindow_ms = 1000"),
                12,
                "pool.thumbs.cluster",
                "[pool.handoff]",
            ),
            (
                listener("redis", "[pool.cluster]\nreplica_reads = \"sometimes\""),
                12,
                "pool.thumbs.cluster.replica_reads",
                "not one of never, hot, always",
            ),
            (
                listener("redis", "[pool.cluster]\nreplica_reads = \"hot\""),
                12,
                "pool.thumbs.cluster.replica_reads",
                "add [pool.hot_keys]",
            ),
        ] {
            let err = Config::parse(&text, "k.toml").expect_err(&text);
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}\n{text}");
            assert!(err.message.contains(needle), "{err}");
        }
    }

    /// GOOD with `section` inserted before the workers, its listener speaking `protocol` (`http`:
    /// as it is).
    fn listener(protocol: &str, section: &str) -> String {
        let text = with_section(section);
        match protocol {
            "http" => text,
            p => text.replace("listen = \"127.0.0.1:0\"\n", &format!("listen = \"127.0.0.1:0\"\nprotocol = \"{p}\"\n")),
        }
    }

    /// GOOD with `section` inserted before the workers.
    fn with_section(section: &str) -> String {
        let at = GOOD.find("[[pool.worker]]").expect("workers");
        format!("{}{section}\n{}", &GOOD[..at], &GOOD[at..])
    }

    #[test]
    fn compatibility_strategies_take_their_parameters_and_worker_ids() {
        let text = with_section("[pool.compat]\nhaproxy_hash = \"crc32 avalanche\"")
            .replace("strategy = \"rendezvous\"", "strategy = \"haproxy\"")
            .replace("weight = 2", "weight = 2\nid = 7");
        let c = Config::parse(&text, "k.toml").expect("valid");
        let p = &c.pools[0];
        assert_eq!(p.strategy, keyroute::Strategy::Compat(keyroute::compat::Mode::Haproxy));
        assert!(p.options.compat.haproxy_hash.avalanche);
        assert_eq!((p.workers[0].id, p.workers[1].id), (None, Some(7)));
        // The section starts on line 10 of GOOD.
        let haproxy = |t: String| t.replace("strategy = \"rendezvous\"", "strategy = \"haproxy\"");
        for (edit, line, field, needle) in [
            (
                haproxy(with_section("[pool.compat]\nhaproxy_hash = \"md5\"")),
                11,
                "pool.thumbs.compat.haproxy_hash",
                "md5",
            ),
            (with_section("[pool.compat]\nhaproxy_hash = \"sdbm\""), 7, "pool.thumbs.compat", "not one"),
            (
                with_section("[pool.compat]\nhash_tag = \"{\"").replace("\"rendezvous\"", "\"twemproxy\""),
                11,
                "pool.thumbs.compat.hash_tag",
                "two bytes",
            ),
            (
                with_section("[pool.compat]\nenvoy_table_size = 65536").replace("\"rendezvous\"", "\"envoy-maglev\""),
                7,
                "pool.thumbs.strategy",
                "prime",
            ),
            (haproxy(GOOD.replace("weight = 2", "weight = 300")), 7, "pool.thumbs.strategy", "0..=256"),
            (haproxy(GOOD.replace("weight = 2", "weight = 2\nid = 0")), 18, "pool.thumbs.worker.w2.id", "at least 1"),
            (
                haproxy(
                    GOOD.replace("weight = 2", "id = 3")
                        .replace("address = \"127.0.0.1:9001\"", "address = \"127.0.0.1:9001\"\nid = 3"),
                ),
                18,
                "pool.thumbs.worker.w2.id",
                "worker 'w1' has id 3 already",
            ),
        ] {
            let err = Config::parse(&edit, "k.toml").expect_err("invalid");
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}");
            assert!(err.message.contains(needle), "{err}");
        }
    }

    #[test]
    fn hot_keys_warm_up_and_the_cache_validate_and_name_their_errors() {
        let text = with_section(
            "[pool.hot_keys]\nthreshold = 200\nmax_replicas = 3\n[pool.hot_keys.cache]\nmax_bytes = 1000000\n[pool.slow_start]\nwindow_ms = 30000\n[pool.handoff]\nwindow_ms = 60000",
        );
        let c = Config::parse(&text, "k.toml").expect("valid");
        let h = c.pools[0].hot_keys.as_ref().expect("hot keys");
        assert_eq!(h.rule.threshold, keyroute::hot::Threshold::Rate(200.0));
        assert_eq!((h.rule.per_replica, h.rule.max_replicas, h.sample_every), (200.0, 3, 16));
        let cache = c.http[0].cache.as_ref().expect("cache");
        assert_eq!(
            (cache.max_bytes, cache.max_object_bytes, cache.cache_authorized),
            (1_000_000, 1_000_000, false),
            "an object may not exceed the cache"
        );
        assert_eq!(c.pools[0].slow_start.expect("slow start").ramp.min_share, 0.1);
        assert_eq!(c.pools[0].handoff, Some(Duration::from_secs(60)));
        // The section starts on line 10 of GOOD.
        for (section, line, field, needle) in [
            ("[pool.hot_keys]\nmax_replicas = 3", 6, "pool.thumbs.hot_keys.threshold", "threshold"),
            ("[pool.hot_keys]\nthreshold = -1", 11, "pool.thumbs.hot_keys.threshold", "> 0"),
            ("[pool.hot_keys]\nthreshold = 5\nthreshold_share = 0.1", 11, "pool.thumbs.hot_keys.threshold", "not both"),
            ("[pool.hot_keys]\nthreshold_share = 1.5", 11, "pool.thumbs.hot_keys.threshold_share", "(0, 1]"),
            ("[pool.hot_keys]\nthreshold_share = 0.1", 11, "pool.thumbs.hot_keys.per_worker", "per_worker"),
            ("[pool.hot_keys]\nthreshold = 50\nmax_replicas = 0", 12, "pool.thumbs.hot_keys.max_replicas", "1..=255"),
            ("[pool.hot_keys]\nthreshold = 50\nsample_every = 0", 12, "pool.thumbs.hot_keys.sample_every", "1..=1024"),
            ("[pool.hot_keys]\nthreshold = 50\nwindow_ms = 10", 12, "pool.thumbs.hot_keys.window_ms", "100..=60000"),
            ("[pool.hot_keys]\nthreshold = 20", 11, "pool.thumbs.hot_keys.threshold", "at least 2"),
            ("[pool.hot_keys]\nthreshold = 50\nhot = 1", 12, "pool.hot_keys.hot", "unknown field"),
            (
                "[pool.hot_keys]\nthreshold = 50\n[pool.hot_keys.cache]\nmax_bytes = 10\nmax_object_bytes = 11",
                14,
                "pool.thumbs.hot_keys.cache.max_object_bytes",
                "1..=10",
            ),
            ("[pool.slow_start]\nwindow_ms = 0", 11, "pool.thumbs.slow_start.window_ms", "1..=86400000"),
            ("[pool.slow_start]\nwindow_ms = 10\nmin_share = 2", 12, "pool.thumbs.slow_start.min_share", "[0, 1]"),
            ("[pool.slow_start]\nmin_share = 0.5", 10, "pool.slow_start.window_ms", "missing field `window_ms`"),
            ("[pool.handoff]\nwindow_ms = 0", 11, "pool.thumbs.handoff.window_ms", "1..=86400000"),
        ] {
            let err = Config::parse(&with_section(section), "k.toml").expect_err("invalid");
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{section}: {err}");
            assert!(err.message.contains(needle), "{section}: {err}");
        }
        // A strategy that ignores keys cannot have hot keys or warm-up.
        let text =
            with_section("[pool.handoff]\nwindow_ms = 5").replace("strategy = \"rendezvous\"", "strategy = \"p2c\"");
        let err = Config::parse(&text, "k.toml").expect_err("p2c");
        assert_eq!((err.line, err.field.as_str()), (Some(7), "pool.thumbs.handoff"), "{err}");
    }

    /// GOOD with its workers replaced by an etcd source (`extra` appended to that section).
    fn etcd_pool(extra: &str) -> String {
        let head = &GOOD[..GOOD.find("[[pool.worker]]").expect("workers")];
        format!(
            "{head}[pool.membership]\nsource = \"etcd\"\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"/keyroute/pools/thumbs/workers/\"\n{extra}"
        )
    }

    #[test]
    fn an_etcd_source_validates_and_names_its_errors() {
        let c = Config::parse(&etcd_pool(""), "/etc/keyroute/k.toml").expect("valid");
        let MembershipConfig::Etcd(e) = &c.pools[0].membership else { panic!("an etcd source") };
        assert_eq!(e.prefix, "/keyroute/pools/thumbs/workers/");
        assert_eq!(e.debounce, Duration::from_millis(50));
        assert_eq!(e.state_file.as_deref(), Some(Path::new("/etc/keyroute/thumbs.members.json")));
        assert!(c.pools[0].workers.is_empty());
        for (text, line, field, needle) in [
            (etcd_pool("").replace("\"etcd\"", "\"consul\""), 11, "pool.thumbs.membership.source", "unknown source"),
            (
                etcd_pool("").replace("http://127.0.0.1:2379", "https://x:1"),
                12,
                "pool.thumbs.membership.endpoints",
                "invalid etcd endpoint",
            ),
            (
                etcd_pool("").replace("/keyroute/pools/thumbs/workers/", "keyroute"),
                13,
                "pool.thumbs.membership.prefix",
                "must start and end with '/'",
            ),
            (etcd_pool("debounce_ms = 60000\n"), 14, "pool.thumbs.membership.debounce_ms", "at most 5000"),
            (etcd_pool("colour = 1\n"), 14, "pool.membership.colour", "unknown field"),
            (
                format!("{}[[pool.worker]]\nname = \"w1\"\naddress = \"127.0.0.1:9001\"\n", etcd_pool("")),
                15,
                "pool.thumbs.worker",
                "takes its workers from etcd",
            ),
            (
                etcd_pool("").replace("source = \"etcd\"", "source = \"static\""),
                12,
                "pool.thumbs.membership.endpoints",
                "only an etcd source",
            ),
        ] {
            let err = Config::parse(&text, "k.toml").expect_err("invalid");
            assert_eq!((err.line, err.field.as_str()), (Some(line), field), "{err}");
            assert!(err.message.contains(needle), "{err}");
        }
        let no_prefix = etcd_pool("").replace("prefix = \"/keyroute/pools/thumbs/workers/\"\n", "");
        let err = Config::parse(&no_prefix, "k.toml").expect_err("no prefix");
        assert_eq!(err.field, "pool.thumbs.membership.prefix", "{err}");
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
        // Found by fuzzing: a comment after a table header ended up in the field.
        let err = Config::parse("[admin] # the admin API\ncolour = \"red\"\n", "k.toml").expect_err("unknown");
        assert_eq!(err.field, "admin.colour", "{err}");
        let err = Config::parse("[[listener]]  # public\nlisten = \"127.0.0.1:0\"\ncolour = 1\n", "k.toml")
            .expect_err("unknown");
        assert_eq!(err.field, "listener.colour", "{err}");
        // Found by fuzzing: a lone `[` named the field "".
        for text in ["[", "[[", "[]", "[[]]\n"] {
            let err = Config::parse(text, "k.toml").expect_err("not TOML");
            assert!(!err.field.is_empty() && err.line == Some(1), "{text:?}: {err}");
        }
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
        // A probe that outlasts its interval was a warning; it is refused since issue 31 (27).
        let slow_probe = GOOD.replace(key, &format!("{key}\n[pool.health]\ninterval_ms = 100\ntimeout_ms = 500"));
        let err = Config::parse(&slow_probe, "k.toml").expect_err("a probe longer than its interval");
        assert_eq!(err.field, "pool.thumbs.health.timeout_ms", "{err}");
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

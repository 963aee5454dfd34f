//! The configuration file as written: serde structs that reject unknown fields, with each
//! value's span kept so that errors can name the line.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) admin: Option<RawAdmin>,
    #[serde(default)]
    pub(super) listener: Vec<RawListener>,
    #[serde(default)]
    pub(super) pool: Vec<RawPool>,
    pub(super) shutdown_grace_ms: Option<Spanned<u64>>,
    pub(super) shutdown_delay_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) listen: Option<Spanned<String>>,
    pub(super) token: Option<Spanned<String>>,
    pub(super) hosts: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub(super) name: Option<String>,
    pub(super) listen: Spanned<String>,
    pub(super) max_header_bytes: Option<Spanned<usize>>,
    pub(super) max_headers: Option<Spanned<usize>>,
    pub(super) header_timeout_ms: Option<Spanned<u64>>,
    pub(super) max_connections: Option<Spanned<usize>>,
    pub(super) http2: Option<Spanned<bool>>,
    pub(super) h2c: Option<Spanned<bool>>,
    pub(super) max_concurrent_streams: Option<Spanned<u32>>,
    pub(super) reuse_port: Option<Spanned<bool>>,
    pub(super) send_timeout_ms: Option<Spanned<u64>>,
    pub(super) tunnel_idle_timeout_ms: Option<Spanned<u64>>,
    pub(super) protocol: Option<Spanned<String>>,
    pub(super) pool: Option<Spanned<String>>,
    pub(super) max_item_bytes: Option<Spanned<usize>>,
    pub(super) password: Option<Spanned<String>>,
    pub(super) server_password: Option<Spanned<String>>,
    pub(super) broadcast: Option<Spanned<bool>>,
    pub(super) read_pool: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) prefix_route: Vec<RawPrefixRoute>,
    pub(super) tls: Option<RawTls>,
    pub(super) access_log: Option<RawAccessLog>,
    #[serde(default)]
    pub(super) route: Vec<RawRoute>,
}

/// `[[listener.prefix_route]]`: a cache listener's keys of a prefix to a pool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrefixRoute {
    pub(super) prefix: Spanned<String>,
    pub(super) pool: Spanned<String>,
    pub(super) read_pool: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    #[serde(default)]
    pub(super) certificate: Vec<RawCertificate>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCertificate {
    pub(super) cert: Spanned<String>,
    pub(super) key: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    pub(super) path: Spanned<String>,
    pub(super) format: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<bool>>,
    pub(super) buffer: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) host: Option<Spanned<String>>,
    pub(super) path_prefix: Option<Spanned<String>>,
    pub(super) pool: Spanned<String>,
    pub(super) upgrades: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPool {
    pub(super) name: Spanned<String>,
    pub(super) strategy: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) normalize: Option<Spanned<Vec<String>>>,
    pub(super) on_missing_key: Option<Spanned<String>>,
    pub(super) hash: Option<Spanned<String>>,
    pub(super) scheme: Option<Spanned<String>>,
    pub(super) vnodes: Option<Spanned<u32>>,
    pub(super) maglev_size: Option<Spanned<u32>>,
    pub(super) epsilon: Option<Spanned<f64>>,
    pub(super) choices: Option<Spanned<usize>>,
    pub(super) worker_header: Option<Spanned<String>>,
    pub(super) connect_timeout_ms: Option<Spanned<u64>>,
    pub(super) read_timeout_ms: Option<Spanned<u64>>,
    pub(super) health: Option<RawHealth>,
    pub(super) passive: Option<RawPassive>,
    pub(super) retry: Option<RawRetry>,
    pub(super) membership: Option<RawMembership>,
    pub(super) hot_keys: Option<RawHotKeys>,
    pub(super) slow_start: Option<RawSlowStart>,
    pub(super) handoff: Option<RawHandoff>,
    pub(super) replication: Option<RawReplication>,
    pub(super) slow_log: Option<RawSlowLog>,
    pub(super) shadow: Option<RawShadow>,
    pub(super) cluster: Option<RawCluster>,
    pub(super) compat: Option<RawCompat>,
    pub(super) upstream: Option<RawUpstream>,
    #[serde(default)]
    pub(super) worker: Vec<RawWorker>,
}

/// `[pool.upstream]`: the protocol spoken to the workers, and TLS.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    pub(super) protocol: Option<Spanned<String>>,
    pub(super) max_streams: Option<Spanned<u32>>,
    pub(super) tls: Option<Spanned<bool>>,
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) server_name: Option<Spanned<String>>,
    pub(super) client_cert: Option<Spanned<String>>,
    pub(super) client_key: Option<Spanned<String>>,
    pub(super) min_version: Option<Spanned<String>>,
}

/// `[pool.compat]`: the parameters of the compatibility strategies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCompat {
    pub(super) haproxy_hash: Option<Spanned<String>>,
    pub(super) hash_tag: Option<Spanned<String>>,
    pub(super) groupcache_replicas: Option<Spanned<u32>>,
    pub(super) guava_input: Option<Spanned<String>>,
    pub(super) envoy_min_ring_size: Option<Spanned<u64>>,
    pub(super) envoy_max_ring_size: Option<Spanned<u64>>,
    pub(super) envoy_table_size: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHotKeys {
    pub(super) threshold: Option<Spanned<f64>>,
    pub(super) threshold_share: Option<Spanned<f64>>,
    pub(super) per_worker: Option<Spanned<f64>>,
    pub(super) max_replicas: Option<Spanned<u32>>,
    pub(super) hold_ms: Option<Spanned<u64>>,
    pub(super) window_ms: Option<Spanned<u64>>,
    pub(super) counters: Option<Spanned<u64>>,
    pub(super) sample_every: Option<Spanned<u64>>,
    pub(super) confidence: Option<Spanned<f64>>,
    pub(super) show_keys: Option<bool>,
    pub(super) cache: Option<RawCache>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
    pub(super) max_bytes: Option<Spanned<u64>>,
    pub(super) max_object_bytes: Option<Spanned<u64>>,
    pub(super) cache_authorized: Option<bool>,
    pub(super) cache_set_cookie: Option<bool>,
    pub(super) coalesce_timeout_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlowStart {
    pub(super) window_ms: Spanned<u64>,
    pub(super) min_share: Option<Spanned<f64>>,
    pub(super) by_hit_rate: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHandoff {
    pub(super) window_ms: Spanned<u64>,
}

/// `[pool.cluster]`: a Redis Cluster behind a Redis listener.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub(super) refresh_ms: Option<Spanned<u64>>,
    pub(super) replica_reads: Option<Spanned<String>>,
}

/// `[pool.shadow]`: a share of a cache pool's commands copied to another pool.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawShadow {
    pub(super) pool: Spanned<String>,
    pub(super) share: Spanned<f64>,
    pub(super) queue: Option<Spanned<u64>>,
}

/// `[pool.slow_log]`: which of a cache pool's commands the admin API's `/slowlog` keeps.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlowLog {
    pub(super) threshold_ms: Option<Spanned<u64>>,
    pub(super) entries: Option<Spanned<u64>>,
    pub(super) show_keys: Option<Spanned<bool>>,
}

/// `[pool.replication]`: a memcached pool that keeps each key on several servers.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplication {
    pub(super) copies: Spanned<u64>,
    pub(super) repair: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMembership {
    pub(super) source: Spanned<String>,
    pub(super) endpoints: Option<Spanned<Vec<String>>>,
    pub(super) prefix: Option<Spanned<String>>,
    pub(super) state_file: Option<Spanned<String>>,
    pub(super) debounce_ms: Option<Spanned<u64>>,
    pub(super) name: Option<Spanned<String>>,
    pub(super) record: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<u16>>,
    pub(super) server: Option<Spanned<String>>,
    pub(super) ttl_floor_ms: Option<Spanned<u64>>,
    pub(super) ttl_ceiling_ms: Option<Spanned<u64>>,
    pub(super) timeout_ms: Option<Spanned<u64>>,
    pub(super) worker_name: Option<Spanned<String>>,
    pub(super) srv_priority: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) path: Option<Spanned<String>>,
    pub(super) grpc_service: Option<Spanned<String>>,
    pub(super) interval_ms: Option<Spanned<u64>>,
    pub(super) timeout_ms: Option<Spanned<u64>>,
    pub(super) rise: Option<Spanned<u32>>,
    pub(super) fall: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPassive {
    pub(super) consecutive_failures: Option<u32>,
    pub(super) base_ejection_ms: Option<Spanned<u64>>,
    pub(super) max_ejection_ms: Option<Spanned<u64>>,
    pub(super) stall_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) attempts: Option<Spanned<u32>>,
    pub(super) per_try_timeout_ms: Option<Spanned<u64>>,
    pub(super) deadline_ms: Option<Spanned<u64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorker {
    pub(super) name: Spanned<String>,
    pub(super) address: Spanned<String>,
    pub(super) weight: Option<Spanned<u32>>,
    pub(super) zone: Option<Spanned<String>>,
    pub(super) id: Option<Spanned<u32>>,
}

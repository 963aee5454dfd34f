//! A pool's settings, validated: placement, health, ejection, retries, membership, hot keys and
//! warm-up. Nothing here is any protocol's: the key template, the HTTP health path or the
//! response cache of a pool served over HTTP are the HTTP gateway's own settings, and a cache
//! listener's are the cache proxy's. The file they come from (and its errors, with file, line and
//! field) is the server's; one worker is validated here ([`validate_worker`]), the same way for a
//! file, the admin API and a membership record.

mod worker;

use std::net::SocketAddr;
use std::time::Duration;

use keyroute::{Options, Strategy};

pub use self::worker::{
    MAX_NAME_BYTES, WorkerFieldError, points_at, resolve, socket_addr, validate_worker, validate_worker_with,
};

/// A pool of workers and how keys are placed on them.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Its name.
    pub name: String,
    /// The placement strategy.
    pub strategy: Strategy,
    /// The strategy's options.
    pub options: Options,
    /// Active health checks.
    pub health: HealthConfig,
    /// Passive ejection.
    pub passive: PassiveConfig,
    /// Retries.
    pub retry: RetryConfig,
    /// The longest wait for a connection to a worker.
    pub connect_timeout: Duration,
    /// Where the members come from.
    pub membership: MembershipConfig,
    /// The workers (of a `static` pool; an etcd-backed pool's come from etcd).
    pub workers: Vec<WorkerConfig>,
    /// Hot-key detection and replication, if on.
    pub hot_keys: Option<HotKeysConfig>,
    /// Slow start for workers that join or recover, if on.
    pub slow_start: Option<SlowStartConfig>,
    /// Previous-owner handoff after a join: its window, if on.
    pub handoff: Option<Duration>,
    /// A memcached pool that keeps each key on several servers, if on.
    pub replication: Option<ReplicationConfig>,
    /// Cache listeners: which commands the pool's slow log keeps.
    pub slow_log: SlowLogConfig,
    /// Cache listeners: a share of the commands copied to another pool, if on.
    pub shadow: Option<ShadowConfig>,
    /// Redis listeners: the pool is a Redis Cluster (its workers are seed nodes), if on.
    pub cluster: Option<ClusterConfig>,
}

/// `[pool.cluster]`: a Redis Cluster behind a Redis listener; the slot map is asked for every
/// `refresh`, and at once after a redirection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// How often the slot map is asked for.
    pub refresh: Duration,
    /// Which reads may go to a slot's replicas.
    pub replica_reads: ReplicaReads,
}

/// `[pool.cluster] replica_reads`: which reading commands of one key may go to a slot's replicas
/// (connections to them are sent `READONLY`). A replica is as new as Redis's asynchronous
/// replication has made it; a key written through the proxy is read from its master for a second
/// after, and a replica's miss or error is asked of the master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaReads {
    /// Every command to the slot's master.
    Never,
    /// A hot key's reads (`[pool.hot_keys]`) spread over its slot's master and replicas, the
    /// least loaded first; other reads to the master.
    Hot,
    /// Every read spread over its slot's master and replicas, the least loaded first.
    Always,
}

/// `[pool.shadow]`: a share of a cache pool's commands of one key, chosen by key hash (a key is
/// shadowed always or never), copied to another pool whose answers are read and dropped.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowConfig {
    /// The pool the copies go to.
    pub pool: String,
    /// The share of keys shadowed, in (0, 1].
    pub share: f64,
    /// The most copies waiting to be sent; past it copies are dropped (counted), never queued.
    pub queue: usize,
}

/// `[pool.slow_log]`: a cache pool's commands slower than `threshold` are kept, the last
/// `entries` of them, for the admin API's `/slowlog` (as Redis's `SLOWLOG`, 10 ms and 128 by
/// default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowLogConfig {
    /// The time from the proxy having a command to its answer written past which it is kept.
    pub threshold: Duration,
    /// How many are kept (0: none).
    pub entries: usize,
    /// Whether keys are shown as text (otherwise as their placement hash).
    pub show_keys: bool,
}

impl Default for SlowLogConfig {
    fn default() -> Self {
        SlowLogConfig { threshold: Duration::from_millis(10), entries: 128, show_keys: false }
    }
}

/// `[pool.replication]`: each key kept on its first `copies` available servers (mcrouter's
/// AllSync for writes, MissFailover for reads; see the cache proxy's memcached listener).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// How many servers hold each key (2 or more).
    pub copies: usize,
    /// A read that missed on a copy and found the value on a later one adds it to those that
    /// missed.
    pub repair: bool,
}

impl PoolConfig {
    /// A static pool of `workers` placed by `strategy` with its default options, and every other
    /// setting at the configuration file's default: no active checks, ejection after 5
    /// consecutive failures for 10 s (doubling up to 300 s), a 2 s stall window, 3 attempts of
    /// 30 s within 60 s, a 2 s connect timeout, no hot keys, slow start or handoff.
    pub fn new(name: impl Into<String>, strategy: Strategy, workers: Vec<WorkerConfig>) -> Self {
        PoolConfig {
            name: name.into(),
            strategy,
            options: Options::default(),
            health: HealthConfig::default(),
            passive: PassiveConfig::default(),
            retry: RetryConfig::default(),
            connect_timeout: Duration::from_secs(2),
            membership: MembershipConfig::Static,
            workers,
            hot_keys: None,
            slow_start: None,
            handoff: None,
            replication: None,
            slow_log: SlowLogConfig::default(),
            shadow: None,
            cluster: None,
        }
    }
}

/// `[pool.hot_keys]`: see [`keyroute::hot`].
#[derive(Clone, Debug, PartialEq)]
pub struct HotKeysConfig {
    /// The replication rule.
    pub rule: keyroute::hot::HotKeyConfig,
    /// How often rates are measured.
    pub window: Duration,
    /// The detector's counters.
    pub counters: usize,
    /// One request in this many is sampled.
    pub sample_every: u32,
    /// `/hotkeys` shows each hot key's text, not only its hash (off by default: a key may hold a
    /// cookie's or a header's value, as in the access log's `key`).
    pub show_keys: bool,
}

/// `[pool.slow_start]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowStartConfig {
    /// The ramp of a warming worker's share of its keys.
    pub ramp: keyroute::warm::Ramp,
    /// Whether a warming worker's own cache hit rate (its `X-Cache` reports) slows its ramp.
    pub by_hit_rate: bool,
}

/// Where a pool's members come from: exactly one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipConfig {
    /// The `[[pool.worker]]` list (reloaded on SIGHUP or `--watch`), and the admin API.
    Static,
    /// Keys under a prefix in etcd, watched (see [`crate::membership::record`] for the layout).
    Etcd(EtcdConfig),
    /// What a DNS name resolves to, asked again at its TTL (see [`crate::membership::dns`]).
    Dns(DnsConfig),
}

impl MembershipConfig {
    /// The etcd source's settings, if the members come from etcd.
    pub fn etcd(&self) -> Option<&EtcdConfig> {
        if let MembershipConfig::Etcd(c) = self { Some(c) } else { None }
    }

    /// The DNS source's settings, if the members come from DNS.
    pub fn dns(&self) -> Option<&DnsConfig> {
        if let MembershipConfig::Dns(c) = self { Some(c) } else { None }
    }
}

/// A DNS membership source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsConfig {
    /// The name asked.
    pub name: String,
    /// SRV or address records.
    pub record: DnsRecord,
    /// The workers' port, for address records.
    pub port: Option<u16>,
    /// The resolver asked.
    pub server: std::net::SocketAddr,
    /// The shortest wait between resolutions, whatever the TTL (also the wait after a failure).
    pub ttl_floor: Duration,
    /// The longest wait between resolutions, whatever the TTL.
    pub ttl_ceiling: Duration,
    /// A query unanswered for this long has failed.
    pub timeout: Duration,
    /// The workers' names: a template over `{host}`, `{ip}` and `{port}`.
    pub worker_name: String,
    /// What an SRV record's priority means.
    pub priority: SrvPriority,
}

/// The records a DNS source asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsRecord {
    /// SRV: target, port, weight and priority per worker.
    Srv,
    /// A, then AAAA: one worker per address.
    Address,
}

/// What an SRV record's priority means to the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrvPriority {
    /// Only the records of the lowest value are members (RFC 2782: the rest are fallbacks).
    Lowest,
    /// Every record is a member, in zone `priority-N`.
    Zone,
}

/// An etcd membership source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// The etcd client endpoints, `http://host:port`.
    pub endpoints: Vec<String>,
    /// The key prefix; each key under it is one worker, named by the rest of the key.
    pub prefix: String,
    /// Where the last applied membership is saved, and read from when etcd is down at start-up.
    pub state_file: Option<std::path::PathBuf>,
    /// Changes arriving within this long of the first are applied as one.
    pub debounce: Duration,
}

/// Active health checks: what the protocol's check is (an HTTP `GET`, memcached's `version`,
/// Redis's `PING`) is the protocol's; when, how long and how many are here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Whether the pool's workers are probed at all (`[pool.health]` present).
    pub active: bool,
    /// Between probes of one worker.
    pub interval: Duration,
    /// A probe slower than this fails (never above `interval`).
    pub timeout: Duration,
    /// Consecutive successes that make an unhealthy worker healthy.
    pub rise: u32,
    /// Consecutive failures that make a healthy worker unhealthy.
    pub fall: u32,
}

impl Default for HealthConfig {
    /// Off; when on, every 2 s with a 1 s timeout, healthy after 2 successes, unhealthy after 3
    /// failures.
    fn default() -> Self {
        HealthConfig {
            active: false,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

/// Passive ejection: consecutive failures take a worker out for a while.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassiveConfig {
    /// Consecutive failures that eject (0 disables).
    pub consecutive_failures: u32,
    /// The first ejection's length; each further ejection in a row doubles it.
    pub base_ejection: Duration,
    /// The longest ejection.
    pub max_ejection: Duration,
    /// A worker that holds tries waiting for an answer and answers none of them for this long is
    /// *stalled*: new requests go to the next worker of each key's ranking, and replayable
    /// idempotent tries waiting on it are abandoned and retried there (zero disables).
    pub stall: Duration,
}

impl Default for PassiveConfig {
    /// A cache's: ejected after 5 consecutive failures for 10 s, doubling up to 300 s; stalled
    /// after 2 s without an answer.
    fn default() -> Self {
        PassiveConfig {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
            stall: Duration::from_secs(2),
        }
    }
}

/// Retries on the next worker of the key's ranking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// Tries in all (1 = no retry).
    pub attempts: u32,
    /// Time to the answer of one try (an HTTP response's headers, a cache server's reply).
    pub per_try_timeout: Duration,
    /// Time to the answer over all tries.
    pub deadline: Duration,
}

impl Default for RetryConfig {
    /// 3 tries of 30 s each, within 60 s.
    fn default() -> Self {
        RetryConfig { attempts: 3, per_try_timeout: Duration::from_secs(30), deadline: Duration::from_secs(60) }
    }
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
    /// Its numeric id, for the `haproxy` placement (HAProxy's server `id`).
    pub id: Option<u32>,
}

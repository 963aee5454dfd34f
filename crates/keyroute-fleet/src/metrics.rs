//! Metrics: plain atomics owned by the worker, pool and listener objects they describe (no
//! global registry, nothing to look up on the request path). `exposition.rs` renders them for
//! `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency histogram, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Status classes counted per worker (`error`: no complete response).
pub const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// One worker's counters.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Responses by class (index into [`CLASSES`]; `error` = no response, or one cut short).
    pub responses: [AtomicU64; 6],
    /// Histogram bucket counts (non-cumulative) and the overflow bucket.
    pub latency_buckets: [AtomicU64; 15],
    /// Sum of latencies, microseconds.
    pub latency_sum_us: AtomicU64,
    /// Tries that failed over to another worker after this one failed.
    pub retries: AtomicU64,
    /// Passive ejections.
    pub ejections: AtomicU64,
    /// Connect errors.
    pub connect_errors: AtomicU64,
    /// Responses whose body ended early (counted in `error` too).
    pub truncated: AtomicU64,
}

impl WorkerMetrics {
    /// Records how a response ended: its status, or `None` for no (complete) response.
    pub fn record_class(&self, status: Option<u16>) {
        let class = match status {
            Some(s) if (100..600).contains(&s) => usize::from(s / 100 - 1),
            _ => 5,
        };
        self.responses[class].fetch_add(1, Relaxed);
    }

    /// Records the time a try took to its response headers (or to its failure).
    pub fn record_latency(&self, latency: Duration) {
        self.latency_buckets[bucket(latency)].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(micros(latency), Relaxed);
    }

    /// Responses of every class.
    pub fn total(&self) -> u64 {
        self.responses.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// The histogram bucket of `latency` (an index into [`LATENCY_BUCKETS`], or past it).
fn bucket(latency: Duration) -> usize {
    let secs = latency.as_secs_f64();
    LATENCY_BUCKETS.iter().position(|&le| secs <= le).unwrap_or(LATENCY_BUCKETS.len())
}

fn micros(latency: Duration) -> u64 {
    latency.as_micros().min(u128::from(u64::MAX)) as u64
}

/// A cache listener's commands in one pool, by class (the protocol's command names, a fixed
/// table: a client cannot add labels): how many, how many were answered with an error, and how
/// long they took from the proxy having them to their answer written.
#[derive(Debug)]
pub struct CommandMetrics {
    /// The protocol the classes are of (`memcached`, `redis`).
    pub protocol: &'static str,
    /// The class names, by index.
    pub classes: &'static [&'static str],
    /// Each class's counters, by the same index.
    pub by_class: Box<[CommandClass]>,
}

/// One command class's counters.
#[derive(Debug, Default)]
pub struct CommandClass {
    /// Commands.
    pub count: AtomicU64,
    /// Commands answered with an error (the server's, or the proxy's).
    pub errors: AtomicU64,
    /// Histogram bucket counts (non-cumulative, [`LATENCY_BUCKETS`] and the overflow).
    pub latency_buckets: [AtomicU64; 15],
    /// Sum of latencies, microseconds.
    pub latency_sum_us: AtomicU64,
}

impl CommandClass {
    /// Records `n` commands that took `latency` each, `errors` of them answered with an error.
    pub fn record(&self, n: u64, errors: u64, latency: Duration) {
        self.count.fetch_add(n, Relaxed);
        if errors > 0 {
            self.errors.fetch_add(errors, Relaxed);
        }
        self.latency_buckets[bucket(latency)].fetch_add(n, Relaxed);
        self.latency_sum_us.fetch_add(micros(latency).saturating_mul(n), Relaxed);
    }
}

/// One command slower than its pool's threshold (`[pool.slow_log]`), as the admin API's
/// `/slowlog` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SlowCommand {
    /// When it was answered, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Its protocol.
    pub protocol: &'static str,
    /// Its class (command name).
    pub command: &'static str,
    /// Its (first) key's placement hash, in hex.
    pub key_hash: Option<String>,
    /// Its (first) key, when the pool shows key text (`show_keys`).
    pub key: Option<String>,
    /// From the proxy having it to its answer written, in microseconds.
    pub micros: u64,
    /// Whether it was answered with an error.
    pub error: bool,
}

/// A pool's slowest recent commands: the last few over its threshold, newest last.
#[derive(Debug, Default)]
pub struct SlowLog {
    entries: std::sync::Mutex<std::collections::VecDeque<SlowCommand>>,
}

impl SlowLog {
    /// Adds `entries` in their order under one lock, keeping the last `keep`.
    pub fn extend(&self, entries: Vec<SlowCommand>, keep: usize) {
        let mut e = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in entries {
            while e.len() >= keep.max(1) {
                e.pop_front();
            }
            e.push_back(c);
        }
    }

    /// The entries, newest first.
    pub fn entries(&self) -> Vec<SlowCommand> {
        let e = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        e.iter().rev().cloned().collect()
    }
}

/// Why a request did not go to its key's owner (or had no key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Served by the key's owner.
    Owner,
    /// The owner was unhealthy, ejected, stalled or draining.
    Unavailable,
    /// The owner was over its bounded-load capacity (or, with affinity, busier than the runner-up).
    Overloaded,
    /// A retry after the owner (or an earlier try) failed.
    Retry,
    /// The strategy does not place by key, or the request had no key.
    Unkeyed,
    /// A hot key served by one of its replicas other than its owner.
    Replica,
    /// The owner is warming up (handoff or slow start) and the key is not admitted to it yet.
    Warming,
}

impl Outcome {
    /// How try `attempt` (0 is the first) of a request was placed, by its decision: a retry, a
    /// request without a key, the key's owner, or why it spilled.
    pub fn of(attempt: u32, keyed: bool, spill: Option<keyroute::Spill>) -> Outcome {
        use keyroute::Spill;
        match (attempt, keyed, spill) {
            (a, _, _) if a > 0 => Outcome::Retry,
            (_, false, _) => Outcome::Unkeyed,
            (_, true, None) => Outcome::Owner,
            (_, true, Some(Spill::Unavailable)) => Outcome::Unavailable,
            (_, true, Some(Spill::Replica)) => Outcome::Replica,
            (_, true, Some(Spill::Warming)) => Outcome::Warming,
            (_, true, Some(_)) => Outcome::Overloaded,
        }
    }
}

/// The outcome label values, in [`Outcome`] order.
pub const OUTCOMES: [&str; 7] = ["owner", "unavailable", "overloaded", "retry", "unkeyed", "replica", "warming"];

/// What became of a command copied to a shadow pool (the index into [`PoolMetrics::shadow`]).
pub const SHADOW_OUTCOMES: [&str; 3] = ["answered", "failed", "dropped"];

/// One pool's counters.
#[derive(Debug, Default)]
pub struct PoolMetrics {
    /// Requests by [`Outcome`] (owner, unavailable, overloaded, retry, unkeyed, replica, warming).
    pub outcomes: [AtomicU64; 7],
    /// Requests answered 503 because no worker was available.
    pub no_worker: AtomicU64,
    /// Requests whose key template could not be rendered.
    pub missing_key: AtomicU64,
    /// Membership or weight changes.
    pub membership_changes: AtomicU64,
    /// Of the recently seen keys, the share whose owner changed at the last membership change
    /// (an `f64`'s bits).
    pub last_remapped_ratio: AtomicU64,
    /// Of the recently seen keys, the total that changed owner over all membership changes.
    pub remapped_keys: AtomicU64,
    /// Cache listeners: misses on a joining server answered from the key's previous server, and
    /// filled into the joining one (the warm-up route).
    pub warm_fills: AtomicU64,
    /// Cache listeners: copies on a key's previous server invalidated by a write during the warm-up.
    pub warm_invalidations: AtomicU64,
    /// Replicated pools: reads that missed or failed on a key's first copy and were asked of the
    /// next; Redis Cluster pools: reads a replica missed, refused or failed, asked of the master.
    pub replica_failovers: AtomicU64,
    /// Replicated pools: values added back to copies that missed them (repair on read).
    pub replica_repairs: AtomicU64,
    /// Shadowed pools: commands copied to the shadow pool and answered there, failed there
    /// (no server, a lost connection, a timeout), and dropped because its queue was full.
    pub shadow: [AtomicU64; 3],
    /// Redis Cluster pools: redirections followed, `MOVED` and `ASK`.
    pub cluster_redirects: [AtomicU64; 2],
    /// gRPC calls by method and final status.
    pub grpc: GrpcCalls,
    /// Cache listeners: their commands by class, one table per protocol that serves the pool.
    pub commands: std::sync::Mutex<Vec<std::sync::Arc<CommandMetrics>>>,
    /// Cache listeners: the slowest recent commands.
    pub slow: SlowLog,
}

impl PoolMetrics {
    /// The command counters of `protocol`'s listeners in this pool (made on first use).
    pub fn commands(&self, protocol: &'static str, classes: &'static [&'static str]) -> std::sync::Arc<CommandMetrics> {
        let mut all = self.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(m) = all.iter().find(|m| m.protocol == protocol) {
            return std::sync::Arc::clone(m);
        }
        let by_class = classes.iter().map(|_| CommandClass::default()).collect();
        let m = std::sync::Arc::new(CommandMetrics { protocol, classes, by_class });
        all.push(std::sync::Arc::clone(&m));
        m
    }
}

/// gRPC calls by method (`package.Service/Method`) and final `grpc-status` (0 to 16). Methods
/// are named by clients, so at most [`GrpcCalls::MAX_METHODS`] are counted apart per pool; calls
/// of any later one count under `other`.
#[derive(Debug, Default)]
pub struct GrpcCalls {
    methods: parking_lot::Mutex<std::collections::HashMap<Box<str>, std::sync::Arc<GrpcMethod>>>,
}

/// One method's calls by final status.
#[derive(Debug, Default)]
pub struct GrpcMethod {
    /// Calls by `grpc-status` code (0 `OK` .. 16 `UNAUTHENTICATED`).
    pub by_status: [AtomicU64; 17],
}

impl GrpcMethod {
    /// Counts a call that ended with this `grpc-status` value; one that is not a code 0 to 16
    /// counts as 2 (`UNKNOWN`), as a client reads it.
    pub fn record(&self, status: &[u8]) {
        let code = std::str::from_utf8(status).ok().and_then(|s| s.trim().parse::<usize>().ok()).filter(|&c| c <= 16);
        self.by_status[code.unwrap_or(2)].fetch_add(1, Relaxed);
    }
}

impl GrpcCalls {
    /// The methods counted apart, per pool.
    pub const MAX_METHODS: usize = 256;

    /// The counters of the method a call's path names (`/package.Service/Method`); a path that
    /// is not a method's, or a method past the limit, counts under `other`.
    pub fn method(&self, path: &str) -> std::sync::Arc<GrpcMethod> {
        let name = path
            .strip_prefix('/')
            .filter(|p| p.split('/').count() == 2 && !p.starts_with('/') && !p.ends_with('/'))
            .unwrap_or("other");
        let mut methods = self.methods.lock();
        if let Some(m) = methods.get(name) {
            return std::sync::Arc::clone(m);
        }
        let name = if methods.len() < Self::MAX_METHODS { name } else { "other" };
        std::sync::Arc::clone(methods.entry(name.into()).or_default())
    }

    /// Every method counted, and its counters.
    pub fn methods(&self) -> Vec<(Box<str>, std::sync::Arc<GrpcMethod>)> {
        let mut all: Vec<_> = self.methods.lock().iter().map(|(k, v)| (k.clone(), std::sync::Arc::clone(v))).collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

impl PoolMetrics {
    /// Counts one placement.
    pub fn outcome(&self, o: Outcome) {
        self.outcomes[o as usize].fetch_add(1, Relaxed);
    }
}

/// One pool's membership source (etcd): whether it is reachable, what was applied and when.
#[derive(Debug, Default)]
pub struct SourceMetrics {
    /// 1 while the source answers (a read or an open watch), 0 after it was lost.
    pub up: AtomicU64,
    /// The etcd revision of the membership applied last.
    pub revision: AtomicU64,
    /// When the membership was last known current: milliseconds since the gateway's epoch.
    pub current_at_ms: AtomicU64,
    /// Records ignored in the membership applied last (invalid JSON, bad fields, duplicates).
    pub rejected: AtomicU64,
    /// Membership snapshots applied from the source.
    pub applied: AtomicU64,
    /// Times the source was lost (a failed read or a broken watch).
    pub lost: AtomicU64,
    /// Full re-reads after the watch's start revision was compacted.
    pub compactions: AtomicU64,
}

/// One runtime thread's client connections (every listener's).
#[derive(Debug, Default)]
pub struct ThreadMetrics {
    /// Accepted on this thread's sockets: how the kernel spreads them.
    pub accepted: AtomicU64,
    /// Served by this thread now, whoever accepted them (a busy thread hands new ones over).
    pub open: AtomicU64,
    /// Accepted here and handed over to a less busy thread.
    pub handed_over: AtomicU64,
}

/// One listener's counters.
#[derive(Debug, Default)]
pub struct ListenerMetrics {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Times the accept loop waited because the connection limit was reached.
    pub limited: AtomicU64,
    /// Failed `accept` calls (EMFILE and the like).
    pub accept_errors: AtomicU64,
    /// Connections closed because their request head did not arrive in time (answered 408).
    pub header_timeouts: AtomicU64,
    /// TLS handshakes that failed or timed out.
    pub tls_errors: AtomicU64,
    /// Connections that spoke HTTP/2.
    pub h2_connections: AtomicU64,
    /// Upgraded connections tunnelled to a worker.
    pub upgrades: AtomicU64,
    /// Tunnels closed because nothing moved for the tunnel idle timeout.
    pub tunnel_idle_closed: AtomicU64,
    /// Responses cut because the client read nothing for the send timeout.
    pub send_timeouts: AtomicU64,
    /// Access log lines written.
    pub log_written: AtomicU64,
    /// Access log lines dropped (the writer's queue was full).
    pub log_dropped: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn classes_and_buckets() {
        let m = WorkerMetrics::default();
        m.record_class(Some(200));
        m.record_class(Some(503));
        m.record_class(None);
        m.record_latency(Duration::from_millis(3));
        m.record_latency(Duration::from_secs(20));
        assert_eq!(m.responses.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>(), [0, 1, 0, 0, 1, 1]);
        assert_eq!(m.latency_buckets[3].load(Relaxed), 1);
        assert_eq!(m.latency_buckets[14].load(Relaxed), 1);
        assert_eq!(m.latency_sum_us.load(Relaxed), 20_003_000);
    }

    #[test]
    fn grpc_methods_are_counted_apart_up_to_a_limit() {
        let calls = GrpcCalls::default();
        calls.method("/a.S/M").record(b"0");
        calls.method("/a.S/M").record(b"14");
        calls.method("/a.S/M").record(b"99");
        for bad in ["/", "/a.S", "/a.S/M/x", "//M", "/a.S/"] {
            calls.method(bad).record(b"0");
        }
        for i in 0..GrpcCalls::MAX_METHODS + 10 {
            calls.method(&format!("/s/m{i}")).record(b"0");
        }
        let all = calls.methods();
        assert_eq!(all.len(), GrpcCalls::MAX_METHODS, "a client cannot grow the list without end");
        let of = |name: &str| all.iter().find(|(n, _)| &**n == name).map(|(_, c)| Arc::clone(c)).expect(name);
        let m = of("a.S/M");
        assert_eq!([0, 2, 14].map(|c| m.by_status[c].load(Relaxed)), [1, 1, 1], "99 is UNKNOWN (2)");
        assert!(of("other").by_status[0].load(Relaxed) >= 5 + 10, "bad paths and methods past the limit");
    }
}

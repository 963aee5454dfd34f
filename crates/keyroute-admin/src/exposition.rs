//! `/metrics`: a [`prometheus_client`] collector that walks the pools', workers' and listeners'
//! counters at scrape time. Each family is described once and carries every pool's and worker's
//! samples, in the Prometheus text format (0.0.4); a test checks the output with `promtool check
//! metrics`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use keyroute_fleet::metrics::{CLASSES, LATENCY_BUCKETS, ListenerMetrics, OUTCOMES};
use keyroute_fleet::pool::hot::{HotKeysState, HotMetrics};
use keyroute_fleet::pool::{Pool, Snapshot, State};
use keyroute_gateway::cache::HotCache;

/// What `/metrics` shows: the pools, the listeners and the admin API's own counters.
#[derive(Debug)]
pub(crate) struct Scrape {
    pub(crate) pools: Vec<Arc<Pool>>,
    /// The response caches of the pools that have one, by pool name.
    pub(crate) caches: Vec<(String, Arc<HotCache>)>,
    pub(crate) listeners: Vec<(String, u64, Arc<ListenerMetrics>)>,
    /// Client connections accepted by each runtime thread, by thread index.
    /// Each thread's connections: accepted, open (served now), handed over.
    pub(crate) threads: Vec<(u64, u64, u64)>,
    pub(crate) admin_auth_failures: u64,
    /// Subscribers of the dashboard's feed now.
    pub(crate) dashboard_viewers: u64,
    /// (listener, certificate file, seconds until it expires: negative once it has).
    pub(crate) certificates: Vec<(String, String, i64)>,
}

/// Renders a scrape in the Prometheus text format.
pub(crate) fn render(scrape: Scrape) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    if prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).is_err() {
        // Writing to a String cannot fail; keep what was written.
        tracing::error!("metrics encoding failed");
    }
    out
}

type Labels = Vec<(&'static str, Cow<'static, str>)>;

/// A value a sample can carry.
enum Value {
    Int(u64),
    Float(f64),
}

/// Encodes one family: its description once, then every sample.
fn family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (Labels, Value)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        let mut e = metric.encode_family(&labels)?;
        match (kind, value) {
            (MetricType::Counter, Value::Int(v)) => e.encode_counter::<NoLabelSet, _, u64>(&v, None)?,
            (MetricType::Counter, Value::Float(v)) => e.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
            (_, Value::Int(v)) => e.encode_gauge(&(v.min(i64::MAX as u64) as i64))?,
            (_, Value::Float(v)) => e.encode_gauge(&v)?,
        }
    }
    Ok(())
}

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, Cow::Owned((*v).to_owned()))).collect()
}

/// The listener families that are one counter (or gauge) of [`ListenerMetrics`] each: name, help,
/// type, and the value.
#[allow(clippy::type_complexity)]
const LISTENER_FAMILIES: [(&str, &str, MetricType, fn(&ListenerMetrics) -> u64); 12] = [
    ("keyroute_listener_connections", "Client connections open now.", MetricType::Gauge, |m| m.open.load(Relaxed)),
    ("keyroute_listener_connections_accepted", "Client connections accepted.", MetricType::Counter, |m| {
        m.accepted.load(Relaxed)
    }),
    (
        "keyroute_listener_connection_limit_reached",
        "Times the listener stopped accepting because it held its connection limit.",
        MetricType::Counter,
        |m| m.limited.load(Relaxed),
    ),
    (
        "keyroute_listener_accept_errors",
        "Failed accept calls (for example, out of file descriptors).",
        MetricType::Counter,
        |m| m.accept_errors.load(Relaxed),
    ),
    (
        "keyroute_listener_header_timeouts",
        "Connections whose request head did not arrive within the header timeout (answered 408).",
        MetricType::Counter,
        |m| m.header_timeouts.load(Relaxed),
    ),
    ("keyroute_listener_tls_handshake_errors", "TLS handshakes that failed or timed out.", MetricType::Counter, |m| {
        m.tls_errors.load(Relaxed)
    }),
    ("keyroute_listener_h2_connections", "Connections that spoke HTTP/2.", MetricType::Counter, |m| {
        m.h2_connections.load(Relaxed)
    }),
    (
        "keyroute_listener_upgrades",
        "Upgraded connections (WebSocket and others) tunnelled to a worker.",
        MetricType::Counter,
        |m| m.upgrades.load(Relaxed),
    ),
    (
        "keyroute_listener_tunnel_idle_timeouts",
        "Tunnels closed because nothing moved either way for tunnel_idle_timeout_ms.",
        MetricType::Counter,
        |m| m.tunnel_idle_closed.load(Relaxed),
    ),
    (
        "keyroute_listener_send_timeouts",
        "Responses cut because the client read nothing of them for send_timeout_ms.",
        MetricType::Counter,
        |m| m.send_timeouts.load(Relaxed),
    ),
    ("keyroute_listener_access_log_lines", "Access log lines written.", MetricType::Counter, |m| {
        m.log_written.load(Relaxed)
    }),
    (
        "keyroute_listener_access_log_dropped",
        "Access log lines dropped because the writer's queue was full (requests never wait for it).",
        MetricType::Counter,
        |m| m.log_dropped.load(Relaxed),
    ),
];

/// A family of one value per pool: name, help, type, and the value.
type PoolRow = (&'static str, &'static str, MetricType, fn(&Pool) -> Value);

/// The pool families that are one counter of the pool's each.
const POOL_FAMILIES: [PoolRow; 9] = [
    ("keyroute_pool_no_worker", "Requests answered 503: no available worker.", MetricType::Counter, |p| {
        Value::Int(p.metrics.no_worker.load(Relaxed))
    }),
    ("keyroute_pool_missing_key", "Requests whose key template could not be rendered.", MetricType::Counter, |p| {
        Value::Int(p.metrics.missing_key.load(Relaxed))
    }),
    ("keyroute_pool_membership_changes", "Membership or weight changes.", MetricType::Counter, |p| {
        Value::Int(p.metrics.membership_changes.load(Relaxed))
    }),
    (
        "keyroute_pool_remapped_keys",
        "Recently seen keys whose owner changed, over all membership changes.",
        MetricType::Counter,
        |p| Value::Int(p.metrics.remapped_keys.load(Relaxed)),
    ),
    (
        "keyroute_pool_last_remapped_ratio",
        "Share of recently seen keys remapped by the last membership change.",
        MetricType::Gauge,
        |p| Value::Float(f64::from_bits(p.metrics.last_remapped_ratio.load(Relaxed))),
    ),
    (
        "keyroute_pool_warm_fills",
        "Cache listeners: misses on a joining server answered from the key's previous server and filled into the joining one.",
        MetricType::Counter,
        |p| Value::Int(p.metrics.warm_fills.load(Relaxed)),
    ),
    (
        "keyroute_pool_warm_invalidations",
        "Cache listeners: copies on a key's previous server deleted by a write during the warm-up.",
        MetricType::Counter,
        |p| Value::Int(p.metrics.warm_invalidations.load(Relaxed)),
    ),
    (
        "keyroute_pool_replica_failovers",
        "Replicated pools: reads that missed or failed on a key's first copy and were asked of the next; Redis Cluster pools: reads a replica missed, refused or failed, asked of the master.",
        MetricType::Counter,
        |p| Value::Int(p.metrics.replica_failovers.load(Relaxed)),
    ),
    (
        "keyroute_pool_replica_repairs",
        "Replicated pools: values added back to copies that had missed them (repair on read).",
        MetricType::Counter,
        |p| Value::Int(p.metrics.replica_repairs.load(Relaxed)),
    ),
];

/// The families of an etcd-backed pool's membership source.
const SOURCE_FAMILIES: [PoolRow; 7] = [
    (
        "keyroute_membership_source_up",
        "1 while the pool's membership source (etcd) answers, 0 while the last known members serve.",
        MetricType::Gauge,
        |p| Value::Int(p.source.up.load(Relaxed)),
    ),
    ("keyroute_membership_revision", "The etcd revision of the membership applied last.", MetricType::Gauge, |p| {
        Value::Int(p.source.revision.load(Relaxed))
    }),
    (
        "keyroute_membership_age_seconds",
        "Seconds since the membership was last known current (a watch message or a liveness check).",
        MetricType::Gauge,
        |p| {
            let at = std::time::Duration::from_millis(p.source.current_at_ms.load(Relaxed));
            Value::Float(p.epoch().elapsed().saturating_sub(at).as_secs_f64())
        },
    ),
    (
        "keyroute_membership_rejected_records",
        "Records under the prefix ignored as invalid in the membership applied last.",
        MetricType::Gauge,
        |p| Value::Int(p.source.rejected.load(Relaxed)),
    ),
    ("keyroute_membership_applied", "Memberships applied from the source.", MetricType::Counter, |p| {
        Value::Int(p.source.applied.load(Relaxed))
    }),
    ("keyroute_membership_source_lost", "Times the membership source was lost.", MetricType::Counter, |p| {
        Value::Int(p.source.lost.load(Relaxed))
    }),
    (
        "keyroute_membership_compactions",
        "Full re-reads after the watch's start revision was compacted.",
        MetricType::Counter,
        |p| Value::Int(p.source.compactions.load(Relaxed)),
    ),
];

/// The hot-key families that are one counter of a pool's hot-key state each.
#[allow(clippy::type_complexity)]
const HOT_FAMILIES: [(&str, &str, fn(&HotMetrics) -> u64); 2] = [
    ("keyroute_pool_hot_key_requests", "Requests for keys that were hot.", |m| m.hot_requests.load(Relaxed)),
    ("keyroute_pool_hot_keys_entered", "Keys that became hot.", |m| m.became_hot.load(Relaxed)),
];

/// The gateway cache's families, for pools with a cache.
#[allow(clippy::type_complexity)]
const CACHE_FAMILIES: [(&str, &str, MetricType, fn(&HotCache) -> u64); 6] = [
    (
        "keyroute_pool_cache_hits",
        "Hot-key responses served from the gateway cache at once (coalesced waits are counted apart).",
        MetricType::Counter,
        |c| c.metrics.hits.load(Relaxed),
    ),
    (
        "keyroute_pool_cache_coalesced",
        "Requests that waited for a concurrent miss of the same URL and were served its response.",
        MetricType::Counter,
        |c| c.metrics.coalesced.load(Relaxed),
    ),
    ("keyroute_pool_cache_misses", "Cacheable hot-key requests that went upstream.", MetricType::Counter, |c| {
        c.metrics.misses.load(Relaxed)
    }),
    ("keyroute_pool_cache_stores", "Responses stored in the gateway cache.", MetricType::Counter, |c| {
        c.metrics.stores.load(Relaxed)
    }),
    ("keyroute_pool_cache_bytes", "Bytes held by the gateway cache.", MetricType::Gauge, |c| c.store.bytes()),
    ("keyroute_pool_cache_entries", "Responses held by the gateway cache.", MetricType::Gauge, |c| {
        c.store.entries() as u64
    }),
];

/// The worker families that are one value of a member's each: name, help, type, and the value of
/// member `i` of a snapshot at a moment.
#[allow(clippy::type_complexity)]
const WORKER_FAMILIES: [(&str, &str, MetricType, fn(&Snapshot, usize, Instant) -> u64); 7] = [
    (
        "keyroute_worker_in_flight",
        "Requests in flight, until their response bodies end.",
        MetricType::Gauge,
        |s, i, _| s.workers()[i].in_flight(),
    ),
    ("keyroute_worker_weight", "The weight in use.", MetricType::Gauge, |s, i, _| u64::from(s.weight(i))),
    ("keyroute_worker_healthy", "1 when the worker takes new requests.", MetricType::Gauge, |s, i, now| {
        u64::from(s.state(i, now) == State::Healthy)
    }),
    ("keyroute_worker_retries", "Failed tries that were retried on another worker.", MetricType::Counter, |s, i, _| {
        s.workers()[i].metrics.retries.load(Relaxed)
    }),
    ("keyroute_worker_ejections", "Passive ejections.", MetricType::Counter, |s, i, _| {
        s.workers()[i].metrics.ejections.load(Relaxed)
    }),
    ("keyroute_worker_connect_errors", "Connection failures.", MetricType::Counter, |s, i, _| {
        s.workers()[i].metrics.connect_errors.load(Relaxed)
    }),
    (
        "keyroute_worker_truncated_responses",
        "Responses whose body ended before its length or its last chunk.",
        MetricType::Counter,
        |s, i, _| s.workers()[i].metrics.truncated.load(Relaxed),
    ),
];

/// Every pool with its snapshot, as one scrape reads them.
type Snaps<'a> = [(&'a Arc<Pool>, Arc<Snapshot>)];

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snaps: Vec<_> = self.pools.iter().map(|p| (p, p.snapshot())).collect();
        let now = Instant::now();
        encode_pools(&mut encoder, &snaps)?;
        encode_commands(&mut encoder, &snaps)?;
        encode_hot_keys(&mut encoder, &snaps, &self.caches)?;
        encode_workers(&mut encoder, &snaps, now)?;
        self.encode_listeners(&mut encoder)
    }
}

/// Placements by outcome, the pool counters, the membership source of etcd-backed pools, and the
/// pools' generations.
fn encode_pools(encoder: &mut DescriptorEncoder<'_>, snaps: &Snaps<'_>) -> Result<(), std::fmt::Error> {
    let all = |_: &Snapshot| true;
    let help = "Placements by outcome: served by the key's owner, or spilled and why.";
    by_label(encoder, ("keyroute_pool_requests", help), snaps, all, ("outcome", &OUTCOMES), |m| &m.outcomes)?;
    let help = "Redis Cluster pools: redirections followed (MOVED, ASK).";
    let clusters = |s: &Snapshot| s.config().cluster.is_some();
    let kinds = ["moved", "ask"];
    by_label(encoder, ("keyroute_pool_cluster_redirections", help), snaps, clusters, ("kind", &kinds), |m| {
        &m.cluster_redirects
    })?;
    let help = "Cache listeners: commands copied to the pool's shadow pool, by what became of them.";
    let shadowed = |s: &Snapshot| s.config().shadow.is_some();
    let outcomes = &keyroute_fleet::metrics::SHADOW_OUTCOMES;
    by_label(encoder, ("keyroute_pool_shadow_commands", help), snaps, shadowed, ("outcome", outcomes), |m| &m.shadow)?;
    let rows = |encoder: &mut DescriptorEncoder<'_>, table: &[PoolRow], pools: &[&Arc<Pool>]| {
        for (name, help, kind, get) in table {
            family(encoder, name, help, *kind, pools.iter().map(|p| (labels(&[("pool", &p.name)]), get(p))))?;
        }
        Ok::<(), std::fmt::Error>(())
    };
    let all: Vec<&Arc<Pool>> = snaps.iter().map(|(p, _)| *p).collect();
    rows(encoder, &POOL_FAMILIES, &all)?;
    // No etcd-backed pool: no empty families.
    let sourced: Vec<&Arc<Pool>> = snaps
        .iter()
        .filter(|(_, s)| {
            use keyroute_fleet::config::MembershipConfig;
            matches!(s.config().membership, MembershipConfig::Etcd(_) | MembershipConfig::Dns(_))
        })
        .map(|(p, _)| *p)
        .collect();
    if !sourced.is_empty() {
        rows(encoder, &SOURCE_FAMILIES, &sourced)?;
    }
    let mut calls = Vec::new();
    for (p, _) in snaps.iter() {
        for (method, counts) in p.metrics.grpc.methods() {
            for (code, n) in counts.by_status.iter().enumerate() {
                let n = n.load(Relaxed);
                if n > 0 {
                    let code = code.to_string();
                    calls.push((
                        labels(&[("pool", &p.name), ("method", &method), ("grpc_status", &code)]),
                        Value::Int(n),
                    ));
                }
            }
        }
    }
    if !calls.is_empty() {
        family(
            encoder,
            "keyroute_grpc_calls",
            "gRPC calls by method and final grpc-status.",
            MetricType::Counter,
            calls,
        )?;
    }
    let generations = snaps.iter().map(|(p, s)| (labels(&[("pool", &p.name)]), Value::Int(s.generation())));
    family(encoder, "keyroute_pool_generation", "The pool snapshot's generation.", MetricType::Gauge, generations)
}

/// A counter family of one sample per pool (those `which` takes) and label value: `values[i]`
/// is counted in `counters(metrics)[i]`. No pool taken: no family.
fn by_label(
    encoder: &mut DescriptorEncoder<'_>,
    (name, help): (&str, &str),
    snaps: &Snaps<'_>,
    which: impl Fn(&Snapshot) -> bool,
    (label, values): (&'static str, &[&str]),
    counters: impl Fn(&keyroute_fleet::metrics::PoolMetrics) -> &[AtomicU64],
) -> Result<(), std::fmt::Error> {
    let taken: Vec<&Arc<Pool>> = snaps.iter().filter(|(_, s)| which(s)).map(|(p, _)| *p).collect();
    if taken.is_empty() {
        return Ok(());
    }
    let rows = taken.iter().flat_map(|p| {
        let counts = counters(&p.metrics);
        values.iter().zip(counts).map(|(v, n)| (labels(&[("pool", &p.name), (label, v)]), Value::Int(n.load(Relaxed))))
    });
    family(encoder, name, help, MetricType::Counter, rows)
}

/// Cache listeners' commands by pool, protocol and class: counts, errors and latency (the
/// classes a listener has served; none for a pool no cache listener serves).
fn encode_commands(encoder: &mut DescriptorEncoder<'_>, snaps: &Snaps<'_>) -> Result<(), std::fmt::Error> {
    let mut rows = Vec::new();
    for (p, _) in snaps {
        let tables = p.metrics.commands.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for t in tables {
            for (i, class) in t.classes.iter().enumerate() {
                if t.by_class.get(i).is_some_and(|c| c.count.load(Relaxed) > 0) {
                    rows.push((p.name.clone(), Arc::clone(&t), i, *class));
                }
            }
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    let l = |(pool, t, _, class): &(String, Arc<keyroute_fleet::metrics::CommandMetrics>, usize, &str)| {
        labels(&[("pool", pool), ("protocol", t.protocol), ("command", class)])
    };
    let get = |t: &keyroute_fleet::metrics::CommandMetrics,
               i: usize,
               f: fn(&keyroute_fleet::metrics::CommandClass) -> u64| { t.by_class.get(i).map_or(0, f) };
    family(
        encoder,
        "keyroute_cache_commands",
        "Cache listeners: commands by pool, protocol and command.",
        MetricType::Counter,
        rows.iter().map(|r| (l(r), Value::Int(get(&r.1, r.2, |c| c.count.load(Relaxed))))),
    )?;
    family(
        encoder,
        "keyroute_cache_command_errors",
        "Cache listeners: commands answered with an error (the server's or the proxy's).",
        MetricType::Counter,
        rows.iter().map(|r| (l(r), Value::Int(get(&r.1, r.2, |c| c.errors.load(Relaxed))))),
    )?;
    let mut metric = encoder.encode_descriptor(
        "keyroute_cache_command_duration_seconds",
        "Cache listeners: time from the proxy having a command to its answer written.",
        None,
        MetricType::Histogram,
    )?;
    for r in &rows {
        let Some(c) = r.1.by_class.get(r.2) else { continue };
        let (sum, count, buckets) = histogram(&c.latency_buckets, &c.latency_sum_us);
        metric.encode_family(&l(r))?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

/// A latency histogram's sum in seconds, count and cumulative buckets, from its
/// [`LATENCY_BUCKETS`] counts (and the overflow's) and its sum in microseconds.
fn histogram(counts: &[AtomicU64; 15], sum_us: &AtomicU64) -> (f64, u64, Vec<(f64, u64)>) {
    let mut cumulative = 0;
    let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
    for (b, le) in LATENCY_BUCKETS.iter().chain(std::iter::once(&f64::INFINITY)).enumerate() {
        cumulative += counts[b].load(Relaxed);
        buckets.push((*le, cumulative));
    }
    (sum_us.load(Relaxed) as f64 / 1e6, cumulative, buckets)
}

/// Hot keys and the gateway cache, for pools that have them.
fn encode_hot_keys(
    encoder: &mut DescriptorEncoder<'_>,
    snaps: &Snaps<'_>,
    caches: &[(String, Arc<HotCache>)],
) -> Result<(), std::fmt::Error> {
    let hot: Vec<(&Arc<Pool>, &Arc<HotKeysState>)> =
        snaps.iter().filter_map(|(p, s)| s.hot().map(|h| (*p, h))).collect();
    if hot.is_empty() {
        return Ok(());
    }
    let sets: Vec<_> = hot.iter().map(|(p, h)| (*p, h.set())).collect();
    family(
        encoder,
        "keyroute_pool_hot_keys",
        "Keys hot now (served by the least loaded of their top replicas).",
        MetricType::Gauge,
        sets.iter().map(|(p, s)| (labels(&[("pool", &p.name)]), Value::Int(s.len() as u64))),
    )?;
    family(
        encoder,
        "keyroute_pool_hot_key_replicas",
        "Hot keys now by replica count.",
        MetricType::Gauge,
        sets.iter().flat_map(|(p, s)| {
            let mut by: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
            for (_, r) in s.iter() {
                *by.entry(r).or_default() += 1;
            }
            by.into_iter().map(|(r, n)| (labels(&[("pool", &p.name), ("replicas", &r.to_string())]), Value::Int(n)))
        }),
    )?;
    for (name, help, get) in HOT_FAMILIES {
        let samples = hot.iter().map(|(p, h)| (labels(&[("pool", &p.name)]), Value::Int(get(&h.metrics))));
        family(encoder, name, help, MetricType::Counter, samples)?;
    }
    // A pool's cache serves its hot keys: shown for the pools with hot keys on.
    let cached: Vec<&(String, Arc<HotCache>)> =
        caches.iter().filter(|(name, _)| hot.iter().any(|(p, _)| p.name == *name)).collect();
    if cached.is_empty() {
        return Ok(());
    }
    for (name, help, kind, get) in CACHE_FAMILIES {
        let samples = cached.iter().map(|(p, c)| (labels(&[("pool", p)]), Value::Int(get(c))));
        family(encoder, name, help, kind, samples)?;
    }
    Ok(())
}

/// Per worker: warm-up, responses by class, the one-value families, the state, the latency
/// histogram.
fn encode_workers(encoder: &mut DescriptorEncoder<'_>, snaps: &Snaps<'_>, now: Instant) -> Result<(), std::fmt::Error> {
    // (pool, snapshot, index) for every member of every pool.
    let members: Vec<_> = snaps.iter().flat_map(|(p, s)| (0..s.workers().len()).map(move |i| (*p, s, i))).collect();
    let wl = |p: &Pool, s: &Snapshot, i: usize| labels(&[("pool", &p.name), ("worker", &s.workers()[i].name)]);
    // Workers warming up (handoff or slow start): their progress, 0 to 1.
    let warming: Vec<_> = members.iter().filter(|(_, s, i)| s.warm_progress(*i, now) < 1.0).collect();
    if !warming.is_empty() {
        family(
            encoder,
            "keyroute_worker_warm_up",
            "Warm-up progress of a worker that joined or recovered: the share of its keys it takes.",
            MetricType::Gauge,
            warming.iter().map(|&&(p, s, i)| (wl(p, s, i), Value::Float(s.warm_progress(i, now)))),
        )?;
    }
    family(
        encoder,
        "keyroute_worker_responses",
        "Upstream responses by status class (error: no response, or a body cut short).",
        MetricType::Counter,
        members.iter().flat_map(|&(p, s, i)| {
            CLASSES.iter().enumerate().map(move |(c, class)| {
                let mut l = wl(p, s, i);
                l.push(("class", Cow::Borrowed(class)));
                (l, Value::Int(s.workers()[i].metrics.responses[c].load(Relaxed)))
            })
        }),
    )?;
    for (name, help, kind, get) in WORKER_FAMILIES {
        family(encoder, name, help, kind, members.iter().map(|&(p, s, i)| (wl(p, s, i), Value::Int(get(s, i, now)))))?;
    }
    family(
        encoder,
        "keyroute_worker_state",
        "The worker's state (1 for the current one).",
        MetricType::Gauge,
        members.iter().flat_map(|&(p, s, i)| {
            let current = s.state(i, now);
            [State::Healthy, State::Unhealthy, State::Ejected, State::Draining, State::Stalled, State::Loop]
                .into_iter()
                .map(move |st| {
                    let mut l = wl(p, s, i);
                    l.push(("state", Cow::Borrowed(st.name())));
                    (l, Value::Int(u64::from(current == st)))
                })
        }),
    )?;
    let mut metric = encoder.encode_descriptor(
        "keyroute_worker_latency_seconds",
        "Time to the upstream response headers (or to the failure).",
        None,
        MetricType::Histogram,
    )?;
    for &(p, s, i) in &members {
        let m = &s.workers()[i].metrics;
        let (sum, count, buckets) = histogram(&m.latency_buckets, &m.latency_sum_us);
        metric.encode_family(&wl(p, s, i))?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

impl Scrape {
    /// The listeners' families, their limits and certificates, and the admin API's own.
    fn encode_listeners(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (name, help, kind, get) in LISTENER_FAMILIES {
            let samples = self.listeners.iter().map(|(n, _, m)| (labels(&[("listener", n)]), Value::Int(get(m))));
            family(encoder, name, help, kind, samples)?;
        }
        family(
            encoder,
            "keyroute_listener_connection_limit",
            "The most client connections the listener holds at once.",
            MetricType::Gauge,
            self.listeners.iter().map(|(n, limit, _)| (labels(&[("listener", n)]), Value::Int(*limit))),
        )?;
        family(
            encoder,
            "keyroute_thread_connections_accepted",
            "Client connections accepted by each runtime thread (every listener): how the kernel spreads them.",
            MetricType::Counter,
            self.threads.iter().enumerate().map(|(i, n)| (labels(&[("thread", &i.to_string())]), Value::Int(n.0))),
        )?;
        family(
            encoder,
            "keyroute_thread_connections_open",
            "Client connections each runtime thread serves now, whoever accepted them.",
            MetricType::Gauge,
            self.threads.iter().enumerate().map(|(i, n)| (labels(&[("thread", &i.to_string())]), Value::Int(n.1))),
        )?;
        family(
            encoder,
            "keyroute_thread_connections_handed_over",
            "Client connections a thread accepted while it served two more than the least busy thread, and handed to it.",
            MetricType::Counter,
            self.threads.iter().enumerate().map(|(i, n)| (labels(&[("thread", &i.to_string())]), Value::Int(n.2))),
        )?;
        family(
            encoder,
            "keyroute_listener_certificate_expiry_seconds",
            "Seconds until each TLS certificate of the listener expires (negative once it has).",
            MetricType::Gauge,
            self.certificates
                .iter()
                .map(|(l, file, secs)| (labels(&[("listener", l), ("certificate", file)]), Value::Float(*secs as f64))),
        )?;
        family(
            encoder,
            "keyroute_admin_auth_failures",
            "Admin requests refused for a missing or wrong token.",
            MetricType::Counter,
            [(Labels::new(), Value::Int(self.admin_auth_failures))],
        )?;
        family(
            encoder,
            "keyroute_dashboard_viewers",
            "Subscribers of the dashboard's feed (GET /events) now.",
            MetricType::Gauge,
            [(Labels::new(), Value::Int(self.dashboard_viewers))],
        )
    }
}

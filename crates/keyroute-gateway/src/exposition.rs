//! `/metrics`: a [`prometheus_client`] collector that walks the pools', workers' and listeners'
//! counters at scrape time. Each family is described once and carries every pool's and worker's
//! samples, in the Prometheus text format (0.0.4); a test checks the output with `promtool check
//! metrics`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::metrics::{CLASSES, LATENCY_BUCKETS, ListenerMetrics, OUTCOMES};
use crate::pool::{Pool, State};

/// What `/metrics` shows: the pools, the listeners and the admin API's own counters.
#[derive(Debug)]
pub(crate) struct Scrape {
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) listeners: Vec<(String, u64, Arc<ListenerMetrics>)>,
    pub(crate) admin_auth_failures: u64,
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

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snaps: Vec<_> = self.pools.iter().map(|p| (p, p.snapshot())).collect();
        let now = Instant::now();
        let pool_counter = |encoder: &mut DescriptorEncoder<'_>, name, help, get: &dyn Fn(&Pool) -> u64| {
            let samples = snaps.iter().map(|(p, _)| (labels(&[("pool", &p.name)]), Value::Int(get(p))));
            family(encoder, name, help, MetricType::Counter, samples)
        };
        let outcomes = snaps.iter().flat_map(|(p, _)| {
            OUTCOMES.iter().enumerate().map(|(i, o)| {
                (labels(&[("pool", &p.name), ("outcome", o)]), Value::Int(p.metrics.outcomes[i].load(Relaxed)))
            })
        });
        family(
            &mut encoder,
            "keyroute_pool_requests",
            "Placements by outcome: served by the key's owner, or spilled and why.",
            MetricType::Counter,
            outcomes,
        )?;
        pool_counter(&mut encoder, "keyroute_pool_no_worker", "Requests answered 503: no available worker.", &|p| {
            p.metrics.no_worker.load(Relaxed)
        })?;
        pool_counter(
            &mut encoder,
            "keyroute_pool_missing_key",
            "Requests whose key template could not be rendered.",
            &|p| p.metrics.missing_key.load(Relaxed),
        )?;
        pool_counter(&mut encoder, "keyroute_pool_membership_changes", "Membership or weight changes.", &|p| {
            p.metrics.membership_changes.load(Relaxed)
        })?;
        pool_counter(
            &mut encoder,
            "keyroute_pool_remapped_keys",
            "Recently seen keys whose owner changed, over all membership changes.",
            &|p| p.metrics.remapped_keys.load(Relaxed),
        )?;
        family(
            &mut encoder,
            "keyroute_pool_last_remapped_ratio",
            "Share of recently seen keys remapped by the last membership change.",
            MetricType::Gauge,
            snaps.iter().map(|(p, _)| {
                (
                    labels(&[("pool", &p.name)]),
                    Value::Float(f64::from_bits(p.metrics.last_remapped_ratio.load(Relaxed))),
                )
            }),
        )?;
        // The membership source of each etcd-backed pool.
        let sourced: Vec<&Arc<Pool>> = snaps
            .iter()
            .filter(|(_, s)| matches!(s.config().membership, crate::config::MembershipConfig::Etcd(_)))
            .map(|(p, _)| *p)
            .collect();
        let source_family = |encoder: &mut DescriptorEncoder<'_>, name, help, kind, get: &dyn Fn(&Pool) -> Value| {
            if sourced.is_empty() {
                return Ok(()); // no etcd-backed pool: no empty families
            }
            family(encoder, name, help, kind, sourced.iter().map(|p| (labels(&[("pool", &p.name)]), get(p))))
        };
        source_family(
            &mut encoder,
            "keyroute_membership_source_up",
            "1 while the pool's membership source (etcd) answers, 0 while the last known members serve.",
            MetricType::Gauge,
            &|p| Value::Int(p.source.up.load(Relaxed)),
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_revision",
            "The etcd revision of the membership applied last.",
            MetricType::Gauge,
            &|p| Value::Int(p.source.revision.load(Relaxed)),
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_age_seconds",
            "Seconds since the membership was last known current (a watch message or a liveness check).",
            MetricType::Gauge,
            &|p| {
                let at = std::time::Duration::from_millis(p.source.current_at_ms.load(Relaxed));
                Value::Float(p.epoch().elapsed().saturating_sub(at).as_secs_f64())
            },
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_rejected_records",
            "Records under the prefix ignored as invalid in the membership applied last.",
            MetricType::Gauge,
            &|p| Value::Int(p.source.rejected.load(Relaxed)),
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_applied",
            "Memberships applied from the source.",
            MetricType::Counter,
            &|p| Value::Int(p.source.applied.load(Relaxed)),
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_source_lost",
            "Times the membership source was lost.",
            MetricType::Counter,
            &|p| Value::Int(p.source.lost.load(Relaxed)),
        )?;
        source_family(
            &mut encoder,
            "keyroute_membership_compactions",
            "Full re-reads after the watch's start revision was compacted.",
            MetricType::Counter,
            &|p| Value::Int(p.source.compactions.load(Relaxed)),
        )?;
        // Hot keys and the gateway cache, for pools that have them.
        let hot: Vec<(&Arc<Pool>, &Arc<crate::pool::hot::HotKeysState>)> =
            snaps.iter().filter_map(|(p, s)| s.hot().map(|h| (*p, h))).collect();
        if !hot.is_empty() {
            let sets: Vec<_> = hot.iter().map(|(p, h)| (*p, h.set())).collect();
            family(
                &mut encoder,
                "keyroute_pool_hot_keys",
                "Keys hot now (served by the least loaded of their top replicas).",
                MetricType::Gauge,
                sets.iter().map(|(p, s)| (labels(&[("pool", &p.name)]), Value::Int(s.len() as u64))),
            )?;
            family(
                &mut encoder,
                "keyroute_pool_hot_key_replicas",
                "Hot keys now by replica count.",
                MetricType::Gauge,
                sets.iter().flat_map(|(p, s)| {
                    let mut by: std::collections::BTreeMap<usize, u64> = std::collections::BTreeMap::new();
                    for (_, r) in s.iter() {
                        *by.entry(r).or_default() += 1;
                    }
                    by.into_iter()
                        .map(|(r, n)| (labels(&[("pool", &p.name), ("replicas", &r.to_string())]), Value::Int(n)))
                }),
            )?;
            let hot_counter = |encoder: &mut DescriptorEncoder<'_>,
                               name,
                               help,
                               get: &dyn Fn(&crate::pool::hot::HotMetrics) -> u64| {
                family(
                    encoder,
                    name,
                    help,
                    MetricType::Counter,
                    hot.iter().map(|(p, h)| (labels(&[("pool", &p.name)]), Value::Int(get(&h.metrics)))),
                )
            };
            hot_counter(&mut encoder, "keyroute_pool_hot_key_requests", "Requests for keys that were hot.", &|m| {
                m.hot_requests.load(Relaxed)
            })?;
            hot_counter(&mut encoder, "keyroute_pool_hot_keys_entered", "Keys that became hot.", &|m| {
                m.became_hot.load(Relaxed)
            })?;
            let cached: Vec<_> = hot.iter().filter_map(|(p, h)| h.cache.as_ref().map(|c| (*p, *h, c))).collect();
            if !cached.is_empty() {
                let cache_family =
                    |encoder: &mut DescriptorEncoder<'_>,
                     name,
                     help,
                     kind,
                     get: &dyn Fn(&crate::pool::hot::HotKeysState, &crate::cache::HttpCache) -> u64| {
                        family(
                            encoder,
                            name,
                            help,
                            kind,
                            cached.iter().map(|(p, h, c)| (labels(&[("pool", &p.name)]), Value::Int(get(h, c)))),
                        )
                    };
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_hits",
                    "Hot-key responses served from the gateway cache at once (coalesced waits are counted apart).",
                    MetricType::Counter,
                    &|h, _| h.metrics.cache_hits.load(Relaxed),
                )?;
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_coalesced",
                    "Requests that waited for a concurrent miss of the same URL and were served its response.",
                    MetricType::Counter,
                    &|h, _| h.metrics.coalesced.load(Relaxed),
                )?;
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_misses",
                    "Cacheable hot-key requests that went upstream.",
                    MetricType::Counter,
                    &|h, _| h.metrics.cache_misses.load(Relaxed),
                )?;
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_stores",
                    "Responses stored in the gateway cache.",
                    MetricType::Counter,
                    &|h, _| h.metrics.cache_stores.load(Relaxed),
                )?;
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_bytes",
                    "Bytes held by the gateway cache.",
                    MetricType::Gauge,
                    &|_, c| c.bytes(),
                )?;
                cache_family(
                    &mut encoder,
                    "keyroute_pool_cache_entries",
                    "Responses held by the gateway cache.",
                    MetricType::Gauge,
                    &|_, c| c.entries() as u64,
                )?;
            }
        }
        // Workers warming up (handoff or slow start): their progress, 0 to 1.
        let warming: Vec<_> = snaps
            .iter()
            .flat_map(|(p, s)| (0..s.workers().len()).map(move |i| (p, s, i)))
            .filter(|(_, s, i)| s.warm_progress(*i, now) < 1.0)
            .collect();
        if !warming.is_empty() {
            family(
                &mut encoder,
                "keyroute_worker_warm_up",
                "Warm-up progress of a worker that joined or recovered: the share of its keys it takes.",
                MetricType::Gauge,
                warming.iter().map(|(p, s, i)| {
                    (
                        labels(&[("pool", &p.name), ("worker", &s.workers()[*i].name)]),
                        Value::Float(s.warm_progress(*i, now)),
                    )
                }),
            )?;
        }
        family(
            &mut encoder,
            "keyroute_pool_generation",
            "The pool snapshot's generation.",
            MetricType::Gauge,
            snaps.iter().map(|(p, s)| (labels(&[("pool", &p.name)]), Value::Int(s.generation()))),
        )?;

        // Per worker: (pool, worker, index) for every member of every pool.
        let members: Vec<_> = snaps.iter().flat_map(|(p, s)| (0..s.workers().len()).map(move |i| (p, s, i))).collect();
        let wl = |p: &Pool, s: &crate::pool::Snapshot, i: usize| {
            labels(&[("pool", &p.name), ("worker", &s.workers()[i].name)])
        };
        family(
            &mut encoder,
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
        let worker_family = |encoder: &mut DescriptorEncoder<'_>,
                             name: &str,
                             help: &str,
                             kind: MetricType,
                             get: &dyn Fn(&crate::pool::Snapshot, usize) -> u64| {
            family(encoder, name, help, kind, members.iter().map(|&(p, s, i)| (wl(p, s, i), Value::Int(get(s, i)))))
        };
        worker_family(
            &mut encoder,
            "keyroute_worker_in_flight",
            "Requests in flight, until their response bodies end.",
            MetricType::Gauge,
            &|s, i| s.workers()[i].in_flight(),
        )?;
        worker_family(&mut encoder, "keyroute_worker_weight", "The weight in use.", MetricType::Gauge, &|s, i| {
            u64::from(s.weight(i))
        })?;
        worker_family(
            &mut encoder,
            "keyroute_worker_healthy",
            "1 when the worker takes new requests.",
            MetricType::Gauge,
            &|s, i| u64::from(s.state(i, now) == State::Healthy),
        )?;
        family(
            &mut encoder,
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
        worker_family(
            &mut encoder,
            "keyroute_worker_retries",
            "Failed tries that were retried on another worker.",
            MetricType::Counter,
            &|s, i| s.workers()[i].metrics.retries.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_ejections",
            "Passive ejections.",
            MetricType::Counter,
            &|s, i| s.workers()[i].metrics.ejections.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_connect_errors",
            "Connection failures.",
            MetricType::Counter,
            &|s, i| s.workers()[i].metrics.connect_errors.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_truncated_responses",
            "Responses whose body ended before its length or its last chunk.",
            MetricType::Counter,
            &|s, i| s.workers()[i].metrics.truncated.load(Relaxed),
        )?;
        {
            let mut metric = encoder.encode_descriptor(
                "keyroute_worker_latency_seconds",
                "Time to the upstream response headers (or to the failure).",
                None,
                MetricType::Histogram,
            )?;
            for &(p, s, i) in &members {
                let m = &s.workers()[i].metrics;
                let mut cumulative = 0;
                let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
                for (b, le) in LATENCY_BUCKETS.iter().chain(std::iter::once(&f64::INFINITY)).enumerate() {
                    cumulative += m.latency_buckets[b].load(Relaxed);
                    buckets.push((*le, cumulative));
                }
                let sum = m.latency_sum_us.load(Relaxed) as f64 / 1e6;
                let l = wl(p, s, i);
                metric.encode_family(&l)?.encode_histogram::<NoLabelSet>(sum, cumulative, &buckets, None)?;
            }
        }

        for (name, help, kind, get) in LISTENER_FAMILIES {
            let samples = self.listeners.iter().map(|(n, _, m)| (labels(&[("listener", n)]), Value::Int(get(m))));
            family(&mut encoder, name, help, kind, samples)?;
        }
        family(
            &mut encoder,
            "keyroute_listener_connection_limit",
            "The most client connections the listener holds at once.",
            MetricType::Gauge,
            self.listeners.iter().map(|(n, limit, _)| (labels(&[("listener", n)]), Value::Int(*limit))),
        )?;
        family(
            &mut encoder,
            "keyroute_listener_certificate_expiry_seconds",
            "Seconds until each TLS certificate of the listener expires (negative once it has).",
            MetricType::Gauge,
            self.certificates
                .iter()
                .map(|(l, file, secs)| (labels(&[("listener", l), ("certificate", file)]), Value::Float(*secs as f64))),
        )?;
        family(
            &mut encoder,
            "keyroute_admin_auth_failures",
            "Admin requests refused for a missing or wrong token.",
            MetricType::Counter,
            [(Labels::new(), Value::Int(self.admin_auth_failures))],
        )?;
        Ok(())
    }
}

//! Metrics: plain atomics owned by the worker, pool and listener objects they describe (no
//! global registry, nothing to look up on the request path), exposed on the admin listener's
//! `/metrics` by a [`prometheus_client`] collector that walks them at scrape time. Each family is
//! described once and carries every pool's and worker's samples, in the Prometheus text format
//! (0.0.4); a test checks the output with `promtool check metrics`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::pool::{Pool, State};

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
        let secs = latency.as_secs_f64();
        let b = LATENCY_BUCKETS.iter().position(|&le| secs <= le).unwrap_or(LATENCY_BUCKETS.len());
        self.latency_buckets[b].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(latency.as_micros().min(u128::from(u64::MAX)) as u64, Relaxed);
    }

    /// Responses of every class.
    pub fn total(&self) -> u64 {
        self.responses.iter().map(|c| c.load(Relaxed)).sum()
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
}

/// The outcome label values, in [`Outcome`] order.
const OUTCOMES: [&str; 5] = ["owner", "unavailable", "overloaded", "retry", "unkeyed"];

/// One pool's counters.
#[derive(Debug, Default)]
pub struct PoolMetrics {
    /// Requests by [`Outcome`] (owner, unavailable, overloaded, retry, unkeyed).
    pub outcomes: [AtomicU64; 5],
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
}

impl PoolMetrics {
    /// Counts one placement.
    pub fn outcome(&self, o: Outcome) {
        self.outcomes[o as usize].fetch_add(1, Relaxed);
    }
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
}

/// What `/metrics` shows: the pools, the listeners and the admin API's own counters.
#[derive(Debug)]
pub(crate) struct Scrape {
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) listeners: Vec<(String, u64, Arc<ListenerMetrics>)>,
    pub(crate) admin_auth_failures: u64,
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
        family(
            &mut encoder,
            "keyroute_pool_generation",
            "The pool snapshot's generation.",
            MetricType::Gauge,
            snaps.iter().map(|(p, s)| (labels(&[("pool", &p.name)]), Value::Int(s.generation))),
        )?;

        // Per worker: (pool, worker, index) for every member of every pool.
        let members: Vec<_> = snaps.iter().flat_map(|(p, s)| (0..s.workers.len()).map(move |i| (p, s, i))).collect();
        let wl = |p: &Pool, s: &crate::pool::Snapshot, i: usize| {
            labels(&[("pool", &p.name), ("worker", &s.workers[i].name)])
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
                    (l, Value::Int(s.workers[i].metrics.responses[c].load(Relaxed)))
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
            &|s, i| s.workers[i].in_flight(),
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
                [State::Healthy, State::Unhealthy, State::Ejected, State::Draining, State::Stalled].into_iter().map(
                    move |st| {
                        let mut l = wl(p, s, i);
                        l.push(("state", Cow::Borrowed(st.name())));
                        (l, Value::Int(u64::from(current == st)))
                    },
                )
            }),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_retries",
            "Failed tries that were retried on another worker.",
            MetricType::Counter,
            &|s, i| s.workers[i].metrics.retries.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_ejections",
            "Passive ejections.",
            MetricType::Counter,
            &|s, i| s.workers[i].metrics.ejections.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_connect_errors",
            "Connection failures.",
            MetricType::Counter,
            &|s, i| s.workers[i].metrics.connect_errors.load(Relaxed),
        )?;
        worker_family(
            &mut encoder,
            "keyroute_worker_truncated_responses",
            "Responses whose body ended before its length or its last chunk.",
            MetricType::Counter,
            &|s, i| s.workers[i].metrics.truncated.load(Relaxed),
        )?;
        {
            let mut metric = encoder.encode_descriptor(
                "keyroute_worker_latency_seconds",
                "Time to the upstream response headers (or to the failure).",
                None,
                MetricType::Histogram,
            )?;
            for &(p, s, i) in &members {
                let m = &s.workers[i].metrics;
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

        let listener =
            |encoder: &mut DescriptorEncoder<'_>, name, help, kind, get: &dyn Fn(&ListenerMetrics) -> u64| {
                let samples = self.listeners.iter().map(|(n, _, m)| (labels(&[("listener", n)]), Value::Int(get(m))));
                family(encoder, name, help, kind, samples)
            };
        listener(
            &mut encoder,
            "keyroute_listener_connections",
            "Client connections open now.",
            MetricType::Gauge,
            &|m| m.open.load(Relaxed),
        )?;
        family(
            &mut encoder,
            "keyroute_listener_connection_limit",
            "The most client connections the listener holds at once.",
            MetricType::Gauge,
            self.listeners.iter().map(|(n, limit, _)| (labels(&[("listener", n)]), Value::Int(*limit))),
        )?;
        listener(
            &mut encoder,
            "keyroute_listener_connections_accepted",
            "Client connections accepted.",
            MetricType::Counter,
            &|m| m.accepted.load(Relaxed),
        )?;
        listener(
            &mut encoder,
            "keyroute_listener_connection_limit_reached",
            "Times the listener stopped accepting because it held its connection limit.",
            MetricType::Counter,
            &|m| m.limited.load(Relaxed),
        )?;
        listener(
            &mut encoder,
            "keyroute_listener_accept_errors",
            "Failed accept calls (for example, out of file descriptors).",
            MetricType::Counter,
            &|m| m.accept_errors.load(Relaxed),
        )?;
        listener(
            &mut encoder,
            "keyroute_listener_header_timeouts",
            "Connections whose request head did not arrive within the header timeout (answered 408).",
            MetricType::Counter,
            &|m| m.header_timeouts.load(Relaxed),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

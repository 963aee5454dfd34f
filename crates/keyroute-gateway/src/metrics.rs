//! Prometheus metrics: plain atomics owned by the worker and pool objects they describe (no global
//! registry), rendered in the text exposition format on the admin listener's `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the latency histogram, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Status classes counted per worker.
pub const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "error"];

/// One worker's counters.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// Responses by class (index into [`CLASSES`]; `error` = no response).
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
}

impl WorkerMetrics {
    /// Records a response status (or `None` for no response) and the time to its headers.
    pub fn record(&self, status: Option<u16>, latency: Duration) {
        let class = match status {
            Some(s) if (100..600).contains(&s) => usize::from(s / 100 - 1),
            _ => 5,
        };
        self.responses[class].fetch_add(1, Relaxed);
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
    /// The owner was unhealthy, ejected or draining.
    Unavailable,
    /// The owner was over its bounded-load capacity (or, with affinity, busier than the runner-up).
    Overloaded,
    /// A retry after the owner (or an earlier try) failed.
    Retry,
    /// The strategy does not place by key, or the request had no key.
    Unkeyed,
}

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

/// A text exposition writer.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
    declared: std::collections::HashSet<&'static str>,
}

impl Exposition {
    /// Declares a family once (HELP and TYPE lines).
    pub fn family(&mut self, name: &'static str, kind: &str, help: &str) {
        if self.declared.insert(name) {
            let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A worker's latency histogram (cumulative buckets, sum, count).
    pub fn histogram(&mut self, name: &'static str, labels: &[(&str, &str)], m: &WorkerMetrics) {
        let mut cumulative = 0;
        for (i, le) in
            LATENCY_BUCKETS.iter().map(|b| b.to_string()).chain(std::iter::once("+Inf".to_owned())).enumerate()
        {
            cumulative += m.latency_buckets[i].load(Relaxed);
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &l, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, m.latency_sum_us.load(Relaxed) as f64 / 1e6);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_labels_are_escaped() {
        let m = WorkerMetrics::default();
        m.record(Some(200), Duration::from_millis(3));
        m.record(Some(503), Duration::from_secs(20));
        m.record(None, Duration::from_millis(1));
        let mut e = Exposition::default();
        e.family("x_seconds", "histogram", "test");
        e.histogram("x_seconds", &[("worker", "a\"b")], &m);
        let text = e.finish();
        assert!(text.contains("x_seconds_bucket{worker=\"a\\\"b\",le=\"0.005\"} 2"), "{text}");
        assert!(text.contains("x_seconds_bucket{worker=\"a\\\"b\",le=\"+Inf\"} 3"), "{text}");
        assert_eq!(m.responses[1].load(Relaxed), 1);
        assert_eq!(m.responses[4].load(Relaxed), 1);
        assert_eq!(m.responses[5].load(Relaxed), 1);
    }
}

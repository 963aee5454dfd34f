//! Latency histograms: [`hdrhistogram`] at 3 significant digits from 1 nanosecond to four
//! hours (a quantile is an upper bound within 0.1%), with the exact maximum and mean kept beside.

use serde::Serialize;

/// The longest latency told apart (ns): four hours. Longer ones count as four hours in the
/// quantiles; the maximum and the mean keep their exact values.
const HIGHEST: u64 = 4 * 3600 * 1_000_000_000;

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: hdrhistogram::Histogram<u64>,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        // Constant bounds that hdrhistogram takes (1 <= low, 2 * low <= high, 3 digits <= 5).
        let counts = hdrhistogram::Histogram::new_with_bounds(1, HIGHEST, 3).expect("valid constant bounds");
        Histogram { counts, max: 0, sum: 0 }
    }
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        self.counts.saturating_record(v.max(1));
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// The number of values recorded.
    pub fn count(&self) -> u64 {
        self.counts.len()
    }

    /// The largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean (0 if empty).
    pub fn mean(&self) -> f64 {
        if self.count() == 0 { 0.0 } else { self.sum as f64 / self.count() as f64 }
    }

    /// The value at quantile `q` in [0, 1] (an upper bound within 0.1%, never above the maximum;
    /// 0 if empty).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count() == 0 {
            return 0;
        }
        self.counts.value_at_quantile(q.clamp(0.0, 1.0)).min(self.max)
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.counts.add(&other.counts);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// The usual summary, in milliseconds.
    pub fn summary(&self) -> LatencySummary {
        let ms = |v: u64| v as f64 / 1e6;
        LatencySummary {
            count: self.count(),
            mean_ms: self.mean() / 1e6,
            p50_ms: ms(self.quantile(0.50)),
            p90_ms: ms(self.quantile(0.90)),
            p95_ms: ms(self.quantile(0.95)),
            p99_ms: ms(self.quantile(0.99)),
            p999_ms: ms(self.quantile(0.999)),
            max_ms: ms(self.max),
        }
    }

    /// `(value in ms, cumulative fraction)` points of the distribution, for a CDF chart.
    pub fn cdf_points(&self, points: usize) -> Vec<(f64, f64)> {
        (0..=points).map(|i| i as f64 / points as f64).map(|q| (self.quantile(q) as f64 / 1e6, q)).collect()
    }
}

/// Latency quantiles in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Values recorded.
    pub count: u64,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_upper_bounds_within_a_tenth_of_a_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        for (q, exact) in [(0.5, 50_000_000u64), (0.9, 90_000_000), (0.99, 99_000_000), (0.999, 99_900_000)] {
            let g = h.quantile(q);
            assert!(g >= exact && (g - exact) as f64 <= exact as f64 / 1000.0, "q{q}: {g} vs {exact}");
        }
        assert_eq!(h.quantile(1.0), 100_000_000, "capped by the maximum recorded");
        assert_eq!((h.count(), h.max()), (100_000, 100_000_000));
        assert!((h.mean() - 50_000_500.0).abs() < 1e-6, "the mean is exact: {}", h.mean());
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }

    #[test]
    fn values_past_the_range_keep_an_exact_maximum_and_merges_add_up() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(0);
        a.record(5);
        b.record(HIGHEST * 10);
        a.merge(&b);
        assert_eq!((a.count(), a.max()), (3, HIGHEST * 10));
        assert!(a.quantile(1.0) >= HIGHEST);
        assert!(a.quantile(0.34) <= 5);
    }
}

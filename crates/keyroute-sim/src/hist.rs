//! A log-linear latency histogram from 1 nanosecond to about an hour, with quantiles exact to 0.2%
//! (a bucket spans 1/512 of its values; the HdrHistogram layout, simplified).

use serde::Serialize;

const SUB_BITS: u32 = 10; // 1024 linear sub-buckets per power of two

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; (64 - SUB_BITS as usize + 1) << SUB_BITS], total: 0, max: 0, sum: 0 }
    }
}

fn index(v: u64) -> usize {
    let v = v.max(1);
    let top = 63 - v.leading_zeros(); // position of the highest bit
    if top < SUB_BITS {
        return v as usize;
    }
    let shift = top - SUB_BITS + 1;
    (((shift as u64) << SUB_BITS) + (v >> shift)) as usize
}

fn value(i: usize) -> u64 {
    let (shift, sub) = ((i >> SUB_BITS) as u32, (i & ((1 << SUB_BITS) - 1)) as u64);
    if shift == 0 { sub } else { ((sub | (1 << (SUB_BITS - 1))) << shift).saturating_add((1 << shift) - 1) }
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        if let Some(c) = self.counts.get_mut(index(v)) {
            *c += 1;
        }
        self.total += 1;
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// The number of values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The largest value recorded.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean (0 if empty).
    pub fn mean(&self) -> f64 {
        if self.total == 0 { 0.0 } else { self.sum as f64 / self.total as f64 }
    }

    /// The value at quantile `q` in [0, 1] (an upper bound within 0.2%; 0 if empty).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value(i).min(self.max);
            }
        }
        self.max
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// The usual summary, in milliseconds.
    pub fn summary(&self) -> LatencySummary {
        let ms = |v: u64| v as f64 / 1e6;
        LatencySummary {
            count: self.total,
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
    fn quantiles_are_upper_bounds_within_a_fifth_of_a_percent() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        // A bucket spans 1/512 of its values (0.195%), and a quantile is its bucket's upper end.
        let mut got = Vec::new();
        for (q, exact) in [(0.5, 50_000_000u64), (0.99, 99_000_000), (0.999, 99_900_000)] {
            let g = h.quantile(q);
            assert!(g >= exact && (g - exact) as f64 <= exact as f64 / 512.0, "q{q}: {g} vs {exact}");
            got.push(g);
        }
        assert_eq!(got, [50_003_967, 99_090_431, 100_000_000]); // the last capped by the maximum recorded
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(Histogram::default().quantile(0.5), 0);
    }

    #[test]
    fn index_and_value_round_trip_upwards() {
        for v in [1u64, 2, 1023, 1024, 1025, 4096, 1 << 40, u64::MAX / 2] {
            let i = index(v);
            assert!(value(i) >= v, "{v}");
            assert!(value(i) - v <= v / 512 + 1, "{v}: {}", value(i));
        }
    }
}

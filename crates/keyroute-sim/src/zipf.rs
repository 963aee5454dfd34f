//! Zipf-distributed key popularity.
//!
//! Key `k` (rank `k`, from 0) is requested with probability proportional to `1 / (k + 1)^s`. With
//! `s` around 1, a few keys take a large share of traffic and a long tail is requested rarely: the
//! shape of real cache workloads (Breslau et al., *Web caching and Zipf-like distributions*, 1999).
//! Sampling inverts the cumulative distribution by binary search over a precomputed table,
//! narrowed first by a guide table of 65,536 buckets of probability (so a draw touches a few
//! neighbouring entries, not `log K` scattered ones of a table of 80 MB at 10M keys): the same rank
//! as the plain search, deterministic for a given [`RandomSource`].

use keyroute::hash::RandomSource;

/// A Zipf(s) distribution over `0..keys`.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
    /// `guide[j]`: the first rank whose cumulative probability reaches `j / GUIDE`.
    guide: Vec<u32>,
}

const GUIDE: usize = 1 << 16;

impl Zipf {
    /// The distribution over `keys` ranks with exponent `s >= 0` (0 is uniform).
    ///
    /// # Panics
    ///
    /// Never: `keys` of 0 is treated as 1, and a negative or non-finite `s` as 0.
    pub fn new(keys: usize, s: f64) -> Self {
        let keys = keys.max(1);
        let s = if s.is_finite() && s > 0.0 { s } else { 0.0 };
        let mut cdf = Vec::with_capacity(keys);
        let mut total = 0.0;
        for k in 0..keys {
            total += 1.0 / ((k + 1) as f64).powf(s);
            cdf.push(total);
        }
        for c in &mut cdf {
            *c /= total;
        }
        let guide = (0..=GUIDE).map(|j| cdf.partition_point(|&c| c < j as f64 / GUIDE as f64) as u32).collect();
        Zipf { cdf, guide }
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    /// Whether there are no keys (never: at least one).
    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The probability of rank `k`.
    pub fn probability(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ if k < self.cdf.len() => self.cdf[k] - self.cdf[k - 1],
            _ => 0.0,
        }
    }

    /// The share of requests going to the `k` most popular keys.
    pub fn head_mass(&self, k: usize) -> f64 {
        if k == 0 { 0.0 } else { self.cdf[(k - 1).min(self.cdf.len() - 1)] }
    }

    /// Draws a rank.
    pub fn sample<R: RandomSource + ?Sized>(&self, rng: &mut R) -> usize {
        let u = rng.unit_open();
        // The answer, the first rank with cdf >= u, lies in guide[j]..=guide[j + 1] for
        // j = floor(u * GUIDE): cdf[guide[j] - 1] < j / GUIDE <= u and cdf[guide[j + 1]] >= (j + 1) / GUIDE > u.
        let j = ((u * GUIDE as f64) as usize).min(GUIDE - 1);
        let (lo, hi) = (self.guide[j] as usize, (self.guide[j + 1] as usize + 1).min(self.cdf.len()));
        (lo + self.cdf[lo..hi].partition_point(|&c| c < u)).min(self.cdf.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyroute::hash::SplitMix64;

    #[test]
    fn frequencies_follow_the_law() {
        let z = Zipf::new(1000, 1.0);
        let mut rng = SplitMix64::new(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        // Rank 0 is twice as popular as rank 1, and ten times rank 9. A ratio of two counts c_a / c_b
        // (multinomial) has a relative standard deviation of about sqrt(1/E[c_a] + 1/E[c_b]); the
        // bounds are 6 of those (about 6% for 0/1 and 12% for 0/9), and each count is binomial, 6
        // standard deviations.
        let n = 200_000.0;
        for (b, law) in [(1usize, 2.0), (9, 10.0)] {
            let ratio = f64::from(counts[0]) / f64::from(counts[b]);
            let rel = (1.0 / (n * z.probability(0)) + 1.0 / (n * z.probability(b))).sqrt();
            assert!((ratio / law - 1.0).abs() <= 6.0 * rel, "rank 0 / rank {b}: {ratio}, law {law}");
        }
        for k in [0usize, 1, 9, 999] {
            let p = z.probability(k);
            let sigma = (n * p * (1.0 - p)).sqrt();
            assert!((f64::from(counts[k]) - n * p).abs() <= 6.0 * sigma, "rank {k}: {} vs {:.0}", counts[k], n * p);
        }
    }

    #[test]
    fn the_guide_gives_the_plain_search_answer() {
        let mut rng = SplitMix64::new(3);
        for (keys, s) in [(1usize, 0.9), (7, 0.0), (1000, 1.0), (100_000, 0.9), (300_000, 1.3)] {
            let z = Zipf::new(keys, s);
            for _ in 0..20_000 {
                let mut a = rng.clone();
                let plain = {
                    let u = a.unit_open();
                    z.cdf.partition_point(|&c| c < u).min(z.cdf.len() - 1)
                };
                assert_eq!(z.sample(&mut rng), plain, "{keys} keys, s {s}");
            }
        }
    }

    #[test]
    fn degenerate_parameters_are_safe() {
        let z = Zipf::new(0, f64::NAN);
        let mut rng = SplitMix64::new(1);
        assert_eq!(z.sample(&mut rng), 0);
        assert_eq!(z.len(), 1);
        let u = Zipf::new(4, 0.0);
        assert!((u.probability(3) - 0.25).abs() < 1e-12);
    }
}

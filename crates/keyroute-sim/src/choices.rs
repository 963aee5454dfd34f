//! `sim choices`: balls into bins with `d` random choices (Mitzenmacher 2001).
//!
//! `balls` balls are thrown one at a time; each picks `d` distinct bins uniformly at random and goes
//! into the least full of them. With one choice and `n` balls in `n` bins the fullest bin holds about
//! `ln n / ln ln n` balls; with two, about `ln ln n / ln 2`: the first source document's "nine with
//! one random choice and four with two" at a million. This is the abstract experiment behind
//! [`keyroute::PowerOfChoices`], run on plain counters so a million bins take milliseconds.

use keyroute::hash::{RandomSource, SplitMix64};
use serde::Serialize;

use crate::SimError;

/// The outcome for each number of choices.
#[derive(Clone, Debug, Serialize)]
pub struct ChoicesReport {
    /// Bins.
    pub bins: u64,
    /// Balls.
    pub balls: u64,
    /// Runs per choice count (each with its own seed, derived from the base seed).
    pub runs: u32,
    /// The base seed.
    pub seed: u64,
    /// One row per choice count.
    pub results: Vec<ChoicesRow>,
}

/// The fullest bin for one number of choices.
#[derive(Clone, Debug, Serialize)]
pub struct ChoicesRow {
    /// Choices per ball.
    pub choices: u32,
    /// The fullest bin of each run.
    pub max_load: Vec<u32>,
    /// Mean over runs.
    pub mean_max_load: f64,
    /// Bins by load in the first run: `load_histogram[l]` bins hold `l` balls.
    pub load_histogram: Vec<u64>,
}

/// Runs the experiment.
///
/// # Errors
///
/// Zero bins, a choice count of 0 or above 16 or the number of bins, or more than 2^32 - 1 balls.
pub fn choices(bins: u64, balls: u64, choice_counts: &[u32], seed: u64, runs: u32) -> Result<ChoicesReport, SimError> {
    if bins == 0 || bins > u64::from(u32::MAX) {
        return Err(SimError::Invalid(format!("bins must be in 1..=4294967295, got {bins}")));
    }
    if balls > u64::from(u32::MAX) {
        return Err(SimError::Invalid(format!("balls must be at most 4294967295, got {balls}")));
    }
    let most = bins.min(16);
    if let Some(&d) = choice_counts.iter().find(|&&d| d == 0 || u64::from(d) > most) {
        return Err(SimError::Invalid(format!("choices must be in 1..={most}, got {d}")));
    }
    let runs = runs.max(1);
    let mut load = vec![0u32; bins as usize];
    let results = choice_counts
        .iter()
        .map(|&d| {
            let mut maxes = Vec::with_capacity(runs as usize);
            let mut histogram = Vec::new();
            for run in 0..runs {
                load.iter_mut().for_each(|l| *l = 0);
                let mut rng = SplitMix64::new(seed ^ (u64::from(run) << 32) ^ u64::from(d));
                let mut max = 0;
                for _ in 0..balls {
                    let mut best = rng.below(bins) as usize;
                    let mut drawn = [best; 16];
                    for k in 1..d as usize {
                        // Distinct samples: redraw on a repeat (d <= 16 and d <= bins).
                        let c = loop {
                            let c = rng.below(bins) as usize;
                            if !drawn[..k].contains(&c) {
                                break c;
                            }
                        };
                        drawn[k] = c;
                        if load[c] < load[best] {
                            best = c;
                        }
                    }
                    load[best] += 1;
                    max = max.max(load[best]);
                }
                maxes.push(max);
                if run == 0 {
                    histogram = vec![0u64; max as usize + 1];
                    for &l in &load {
                        histogram[l as usize] += 1;
                    }
                }
            }
            let mean = maxes.iter().map(|&m| f64::from(m)).sum::<f64>() / maxes.len() as f64;
            ChoicesRow { choices: d, max_load: maxes, mean_max_load: mean, load_histogram: histogram }
        })
        .collect();
    Ok(ChoicesReport { bins, balls, runs, seed, results })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_choices_beat_one() {
        // Seeded, so exact: the busiest bin of each run, and the first run's histogram.
        let r = choices(100_000, 100_000, &[1, 2, 3], 7, 2).expect("valid");
        let maxes: Vec<&[u32]> = r.results.iter().map(|x| &x.max_load[..]).collect();
        assert_eq!(maxes, [&[8, 7][..], &[3, 4], &[3, 3]]);
        let means: Vec<f64> = r.results.iter().map(|x| x.mean_max_load).collect();
        assert_eq!(means, [7.5, 3.5, 3.0]);
        assert_eq!(r.results[1].load_histogram, [23869, 53131, 22131, 869]);
        for row in &r.results {
            // Every ball lands in one bin: the histogram counts every bin, and its balls add up.
            assert_eq!(row.load_histogram.iter().sum::<u64>(), 100_000);
            assert_eq!(row.load_histogram.iter().enumerate().map(|(l, &b)| l as u64 * b).sum::<u64>(), 100_000);
        }
        assert!(choices(0, 1, &[1], 0, 1).is_err());
        assert!(choices(3, 1, &[4], 0, 1).is_err());
    }

    #[test]
    fn the_readme_figures_at_a_million() {
        // `keyroute sim choices` with its defaults (a million balls into a million bins, seed 1):
        // "busiest bin: 8 with one choice, 4 with two, 3 with three".
        let r = choices(1_000_000, 1_000_000, &[1, 2, 3], 1, 1).expect("valid");
        let maxes: Vec<&[u32]> = r.results.iter().map(|x| &x.max_load[..]).collect();
        assert_eq!(maxes, [&[8][..], &[4], &[3]]);
    }
}

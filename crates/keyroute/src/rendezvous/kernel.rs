//! The selection loops of rendezvous hashing: the best nodes of a range for one key, in one pass,
//! with no buffer.
//!
//! Two kinds of pass, each with a portable scalar version (the reference) and vector versions
//! chosen once, when a table is built, from what the CPU has:
//!
//! - **The best `K`** ([`top_scalar`], `avx512::top`, `avx2::top`): a pick (`K = 1`) and the head of
//!   a ranked list (`K = 3`). The vector versions compare nodes by the top 32 bits of their scores
//!   only, which the score's last step (`x ^ x >> 32`) leaves as they were after the second
//!   multiply, so that step and the first one's shift are not computed for every node (the first
//!   shift is folded into the seeds at build and into the key's hash once per key: `(h ^ s) ^
//!   (h ^ s) >> 32 = (h ^ h >> 32) ^ (s ^ s >> 32)`). Each lane keeps its best `K + 1` values as
//!   `top32 << 32 | position`, sorted by a chain of max and min, and the lanes are merged once at
//!   the end, in pairs (a bitonic merge: three rounds for eight lanes). When two of the best `K + 1` share their top 32 bits (about `K n / 2^32` of keys),
//!   the order cannot be read from them: the pass says so and the exact scalar pass decides.
//! - **The earliest clock** (`avx512::earliest`): a weighted pick in one pass over every weight
//!   group, on lower bounds of the clocks; the exact group passes decide when the bounds do not.
//! - **The best after a floor** ([`best_scalar`], `avx512::best_below`): further elements of a
//!   ranked list, one pass each.
//!
//! Every vector pass gives the scalar pass's answer, or says it cannot (tests below, on random
//! and tied inputs).

use crate::hash::score;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Level {
    /// The best level this CPU has, capped by the environment variable `KEYROUTE_SIMD` (`scalar`,
    /// `avx2` or `avx512`) when it is set: to compare the kernels on one machine, or to rule one
    /// out. Read once per process.
    pub(super) fn detect() -> Level {
        static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            let cap = std::env::var("KEYROUTE_SIMD").ok();
            Level::cpu().min_with(cap.as_deref())
        })
    }

    fn cpu() -> Level {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
                return Level::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Level::Avx2;
            }
        }
        Level::Scalar
    }

    /// This level, or the one `cap` names if it is lower (an unknown name caps nothing).
    fn min_with(self, cap: Option<&str>) -> Level {
        let order = |l: Level| match l {
            Level::Scalar => 0,
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => 1,
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => 2,
        };
        let capped = match cap.map(str::trim) {
            Some("scalar") => Level::Scalar,
            #[cfg(target_arch = "x86_64")]
            Some("avx2") => Level::Avx2,
            _ => return self,
        };
        if order(capped) < order(self) { capped } else { self }
    }

    /// A test that cannot run at level `needs` (`"avx2"` or `"avx512"`) on this CPU: it fails when
    /// CI expects that level (`KEYROUTE_EXPECT_SIMD`, which `scripts/test.sh` sets from
    /// `/proc/cpuinfo`), so that a kernel CI means to test is never skipped in silence; otherwise
    /// it says so.
    #[cfg(test)]
    pub(super) fn skip(test: &str, needs: &str, why: &str) {
        let expected = std::env::var("KEYROUTE_EXPECT_SIMD").unwrap_or_default();
        let order = |s: &str| match s.trim() {
            "avx512" => 2,
            "avx2" => 1,
            _ => 0,
        };
        assert!(
            order(&expected) < order(needs),
            "{test}: KEYROUTE_EXPECT_SIMD={expected}, but {why}: the {needs} kernel was not tested"
        );
        eprintln!("SKIPPED {test}: {why}");
    }

    /// Every level this CPU can run, the scalar one first.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Level> {
        #[allow(unused_mut)]
        let mut levels = vec![Level::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                levels.push(Level::Avx2);
            }
            if Level::cpu() == Level::Avx512 {
                levels.push(Level::Avx512);
            }
        }
        levels
    }
}

/// The first step of the score, `x ^ x >> 32`, applied to a seed or a key's hash alone.
#[inline(always)]
pub(super) const fn fold(x: u64) -> u64 {
    x ^ (x >> 32)
}

/// The best `K` of `seeds` in the order "higher score, then lower rank", best first, as
/// `(score, rank, index)`; returns how many there are (`K`, or fewer nodes).
#[inline]
pub(super) fn top_scalar<const K: usize>(
    h: u64,
    seeds: &[u64],
    ranks: &[u32],
    out: &mut [(u64, u32, usize); K],
) -> usize {
    let key = |s: u64, r: u32| (u128::from(s) << 32) | u128::from(!r);
    let mut best = [0u128; K];
    let mut at = [0usize; K];
    let mut len = 0;
    for (j, (&seed, &r)) in seeds.iter().zip(ranks).enumerate() {
        let k = key(score(h, seed), r);
        if len < K {
            len += 1;
        } else if k <= best[K - 1] {
            continue;
        }
        let mut i = len - 1;
        while i > 0 && best[i - 1] < k {
            best[i] = best[i - 1];
            at[i] = at[i - 1];
            i -= 1;
        }
        best[i] = k;
        at[i] = j;
    }
    for i in 0..len {
        out[i] = ((best[i] >> 32) as u64, !(best[i] as u32), at[i]);
    }
    len
}

/// The best after a floor, exactly.
///
/// The best `(score, rank, index)` among `seeds` strictly after `floor = (score, rank)` in the
/// order "higher score, then lower rank".
///
/// Both orders are folded into one 96-bit key, `score << 32 | !rank` (higher is better), so the
/// loop is two compares and two selects, without unpredictable branches.
#[inline]
pub(super) fn best_scalar(
    h: u64,
    seeds: &[u64],
    ranks: &[u32],
    floor: Option<(u64, u32)>,
) -> Option<(u64, u32, usize)> {
    let key = |s: u64, r: u32| (u128::from(s) << 32) | u128::from(!r);
    let below = floor.map_or(u128::MAX, |(s, r)| key(s, r));
    let mut best = 0u128; // below every key: `!rank` is never 0 for a rank below u32::MAX
    let mut at = usize::MAX;
    for (j, (&seed, &r)) in seeds.iter().zip(ranks).enumerate() {
        let k = key(score(h, seed), r);
        let take = (k < below) & (k > best);
        best = if take { k } else { best };
        at = if take { j } else { at };
    }
    (at != usize::MAX).then_some(((best >> 32) as u64, !(best as u32), at))
}

/// What the vector pass after a floor found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fast {
    /// No score below the floor.
    Nothing,
    /// The single best score below the floor and its index.
    Best { score: u64, at: usize },
    /// Equal scores were seen; use the scalar pass.
    Ambiguous,
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use super::*;

    #[cfg(not(target_arch = "x86_64"))]
    #[test]
    fn the_best_k_passes_agree_with_the_scalar_one() {
        Level::skip("the_best_k_passes_agree_with_the_scalar_one", "avx2", "no vector kernel on this architecture");
    }

    /// The level CI expects (`KEYROUTE_EXPECT_SIMD`) is one this process detects and tests: a
    /// detection that went wrong (or a CPU that lost a feature) fails here rather than turning the
    /// kernel tests into skips.
    #[test]
    fn the_level_ci_expects_is_detected() {
        let available = Level::available();
        let Ok(expected) = std::env::var("KEYROUTE_EXPECT_SIMD") else {
            eprintln!("KEYROUTE_EXPECT_SIMD is not set; the kernels tested here: {available:?}");
            return;
        };
        let want = match expected.trim() {
            "scalar" => Level::Scalar,
            #[cfg(target_arch = "x86_64")]
            "avx2" => Level::Avx2,
            #[cfg(target_arch = "x86_64")]
            "avx512" => Level::Avx512,
            other => panic!("KEYROUTE_EXPECT_SIMD={other}: not a level this architecture has"),
        };
        assert!(available.contains(&want), "CI expects {want:?}, this process detects only {available:?}");
        assert_eq!(Level::cpu(), *available.last().unwrap_or(&Level::Scalar));
    }

    #[test]
    fn the_environment_caps_the_level_and_never_raises_it() {
        assert_eq!(Level::Scalar.min_with(None), Level::Scalar);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(Level::Avx512.min_with(Some("scalar")), Level::Scalar);
            assert_eq!(Level::Avx512.min_with(Some("avx2")), Level::Avx2);
            assert_eq!(Level::Avx512.min_with(Some(" avx512 ")), Level::Avx512);
            assert_eq!(Level::Avx2.min_with(Some("avx512")), Level::Avx2);
            assert_eq!(Level::Scalar.min_with(Some("avx2")), Level::Scalar);
            assert_eq!(Level::Avx2.min_with(Some("sse9")), Level::Avx2);
        }
    }

    /// One best-`K` vector pass (`L = K + 1`) against the exact scalar one, on `seeds` as given.
    /// Returns whether the vector pass answered (rather than handing over to the scalar one).
    #[cfg(target_arch = "x86_64")]
    fn check_top<const K: usize, const L: usize>(level: Level, h: u64, seeds: &[u64], first: u32, what: &str) -> bool {
        let ranks: Vec<u32> = (0..seeds.len() as u32).collect();
        let mut exact = [(0u64, 0u32, 0usize); L];
        let m = top_scalar(h, seeds, &ranks, &mut exact);
        let mixed: Vec<u64> = seeds.iter().map(|&s| fold(s)).collect();
        let mut got = [0u64; L];
        let answered = match level {
            // SAFETY: the caller runs only the levels `Level::available` lists.
            Level::Avx512 => unsafe { avx512::top(fold(h), &mixed, first, &mut got) },
            // SAFETY: as above.
            Level::Avx2 => unsafe { avx2::top(fold(h), &mixed, first, &mut got) },
            Level::Scalar => return true,
        };
        // What the vector pass cannot order: two of the best `L` with equal top halves, or a top half of 0.
        let top = |i: usize| exact[i].0 >> 32;
        let tied = (0..m).any(|i| top(i) == 0 || (i + 1 < m && top(i) == top(i + 1)));
        if answered {
            assert!(!tied, "{level:?} missed a tie: {what}, exact {:?}", &exact[..m]);
            for i in 0..m.min(K) {
                assert_eq!(got[i] >> 32, top(i), "{level:?} score {i}: {what}");
                assert_eq!(got[i] as u32, first + exact[i].2 as u32, "{level:?} position {i}: {what}");
            }
        } else {
            assert!(tied, "{level:?} handed over with no tie: {what}, exact {:?}", &exact[..m]);
        }
        answered
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_best_k_passes_agree_with_the_scalar_one() {
        use crate::hash::{RandomSource, SplitMix64};
        let levels: Vec<Level> = Level::available().into_iter().filter(|&l| l != Level::Scalar).collect();
        if levels.is_empty() {
            let why = "this CPU has neither AVX2 nor AVX-512";
            return Level::skip("the_best_k_passes_agree_with_the_scalar_one", "avx2", why);
        }
        let mut rng = SplitMix64::new(23);
        for &level in &levels {
            let (mut answered, mut handed) = (0u32, 0u32);
            for round in 0..6000u32 {
                let n = 1 + rng.below(if round % 4 == 0 { 12 } else { 90 }) as usize;
                let mut seeds: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
                let mut h = rng.next_u64();
                match round % 5 {
                    // Equal seeds: equal scores, often among the best.
                    1 if n > 1 => {
                        let s = seeds[rng.below(n as u64) as usize];
                        for _ in 0..1 + rng.below(3) {
                            seeds[rng.below(n as u64) as usize] = s;
                        }
                    }
                    // The best node duplicated: a tie for first place.
                    2 if n > 1 => {
                        let best = (0..n).max_by_key(|&i| score(h, seeds[i])).unwrap_or(0);
                        let other = (best + 1 + rng.below(n as u64 - 1) as usize) % n;
                        seeds[other] = seeds[best];
                    }
                    // A node scoring exactly 0.
                    3 => h = seeds[rng.below(n as u64) as usize],
                    _ => {}
                }
                let first = rng.below(1000) as u32;
                let what = format!("round {round}, n {n}, first {first}");
                let a = check_top::<1, 2>(level, h, &seeds, first, &what);
                let b = check_top::<3, 4>(level, h, &seeds, first, &what);
                answered += u32::from(a) + u32::from(b);
                handed += u32::from(!a) + u32::from(!b);
            }
            // Both outcomes were exercised.
            assert!(answered > 6000 && handed > 1000, "{level:?}: {answered} answered, {handed} handed over");
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[test]
    fn the_vector_pass_agrees_with_the_scalar_one() {
        let why = "no AVX-512 kernel on this architecture";
        Level::skip("the_vector_pass_agrees_with_the_scalar_one", "avx512", why);
    }

    /// What the scalar reference says about one vector pass's input: which scores are tied.
    #[cfg(target_arch = "x86_64")]
    struct Ties {
        /// Equal scores the pass cannot order by itself: a tie for the best candidate, another
        /// node scoring exactly the floor, or a best candidate scoring 0 (the accumulators' start).
        /// The pass must report these as ambiguous.
        must: bool,
        /// Any real coincidence the pass may see on its way: two candidates with equal scores
        /// (best or not, the pass compares lane by lane), another node at the floor, or a
        /// candidate scoring 0. Ambiguity without one of these is spurious.
        may: bool,
    }

    #[cfg(target_arch = "x86_64")]
    fn ties(h: u64, seeds: &[u64], below: Option<u64>) -> Ties {
        let scores: Vec<u64> = seeds.iter().map(|&s| score(h, s)).collect();
        let cands: Vec<u64> = scores.iter().copied().filter(|&s| below.is_none_or(|b| s < b)).collect();
        let at_floor = below.map_or(0, |b| scores.iter().filter(|&&s| s == b).count());
        let mut sorted = cands.clone();
        sorted.sort_unstable();
        let equal_pair = sorted.windows(2).any(|w| w[0] == w[1]);
        let best = cands.iter().copied().max();
        let best_tied = best.is_some_and(|m| cands.iter().filter(|&&s| s == m).count() > 1);
        Ties {
            must: best_tied || at_floor > 1 || best == Some(0),
            may: equal_pair || at_floor > 1 || cands.contains(&0),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_pass_agrees_with_the_scalar_one() {
        use crate::hash::{RandomSource, SplitMix64};
        if Level::cpu() != Level::Avx512 {
            let why = "this CPU lacks AVX-512F/DQ, so the vector pass is never used here";
            return Level::skip("the_vector_pass_agrees_with_the_scalar_one", "avx512", why);
        }
        let mut rng = SplitMix64::new(8);
        let (mut best_seen, mut ambiguous_seen, mut must_seen) = (0u32, 0u32, 0u32);
        for round in 0..4000u32 {
            let n = 1 + rng.below(70) as usize;
            let mut seeds: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
            // Ranks a random permutation, so that breaking a tie by index would not pass for
            // breaking it by rank.
            let mut ranks: Vec<u32> = (0..n as u32).collect();
            for i in (1..n).rev() {
                ranks.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut h = rng.next_u64();
            let with_floor = round % 2 == 1;
            let mut j = rng.below(n as u64) as usize; // the floor's node
            let pos = |rng: &mut SplitMix64| rng.below(n as u64) as usize;
            match (round / 2) % 6 {
                0 => {} // distinct seeds: the common case, where the pass must answer itself
                1 if n > 1 => {
                    let (a, b) = (pos(&mut rng), pos(&mut rng));
                    seeds[a] = seeds[b]; // a tie somewhere (often not for the best)
                }
                2 if n > 1 => {
                    // A tie for the best candidate below the floor (or overall).
                    let below = if with_floor { score(h, seeds[j]) } else { u64::MAX };
                    let best = (0..n)
                        .filter(|&i| !with_floor || score(h, seeds[i]) < below)
                        .max_by_key(|&i| score(h, seeds[i]));
                    if let Some(b) = best {
                        let other = loop {
                            let o = pos(&mut rng);
                            if o != j || !with_floor {
                                break o;
                            }
                        };
                        seeds[other] = seeds[b];
                    }
                }
                3 if n > 2 => {
                    let s = seeds[pos(&mut rng)];
                    for _ in 0..1 + rng.below(n as u64 / 2) {
                        let at = pos(&mut rng);
                        seeds[at] = s; // one seed many times
                    }
                }
                4 => h = seeds[pos(&mut rng)], // that node scores exactly 0
                5 if n > 1 => {
                    let other = (j + 1 + rng.below(n as u64 - 1) as usize) % n;
                    seeds[other] = seeds[j]; // another node at the floor's score
                    if rng.below(2) == 0 {
                        j = other;
                    }
                }
                _ => {}
            }
            let floor = with_floor.then(|| (score(h, seeds[j]), ranks[j]));
            let exact = best_scalar(h, &seeds, &ranks, floor);
            let fast = match floor {
                // SAFETY: detected above.
                None => unsafe { avx512::best_below::<false>(h, &seeds, u64::MAX, false) },
                // SAFETY: detected above.
                Some(f) => unsafe { avx512::best_below::<true>(h, &seeds, f.0, true) },
            };
            let t = ties(h, &seeds, floor.map(|f| f.0));
            must_seen += u32::from(t.must);
            let what = format!("round {round}, n {n}, floor {floor:?}: {fast:?}, scalar {exact:?}");
            match fast {
                Fast::Nothing => {
                    assert!(!t.must, "missed a tie: {what}");
                    assert_eq!(exact, None, "{what}");
                }
                Fast::Best { score, at } => {
                    assert!(!t.must, "missed a tie: {what}");
                    assert_eq!(exact, Some((score, ranks[at], at)), "{what}");
                    best_seen += 1;
                }
                Fast::Ambiguous => {
                    assert!(t.may, "spurious ambiguity, no two scores are equal: {what}");
                    ambiguous_seen += 1;
                }
            }
        }
        // Both outcomes were exercised, and the ties that must be flagged did occur.
        assert!(
            best_seen > 1500 && ambiguous_seen > 1000 && must_seen > 800,
            "{best_seen} {ambiguous_seen} {must_seen}"
        );
    }
}

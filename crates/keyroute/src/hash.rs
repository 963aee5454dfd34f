//! The stable hashes: part of keyroute's public contract.
//!
//! Every placement decision is a pure function of a key's bytes, the node names, weights and zones,
//! and the options a table was built with. The functions in this module are the only source of
//! randomness in that function, so they are specified here exactly, and locked by golden vectors in
//! `crates/keyroute/testdata/` that were produced by independent implementations (Python's `xxhash`
//! and `hashlib`, see `testdata/README.md`). Changing any of them is a breaking change.
//!
//! # Key encoding
//!
//! A key is a byte string. Keys given as text are hashed as their UTF-8 bytes, with no terminator,
//! length prefix or normalisation: `user:42` is the seven bytes `75 73 65 72 3a 34 32`.
//!
//! # Key hashes ([`KeyHasher`])
//!
//! - [`KeyHasher::Xxh3`] (the default): XXH3-64 of the key bytes with seed 0, the same value as
//!   `xxhash.xxh3_64_intdigest(key)` in Python or `XXH3_64bits(key, len)` in C. XXH3 is fast (a
//!   short key hashes in a few nanoseconds), well distributed, and has implementations in every
//!   language, so another client can place keys exactly as keyroute does.
//! - [`KeyHasher::Md5`]: the first 8 bytes of the MD5 digest read as a big-endian integer. This is
//!   what the Java sketch of the consistent-hashing note and many older clients use. Slow (about
//!   200 ns a key); choose it only for compatibility.
//!
//! # Node seeds
//!
//! Strategies that score a key against every node (rendezvous, the fallback ranking of the others)
//! hash each node's name once, when the table is built: `node_seed(name) = XXH3-64(name, seed =
//! NODE_SEED)`. The seed is domain separation: a node named `a` and a key `a` do not share a hash.
//!
//! # The rendezvous score
//!
//! `score(key_hash, node_seed)` is [`mix64`]`(key_hash ^ node_seed)`, a bijective 64-bit finaliser
//! (two multiply / xor-shift rounds). Because the key hash is already uniform, the XOR gives every
//! node an independent-looking uniform value per key, and the finaliser removes the XOR structure
//! between nodes.

use md5::{Digest, Md5};

/// Seed for hashing node names into node seeds: the ASCII bytes of `keyroute`, big-endian.
pub const NODE_SEED: u64 = 0x6b65_7972_6f75_7465;

/// XXH3-64 of `bytes` with seed 0.
///
/// # Examples
///
/// ```
/// assert_eq!(keyroute::hash::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
/// ```
#[inline]
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// XXH3-64 of `bytes` with the given seed.
#[inline]
pub fn xxh3_64_with_seed(bytes: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed)
}

/// The first 8 bytes of the MD5 digest of `bytes`, as a big-endian integer.
///
/// This is the `hash` of the consistent-hashing note's Java sketch, read as unsigned.
///
/// # Examples
///
/// ```
/// // md5("") = d41d8cd98f00b204 e9800998ecf8427e
/// assert_eq!(keyroute::hash::md5_64(b""), 0xd41d_8cd9_8f00_b204);
/// ```
pub fn md5_64(bytes: &[u8]) -> u64 {
    let digest = Md5::digest(bytes);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The seed of a node name, used by rendezvous scores and fallback rankings.
#[inline]
pub fn node_seed(name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), NODE_SEED)
}

/// The multiplier of [`mix64`].
pub const MIX_MULTIPLIER: u64 = 0xd6e8_feb8_6659_fd93;

/// A bijective 64-bit mixer: `x ^= x >> 32; x *= M; x ^= x >> 29; x *= M; x ^= x >> 32` with
/// `M = 0xd6e8_feb8_6659_fd93`.
///
/// Two multiply rounds are the fewest that pass the avalanche tests we run (see the unit tests);
/// the function has no branches, so a loop of it over many seeds vectorises.
#[inline(always)]
pub const fn mix64(mut x: u64) -> u64 {
    const M: u64 = MIX_MULTIPLIER;
    x ^= x >> 32;
    x = x.wrapping_mul(M);
    x ^= x >> 29;
    x = x.wrapping_mul(M);
    x ^= x >> 32;
    x
}

/// The rendezvous score of a key (by its hash) on a node (by its seed). Higher wins.
#[inline(always)]
pub const fn score(key_hash: u64, node_seed: u64) -> u64 {
    mix64(key_hash ^ node_seed)
}

/// Maps a 64-bit hash onto `0..n` without a division (Lemire's multiply-shift reduction):
/// `(hash * n) >> 64`. Uniform when `hash` is, and monotone in `hash`.
#[inline(always)]
pub const fn reduce(hash: u64, n: u64) -> u64 {
    ((hash as u128 * n as u128) >> 64) as u64
}

/// How a table hashes keys. Part of the placement contract: two tables agree on every key only if
/// they hash keys the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyHasher {
    /// XXH3-64 with the given seed; the default is seed 0.
    Xxh3 {
        /// The XXH3 seed.
        seed: u64,
    },
    /// The first 8 bytes of MD5, big-endian (compatibility with older clients).
    Md5,
}

impl Default for KeyHasher {
    /// XXH3-64 with seed 0.
    fn default() -> Self {
        KeyHasher::Xxh3 { seed: 0 }
    }
}

impl KeyHasher {
    /// Hashes a key's bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyroute::hash::{KeyHasher, xxh3_64};
    /// assert_eq!(KeyHasher::default().hash(b"user:42"), xxh3_64(b"user:42"));
    /// ```
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        match *self {
            KeyHasher::Xxh3 { seed } => xxh3_64_with_seed(key, seed),
            KeyHasher::Md5 => md5_64(key),
        }
    }

    /// The name used in configuration and on the command line: `xxh3`, `xxh3:SEED` or `md5`.
    pub fn name(&self) -> String {
        match *self {
            KeyHasher::Xxh3 { seed: 0 } => "xxh3".to_owned(),
            KeyHasher::Xxh3 { seed } => format!("xxh3:{seed}"),
            KeyHasher::Md5 => "md5".to_owned(),
        }
    }
}

impl std::str::FromStr for KeyHasher {
    type Err = crate::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "xxh3" => Ok(KeyHasher::default()),
            "md5" => Ok(KeyHasher::Md5),
            _ => {
                if let Some(seed) = s.strip_prefix("xxh3:") {
                    let seed = seed.parse::<u64>().map_err(|_| {
                        crate::Error::invalid_parameter(format!(
                            "invalid hash '{s}': the seed after 'xxh3:' must be an unsigned 64-bit integer"
                        ))
                    })?;
                    return Ok(KeyHasher::Xxh3 { seed });
                }
                Err(crate::Error::invalid_parameter(format!(
                    "unknown hash '{s}' (expected one of: xxh3, xxh3:SEED, md5)"
                )))
            }
        }
    }
}

/// A small, fast, seedable pseudo-random generator (SplitMix64, Steele et al. 2014).
///
/// keyroute never draws from the operating system: strategies that need randomness (power of
/// choices, tie breaks) take a [`RandomSource`], and this one is provided so that simulations and
/// tests are reproducible from a seed.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole output is determined by `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }
}

/// A source of uniformly random 64-bit words, injected wherever a strategy needs randomness.
///
/// Implement it for your generator of choice (it is one method); [`SplitMix64`] is provided.
pub trait RandomSource {
    /// The next uniformly distributed 64-bit word.
    fn next_u64(&mut self) -> u64;

    /// A uniform integer in `0..n` (`n > 0`), by Lemire's nearly divisionless method.
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = self.next_u64() as u128 * n as u128;
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = self.next_u64() as u128 * n as u128;
            }
        }
        (m >> 64) as u64
    }

    /// A uniform float in the open interval (0, 1).
    #[inline]
    fn unit_open(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    }
}

impl RandomSource for SplitMix64 {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl<R: RandomSource + ?Sized> RandomSource for &mut R {
    #[inline]
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

/// The natural logarithm, computed with IEEE-754 additions, multiplications and one division only,
/// in a fixed order, so that it gives the same bits on every platform (the platform `ln` may differ
/// in the last place between libm implementations, which would make weighted rendezvous scores
/// differ across machines). Accurate to about 1e-15 relative on `(0, 1]`.
pub(crate) fn ln_portable(x: f64) -> f64 {
    debug_assert!(x > 0.0 && x.is_finite());
    let bits = x.to_bits();
    let mut exponent = ((bits >> 52) & 0x7ff) as i64;
    let mut mantissa_bits = bits & ((1u64 << 52) - 1);
    if exponent == 0 {
        // Subnormal: normalise.
        let shift = mantissa_bits.leading_zeros() as i64 - 11;
        mantissa_bits = (mantissa_bits << shift) & ((1u64 << 52) - 1);
        exponent = 1 - shift;
    }
    let mut e = exponent - 1023;
    let mut m = f64::from_bits(mantissa_bits | (1023u64 << 52)); // in [1, 2)
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut poly = 1.0 / 21.0;
    for k in [19.0, 17.0, 15.0, 13.0, 11.0, 9.0, 7.0, 5.0, 3.0] {
        poly = poly * s2 + 1.0 / k;
    }
    poly = poly * s2 + 1.0;
    // ln 2 split in a high part exact in few bits and a low part, for accuracy when e is large.
    // fdlibm's split: ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let ef = e as f64;
    ef * LN2_HI + (2.0 * s * poly + ef * LN2_LO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_64_is_big_endian_prefix() {
        // md5("a") = 0cc175b9c0f1b6a8 31c399e269772661
        assert_eq!(md5_64(b"a"), 0x0cc1_75b9_c0f1_b6a8);
    }

    #[test]
    fn mix64_is_bijective_on_samples_and_avalanches() {
        // Flipping any one input bit flips each output bit with probability close to 1/2.
        let mut rng = SplitMix64::new(7);
        let mut flips = [[0u32; 64]; 64];
        let trials = 4000u32;
        for _ in 0..trials {
            let x = rng.next_u64();
            let y = mix64(x);
            for (i, row) in flips.iter_mut().enumerate() {
                let d = y ^ mix64(x ^ (1 << i));
                for (j, cell) in row.iter_mut().enumerate() {
                    *cell += ((d >> j) & 1) as u32;
                }
            }
        }
        // For an ideal mixer each cell is Binomial(trials, 1/2): standard deviation
        // sqrt(1/4 / trials) = 0.0079 in p. Over the 4096 cells the largest deviation is about 3.8
        // of those (measured: 0.0305, 3.9); 6 of them (two-sided 2e-9 a cell, 8e-6 for all) is the
        // bound, so a real bias of 5% in any one cell fails.
        let bound = 6.0 * (0.25 / f64::from(trials)).sqrt();
        for (i, row) in flips.iter().enumerate() {
            for (j, &c) in row.iter().enumerate() {
                let p = f64::from(c) / f64::from(trials);
                assert!((p - 0.5).abs() <= bound, "avalanche bias {p} from input bit {i} to output bit {j}");
            }
        }
    }

    #[test]
    fn ln_portable_matches_std_closely() {
        let mut rng = SplitMix64::new(1);
        for _ in 0..100_000 {
            let x = rng.unit_open();
            let (a, b) = (ln_portable(x), x.ln());
            assert!((a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1e-300), "{x}: {a} vs {b}");
        }
        for x in [1.0, 0.5, 1e-300, 5e-324, 0.999_999_999_999, f64::MIN_POSITIVE] {
            let (a, b) = (ln_portable(x), x.ln());
            assert!((a - b).abs() <= 4.0 * f64::EPSILON * b.abs().max(1e-300), "{x}: {a} vs {b}");
        }
    }

    #[test]
    fn below_is_in_range_and_unbiased_enough() {
        let mut rng = SplitMix64::new(3);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[rng.below(7) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..=10_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn key_hasher_parses_its_names() {
        for h in [KeyHasher::default(), KeyHasher::Md5, KeyHasher::Xxh3 { seed: 9 }] {
            let parsed: KeyHasher = h.name().parse().expect("parses");
            assert_eq!(parsed.hash(b"k"), h.hash(b"k"));
        }
        let err = "sha1".parse::<KeyHasher>().expect_err("unknown");
        assert!(err.to_string().contains("xxh3"), "{err}");
    }
}

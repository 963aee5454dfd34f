//! The best-`K` pass with AVX2 (four nodes a step), for CPUs without AVX-512.
//!
//! AVX2 has no 64-bit multiply and no unsigned 64-bit compare: the multiply by the mixer's
//! constant is three 32-bit multiplies (`a * M = a_lo * M_lo + (a_lo * M_hi + a_hi * M_lo) << 32`,
//! modulo 2^64), and the packed values are compared as signed numbers after flipping their top bit.

use std::arch::x86_64::*;

use crate::hash::MIX_MULTIPLIER;

const SIGN: i64 = i64::MIN;

/// What `avx512::top` does, four nodes a step: the best `L - 1` of `mixed`, as
/// `top32 << 32 | first + index`, best first, into `out`, or `false` when two of the best `L` share their top
/// 32 bits (`out` then holds nothing of use).
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(in super::super) unsafe fn top<const L: usize>(hx: u64, mixed: &[u64], first: u32, out: &mut [u64; L]) -> bool {
    let hv = _mm256_set1_epi64x(hx as i64);
    let m_lo = _mm256_set1_epi64x((MIX_MULTIPLIER & 0xffff_ffff) as i64);
    let m_hi = _mm256_set1_epi64x((MIX_MULTIPLIER >> 32) as i64);
    let sign = _mm256_set1_epi64x(SIGN);
    let four = _mm256_set1_epi64x(4);
    let mut idx = _mm256_add_epi64(_mm256_setr_epi64x(0, 1, 2, 3), _mm256_set1_epi64x(i64::from(first)));
    // Every list starts at packed 0 (as a signed number after the flip: the smallest).
    let mut lists = [sign; L];
    let mul = |a: __m256i| {
        let cross = _mm256_add_epi64(_mm256_mul_epu32(a, m_hi), _mm256_mul_epu32(_mm256_srli_epi64::<32>(a), m_lo));
        _mm256_add_epi64(_mm256_mul_epu32(a, m_lo), _mm256_slli_epi64::<32>(cross))
    };
    let packed = |x: __m256i, idx: __m256i| {
        let x = mul(_mm256_xor_si256(x, hv));
        let x = mul(_mm256_xor_si256(x, _mm256_srli_epi64::<29>(x)));
        // The top half of the score, the position in the low half (even 32-bit lanes), top bit flipped.
        _mm256_xor_si256(_mm256_blend_epi32::<0b0101_0101>(x, idx), sign)
    };
    let insert = |lists: &mut [__m256i; L], mut v: __m256i| {
        for l in lists.iter_mut() {
            let gt = _mm256_cmpgt_epi64(v, *l);
            let larger = _mm256_blendv_epi8(*l, v, gt);
            v = _mm256_blendv_epi8(v, *l, gt);
            *l = larger;
        }
    };
    let ptr = mixed.as_ptr();
    let full = mixed.len() / 4;
    for block in 0..full {
        // SAFETY: block * 4 + 4 <= mixed.len().
        let x = unsafe { _mm256_loadu_si256(ptr.add(block * 4).cast()) };
        insert(&mut lists, packed(x, idx));
        idx = _mm256_add_epi64(idx, four);
    }
    let left = mixed.len() - full * 4;
    if left > 0 {
        // Lanes below `left` are live: their mask has the top bit set.
        let live = _mm256_cmpgt_epi64(_mm256_set1_epi64x(left as i64), _mm256_setr_epi64x(0, 1, 2, 3));
        // SAFETY: the mask only reads the `left` lanes inside `mixed`.
        let x = unsafe { _mm256_maskload_epi64(ptr.add(full * 4).cast(), live) };
        insert(&mut lists, _mm256_blendv_epi8(sign, packed(x, idx), live));
    }
    // The lanes merged in pairs, two rounds (lanes two apart, one apart): then every lane holds
    // the best `L` of all, best first.
    merge_pairs(&mut lists, |x| _mm256_permute4x64_epi64::<0b01_00_11_10>(x));
    merge_pairs(&mut lists, |x| _mm256_shuffle_epi32::<0b01_00_11_10>(x));
    for r in 0..L.min(mixed.len()) {
        let best = (_mm_cvtsi128_si64(_mm256_castsi256_si128(lists[r])) ^ SIGN) as u64;
        if best >> 32 == 0 || (r > 0 && out[r - 1] >> 32 == best >> 32) {
            return false;
        }
        out[r] = best;
    }
    true
}

/// `avx512::merge_pairs` with signed compares: each lane's sorted list merged with its partner's,
/// keeping the best `L`, sorted (`L` a power of two).
#[inline]
#[target_feature(enable = "avx2")]
fn merge_pairs<const L: usize>(lists: &mut [__m256i; L], partner: impl Fn(__m256i) -> __m256i) {
    const { assert!(L.is_power_of_two()) };
    let max = |a, b| _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
    let min = |a, b| _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
    let other = lists.map(&partner);
    for i in 0..L {
        lists[i] = max(lists[i], other[L - 1 - i]);
    }
    let mut half = L / 2;
    while half > 0 {
        for i in (0..L).filter(|i| i % (2 * half) < half) {
            let (a, b) = (lists[i], lists[i + half]);
            lists[i] = max(a, b);
            lists[i + half] = min(a, b);
        }
        half /= 2;
    }
}

use std::arch::x86_64::*;

use super::Fast;
use crate::hash::MIX_MULTIPLIER;

/// The best `L - 1` of `mixed` (the seeds folded by `fold`) for the folded key hash `hx`, eight
/// nodes a step, as `top32 << 32 | first + index`, best first, into `out`; the `L`-th best (when
/// there is one) is there to show that the `(L - 1)`-th is not tied with it. `false` when two of
/// the best `L` share their top 32 bits (see the module documentation).
///
/// # Safety
///
/// The CPU must support AVX-512F and AVX-512DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(in super::super) unsafe fn top<const L: usize>(hx: u64, mixed: &[u64], first: u32, out: &mut [u64; L]) -> bool {
    let hv = _mm512_set1_epi64(hx as i64);
    let mv = _mm512_set1_epi64(MIX_MULTIPLIER as i64);
    let high = _mm512_set1_epi64(0xffff_ffff_0000_0000u64 as i64);
    let eight = _mm512_set1_epi64(8);
    let mut idx = _mm512_add_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_epi64(i64::from(first)));
    let mut lists = [_mm512_setzero_si512(); L];
    // The score up to its second multiply, its top half beside the node's position.
    let packed = |x: __m512i, idx: __m512i| {
        let x = _mm512_mullo_epi64(_mm512_xor_si512(x, hv), mv);
        let x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64::<29>(x)), mv);
        // (x & high) | idx
        _mm512_ternarylogic_epi64::<0xea>(x, high, idx)
    };
    // Into the lane's sorted list: each level keeps the larger and passes the smaller on.
    let insert = |lists: &mut [__m512i; L], mut v: __m512i| {
        for l in lists.iter_mut() {
            let larger = _mm512_max_epu64(*l, v);
            v = _mm512_min_epu64(*l, v);
            *l = larger;
        }
    };
    let ptr = mixed.as_ptr();
    let full = mixed.len() / 8;
    for block in 0..full {
        // SAFETY: block * 8 + 8 <= mixed.len().
        let x = unsafe { _mm512_loadu_si512(ptr.add(block * 8).cast()) };
        insert(&mut lists, packed(x, idx));
        idx = _mm512_add_epi64(idx, eight);
    }
    let left = mixed.len() - full * 8;
    if left > 0 {
        let live: __mmask8 = (1u8 << left) - 1;
        // SAFETY: the mask only reads the `left` lanes inside `mixed`.
        let x = unsafe { _mm512_maskz_loadu_epi64(live, ptr.add(full * 8).cast()) };
        insert(&mut lists, _mm512_maskz_mov_epi64(live, packed(x, idx)));
    }
    // The lanes merged in pairs, three rounds (lanes four apart, two apart, one apart): then every
    // lane holds the best `L` of all, best first.
    merge_pairs(&mut lists, |x| _mm512_shuffle_i64x2::<0b01_00_11_10>(x, x));
    merge_pairs(&mut lists, |x| _mm512_shuffle_i64x2::<0b10_11_00_01>(x, x));
    merge_pairs(&mut lists, |x| _mm512_shuffle_epi32::<0b01_00_11_10>(x));
    for r in 0..L.min(mixed.len()) {
        let best = _mm_cvtsi128_si64(_mm512_castsi512_si128(lists[r])) as u64;
        if best >> 32 == 0 || (r > 0 && out[r - 1] >> 32 == best >> 32) {
            return false;
        }
        out[r] = best;
    }
    true
}

#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn mix(x: __m512i, m: __m512i) -> __m512i {
    let x = _mm512_xor_si512(x, _mm512_srli_epi64::<32>(x));
    let x = _mm512_mullo_epi64(x, m);
    let x = _mm512_xor_si512(x, _mm512_srli_epi64::<29>(x));
    let x = _mm512_mullo_epi64(x, m);
    _mm512_xor_si512(x, _mm512_srli_epi64::<32>(x))
}

/// The weighted pick in one pass over every group: for each node a lower bound of its exponential
/// clock, `-ln(u) / w >= (t + t^2/2) / w` with `t = 1 - u` (the series `t + t^2/2 + t^3/3 + ...`
/// has positive terms), where `t` is itself bounded below from the top half of the score; the
/// bound's top 32 bits beside the position, and each lane keeps its two smallest. Into `out`: the
/// smallest and the second smallest, as `bound_bits_top32 << 32 | index`. The caller checks that
/// the first node's clock is below the second's bound (then it wins outright) and otherwise asks
/// the exact passes. `slow` holds each node's `(1 - 1e-9) / w / 2^32`: the margin keeps the bound
/// below the clock as `ln_portable` computes it, and the power of two (exact) turns the score's
/// top half into `t`, so the loop does not scale it.
///
/// Two terms: the clocks that come near winning have `t` of about `1 / sum(w)`, where the dropped
/// terms are a fraction of about `t^2 / 3` of the bound. With the third term the loop took one more
/// vector operation per eight nodes (of about twenty); with the first term only, more picks fell
/// back to the exact passes, and picks among 8 and 16 nodes were 1.2x slower.
///
/// # Safety
///
/// The CPU must support AVX-512F and AVX-512DQ; `slow` is as long as `mixed`, which is not empty.
#[target_feature(enable = "avx512f,avx512dq")]
pub(in super::super) unsafe fn earliest(hx: u64, mixed: &[u64], slow: &[f64], out: &mut [u64; 2]) {
    debug_assert_eq!(mixed.len(), slow.len());
    let hv = _mm512_set1_epi64(hx as i64);
    let mv = _mm512_set1_epi64(MIX_MULTIPLIER as i64);
    let high = _mm512_set1_epi64(0xffff_ffff_0000_0000u64 as i64);
    let low = _mm512_set1_epi64(0xffff_ffff);
    let eight = _mm512_set1_epi64(8);
    let half_scale = _mm512_set1_pd(1.0 / 8_589_934_592.0);
    let mut idx = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    let mut lists = [_mm512_set1_epi64(-1); 2];
    let bound = |x: __m512i, w: __m512d, idx: __m512i| {
        let x = _mm512_mullo_epi64(_mm512_xor_si512(x, hv), mv);
        let x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64::<29>(x)), mv);
        // u < (top + 1) / 2^32, so t > (2^32 - 1 - top) / 2^32: the numerator `n` is exactly
        // representable, and t + t^2/2 = (n + n^2 2^-33) 2^-32, the last factor in `slow`.
        let n = _mm512_cvtepu64_pd(_mm512_andnot_si512(_mm512_srli_epi64::<32>(x), low));
        let series = _mm512_fmadd_pd(_mm512_mul_pd(n, n), half_scale, n);
        // A positive double's bits order as the number does; cutting the low half rounds down.
        _mm512_ternarylogic_epi64::<0xea>(_mm512_castpd_si512(_mm512_mul_pd(series, w)), high, idx)
    };
    let insert = |lists: &mut [__m512i; 2], v: __m512i| {
        let larger = _mm512_max_epu64(lists[0], v);
        lists[0] = _mm512_min_epu64(lists[0], v);
        lists[1] = _mm512_min_epu64(lists[1], larger);
    };
    let (ptr, wptr) = (mixed.as_ptr(), slow.as_ptr());
    let full = mixed.len() / 8;
    for block in 0..full {
        // SAFETY: block * 8 + 8 <= mixed.len() == slow.len().
        let (x, w) = unsafe { (_mm512_loadu_si512(ptr.add(block * 8).cast()), _mm512_loadu_pd(wptr.add(block * 8))) };
        insert(&mut lists, bound(x, w, idx));
        idx = _mm512_add_epi64(idx, eight);
    }
    let left = mixed.len() - full * 8;
    if left > 0 {
        let live: __mmask8 = (1u8 << left) - 1;
        // SAFETY: the mask only reads the `left` lanes inside `mixed` and `slow`.
        let (x, w) = unsafe {
            (_mm512_maskz_loadu_epi64(live, ptr.add(full * 8).cast()), _mm512_maskz_loadu_pd(live, wptr.add(full * 8)))
        };
        insert(&mut lists, _mm512_mask_mov_epi64(_mm512_set1_epi64(-1), live, bound(x, w, idx)));
    }
    // The lanes merged in pairs as in `top`, smallest first.
    for round in 0..3 {
        let other = lists.map(|x| match round {
            0 => _mm512_shuffle_i64x2::<0b01_00_11_10>(x, x),
            1 => _mm512_shuffle_i64x2::<0b10_11_00_01>(x, x),
            _ => _mm512_shuffle_epi32::<0b01_00_11_10>(x),
        });
        let (a, b) = (_mm512_min_epu64(lists[0], other[1]), _mm512_min_epu64(lists[1], other[0]));
        lists = [_mm512_min_epu64(a, b), _mm512_max_epu64(a, b)];
    }
    for (o, l) in out.iter_mut().zip(&lists) {
        *o = _mm_cvtsi128_si64(_mm512_castsi512_si128(*l)) as u64;
    }
}

/// Merges each lane's sorted list with its partner lane's (`partner` moves the partner's lists
/// onto the lane), keeping the best `L`, sorted: the larger of each value and the partner's mirror
/// image are the best `L` in a bitonic order, which two rounds of compare-exchange sort (`L` a power
/// of two).
#[inline]
#[target_feature(enable = "avx512f")]
fn merge_pairs<const L: usize>(lists: &mut [__m512i; L], partner: impl Fn(__m512i) -> __m512i) {
    const { assert!(L.is_power_of_two()) };
    let other = lists.map(&partner);
    for i in 0..L {
        lists[i] = _mm512_max_epu64(lists[i], other[L - 1 - i]);
    }
    let mut half = L / 2;
    while half > 0 {
        for i in (0..L).filter(|i| i % (2 * half) < half) {
            let (a, b) = (lists[i], lists[i + half]);
            lists[i] = _mm512_max_epu64(a, b);
            lists[i + half] = _mm512_min_epu64(a, b);
        }
        half /= 2;
    }
}

/// The highest score strictly below `below` among `seeds`, eight at a time. `floor_here`
/// says that one seed (the floor's own node) scores exactly `below`; any other score equal
/// to `below`, any tie for the best, or a best of 0 is reported as ambiguous.
///
/// # Safety
///
/// The CPU must support AVX-512F and AVX-512DQ.
#[target_feature(enable = "avx512f,avx512dq,popcnt")]
pub(in super::super) unsafe fn best_below<const FLOOR: bool>(
    h: u64,
    seeds: &[u64],
    below: u64,
    floor_here: bool,
) -> Fast {
    let hv = _mm512_set1_epi64(h as i64);
    let mv = _mm512_set1_epi64(crate::hash::MIX_MULTIPLIER as i64);
    let bv = _mm512_set1_epi64(below as i64);
    // Two independent accumulators (even and odd blocks of eight) to shorten the
    // loop-carried dependency; merged at the end, earlier index first on equal scores.
    let mut best = [_mm512_setzero_si512(); 2];
    let mut best_idx = [_mm512_set1_epi64(-1); 2];
    let mut tie: __mmask8 = 0;
    let mut at_floor = 0u32;
    let mut step = |block: usize, live: __mmask8, x: __m512i, k: usize| {
        let idx = _mm512_add_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), _mm512_set1_epi64((block * 8) as i64));
        let s = mix(_mm512_xor_si512(x, hv), mv);
        // Without a floor (a pick), every live lane is a candidate: two fewer compares.
        let cand = if FLOOR {
            at_floor += _mm512_mask_cmpeq_epu64_mask(live, s, bv).count_ones();
            _mm512_mask_cmplt_epu64_mask(live, s, bv)
        } else {
            live
        };
        tie |= _mm512_mask_cmpeq_epu64_mask(cand, s, best[k]);
        let gt = _mm512_mask_cmpgt_epu64_mask(cand, s, best[k]);
        best[k] = _mm512_mask_mov_epi64(best[k], gt, s);
        best_idx[k] = _mm512_mask_mov_epi64(best_idx[k], gt, idx);
    };
    let full = seeds.len() / 8;
    let ptr = seeds.as_ptr();
    for block in 0..full {
        // SAFETY: block * 8 + 8 <= seeds.len().
        let x = unsafe { _mm512_loadu_si512(ptr.add(block * 8).cast()) };
        step(block, 0xff, x, block & 1);
    }
    let left = seeds.len() - full * 8;
    if left > 0 {
        let live: __mmask8 = (1u8 << left) - 1;
        // SAFETY: the mask only reads the `left` lanes inside `seeds`.
        let x = unsafe { _mm512_maskz_loadu_epi64(live, ptr.add(full * 8).cast()) };
        step(full, live, x, full & 1);
    }
    // Merge: lane-wise, the higher score wins; on equal scores, report ambiguity.
    tie |= _mm512_mask_cmpeq_epu64_mask(
        _mm512_cmpneq_epi64_mask(best_idx[0], _mm512_set1_epi64(-1))
            & _mm512_cmpneq_epi64_mask(best_idx[1], _mm512_set1_epi64(-1)),
        best[0],
        best[1],
    );
    let take1 = _mm512_cmpgt_epu64_mask(best[1], best[0])
        | (_mm512_cmpeq_epi64_mask(best_idx[0], _mm512_set1_epi64(-1))
            & _mm512_cmpneq_epi64_mask(best_idx[1], _mm512_set1_epi64(-1)));
    let best_v = _mm512_mask_mov_epi64(best[0], take1, best[1]);
    let best_i = _mm512_mask_mov_epi64(best_idx[0], take1, best_idx[1]);
    if tie != 0 || at_floor > u32::from(floor_here) {
        return Fast::Ambiguous;
    }
    let valid = _mm512_cmpneq_epi64_mask(best_i, _mm512_set1_epi64(-1));
    if valid == 0 {
        return Fast::Nothing;
    }
    let max = _mm512_mask_reduce_max_epu64(valid, best_v);
    let lanes = _mm512_mask_cmpeq_epu64_mask(valid, best_v, _mm512_set1_epi64(max as i64));
    if lanes.count_ones() != 1 {
        return Fast::Ambiguous;
    }
    let mut out = [0i64; 8];
    // SAFETY: `out` has room for eight lanes.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), best_i) };
    Fast::Best { score: max, at: out[lanes.trailing_zeros() as usize] as usize }
}

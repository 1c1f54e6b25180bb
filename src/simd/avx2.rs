//! AVX2 + FMA helpers shared by the micro-kernels of the tiled attention
//! (`crate::sdpa::cpu::avx2`), of the projection (`crate::projection::avx2`) and by the row
//! scans ([`super::rows`]): partial-vector loads and stores that never touch memory past a
//! row's end, the vector `2^x` with [`super::scalar::EXP2_POLY`], an 8 × 8 transpose and the
//! horizontal sums of 8 vectors at once.
//!
//! All are `unsafe` and `#[inline(always)]` into callers compiled with
//! `#[target_feature(enable = "avx2,fma")]` (`f16c` too where they convert); those callers are
//! only reached through [`super::Isa::Avx2`] or [`super::Isa::Avx512`], which exist only after
//! `is_x86_feature_detected!` found AVX2, FMA and F16C.

use core::arch::x86_64::*;

/// Eight `-1` then eight `0`: `MASKS[8 - n ..][..8]` is the lane mask of the first `n` lanes.
static MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// The mask of lanes `0 .. n` (all eight for `n >= 8`), for [`load_n`] and [`store_n`].
///
/// # Safety
/// AVX available (one unaligned load from a static table).
#[inline(always)]
pub(crate) unsafe fn lanes8(n: usize) -> __m256i {
    let n = n.min(8);
    // SAFETY: 8 - n in 0..=8, so the 8 ints read lie inside the 16 of the table.
    _mm256_loadu_si256(MASKS.as_ptr().add(8 - n).cast())
}

/// `p[..8]`, or only the lanes of `mask` (the others zero, not read: `vmaskmovps` neither
/// reads nor faults on them) when `masked`.
///
/// # Safety
/// AVX available; the lanes read are readable.
#[inline(always)]
pub(crate) unsafe fn load(masked: bool, mask: __m256i, p: *const f32) -> __m256 {
    if masked {
        _mm256_maskload_ps(p, mask)
    } else {
        _mm256_loadu_ps(p)
    }
}

/// `p[..8] = a`, or only the lanes of `mask` (the others untouched) when `masked`.
///
/// # Safety
/// AVX available; the lanes written are writable.
#[inline(always)]
pub(crate) unsafe fn store(masked: bool, mask: __m256i, p: *mut f32, a: __m256) {
    if masked {
        _mm256_maskstore_ps(p, mask, a)
    } else {
        _mm256_storeu_ps(p, a)
    }
}

/// `2^x` for `x <= 0` (right up to `x < 127.5`; larger `x`, `+inf` included, give `2^127 ·
/// 2^f`, finite: softmax only ever passes `x <= 0`): anything below -126 (including `-inf`)
/// gives exactly `0`, NaN gives NaN.
/// The polynomial of [`super::scalar::EXP2_POLY`] on `[-0.5, 0.5]` (relative error about 2e-7),
/// scaled by `2^n` built in the exponent bits; never a denormal, as the AVX-512 version.
///
/// # Safety
/// AVX2 and FMA available (registers only).
#[inline(always)]
pub(crate) unsafe fn exp2_ps(x: __m256) -> __m256 {
    exp2_poly(x, super::scalar::EXP2_POLY)
}

/// [`exp2_ps`] with the coefficients `c` (highest degree first) of a polynomial for `2^f`
/// on `[-0.5, 0.5]`.
///
/// # Safety
/// AVX2 and FMA available (registers only).
#[inline(always)]
unsafe fn exp2_poly<const N: usize>(x: __m256, c: [f32; N]) -> __m256 {
    // Lanes that survive: x >= -126, or NaN (NLT_UQ is true for unordered).
    let live = _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_set1_ps(-126.0));
    // max / min return their second operand when either is NaN: NaN stays NaN.
    let x = _mm256_min_ps(
        _mm256_set1_ps(127.0),
        _mm256_max_ps(_mm256_set1_ps(-126.0), x),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let p = horner(f, c);
    // 2^n for n in -126 ..= 127: the biased exponent n + 127 in 1 ..= 254. (A NaN lane gives
    // some finite scale, and NaN times it is NaN.)
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live)
}

/// The polynomial with coefficients `c` (highest degree first) at `f`, by Horner's rule in
/// fused multiply-adds: the `2^f` of every exponential here.
///
/// # Safety
/// AVX2 and FMA available (registers only).
#[inline(always)]
unsafe fn horner<const N: usize>(f: __m256, c: [f32; N]) -> __m256 {
    let mut p = _mm256_set1_ps(c[0]);
    for &ci in &c[1..] {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(ci));
    }
    p
}

/// `2^x` for the softmax's `x = s - max <= 0` (or `-inf`, or NaN): [`exp2_ps`]'s polynomial
/// and, for `x` in `[-126, 0]`, its result bit for bit (at the ties `x = k + 1/2`, where the
/// shifter's +127 makes it round to the other neighbour, within an ulp), in fewer instructions:
/// 6.0 cycles a vector in a loop on Zen 3 instead of 8.5. Rounding by the 1.5 · 2^23 shifter
/// replaces `vroundps` / `vcvtps2dq` (the rounded value's integer bits sit in the sum's
/// mantissa, already biased by 127), and there is no upper clamp and no lane mask: `x` is
/// raised to at least -127, whose `2^-127` is built as the bits of `+0.0`, so `-inf` and
/// everything up to -126.5 give exactly `0` (a fully masked row stays all zeros);
/// `(-126.5, -126)` gives the denormal `2^x` where [`exp2_ps`] gives `0`; NaN stays NaN.
/// `x > 0` is never asked for and gives garbage (`+inf`: NaN).
///
/// # Safety
/// AVX2 and FMA available (registers only).
#[inline(always)]
pub(crate) unsafe fn exp2_nonpositive_ps(x: __m256) -> __m256 {
    // 1.5 · 2^23 + 127: for x in [-127, 0], x + SHIFT lies in [2^23, 2^24), whose spacing is
    // 1, so the sum is round(x) + SHIFT exactly (ties to even, as `vroundps`) and its low
    // mantissa bits hold round(x) + 127 in 0 ..= 127.
    const SHIFT: f32 = 12_583_039.0;
    // `max` returns its second operand when either is NaN: NaN stays NaN.
    let x = _mm256_max_ps(_mm256_set1_ps(-127.0), x);
    let y = _mm256_add_ps(x, _mm256_set1_ps(SHIFT));
    let f = _mm256_sub_ps(x, _mm256_sub_ps(y, _mm256_set1_ps(SHIFT)));
    let p = horner(f, super::scalar::EXP2_POLY);
    // round(x) + 127 from the mantissa into the exponent field (the bits above it shift out).
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(y));
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// `e^x` for 8 lanes: `2^(x · log2 e)` with the rounding error of that product carried into
/// the polynomial's argument (an FMA and the low part of `log2 e`), so the result keeps
/// [`exp2_ps`]'s relative error (about 2e-7) instead of losing `|x| · 6e-8` to the product.
/// `0` below `x ≈ -87.3`, `+inf` above `x ≈ 88.7` (as `f32::exp`), NaN for NaN.
///
/// # Safety
/// AVX2 and FMA available (registers only).
#[inline(always)]
pub(crate) unsafe fn exp_ps(x: __m256) -> __m256 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // log2(e) - LOG2E, the part of log2 e that f32 cannot hold.
    const LOG2E_LO: f32 = 1.925_963e-8;
    let l = _mm256_set1_ps(LOG2E);
    let t = _mm256_mul_ps(x, l);
    let err = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E_LO), _mm256_fmsub_ps(x, l, t));
    let live = _mm256_cmp_ps::<_CMP_NLT_UQ>(t, _mm256_set1_ps(-126.0));
    let t_raw = t;
    let t = _mm256_min_ps(
        _mm256_set1_ps(127.0),
        _mm256_max_ps(_mm256_set1_ps(-126.0), t),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm256_add_ps(_mm256_sub_ps(t, n), err);
    let p = horner(f, super::scalar::EXP2_POLY);
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let r = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
    // Past 2^128: +inf (the exponent bits above cannot say it).
    let over = _mm256_cmp_ps::<_CMP_GT_OQ>(t_raw, _mm256_set1_ps(128.0));
    _mm256_blendv_ps(r, _mm256_set1_ps(f32::INFINITY), over)
}

/// The sum of the 8 lanes of `v`.
///
/// # Safety
/// AVX available (registers only).
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The largest of the 8 lanes of `v` (NaN lanes as `vmaxps` treats them: a NaN in the
/// second operand wins, so callers pass vectors without NaN or do not care).
///
/// # Safety
/// AVX available (registers only).
#[inline(always)]
pub(crate) unsafe fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The horizontal sums of 8 vectors in one: lane `j` = the sum of the 8 lanes of `v[j]`
/// (three `vhaddps` stages and one 128-bit lane exchange: 10 instructions for 8 sums).
///
/// # Safety
/// AVX available (registers only).
#[inline(always)]
pub(crate) unsafe fn sums_8(v: [__m256; 8]) -> __m256 {
    // Per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3].
    let ab = _mm256_hadd_ps(v[0], v[1]);
    let cd = _mm256_hadd_ps(v[2], v[3]);
    let ef = _mm256_hadd_ps(v[4], v[5]);
    let gh = _mm256_hadd_ps(v[6], v[7]);
    // Per 128-bit lane: the half sums of a, b, c, d (low lane: lanes 0-3, high: 4-7).
    let abcd = _mm256_hadd_ps(ab, cd);
    let efgh = _mm256_hadd_ps(ef, gh);
    // Low halves of both with the high halves of both.
    let lo = _mm256_permute2f128_ps::<0x20>(abcd, efgh);
    let hi = _mm256_permute2f128_ps::<0x31>(abcd, efgh);
    _mm256_add_ps(lo, hi)
}

/// The horizontal sums of 4 vectors: lane `j` = the sum of the 8 lanes of `v[j]`.
///
/// # Safety
/// AVX available (registers only).
#[inline(always)]
pub(crate) unsafe fn sums_4(v: [__m256; 4]) -> __m128 {
    let ab = _mm256_hadd_ps(v[0], v[1]);
    let cd = _mm256_hadd_ps(v[2], v[3]);
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(
        _mm256_castps256_ps128(abcd),
        _mm256_extractf128_ps::<1>(abcd),
    )
}

/// Transposes 8 rows of 8 floats: `out[c]` lane `r` = `r[r]` lane `c`.
///
/// # Safety
/// AVX available (registers only).
#[inline(always)]
pub(crate) unsafe fn transpose_8x8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_avx2() -> bool {
        crate::simd::Isa::get().level() >= crate::simd::IsaLevel::Avx2
    }

    /// `exp2_nonpositive_ps` against `exp2_ps` over [-126, 0] (bit for bit but at the ties),
    /// and its special values: `-inf`, -127 and below to exactly 0, NaN to NaN, -0 and 0 to 1.
    #[test]
    fn exp2_nonpositive_is_exp2_below_zero() {
        if !has_avx2() {
            return;
        }
        let eval = |f: unsafe fn(__m256) -> __m256, xs: &[f32]| {
            let mut out = [0f32; 8];
            // SAFETY: AVX2/FMA detected (the process level is at least AVX2); 8 floats each.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), f(_mm256_loadu_ps(xs.as_ptr()))) };
            out
        };
        // SAFETY (both): called by `eval` only after AVX2/FMA were detected.
        unsafe fn fast(x: __m256) -> __m256 {
            exp2_nonpositive_ps(x)
        }
        unsafe fn full(x: __m256) -> __m256 {
            exp2_ps(x)
        }
        // Every 2^-14 step of [-126, 0]; the ties of the rounding (k + 1/2) within an ulp.
        let xs: Vec<f32> = (0..=126 << 14).map(|i| -(i as f32) / 16384.0).collect();
        for chunk in xs.chunks_exact(8) {
            let (a, b) = (eval(fast, chunk), eval(full, chunk));
            for ((x, a), b) in chunk.iter().zip(a).zip(b) {
                let tie = (x * 2.0).fract() == 0.0 && x.fract() != 0.0;
                let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
                assert!(ulps <= i64::from(tie), "2^{x}: {a} vs {b}");
            }
        }
        let special = [
            f32::NEG_INFINITY,
            -127.0,
            -1000.0,
            -0.0,
            f32::NAN,
            -126.75,
            -126.0,
            0.0,
        ];
        let out = eval(fast, &special);
        assert_eq!(&out[..3], &[0.0; 3]);
        assert_eq!(out[3], 1.0);
        assert!(out[4].is_nan());
        assert_eq!(out[5], 0.0);
        let denormal = eval(fast, &[-126.25; 8])[0];
        assert!(denormal > 0.0 && (denormal - (-126.25f32).exp2()).abs() <= 1e-44);
        assert_eq!((out[6], out[7]), (2f32.powi(-126), 1.0));
    }

    /// `exp2_ps` against `f32::exp2` within 3e-7 over [-125, 25]; `-inf` and everything below
    /// -126 to exactly 0; 0 to exactly 1; NaN to NaN, `+inf` to 2^127; never a denormal.
    #[test]
    fn exp2_matches_std() {
        if !has_avx2() {
            return;
        }
        let eval = |xs: &[f32]| {
            let mut out = [0f32; 8];
            // SAFETY: AVX2/FMA detected (the process level is at least AVX2); 8 floats each.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp2_ps(_mm256_loadu_ps(xs.as_ptr()))) };
            out
        };
        let xs: Vec<f32> = (0..8 * 640).map(|i| -125.0 + i as f32 * 0.0293).collect();
        for chunk in xs.chunks(8) {
            for (x, y) in chunk.iter().zip(eval(chunk)) {
                let want = x.exp2();
                assert!(
                    (y - want).abs() <= 3e-7 * want.max(f32::MIN_POSITIVE),
                    "{x}: {y} vs {want}"
                );
                assert!(y == 0.0 || y.is_normal(), "{x}: {y}");
            }
        }
        let special = [
            f32::NEG_INFINITY,
            -126.5,
            -1000.0,
            0.0,
            f32::NAN,
            -0.0,
            f32::INFINITY,
            -126.0,
        ];
        let out = eval(&special);
        assert_eq!(&out[..3], &[0.0; 3]);
        assert_eq!((out[3], out[5]), (1.0, 1.0));
        assert!(out[4].is_nan());
        assert_eq!(out[6], 2f32.powi(127));
        assert_eq!(out[7], 2f32.powi(-126));
    }

    /// `exp_ps` against `f64::exp` within 3e-7 relative over [-87, 88]; +inf past 89.
    #[test]
    fn exp_matches_f64() {
        if !has_avx2() {
            return;
        }
        let xs: Vec<f32> = (0..8 * 2000).map(|i| -87.0 + i as f32 * 0.01093).collect();
        for chunk in xs.chunks(8) {
            let mut out = [0f32; 8];
            // SAFETY: AVX2/FMA detected; 8 floats each.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp_ps(_mm256_loadu_ps(chunk.as_ptr()))) };
            for (x, y) in chunk.iter().zip(out) {
                let want = (*x as f64).exp();
                assert!(
                    ((y as f64) - want).abs() <= 3e-7 * want,
                    "{x}: {y} vs {want}"
                );
            }
        }
        let mut out = [0f32; 8];
        let big = [
            89.0f32,
            100.0,
            f32::INFINITY,
            1e30,
            -1e30,
            f32::NEG_INFINITY,
            0.0,
            -88.0,
        ];
        // SAFETY: AVX2/FMA detected; 8 floats each.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp_ps(_mm256_loadu_ps(big.as_ptr()))) };
        assert_eq!(&out[..4], &[f32::INFINITY; 4]);
        assert_eq!(&out[4..7], &[0.0, 0.0, 1.0]);
    }

    #[test]
    fn partial_loads_and_stores_touch_only_their_lanes() {
        if !has_avx2() {
            return;
        }
        for n in 0..=8 {
            // Exactly n floats: a masked access past them would be out of bounds (ASan).
            let src: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            let mut dst = vec![-1.0f32; n];
            let mut out = [9f32; 8];
            // SAFETY: AVX2 detected; `src` and `dst` hold n floats, the lanes touched; `out` 8.
            unsafe {
                let v = load(n < 8, lanes8(n), src.as_ptr());
                _mm256_storeu_ps(out.as_mut_ptr(), v);
                store(n < 8, lanes8(n), dst.as_mut_ptr(), v);
            }
            for (i, &o) in out.iter().enumerate() {
                assert_eq!(o, if i < n { i as f32 + 1.0 } else { 0.0 });
            }
            assert_eq!(dst, src);
        }
    }

    #[test]
    fn transposes_and_sums_are_exact() {
        if !has_avx2() {
            return;
        }
        let m: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
        // SAFETY: AVX2 detected; every pointer is to 8 floats inside `m` or `out`.
        unsafe {
            let rows: [__m256; 8] = std::array::from_fn(|r| _mm256_loadu_ps(m.as_ptr().add(8 * r)));
            let t = transpose_8x8(rows);
            let mut out = [0f32; 64];
            for (c, v) in t.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *v);
            }
            for r in 0..8 {
                for c in 0..8 {
                    assert_eq!(out[c * 8 + r], m[r * 8 + c]);
                }
            }
            let mut s = [0f32; 8];
            _mm256_storeu_ps(s.as_mut_ptr(), sums_8(rows));
            let mut s4 = [0f32; 4];
            _mm_storeu_ps(
                s4.as_mut_ptr(),
                sums_4([rows[0], rows[1], rows[2], rows[3]]),
            );
            for r in 0..8 {
                let want: f32 = m[8 * r..8 * r + 8].iter().sum();
                assert_eq!(s[r], want);
                assert_eq!(hsum(rows[r]), want);
                assert_eq!(hmax(rows[r]), m[8 * r + 7]);
                if r < 4 {
                    assert_eq!(s4[r], want);
                }
            }
        }
    }
}

//! AVX-512 helpers shared by the micro-kernels of the tiled attention (`crate::sdpa::avx512`)
//! and of the projection GEMM (`crate::projection`): masked loads and stores, how they touch the
//! last, partial vector of a row without reading or writing past it, and a 16 × 16 transpose in
//! registers (query blocks; strips of a weight matrix read in place).
//!
//! All are `unsafe` and `#[inline(always)]` into callers compiled with
//! `#[target_feature(enable = "avx512f")]`; those callers are only reached through
//! [`super::Isa::Avx512`], which exists only after `is_x86_feature_detected!("avx512f")`.

use core::arch::x86_64::*;

/// Lanes `0 .. n` of a 16-lane mask (all of them for `n >= 16`): the lanes of a row's last,
/// partial vector.
#[inline(always)]
pub(crate) fn lanes16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// Lanes `0 .. n` of a 32-lane mask (all of them for `n >= 32`), for 16-bit elements.
#[inline(always)]
pub(crate) fn lanes32(n: usize) -> __mmask32 {
    if n >= 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

/// `p[..16]`, or only the lanes of `tail` (the others zero, not read) when `masked`.
///
/// # Safety
/// AVX-512F available; the lanes read are readable.
#[inline(always)]
pub(crate) unsafe fn load(masked: bool, tail: __mmask16, p: *const f32) -> __m512 {
    if masked {
        _mm512_maskz_loadu_ps(tail, p)
    } else {
        _mm512_loadu_ps(p)
    }
}

/// `p[..16] = a`, or only the lanes of `tail` (the others untouched) when `masked`.
///
/// # Safety
/// AVX-512F available; the lanes written are writable.
#[inline(always)]
pub(crate) unsafe fn store(masked: bool, tail: __mmask16, p: *mut f32, a: __m512) {
    if masked {
        _mm512_mask_storeu_ps(p, tail, a)
    } else {
        _mm512_storeu_ps(p, a)
    }
}

/// `2^x` for `x <= 0` (also right for positive `x`: `+inf` past 128), 16 lanes; anything below
/// -126 (including `-inf`) gives exactly `0`, NaN gives NaN. Relative error about 2e-7 (degree-6 polynomial on
/// `[-0.5, 0.5]`). Never produces a denormal: on Intel cores an underflowing `vscalefps`
/// takes a microcode assist (~100 cycles), which made masked tiles several times slower.
///
/// # Safety
/// AVX-512F available (it only computes on registers; no memory is touched).
#[inline(always)]
pub(crate) unsafe fn exp2_ps(x: __m512) -> __m512 {
    exp2_poly(x, super::scalar::EXP2_POLY)
}

/// [`exp2_ps`] with the degree-4 polynomial [`super::scalar::EXP2_POLY_BF16`] (relative error
/// 3.1e-6), for probabilities that are rounded to bf16 (relative error up to 2^-9) right
/// after: two multiply-adds fewer per 16 values.
///
/// # Safety
/// AVX-512F available (registers only).
#[inline(always)]
pub(crate) unsafe fn exp2_ps_bf16(x: __m512) -> __m512 {
    exp2_poly(x, super::scalar::EXP2_POLY_BF16)
}

/// `2^x` as [`exp2_ps`] describes, with `c` the coefficients (highest degree first) of the
/// polynomial approximating `2^f` on `[-0.5, 0.5]`.
///
/// # Safety
/// AVX-512F available (registers only).
#[inline(always)]
unsafe fn exp2_poly<const N: usize>(x: __m512, c: [f32; N]) -> __m512 {
    // NaN must stay NaN (a NaN or +inf score makes torch's row NaN, and ours): `NLT_UQ` is
    // true for NaN, and max returns its second operand when either is NaN. No upper clamp:
    // `vscalefps` saturates to +inf by itself (and softmax only ever passes x <= 0).
    let live = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-126.0));
    let x = _mm512_max_ps(_mm512_set1_ps(-126.0), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(c[0]);
    for &ci in &c[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(ci));
    }
    _mm512_maskz_scalef_ps(live, p, n)
}

/// Transposes 16 rows of 16 floats: `out[c]` lane `r` = `rows[r]` lane `c`.
///
/// # Safety
/// AVX-512F available (registers only).
#[inline(always)]
pub(crate) unsafe fn transpose_16x16(r: [__m512; 16]) -> [__m512; 16] {
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    // Stage 1: interleave 32-bit pairs of rows (2k, 2k + 1) within 128-bit lanes.
    let mut t = [_mm512_setzero_ps(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    // Stage 2: interleave 64-bit pairs: u[4k + j] holds column j (mod 4) of rows 4k .. 4k + 4.
    let mut u = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        let (a, b, c, e) = (t[4 * k], t[4 * k + 1], t[4 * k + 2], t[4 * k + 3]);
        u[4 * k] = ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        u[4 * k + 1] = ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        u[4 * k + 2] = ps(_mm512_unpacklo_pd(pd(b), pd(e)));
        u[4 * k + 3] = ps(_mm512_unpackhi_pd(pd(b), pd(e)));
    }
    // Stages 3 and 4: gather the 128-bit lanes (0x88: lanes 0, 2 of each; 0xdd: lanes 1, 3).
    let mut v = [_mm512_setzero_ps(); 16];
    for j in 0..4 {
        v[j] = _mm512_shuffle_f32x4::<0x88>(u[j], u[4 + j]);
        v[4 + j] = _mm512_shuffle_f32x4::<0xdd>(u[j], u[4 + j]);
        v[8 + j] = _mm512_shuffle_f32x4::<0x88>(u[8 + j], u[12 + j]);
        v[12 + j] = _mm512_shuffle_f32x4::<0xdd>(u[8 + j], u[12 + j]);
    }
    let mut out = [_mm512_setzero_ps(); 16];
    for j in 0..4 {
        out[j] = _mm512_shuffle_f32x4::<0x88>(v[j], v[8 + j]);
        out[4 + j] = _mm512_shuffle_f32x4::<0x88>(v[4 + j], v[12 + j]);
        out[8 + j] = _mm512_shuffle_f32x4::<0xdd>(v[j], v[8 + j]);
        out[12 + j] = _mm512_shuffle_f32x4::<0xdd>(v[4 + j], v[12 + j]);
    }
    out
}

/// The horizontal sums of 16 vectors in one: lane `j` = the sum of the 16 lanes of `v[j]`.
/// Four halving stages (unpack 32-bit, unpack 64-bit, two 128-bit lane shuffles), 45
/// instructions for the 16 sums where a `_mm512_reduce_add_ps` each would take about 130.
///
/// # Safety
/// AVX-512F available (registers only).
#[inline(always)]
pub(crate) unsafe fn sums_16(v: [__m512; 16]) -> __m512 {
    let pd = _mm512_castps_pd;
    let ps = _mm512_castpd_ps;
    // Stage 1: per 128-bit lane, [a0 + a2, b0 + b2, a1 + a3, b1 + b3] for the pair (a, b).
    let s: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    // Stage 2: per 128-bit lane, the partial sums of four vectors, in order.
    let u: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (pd(s[2 * q]), pd(s[2 * q + 1]));
        _mm512_add_ps(ps(_mm512_unpacklo_pd(a, b)), ps(_mm512_unpackhi_pd(a, b)))
    });
    // Stages 3 and 4: add the 128-bit lanes pairwise (0x88 takes lanes 0 and 2 of each
    // operand, 0xdd lanes 1 and 3), twice.
    let w: [__m512; 2] = std::array::from_fn(|h| {
        let (a, b) = (u[2 * h], u[2 * h + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xdd>(a, b),
        )
    });
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0x88>(w[0], w[1]),
        _mm512_shuffle_f32x4::<0xdd>(w[0], w[1]),
    )
}

/// The sum of the 16 lanes of `v`, added in the order [`sums_16`] adds each vector's lanes
/// (lanes `j` and `j + 2` of each 128-bit lane, then the pairs, then the 128-bit lanes 0 + 1 and
/// 2 + 3, then those two): a kernel that sums some outputs 16 at a time and the rest one by one
/// gives every output the same rounding, so an output does not depend on which tile, that is
/// which other rows of the batch, it was computed with.
///
/// # Safety
/// AVX-512F available (registers only).
#[inline(always)]
pub(crate) unsafe fn sum_16_lanes(v: __m512) -> f32 {
    let t = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
    let t = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b10_11_00_01>(t, t));
    let t = _mm512_add_ps(t, _mm512_shuffle_f32x4::<0b01_00_11_10>(t, t));
    _mm512_cvtss_f32(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked load reads only the lanes of the mask and zeroes the rest; a masked store
    /// writes only those lanes. The buffers are exactly as long as the lanes touched, so an
    /// out-of-bounds access would show under AddressSanitizer (scripts/sanitize.sh).
    #[test]
    fn masked_loads_and_stores_touch_only_the_tail() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for n in 1..16usize {
            let tail: __mmask16 = ((1u32 << n) - 1) as u16;
            let src: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            let mut dst = vec![-1.0f32; n];
            let mut lanes = [0f32; 16];
            // SAFETY: AVX-512F was detected above; the mask covers exactly the `n` lanes
            // `src` and `dst` hold, and `lanes` is 16 floats for the unmasked store.
            unsafe {
                let v = load(true, tail, src.as_ptr());
                _mm512_storeu_ps(lanes.as_mut_ptr(), v);
                store(true, tail, dst.as_mut_ptr(), _mm512_add_ps(v, v));
            }
            assert_eq!(&lanes[..n], src.as_slice());
            assert!(
                lanes[n..].iter().all(|&x| x == 0.0),
                "lanes past the tail are zero"
            );
            let doubled: Vec<f32> = src.iter().map(|x| 2.0 * x).collect();
            assert_eq!(dst, doubled);
        }
        let full: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let mut out = [0f32; 16];
        // SAFETY: AVX-512F was detected above; both buffers hold 16 floats.
        unsafe { store(false, 0, out.as_mut_ptr(), load(false, 0, full.as_ptr())) };
        assert_eq!(out.as_slice(), full.as_slice());
    }
    #[test]
    fn one_vector_sums_as_sums_16_does() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        // Values whose sums round differently in different orders.
        let data: Vec<f32> = (0..256)
            .map(|i| ((i * 7919) % 1013) as f32 * 1.0e-3 * if i % 3 == 0 { 1.0e4 } else { 1.0 })
            .collect();
        // SAFETY: AVX-512F was detected above; `data` holds 16 vectors.
        unsafe {
            let v: [__m512; 16] =
                std::array::from_fn(|j| _mm512_loadu_ps(data.as_ptr().add(16 * j)));
            let mut all = [0f32; 16];
            _mm512_storeu_ps(all.as_mut_ptr(), sums_16(v));
            for (j, want) in all.iter().enumerate() {
                assert_eq!(sum_16_lanes(v[j]).to_bits(), want.to_bits(), "vector {j}");
            }
        }
    }

    #[test]
    fn sums_16_adds_each_vector_into_its_lane() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        // Integers below 2^24 / 16: every sum is exact whatever the order.
        let data: Vec<f32> = (0..256).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut got = [0f32; 16];
        // SAFETY: AVX-512F was detected above; `data` holds 16 vectors, `got` one.
        unsafe {
            let v = std::array::from_fn(|j| _mm512_loadu_ps(data.as_ptr().add(16 * j)));
            _mm512_storeu_ps(got.as_mut_ptr(), sums_16(v));
        }
        let want: Vec<f32> = data.chunks(16).map(|c| c.iter().sum()).collect();
        assert_eq!(got.as_slice(), want.as_slice());
    }
}

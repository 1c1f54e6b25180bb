//! Passes over one long row of scores (a vocabulary: 58101 floats for opus-mt), as the
//! generation loops make them every step for every hypothesis: `log_softmax` in place, the
//! first maximum, and the scan for values above a threshold that top-k selection needs.
//!
//! At beam-search sizes (32 rows × 58101) these passes took as long as the model's step with
//! scalar `exp`; here they use AVX-512 where the CPU has it, with plain loops as the fallback.
//! Both give the same results up to the rounding of `exp` (the vector `2^x` polynomial has a
//! relative error of about 2e-7; torch's vectorised `exp` differs from libm's in the last bits
//! too) and the order of the sum.

use super::isa::Isa;

/// `log_softmax` as torch computes it in `f32`: `(x - max) - ln Σ exp(x - max)`, in place.
/// NaN is skipped by the maximum (as `f32::max` does); a row that is all `-inf` becomes NaN, as
/// in torch (callers that want it to stay `-inf` check first).
pub(crate) fn log_softmax_in_place(row: &mut [f32]) {
    log_softmax_with(Isa::get(), row)
}

/// [`log_softmax_in_place`] with the kernel of `isa`.
pub(crate) fn log_softmax_with(isa: Isa, row: &mut [f32]) {
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::log_softmax_in_place(row) },
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::log_softmax_in_place(row) },
        Isa::Portable => log_softmax_portable(row),
    }
}

/// Lanes of the portable passes' accumulator arrays.
const L: usize = 8;

/// The portable `log_softmax`: 8-lane partial maxima and sums (vectorised by the compiler),
/// `exp` as the vector kernels' `2^x` polynomial ([`super::exp2`]).
fn log_softmax_portable(row: &mut [f32]) {
    let max = max_ignoring_nan_portable(row);
    let mut sums = [0f32; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for j in 0..L {
            sums[j] += super::scalar::exp2::<false>((c[j] - max) * std::f32::consts::LOG2_E);
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for &x in chunks.remainder() {
        sum += super::scalar::exp2::<false>((x - max) * std::f32::consts::LOG2_E);
    }
    let log_sum = sum.ln();
    for x in row.iter_mut() {
        *x = (*x - max) - log_sum;
    }
}

/// The maximum of `row` ignoring NaN (`-inf` for a row without any other value), 8 lanes at a
/// time.
fn max_ignoring_nan_portable(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for j in 0..L {
            // `>` is false for NaN: NaN is skipped (a compare and a select per lane).
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    let mut m = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &x in chunks.remainder() {
        m = m.max(x);
    }
    m
}

/// `torch.argmax` of a row: the first maximum; NaN counts as larger than everything (the first
/// NaN wins); 0 for an empty row.
pub(crate) fn argmax(row: &[f32]) -> usize {
    argmax_with(Isa::get(), row)
}

/// [`argmax`] with the kernel of `isa`.
pub(crate) fn argmax_with(isa: Isa, row: &[f32]) -> usize {
    let fast = match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::argmax_without_nan(row) },
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::argmax_without_nan(row) },
        Isa::Portable => argmax_without_nan_portable(row),
    };
    fast.unwrap_or_else(|| argmax_scalar(row))
}

/// The first maximum of a row without NaN (8-lane maxima, then the first lane equal to the
/// maximum), or `None` when the row holds a NaN or is empty.
fn argmax_without_nan_portable(row: &[f32]) -> Option<usize> {
    if row.is_empty() || row.iter().any(|x| x.is_nan()) {
        return None;
    }
    let max = max_ignoring_nan_portable(row);
    row.iter().position(|&x| x == max)
}

/// The plain definition (NaN first), what every kernel must equal.
fn argmax_scalar(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate().skip(1) {
        let b = row[best];
        if !b.is_nan() && (x.is_nan() || x > b) {
            best = i;
        }
    }
    best
}

/// The first index `i >= from` whose value is NaN or greater than `threshold`, if any: what
/// a top-k selection whose `k`-th best is `threshold` must look at (everything else is skipped
/// a vector at a time).
pub(crate) fn next_above(row: &[f32], from: usize, threshold: f32) -> Option<usize> {
    next_above_with(Isa::get(), row, from, threshold)
}

/// [`next_above`] with the kernel of `isa`.
pub(crate) fn next_above_with(isa: Isa, row: &[f32], from: usize, threshold: f32) -> Option<usize> {
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::next_above(row, from, threshold) },
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::next_above(row, from, threshold) },
        Isa::Portable => next_above_portable(row, from, threshold),
    }
}

/// [`next_above`], 8 values at a time: a chunk is looked into only when one of its lanes hits.
fn next_above_portable(row: &[f32], from: usize, threshold: f32) -> Option<usize> {
    // Not less or equal: above the threshold, or NaN on either side (as the vector compares).
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // NaN must count as a hit
    let hit = |v: f32| !(v <= threshold);
    let rest = row.get(from..)?;
    let mut chunks = rest.chunks_exact(L);
    for (ci, c) in (&mut chunks).enumerate() {
        let mut any = false;
        for &v in c {
            any |= hit(v);
        }
        if any {
            return c.iter().position(|&v| hit(v)).map(|j| from + ci * L + j);
        }
    }
    let tail = rest.len() / L * L;
    chunks
        .remainder()
        .iter()
        .position(|&v| hit(v))
        .map(|j| from + tail + j)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::simd::avx2::{exp2_ps, hmax, hsum, lanes8};
    use core::arch::x86_64::*;

    /// The last, partial vector of a row: `c.len() < 8` floats, the other lanes `fill`.
    ///
    /// # Safety
    /// AVX2 available.
    #[inline(always)]
    unsafe fn load_tail(c: &[f32], fill: f32) -> (__m256, __m256i) {
        let mask = lanes8(c.len());
        // SAFETY: the masked load reads only the c.len() floats of the chunk.
        let x = _mm256_maskload_ps(c.as_ptr(), mask);
        (
            _mm256_blendv_ps(_mm256_set1_ps(fill), x, _mm256_castsi256_ps(mask)),
            mask,
        )
    }

    /// The maximum of `row` ignoring NaN (`-inf` for a row without any other value).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn max_ignoring_nan(row: &[f32]) -> f32 {
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut acc = [ninf; 4];
        let mut chunks = row.chunks_exact(32);
        for c in &mut chunks {
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: 8 floats at 8 v within the 32 of the chunk. `max(x, a)` returns
                // `a` when `x` is NaN: NaN is skipped.
                *a = _mm256_max_ps(_mm256_loadu_ps(c.as_ptr().add(8 * v)), *a);
            }
        }
        for c in chunks.remainder().chunks(8) {
            let (x, _) = load_tail_or_full(c, f32::NEG_INFINITY);
            acc[0] = _mm256_max_ps(x, acc[0]);
        }
        hmax(_mm256_max_ps(
            _mm256_max_ps(acc[0], acc[1]),
            _mm256_max_ps(acc[2], acc[3]),
        ))
    }

    /// A chunk of at most 8 floats as a vector (the lanes past it `fill`).
    ///
    /// # Safety
    /// AVX2 available.
    #[inline(always)]
    unsafe fn load_tail_or_full(c: &[f32], fill: f32) -> (__m256, __m256i) {
        if c.len() == 8 {
            // SAFETY: 8 floats.
            (_mm256_loadu_ps(c.as_ptr()), _mm256_set1_epi32(-1))
        } else {
            load_tail(c, fill)
        }
    }

    /// See [`super::log_softmax_in_place`].
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn log_softmax_in_place(row: &mut [f32]) {
        let max = max_ignoring_nan(row);
        let (m, l2e) = (
            _mm256_set1_ps(max),
            _mm256_set1_ps(std::f32::consts::LOG2_E),
        );
        let mut sums = [_mm256_setzero_ps(); 4];
        let mut chunks = row.chunks_exact(32);
        for c in &mut chunks {
            for (v, s) in sums.iter_mut().enumerate() {
                // SAFETY: 8 floats at 8 v within the 32 of the chunk.
                let x = _mm256_loadu_ps(c.as_ptr().add(8 * v));
                *s = _mm256_add_ps(*s, exp2_ps(_mm256_mul_ps(_mm256_sub_ps(x, m), l2e)));
            }
        }
        for c in chunks.remainder().chunks(8) {
            // The lanes past the row are -inf, whose exp is exactly 0.
            let (x, _) = load_tail_or_full(c, f32::NEG_INFINITY);
            sums[0] = _mm256_add_ps(sums[0], exp2_ps(_mm256_mul_ps(_mm256_sub_ps(x, m), l2e)));
        }
        let sum = hsum(_mm256_add_ps(
            _mm256_add_ps(sums[0], sums[1]),
            _mm256_add_ps(sums[2], sums[3]),
        ));
        let ls = _mm256_set1_ps(sum.ln());
        // Whole vectors with plain loads and stores (a masked store is microcoded on AMD
        // cores), the tail masked.
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: 8 floats.
            let x = _mm256_loadu_ps(c.as_ptr());
            _mm256_storeu_ps(c.as_mut_ptr(), _mm256_sub_ps(_mm256_sub_ps(x, m), ls));
        }
        let c = chunks.into_remainder();
        if !c.is_empty() {
            let mask = lanes8(c.len());
            // SAFETY: the masked load and store touch only the c.len() floats of the tail.
            let x = _mm256_maskload_ps(c.as_ptr(), mask);
            _mm256_maskstore_ps(c.as_mut_ptr(), mask, _mm256_sub_ps(_mm256_sub_ps(x, m), ls));
        }
    }

    /// The first maximum of a row without NaN, or `None` when the row holds a NaN (the caller
    /// then applies torch's NaN rule) or is empty.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn argmax_without_nan(row: &[f32]) -> Option<usize> {
        if row.is_empty() {
            return None;
        }
        let mut nan = _mm256_setzero_ps();
        for c in row.chunks(8) {
            let (x, _) = load_tail_or_full(c, 0.0);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        }
        if _mm256_movemask_ps(nan) != 0 {
            return None;
        }
        let max = _mm256_set1_ps(max_ignoring_nan(row));
        for (b, c) in row.chunks(8).enumerate() {
            let (x, mask) = load_tail_or_full(c, f32::NEG_INFINITY);
            let hit = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_EQ_OQ>(x, max),
                _mm256_castsi256_ps(mask),
            );
            let bits = _mm256_movemask_ps(hit);
            if bits != 0 {
                return Some(8 * b + bits.trailing_zeros() as usize);
            }
        }
        None
    }

    /// See [`super::next_above`].
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn next_above(row: &[f32], from: usize, threshold: f32) -> Option<usize> {
        let t = _mm256_set1_ps(threshold);
        let rest = row.get(from..)?;
        for (b, c) in rest.chunks(8).enumerate() {
            let (x, mask) = load_tail_or_full(c, f32::NEG_INFINITY);
            // Not-less-or-equal, unordered: greater than the threshold, or NaN (either side).
            let hit = _mm256_cmp_ps::<_CMP_NLE_UQ>(x, t);
            let bits = _mm256_movemask_ps(_mm256_and_ps(hit, _mm256_castsi256_ps(mask)));
            if bits != 0 {
                return Some(from + 8 * b + bits.trailing_zeros() as usize);
            }
        }
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::simd::avx512::{exp2_ps, lanes16 as lanes};
    use core::arch::x86_64::*;

    /// The maximum of `row` ignoring NaN (`-inf` for a row without any other value).
    #[target_feature(enable = "avx512f")]
    unsafe fn max_ignoring_nan(row: &[f32]) -> f32 {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut acc = [ninf; 4];
        let mut chunks = row.chunks_exact(64);
        for c in &mut chunks {
            for (v, a) in acc.iter_mut().enumerate() {
                // SAFETY: 16 floats at 16 v within the 64 of the chunk. `max(x, a)` returns
                // `a` when `x` is NaN: NaN is skipped.
                *a = _mm512_max_ps(_mm512_loadu_ps(c.as_ptr().add(16 * v)), *a);
            }
        }
        for c in chunks.remainder().chunks(16) {
            // SAFETY: the masked load reads only the c.len() floats of the chunk.
            let x = _mm512_mask_loadu_ps(ninf, lanes(c.len()), c.as_ptr());
            acc[0] = _mm512_max_ps(x, acc[0]);
        }
        let m = _mm512_max_ps(_mm512_max_ps(acc[0], acc[1]), _mm512_max_ps(acc[2], acc[3]));
        _mm512_reduce_max_ps(m)
    }

    /// See [`super::log_softmax_in_place`].
    ///
    /// # Safety
    /// AVX-512F available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn log_softmax_in_place(row: &mut [f32]) {
        let max = max_ignoring_nan(row);
        let (m, l2e) = (
            _mm512_set1_ps(max),
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        );
        let mut sums = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i + 64 <= row.len() {
            for (v, s) in sums.iter_mut().enumerate() {
                // SAFETY: 16 floats at i + 16 v <= row.len() - 16.
                let x = _mm512_loadu_ps(row.as_ptr().add(i + 16 * v));
                *s = _mm512_add_ps(*s, exp2_ps(_mm512_mul_ps(_mm512_sub_ps(x, m), l2e)));
            }
            i += 64;
        }
        while i < row.len() {
            let mask = lanes(row.len() - i);
            // SAFETY: the masked load reads only the floats left in the row; the other lanes
            // are -inf, whose exp is exactly 0.
            let x =
                _mm512_mask_loadu_ps(_mm512_set1_ps(f32::NEG_INFINITY), mask, row.as_ptr().add(i));
            sums[0] = _mm512_add_ps(
                sums[0],
                _mm512_maskz_mov_ps(mask, exp2_ps(_mm512_mul_ps(_mm512_sub_ps(x, m), l2e))),
            );
            i += 16;
        }
        let sum = _mm512_reduce_add_ps(_mm512_add_ps(
            _mm512_add_ps(sums[0], sums[1]),
            _mm512_add_ps(sums[2], sums[3]),
        ));
        let ls = _mm512_set1_ps(sum.ln());
        for c in row.chunks_mut(16) {
            let mask = lanes(c.len());
            // SAFETY: the masked load and store touch only the c.len() floats of the chunk.
            let x = _mm512_maskz_loadu_ps(mask, c.as_ptr());
            _mm512_mask_storeu_ps(c.as_mut_ptr(), mask, _mm512_sub_ps(_mm512_sub_ps(x, m), ls));
        }
    }

    /// The first maximum of a row without NaN, or `None` when the row holds a NaN (the caller
    /// then applies torch's NaN rule) or is empty.
    ///
    /// # Safety
    /// AVX-512F available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn argmax_without_nan(row: &[f32]) -> Option<usize> {
        if row.is_empty() {
            return None;
        }
        for c in row.chunks(16) {
            // SAFETY: the masked load reads only the c.len() floats of the chunk.
            let x = _mm512_maskz_loadu_ps(lanes(c.len()), c.as_ptr());
            if _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x) != 0 {
                return None;
            }
        }
        let max = _mm512_set1_ps(max_ignoring_nan(row));
        for (b, c) in row.chunks(16).enumerate() {
            // SAFETY: as above.
            let x = _mm512_maskz_loadu_ps(lanes(c.len()), c.as_ptr());
            let hit = _mm512_mask_cmp_ps_mask::<_CMP_EQ_OQ>(lanes(c.len()), x, max);
            if hit != 0 {
                return Some(16 * b + hit.trailing_zeros() as usize);
            }
        }
        None
    }

    /// See [`super::next_above`].
    ///
    /// # Safety
    /// AVX-512F available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn next_above(row: &[f32], from: usize, threshold: f32) -> Option<usize> {
        let t = _mm512_set1_ps(threshold);
        let mut i = from;
        while i < row.len() {
            let mask = lanes(row.len() - i);
            // SAFETY: the masked load reads only the floats left in the row.
            let x = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(i));
            // Not-less-or-equal, unordered: greater than the threshold, or NaN (either side).
            let hit = _mm512_mask_cmp_ps_mask::<_CMP_NLE_UQ>(mask, x, t);
            if hit != 0 {
                return Some(i + hit.trailing_zeros() as usize);
            }
            i += 16;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of awkward lengths and contents: ties, -inf, a large spread.
    fn rows() -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for len in [1usize, 5, 16, 17, 63, 64, 65, 200, 1000] {
            let row: Vec<f32> = (0..len)
                .map(|i| ((i * 7919 % 113) as f32 - 56.0) * 0.37)
                .collect();
            out.push(row.clone());
            let mut with_inf = row;
            for i in (0..len).step_by(3) {
                with_inf[i] = f32::NEG_INFINITY;
            }
            out.push(with_inf);
        }
        out
    }

    /// Every kernel against the formula in f64 (the rounding of `exp` and the order of the sum
    /// differ, by far less than 1e-5).
    #[test]
    fn log_softmax_agrees_with_the_formula_at_every_level() {
        for isa in crate::simd::isas() {
            for row in rows() {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
                let mut fast = row.clone();
                log_softmax_with(isa, &mut fast);
                for (i, (a, x)) in fast.iter().zip(&row).enumerate() {
                    let b = ((*x as f64 - max) - sum.ln()) as f32;
                    assert!(
                        a == &b
                            || (a.is_nan() && b.is_nan())
                            || (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{isa:?} len {} index {i}: {a} vs {b}",
                        row.len()
                    );
                }
            }
            let mut all_inf = vec![f32::NEG_INFINITY; 19];
            log_softmax_with(isa, &mut all_inf);
            assert!(all_inf.iter().all(|x| x.is_nan()), "{isa:?}: as torch");
        }
    }

    #[test]
    fn argmax_is_torchs_at_every_level() {
        for isa in crate::simd::isas() {
            let argmax = |r: &[f32]| argmax_with(isa, r);
            for row in rows() {
                assert_eq!(argmax(&row), argmax_scalar(&row), "{isa:?} {row:?}");
            }
            assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
            assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), 0);
            assert_eq!(argmax(&[]), 0);
            let mut nan = vec![1.0f32; 40];
            nan[33] = f32::NAN;
            nan[35] = f32::NAN;
            nan[20] = 5.0;
            assert_eq!(argmax(&nan), 33);
            let mut late = vec![0.0f32; 37];
            late[36] = 1.0;
            assert_eq!(argmax(&late), 36);
        }
    }

    #[test]
    fn next_above_finds_the_first_value_over_the_threshold_or_nan() {
        for isa in crate::simd::isas() {
            let next = |r: &[f32], from, t| next_above_with(isa, r, from, t);
            let mut row = vec![0.0f32; 50];
            row[40] = 2.0;
            assert_eq!(next(&row, 0, 1.0), Some(40));
            assert_eq!(next(&row, 41, 1.0), None);
            assert_eq!(next(&row, 0, 2.0), None, "equal is not above");
            row[45] = f32::NAN;
            assert_eq!(next(&row, 41, 1.0), Some(45));
            assert_eq!(next(&row, 50, -1.0), None);
            assert_eq!(next(&row, 51, -1.0), None);
            assert_eq!(next(&row, 3, -1.0), Some(3));
            assert_eq!(next(&row[..43], 41, f32::NAN), Some(41), "{isa:?}");
            assert_eq!(
                next(&row[..43], 43, f32::NAN),
                None,
                "{isa:?}: nothing past the end"
            );
            for (len, from) in [(17, 9), (33, 0), (64, 63), (7, 2)] {
                let r: Vec<f32> = (0..len).map(|i| (i % 5) as f32).collect();
                let want = (from..len).find(|&i| r[i] > 3.5);
                assert_eq!(next(&r, from, 3.5), want, "{isa:?} {len} {from}");
            }
        }
    }
}

//! Passes over one long row of scores (a vocabulary: 58101 floats for opus-mt), as the
//! generation loops make them every step for every hypothesis: `log_softmax` in place, the
//! first maximum, and the scan for values above a threshold that top-k selection needs.
//!
//! At beam-search sizes (32 rows × 58101) these passes took as long as the model's step with
//! scalar `exp`; here they use AVX-512 where the CPU has it, with plain loops as the fallback.
//! Both give the same results up to the rounding of `exp` (the vector `2^x` polynomial has a
//! relative error of about 2e-7; torch's vectorised `exp` differs from libm's in the last bits
//! too) and the order of the sum.

use super::Isa;

/// `log_softmax` as torch computes it in `f32`: `(x - max) - ln Σ exp(x - max)`, in place.
/// NaN is skipped by the maximum (as `f32::max` does); a row that is all `-inf` becomes NaN, as
/// in torch (callers that want it to stay `-inf` check first).
pub(crate) fn log_softmax_in_place(row: &mut [f32]) {
    match Isa::detect(false) {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::log_softmax_in_place(row) },
        _ => log_softmax_portable(row),
    }
}

fn log_softmax_portable(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = row.iter().map(|&x| (x - max).exp()).sum();
    let log_sum = sum.ln();
    for x in row.iter_mut() {
        *x = (*x - max) - log_sum;
    }
}

/// `torch.argmax` of a row: the first maximum; NaN counts as larger than everything (the first
/// NaN wins); 0 for an empty row.
pub(crate) fn argmax(row: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect(false) == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        if let Some(i) = unsafe { avx512::argmax_without_nan(row) } {
            return i;
        }
    }
    argmax_portable(row)
}

fn argmax_portable(row: &[f32]) -> usize {
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
/// 16 values at a time).
pub(crate) fn next_above(row: &[f32], from: usize, threshold: f32) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect(false) == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected.
        return unsafe { avx512::next_above(row, from, threshold) };
    }
    row.iter()
        .enumerate()
        .skip(from)
        .find(|(_, &v)| v.is_nan() || v > threshold)
        .map(|(i, _)| i)
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

    #[test]
    fn log_softmax_agrees_with_the_scalar_formula() {
        for row in rows() {
            let mut fast = row.clone();
            log_softmax_in_place(&mut fast);
            let mut slow = row.clone();
            log_softmax_portable(&mut slow);
            for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
                assert!(
                    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "len {} index {i}: {a} vs {b}",
                    row.len()
                );
            }
        }
    }

    #[test]
    fn argmax_is_torchs() {
        for row in rows() {
            assert_eq!(argmax(&row), argmax_portable(&row), "{row:?}");
        }
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 20]), 0);
        let mut nan = vec![1.0f32; 40];
        nan[33] = f32::NAN;
        nan[35] = f32::NAN;
        nan[20] = 5.0;
        assert_eq!(argmax(&nan), 33);
        let mut late = vec![0.0f32; 37];
        late[36] = 1.0;
        assert_eq!(argmax(&late), 36);
    }

    #[test]
    fn next_above_finds_the_first_value_over_the_threshold_or_nan() {
        let mut row = vec![0.0f32; 50];
        row[40] = 2.0;
        assert_eq!(next_above(&row, 0, 1.0), Some(40));
        assert_eq!(next_above(&row, 41, 1.0), None);
        assert_eq!(next_above(&row, 0, 2.0), None, "equal is not above");
        row[45] = f32::NAN;
        assert_eq!(next_above(&row, 41, 1.0), Some(45));
        assert_eq!(next_above(&row, 50, -1.0), None);
        assert_eq!(next_above(&row, 3, -1.0), Some(3));
    }
}

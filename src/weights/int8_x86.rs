//! The weight quantizer's panel kernels for x86-64 (AVX-512F, AVX2), written with intrinsics.
//!
//! Each gives exactly the bytes, scales and sums of the portable definition
//! ([`super::int8_rule::quantize_value`], [`super::int8_rule::row_scale`]): the largest magnitude is
//! taken over the bits of `|v|` as unsigned integers (the same order as the floats' for
//! finite values, and every NaN or infinity above every finite value, so a row holding one
//! gets a non-finite maximum, which [`super::int8_rule::scale_for_max`] refuses), and each
//! value is rounded by adding [`super::int8_rule::ROUNDING_MAGIC`] as the portable code does,
//! then read from the sum's bits.
//!
//! Why not the portable loop compiled for each level: it reached 45 ms per 100 M weights at
//! the AVX-512 level (AMD EPYC Zen 4, 2 threads), where reading the f32 values and writing
//! the bytes takes 17: the compiler turned the per-group copies into `vpscatterdd` (microcoded
//! on Zen 4, 20% of the samples) and the NaN-aware `f32::max` into blends and lane inserts.
//! Here every group of 4 bytes is one 32-bit store.

use super::int8_rule::{quantize_value, scale_for_max, INT8_GROUP, INT8_PANEL, ROUNDING_MAGIC};
use std::arch::x86_64::*;

/// The bits of [`ROUNDING_MAGIC`]: a rounded sum's bits less these are `q`.
const MAGIC_BITS: i32 = ROUNDING_MAGIC.to_bits() as i32;

/// Byte offset of group `g` of row `r` in a panel.
#[inline(always)]
fn group_at(g: usize, r: usize) -> usize {
    (g * INT8_PANEL + r) * INT8_GROUP
}

/// Quantizes values `from..` of a row (the tail past the vectors) one by one into the panel,
/// returning their sum.
#[inline(always)]
fn quantize_tail(values: &[f32], from: usize, inv: f32, panel: &mut [i8], r: usize) -> i32 {
    let mut sum = 0;
    for (c, &v) in values.iter().enumerate().skip(from) {
        let q = quantize_value(v, inv);
        panel[group_at(c / INT8_GROUP, r) + c % INT8_GROUP] = q;
        sum += q as i32;
    }
    sum
}

/// Checks a panel's slices (as `super::int8::quantize_panel` takes them): its row count.
#[inline(always)]
fn panel_rows(w: &[f32], cols: usize, panel: &[i8], scales: &[f32], sums: &[i32]) -> usize {
    let groups = cols.div_ceil(INT8_GROUP);
    assert!(w.len() >= scales.len() * cols && sums.len() == scales.len());
    assert!(scales.len() <= INT8_PANEL && panel.len() >= groups * INT8_PANEL * INT8_GROUP);
    scales.len()
}

/// Pass 1 of both kernels: each row's scale (into `scales`) and `127 / max|v|` (into `invs`),
/// the rows read one after the other (one sequential stream: the read from memory).
/// `body_max` gives the largest `|v|` bits of a row's first `body` values, by vectors; the
/// rest are taken one by one. `Err(r)`: row `r` holds a NaN or an infinity.
#[inline(always)]
fn row_scales(
    w: &[f32],
    cols: usize,
    body: usize,
    scales: &mut [f32],
    invs: &mut [f32; INT8_PANEL],
    body_max: impl Fn(&[f32]) -> u32,
) -> std::result::Result<(), usize> {
    for (r, (scale, inv)) in scales.iter_mut().zip(invs.iter_mut()).enumerate() {
        let values = &w[r * cols..(r + 1) * cols];
        let tail = values[body..].iter().map(|v| v.to_bits() & 0x7fff_ffff);
        let bits = tail.fold(body_max(&values[..body]), u32::max);
        // The largest bits are the largest magnitude's (a NaN's or an infinity's too, which
        // `scale_for_max` refuses).
        (*scale, *inv) = scale_for_max(f32::from_bits(bits)).ok_or(r)?;
    }
    Ok(())
}

/// The largest `|v|` bits of `v` (a multiple of 16 values), 16 lanes at a time with four
/// accumulators (so that the loads bound it, not the max).
///
/// # Safety
/// AVX-512F is available.
#[target_feature(enable = "avx512f,avx2")]
unsafe fn max_bits_avx512(v: &[f32]) -> u32 {
    let abs = _mm512_set1_epi32(0x7fff_ffff);
    let p = v.as_ptr();
    let mut m = [_mm512_setzero_si512(); 4];
    let mut c = 0;
    while c + 64 <= v.len() {
        for (j, m) in m.iter_mut().enumerate() {
            let x = _mm512_loadu_si512(p.add(c + 16 * j) as *const __m512i);
            *m = _mm512_max_epu32(*m, _mm512_and_si512(x, abs));
        }
        c += 64;
    }
    while c + 16 <= v.len() {
        let x = _mm512_loadu_si512(p.add(c) as *const __m512i);
        m[0] = _mm512_max_epu32(m[0], _mm512_and_si512(x, abs));
        c += 16;
    }
    let m = _mm512_max_epu32(_mm512_max_epu32(m[0], m[1]), _mm512_max_epu32(m[2], m[3]));
    _mm512_reduce_max_epu32(m)
}

/// [`max_bits_avx512`] at the AVX2 level: 8 lanes, `v` a multiple of 8 values.
///
/// # Safety
/// AVX2 is available.
#[target_feature(enable = "avx2")]
unsafe fn max_bits_avx2(v: &[f32]) -> u32 {
    let abs = _mm256_set1_epi32(0x7fff_ffff);
    let p = v.as_ptr();
    let mut m = [_mm256_setzero_si256(); 4];
    let mut c = 0;
    while c + 32 <= v.len() {
        for (j, m) in m.iter_mut().enumerate() {
            let x = _mm256_loadu_si256(p.add(c + 8 * j) as *const __m256i);
            *m = _mm256_max_epu32(*m, _mm256_and_si256(x, abs));
        }
        c += 32;
    }
    while c + 8 <= v.len() {
        let x = _mm256_loadu_si256(p.add(c) as *const __m256i);
        m[0] = _mm256_max_epu32(m[0], _mm256_and_si256(x, abs));
        c += 8;
    }
    let m = _mm256_max_epu32(_mm256_max_epu32(m[0], m[1]), _mm256_max_epu32(m[2], m[3]));
    let mut lanes = [0u32; 8];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, m);
    lanes.into_iter().max().unwrap_or(0)
}

/// The panel quantizer (see `super::int8::quantize_panel` for the arguments) at the AVX-512
/// level: 16 values a vector, 4 groups stored from each. `next` holds the rows that follow
/// the panel's (the next panel, which the same thread most likely quantizes next: rayon
/// splits a range into runs of neighbours): they are prefetched into L2 while this panel is
/// rounded, so that reading the memory overlaps the arithmetic instead of preceding it.
///
/// # Safety
/// AVX-512F and AVX2 are available.
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn quantize_panel_avx512(
    w: &[f32],
    next: &[f32],
    cols: usize,
    panel: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
) -> std::result::Result<(), usize> {
    let rows = panel_rows(w, cols, panel, scales, sums);
    let body = cols / 16 * 16;
    let mut invs = [0f32; INT8_PANEL];
    let body_max = |v: &[f32]| {
        // SAFETY: AVX-512F is available (this function's contract).
        unsafe { max_bits_avx512(v) }
    };
    row_scales(w, cols, body, scales, &mut invs, body_max)?;
    // Pass 2 (the panel's rows are in L2 now), by blocks of 64 columns: every row's 16
    // groups of the block, so that the block's 4 KB of the panel stay in L1 while each row
    // writes one 32-bit group to each of 16 places 256 bytes apart. (Row by row, a row's
    // groups went to as many cache lines as it has groups: the quantizer ran at 40 ms per
    // 100 M weights, against 30 in this order, and 23–27 with the next panel prefetched.)
    let magic = _mm512_set1_ps(ROUNDING_MAGIC);
    let magic_bits = _mm512_set1_epi32(MAGIC_BITS);
    let (low, high) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let mut totals = [_mm512_setzero_si512(); INT8_PANEL];
    let mut c = 0;
    while c < body {
        let vectors = if c + 64 <= body { 4 } else { 1 };
        let out = panel.as_mut_ptr();
        for r in 0..rows {
            let p = w.as_ptr().add(r * cols + c);
            if let Some(ahead) = next.get(r * cols + c..r * cols + c + 16 * vectors) {
                for line in ahead.chunks(16) {
                    _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8);
                }
            }
            let vinv = _mm512_set1_ps(invs[r]);
            let mut total = totals[r];
            for j in 0..vectors {
                let x = _mm512_mul_ps(_mm512_loadu_ps(p.add(16 * j)), vinv);
                let x = _mm512_min_ps(_mm512_max_ps(x, low), high);
                let bits = _mm512_castps_si512(_mm512_add_ps(x, magic));
                total = _mm512_add_epi32(total, _mm512_sub_epi32(bits, magic_bits));
                // The low byte of each lane is q (two's complement).
                let bytes = _mm512_cvtepi32_epi8(bits);
                let g = (c + 16 * j) / INT8_GROUP;
                let fours = [
                    _mm_extract_epi32::<0>(bytes),
                    _mm_extract_epi32::<1>(bytes),
                    _mm_extract_epi32::<2>(bytes),
                    _mm_extract_epi32::<3>(bytes),
                ];
                for (k, &four) in fours.iter().enumerate() {
                    // SAFETY: group g + k < groups (its values lie before `body` ≤ cols),
                    // row r < 64: inside the panel.
                    std::ptr::write_unaligned(out.add(group_at(g + k, r)) as *mut i32, four);
                }
            }
            totals[r] = total;
        }
        c += 16 * vectors;
    }
    for (r, sum) in sums.iter_mut().enumerate() {
        let values = &w[r * cols..(r + 1) * cols];
        *sum = _mm512_reduce_add_epi32(totals[r]) + quantize_tail(values, body, invs[r], panel, r);
    }
    Ok(())
}

/// The panel quantizer at the AVX2 level, in the order of [`quantize_panel_avx512`]: 8
/// values a vector, one group in each 128-bit half.
///
/// # Safety
/// AVX2 is available.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_panel_avx2(
    w: &[f32],
    next: &[f32],
    cols: usize,
    panel: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
) -> std::result::Result<(), usize> {
    let rows = panel_rows(w, cols, panel, scales, sums);
    let body = cols / 8 * 8;
    let mut invs = [0f32; INT8_PANEL];
    let body_max = |v: &[f32]| {
        // SAFETY: AVX2 is available (this function's contract).
        unsafe { max_bits_avx2(v) }
    };
    row_scales(w, cols, body, scales, &mut invs, body_max)?;
    let magic = _mm256_set1_ps(ROUNDING_MAGIC);
    let magic_bits = _mm256_set1_epi32(MAGIC_BITS);
    let (low, high) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    // Bytes 0, 4, 8, 12 of each half (its four values' low bytes) into its first 32 bits.
    let low_bytes = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, //
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    );
    let mut totals = [_mm256_setzero_si256(); INT8_PANEL];
    let mut c = 0;
    while c < body {
        let vectors = if c + 64 <= body { 8 } else { 1 };
        let out = panel.as_mut_ptr();
        for r in 0..rows {
            let p = w.as_ptr().add(r * cols + c);
            if let Some(ahead) = next.get(r * cols + c..r * cols + c + 8 * vectors) {
                for line in ahead.chunks(16) {
                    _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8);
                }
            }
            let vinv = _mm256_set1_ps(invs[r]);
            let mut total = totals[r];
            for j in 0..vectors {
                let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * j)), vinv);
                let x = _mm256_min_ps(_mm256_max_ps(x, low), high);
                let bits = _mm256_castps_si256(_mm256_add_ps(x, magic));
                total = _mm256_add_epi32(total, _mm256_sub_epi32(bits, magic_bits));
                let packed = _mm256_shuffle_epi8(bits, low_bytes);
                let g = (c + 8 * j) / INT8_GROUP;
                // SAFETY: groups g and g + 1 < groups (their values lie before `body`), row
                // r < 64: inside the panel.
                std::ptr::write_unaligned(
                    out.add(group_at(g, r)) as *mut i32,
                    _mm256_extract_epi32::<0>(packed),
                );
                std::ptr::write_unaligned(
                    out.add(group_at(g + 1, r)) as *mut i32,
                    _mm256_extract_epi32::<4>(packed),
                );
            }
            totals[r] = total;
        }
        c += 8 * vectors;
    }
    for (r, sum) in sums.iter_mut().enumerate() {
        let values = &w[r * cols..(r + 1) * cols];
        let mut partial = [0i32; 8];
        _mm256_storeu_si256(partial.as_mut_ptr() as *mut __m256i, totals[r]);
        *sum = partial.iter().sum::<i32>() + quantize_tail(values, body, invs[r], panel, r);
    }
    Ok(())
}

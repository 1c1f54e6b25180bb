//! The bf16 micro-kernel of the half-precision projection GEMM ([`super::half`]): AVX-512 BF16
//! `vdpbf16ps`, which multiplies two adjacent bf16 pairs per 32-bit lane and adds both
//! products into an `f32` accumulator (32 multiply-adds per instruction, twice an `f32` FMA).
//!
//! Because the instruction pairs neighbours along its 32-bit lanes, both operands are packed
//! in pairs along the reduction dimension `k` (an odd `k` gets a zero partner for its last
//! input, in both operands, so the pad adds `0 · 0`):
//!
//! * the weight once, when the layer is built ([`pack_weight_pairs`]): panels of
//!   [`PANEL`] = 64 output columns, `(k/2, 64)` 32-bit pairs each, element `(p, j)` holding
//!   `Wᵀ[2p, j]` in its low half and `Wᵀ[2p + 1, j]` in its high half;
//! * the input rows per call ([`pack_row_pairs`]), in groups of [`R`] = 6 rows, `(k/2, 6)`
//!   pairs per group, what the micro-kernel broadcasts from (as the f32 kernel does, and for
//!   the same reason: six rows `k` apart share L1 sets).
//!
//! The micro-kernel is register blocked as the f32 one: 6 rows × 64 columns, 24 `f32`
//! accumulators, 4 vectors of weight pairs and one broadcast pair. It accumulates into an
//! `f32` tile (row stride 64) that the driver rounds to bf16 once, at the end of `k`.
//! A portable kernel computes the same sums in plain Rust where the instruction is missing
//! (and under Miri, which runs no SIMD).

#[cfg(target_arch = "x86_64")]
use super::avx512_bf16 as avx512;
use super::tile::{PANEL, R};
use crate::simd::Isa;

/// `f32` value of bf16 bits.
#[inline(always)]
pub(super) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Packs `W` `(out, k)` (bf16 bits, row-major) into pair panels of `Wᵀ`: element `(p, j)` of
/// panel `q` (at `q * k2 * 64 + p * 64 + j`, `k2 = ceil(k / 2)`) holds `W[64 q + j, 2p]`
/// (low half) and `W[64 q + j, 2p + 1]` (high half, zero past `k`); columns past `out` are
/// zero.
pub(super) fn pack_weight_pairs(w: &[u16], out: usize, k: usize) -> Vec<u32> {
    assert!(k > 0 && w.len() >= out * k);
    let k2 = k.div_ceil(2);
    let mut packed = vec![0u32; out.div_ceil(PANEL) * k2 * PANEL];
    for (n, row) in w.chunks_exact(k).take(out).enumerate() {
        let base = (n / PANEL) * k2 * PANEL + n % PANEL;
        for (p, pair) in row.chunks(2).enumerate() {
            packed[base + p * PANEL] = pair_bits(pair);
        }
    }
    packed
}

/// One or two bf16 values (bits) as a 32-bit pair, the first in the low half; a missing
/// second one is zero.
#[inline(always)]
fn pair_bits(pair: &[u16]) -> u32 {
    pair[0] as u32 | (pair.get(1).copied().unwrap_or(0) as u32) << 16
}

/// Packs `x` `(m, k)` (bf16 bits, row-major) in groups of [`R`] rows: the pair `p` of row `i`
/// goes to `xp[(i / R) * R * k2 + p * R + i % R]` (`k2 = ceil(k / 2)`, the second half zero
/// past `k`). The missing rows of the last group are left as they are (never read).
pub(super) fn pack_row_pairs(x: &[u16], k: usize, xp: &mut [u32]) {
    let k2 = k.div_ceil(2);
    assert!(k > 0 && x.len().is_multiple_of(k) && xp.len() >= x.len().div_ceil(R * k) * R * k2);
    for (group, dst) in x.chunks(R * k).zip(xp.chunks_mut(R * k2)) {
        for (i, row) in group.chunks_exact(k).enumerate() {
            let pairs = row.chunks_exact(2);
            let odd = pairs.remainder();
            for (p, pair) in pairs.enumerate() {
                dst[p * R + i] = pair[0] as u32 | (pair[1] as u32) << 16;
            }
            if !odd.is_empty() {
                dst[(k2 - 1) * R + i] = pair_bits(odd);
            }
        }
    }
}

/// `dst[i]` = the bf16 bits of `src[i]` rounded to nearest even (`vcvtneps2bf16` with
/// [`Kernel::Avx512Bf16`], which also flushes results below bf16's normal range, 1.2e-38,
/// to zero, as the multiply-adds flush their inputs).
pub(super) fn round_row(kernel: Kernel, src: &[f32], dst: &mut [u16]) {
    assert!(dst.len() <= src.len());
    match kernel {
        // SAFETY: `Kernel::Avx512Bf16` exists only after AVX-512F/BW/VL/BF16 were detected;
        // `src` has at least `dst.len()` values.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bf16 => unsafe {
            avx512::round_row(src.as_ptr(), dst.as_mut_ptr(), dst.len())
        },
        Kernel::Portable => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = crate::simd::round_bf16(s);
            }
        }
    }
}

/// Which bf16 micro-kernel runs: chosen once per call by [`Kernel::for_isa`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// Plain Rust (products in `f32`).
    Portable,
    /// `vdpbf16ps`; only ever constructed after the CPU was found to have AVX-512F, BW, VL
    /// and BF16, which is what makes calling the `#[target_feature]` kernel sound.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
}

impl Kernel {
    /// The AVX-512 BF16 kernel when `isa` is AVX-512 and this CPU has AVX-512 BF16 (and BW,
    /// VL), else the portable one.
    pub(super) fn for_isa(isa: Isa) -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512 && has_avx512bf16() {
            return Kernel::Avx512Bf16;
        }
        let _ = isa;
        Kernel::Portable
    }
}

/// Whether this CPU runs the AVX-512 BF16 kernel (AVX-512F, BW, VL and BF16).
pub(super) fn has_avx512bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `acc[i * 64 + c] += Σ_{p < kc2} x(i, 2p) · wp(2p, c) + x(i, 2p + 1) · wp(2p + 1, c)` for
/// rows `i < nr` and columns `c < w`, where `x(i, ·)` is the pair at
/// `x[(i / 6) * gs + p * 6 + i % 6]` (packed rows) and `wp(·, c)` the pair at
/// `wp[p * 64 + c]` (a panel, possibly starting inside it).
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    kernel: Kernel,
    x: &[u32],
    gs: usize,
    kc2: usize,
    wp: &[u32],
    acc: &mut [f32],
    nr: usize,
    w: usize,
) {
    assert!((1..=PANEL).contains(&w) && kc2 > 0 && gs >= R * kc2);
    assert!(nr == 0 || x.len() >= (nr - 1) / R * gs + (kc2 - 1) * R + R);
    assert!(wp.len() >= (kc2 - 1) * PANEL + w);
    assert!(nr == 0 || acc.len() >= (nr - 1) * PANEL + w);
    match kernel {
        // SAFETY: `Kernel::Avx512Bf16` exists only after AVX-512F/BW/VL/BF16 were detected;
        // the lengths asserted above are the kernel's contract.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bf16 => unsafe {
            avx512::accumulate(x.as_ptr(), gs, kc2, wp.as_ptr(), acc.as_mut_ptr(), nr, w)
        },
        Kernel::Portable => accumulate_portable(x, gs, kc2, wp, acc, nr, w),
    }
}

/// Rows `i < nr`, columns `c < w` of `y` (bf16 bits, row stride `ys`) `= round(bias[c] +
/// Σ_{p < k2} x(i, 2p) · wp(2p, c) + x(i, 2p + 1) · wp(2p + 1, c))`, with `x` and `wp` as in
/// [`accumulate`] over the whole reduction at once: the sums stay in registers from the bias
/// to the rounding (`vcvtneps2bf16`, as [`round_row`]), with no `f32` tile to zero, fill and
/// round in separate passes (a sixth of the time of a 128-row product). `None` where the
/// kernel cannot (the portable one): the caller then accumulates into a tile.
///
/// # Safety
/// `y` is valid for writes of `w` values at `y + i * ys` for `i < nr`, and nothing else
/// accesses them while this runs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product_rounded(
    kernel: Kernel,
    x: &[u32],
    gs: usize,
    k2: usize,
    wp: &[u32],
    bias: Option<&[f32]>,
    y: *mut u16,
    ys: usize,
    nr: usize,
    w: usize,
) -> Option<()> {
    assert!((1..=PANEL).contains(&w) && k2 > 0 && gs >= R * k2);
    assert!(nr == 0 || x.len() >= (nr - 1) / R * gs + (k2 - 1) * R + R);
    assert!(wp.len() >= (k2 - 1) * PANEL + w);
    assert!(bias.is_none_or(|b| b.len() >= w) && (nr <= 1 || ys >= w));
    match kernel {
        // SAFETY: `Kernel::Avx512Bf16` exists only after AVX-512F/BW/VL/BF16 were detected;
        // the lengths asserted above and the caller's `y` are the kernel's contract.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512Bf16 => {
            let b = bias.map_or(std::ptr::null(), |b| b.as_ptr());
            avx512::product_rounded(x.as_ptr(), gs, k2, wp.as_ptr(), b, y, ys, nr, w);
            Some(())
        }
        Kernel::Portable => None,
    }
}

/// Plain-Rust [`accumulate`], row by row (the loop over the columns vectorises).
#[allow(clippy::too_many_arguments)]
fn accumulate_portable(
    x: &[u32],
    gs: usize,
    kc2: usize,
    wp: &[u32],
    acc: &mut [f32],
    nr: usize,
    w: usize,
) {
    for i in 0..nr {
        let row = &mut acc[i * PANEL..i * PANEL + w];
        let group = &x[i / R * gs + i % R..];
        for p in 0..kc2 {
            let pair = group[p * R];
            let (x0, x1) = (bf16_to_f32(pair as u16), bf16_to_f32((pair >> 16) as u16));
            for (a, &wv) in row.iter_mut().zip(&wp[p * PANEL..p * PANEL + w]) {
                *a += x0 * bf16_to_f32(wv as u16) + x1 * bf16_to_f32((wv >> 16) as u16);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both roundings agree with `half`'s (round to nearest even) on ties, carries into the
    /// exponent, infinities, NaN and odd lengths (the masked tail).
    #[test]
    fn rounding_matches_half() {
        let mut src: Vec<f32> = vec![
            1.0,
            -1.0,
            f32::from_bits(0x3f80_8000), // a tie, even below: stays 0x3f80
            f32::from_bits(0x3f81_8000), // a tie, odd below: up to 0x3f82
            f32::from_bits(0x3f80_8001), // just above a tie: up
            f32::from_bits(0x3fff_ffff), // carries into the exponent
            f32::MAX,                    // rounds to infinity
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            65504.0,
            3.140_625,
            -2.5e-3,
            1e30,
            7.0,
        ];
        src.extend((0..40).map(|i| (i as f32 * 0.377).sin() * 1e3));
        for kernel in [Kernel::for_isa(Isa::get()), Kernel::Portable] {
            for len in [0, 1, 15, 16, 17, src.len()] {
                let mut dst = vec![0u16; len];
                round_row(kernel, &src[..len], &mut dst);
                for (i, (&d, &s)) in dst.iter().zip(&src).enumerate() {
                    let want = half::bf16::from_f32(s);
                    if s.is_nan() {
                        assert!(half::bf16::from_bits(d).is_nan(), "{kernel:?} NaN");
                    } else {
                        assert_eq!(d, want.to_bits(), "{kernel:?} [{i}] = {s}");
                    }
                }
            }
        }
    }

    /// [`super::super::half::tests::exact`]'s values (multiples of 1/8 in [-1, 1]) as bf16
    /// bits: exact in bf16, their products and sums exact in f32, so every kernel must give
    /// the reference bit for bit.
    fn exact_bf16(len: usize, seed: u32) -> Vec<u16> {
        super::super::half::tests::exact(len, seed)
            .iter()
            .map(|v| (v.to_bits() >> 16) as u16)
            .collect()
    }

    /// Packing and both kernels against a plain sum, at odd `k` (the zero partner), partial
    /// panels, panels entered in the middle and row counts around the micro-tile.
    #[test]
    fn kernels_match_the_plain_sum() {
        let kernels = [Kernel::for_isa(Isa::get()), Kernel::Portable];
        for &(m, k, n, within) in &[(1, 1, 1, 0), (7, 5, 17, 3), (13, 34, 64, 0), (6, 9, 40, 20)] {
            let wt = exact_bf16(n.max(1) * k, 5);
            // W (n + within, k): the first `within` rows are skipped by entering the panel.
            let mut w = exact_bf16(within * k, 9);
            w.extend_from_slice(&wt);
            let packed = pack_weight_pairs(&w, within + n, k);
            let x = exact_bf16(m * k, 7);
            let k2 = k.div_ceil(2);
            let mut xp = vec![0u32; m.div_ceil(R) * R * k2];
            pack_row_pairs(&x, k, &mut xp);
            for kernel in kernels {
                let mut acc = vec![0.5f32; m * PANEL];
                accumulate(kernel, &xp, R * k2, k2, &packed[within..], &mut acc, m, n);
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0.5f32;
                        for kk in 0..k {
                            s += bf16_to_f32(x[i * k + kk]) * bf16_to_f32(wt[j * k + kk]);
                        }
                        assert_eq!(
                            acc[i * PANEL + j],
                            s,
                            "{kernel:?} m={m} k={k} n={n} ({i}, {j})"
                        );
                    }
                    for j in n..PANEL {
                        assert_eq!(acc[i * PANEL + j], 0.5, "{kernel:?} wrote past column {n}");
                    }
                }
            }
        }
    }
}

//! The AVX-512 micro-kernel of the projection GEMM ([`super::gemm`]).
//!
//! Layouts (all `f32`): `x` packed in groups of [`R`] = 6 rows, `(kc, 6)` row-major per group
//! (element `(r, kk)` of group `g` at `g * gs + kk * 6 + r`), read by broadcast;
//! `wp` a packed panel of `Wᵀ`, rows of [`super::PANEL`] = 64 floats, possibly starting
//! inside the panel, read by vector; `y` rows at stride `ys`, accumulated in place
//! ([`accumulate`]), or f16 rows written once from the bias and the whole reduction
//! ([`product_f16`]).

#![allow(clippy::too_many_arguments)]

use super::gemm::Ahead;
use super::PANEL;
use crate::simd::avx512::{lanes16, load, store};
use core::arch::x86_64::*;

/// Rows per micro-tile: 6 rows × 4 vectors = 24 accumulators, 4 registers of `Wᵀ` and one
/// broadcast, within the 32 registers.
const R: usize = 6;

/// `y[i * ys + c] += Σ_kk x(i, kk) · wp[kk * 64 + c]` for rows `i < nr`, columns `c < w`,
/// where `x(i, kk) = x[(i / 6) * gs + kk * 6 + i % 6]` (rows packed in groups of 6).
///
/// # Safety
/// AVX-512F available; `1 <= w <= 64`; `x` readable at the `x(i, kk)` above for `i < nr`,
/// `kk < kc`; `wp` readable at `kk * 64 + c` for `kk < kc`, `c < w`; `y` readable and writable at `i * ys + c`
/// for `i < nr`, `c < w`.
#[target_feature(enable = "avx512f")]
pub unsafe fn accumulate(
    x: *const f32,
    gs: usize,
    kc: usize,
    wp: *const f32,
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
    ahead: Option<Ahead>,
) {
    // SAFETY: the caller's contract.
    columns(x, gs, kc, wp, Out::InPlace { y, ys }, nr, w, ahead)
}

/// Rows `i < nr`, columns `c < w` of `y` (f16 bits, row stride `ys`) `= round(bias[c] +
/// Σ_{kk < k} x(i, kk) · wp[kk * 64 + c])` (`x` packed as for [`accumulate`]), the whole
/// reduction in registers and rounded to f16 once (`vcvtps2ph`, to nearest even), straight
/// into the output. `bias` null for none.
///
/// # Safety
/// AVX-512F, BW and VL available; `1 <= w <= 64`; `x` and `wp` as in [`accumulate`] for
/// `kk < k`; `bias` null or readable for `w` floats; `y` writable for `w` values at `y + i *
/// ys`, `i < nr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn product_f16(
    x: *const f32,
    gs: usize,
    k: usize,
    wp: *const f32,
    bias: *const f32,
    y: *mut u16,
    ys: usize,
    nr: usize,
    w: usize,
) {
    // SAFETY: the caller's contract.
    columns(x, gs, k, wp, Out::F16 { bias, y, ys }, nr, w, None)
}

/// [`rows`] for `w` columns: `ceil(w / 16)` vectors, the last one masked unless it is full.
///
/// # Safety
/// As [`accumulate`] (`out` in place) or [`product_f16`] (`out` f16), with the features
/// enabled by the caller.
#[inline(always)]
unsafe fn columns(
    x: *const f32,
    gs: usize,
    kc: usize,
    wp: *const f32,
    out: Out,
    nr: usize,
    w: usize,
    ahead: Option<Ahead>,
) {
    let nv = w.div_ceil(16);
    let last = w - 16 * (nv - 1); // 1..=16 lanes in the last vector
    let tail = lanes16(last);
    // SAFETY: the caller's contract, with `nv` in 1..=4 since 1 <= w <= 64. Whole panels (the
    // common case) take unmasked loads and stores: on Intel cores a masked load costs an extra
    // vector µop on the FMA ports.
    match (nv, last == 16) {
        (1, false) => rows::<1, false>(x, gs, kc, wp, out, nr, tail, ahead),
        (2, false) => rows::<2, false>(x, gs, kc, wp, out, nr, tail, ahead),
        (3, false) => rows::<3, false>(x, gs, kc, wp, out, nr, tail, ahead),
        (_, false) => rows::<4, false>(x, gs, kc, wp, out, nr, tail, ahead),
        (1, true) => rows::<1, true>(x, gs, kc, wp, out, nr, tail, ahead),
        (2, true) => rows::<2, true>(x, gs, kc, wp, out, nr, tail, ahead),
        (3, true) => rows::<3, true>(x, gs, kc, wp, out, nr, tail, ahead),
        (_, true) => rows::<4, true>(x, gs, kc, wp, out, nr, tail, ahead),
    }
}

/// Where a micro-tile's sums start from and end up.
#[derive(Clone, Copy)]
enum Out {
    /// `f32` rows at stride `ys`, read first and accumulated into.
    InPlace { y: *mut f32, ys: usize },
    /// Started from `bias` (zero when null), rounded to f16 into `y` (row stride `ys`).
    F16 {
        bias: *const f32,
        y: *mut u16,
        ys: usize,
    },
}

impl Out {
    /// The same output from row `i` on.
    ///
    /// # Safety
    /// Row `i` lies inside the output.
    #[inline(always)]
    unsafe fn at_row(self, i: usize) -> Out {
        match self {
            Out::InPlace { y, ys } => Out::InPlace {
                y: y.add(i * ys),
                ys,
            },
            Out::F16 { bias, y, ys } => Out::F16 {
                bias,
                y: y.add(i * ys),
                ys,
            },
        }
    }
}

/// [`accumulate`] for `w = 16 * (NV - 1) + popcount(tail)` columns; `FULL` when `tail` is all
/// ones.
///
/// # Safety
/// As [`accumulate`], with `1 <= NV <= 4`.
#[inline(always)]
unsafe fn rows<const NV: usize, const FULL: bool>(
    x: *const f32,
    gs: usize,
    kc: usize,
    wp: *const f32,
    out: Out,
    nr: usize,
    tail: __mmask16,
    ahead: Option<Ahead>,
) {
    // The prefetch address of micro-tile `t`, if it prefetches.
    let pf = |t: usize| {
        ahead
            .filter(|a| t < a.tiles)
            .map(|a| a.base.wrapping_add(t * a.per_tile))
    };
    let mut i = 0;
    while i + R <= nr {
        // SAFETY: rows i .. i + R <= nr (group i / R) of `x` and `y` are in the caller's
        // contract.
        tile::<NV, R, FULL>(x.add(i / R * gs), kc, wp, out.at_row(i), tail, pf(i / R));
        i += R;
    }
    // SAFETY: as above for the last nr - i < R rows (i <= nr), the first rows of group i / R.
    let (xi, oi, p) = (x.add(i / R * gs), out.at_row(i), pf(i / R));
    match nr - i {
        1 => tile::<NV, 1, FULL>(xi, kc, wp, oi, tail, p),
        2 => tile::<NV, 2, FULL>(xi, kc, wp, oi, tail, p),
        3 => tile::<NV, 3, FULL>(xi, kc, wp, oi, tail, p),
        4 => tile::<NV, 4, FULL>(xi, kc, wp, oi, tail, p),
        5 => tile::<NV, 5, FULL>(xi, kc, wp, oi, tail, p),
        _ => {}
    }
}

/// `RR` rows × `16 * NV` columns (the last vector masked by `tail`), accumulators in
/// registers over the whole chunk.
///
/// # Safety
/// AVX-512F available; `NV <= 4`, `RR <= 6`; `x` (one packed group) readable at
/// `kk * 6 + r` for `r < RR`, `kk < kc`;
/// `wp` readable at `kk * 64 + c` and `y` readable and writable at `r * ys + c`, for `r < RR`
/// and the columns named above (masked lanes are neither read nor written, and AVX-512
/// suppresses faults on them).
#[inline(always)]
unsafe fn tile<const NV: usize, const RR: usize, const FULL: bool>(
    x: *const f32,
    kc: usize,
    wp: *const f32,
    out: Out,
    tail: __mmask16,
    prefetch: Option<*const f32>,
) {
    // Only the last vector of a partial panel is masked (known at compile time).
    let masked = |v: usize| !FULL && v + 1 == NV;
    let mut acc = [[_mm512_setzero_ps(); NV]; RR];
    match out {
        Out::InPlace { y, ys } => {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, a) in acc.iter_mut().enumerate() {
                    *a = load(masked(v), tail, y.add(r * ys + 16 * v));
                }
            }
        }
        Out::F16 { bias, .. } if !bias.is_null() => {
            for v in 0..NV {
                let b = load(masked(v), tail, bias.add(16 * v));
                for acc in acc.iter_mut() {
                    acc[v] = b;
                }
            }
        }
        Out::F16 { .. } => {}
    }
    for kk in 0..kc {
        if let Some(p) = prefetch {
            // A hint: never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(16 * kk).cast());
        }
        let wr = wp.add(kk * PANEL);
        let mut wv = [_mm512_setzero_ps(); NV];
        for (v, wv) in wv.iter_mut().enumerate() {
            // Masked when partial: the columns may start inside the panel (a narrowed
            // projection), so the lanes past `w` may be past the panel's end.
            *wv = load(masked(v), tail, wr.add(16 * v));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let xb = _mm512_set1_ps(*x.add(kk * R + r));
            for v in 0..NV {
                acc[v] = _mm512_fmadd_ps(xb, wv[v], acc[v]);
            }
        }
    }
    match out {
        Out::InPlace { y, ys } => {
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    store(masked(v), tail, y.add(r * ys + 16 * v), *a);
                }
            }
        }
        Out::F16 { y, ys, .. } => {
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    let h =
                        _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(*a);
                    let m = if masked(v) { tail } else { 0xffff };
                    _mm256_mask_storeu_epi16(y.add(r * ys + 16 * v).cast(), m, h);
                }
            }
        }
    }
}

//! The AVX-512 micro-kernels of the projection: the packed GEMM's ([`super::gemm`]: products
//! and the on-the-fly transposition of strips of `W`) and the in-place row kernel's
//! ([`super::rows`]).
//!
//! Layouts (all `f32`): `x` packed in groups of [`R`] = 6 rows, `(kc, 6)` row-major per group
//! (element `(r, kk)` of group `g` at `g * gs + kk * 6 + r`), read by broadcast;
//! `wp` a packed panel of `Wᵀ`, rows of [`super::PANEL`] = 64 floats, possibly starting
//! inside the panel, read by vector; `y` rows at stride `ys`, accumulated in place
//! ([`accumulate`]), or f16 rows written once from the bias and the whole reduction
//! ([`product_f16`]).

#![allow(clippy::too_many_arguments)]

use super::tile::{Ahead, PANEL, R};
use crate::simd::avx512::{lanes16, load, store, sum_16_lanes, sums_16, transpose_16x16};
use core::arch::x86_64::*;

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

/// [`super::kernels::pack_strip`] by 16 × 16 blocks transposed in registers (a scalar transposition would
/// cost more than the products at a few rows of `x`).
///
/// # Safety
/// AVX-512F available; `cols <= 64`, `rows.len() >= cols * k`, `panel.len() >= k * 64`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_strip(rows: &[f32], cols: usize, k: usize, panel: &mut [f32]) {
    let (src, dst) = (rows.as_ptr(), panel.as_mut_ptr());
    let mut j0 = 0;
    while j0 < cols {
        let nj = (cols - j0).min(16);
        let mut k0 = 0;
        while k0 < k {
            let nk = (k - k0).min(16);
            let mask = lanes16(nk);
            // The next strip's line of row j, into L2 (a hint, never a fault): `W` streams
            // from memory, and the hardware prefetcher does not follow 16 row streams.
            let ahead = |j: usize| {
                _mm_prefetch::<_MM_HINT_T1>(src.wrapping_add((PANEL + j0 + j) * k + k0).cast())
            };
            let r: [__m512; 16] = if nj == 16 && nk == 16 {
                // Whole blocks (nearly all of them), with a fixed trip count, so that the rows
                // stay in registers instead of going through the stack.
                std::array::from_fn(|j| {
                    ahead(j);
                    // SAFETY: row j0 + j < cols, inputs k0 .. k0 + 16 <= k.
                    _mm512_loadu_ps(src.add((j0 + j) * k + k0))
                })
            } else {
                std::array::from_fn(|j| {
                    if j < nj {
                        ahead(j);
                        // SAFETY: row j0 + j < cols, inputs k0 .. k0 + nk <= k (masked: the
                        // lanes past nk are neither read nor faulted on).
                        _mm512_maskz_loadu_ps(mask, src.add((j0 + j) * k + k0))
                    } else {
                        _mm512_setzero_ps()
                    }
                })
            };
            let t = transpose_16x16(r);
            for (kk, t) in t.iter().enumerate().take(nk) {
                // SAFETY: panel row k0 + kk < k, lanes j0 .. j0 + 16 <= 64 (j0 < cols <= 64
                // and j0 is a multiple of 16).
                _mm512_storeu_ps(dst.add((k0 + kk) * PANEL + j0), *t);
            }
            k0 += 16;
        }
        j0 += 16;
    }
}

/// How many groups of rows of `w` ahead [`rows_block`] prefetches (measured: 2 to 16 give
/// the same speed; 1, or prefetching into L1, much less).
const PREFETCH_GROUPS: usize = 4;

/// Register tiles of 4 rows of `w` × 4 rows of `x`: 16 accumulators of 16 lanes, each step
/// loading 4 + 4 vectors for 16 FMAs; masked loads for the last `k % 16` columns. A whole tile
/// ends with the 16 horizontal sums in one vector ([`sums_16`]), lanes ordered so that each
/// quarter is 4 consecutive outputs of one row of `y`: 4 vector stores, bias added.
///
/// # Safety
/// The CPU has avx512f; `x` holds `m · k`, `w` `rows · k` and `bias` (if any) `rows` floats;
/// `y` as in [`super::kernels::rows_block`].
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rows_block(
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    let tail = k % 16;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as __mmask16;
    let bias_at = |r: usize| bias.map_or(0.0, |b| b[r]);
    // With 4 or more tiles of 4 rows of `x` per group of rows of `w`, the prefetches of the
    // group's row b are issued by tile b (one line per step), not all by the first tile: a
    // burst of 4 × k / 16 prefetches queued behind each other (32 rows of `x`, 58101 × 512:
    // 171 → 185 GFLOP/s on 2 threads).
    let spread = m >= 16;
    // One tile: MR rows of x from i, NR rows of w from r; `$finish` stores it.
    macro_rules! tile {
        ($mr:expr, $nr:expr, $i:expr, $r:expr, $finish:ident) => {{
            // Tiles prefetch, into L2, the rows of `w` PREFETCH_GROUPS groups ahead (which
            // tiles: `spread`): without it the weights arrived from memory at 22 GB/s with one
            // row of `x` and 14 GB/s with 8 (the loads of `w` stalled the kernel), with it at
            // 35 and 29 GB/s, the machine's streaming bandwidth (an opus-mt output
            // projection, 58101 × 512, 2 threads).
            let prefetch: [bool; $nr] =
                std::array::from_fn(|b| if spread { $i == 4 * b } else { $i == 0 });
            let mut acc = [[_mm512_setzero_ps(); $nr]; $mr];
            let xp: [*const f32; $mr] = std::array::from_fn(|a| x.as_ptr().add(($i + a) * k));
            let wp: [*const f32; $nr] = std::array::from_fn(|b| w.as_ptr().add(($r + b) * k));
            let mut c = 0;
            while c + 16 <= k {
                for b in 0..$nr {
                    if prefetch[b] {
                        // A hint, never a fault: past the end of `w` it does nothing.
                        _mm_prefetch::<_MM_HINT_T1>(
                            wp[b].wrapping_add(c + PREFETCH_GROUPS * $nr * k).cast(),
                        );
                    }
                }
                let wv: [__m512; $nr] = std::array::from_fn(|b| _mm512_loadu_ps(wp[b].add(c)));
                for a in 0..$mr {
                    let xv = _mm512_loadu_ps(xp[a].add(c));
                    for b in 0..$nr {
                        acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
                    }
                }
                c += 16;
            }
            if tail > 0 {
                let wv: [__m512; $nr] =
                    std::array::from_fn(|b| _mm512_maskz_loadu_ps(tail_mask, wp[b].add(c)));
                for a in 0..$mr {
                    let xv = _mm512_maskz_loadu_ps(tail_mask, xp[a].add(c));
                    for b in 0..$nr {
                        acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
                    }
                }
            }
            $finish!(acc, $mr, $nr, $i, $r);
        }};
    }
    // Any tile: one horizontal sum per output, in the order of the 4 × 4 tiles' sums (so an
    // output is the same whichever tile computed it: a row's result does not depend on the
    // rows batched with it).
    macro_rules! finish_each {
        ($acc:ident, $mr:expr, $nr:expr, $i:expr, $r:expr) => {
            for a in 0..$mr {
                for b in 0..$nr {
                    *y.add(($i + a) * ys + $r + b) = sum_16_lanes($acc[a][b]) + bias_at($r + b);
                }
            }
        };
    }
    // A 4 × 4 tile: lane 4a + b of the sums is output (i + a, r + b).
    macro_rules! finish_4x4 {
        ($acc:ident, $mr:expr, $nr:expr, $i:expr, $r:expr) => {{
            let s = sums_16(std::array::from_fn(|j| $acc[j / 4][j % 4]));
            let b4 = match bias {
                Some(b) => _mm_loadu_ps(b.as_ptr().add($r)),
                None => _mm_setzero_ps(),
            };
            let row = |a: usize| y.add(($i + a) * ys + $r);
            _mm_storeu_ps(row(0), _mm_add_ps(_mm512_extractf32x4_ps::<0>(s), b4));
            _mm_storeu_ps(row(1), _mm_add_ps(_mm512_extractf32x4_ps::<1>(s), b4));
            _mm_storeu_ps(row(2), _mm_add_ps(_mm512_extractf32x4_ps::<2>(s), b4));
            _mm_storeu_ps(row(3), _mm_add_ps(_mm512_extractf32x4_ps::<3>(s), b4));
        }};
    }
    let mut r = 0;
    while r + 4 <= rows {
        let mut i = 0;
        while i + 4 <= m {
            tile!(4, 4, i, r, finish_4x4);
            i += 4;
        }
        // The last 1–3 rows of `x` as one tile: each load of `w` serves all of them (one
        // tile a row loaded `w` once per row; a step of the running batch has 23 rows or so
        // in each half, ~1% of the decoding time at 32 clients).
        match m - i {
            3 => tile!(3, 4, i, r, finish_each),
            2 => tile!(2, 4, i, r, finish_each),
            1 => tile!(1, 4, i, r, finish_each),
            _ => {}
        }
        r += 4;
    }
    while r < rows {
        let mut i = 0;
        while i + 4 <= m {
            tile!(4, 1, i, r, finish_each);
            i += 4;
        }
        while i < m {
            tile!(1, 1, i, r, finish_each);
            i += 1;
        }
        r += 1;
    }
}

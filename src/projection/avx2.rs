//! The AVX2 + FMA micro-kernels of the projection: the packed GEMM's ([`super::gemm`]:
//! products, and the on-the-fly transposition of strips of `W`) and the in-place row
//! kernel's ([`super::rows`]), for 16 `ymm` registers.
//!
//! Layouts as in the AVX-512 kernels (`super::avx512`): `x` packed in groups of [`R`] = 6 rows,
//! `(kc, 6)` row-major per group, read by broadcast; `wp` a packed panel of `Wᵀ`, rows of
//! [`PANEL`] = 64 floats, possibly starting inside the panel; `y` rows at stride `ys`.
//!
//! **The GEMM tile** is 6 rows × 16 columns: 12 accumulators, 2 vectors of the panel and one
//! broadcast, 15 of the 16 registers (the classic Haswell/Zen tile: 12 FMAs per 8 loads, 2
//! FMAs a cycle). A 64-column panel is four such column slices; the slice is the outer loop,
//! so that the 16 columns of the panel chunk a slice reads (`kc × 64` bytes, 32 KiB at `kc =
//! 512`) are reused from cache by every row tile of the block. A call of one or two rows
//! (decoding) instead takes slices of 32 columns (1–2 rows × 4 vectors), so that streaming the
//! panel from memory reads half of each 256-byte panel row per pass, not a quarter.
//!
//! **The row kernel** multiplies `MR` rows of `x` by `NR` rows of `W` with `MR · NR`
//! accumulators: `4 × 3` (12 accumulators, the 3 rows of `W` held, `x` streamed) from 4 rows
//! of `x` on, `2 × 4` / `1 × 4` below (decoding one or two sentences), with the rows of `W` a
//! few groups ahead prefetched into L2 and each tile's sums reduced together
//! ([`sums_8`]/[`sums_4`]).

#![allow(clippy::too_many_arguments)]

use super::tile::{Ahead, PANEL, R};
use crate::simd::avx2::{lanes8, load, store, sums_4, sums_8, transpose_8x8};
use core::arch::x86_64::*;

/// Columns per slice of the GEMM tile (two vectors).
const SLICE: usize = 16;
/// Columns per slice when a call has one or two rows (four vectors; see [`slices`]).
const WIDE_SLICE: usize = 32;

/// `y[i * ys + c] += Σ_kk x(i, kk) · wp[kk * 64 + c]` for rows `i < nr`, columns `c < w`,
/// where `x(i, kk) = x[(i / 6) * gs + kk * 6 + i % 6]` (rows packed in groups of 6).
///
/// # Safety
/// AVX2 and FMA available; `1 <= w <= 64`; `x` readable at the `x(i, kk)` above for `i < nr`,
/// `kk < kc`; `wp` readable at `kk * 64 + c` for `kk < kc`, `c < w`; `y` readable and
/// writable at `i * ys + c` for `i < nr`, `c < w`.
#[target_feature(enable = "avx2,fma")]
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
    slices(x, gs, kc, wp, Out::InPlace { y, ys }, nr, w, ahead)
}

/// Rows `i < nr`, columns `c < w` of `y` (f16 bits, row stride `ys`) `= round(bias[c] +
/// Σ_{kk < k} x(i, kk) · wp[kk * 64 + c])` (`x` packed as for [`accumulate`]): the whole
/// reduction in registers, rounded to f16 once (F16C `vcvtps2ph`, to nearest even) straight
/// into the output. `bias` null for none.
///
/// # Safety
/// AVX2, FMA and F16C available; `1 <= w <= 64`; `x` and `wp` as in [`accumulate`] for
/// `kk < k`; `bias` null or readable for `w` floats; `y` writable for `w` values at `y + i *
/// ys`, `i < nr`.
#[target_feature(enable = "avx2,fma,f16c")]
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
    slices(x, gs, k, wp, Out::F16 { bias, y, ys }, nr, w, None)
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
    /// The same output from row `i` and column `c` on (`bias` from column `c`).
    ///
    /// # Safety
    /// Row `i`, column `c` lie inside the output (or one past a row's end).
    #[inline(always)]
    unsafe fn at(self, i: usize, c: usize) -> Out {
        match self {
            Out::InPlace { y, ys } => Out::InPlace {
                y: y.add(i * ys + c),
                ys,
            },
            Out::F16 { bias, y, ys } => Out::F16 {
                bias: if bias.is_null() { bias } else { bias.add(c) },
                y: y.add(i * ys + c),
                ys,
            },
        }
    }
}

/// The column slices of 16 (the last one possibly partial), each over every row tile.
///
/// # Safety
/// As [`accumulate`] (`out` in place) or [`product_f16`] (`out` f16).
#[inline(always)]
unsafe fn slices(
    x: *const f32,
    gs: usize,
    kc: usize,
    wp: *const f32,
    out: Out,
    nr: usize,
    w: usize,
    ahead: Option<Ahead>,
) {
    // Micro-tile t of this call prefetches (the first `ahead.tiles` of them).
    let mut t = 0;
    if nr <= 2 {
        // One or two rows (decoding a sentence or two) stream the panel from memory: slices
        // of 32 columns read half of every 256-byte panel row per pass instead of a quarter,
        // and each tile prefetches for two (8 or 16 accumulators, 4 panel vectors, one
        // broadcast: at most 13 registers).
        let mut c0 = 0;
        while c0 < w {
            let ws = (w - c0).min(WIDE_SLICE);
            let nvv = ws.div_ceil(8);
            // The lanes of the slice's last vector: 1..=8.
            let last = ws - 8 * (nvv - 1);
            let mask = lanes8(last);
            let mut pf = || {
                let p = ahead
                    .filter(|a| t < a.tiles)
                    .map(|a| a.base.wrapping_add(t * a.per_tile));
                t += 1;
                p
            };
            let p = [pf(), pf()];
            // SAFETY: columns c0 .. c0 + ws of rows 0 .. nr are in the caller's contract; the
            // tile touches only those (the masked vector's other lanes are neither read nor
            // written).
            let (wc, oc, m) = (wp.add(c0), out.at(0, c0), last < 8);
            match nvv {
                1 => wide::<1>(x, kc, wc, oc, nr, m, mask, p),
                2 => wide::<2>(x, kc, wc, oc, nr, m, mask, p),
                3 => wide::<3>(x, kc, wc, oc, nr, m, mask, p),
                _ => wide::<4>(x, kc, wc, oc, nr, m, mask, p),
            }
            c0 += WIDE_SLICE;
        }
        return;
    }
    let mut c0 = 0;
    while c0 < w {
        let ws = (w - c0).min(SLICE);
        // The lanes of the slice's last vector: 1..=8.
        let last = ws - 8 * ((ws - 1) / 8);
        let mask = lanes8(last);
        // SAFETY: columns c0 .. c0 + ws of every row are in the caller's contract; `rows`
        // touches only those (the masked vector's other lanes are neither read nor written).
        let (wc, oc) = (wp.add(c0), out.at(0, c0));
        match (ws > 8, last == 8) {
            (true, true) => rows::<2, false>(x, gs, kc, wc, oc, nr, mask, ahead, &mut t),
            (true, false) => rows::<2, true>(x, gs, kc, wc, oc, nr, mask, ahead, &mut t),
            (false, true) => rows::<1, false>(x, gs, kc, wc, oc, nr, mask, ahead, &mut t),
            (false, false) => rows::<1, true>(x, gs, kc, wc, oc, nr, mask, ahead, &mut t),
        }
        c0 += SLICE;
    }
}

/// One or two rows × `8 * NV` columns (the last vector masked when `masked`), prefetching
/// for two micro-tiles ([`slices`]).
///
/// # Safety
/// As [`accumulate`] for the slice's columns, `1 <= nr <= 2`, `1 <= NV <= 4`.
#[inline(always)]
unsafe fn wide<const NV: usize>(
    x: *const f32,
    kc: usize,
    wp: *const f32,
    out: Out,
    nr: usize,
    masked: bool,
    mask: __m256i,
    p: [Option<*const f32>; 2],
) {
    match (nr, masked) {
        (1, false) => tile::<NV, 1, false>(x, kc, wp, out, mask, p),
        (1, true) => tile::<NV, 1, true>(x, kc, wp, out, mask, p),
        (_, false) => tile::<NV, 2, false>(x, kc, wp, out, mask, p),
        (_, true) => tile::<NV, 2, true>(x, kc, wp, out, mask, p),
    }
}

/// The row tiles of one slice of `8 * NV` columns (the last vector masked when `MASKED`).
///
/// # Safety
/// As [`accumulate`] for the slice's columns, `1 <= NV <= 2`.
#[inline(always)]
unsafe fn rows<const NV: usize, const MASKED: bool>(
    x: *const f32,
    gs: usize,
    kc: usize,
    wp: *const f32,
    out: Out,
    nr: usize,
    mask: __m256i,
    ahead: Option<Ahead>,
    t: &mut usize,
) {
    let mut pf = || {
        let p = ahead
            .filter(|a| *t < a.tiles)
            .map(|a| a.base.wrapping_add(*t * a.per_tile));
        *t += 1;
        p
    };
    let mut i = 0;
    while i + R <= nr {
        // SAFETY: rows i .. i + R <= nr (group i / R) are in the caller's contract.
        tile::<NV, R, MASKED>(x.add(i / R * gs), kc, wp, out.at(i, 0), mask, [pf(), None]);
        i += R;
    }
    if i == nr {
        return;
    }
    // SAFETY: as above for the last nr - i < R rows, the first rows of group i / R.
    let (xi, oi) = (x.add(i / R * gs), out.at(i, 0));
    match nr - i {
        1 => tile::<NV, 1, MASKED>(xi, kc, wp, oi, mask, [pf(), None]),
        2 => tile::<NV, 2, MASKED>(xi, kc, wp, oi, mask, [pf(), None]),
        3 => tile::<NV, 3, MASKED>(xi, kc, wp, oi, mask, [pf(), None]),
        4 => tile::<NV, 4, MASKED>(xi, kc, wp, oi, mask, [pf(), None]),
        _ => tile::<NV, 5, MASKED>(xi, kc, wp, oi, mask, [pf(), None]),
    }
}

/// `RR` rows × `8 * NV` columns (the last vector masked by `mask` when `MASKED`), the sums in
/// registers over the whole chunk; each address of `prefetch` is fetched into L2 one line per
/// input step (hints, never faults).
///
/// # Safety
/// AVX2 and FMA available (F16C for an f16 `out`); `NV <= 2` with `RR <= 6`, or `NV <= 4`
/// with `RR <= 2`; `x` (one packed
/// group) readable at `kk * 6 + r` for `r < RR`, `kk < kc`; `wp` readable at `kk * 64 + c`
/// and `out` at row `r < RR`, column `c`, for the columns named above (masked lanes are
/// neither read nor written).
#[inline(always)]
unsafe fn tile<const NV: usize, const RR: usize, const MASKED: bool>(
    x: *const f32,
    kc: usize,
    wp: *const f32,
    out: Out,
    mask: __m256i,
    prefetch: [Option<*const f32>; 2],
) {
    let masked = |v: usize| MASKED && v + 1 == NV;
    let mut acc = [[_mm256_setzero_ps(); NV]; RR];
    match out {
        Out::InPlace { y, ys } => {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, a) in acc.iter_mut().enumerate() {
                    *a = load(masked(v), mask, y.add(r * ys + 8 * v));
                }
            }
        }
        Out::F16 { bias, .. } if !bias.is_null() => {
            for v in 0..NV {
                let b = load(masked(v), mask, bias.add(8 * v));
                for acc in acc.iter_mut() {
                    acc[v] = b;
                }
            }
        }
        Out::F16 { .. } => {}
    }
    for kk in 0..kc {
        for p in prefetch.into_iter().flatten() {
            // A hint: never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(16 * kk).cast());
        }
        let wr = wp.add(kk * PANEL);
        let mut wv = [_mm256_setzero_ps(); NV];
        for (v, wv) in wv.iter_mut().enumerate() {
            // Masked when partial: the columns may start inside the panel (a narrowed
            // projection), so the lanes past `w` may be past the panel's end.
            *wv = load(masked(v), mask, wr.add(8 * v));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let xb = _mm256_broadcast_ss(&*x.add(kk * R + r));
            for v in 0..NV {
                acc[v] = _mm256_fmadd_ps(xb, wv[v], acc[v]);
            }
        }
    }
    match out {
        Out::InPlace { y, ys } => {
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    store(masked(v), mask, y.add(r * ys + 8 * v), *a);
                }
            }
        }
        Out::F16 { y, ys, .. } => {
            for (r, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(*a);
                    let dst = y.add(r * ys + 8 * v);
                    if masked(v) {
                        // No 16-bit masked store in AVX2: the lanes of the mask, one by one.
                        let mut lanes = [0u16; 8];
                        _mm_storeu_si128(lanes.as_mut_ptr().cast(), h);
                        let mut m = [0i32; 8];
                        _mm256_storeu_si256(m.as_mut_ptr().cast(), mask);
                        for (j, &l) in lanes.iter().enumerate() {
                            if m[j] != 0 {
                                *dst.add(j) = l;
                            }
                        }
                    } else {
                        _mm_storeu_si128(dst.cast(), h);
                    }
                }
            }
        }
    }
}

/// [`super::kernels::pack_strip`] by 8 × 8 blocks transposed in registers.
///
/// # Safety
/// AVX2 available; `cols <= 64`, `rows.len() >= cols * k`, `panel.len() >= k * 64`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn pack_strip(rows: &[f32], cols: usize, k: usize, panel: &mut [f32]) {
    let (src, dst) = (rows.as_ptr(), panel.as_mut_ptr());
    let mut j0 = 0;
    while j0 < cols {
        let nj = (cols - j0).min(8);
        let mut k0 = 0;
        while k0 < k {
            let nk = (k - k0).min(8);
            let mask = lanes8(nk);
            // The next strip's line of row j, into L2 (a hint, never a fault): `W` streams
            // from memory, and the hardware prefetcher does not follow 64 row streams.
            let ahead = |j: usize| {
                if k0 % 16 == 0 {
                    _mm_prefetch::<_MM_HINT_T1>(src.wrapping_add((PANEL + j0 + j) * k + k0).cast())
                }
            };
            let r: [__m256; 8] = if nj == 8 && nk == 8 {
                std::array::from_fn(|j| {
                    ahead(j);
                    // SAFETY: row j0 + j < cols, inputs k0 .. k0 + 8 <= k.
                    _mm256_loadu_ps(src.add((j0 + j) * k + k0))
                })
            } else {
                std::array::from_fn(|j| {
                    if j < nj {
                        ahead(j);
                        // SAFETY: row j0 + j < cols, inputs k0 .. k0 + nk <= k (masked: the
                        // lanes past nk are neither read nor faulted on).
                        _mm256_maskload_ps(src.add((j0 + j) * k + k0), mask)
                    } else {
                        _mm256_setzero_ps()
                    }
                })
            };
            let t = transpose_8x8(r);
            for (kk, t) in t.iter().enumerate().take(nk) {
                // SAFETY: panel row k0 + kk < k, lanes j0 .. j0 + 8 <= 64 (j0 < cols <= 64
                // and j0 is a multiple of 8).
                _mm256_storeu_ps(dst.add((k0 + kk) * PANEL + j0), *t);
            }
            k0 += 8;
        }
        j0 += 8;
    }
}

/// How many groups of rows of `w` ahead [`rows_block`] prefetches.
const PREFETCH_GROUPS: usize = 4;

/// `y[i * ys + r] = Σ_kk x[i, kk] · w[r, kk] + bias[r]` for `i < m`, `r < rows`: register
/// tiles of `MR` rows of `x` × `NR` rows of `w` (see the module documentation), 16 inputs per
/// step (one prefetched line per row of `w`), then 8, then a masked tail.
///
/// # Safety
/// AVX2 and FMA available; `x` holds `m · k`, `w` `rows · k` and `bias` (if any) `rows`
/// floats; `y` as in [`super::kernels::rows_block`].
#[target_feature(enable = "avx2,fma")]
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
    let ctx = Rows {
        x: x.as_ptr(),
        w: w.as_ptr(),
        k,
        bias: bias.map_or(std::ptr::null(), |b| b.as_ptr()),
        y,
        ys,
        // With 3 or more tiles of rows of `x` per group of rows of `w`, tile `b` prefetches
        // the group's row `b` (not all from the first tile: a burst of prefetches queued
        // behind each other).
        spread: m >= 12,
    };
    // SAFETY (all tiles below): rows i .. i + MR <= m of `x`, r .. r + NR <= rows of `w`,
    // and their outputs, are in the caller's contract.
    if m >= 4 {
        let mut r = 0;
        while r + 3 <= rows {
            let mut i = 0;
            while i + 4 <= m {
                ctx.tile::<4, 3>(i, r);
                i += 4;
            }
            match m - i {
                1 => ctx.tile::<1, 3>(i, r),
                2 => ctx.tile::<2, 3>(i, r),
                3 => ctx.tile::<3, 3>(i, r),
                _ => {}
            }
            r += 3;
        }
        while r < rows {
            let mut i = 0;
            while i + 4 <= m {
                ctx.tile::<4, 1>(i, r);
                i += 4;
            }
            while i < m {
                ctx.tile::<1, 1>(i, r);
                i += 1;
            }
            r += 1;
        }
    } else {
        let mut r = 0;
        while r + 4 <= rows {
            match m {
                1 => ctx.tile::<1, 4>(0, r),
                2 => ctx.tile::<2, 4>(0, r),
                3 => {
                    ctx.tile::<2, 4>(0, r);
                    ctx.tile::<1, 4>(2, r);
                }
                _ => {}
            }
            r += 4;
        }
        while r < rows {
            for i in 0..m {
                ctx.tile::<1, 1>(i, r);
            }
            r += 1;
        }
    }
}

/// The operands of [`rows_block`], as raw pointers for its tiles.
struct Rows {
    x: *const f32,
    w: *const f32,
    k: usize,
    /// Null for none.
    bias: *const f32,
    y: *mut f32,
    ys: usize,
    spread: bool,
}

impl Rows {
    /// Outputs `(i + a, r + b)` for `a < MR`, `b < NR`.
    ///
    /// # Safety
    /// AVX2 and FMA available; rows `i .. i + MR` of `x` and `r .. r + NR` of `w` exist, and
    /// the outputs are the caller's to write ([`rows_block`]'s contract).
    #[inline(always)]
    unsafe fn tile<const MR: usize, const NR: usize>(&self, i: usize, r: usize) {
        let k = self.k;
        let prefetch: [bool; NR] =
            std::array::from_fn(|b| if self.spread { i == 4 * b } else { i == 0 });
        let xp: [*const f32; MR] = std::array::from_fn(|a| self.x.add((i + a) * k));
        let wp: [*const f32; NR] = std::array::from_fn(|b| self.w.add((r + b) * k));
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        macro_rules! step {
            ($c:expr, $load:expr) => {{
                let wv: [__m256; NR] = std::array::from_fn(|b| $load(wp[b].add($c)));
                for a in 0..MR {
                    let xv = $load(xp[a].add($c));
                    for b in 0..NR {
                        acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
                    }
                }
            }};
        }
        let full = |p: *const f32| _mm256_loadu_ps(p);
        let mut c = 0;
        while c + 16 <= k {
            for b in 0..NR {
                if prefetch[b] {
                    // A hint, never a fault: past the end of `w` it does nothing.
                    _mm_prefetch::<_MM_HINT_T1>(
                        wp[b].wrapping_add(c + PREFETCH_GROUPS * NR * k).cast(),
                    );
                }
            }
            step!(c, full);
            step!(c + 8, full);
            c += 16;
        }
        if c + 8 <= k {
            step!(c, full);
            c += 8;
        }
        if c < k {
            let mask = lanes8(k - c);
            // Masked: the lanes past k are neither read nor faulted on (zero).
            let part = |p: *const f32| _mm256_maskload_ps(p, mask);
            step!(c, part);
        }
        let bias = |b: usize| {
            if self.bias.is_null() {
                0.0
            } else {
                *self.bias.add(r + b)
            }
        };
        let out = |a: usize, b: usize| self.y.add((i + a) * self.ys + r + b);
        // The sums, several at a time: 8 and 4 per shuffle network, then one by one.
        let mut sums = [0f32; 16];
        let n = MR * NR;
        let mut j = 0;
        while j + 8 <= n {
            let v: [__m256; 8] = std::array::from_fn(|q| acc[(j + q) / NR][(j + q) % NR]);
            _mm256_storeu_ps(sums.as_mut_ptr().add(j), sums_8(v));
            j += 8;
        }
        while j + 4 <= n {
            let v: [__m256; 4] = std::array::from_fn(|q| acc[(j + q) / NR][(j + q) % NR]);
            _mm_storeu_ps(sums.as_mut_ptr().add(j), sums_4(v));
            j += 4;
        }
        // One by one, in the order of the networks above (`sums_4` of one vector), so an
        // output is the same whichever tile computed it: a row's result does not depend on
        // the rows batched with it.
        while j < n {
            sums[j] = _mm_cvtss_f32(sums_4([acc[j / NR][j % NR]; 4]));
            j += 1;
        }
        for a in 0..MR {
            for b in 0..NR {
                *out(a, b) = sums[a * NR + b] + bias(b);
            }
        }
    }
}

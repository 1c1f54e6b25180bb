//! The `vdpbf16ps` micro-kernel of the bf16 projection ([`super::bf16`]; `_mm512_dpbf16_ps`,
//! stable since Rust 1.89).

#![allow(clippy::too_many_arguments)]

use super::tile::{PANEL, R};
use crate::simd::avx512::{lanes16, load, store};
use core::arch::x86_64::*;

/// [`super::bf16::accumulate`] with AVX-512 BF16.
///
/// # Safety
/// AVX-512F, BW, VL and BF16 available; `1 <= w <= 64`; `x` readable at the pairs named by
/// [`super::bf16::accumulate`] for `i < nr`, `p < kc2`; `wp` readable at `p * 64 + c` and `acc`
/// readable and writable at `i * 64 + c`, for `p < kc2`, `i < nr`, `c < w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn accumulate(
    x: *const u32,
    gs: usize,
    kc2: usize,
    wp: *const u32,
    acc: *mut f32,
    nr: usize,
    w: usize,
) {
    // SAFETY: the caller's contract.
    columns(x, gs, kc2, wp, Out::Tile(acc), nr, w)
}

/// [`super::bf16::product_rounded`] with AVX-512 BF16; `bias` null for none.
///
/// # Safety
/// AVX-512F, BW, VL and BF16 available; `1 <= w <= 64`; `x` and `wp` as in
/// [`accumulate`] for `p < k2`; `bias` null or readable for `w` floats; `y` writable for
/// `w` values at `y + i * ys`, `i < nr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn product_rounded(
    x: *const u32,
    gs: usize,
    k2: usize,
    wp: *const u32,
    bias: *const f32,
    y: *mut u16,
    ys: usize,
    nr: usize,
    w: usize,
) {
    // SAFETY: the caller's contract.
    columns(x, gs, k2, wp, Out::Rounded { bias, y, ys }, nr, w)
}

/// [`rows`] for `w` columns: the number of vectors and the last one's mask.
///
/// # Safety
/// As [`accumulate`] (`out` a tile) or [`product_rounded`] (`out` rounded), with the
/// features enabled by the caller.
#[inline(always)]
unsafe fn columns(
    x: *const u32,
    gs: usize,
    kc2: usize,
    wp: *const u32,
    out: Out,
    nr: usize,
    w: usize,
) {
    let nv = w.div_ceil(16);
    let last = w - 16 * (nv - 1);
    let tail = lanes16(last);
    // SAFETY: the caller's contract, with `nv` in 1..=4 since 1 <= w <= 64.
    match (nv, last == 16) {
        (1, false) => rows::<1, false>(x, gs, kc2, wp, out, nr, tail),
        (2, false) => rows::<2, false>(x, gs, kc2, wp, out, nr, tail),
        (3, false) => rows::<3, false>(x, gs, kc2, wp, out, nr, tail),
        (_, false) => rows::<4, false>(x, gs, kc2, wp, out, nr, tail),
        (1, true) => rows::<1, true>(x, gs, kc2, wp, out, nr, tail),
        (2, true) => rows::<2, true>(x, gs, kc2, wp, out, nr, tail),
        (3, true) => rows::<3, true>(x, gs, kc2, wp, out, nr, tail),
        (_, true) => rows::<4, true>(x, gs, kc2, wp, out, nr, tail),
    }
}

/// Where a micro-tile's sums start from and end up.
#[derive(Clone, Copy)]
enum Out {
    /// An `f32` tile (row stride 64), read first and written back.
    Tile(*mut f32),
    /// Started from `bias` (or zero when null), rounded to bf16 into `y` (row stride
    /// `ys`).
    Rounded {
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
            Out::Tile(acc) => Out::Tile(acc.add(i * PANEL)),
            Out::Rounded { bias, y, ys } => Out::Rounded {
                bias,
                y: y.add(i * ys),
                ys,
            },
        }
    }
}

/// [`super::round_row`]: `len` values of `src` rounded into `dst`, 16 at a time.
///
/// # Safety
/// AVX-512F, BW, VL and BF16 available; `src` readable and `dst` writable for `len`
/// values (the masked lanes of the last vector are neither read nor written).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn round_row(src: *const f32, dst: *mut u16, len: usize) {
    let mut i = 0;
    while i < len {
        let mask = lanes16(len - i);
        let v = _mm512_maskz_loadu_ps(mask, src.add(i));
        // SAFETY: both are 32-byte vectors of 16 × 16 bits.
        let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(v));
        _mm256_mask_storeu_epi16(dst.add(i).cast(), mask, h);
        i += 16;
    }
}

/// [`accumulate`] or [`product_rounded`] for `w = 16 * (NV - 1) + popcount(tail)` columns.
///
/// # Safety
/// As those, with `1 <= NV <= 4`.
#[inline(always)]
unsafe fn rows<const NV: usize, const FULL: bool>(
    x: *const u32,
    gs: usize,
    kc2: usize,
    wp: *const u32,
    out: Out,
    nr: usize,
    tail: __mmask16,
) {
    let mut i = 0;
    while i + R <= nr {
        // SAFETY: rows i .. i + R <= nr (group i / R) are in the caller's contract.
        tile::<NV, R, FULL>(x.add(i / R * gs), kc2, wp, out.at_row(i), tail);
        i += R;
    }
    // SAFETY: as above for the last nr - i < R rows, the first rows of group i / R.
    let (xi, oi) = (x.add(i / R * gs), out.at_row(i));
    match nr - i {
        1 => tile::<NV, 1, FULL>(xi, kc2, wp, oi, tail),
        2 => tile::<NV, 2, FULL>(xi, kc2, wp, oi, tail),
        3 => tile::<NV, 3, FULL>(xi, kc2, wp, oi, tail),
        4 => tile::<NV, 4, FULL>(xi, kc2, wp, oi, tail),
        5 => tile::<NV, 5, FULL>(xi, kc2, wp, oi, tail),
        _ => {}
    }
}

/// `RR` rows × `16 * NV` columns (the last vector masked by `tail` unless `FULL`),
/// accumulators in registers over the whole chunk, from and to `out`.
///
/// # Safety
/// AVX-512F, BW, VL and BF16 available; `NV <= 4`, `RR <= 6`; `x` (one packed group)
/// readable at `p * 6 + r` for `r < RR`, `p < kc2`; `wp` readable at `p * 64 + c`; for
/// `r < RR` and the columns named above, `out`'s tile readable and writable at `r * 64 +
/// c`, or its `bias` (unless null) readable at `c` and its `y` writable at `r * ys + c`
/// (masked lanes are neither read nor written, and AVX-512 suppresses faults on them).
#[inline(always)]
unsafe fn tile<const NV: usize, const RR: usize, const FULL: bool>(
    x: *const u32,
    kc2: usize,
    wp: *const u32,
    out: Out,
    tail: __mmask16,
) {
    let masked = |v: usize| !FULL && v + 1 == NV;
    let mut a = [[_mm512_setzero_ps(); NV]; RR];
    match out {
        Out::Tile(acc) => {
            for (r, a) in a.iter_mut().enumerate() {
                for (v, a) in a.iter_mut().enumerate() {
                    *a = load(masked(v), tail, acc.add(r * PANEL + 16 * v));
                }
            }
        }
        Out::Rounded { bias, .. } if !bias.is_null() => {
            for v in 0..NV {
                let b = load(masked(v), tail, bias.add(16 * v));
                for a in a.iter_mut() {
                    a[v] = b;
                }
            }
        }
        Out::Rounded { .. } => {}
    }
    for p in 0..kc2 {
        let wr = wp.add(p * PANEL);
        let wv: [__m512bh; NV] = std::array::from_fn(|v| {
            let bits = if masked(v) {
                _mm512_maskz_loadu_epi32(tail, wr.add(16 * v).cast())
            } else {
                _mm512_loadu_si512(wr.add(16 * v).cast())
            };
            // SAFETY: both are 64-byte vectors and every bit pattern is a valid pair of
            // bf16 values per lane.
            std::mem::transmute::<__m512i, __m512bh>(bits)
        });
        for (r, a) in a.iter_mut().enumerate() {
            // SAFETY: as above; the pair (x(r, 2p), x(r, 2p + 1)) in every lane.
            let xb = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                *x.add(p * R + r) as i32
            ));
            for v in 0..NV {
                a[v] = _mm512_dpbf16_ps(a[v], xb, wv[v]);
            }
        }
    }
    match out {
        Out::Tile(acc) => {
            for (r, a) in a.iter().enumerate() {
                for (v, a) in a.iter().enumerate() {
                    store(masked(v), tail, acc.add(r * PANEL + 16 * v), *a);
                }
            }
        }
        Out::Rounded { y, ys, .. } => {
            for (r, a) in a.iter().enumerate() {
                for (v, a) in a.iter().enumerate() {
                    // SAFETY: both are 32-byte vectors of 16 × 16 bits.
                    let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(*a));
                    let m = if masked(v) { tail } else { 0xffff };
                    _mm256_mask_storeu_epi16(y.add(r * ys + 16 * v).cast(), m, h);
                }
            }
        }
    }
}

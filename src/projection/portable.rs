//! Plain-Rust micro-kernels of the projection, written so the compiler vectorises them; `FMA`
//! selects fused multiply-adds (only when compiled with the `fma` target feature).
#![allow(clippy::too_many_arguments)]

use super::tile::{PANEL, R};
use crate::simd::fma;

/// Plain-Rust [`super::kernels::accumulate`], row by row (the loop over the `w` columns vectorises).
///
/// # Safety
/// The contract of [`super::kernels::accumulate`].
#[inline(always)]
pub(super) unsafe fn accumulate<const FMA: bool>(
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    for i in 0..nr {
        // SAFETY: row i < nr of the caller's rectangle, `w` floats, accessed by no one else.
        let row = std::slice::from_raw_parts_mut(y.add(i * ys), w);
        let group = &x[i / R * gs + i % R..];
        for kk in 0..kc {
            let a = group[kk * R];
            for (yv, &wv) in row.iter_mut().zip(&wp[kk * PANEL..kk * PANEL + w]) {
                *yv = fma::<FMA>(a, wv, *yv);
            }
        }
    }
}

/// The portable loop: one dot product at a time.
///
/// # Safety
/// As [`super::kernels::rows_block`], with the lengths it asserts.
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
    for r in 0..rows {
        let wr = &w[r * k..(r + 1) * k];
        let b = bias.map_or(0.0, |b| b[r]);
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let dot: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            // SAFETY: i < m, r < rows: the caller's contract.
            unsafe { *y.add(i * ys + r) = dot + b };
        }
    }
}

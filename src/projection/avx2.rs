//! AVX2 + FMA micro-kernels of the projection.
#![allow(clippy::too_many_arguments)]

use super::portable;

/// [`portable::accumulate`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the contract of [`super::kernels::accumulate`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn accumulate(
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    // SAFETY: the caller's contract.
    portable::accumulate::<true>(x, gs, kc, wp, y, ys, nr, w)
}

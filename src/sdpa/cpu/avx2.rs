//! The AVX2 + FMA micro-kernels of the tiled attention: the portable kernels compiled a second
//! time with those features enabled.
#![allow(clippy::too_many_arguments)]

use super::portable;

/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores(
    qt: &[f32],
    d: usize,
    k: &[f32],
    ks: usize,
    nk: usize,
    st: &mut [f32],
    nv: usize,
    c: f32,
) {
    portable::scores::<true>(qt, d, k, ks, nk, st, nv, c)
}

/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_update(
    st: &mut [f32],
    nk: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
    nv: usize,
) {
    portable::softmax_update::<true>(st, nk, m, l, alpha, nv)
}

/// # Safety
/// The CPU supports AVX2 and FMA; the contract of [`portable::pv`].
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv(
    st: &[f32],
    nk: usize,
    v: &[f32],
    vs: usize,
    dv: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: &[f32],
    first: bool,
) {
    portable::pv::<true>(st, nk, v, vs, dv, o, os, nq, alpha, first)
}

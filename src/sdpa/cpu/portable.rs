//! Plain-Rust micro-kernels of the tiled attention, written to auto-vectorise; `FMA` selects
//! fused multiply-adds (only when compiled with the `fma` target feature, where they are
//! single instructions).
#![allow(clippy::too_many_arguments)]

use super::tile::BQ;
use crate::simd::{fma, EXP2_POLY};

/// `2^x`, branch-free (vectorisable); `0` for `x < -126.5` (including `-inf`).
#[inline(always)]
pub fn exp2<const FMA: bool>(x: f32) -> f32 {
    let x = x.clamp(-127.0, 127.0);
    let n = (x + 12_582_912.0) - 12_582_912.0; // round to nearest
    let f = x - n;
    let c = EXP2_POLY;
    let mut p = c[0];
    for &ci in &c[1..] {
        p = fma::<FMA>(p, f, ci);
    }
    // n = -127 gives the bit pattern of +0.0.
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[inline(always)]
pub fn scores<const FMA: bool>(
    qt: &[f32],
    d: usize,
    k: &[f32],
    ks: usize,
    nk: usize,
    st: &mut [f32],
    nv: usize,
    c: f32,
) {
    let w = 16 * nv;
    for j in 0..nk {
        let row = &mut st[j * BQ..j * BQ + w];
        row.fill(0.0);
        for (dd, &kv) in k[j * ks..j * ks + d].iter().enumerate() {
            for (s, &q) in row.iter_mut().zip(&qt[dd * BQ..dd * BQ + w]) {
                *s = fma::<FMA>(kv, q, *s);
            }
        }
        row.iter_mut().for_each(|s| *s *= c);
    }
}

#[inline(always)]
pub fn softmax_update<const FMA: bool>(
    st: &mut [f32],
    nk: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
    nv: usize,
) {
    let w = 16 * nv;
    let mut mx = [f32::NEG_INFINITY; BQ];
    for j in 0..nk {
        for (a, &s) in mx[..w].iter_mut().zip(&st[j * BQ..j * BQ + w]) {
            *a = a.max(s);
        }
    }
    let mut m_use = [0f32; BQ];
    for i in 0..w {
        let m_new = m[i].max(mx[i]);
        m_use[i] = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        alpha[i] = exp2::<FMA>(m[i] - m_use[i]);
        m[i] = m_new;
    }
    let mut sum = [0f32; BQ];
    for j in 0..nk {
        let row = &mut st[j * BQ..j * BQ + w];
        for ((s, &mu), acc) in row.iter_mut().zip(&m_use[..w]).zip(&mut sum[..w]) {
            *s = exp2::<FMA>(*s - mu);
            *acc += *s;
        }
    }
    for i in 0..w {
        l[i] = fma::<FMA>(l[i], alpha[i], sum[i]);
    }
}

/// # Safety
/// Rows `i < nq` of `o` (`dv` floats at `o + i * os`) are valid for reads and writes and
/// accessed by nothing else meanwhile.
#[inline(always)]
pub unsafe fn pv<const FMA: bool>(
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
    for i in 0..nq {
        // SAFETY: row i < nq, the caller's contract.
        let orow = std::slice::from_raw_parts_mut(o.add(i * os), dv);
        if first {
            orow.fill(0.0);
        } else {
            let a = alpha[i];
            orow.iter_mut().for_each(|x| *x *= a);
        }
        for j in 0..nk {
            let p = st[j * BQ + i];
            for (x, &vv) in orow.iter_mut().zip(&v[j * vs..j * vs + dv]) {
                *x = fma::<FMA>(p, vv, *x);
            }
        }
    }
}

//! Plain-Rust micro-kernels of the tiled attention (what aarch64 and x86-64 CPUs without AVX2
//! run), written so the compiler vectorises them for the target's baseline (SSE2, NEON):
//! register tiles of fixed-size lane arrays (`[f32; 8]`), fixed trip counts, rows cut to
//! their length before the inner loops, the `2^x` polynomial branch-free
//! ([`crate::simd::exp2`]). `FMA` selects fused multiply-adds (only when compiled with the
//! `fma` target feature, where they are single instructions).
//!
//! * scores: tiles of 4 keys × 8 queries (8 vectors of sums on a 4-lane target);
//! * `P·V`: tiles of 4 queries × 8 value columns, the columns past the last multiple of 8
//!   row by row.
#![allow(clippy::too_many_arguments)]

use super::tile::BQ;
use crate::simd::{exp2, fma};

/// Lanes per accumulator array.
const L: usize = 8;
/// Keys per score tile and queries per `P·V` tile.
const T: usize = 4;

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
    let qt = &qt[..d * BQ];
    let mut j = 0;
    while j + T <= nk {
        scores_tile::<FMA, T>(qt, d, k, ks, j, st, w, c);
        j += T;
    }
    match nk - j {
        1 => scores_tile::<FMA, 1>(qt, d, k, ks, j, st, w, c),
        2 => scores_tile::<FMA, 2>(qt, d, k, ks, j, st, w, c),
        3 => scores_tile::<FMA, 3>(qt, d, k, ks, j, st, w, c),
        _ => {}
    }
}

/// Keys `j0 .. j0 + R` against the first `w` (a multiple of 8) queries.
#[inline(always)]
fn scores_tile<const FMA: bool, const R: usize>(
    qt: &[f32],
    d: usize,
    k: &[f32],
    ks: usize,
    j0: usize,
    st: &mut [f32],
    w: usize,
    c: f32,
) {
    let keys: [&[f32]; R] = std::array::from_fn(|r| &k[(j0 + r) * ks..(j0 + r) * ks + d]);
    for c0 in (0..w).step_by(L) {
        let mut acc = [[0f32; L]; R];
        for (dd, qrow) in qt.chunks_exact(BQ).enumerate().take(d) {
            let q: &[f32; L] = qrow[c0..c0 + L].try_into().expect("8 lanes");
            for r in 0..R {
                let kv = keys[r][dd];
                for i in 0..L {
                    acc[r][i] = fma::<FMA>(kv, q[i], acc[r][i]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let o = &mut st[(j0 + r) * BQ + c0..(j0 + r) * BQ + c0 + L];
            for (o, &a) in o.iter_mut().zip(acc) {
                *o = a * c;
            }
        }
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
    for row in st.chunks_exact(BQ).take(nk) {
        for (a, &s) in mx[..w].iter_mut().zip(&row[..w]) {
            // `>` is false for NaN: a NaN score is skipped here and poisons the sum below.
            *a = if s > *a { s } else { *a };
        }
    }
    let mut m_use = [0f32; BQ];
    for i in 0..w {
        let m_new = if mx[i] > m[i] { mx[i] } else { m[i] };
        m_use[i] = if m_new == f32::NEG_INFINITY {
            0.0
        } else {
            m_new
        };
        alpha[i] = exp2::<FMA>(m[i] - m_use[i]);
        m[i] = m_new;
    }
    let mut sum = [0f32; BQ];
    for row in st.chunks_exact_mut(BQ).take(nk) {
        for ((s, &mu), acc) in row[..w].iter_mut().zip(&m_use[..w]).zip(&mut sum[..w]) {
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
    let whole = dv / L * L;
    let mut i = 0;
    while i + T <= nq {
        // SAFETY: rows i .. i + T < nq: the caller's contract.
        pv_tile::<FMA, T>(st, nk, v, vs, whole, o, os, i, alpha, first);
        i += T;
    }
    // SAFETY: as above, for the last nq - i < T rows.
    match nq - i {
        1 => pv_tile::<FMA, 1>(st, nk, v, vs, whole, o, os, i, alpha, first),
        2 => pv_tile::<FMA, 2>(st, nk, v, vs, whole, o, os, i, alpha, first),
        3 => pv_tile::<FMA, 3>(st, nk, v, vs, whole, o, os, i, alpha, first),
        _ => {}
    }
    if whole < dv {
        for i in 0..nq {
            // SAFETY: row i < nq, columns whole .. dv: the caller's contract.
            let orow = std::slice::from_raw_parts_mut(o.add(i * os + whole), dv - whole);
            if first {
                orow.fill(0.0);
            } else {
                let a = alpha[i];
                orow.iter_mut().for_each(|x| *x *= a);
            }
            for (j, prow) in st.chunks_exact(BQ).enumerate().take(nk) {
                let p = prow[i];
                let vr = &v[j * vs + whole..j * vs + dv];
                for (x, &vv) in orow.iter_mut().zip(vr) {
                    *x = fma::<FMA>(p, vv, *x);
                }
            }
        }
    }
}

/// Output rows `i0 .. i0 + R`, the first `whole` (a multiple of 8) columns, 8 at a time.
///
/// # Safety
/// As [`pv`] for those rows.
#[inline(always)]
unsafe fn pv_tile<const FMA: bool, const R: usize>(
    st: &[f32],
    nk: usize,
    v: &[f32],
    vs: usize,
    whole: usize,
    o: *mut f32,
    os: usize,
    i0: usize,
    alpha: &[f32],
    first: bool,
) {
    let a: [f32; R] = std::array::from_fn(|r| alpha[i0 + r]);
    for c0 in (0..whole).step_by(L) {
        let mut acc = [[0f32; L]; R];
        if !first {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row i0 + r < nq, columns c0 .. c0 + 8 <= dv: the caller's.
                let orow = std::slice::from_raw_parts(o.add((i0 + r) * os + c0), L);
                for i in 0..L {
                    acc[i] = orow[i] * a[r];
                }
            }
        }
        for (j, prow) in st.chunks_exact(BQ).enumerate().take(nk) {
            let p: &[f32; R] = prow[i0..i0 + R].try_into().expect("R probabilities");
            let vr: &[f32; L] = v[j * vs + c0..j * vs + c0 + L].try_into().expect("8 lanes");
            for r in 0..R {
                for i in 0..L {
                    acc[r][i] = fma::<FMA>(p[r], vr[i], acc[r][i]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: as above.
            std::slice::from_raw_parts_mut(o.add((i0 + r) * os + c0), L).copy_from_slice(acc);
        }
    }
}

/// Scores of `nk` keys against `nq` query rows read in place, times `c`, for query blocks of
/// at most [`super::tile::FEW_QUERIES`] rows (decoding), as the AVX kernels' `scores_few`:
/// `st[j * BQ + i] = c · Σ_d k[j * ks + d] * q[i * qs + d]` for `i < nq`, and `0` for
/// `nq <= i < 16`; the head dimension in lane arrays of 8, the rest one by one.
#[inline(always)]
pub fn scores_few<const FMA: bool>(
    q: &[f32],
    qs: usize,
    nq: usize,
    d: usize,
    k: &[f32],
    ks: usize,
    nk: usize,
    st: &mut [f32],
    c: f32,
) {
    let whole = d / L * L;
    for (j, row) in st.chunks_exact_mut(BQ).take(nk).enumerate() {
        let kr = &k[j * ks..j * ks + d];
        row[..16].fill(0.0);
        for (i, s) in row[..nq].iter_mut().enumerate() {
            let qr = &q[i * qs..i * qs + d];
            let mut acc = [0f32; L];
            for (kc, qc) in kr[..whole].chunks_exact(L).zip(qr[..whole].chunks_exact(L)) {
                for t in 0..L {
                    acc[t] = fma::<FMA>(kc[t], qc[t], acc[t]);
                }
            }
            // Pairwise, as the vector kernels reduce their lanes.
            let mut sum =
                ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
            for t in whole..d {
                sum = fma::<FMA>(kr[t], qr[t], sum);
            }
            *s = sum * c;
        }
    }
}

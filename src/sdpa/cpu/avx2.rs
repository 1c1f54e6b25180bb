//! AVX2 + FMA micro-kernels of the tiled attention kernel ([`super::tiled`]), for 16 `ymm`
//! registers, and the F16C / AVX2 conversions of half-precision tiles ([`super::half`]).
//!
//! Every function here is `unsafe` and `#[target_feature(enable = "avx2,fma")]` (F16C too for
//! the conversions): it may only be called with an [`crate::simd::Isa::Avx2`] or `Avx512`,
//! which exist only after `is_x86_feature_detected!` found AVX2, FMA and F16C; the safe
//! wrappers in [`super::kernels`] and [`super::half`] guarantee that and check every slice
//! length the kernels rely on. Layouts as in `super::avx512` (`BQ` = 64 queries per block):
//! `qt` `(D, BQ)`, the score tile `st` `(nk, BQ)`, key / value rows at strides `ks` / `vs`, the
//! output rows at stride `os`.
//!
//! * scores: tiles of 6 keys × 16 queries (12 accumulators, two query vectors, one broadcast
//!   key element: 15 registers), the key rows read in place;
//! * online softmax: the maxima a key row of the tile at a time, then the exponentials 16
//!   queries down all keys at a time, running sums in registers, `2^x` by the polynomial of
//!   `simd::scalar::EXP2_POLY` ([`crate::simd::avx2::exp2_nonpositive_ps`]);
//! * `P·V`: tiles of 6 queries × 16 value columns (12 accumulators, two value vectors, one
//!   broadcast probability).

#![allow(clippy::too_many_arguments)]

use super::tile::BQ;
use crate::simd::avx2::{exp2_nonpositive_ps, exp2_ps, lanes8, load, store, sums_8, transpose_8x8};
use core::arch::x86_64::*;

/// Keys per micro-tile of the score kernel.
const RS: usize = 6;
/// Queries per micro-tile of the P·V kernel.
const RP: usize = 6;

/// Scores of `nk` keys against `16 * nv` queries, times `c`:
/// `st[j * BQ + i] = c · Σ_d k[j * ks + d] * qt[d * BQ + i]`.
///
/// # Safety
/// AVX2 and FMA available; `1 <= nv <= 4`; `qt` readable for `d * BQ` floats, `k` for
/// `(nk - 1) * ks + d` floats (when `nk > 0`), `st` writable for `nk * BQ` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores(
    qt: *const f32,
    d: usize,
    k: *const f32,
    ks: usize,
    nk: usize,
    st: *mut f32,
    nv: usize,
    c: f32,
) {
    let c = _mm256_set1_ps(c);
    let mut j = 0;
    while j + RS <= nk {
        // SAFETY: keys j .. j + RS exist: `k.add(j * ks)` is readable for (RS - 1) * ks + d
        // floats and `st.add(j * BQ)` writable for RS * BQ floats (j + RS <= nk).
        for s in 0..nv {
            scores_tile::<RS>(
                qt.add(16 * s),
                d,
                k.add(j * ks),
                ks,
                st.add(j * BQ + 16 * s),
                c,
            );
        }
        j += RS;
    }
    if j == nk {
        return;
    }
    // SAFETY: as in the loop, for the remaining nk - j < RS keys (j < nk).
    let (kj, sj) = (k.add(j * ks), st.add(j * BQ));
    for s in 0..nv {
        let (q, o) = (qt.add(16 * s), sj.add(16 * s));
        match nk - j {
            1 => scores_tile::<1>(q, d, kj, ks, o, c),
            2 => scores_tile::<2>(q, d, kj, ks, o, c),
            3 => scores_tile::<3>(q, d, kj, ks, o, c),
            4 => scores_tile::<4>(q, d, kj, ks, o, c),
            5 => scores_tile::<5>(q, d, kj, ks, o, c),
            _ => {}
        }
    }
}

/// `R` keys × 16 queries, accumulators in registers over the whole head dimension.
///
/// # Safety
/// AVX2 and FMA available; `qt` readable at `dd * BQ ..` for 16 floats, `dd < d`; `k`
/// readable for `(R - 1) * ks + d` floats; `st` writable at `r * BQ ..` for 16 floats, `r < R`.
#[inline(always)]
unsafe fn scores_tile<const R: usize>(
    qt: *const f32,
    d: usize,
    k: *const f32,
    ks: usize,
    st: *mut f32,
    c: __m256,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for dd in 0..d {
        let q = qt.add(dd * BQ);
        let (q0, q1) = (_mm256_loadu_ps(q), _mm256_loadu_ps(q.add(8)));
        for (r, acc) in acc.iter_mut().enumerate() {
            let kb = _mm256_broadcast_ss(&*k.add(r * ks + dd));
            acc[0] = _mm256_fmadd_ps(kb, q0, acc[0]);
            acc[1] = _mm256_fmadd_ps(kb, q1, acc[1]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(st.add(r * BQ), _mm256_mul_ps(acc[0], c));
        _mm256_storeu_ps(st.add(r * BQ + 8), _mm256_mul_ps(acc[1], c));
    }
}

/// The query block transposed: `qt[dd * BQ + i] = q[i * qs + dd]` for `i < nq`, `dd < d`,
/// and `0` for `nq <= i < 16 * ceil(nq / 16)`, by 8 × 8 tiles transposed in registers.
///
/// # Safety
/// AVX2 available; `nq <= BQ`; `q` readable at `i * qs + dd` for `i < nq`, `dd < d`; `qt`
/// writable for `d * BQ` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn transpose_queries(q: *const f32, qs: usize, nq: usize, d: usize, qt: *mut f32) {
    let padded = nq.div_ceil(16) * 16;
    let mut i0 = 0;
    while i0 < padded {
        let rows = nq.saturating_sub(i0).min(8);
        let mut d0 = 0;
        while d0 < d {
            let cols = (d - d0).min(8);
            let cmask = lanes8(cols);
            let r: [__m256; 8] = std::array::from_fn(|i| {
                if i < rows {
                    // SAFETY: row i0 + i < nq, columns d0 .. d0 + cols <= d (masked: the
                    // lanes past `cols` are neither read nor faulted on).
                    load(cols < 8, cmask, q.add((i0 + i) * qs + d0))
                } else {
                    _mm256_setzero_ps()
                }
            });
            let t = transpose_8x8(r);
            for (c, t) in t.iter().enumerate().take(cols) {
                // SAFETY: row d0 + c < d of `qt`, lanes i0 .. i0 + 8 <= padded <= BQ.
                _mm256_storeu_ps(qt.add((d0 + c) * BQ + i0), *t);
            }
            d0 += 8;
        }
        i0 += 8;
    }
}

/// Adds `kb[j]` (already in the log2 domain) to row `j` of the score tile, for `16 * nv`
/// queries.
///
/// # Safety
/// AVX2 available; `nv <= 4`; `kb` readable for `nk` floats; `st` readable and writable for
/// `nk * BQ` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn add_key_bias(st: *mut f32, nk: usize, kb: *const f32, nv: usize) {
    // Reads kb[j] for j < nk and st[j * BQ + 8 v ..][..8] with 8 v + 8 <= 16 nv <= BQ.
    for j in 0..nk {
        let b = _mm256_set1_ps(*kb.add(j));
        let row = st.add(j * BQ);
        for v in 0..2 * nv {
            let p = row.add(8 * v);
            _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), b));
        }
    }
}

/// Online-softmax step for one score tile (`nk` keys × `16 * nv` queries, log2 domain), as
/// `super::avx512::softmax_update`: updates the running maxima `m` and sums `l`, overwrites
/// the tile with `2^(s - m_new)` and writes `alpha = 2^(m_old - m_new)`. Columns whose scores
/// are all `-inf` so far keep `m = -inf`, `l = 0`, and get `p = 0`.
///
/// # Safety
/// AVX2 and FMA available; `nv <= 4`; `st` readable and writable for `nk * BQ` floats; `m`,
/// `l` and `alpha` for `16 * nv` floats each.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_update(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
    nv: usize,
) {
    // SAFETY: the caller's contract, with 2 nv vectors of 8 queries.
    match nv {
        0 => {}
        1 => softmax_nv::<2>(st, nk, m, l, alpha),
        2 => softmax_nv::<4>(st, nk, m, l, alpha),
        3 => softmax_nv::<6>(st, nk, m, l, alpha),
        _ => softmax_nv::<8>(st, nk, m, l, alpha),
    }
}

/// The first half of a one-query online-softmax step (`softmax_update_one` here and at the
/// AVX-512 level), as lane 0 of the vector passes' `running_max` computes it: the maximum of
/// the keys' scores (`BQ` floats apart) merged into the running maximum `*m` (updated);
/// returns the old maximum and the maximum to subtract (the new one, or 0 while it is still
/// `-inf`, so that `-inf - m` stays `-inf` instead of NaN).
///
/// # Safety
/// `st` readable at `j * BQ` for `j < nk`; `m` readable and writable for one float.
#[inline(always)]
pub(super) unsafe fn running_max_one(st: *const f32, nk: usize, m: *mut f32) -> (f32, f32) {
    // `vmaxss` keeps the second operand when either is NaN, as `vmaxps` in the vector pass.
    // (SSE, which every x86-64 CPU has.)
    let mut mx = _mm_set_ss(f32::NEG_INFINITY);
    for j in 0..nk {
        mx = _mm_max_ss(mx, _mm_load_ss(st.add(j * BQ)));
    }
    let m_old = _mm_load_ss(m);
    let m_new = _mm_max_ss(m_old, mx);
    *m = _mm_cvtss_f32(m_new);
    let m_use = if *m == f32::NEG_INFINITY { 0.0 } else { *m };
    (_mm_cvtss_f32(m_old), m_use)
}

/// [`softmax_update`] for query 0 alone (a decoding step: one query per head), exactly as
/// lane 0 of the 16-query pass computes it (the same maximum, exponentials and left-to-right
/// sum) at a sixteenth of the exponentials: the keys' scores, 16 floats apart in the tile,
/// are gathered 8 at a time (`BQ` floats apart).
///
/// # Safety
/// AVX2 and FMA available; `st` readable and writable at `j * BQ` for `j < nk`; `m`, `l` and
/// `alpha` for one float each.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softmax_update_one(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    // SAFETY: the caller's contract.
    let (m_old, m_use) = running_max_one(st, nk, m);
    let a = _mm256_cvtss_f32(exp2_ps(_mm256_set1_ps(m_old - m_use)));
    *alpha = a;
    let mv = _mm256_set1_ps(m_use);
    // Key j's score is float j · BQ of the tile.
    let stride = BQ as i32;
    let offsets = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(stride),
    );
    let mut sum = 0f32;
    let mut e = [0f32; 8];
    let mut j = 0;
    while j < nk {
        let n = (nk - j).min(8);
        let p = st.add(j * BQ);
        let x = if n == 8 {
            _mm256_i32gather_ps::<4>(p, offsets)
        } else {
            // The last keys: only `n` of them are read (the other lanes give 2^-inf = 0,
            // unused).
            let mut x = [f32::NEG_INFINITY; 8];
            for (t, x) in x.iter_mut().enumerate().take(n) {
                *x = *p.add(t * BQ);
            }
            _mm256_loadu_ps(x.as_ptr())
        };
        _mm256_storeu_ps(e.as_mut_ptr(), exp2_nonpositive_ps(_mm256_sub_ps(x, mv)));
        for (t, &e) in e.iter().enumerate().take(n) {
            *p.add(t * BQ) = e;
            sum += e;
        }
        j += 8;
    }
    *l = (*l).mul_add(a, sum);
}

/// [`softmax_update`] for `V` vectors of 8 queries (`V = 2 · nv`).
///
/// # Safety
/// As [`softmax_update`] with `8 V <= BQ` queries.
#[inline(always)]
unsafe fn softmax_nv<const V: usize>(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Every access below is `st[j * BQ + 8 v ..][..8]` with `j < nk`, `8 v + 8 <= 8 V <=
    // BQ`, or `m`/`l`/`alpha[8 v ..][..8]`: the caller's contract.
    let mut mx = [neg_inf; V];
    for j in 0..nk {
        let row = st.add(j * BQ);
        for (v, mx) in mx.iter_mut().enumerate() {
            *mx = _mm256_max_ps(*mx, _mm256_loadu_ps(row.add(8 * v)));
        }
    }
    let mut m_use = [neg_inf; V];
    let mut a = [neg_inf; V];
    for v in 0..V {
        let m_old = _mm256_loadu_ps(m.add(8 * v));
        let m_new = _mm256_max_ps(m_old, mx[v]);
        // Still -inf: subtract 0 instead, so that -inf - m stays -inf instead of NaN.
        let dead = _mm256_cmp_ps::<_CMP_EQ_OQ>(m_new, neg_inf);
        m_use[v] = _mm256_andnot_ps(dead, m_new);
        a[v] = exp2_ps(_mm256_sub_ps(m_old, m_use[v]));
        _mm256_storeu_ps(m.add(8 * v), m_new);
        _mm256_storeu_ps(alpha.add(8 * v), a[v]);
    }
    // Two vectors (16 queries: one cache line of each tile row) down all the keys at a time,
    // two keys per step: their maxima and sums stay in registers beside the exponential's
    // constants and temporaries. All `V` sums and maxima at once do not fit in the 16 `ymm`
    // registers; spilled, this pass took 9.9 cycles a vector instead of 8.5 (Zen 3, in L1).
    for v in (0..V).step_by(2) {
        let (m0, m1) = (m_use[v], m_use[v + 1]);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut j = 0;
        while j + 2 <= nk {
            let p = st.add(j * BQ + 8 * v);
            exp_16(p, m0, m1, &mut s0, &mut s1);
            exp_16(p.add(BQ), m0, m1, &mut s0, &mut s1);
            j += 2;
        }
        if j < nk {
            exp_16(st.add(j * BQ + 8 * v), m0, m1, &mut s0, &mut s1);
        }
        for (u, s) in [(v, s0), (v + 1, s1)] {
            let l_old = _mm256_loadu_ps(l.add(8 * u));
            _mm256_storeu_ps(l.add(8 * u), _mm256_fmadd_ps(l_old, a[u], s));
        }
    }
}

/// `p[..16] = 2^(p[..16] - (m0, m1))` (8 lanes each), the results added to `s0`, `s1`.
///
/// # Safety
/// AVX2 and FMA available; `p` readable and writable for 16 floats.
#[inline(always)]
unsafe fn exp_16(p: *mut f32, m0: __m256, m1: __m256, s0: &mut __m256, s1: &mut __m256) {
    let e0 = exp2_nonpositive_ps(_mm256_sub_ps(_mm256_loadu_ps(p), m0));
    let e1 = exp2_nonpositive_ps(_mm256_sub_ps(_mm256_loadu_ps(p.add(8)), m1));
    _mm256_storeu_ps(p, e0);
    _mm256_storeu_ps(p.add(8), e1);
    *s0 = _mm256_add_ps(*s0, e0);
    *s1 = _mm256_add_ps(*s1, e1);
}

/// `o[i * os ..][:dv] = alpha[i] * o[i * os ..][:dv] + Σ_j st[j * BQ + i] * v[j * vs ..][:dv]`
/// for rows `0..nq`, keys `0..nk`; with `first`, `o[i * os ..][:dv] = Σ_j ...` (the old rows
/// are not read).
///
/// # Safety
/// AVX2 and FMA available; `nq <= BQ`; `dv <= os` when `nq > 1`; `st` readable for `nk * BQ`
/// floats; `v` for `(nk - 1) * vs + dv` floats (when `nk > 0`); rows `i < nq` of `o` (`dv`
/// floats at `o + i * os`) readable and writable; `alpha` readable for `nq` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv(
    st: *const f32,
    nk: usize,
    v: *const f32,
    vs: usize,
    dv: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: *const f32,
    first: bool,
) {
    let mut c0 = 0;
    if nq == 1 {
        // One query row (a decoding step): 64 columns at a time, 8 independent FMA chains
        // (the 16-column tiles below have 2 chains for one row, a quarter of the FMA rate
        // behind the FMA latency). The same FMAs in the same order: the same sums.
        while c0 + ROW_COLS <= dv {
            // SAFETY: columns c0 .. c0 + 64 <= dv of row 0 of `o` and of every `v` row.
            pv_row(st, nk, v.add(c0), vs, o.add(c0), alpha, first);
            c0 += ROW_COLS;
        }
    }
    while c0 < dv {
        let w = (dv - c0).min(16);
        let last = w - 8 * ((w - 1) / 8); // 1..=8 lanes in the last vector
        let mask = lanes8(last);
        // SAFETY: columns c0 .. c0 + w of every row lie inside the rows the caller vouches
        // for (c0 + w <= dv); `pv_cols` touches exactly those, the last vector masked to its
        // `last` lanes when partial (masked-off lanes are neither read nor written).
        let (vc, oc) = (v.add(c0), o.add(c0));
        match (w > 8, last == 8) {
            (true, true) => pv_cols::<2, false>(st, nk, vc, vs, os, oc, nq, alpha, mask, first),
            (true, false) => pv_cols::<2, true>(st, nk, vc, vs, os, oc, nq, alpha, mask, first),
            (false, true) => pv_cols::<1, false>(st, nk, vc, vs, os, oc, nq, alpha, mask, first),
            (false, false) => pv_cols::<1, true>(st, nk, vc, vs, os, oc, nq, alpha, mask, first),
        }
        c0 += 16;
    }
}

/// Columns of one output row per [`pv_row`] call: 8 vectors, the accumulators of 8
/// independent FMA chains.
const ROW_COLS: usize = 64;

/// [`pv`] for one output row and the [`ROW_COLS`] columns from `v` / `o`.
///
/// # Safety
/// AVX2 and FMA available; `st` readable at `j * BQ` for `j < nk`; `alpha` for one float;
/// columns `0..ROW_COLS` of `v` rows `j < nk` (stride `vs`) readable and of `o` readable and
/// writable.
#[inline(always)]
unsafe fn pv_row(
    st: *const f32,
    nk: usize,
    v: *const f32,
    vs: usize,
    o: *mut f32,
    alpha: *const f32,
    first: bool,
) {
    const NV: usize = ROW_COLS / 8;
    let mut acc = [_mm256_setzero_ps(); NV];
    if !first {
        let a = _mm256_broadcast_ss(&*alpha);
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_mul_ps(_mm256_loadu_ps(o.add(8 * c)), a);
        }
    }
    for j in 0..nk {
        let vr = v.add(j * vs);
        let p = _mm256_broadcast_ss(&*st.add(j * BQ));
        for (c, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr.add(8 * c)), *acc);
        }
    }
    for (c, acc) in acc.iter().enumerate() {
        _mm256_storeu_ps(o.add(8 * c), *acc);
    }
}

/// [`pv`] for the `8 * NV` columns (the last vector masked when `MASKED`) from `v` / `o`.
///
/// # Safety
/// AVX2 and FMA available; `1 <= NV <= 2`; `nq <= BQ`; `st` readable for `nk * BQ` floats;
/// `alpha` for `nq`; the columns named above of `v` rows `j < nk` (stride `vs`) readable and
/// of `o` rows `i < nq` (stride `os`) readable and writable.
#[inline(always)]
unsafe fn pv_cols<const NV: usize, const MASKED: bool>(
    st: *const f32,
    nk: usize,
    v: *const f32,
    vs: usize,
    os: usize,
    o: *mut f32,
    nq: usize,
    alpha: *const f32,
    mask: __m256i,
    first: bool,
) {
    let mut i = 0;
    while i + RP <= nq {
        // SAFETY: rows i .. i + RP exist (i + RP <= nq).
        pv_tile::<NV, RP, MASKED>(
            st.add(i),
            nk,
            v,
            vs,
            os,
            o.add(i * os),
            alpha.add(i),
            mask,
            first,
        );
        i += RP;
    }
    if i == nq {
        return;
    }
    // SAFETY: as in the loop, for the remaining nq - i < RP rows (i < nq).
    let (si, oi, ai) = (st.add(i), o.add(i * os), alpha.add(i));
    match nq - i {
        1 => pv_tile::<NV, 1, MASKED>(si, nk, v, vs, os, oi, ai, mask, first),
        2 => pv_tile::<NV, 2, MASKED>(si, nk, v, vs, os, oi, ai, mask, first),
        3 => pv_tile::<NV, 3, MASKED>(si, nk, v, vs, os, oi, ai, mask, first),
        4 => pv_tile::<NV, 4, MASKED>(si, nk, v, vs, os, oi, ai, mask, first),
        5 => pv_tile::<NV, 5, MASKED>(si, nk, v, vs, os, oi, ai, mask, first),
        _ => {}
    }
}

/// `R` output rows × `8 * NV` columns.
///
/// # Safety
/// AVX2 and FMA available; `st` readable at `j * BQ + r` for `j < nk`, `r < R`; `alpha` for
/// `R` floats; the columns of [`pv_cols`] of `v` rows `j < nk` readable and of `o` rows `r < R`
/// (stride `os`) readable and writable.
#[inline(always)]
unsafe fn pv_tile<const NV: usize, const R: usize, const MASKED: bool>(
    st: *const f32,
    nk: usize,
    v: *const f32,
    vs: usize,
    os: usize,
    o: *mut f32,
    alpha: *const f32,
    mask: __m256i,
    first: bool,
) {
    let masked = |c: usize| MASKED && c + 1 == NV;
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = _mm256_broadcast_ss(&*alpha.add(r));
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_mul_ps(load(masked(c), mask, o.add(r * os + 8 * c)), a);
            }
        }
    }
    for j in 0..nk {
        let vr = v.add(j * vs);
        let mut vv = [_mm256_setzero_ps(); NV];
        for (c, vv) in vv.iter_mut().enumerate() {
            *vv = load(masked(c), mask, vr.add(8 * c));
        }
        let sr = st.add(j * BQ);
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = _mm256_broadcast_ss(&*sr.add(r));
            for c in 0..NV {
                acc[c] = _mm256_fmadd_ps(p, vv[c], acc[c]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            store(masked(c), mask, o.add(r * os + 8 * c), *a);
        }
    }
}

/// Rows `r < rows` (`cols` elements at `src[r * ss ..]`) of f16 (`f16`, F16C `vcvtph2ps`) or
/// bf16 (a 16-bit shift) bits as `f32` into `dst[r * cols ..]`, 8 at a time.
///
/// # Safety
/// AVX2 and F16C available; `src` readable at `r * ss + c`, `dst` writable at `r * cols + c`,
/// for `r < rows`, `c < cols`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn convert_rows(
    src: *const u16,
    ss: usize,
    rows: usize,
    cols: usize,
    f16: bool,
    dst: *mut f32,
) {
    for r in 0..rows {
        let (s, d) = (src.add(r * ss), dst.add(r * cols));
        let mut c = 0;
        while c + 8 <= cols {
            // SAFETY: elements c .. c + 8 <= cols of row r.
            let h = _mm_loadu_si128(s.add(c).cast());
            let f = if f16 {
                _mm256_cvtph_ps(h)
            } else {
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            };
            _mm256_storeu_ps(d.add(c), f);
            c += 8;
        }
        while c < cols {
            let x = *s.add(c);
            *d.add(c) = if f16 {
                half::f16::from_bits(x).to_f32()
            } else {
                f32::from_bits(u32::from(x) << 16)
            };
            c += 1;
        }
    }
}

/// `out[i]` = `src[i]` rounded to f16 (`f16`, F16C `vcvtps2ph`) or bf16, to nearest even, as
/// `half::{f16, bf16}::from_f32` round (NaN stays NaN, quietened), for `i < n`.
///
/// # Safety
/// AVX2 and F16C available; `src` readable and `out` writable for `n` elements.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn round_to_half(src: *const f32, n: usize, f16: bool, out: *mut u16) {
    let mut i = 0;
    if f16 {
        while i + 8 <= n {
            // SAFETY: elements i .. i + 8 <= n.
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
            _mm_storeu_si128(out.add(i).cast(), h);
            i += 8;
        }
    } else {
        let round = |x: __m256| -> __m256i {
            let b = _mm256_castps_si256(x);
            // bits + 0x7fff + (bit 16), then the top half: round to nearest, ties to even.
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
            let r = _mm256_srli_epi32::<16>(_mm256_add_epi32(
                _mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)),
                lsb,
            ));
            // NaN: the top half with the quiet bit set (`half::bf16::from_f32`'s rule).
            let q = _mm256_or_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(0x40));
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            _mm256_blendv_epi8(r, q, nan)
        };
        while i + 16 <= n {
            // SAFETY: elements i .. i + 16 <= n.
            let a = round(_mm256_loadu_ps(src.add(i)));
            let b = round(_mm256_loadu_ps(src.add(i + 8)));
            // Values <= 0xffff: the unsigned saturating pack keeps them; it interleaves the
            // 128-bit lanes, which the permutation puts back in order.
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            _mm256_storeu_si256(out.add(i).cast(), p);
            i += 16;
        }
    }
    while i < n {
        let x = *src.add(i);
        *out.add(i) = if f16 {
            half::f16::from_f32(x).to_bits()
        } else {
            half::bf16::from_f32(x).to_bits()
        };
        i += 1;
    }
}

/// Scores of `nk` keys against `nq` query rows read in place, times `c`, for query blocks of
/// at most [`super::tile::FEW_QUERIES`] rows (decoding), as `super::avx512::scores_few`:
/// `st[j * BQ + i] = c · Σ_d k[j * ks + d] * q[i * qs + d]` for `i < nq`, and `0` for
/// `nq <= i < 16`. Eight keys at a time, one accumulator each, reduced together by
/// [`sums_8`].
///
/// # Safety
/// AVX2 and FMA available; `nq <= 16`; `q` readable at `i * qs + dd` for `i < nq`, `dd < d`;
/// `k` readable for `(nk - 1) * ks + d` floats (when `nk > 0`); `st` writable for `nk * BQ`
/// floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scores_few(
    q: *const f32,
    qs: usize,
    nq: usize,
    d: usize,
    k: *const f32,
    ks: usize,
    nk: usize,
    st: *mut f32,
    c: f32,
) {
    let tmask = lanes8(d % 8);
    let mut j = 0;
    while j < nk {
        let keys = (nk - j).min(8);
        // SAFETY: keys j .. j + keys < nk: rows of `k` and of `st` inside the contract; the
        // lanes of the masked tail past `d` are neither read nor faulted on.
        for r in 0..keys {
            let row = st.add((j + r) * BQ);
            _mm256_storeu_ps(row, _mm256_setzero_ps());
            _mm256_storeu_ps(row.add(8), _mm256_setzero_ps());
        }
        for i in 0..nq {
            let qi = q.add(i * qs);
            let mut acc = [_mm256_setzero_ps(); 8];
            // Key by key, each row read front to back (the rows of a cache lie one after
            // the other: one sequential stream); a short last group repeats its last key in
            // the unused accumulators, never stored.
            for (r, acc) in acc.iter_mut().enumerate() {
                let kr = k.add((j + r.min(keys - 1)) * ks);
                if i == 0 {
                    // The row 16 keys ahead, a line at a time: a hint, never a fault.
                    let ahead = kr.wrapping_add(16 * ks);
                    let mut c = 0;
                    while c < d {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c).cast());
                        c += 16;
                    }
                }
                let mut c0 = 0;
                while c0 < d {
                    let masked = d - c0 < 8;
                    let kv = load(masked, tmask, kr.add(c0));
                    *acc = _mm256_fmadd_ps(kv, load(masked, tmask, qi.add(c0)), *acc);
                    c0 += 8;
                }
            }
            let mut sums = [0f32; 8];
            _mm256_storeu_ps(
                sums.as_mut_ptr(),
                _mm256_mul_ps(sums_8(acc), _mm256_set1_ps(c)),
            );
            for (r, &s) in sums.iter().enumerate().take(keys) {
                *st.add((j + r) * BQ + i) = s;
            }
        }
        j += keys;
    }
}

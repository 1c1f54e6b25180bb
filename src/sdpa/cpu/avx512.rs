//! AVX-512 micro-kernels of the tiled attention kernel ([`super::tiled`]).
//!
//! Every function here is `unsafe` and `#[target_feature(enable = "avx512f")]`: it may only be
//! called once `is_x86_feature_detected!("avx512f")` returned true, which the safe wrappers in
//! [`super::tiled`] guarantee by construction (their `Isa::Avx512` value is only created after
//! that check). The wrappers also check every slice length the kernels rely on; each kernel
//! states the precondition it needs in a `# Safety` section.
//!
//! Layouts (all `f32`, `BQ` = [`super::tile::BQ`] = 64 queries per block):
//! * `qt`: the query block transposed, `(D, BQ)`: `qt[d * BQ + i]` (pre-scaled, zero padded).
//! * `st`: the score tile transposed, `(nk, BQ)`: `st[j * BQ + i]` = score of query `i`, key `j`.
//! * `k`, `v`: key / value rows `j` at `k[j * ks ..]`, `v[j * vs ..]` (head-dim contiguous).
//! * `o`: the output accumulator `(BQ, dv)`, row-major.

#![allow(clippy::too_many_arguments)]

use super::tile::{ByStride, RowAddr, BQ};
use crate::simd::avx512::{exp2_ps, lanes16, load, store, sums_16, transpose_16x16};
use core::arch::x86_64::*;

/// Keys per micro-tile of the score kernel.
const RS: usize = 6;
/// Queries per micro-tile of the P·V kernel.
const RP: usize = 6;

/// Scores of `nk` keys against `16 * nv` queries, times `c`:
/// `st[j * BQ + i] = c · Σ_d k[j * ks + d] * qt[d * BQ + i]`. (Scaling the sum rather than the
/// queries halves the round-off of large logits.)
///
/// # Safety
/// AVX-512F available; `1 <= nv <= 4`; `qt` readable for `d * BQ` floats, `k` for
/// `(nk - 1) * ks + d` floats (when `nk > 0`), `st` writable for `nk * BQ` floats.
#[target_feature(enable = "avx512f")]
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
    // SAFETY: the caller's contract with `nv` in 1..=4, which is `scores_nv::<NV>`'s contract.
    match nv {
        1 => scores_nv::<1>(qt, d, k, ks, nk, st, c),
        2 => scores_nv::<2>(qt, d, k, ks, nk, st, c),
        3 => scores_nv::<3>(qt, d, k, ks, nk, st, c),
        _ => scores_nv::<4>(qt, d, k, ks, nk, st, c),
    }
}

/// [`scores`] for `nv = NV`.
///
/// # Safety
/// As [`scores`] with `nv = NV` (`1 <= NV <= 4`).
#[inline(always)]
unsafe fn scores_nv<const NV: usize>(
    qt: *const f32,
    d: usize,
    k: *const f32,
    ks: usize,
    nk: usize,
    st: *mut f32,
    c: f32,
) {
    let c = _mm512_set1_ps(c);
    let mut j = 0;
    while j + RS <= nk {
        // SAFETY: keys j .. j + RS exist (j + RS <= nk): `k.add(j * ks)` is readable for
        // (RS - 1) * ks + d floats because (j + RS - 1) * ks + d <= (nk - 1) * ks + d, and
        // `st.add(j * BQ)` writable for RS * BQ floats because (j + RS) * BQ <= nk * BQ.
        scores_tile::<NV, RS>(qt, d, k.add(j * ks), ks, st.add(j * BQ), c);
        j += RS;
    }
    // SAFETY: as in the loop, for the remaining nk - j < RS keys (R = nk - j below); `add`
    // stays within (or one past) the allocations because j <= nk.
    let (kj, sj) = (k.add(j * ks), st.add(j * BQ));
    match nk - j {
        1 => scores_tile::<NV, 1>(qt, d, kj, ks, sj, c),
        2 => scores_tile::<NV, 2>(qt, d, kj, ks, sj, c),
        3 => scores_tile::<NV, 3>(qt, d, kj, ks, sj, c),
        4 => scores_tile::<NV, 4>(qt, d, kj, ks, sj, c),
        5 => scores_tile::<NV, 5>(qt, d, kj, ks, sj, c),
        _ => {}
    }
}

/// `R` keys × `16 * NV` queries, accumulators in registers over the whole head dimension.
///
/// # Safety
/// AVX-512F available; `NV <= 4` (so `16 * NV <= BQ`); `qt` readable for `d * BQ` floats
/// (it reads `qt[dd * BQ + 16 v ..][..16]`); `k` readable for `(R - 1) * ks + d` floats
/// (`k[r * ks + dd]`); `st` writable for `R * BQ` floats (`st[r * BQ + 16 v ..][..16]`).
#[inline(always)]
unsafe fn scores_tile<const NV: usize, const R: usize>(
    qt: *const f32,
    d: usize,
    k: *const f32,
    ks: usize,
    st: *mut f32,
    c: __m512,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for dd in 0..d {
        let q = qt.add(dd * BQ);
        let mut qv = [_mm512_setzero_ps(); NV];
        for (v, qv) in qv.iter_mut().enumerate() {
            *qv = _mm512_loadu_ps(q.add(16 * v));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let kb = _mm512_set1_ps(*k.add(r * ks + dd));
            for v in 0..NV {
                acc[v] = _mm512_fmadd_ps(kb, qv[v], acc[v]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(st.add(r * BQ + 16 * v), _mm512_mul_ps(*a, c));
        }
    }
}

/// The query block transposed: `qt[dd * BQ + i] = q[i * qs + dd]` for `i < nq`, `dd < d`,
/// and `qt[dd * BQ + i] = 0` for `nq <= i < 16 * ceil(nq / 16)`: 16 × 16 tiles transposed in
/// registers (three shuffle stages), instead of 16 scattered scalar stores per query.
///
/// # Safety
/// AVX-512F available; `nq <= BQ`; `q` readable at `i * qs + dd` for `i < nq`, `dd < d`;
/// `qt` writable for `d * BQ` floats.
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_queries(q: *const f32, qs: usize, nq: usize, d: usize, qt: *mut f32) {
    let mut i0 = 0;
    while i0 < nq {
        let rows = (nq - i0).min(16);
        let mut d0 = 0;
        while d0 < d {
            let cols = (d - d0).min(16);
            let cmask = lanes16(cols);
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, r) in r.iter_mut().enumerate().take(rows) {
                // SAFETY: row i0 + i < nq, columns d0 .. d0 + cols <= d (masked: the lanes
                // past `cols` are neither read nor faulted on).
                *r = _mm512_maskz_loadu_ps(cmask, q.add((i0 + i) * qs + d0));
            }
            let t = transpose_16x16(r);
            for (c, t) in t.iter().enumerate().take(cols) {
                // SAFETY: row d0 + c < d of `qt`, lanes i0 .. i0 + 16 <= BQ (i0 < nq <= BQ
                // and i0 is a multiple of 16).
                _mm512_storeu_ps(qt.add((d0 + c) * BQ + i0), *t);
            }
            d0 += 16;
        }
        i0 += 16;
    }
}

/// Adds `kb[j]` (already in the log2 domain) to row `j` of the score tile, for `16 * nv` queries.
///
/// # Safety
/// AVX-512F available; `nv <= 4`; `kb` readable for `nk` floats; `st` writable for `nk * BQ`.
#[target_feature(enable = "avx512f")]
pub unsafe fn add_key_bias(st: *mut f32, nk: usize, kb: *const f32, nv: usize) {
    // Reads kb[j] for j < nk and st[j * BQ + 16 v ..][..16] with 16 v + 16 <= BQ: within the
    // caller's contract.
    for j in 0..nk {
        let b = _mm512_set1_ps(*kb.add(j));
        let row = st.add(j * BQ);
        for v in 0..nv {
            let p = row.add(16 * v);
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), b));
        }
    }
}

/// Online-softmax step for one score tile (`nk` keys × `16 * nv` queries, log2 domain):
/// updates the running maxima `m` and sums `l`, overwrites the tile with the probabilities
/// `2^(s - m_new)` and writes the rescaling factors `alpha = 2^(m_old - m_new)` of the output
/// rows. Columns whose scores are all `-inf` so far keep `m = -inf`, `l = 0`, and get `p = 0`.
///
/// # Safety
/// AVX-512F available; `nv <= 4`; `st` readable and writable for `nk * BQ` floats; `m`, `l` and
/// `alpha` for `16 * nv` floats each.
#[target_feature(enable = "avx512f")]
pub unsafe fn softmax_update(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
    nv: usize,
) {
    // SAFETY: the caller's contract, with `nv` in 1..=4 (0 does nothing).
    match nv {
        0 => {}
        1 => softmax_nv::<1>(st, nk, m, l, alpha),
        2 => softmax_nv::<2>(st, nk, m, l, alpha),
        3 => softmax_nv::<3>(st, nk, m, l, alpha),
        _ => softmax_nv::<4>(st, nk, m, l, alpha),
    }
}

/// [`softmax_update`] for query 0 alone (a decoding step: one query per head), exactly as
/// lane 0 of the 16-query pass computes it (the same maximum, the same [`exp2_ps`] of the
/// same differences, the same left-to-right sum and final multiply-add) at a sixteenth of the
/// exponentials: the keys' scores, `BQ` floats apart in the tile, are gathered 16 at a time.
///
/// # Safety
/// AVX-512F available; `st` readable and writable at `j * BQ` for `j < nk`; `m`, `l` and
/// `alpha` for one float each.
#[target_feature(enable = "avx512f")]
pub unsafe fn softmax_update_one(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    // SAFETY: the caller's contract.
    let (m_old, m_use) = super::avx2::running_max_one(st, nk, m);
    let a = _mm512_cvtss_f32(exp2_ps(_mm512_set1_ps(m_old - m_use)));
    *alpha = a;
    let mv = _mm512_set1_ps(m_use);
    // Key j's score is float j · BQ of the tile.
    let offsets = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(BQ as i32),
    );
    let mut sum = 0f32;
    let mut e = [0f32; 16];
    let mut j = 0;
    while j < nk {
        let n = (nk - j).min(16);
        let p = st.add(j * BQ);
        // The last keys: only `n` of them are read (the other lanes give 2^-inf = 0, unused).
        let x = _mm512_mask_i32gather_ps::<4>(
            _mm512_set1_ps(f32::NEG_INFINITY),
            lanes16(n),
            offsets,
            p.cast(),
        );
        _mm512_storeu_ps(e.as_mut_ptr(), exp2_ps(_mm512_sub_ps(x, mv)));
        for (t, &e) in e.iter().enumerate().take(n) {
            *p.add(t * BQ) = e;
            sum += e;
        }
        j += 16;
    }
    *l = (*l).mul_add(a, sum);
}

/// [`softmax_update`] for `nv = NV`, a key row (`16 · NV` queries) at a time: `NV`
/// independent max, `exp2` and sum chains per row.
///
/// # Safety
/// As [`softmax_update`] with `nv = NV` (`1 <= NV <= 4`).
#[inline(always)]
unsafe fn softmax_nv<const NV: usize>(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    // SAFETY: the caller's contract is `running_max`'s.
    let (m_use, a) = running_max::<NV>(st, nk, m, alpha);
    // Every access below is `st[j * BQ + 16 v ..][..16]` with `j < nk` and `16 v + 16 <= 16 NV
    // <= BQ`, inside the `nk * BQ` floats of `st`, or `l[16 v ..][..16]`: the caller's contract.
    let mut sum = [_mm512_setzero_ps(); NV];
    for j in 0..nk {
        let row = st.add(j * BQ);
        for v in 0..NV {
            let p = row.add(16 * v);
            let e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(p), m_use[v]));
            _mm512_storeu_ps(p, e);
            sum[v] = _mm512_add_ps(sum[v], e);
        }
    }
    update_sums(l, a, sum);
}

/// The first half of an online-softmax step for `16 · NV` queries: the tile's column maxima
/// merged into the running maxima `m` (updated), the rescaling factors `alpha = 2^(m_old -
/// m_new)` (written, exact `f32`), and returned with the maxima to subtract (`m_new`, or 0
/// where it is still `-inf`, so that `-inf - m` stays `-inf` instead of NaN).
///
/// # Safety
/// AVX-512F available; `1 <= NV <= 4`; `st` readable for `nk * BQ` floats; `m` and `alpha`
/// readable and writable for `16 * NV` floats.
#[inline(always)]
pub(super) unsafe fn running_max<const NV: usize>(
    st: *const f32,
    nk: usize,
    m: *mut f32,
    alpha: *mut f32,
) -> ([__m512; NV], [__m512; NV]) {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    // Every access below is `st[j * BQ + 16 v ..][..16]` with `j < nk` and `16 v + 16 <= 16 NV
    // <= BQ`, inside the `nk * BQ` floats of `st`, or `m`/`alpha[16 v ..][..16]`, inside
    // their `16 NV` floats: the caller's contract.
    let mut mx = [neg_inf; NV];
    for j in 0..nk {
        let row = st.add(j * BQ);
        for (v, mx) in mx.iter_mut().enumerate() {
            *mx = _mm512_max_ps(*mx, _mm512_loadu_ps(row.add(16 * v)));
        }
    }
    let mut m_use = [neg_inf; NV];
    let mut a = [neg_inf; NV];
    for v in 0..NV {
        let m_old = _mm512_loadu_ps(m.add(16 * v));
        let m_new = _mm512_max_ps(m_old, mx[v]);
        let dead = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, neg_inf);
        m_use[v] = _mm512_mask_blend_ps(dead, m_new, _mm512_setzero_ps());
        a[v] = exp2_ps(_mm512_sub_ps(m_old, m_use[v]));
        _mm512_storeu_ps(m.add(16 * v), m_new);
        _mm512_storeu_ps(alpha.add(16 * v), a[v]);
    }
    (m_use, a)
}

/// The last step of an online-softmax update: `l = alpha · l + sum` for `16 · NV` queries.
///
/// # Safety
/// AVX-512F available; `l` readable and writable for `16 * NV` floats.
#[inline(always)]
pub(super) unsafe fn update_sums<const NV: usize>(
    l: *mut f32,
    alpha: [__m512; NV],
    sum: [__m512; NV],
) {
    for v in 0..NV {
        let l_old = _mm512_loadu_ps(l.add(16 * v));
        _mm512_storeu_ps(l.add(16 * v), _mm512_fmadd_ps(l_old, alpha[v], sum[v]));
    }
}

/// `o[i * os ..][:dv] = alpha[i] * o[i * os ..][:dv] + Σ_j st[j * BQ + i] * v[j * vs ..][:dv]`
/// for rows `0..nq`, keys `0..nk`; with `first`, `o[i * os ..][:dv] = Σ_j ...` (the old rows
/// are not read, so they may hold anything). `os` is the output row stride: `Dv` for a
/// contiguous block, `H · Dv` in the `(B, L, H, Dv)` output.
///
/// # Safety
/// AVX-512F available; `nq <= BQ`; `dv <= os` when `nq > 1`; `st` readable for `nk * BQ`
/// floats; `v` for `(nk - 1) * vs + dv` floats (when `nk > 0`); rows `i < nq` of `o` (`dv`
/// floats at `o + i * os`) readable and writable; `alpha` readable for `nq` floats.
#[target_feature(enable = "avx512f")]
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
    // SAFETY: the caller's contract, rows at stride `vs`.
    pv_rows(
        st,
        nk,
        ByStride { ptr: v, stride: vs },
        dv,
        o,
        os,
        nq,
        alpha,
        first,
    )
}

/// [`pv`] with the value rows wherever `v` says they lie (the same floats as [`pv`] on the
/// same rows copied one after the other).
///
/// # Safety
/// As [`pv`], with value row `j < nk` readable for `dv` floats at `v.row(j)`.
#[target_feature(enable = "avx512f")]
#[inline]
pub unsafe fn pv_rows<V: RowAddr>(
    st: *const f32,
    nk: usize,
    v: V,
    dv: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: *const f32,
    first: bool,
) {
    let mut c0 = 0;
    while c0 < dv {
        let w = (dv - c0).min(64);
        let nvv = w.div_ceil(16);
        let last = w - 16 * (nvv - 1); // 1..=16 lanes in the last vector
        let tail = lanes16(last);
        // SAFETY: columns c0 .. c0 + w of every row lie inside the rows the caller vouches
        // for (c0 + w <= dv): of `v` rows j < nk at stride vs, of `o` rows i < nq at stride
        // os. `pv_cols` touches exactly those columns: 16 per vector, the last masked by
        // `tail` to its `last` lanes (masked-off lanes are neither read nor written, and
        // AVX-512 suppresses faults on them).
        // Whole vectors (the common case) take unmasked loads and stores: on Intel cores a
        // masked load costs an extra vector µop on the FMA ports.
        let (vc, oc) = (v.cols(c0), o.add(c0));
        match (nvv, last == 16) {
            (1, false) => pv_cols::<1, false, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (2, false) => pv_cols::<2, false, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (3, false) => pv_cols::<3, false, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (_, false) => pv_cols::<4, false, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (1, true) => pv_cols::<1, true, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (2, true) => pv_cols::<2, true, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (3, true) => pv_cols::<3, true, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
            (_, true) => pv_cols::<4, true, V>(st, nk, vc, os, oc, nq, alpha, tail, first),
        }
        c0 += 64;
    }
}

/// [`pv`] for the `16 * (NV - 1) + popcount(tail)` columns starting at `v` / `o`.
///
/// # Safety
/// AVX-512F available; `1 <= NV <= 4`; `nq <= BQ`; `st` readable for `nk * BQ` floats;
/// `alpha` for `nq`; the columns named above of `v` rows `j < nk` (stride `vs`) readable and
/// of `o` rows `i < nq` (stride `ostride`) readable and writable.
#[inline(always)]
unsafe fn pv_cols<const NV: usize, const FULL: bool, V: RowAddr>(
    st: *const f32,
    nk: usize,
    v: V,
    ostride: usize,
    o: *mut f32,
    nq: usize,
    alpha: *const f32,
    tail: __mmask16,
    first: bool,
) {
    let mut i = 0;
    while i + RP <= nq {
        // SAFETY: rows i .. i + RP exist (i + RP <= nq): `st.add(i)` read at j * BQ + r with
        // i + r < nq <= BQ stays in nk * BQ; `o` and `alpha` rows i + r < nq.
        pv_tile::<NV, RP, FULL, V>(
            st.add(i),
            nk,
            v,
            ostride,
            o.add(i * ostride),
            alpha.add(i),
            tail,
            first,
        );
        i += RP;
    }
    // SAFETY: as in the loop, for the remaining nq - i < RP rows (i <= nq).
    let (si, oi, ai) = (st.add(i), o.add(i * ostride), alpha.add(i));
    match nq - i {
        1 => pv_tile::<NV, 1, FULL, V>(si, nk, v, ostride, oi, ai, tail, first),
        2 => pv_tile::<NV, 2, FULL, V>(si, nk, v, ostride, oi, ai, tail, first),
        3 => pv_tile::<NV, 3, FULL, V>(si, nk, v, ostride, oi, ai, tail, first),
        4 => pv_tile::<NV, 4, FULL, V>(si, nk, v, ostride, oi, ai, tail, first),
        5 => pv_tile::<NV, 5, FULL, V>(si, nk, v, ostride, oi, ai, tail, first),
        _ => {}
    }
}

/// `R` output rows × `16 * NV` columns (the last vector masked by `tail`).
///
/// # Safety
/// AVX-512F available; `st` readable at `j * BQ + r` for `j < nk`, `r < R`; `alpha` for `R`
/// floats; the columns of [`pv_cols`] of `v` rows `j < nk` readable and of `o` rows `r < R`
/// (stride `ostride`) readable and writable.
#[inline(always)]
unsafe fn pv_tile<const NV: usize, const R: usize, const FULL: bool, V: RowAddr>(
    st: *const f32,
    nk: usize,
    v: V,
    ostride: usize,
    o: *mut f32,
    alpha: *const f32,
    tail: __mmask16,
    first: bool,
) {
    // Only the last vector of a partial column block is masked (known at compile time).
    let masked = |c: usize| !FULL && c + 1 == NV;
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = _mm512_set1_ps(*alpha.add(r));
            for (c, acc) in acc.iter_mut().enumerate() {
                let x = load(masked(c), tail, o.add(r * ostride + 16 * c));
                *acc = _mm512_mul_ps(x, a);
            }
        }
    }
    for j in 0..nk {
        let vr = v.row(j);
        let mut vv = [_mm512_setzero_ps(); NV];
        for (c, vv) in vv.iter_mut().enumerate() {
            *vv = load(masked(c), tail, vr.add(16 * c));
        }
        let sr = st.add(j * BQ);
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = _mm512_set1_ps(*sr.add(r));
            for c in 0..NV {
                acc[c] = _mm512_fmadd_ps(p, vv[c], acc[c]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            store(masked(c), tail, o.add(r * ostride + 16 * c), *a);
        }
    }
}

/// Scores of `nk` keys against `nq` query rows read in place, times `c`, for query blocks of
/// at most [`super::tile::FEW_QUERIES`] rows (decoding: one new token per sequence), where the
/// block kernel [`scores`] would spend 16 query lanes on each row:
/// `st[j * BQ + i] = c · Σ_d k[j * ks + d] * q[i * qs + d]` for `i < nq`, and `0` for
/// `nq <= i < 16`. Sixteen keys at a time, one accumulator each over the head dimension,
/// reduced together by [`sums_16`]; a last group of fewer keys computes only its quads of
/// four ([`score_group`]).
///
/// # Safety
/// AVX-512F available; `nq <= 16`; `q` readable at `i * qs + dd` for `i < nq`, `dd < d`; `k`
/// readable for `(nk - 1) * ks + d` floats (when `nk > 0`); `st` writable for `nk * BQ`
/// floats.
#[target_feature(enable = "avx512f")]
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
    // SAFETY: the caller's contract, rows at stride `ks`.
    scores_few_rows(q, qs, nq, d, ByStride { ptr: k, stride: ks }, nk, st, c)
}

/// [`scores_few`] with the key rows wherever `k` says they lie (the same floats as
/// [`scores_few`] on the same rows copied one after the other).
///
/// # Safety
/// As [`scores_few`], with key row `j < nk` readable for `d` floats at `k.row(j)`.
#[target_feature(enable = "avx512f")]
#[inline]
pub unsafe fn scores_few_rows<K: RowAddr>(
    q: *const f32,
    qs: usize,
    nq: usize,
    d: usize,
    k: K,
    nk: usize,
    st: *mut f32,
    c: f32,
) {
    let mut j = 0;
    while j < nk {
        let keys = (nk - j).min(16);
        // SAFETY: keys j .. j + keys < nk: rows of `k` and of `st` inside the contract.
        for r in 0..keys {
            _mm512_storeu_ps(st.add((j + r) * BQ), _mm512_setzero_ps());
        }
        let kj = k.skip(j);
        let sj = st.add(j * BQ);
        // SAFETY: the caller's contract for keys j .. j + keys, with `keys` in 1..=16 and the
        // quads rounded up to cover them.
        match keys.div_ceil(4) {
            1 => score_group::<1, K>(q, qs, nq, d, kj, keys, sj, c),
            2 => score_group::<2, K>(q, qs, nq, d, kj, keys, sj, c),
            3 => score_group::<3, K>(q, qs, nq, d, kj, keys, sj, c),
            _ => score_full_group(q, qs, nq, d, kj, keys, sj, c),
        }
        j += keys;
    }
}

/// [`scores_few`] for a group of 13 to 16 keys: [`score_group`] in a function of its own, where
/// it compiles to its key-by-key loop. Inlined into the loop over groups, the compiler
/// interleaves the sixteen keys' loops (sixteen columns of every key at a time), which took
/// 37–48% longer over 400 keys that were not in cache (`attn bench attention --seq-q 1
/// --seq-k 400`, AMD EPYC Zen 4); the short last group (at most 12 keys) takes it inlined.
///
/// # Safety
/// As [`scores_few`] for keys `0 .. keys` from `k` and `st`, with `13 <= keys <= 16`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn score_full_group<K: RowAddr>(
    q: *const f32,
    qs: usize,
    nq: usize,
    d: usize,
    k: K,
    keys: usize,
    st: *mut f32,
    c: f32,
) {
    // SAFETY: the caller's contract.
    score_group::<4, K>(q, qs, nq, d, k, keys, st, c)
}

/// [`scores_few`] for one group of `keys <= 4 · QUADS` keys (`keys > 4 · (QUADS - 1)`): `4 ·
/// QUADS` accumulators, a partial last quad repeating its last key (never stored), the rest
/// of the 16 left at zero. [`sums_16`] reduces each accumulator's lanes on their own, so a
/// key's score is the same floats whichever group size computed it.
///
/// # Safety
/// As [`scores_few`] for keys `0 .. keys` from `k` and `st`, with `1 <= keys <= 4 · QUADS <= 16`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_group<const QUADS: usize, K: RowAddr>(
    q: *const f32,
    qs: usize,
    nq: usize,
    d: usize,
    k: K,
    keys: usize,
    st: *mut f32,
    c: f32,
) {
    let tmask = lanes16(d % 16);
    for i in 0..nq {
        let qi = q.add(i * qs);
        let mut acc = [_mm512_setzero_ps(); 16];
        // Key by key, each row read front to back (the rows of a cache lie one after the
        // other: one sequential stream; see `score_full_group` for where that order holds).
        for (r, acc) in acc.iter_mut().enumerate().take(4 * QUADS) {
            // SAFETY: key min(r, keys - 1) < keys: a row inside the contract; the lanes of
            // the masked tail past `d` are neither read nor faulted on.
            let kr = k.row(r.min(keys - 1));
            let mut c0 = 0;
            while c0 < d {
                let masked = d - c0 < 16;
                let kv = load(masked, tmask, kr.add(c0));
                *acc = _mm512_fmadd_ps(kv, load(masked, tmask, qi.add(c0)), *acc);
                c0 += 16;
            }
        }
        let mut sums = [0f32; 16];
        _mm512_storeu_ps(
            sums.as_mut_ptr(),
            _mm512_mul_ps(sums_16(acc), _mm512_set1_ps(c)),
        );
        for (r, &s) in sums.iter().enumerate().take(keys) {
            *st.add(r * BQ + i) = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_queries_matches_scalar_at_every_edge() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for (nq, d, qs) in [
            (64, 64, 64),
            (1, 1, 1),
            (17, 3, 5),
            (63, 65, 70),
            (16, 16, 192),
            (5, 33, 40),
        ] {
            let q: Vec<f32> = (0..(nq - 1) * qs + d).map(|x| x as f32 + 0.5).collect();
            let mut qt = vec![f32::NAN; d * BQ];
            // SAFETY: avx512f detected; `q` holds rows i < nq at stride qs with d columns;
            // `qt` holds d * BQ floats; nq <= BQ.
            unsafe { transpose_queries(q.as_ptr(), qs, nq, d, qt.as_mut_ptr()) };
            for dd in 0..d {
                for i in 0..nq.div_ceil(16) * 16 {
                    let want = if i < nq { q[i * qs + dd] } else { 0.0 };
                    assert_eq!(
                        qt[dd * BQ + i],
                        want,
                        "nq={nq} d={d} qs={qs} at ({dd}, {i})"
                    );
                }
            }
        }
    }

    #[test]
    fn exp2_matches_std() {
        // SAFETY: `check_exp2` calls it only after detecting avx512f.
        check_exp2(|x| unsafe { exp2_ps(x) }, 3e-7);
    }

    #[test]
    fn the_bf16_exp2_is_within_its_stated_error() {
        // 3.1e-6 stated; the bf16 rounding that follows it is 2^-9 = 2e-3.
        // SAFETY: `check_exp2` calls it only after detecting avx512f.
        check_exp2(|x| unsafe { crate::simd::avx512::exp2_ps_bf16(x) }, 3.2e-6);
    }

    /// `exp2` against `f32::exp2` within `rel` over [-125, 25], `-inf` and everything below -126
    /// to exactly 0, 0 to exactly 1, NaN to NaN.
    fn check_exp2(exp2: impl Fn(__m512) -> __m512, rel: f32) {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let eval = |xs: &[f32]| {
            let mut out = [0f32; 16];
            // SAFETY: avx512f was detected above (the callers' closures need nothing more);
            // `xs` and `out` hold 16 floats each.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), exp2(_mm512_loadu_ps(xs.as_ptr()))) };
            out
        };
        let xs: Vec<f32> = (0..16 * 320).map(|i| -125.0 + i as f32 * 0.0469).collect();
        for chunk in xs.chunks(16) {
            for (x, y) in chunk.iter().zip(eval(chunk)) {
                let want = x.exp2();
                assert!(
                    (y - want).abs() <= rel * want.max(f32::MIN_POSITIVE),
                    "{x}: {y} vs {want}"
                );
            }
        }
        let special = [
            f32::NEG_INFINITY,
            -126.5,
            -1000.0,
            0.0,
            f32::NAN,
            -0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
            0.0,
        ];
        let out = eval(&special);
        assert_eq!(&out[..3], &[0.0; 3]);
        assert_eq!((out[3], out[5]), (1.0, 1.0));
        assert!(out[4].is_nan());
    }
}

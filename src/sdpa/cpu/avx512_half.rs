//! AVX-512 micro-kernels for half-precision inputs of the tiled attention kernel
//! ([`super::tiled`], dispatched through [`super::half`]).
//!
//! * bf16 with AVX-512 BF16: `Q·Kᵀ` and `P·V` with `vdpbf16ps`, which multiplies PAIRS of
//!   adjacent bf16 values along the reduction dimension and adds both products to an `f32`
//!   lane. Operands are therefore packed with the reduction dimension interleaved in pairs,
//!   one 32-bit word per pair (low half: the even element, high half: the odd one):
//!   - `qt` (queries, reduction over the head dimension): word `qt[p * BQ + i]` = `(q[i][2p],
//!     q[i][2p + 1])`, the query block transposed by words ([`pack_queries`]);
//!   - keys are read in place: row `j` of `K` is already `d` consecutive bf16, so the pair
//!     `(k[j][2p], k[j][2p + 1])` is one unaligned 32-bit load, broadcast to all lanes;
//!   - `vp` (values, reduction over keys): word `vp[jp * vps + c]` = `(v[2jp][c], v[2jp+1][c])`,
//!     two key rows interleaved ([`pack_values`]), per key block;
//!   - `P` (probabilities, reduction over keys): the `f32` score tile, rounded to bf16 and
//!     packed in place to `pt[jp * BQ + i]` = `(p[2jp][i], p[2jp+1][i])` by the online-softmax
//!     step itself ([`softmax_pack`]).
//!
//!   An odd head dimension or key count leaves a last half pair: its missing element is taken
//!   as zero on both sides (never read past a row, and a zero times a NaN or infinite value
//!   that is not part of the sum is never formed).
//! * f16 (and bf16 without AVX-512 BF16): rows converted to `f32` tiles ([`convert_rows`],
//!   `vcvtph2ps` / a 16-bit shift), which the `f32` micro-kernels then read.
//!
//! Every function is `unsafe` with the target features it needs; the safe wrappers in
//! [`super::half`] only call them under a [`super::half::Kind`] that was created after the
//! matching `is_x86_feature_detected!` checks, and check the slice lengths stated under
//! `# Safety`.

#![allow(clippy::too_many_arguments)]

use super::avx512::{running_max, update_sums};
use super::tile::BQ;
use crate::simd::avx512::{exp2_ps_bf16, lanes16, lanes32, load, store, transpose_16x16};
use core::arch::x86_64::*;
use core::mem::transmute;

/// Keys per micro-tile of the score kernel (24 accumulators for 64 queries, as in `f32`).
const RS: usize = 6;
/// Queries per micro-tile of the P·V kernel.
const RP: usize = 6;

/// The 16 words of `x` as bf16 pairs (a bit cast).
#[inline(always)]
unsafe fn bh(x: __m512) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors; every bit pattern is valid for both.
    transmute::<__m512, __m512bh>(x)
}

/// The query block packed in bf16 pairs along the head dimension:
/// `qt` word `p * BQ + i` = `(q[i * qs + 2p], q[i * qs + 2p + 1])` for `i < nq`, `p <
/// ceil(d / 2)` (the odd element past `d` is zero), and zero words for `nq <= i < 16 *
/// ceil(nq / 16)`. Rows of 32 bf16 are loaded as 16 words and transposed 16 × 16 in registers.
///
/// # Safety
/// AVX-512F/BW available; `nq <= BQ`; `q` readable at `i * qs + dd` for `i < nq`, `dd < d`;
/// `qt` writable for `ceil(d / 2) * BQ` words (32-bit).
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn pack_queries(q: *const u16, qs: usize, nq: usize, d: usize, qt: *mut f32) {
    let mut i0 = 0;
    while i0 < nq {
        let rows = (nq - i0).min(16);
        let mut d0 = 0;
        while d0 < d {
            let cols = (d - d0).min(32);
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, r) in r.iter_mut().enumerate().take(rows) {
                // SAFETY: row i0 + i < nq, elements d0 .. d0 + cols <= d: the masked load
                // reads (and faults on) only those.
                let x = _mm512_maskz_loadu_epi16(lanes32(cols), q.add((i0 + i) * qs + d0) as _);
                *r = _mm512_castsi512_ps(x);
            }
            let t = transpose_16x16(r);
            for (c, t) in t.iter().enumerate().take(cols.div_ceil(2)) {
                // SAFETY: word row d0 / 2 + c < ceil(d / 2), lanes i0 .. i0 + 16 <= BQ.
                _mm512_storeu_ps(qt.add((d0 / 2 + c) * BQ + i0), *t);
            }
            d0 += 32;
        }
        i0 += 16;
    }
}

/// Scores of `nk` keys (bf16 rows `k[j * ks ..][..d]`, read in place) against `16 * nv`
/// queries packed by [`pack_queries`], times `c`, in `f32`: `st[j * BQ + i]`.
///
/// # Safety
/// AVX-512F and AVX-512 BF16 available; `1 <= nv <= 4`; `qt` readable for `ceil(d / 2) * BQ`
/// words; `k` readable for `(nk - 1) * ks + d` elements (when `nk > 0`); `st` writable for
/// `nk * BQ` floats.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn scores_bf16(
    qt: *const f32,
    d: usize,
    k: *const u16,
    ks: usize,
    nk: usize,
    st: *mut f32,
    nv: usize,
    c: f32,
) {
    // SAFETY: the caller's contract, with `nv` in 1..=4.
    match nv {
        1 => scores_nv::<1>(qt, d, k, ks, nk, st, c),
        2 => scores_nv::<2>(qt, d, k, ks, nk, st, c),
        3 => scores_nv::<3>(qt, d, k, ks, nk, st, c),
        _ => scores_nv::<4>(qt, d, k, ks, nk, st, c),
    }
}

/// [`scores_bf16`] for `nv = NV`.
///
/// # Safety
/// As [`scores_bf16`] with `nv = NV`.
#[inline(always)]
unsafe fn scores_nv<const NV: usize>(
    qt: *const f32,
    d: usize,
    k: *const u16,
    ks: usize,
    nk: usize,
    st: *mut f32,
    c: f32,
) {
    let c = _mm512_set1_ps(c);
    let mut j = 0;
    while j + RS <= nk {
        // SAFETY: keys j .. j + RS < nk exist: `k.add(j * ks)` is readable for
        // (RS - 1) * ks + d elements and `st.add(j * BQ)` writable for RS * BQ floats.
        scores_tile::<NV, RS>(qt, d, k.add(j * ks), ks, st.add(j * BQ), c);
        j += RS;
    }
    if j == nk {
        return;
    }
    // SAFETY: as in the loop for the remaining 0 < nk - j < RS keys (key j exists, so both
    // offsets are inside their allocations).
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

/// `R` keys × `16 * NV` queries, `d / 2` `vdpbf16ps` steps (plus one half step for an odd `d`).
///
/// # Safety
/// AVX-512F/BF16 available; `NV <= 4`; `qt` readable for `ceil(d / 2) * BQ` words; `k`
/// readable for `(R - 1) * ks + d` elements; `st` writable for `R * BQ` floats.
#[inline(always)]
unsafe fn scores_tile<const NV: usize, const R: usize>(
    qt: *const f32,
    d: usize,
    k: *const u16,
    ks: usize,
    st: *mut f32,
    c: __m512,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    let pairs = d / 2;
    for p in 0..pairs {
        let q = qt.add(p * BQ);
        let mut qv = [bh(_mm512_setzero_ps()); NV];
        for (v, qv) in qv.iter_mut().enumerate() {
            *qv = bh(_mm512_loadu_ps(q.add(16 * v)));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            // Elements 2p, 2p + 1 < d of key row r: one (unaligned) 32-bit word.
            let w = (k.add(r * ks + 2 * p) as *const i32).read_unaligned();
            let kb = bh(_mm512_castsi512_ps(_mm512_set1_epi32(w)));
            for v in 0..NV {
                acc[v] = _mm512_dpbf16_ps(acc[v], qv[v], kb);
            }
        }
    }
    if d % 2 == 1 {
        // The last element alone (the word's high half zero, never read past the row).
        let q = qt.add(pairs * BQ);
        let mut qv = [bh(_mm512_setzero_ps()); NV];
        for (v, qv) in qv.iter_mut().enumerate() {
            *qv = bh(_mm512_loadu_ps(q.add(16 * v)));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let w = *k.add(r * ks + 2 * pairs) as i32;
            let kb = bh(_mm512_castsi512_ps(_mm512_set1_epi32(w)));
            for v in 0..NV {
                acc[v] = _mm512_dpbf16_ps(acc[v], qv[v], kb);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(st.add(r * BQ + 16 * v), _mm512_mul_ps(*a, c));
        }
    }
}

/// Values of `nk` keys packed in key pairs: word `vp[jp * vps + c]` = `(v[2jp][c],
/// v[2jp + 1][c])` for `c < dv` (a missing odd row is zero), and zero for `dv <= c < vps`,
/// where `vps = 16 * ceil(dv / 16)`.
///
/// # Safety
/// AVX-512F/BW/VL available; `v` readable for `(nk - 1) * vs + dv` elements (when `nk > 0`);
/// `vp` writable for `ceil(nk / 2) * vps` words.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn pack_values(v: *const u16, vs: usize, nk: usize, dv: usize, vp: *mut f32) {
    let vps = dv.div_ceil(16) * 16;
    // Word c of the first result = (row 2jp [c], row 2jp + 1 [c]) for c < 16 (`vpermt2w`
    // indices: a lane of the first operand, 32 + a lane of the second); the second: c + 16.
    let interleave = |from: i16| {
        let mut w = [0i16; 32];
        for (c, pair) in w.chunks_exact_mut(2).enumerate() {
            pair[0] = from + c as i16;
            pair[1] = 32 + from + c as i16;
        }
        transmute::<[i16; 32], __m512i>(w)
    };
    let (first, second) = (interleave(0), interleave(16));
    for jp in 0..nk.div_ceil(2) {
        let r0 = v.add(2 * jp * vs);
        let odd_missing = 2 * jp + 1 >= nk;
        let mut c0 = 0;
        while c0 < dv {
            let n = (dv - c0).min(32);
            let m = lanes32(n);
            // SAFETY: elements c0 .. c0 + n <= dv of key rows 2jp (< nk) and, unless missing,
            // 2jp + 1 (< nk); masked lanes are neither read nor faulted on, and are zero.
            let lo = _mm512_maskz_loadu_epi16(m, r0.add(c0) as _);
            let hi = if odd_missing {
                _mm512_setzero_si512()
            } else {
                _mm512_maskz_loadu_epi16(m, v.add((2 * jp + 1) * vs + c0) as _)
            };
            let out = vp.add(jp * vps + c0);
            // SAFETY: words c0 .. c0 + 16 <= vps of row jp (c0 < dv, a multiple of 16), and
            // c0 + 16 .. c0 + 32 <= vps when n > 16 (then dv > c0 + 16).
            let w0 = _mm512_permutex2var_epi16(lo, first, hi);
            _mm512_storeu_ps(out, _mm512_castsi512_ps(w0));
            if n > 16 {
                let w1 = _mm512_permutex2var_epi16(lo, second, hi);
                _mm512_storeu_ps(out.add(16), _mm512_castsi512_ps(w1));
            }
            c0 += 32;
        }
    }
}

/// The online-softmax step of [`super::avx512::softmax_update`] for a tile whose
/// probabilities go to the bf16 `P·V`, fused with their rounding and packing: updates `m`, `l`
/// and `alpha` as that function does, then overwrites the tile IN PLACE with the probabilities
/// `2^(s - m_new)` rounded to bf16 (to nearest even) and packed in key pairs: word `jp * BQ +
/// i` = `(p[2jp][i], p[2jp + 1][i])`, the high half zero for a missing odd key. Word row `jp`
/// overwrites float row `jp <= 2jp`, which has already been read. `l` sums the unrounded
/// `f32` probabilities, computed with the degree-4 [`exp2_ps_bf16`] (relative error 3.1e-6,
/// far below the 2^-9 of the rounding that follows); `alpha` stays exact `f32`.
///
/// # Safety
/// AVX-512F/BW/BF16 available; `nv <= 4`; `st` readable and writable for `nk * BQ` floats;
/// `m`, `l` and `alpha` for `16 * nv` floats each.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub unsafe fn softmax_pack(
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
        1 => softmax_pack_nv::<1>(st, nk, m, l, alpha),
        2 => softmax_pack_nv::<2>(st, nk, m, l, alpha),
        3 => softmax_pack_nv::<3>(st, nk, m, l, alpha),
        _ => softmax_pack_nv::<4>(st, nk, m, l, alpha),
    }
}

/// [`softmax_pack`] for `nv = NV`.
///
/// # Safety
/// As [`softmax_pack`] with `nv = NV` (`1 <= NV <= 4`).
#[inline(always)]
unsafe fn softmax_pack_nv<const NV: usize>(
    st: *mut f32,
    nk: usize,
    m: *mut f32,
    l: *mut f32,
    alpha: *mut f32,
) {
    // SAFETY: the caller's contract is `running_max`'s and `update_sums`'.
    let (m_use, a) = running_max::<NV>(st, nk, m, alpha);
    // Word 2i from the low 16 bf16 (row 2jp), word 2i + 1 from the high 16 (row 2jp + 1).
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let mut sum = [_mm512_setzero_ps(); NV];
    for jp in 0..nk.div_ceil(2) {
        let r0 = st.add(2 * jp * BQ);
        let odd_missing = 2 * jp + 1 >= nk;
        for v in 0..NV {
            // SAFETY: float rows 2jp and (unless missing) 2jp + 1 < nk, lanes 16 v .. + 16 <=
            // BQ; both are read before word row jp (at or before row 2jp) is written.
            let lo = exp2_ps_bf16(_mm512_sub_ps(_mm512_loadu_ps(r0.add(16 * v)), m_use[v]));
            let hi = if odd_missing {
                _mm512_setzero_ps()
            } else {
                exp2_ps_bf16(_mm512_sub_ps(
                    _mm512_loadu_ps(r0.add(BQ + 16 * v)),
                    m_use[v],
                ))
            };
            sum[v] = _mm512_add_ps(sum[v], _mm512_add_ps(lo, hi));
            let both = transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            let w = _mm512_permutexvar_epi16(idx, both);
            _mm512_storeu_ps(st.add(jp * BQ + 16 * v), _mm512_castsi512_ps(w));
        }
    }
    update_sums(l, a, sum);
}

/// `o[i * os ..][:dv] = alpha[i] · o[...] + Σ_j p[j][i] · v[j][:dv]` (or without the old rows
/// when `first`) for `i < nq`, `j < nk`, from `P` packed by [`softmax_pack`] (`pt`) and `V` by
/// [`pack_values`] (`vp`, stride `vps = 16 * ceil(dv / 16)` words).
///
/// # Safety
/// AVX-512F/BF16 available; `nq <= BQ`; `dv <= os` when `nq > 1`; `pt` readable for
/// `ceil(nk / 2) * BQ` words, `vp` for `ceil(nk / 2) * vps` words; rows `i < nq` of `o` (`dv`
/// floats at `o + i * os`) readable and writable; `alpha` readable for `nq` floats.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn pv_bf16(
    pt: *const f32,
    nk: usize,
    vp: *const f32,
    dv: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: *const f32,
    first: bool,
) {
    let vps = dv.div_ceil(16) * 16;
    let mut c0 = 0;
    while c0 < dv {
        let w = (dv - c0).min(64);
        let nvv = w.div_ceil(16);
        let last = w - 16 * (nvv - 1);
        let tail = lanes16(last);
        // SAFETY: columns c0 .. c0 + w <= dv of the `o` rows, words c0 .. c0 + 16 nvv <= vps
        // of each `vp` row: inside the caller's contract (only the output's last vector is
        // masked; `vp` rows are padded to whole vectors).
        let (vc, oc) = (vp.add(c0), o.add(c0));
        match (nvv, last == 16) {
            (1, false) => pv_cols::<1, false>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (2, false) => pv_cols::<2, false>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (3, false) => pv_cols::<3, false>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (_, false) => pv_cols::<4, false>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (1, true) => pv_cols::<1, true>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (2, true) => pv_cols::<2, true>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (3, true) => pv_cols::<3, true>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
            (_, true) => pv_cols::<4, true>(pt, nk, vc, vps, oc, os, nq, alpha, tail, first),
        }
        c0 += 64;
    }
}

/// [`pv_bf16`] for `16 * NV` columns (the last vector's output masked by `tail` unless `FULL`).
///
/// # Safety
/// As [`pv_bf16`] for these columns: `vp` rows readable for `16 * NV` words from `vp`.
#[inline(always)]
unsafe fn pv_cols<const NV: usize, const FULL: bool>(
    pt: *const f32,
    nk: usize,
    vp: *const f32,
    vps: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: *const f32,
    tail: __mmask16,
    first: bool,
) {
    let mut i = 0;
    while i + RP <= nq {
        // SAFETY: rows i .. i + RP < nq of `pt` (lanes), `o` and `alpha`.
        pv_tile::<NV, RP, FULL>(
            pt.add(i),
            nk,
            vp,
            vps,
            o.add(i * os),
            os,
            alpha.add(i),
            tail,
            first,
        );
        i += RP;
    }
    if i == nq {
        return;
    }
    // SAFETY: as in the loop for the remaining 0 < nq - i < RP rows (row i exists).
    let (pi, oi, ai) = (pt.add(i), o.add(i * os), alpha.add(i));
    match nq - i {
        1 => pv_tile::<NV, 1, FULL>(pi, nk, vp, vps, oi, os, ai, tail, first),
        2 => pv_tile::<NV, 2, FULL>(pi, nk, vp, vps, oi, os, ai, tail, first),
        3 => pv_tile::<NV, 3, FULL>(pi, nk, vp, vps, oi, os, ai, tail, first),
        4 => pv_tile::<NV, 4, FULL>(pi, nk, vp, vps, oi, os, ai, tail, first),
        5 => pv_tile::<NV, 5, FULL>(pi, nk, vp, vps, oi, os, ai, tail, first),
        _ => {}
    }
}

/// `R` output rows × `16 * NV` columns over `ceil(nk / 2)` key pairs.
///
/// # Safety
/// AVX-512F/BF16 available; `pt` readable at word `jp * BQ + r` for `jp < ceil(nk / 2)`,
/// `r < R`; `vp` rows `jp` readable for `16 * NV` words (stride `vps`); `alpha` for `R`
/// floats; the columns of `o` rows `r < R` (stride `os`) readable and writable.
#[inline(always)]
unsafe fn pv_tile<const NV: usize, const R: usize, const FULL: bool>(
    pt: *const f32,
    nk: usize,
    vp: *const f32,
    vps: usize,
    o: *mut f32,
    os: usize,
    alpha: *const f32,
    tail: __mmask16,
    first: bool,
) {
    let masked = |c: usize| !FULL && c + 1 == NV;
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    if !first {
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = _mm512_set1_ps(*alpha.add(r));
            for (c, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_mul_ps(load(masked(c), tail, o.add(r * os + 16 * c)), a);
            }
        }
    }
    let pairs = nk / 2;
    for jp in 0..pairs {
        let vr = vp.add(jp * vps);
        let mut vv = [bh(_mm512_setzero_ps()); NV];
        for (c, vv) in vv.iter_mut().enumerate() {
            *vv = bh(_mm512_loadu_ps(vr.add(16 * c)));
        }
        let pr = pt.add(jp * BQ);
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = bh(_mm512_set1_ps(*pr.add(r)));
            for c in 0..NV {
                acc[c] = _mm512_dpbf16_ps(acc[c], vv[c], p);
            }
        }
    }
    if nk % 2 == 1 {
        // The last key alone: its pair partner may be a real key past this sub-block's range
        // (packed with the whole key block), so its half of the value words is cleared.
        let vr = vp.add(pairs * vps);
        let low = _mm512_set1_epi32(0xffff);
        let mut vv = [bh(_mm512_setzero_ps()); NV];
        for (c, vv) in vv.iter_mut().enumerate() {
            let x = _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(vr.add(16 * c))), low);
            *vv = bh(_mm512_castsi512_ps(x));
        }
        let pr = pt.add(pairs * BQ);
        for (r, acc) in acc.iter_mut().enumerate() {
            let p = bh(_mm512_set1_ps(*pr.add(r)));
            for c in 0..NV {
                acc[c] = _mm512_dpbf16_ps(acc[c], vv[c], p);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (c, a) in acc.iter().enumerate() {
            store(masked(c), tail, o.add(r * os + 16 * c), *a);
        }
    }
}

/// Half-precision rows to `f32`: `dst[r * cols + c]` = `src[r * ss + c]` as `f32` for
/// `r < rows`, `c < cols`; `f16` (IEEE half, `vcvtph2ps`) or bf16 (a 16-bit shift).
///
/// # Safety
/// AVX-512F/BW/VL available; `src` readable for `(rows - 1) * ss + cols` elements (when
/// `rows > 0`); `dst` writable for `rows * cols` floats.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
        while c < cols {
            let m = lanes16(cols - c);
            // SAFETY: elements c .. c + popcount(m) <= cols of row r, masked loads and
            // stores touch only those.
            let h = _mm256_maskz_loadu_epi16(m, s.add(c) as _);
            let x = if f16 {
                _mm512_cvtph_ps(h)
            } else {
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            };
            store(m != 0xffff, m, d.add(c), x);
            c += 16;
        }
    }
}

/// `n` floats rounded to f16 (`f16`, `vcvtps2ph`, to nearest even) or bf16 (to nearest even
/// in integer arithmetic, NaN kept quiet: bit for bit what `half::bf16::from_f32` gives,
/// denormals included), as 16-bit patterns.
///
/// # Safety
/// AVX-512F/BW/VL available; `src` readable and `dst` writable for `n` elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn round_to_half(src: *const f32, n: usize, f16: bool, dst: *mut u16) {
    let mut i = 0;
    while i < n {
        let m = lanes16(n - i);
        // SAFETY: elements i .. i + popcount(m) <= n; masked lanes are not touched.
        let x = _mm512_maskz_loadu_ps(m, src.add(i));
        let h = if f16 {
            _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x)
        } else {
            let b = _mm512_castps_si512(x);
            let hi = _mm512_srli_epi32::<16>(b);
            let lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
            let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
            let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, bias));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            let quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
            _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
        };
        _mm256_mask_storeu_epi16(dst.add(i) as _, m, h);
        i += 16;
    }
}

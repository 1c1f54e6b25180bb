//! The micro-kernels of the tiled attention, one safe wrapper each: it checks the lengths the
//! kernel relies on and calls the version of the instruction set (`portable`, `avx2`,
//! `avx512`).

use super::portable;
use super::tile::{ByTable, BQ, FEW_QUERIES};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::simd::Isa;

/// `qt[dd * BQ + i] = q[i * qs + dd]` for `i < nq`, `dd < d`, zero for
/// `nq <= i < 16 * ceil(nq / 16)`: the query block as the score kernel reads it.
pub(super) fn transpose_queries(
    isa: Isa,
    q: &[f32],
    qs: usize,
    nq: usize,
    d: usize,
    qt: &mut [f32],
) {
    assert!(nq <= BQ && qt.len() >= d * BQ);
    assert!(nq == 0 || q.len() >= (nq - 1) * qs + d);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); the lengths asserted above are the
        // preconditions of `avx512::transpose_queries`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::transpose_queries(q.as_ptr(), qs, nq, d, qt.as_mut_ptr()) },
        // SAFETY: avx2 and fma detected (see `Isa`); the lengths asserted above are the
        // preconditions of `avx2::transpose_queries`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::transpose_queries(q.as_ptr(), qs, nq, d, qt.as_mut_ptr()) },
        Isa::Portable => {
            for i in 0..nq {
                let qrow = &q[i * qs..i * qs + d];
                for (col, &x) in qt.chunks_exact_mut(BQ).zip(qrow) {
                    col[i] = x;
                }
            }
            let padded = nq.div_ceil(16) * 16;
            if nq < padded {
                for col in qt.chunks_exact_mut(BQ).take(d) {
                    col[nq..padded].fill(0.0);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    isa: Isa,
    qt: &[f32],
    d: usize,
    k: &[f32],
    ks: usize,
    nk: usize,
    st: &mut [f32],
    nv: usize,
    c: f32,
) {
    assert!((1..=4).contains(&nv) && qt.len() >= d * BQ && st.len() >= nk * BQ);
    assert!(nk == 0 || k.len() >= (nk - 1) * ks + d);
    match isa {
        // SAFETY: `Isa::Avx512` exists only after `is_x86_feature_detected!("avx512f")`; the
        // asserts above are exactly the length preconditions of `avx512::scores`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            avx512::scores(qt.as_ptr(), d, k.as_ptr(), ks, nk, st.as_mut_ptr(), nv, c)
        },
        // SAFETY: `Isa::Avx2` exists only after detecting avx2 and fma; the asserts above are
        // the length preconditions of `avx2::scores`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            avx2::scores(qt.as_ptr(), d, k.as_ptr(), ks, nk, st.as_mut_ptr(), nv, c)
        },
        Isa::Portable => portable::scores::<false>(qt, d, k, ks, nk, st, nv, c),
    }
}

/// Scores of `nk` keys against `nq <= FEW_QUERIES` query rows read in place (`q[i * qs ..]
/// [..d]`), times `c`: `st[j * BQ + i]` for `i < nq`, and `0` for `nq <= i < 16`, what
/// [`scores`] writes for a block of `nq` queries (up to the summation order).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores_few(
    isa: Isa,
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
    assert!((1..=FEW_QUERIES).contains(&nq) && q.len() >= (nq - 1) * qs + d);
    assert!(st.len() >= nk * BQ && (nk == 0 || k.len() >= (nk - 1) * ks + d));
    match isa {
        // SAFETY: avx512f detected (see `Isa`); the asserts above are the length
        // preconditions of `avx512::scores_few` (nq <= FEW_QUERIES <= 16).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            avx512::scores_few(
                q.as_ptr(),
                qs,
                nq,
                d,
                k.as_ptr(),
                ks,
                nk,
                st.as_mut_ptr(),
                c,
            )
        },
        // SAFETY: avx2 and fma detected (see `Isa`); as above for `avx2::scores_few`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            avx2::scores_few(
                q.as_ptr(),
                qs,
                nq,
                d,
                k.as_ptr(),
                ks,
                nk,
                st.as_mut_ptr(),
                c,
            )
        },
        Isa::Portable => portable::scores_few::<false>(q, qs, nq, d, k, ks, nk, st, c),
    }
}

pub(super) fn add_key_bias(isa: Isa, st: &mut [f32], nk: usize, kb: &[f32], nv: usize) {
    assert!(nv <= 4 && kb.len() >= nk && st.len() >= nk * BQ);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::add_key_bias(st.as_mut_ptr(), nk, kb.as_ptr(), nv) },
        // SAFETY: avx2 detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::add_key_bias(st.as_mut_ptr(), nk, kb.as_ptr(), nv) },
        Isa::Portable => {
            for (j, &b) in kb[..nk].iter().enumerate() {
                st[j * BQ..j * BQ + 16 * nv]
                    .iter_mut()
                    .for_each(|x| *x += b);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_update(
    isa: Isa,
    st: &mut [f32],
    nk: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
    nv: usize,
    nq: usize,
) {
    assert!(
        nv <= 4
            && nq <= 16 * nv
            && st.len() >= nk * BQ
            && m.len() >= 16 * nv
            && l.len() >= 16 * nv
            && alpha.len() >= 16 * nv
    );
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above (nq >= 1 reads
        // m, l, alpha[0]).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if nq == 1 => unsafe {
            avx512::softmax_update_one(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
            )
        },
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            avx512::softmax_update(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
                nv,
            )
        },
        // SAFETY: avx2 and fma detected (see `Isa`); lengths asserted above (nq >= 1 reads
        // m, l, alpha[0]).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if nq == 1 => unsafe {
            avx2::softmax_update_one(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
            )
        },
        // SAFETY: avx2 and fma detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            avx2::softmax_update(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
                nv,
            )
        },
        Isa::Portable => portable::softmax_update::<false>(st, nk, m, l, alpha, nv),
    }
}

/// `o[i * os ..][:dv] = alpha[i] · o[i * os ..][:dv] + Σ_j st[j * BQ + i] · v[j * vs ..][:dv]`
/// for rows `i < nq`, keys `j < nk`: the `P · V` step, into output rows `os` floats apart.
///
/// With `first` the old rows are not read (they may be uninitialised): `o = Σ_j ...`.
///
/// # Safety
/// Rows `i < nq` of `o` (`dv` floats at `o + i * os`, `dv <= os` when `nq > 1`) are valid for
/// reads and writes, and nothing else accesses them meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pv(
    isa: Isa,
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
    assert!(nq <= BQ && st.len() >= nk * BQ && alpha.len() >= nq && (nq <= 1 || dv <= os));
    assert!(nk == 0 || v.len() >= (nk - 1) * vs + dv);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above and the rows of `o`
        // (the caller's contract) are the preconditions of `avx512::pv`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::pv(
            st.as_ptr(),
            nk,
            v.as_ptr(),
            vs,
            dv,
            o,
            os,
            nq,
            alpha.as_ptr(),
            first,
        ),
        // SAFETY: avx2 and fma detected (see `Isa`); lengths asserted above and the rows of
        // `o` (the caller's contract) are the preconditions of `avx2::pv`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::pv(
            st.as_ptr(),
            nk,
            v.as_ptr(),
            vs,
            dv,
            o,
            os,
            nq,
            alpha.as_ptr(),
            first,
        ),
        // SAFETY: the rows are the caller's contract.
        Isa::Portable => portable::pv::<false>(st, nk, v, vs, dv, o, os, nq, alpha, first),
    }
}

/// The kernels that read a paged cache's keys and values where they lie ([`ByTable`] rows:
/// each position's slot, instead of a copy of the head's rows in the task's scratch), at the
/// levels that have them: the AVX-512 level. Their floats are the strided kernels' on the same
/// rows ([`scores_few`], [`pv`]).
#[derive(Clone, Copy)]
pub(super) struct InPlace(());

impl InPlace {
    /// The in-place kernels of `isa`, if it has them.
    pub(super) fn at(isa: Isa) -> Option<Self> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(Self(())),
            _ => None,
        }
    }

    /// [`scores_few`] over the `nk` key rows of `k` (`d` floats each).
    ///
    /// # Safety
    /// Key row `j < nk` of `k` is readable for `d` floats.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn scores_few(
        self,
        q: &[f32],
        qs: usize,
        nq: usize,
        d: usize,
        k: ByTable,
        nk: usize,
        st: &mut [f32],
        c: f32,
    ) {
        assert!((1..=FEW_QUERIES).contains(&nq) && q.len() >= (nq - 1) * qs + d);
        assert!(st.len() >= nk * BQ);
        // SAFETY: `InPlace` exists only at the AVX-512 level (avx512f detected, see `Isa`);
        // the asserts above and the caller's rows are the preconditions of
        // `avx512::scores_few_rows`.
        #[cfg(target_arch = "x86_64")]
        avx512::scores_few_rows(q.as_ptr(), qs, nq, d, k, nk, st.as_mut_ptr(), c);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (q, qs, nq, d, k, nk, st, c);
    }

    /// [`pv`] over the `nk` value rows of `v` (`dv` floats each).
    ///
    /// # Safety
    /// Value row `j < nk` of `v` is readable for `dv` floats, and the rows of `o` as for
    /// [`pv`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn pv(
        self,
        st: &[f32],
        nk: usize,
        v: ByTable,
        dv: usize,
        o: *mut f32,
        os: usize,
        nq: usize,
        alpha: &[f32],
        first: bool,
    ) {
        assert!(nq <= BQ && st.len() >= nk * BQ && alpha.len() >= nq && (nq <= 1 || dv <= os));
        // SAFETY: as for `scores_few` above, and the rows of `o` (the caller's contract) for
        // `avx512::pv_rows`.
        #[cfg(target_arch = "x86_64")]
        avx512::pv_rows(st.as_ptr(), nk, v, dv, o, os, nq, alpha.as_ptr(), first);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (st, nk, v, dv, o, os, nq, alpha, first);
    }
}

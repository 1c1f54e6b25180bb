//! The micro-kernels of the projection, one safe (or documented-unsafe) wrapper each: it
//! checks the lengths the kernel relies on and calls the version of the instruction set
//! (`portable`, `avx2`, `avx512`).

use super::portable;
use super::tile::{Ahead, PANEL, R};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use crate::simd::Isa;

/// `y[i * ys + c] += Σ_kk x(i, kk) · wp[kk * 64 + c]` for rows `i < nr`, columns `c < w`,
/// inputs `kk < kc`, with `x(i, kk) = x[(i / 6) * gs + kk * 6 + i % 6]` (packed rows).
///
/// # Safety
/// `y` is valid for reads and writes of `w` floats at `y + i * ys` for every `i < nr`, and
/// nothing else accesses those floats meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate(
    isa: Isa,
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
    ahead: Option<Ahead>,
) {
    assert!((1..=PANEL).contains(&w) && kc > 0 && gs >= R * kc);
    assert!(nr == 0 || x.len() >= (nr - 1) / R * gs + (kc - 1) * R + R);
    assert!(wp.len() >= (kc - 1) * PANEL + w);
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected; the lengths of `x`
        // and `wp` are asserted above and `y`'s rows are the caller's contract: that is
        // `avx512::accumulate`'s contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::accumulate(x.as_ptr(), gs, kc, wp.as_ptr(), y, ys, nr, w, ahead),
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected; the lengths of
        // `x` and `wp` are asserted above and `y`'s rows are the caller's contract: that is
        // `avx2::accumulate`'s contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::accumulate(x.as_ptr(), gs, kc, wp.as_ptr(), y, ys, nr, w, ahead),
        // SAFETY: the caller's contract.
        Isa::Portable => portable::accumulate::<false>(x, gs, kc, wp, y, ys, nr, w),
    }
}

/// Rows `i < nr`, columns `c < w` of `y` (f16 bits, row stride `ys`) `= round(bias[c] +
/// Σ_{kk < k} x(i, kk) · wp[kk * 64 + c])`, `x` packed as for [`accumulate`], over the whole
/// reduction at once with the sums in registers and one rounding, straight into the output
/// (`avx512::product_f16`, `avx2::product_f16`). `None` for the portable kernels (and
/// AVX-512 without BW/VL, which then takes AVX2's): the caller then accumulates into an `f32`
/// tile and rounds it.
///
/// # Safety
/// `y` is valid for writes of `w` values at `y + i * ys` for `i < nr`, and nothing else
/// accesses them while this runs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn product_f16(
    isa: Isa,
    x: &[f32],
    gs: usize,
    k: usize,
    wp: &[f32],
    bias: Option<&[f32]>,
    y: *mut u16,
    ys: usize,
    nr: usize,
    w: usize,
) -> Option<()> {
    assert!((1..=PANEL).contains(&w) && k > 0 && gs >= R * k);
    assert!(nr == 0 || x.len() >= (nr - 1) / R * gs + (k - 1) * R + R);
    assert!(wp.len() >= (k - 1) * PANEL + w);
    assert!(bias.is_none_or(|b| b.len() >= w) && (nr <= 1 || ys >= w));
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected, BW and VL are checked
        // here; the lengths asserted above and the caller's `y` are the kernel's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512
            if is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl") =>
        {
            let b = bias.map_or(std::ptr::null(), |b| b.as_ptr());
            avx512::product_f16(x.as_ptr(), gs, k, wp.as_ptr(), b, y, ys, nr, w);
            Some(())
        }
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` exist only after avx2, fma and f16c were
        // detected; the lengths asserted above and the caller's `y` are the kernel's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => {
            let b = bias.map_or(std::ptr::null(), |b| b.as_ptr());
            avx2::product_f16(x.as_ptr(), gs, k, wp.as_ptr(), b, y, ys, nr, w);
            Some(())
        }
        Isa::Portable => None,
    }
}

/// Transposes `cols` rows of `W` (`k` floats each, row-major) into a panel:
/// `panel[kk * 64 + j] = rows[j * k + kk]` for `j < cols <= 64`, `kk < k`. Lanes `j >= cols`
/// are unspecified (the micro-kernel never reads them into a result).
pub(super) fn pack_strip(isa: Isa, rows: &[f32], cols: usize, k: usize, panel: &mut [f32]) {
    assert!(cols <= PANEL && rows.len() >= cols * k && panel.len() >= k * PANEL);
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected; the lengths are
        // asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::pack_strip(rows, cols, k, panel) },
        // SAFETY: `Isa::Avx2` exists only after avx2 was detected; the lengths are asserted
        // above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::pack_strip(rows, cols, k, panel) },
        Isa::Portable => portable::pack_strip(rows, cols, k, panel),
    }
}

/// `y[i * ys + r] = Σ_kk x[i, kk] · w[r, kk] + bias[r]` for `i < m`, `r < rows`, with the
/// kernel of `isa`.
///
/// # Safety
/// `y` is valid for writes at `i * ys + r` for every `i < m`, `r < rows`, and nothing else
/// accesses those floats meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_block(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    assert!(x.len() >= m * k && w.len() >= rows * k && bias.is_none_or(|b| b.len() >= rows));
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected; the lengths are
        // asserted above and `y` is the caller's contract, which is the function's.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::rows_block(x, m, w, rows, k, bias, y, ys) },
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected; as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::rows_block(x, m, w, rows, k, bias, y, ys) },
        // SAFETY: the caller's contract.
        Isa::Portable => unsafe { portable::rows_block::<false>(x, m, w, rows, k, bias, y, ys) },
    }
}

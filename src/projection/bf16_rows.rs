//! The in-place bf16 row kernel: `y = x Wᵀ + b` with `x` `(m, k)` and `W` `(n, k)` bf16,
//! `W` read row by row where it lies (a memory-mapped bf16 checkpoint), `f32` accumulation,
//! each output rounded once to bf16 (to nearest even, as torch's bf16 `Linear`). A decoding
//! step at a few rows reads every weight once: this is its memory-bound path, reading half the
//! bytes of the `f32` one. Many rows take the packed pair panels instead (`super::half`).
//!
//! Each output is a dot product of two bf16 rows: `vdpbf16ps` (two products a lane) where the
//! CPU has AVX-512 BF16, bf16 widened to `f32` by a shift and `vfmadd` at the AVX2 level, the
//! same in plain Rust over 16 lanes otherwise. The levels sum in different orders (`f32`
//! round-off apart, before the bf16 rounding).

use super::tile::OutPtr;
use crate::simd::Isa;
use rayon::prelude::*;

/// Rows of `W` per parallel task.
const ROWS_PER_TASK: usize = 64;

/// How many rows of `W` ahead the kernel prefetches into L2: the hardware prefetcher alone
/// brought a mapped bf16 output projection (58101 × 512) in at 14 GB/s, half the machine's
/// streaming bandwidth (the `f32` row kernel prefetches likewise, `avx512::rows_block`).
const PREFETCH_ROWS: usize = 48;

/// Prefetches into L2 the `k` values of `w` from `start` on (a hint: addresses past the end
/// are never dereferenced).
#[inline(always)]
fn prefetch_row(w: &[u16], start: usize, k: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let base = w.as_ptr().wrapping_add(start).cast::<i8>();
        let mut line = 0;
        while line < 2 * k {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    base.wrapping_add(line),
                )
            };
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, start, k);
}

/// `f32` value of bf16 bits.
#[inline(always)]
fn widen(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// The portable dot product of two bf16 rows, over 16 `f32` lanes.
fn dot_portable(x: &[u16], w: &[u16]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut xc = x.chunks_exact(16);
    let mut wc = w.chunks_exact(16);
    for (a, b) in (&mut xc).zip(&mut wc) {
        for ((l, &a), &b) in lanes.iter_mut().zip(a).zip(b) {
            *l += widen(a) * widen(b);
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for (&a, &b) in xc.remainder().iter().zip(wc.remainder()) {
        sum += widen(a) * widen(b);
    }
    sum
}

/// How a dot product is computed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dot {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
}

impl Dot {
    fn for_isa(isa: Isa) -> Dot {
        match isa {
            Isa::Portable => Dot::Portable,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Dot::Avx2,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                if x86::has_avx512_bf16() {
                    Dot::Avx512Bf16
                } else {
                    Dot::Avx2
                }
            }
        }
    }

    /// `Σ x[i] · w[i]` over equal-length rows.
    fn dot(self, x: &[u16], w: &[u16]) -> f32 {
        assert_eq!(x.len(), w.len());
        match self {
            Dot::Portable => dot_portable(x, w),
            // SAFETY: `Isa::Avx2` exists only after AVX2 and FMA were detected; the lengths
            // are equal (asserted): `dot_avx2`'s contract.
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 => unsafe { x86::dot_avx2(x, w) },
            // SAFETY: chosen only where AVX-512 F, BW and BF16 were detected; equal lengths.
            #[cfg(target_arch = "x86_64")]
            Dot::Avx512Bf16 => unsafe { x86::dot_avx512_bf16(x, w) },
        }
    }
}

/// `y = round_bf16(x Wᵀ + b)`: `x` `(m, k)`, `w` `(n, k)` bf16 bits row-major, `bias` `(n)`
/// in `f32` → `(m, n)` bf16 bits.
pub(super) fn linear_nt(
    isa: Isa,
    x: &[u16],
    m: usize,
    w: &[u16],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<u16> {
    assert!(x.len() >= m * k && w.len() >= n * k && bias.is_none_or(|b| b.len() >= n));
    let dot = Dot::for_isa(isa);
    let mut y = vec![0u16; m * n];
    let out = OutPtr(y.as_mut_ptr().cast());
    let task = |t: usize| {
        let outputs = t * ROWS_PER_TASK..n.min((t + 1) * ROWS_PER_TASK);
        for j in outputs {
            prefetch_row(w, (j + PREFETCH_ROWS) * k, k);
            let wr = &w[j * k..(j + 1) * k];
            let b = bias.map_or(0.0, |b| b[j]);
            for i in 0..m {
                let v = dot.dot(&x[i * k..(i + 1) * k], wr) + b;
                // SAFETY: `i < m`, `j < n`: inside the `m · n` values of `y`, which outlive
                // the loop; this task alone writes columns `outputs` (the tasks partition
                // them).
                unsafe {
                    *out.get().cast::<u16>().add(i * n + j) = half::bf16::from_f32(v).to_bits()
                };
            }
        }
    };
    let tasks = n.div_ceil(ROWS_PER_TASK);
    if m * n * k >= 1 << 18 && rayon::current_num_threads() > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    y
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// AVX-512 F, BW and BF16, checked once.
    pub(super) fn has_avx512_bf16() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        })
    }

    /// Eight bf16 values at `p` widened to `f32`.
    ///
    /// # Safety
    /// AVX2; 16 bytes readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn widen8(p: *const u16) -> __m256 {
        let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
    }

    /// The dot product of two bf16 rows at the AVX2 level.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `x.len() == w.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(x: &[u16], w: &[u16]) -> f32 {
        let len = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= len {
            a0 = _mm256_fmadd_ps(widen8(xp.add(i)), widen8(wp.add(i)), a0);
            a1 = _mm256_fmadd_ps(widen8(xp.add(i + 8)), widen8(wp.add(i + 8)), a1);
            i += 16;
        }
        let s = _mm256_add_ps(a0, a1);
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        let mut sum = _mm_cvtss_f32(s);
        while i < len {
            sum += super::widen(x[i]) * super::widen(w[i]);
            i += 1;
        }
        sum
    }

    /// The dot product of two bf16 rows with `vdpbf16ps` (the tail masked).
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16 are available; `x.len() == w.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn dot_avx512_bf16(x: &[u16], w: &[u16]) -> f32 {
        let len = x.len();
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 64 <= len {
            let (x0, w0) = (
                _mm512_loadu_si512(xp.add(i).cast()),
                _mm512_loadu_si512(wp.add(i).cast()),
            );
            let (x1, w1) = (
                _mm512_loadu_si512(xp.add(i + 32).cast()),
                _mm512_loadu_si512(wp.add(i + 32).cast()),
            );
            a0 = _mm512_dpbf16_ps(
                a0,
                std::mem::transmute::<__m512i, __m512bh>(x0),
                std::mem::transmute::<__m512i, __m512bh>(w0),
            );
            a1 = _mm512_dpbf16_ps(
                a1,
                std::mem::transmute::<__m512i, __m512bh>(x1),
                std::mem::transmute::<__m512i, __m512bh>(w1),
            );
            i += 64;
        }
        while i < len {
            let rest = (len - i).min(32);
            // Lanes past the row read as zeros (masked loads touch only their lanes).
            let mask: __mmask32 = if rest == 32 { !0 } else { (1u32 << rest) - 1 };
            let xv = _mm512_maskz_loadu_epi16(mask, xp.add(i).cast());
            let wv = _mm512_maskz_loadu_epi16(mask, wp.add(i).cast());
            a0 = _mm512_dpbf16_ps(
                a0,
                std::mem::transmute::<__m512i, __m512bh>(xv),
                std::mem::transmute::<__m512i, __m512bh>(wv),
            );
            i += rest;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_matches_an_f64_reference() {
        for &(m, n, k) in &[(1, 3, 1), (2, 70, 33), (3, 130, 512), (5, 64, 100)] {
            let bits = |len: usize, seed: usize| -> Vec<u16> {
                (0..len)
                    .map(|i| {
                        half::bf16::from_f32((((i * 7 + seed) % 23) as f32 - 11.0) / 8.0).to_bits()
                    })
                    .collect()
            };
            let (x, w) = (bits(m * k, 1), bits(n * k, 5));
            let b: Vec<f32> = (0..n).map(|j| j as f32 / 16.0).collect();
            for isa in crate::simd::isas() {
                let y = linear_nt(isa, &x, m, &w, n, k, Some(&b));
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|kk| widen(x[i * k + kk]) as f64 * widen(w[j * k + kk]) as f64)
                            .sum::<f64>()
                            + b[j] as f64;
                        let got = widen(y[i * n + j]) as f64;
                        // One bf16 rounding (2^-8 relative) of an exactly summed product.
                        assert!(
                            (got - want).abs() <= want.abs() / 256.0 + 1e-6,
                            "{isa:?} {m}x{n}x{k} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
            // AVX-512 BF16 is tested where the CPU has it, whatever level `isas` stops at.
            #[cfg(target_arch = "x86_64")]
            if x86::has_avx512_bf16() {
                let y = Dot::Avx512Bf16.dot(&x[..k], &w[..k]);
                assert!((y - dot_portable(&x[..k], &w[..k])).abs() <= 1e-3 * (1.0 + y.abs()));
            }
        }
    }
}

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
use crate::simd::{prefetch_lines, Isa, NearCache};
use rayon::prelude::*;

/// Rows of `W` per parallel task.
const ROWS_PER_TASK: usize = 64;

/// How many rows of `W` ahead the kernel prefetches into L2: the hardware prefetcher alone
/// brought a mapped bf16 output projection (58101 × 512) in at 14 GB/s, half the machine's
/// streaming bandwidth (the `f32` row kernel prefetches likewise, `avx512::rows_block`).
const PREFETCH_ROWS: usize = 48;

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

    /// Rows of `x` per tile (the tile is that many rows × 4 outputs).
    fn tile_rows(self) -> usize {
        match self {
            Dot::Portable => 4,
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 => 2,
            #[cfg(target_arch = "x86_64")]
            Dot::Avx512Bf16 => 4,
        }
    }

    /// `sums[a][b] = Σ_c x[a·k + c] · w[b·k + c]` for rows `a < mr` of `x` (at most
    /// [`Dot::tile_rows`]) and 4 rows `b` of `w` (`w` holds 4 rows of `k`).
    ///
    /// With `ahead`, the tile also prefetches into L2 the 4 rows of `k` values from that
    /// position of `w`, one line per row at each step (spread over the tile's loads rather
    /// than issued in a burst, which stalled on the CPU's outstanding-miss limit).
    fn tile(
        self,
        x: &[u16],
        mr: usize,
        w: &[u16],
        k: usize,
        ahead: Option<*const u16>,
    ) -> [[f32; 4]; 4] {
        assert!(mr >= 1 && mr <= self.tile_rows() && x.len() >= mr * k && w.len() >= 4 * k);
        match self {
            Dot::Portable => {
                if let Some(p) = ahead {
                    // The next 4 rows of `W` (2 bytes a value).
                    prefetch_lines(p.cast(), 2 * 4 * k, NearCache::L2);
                }
                let mut sums = [[0f32; 4]; 4];
                for (a, row) in sums.iter_mut().enumerate().take(mr) {
                    for (b, s) in row.iter_mut().enumerate() {
                        *s = dot_portable(&x[a * k..(a + 1) * k], &w[b * k..(b + 1) * k]);
                    }
                }
                sums
            }
            // SAFETY: `Isa::Avx2` exists only after AVX2 and FMA were detected; the lengths
            // are asserted above: `tile_avx2`'s contract.
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 => unsafe {
                match mr {
                    1 => x86::tile_avx2::<1>(x.as_ptr(), w.as_ptr(), k, ahead),
                    _ => x86::tile_avx2::<2>(x.as_ptr(), w.as_ptr(), k, ahead),
                }
            },
            // SAFETY: chosen only where AVX-512 F, BW and BF16 were detected; lengths as above.
            #[cfg(target_arch = "x86_64")]
            Dot::Avx512Bf16 => unsafe {
                match mr {
                    1 => x86::tile_avx512_bf16::<1>(x.as_ptr(), w.as_ptr(), k, ahead),
                    2 => x86::tile_avx512_bf16::<2>(x.as_ptr(), w.as_ptr(), k, ahead),
                    3 => x86::tile_avx512_bf16::<3>(x.as_ptr(), w.as_ptr(), k, ahead),
                    _ => x86::tile_avx512_bf16::<4>(x.as_ptr(), w.as_ptr(), k, ahead),
                }
            },
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
    let tr = dot.tile_rows();
    // The 4 rows of a tile past the last row of `w` repeat its first row (read, not written).
    let task = |t: usize| {
        let outputs = t * ROWS_PER_TASK..n.min((t + 1) * ROWS_PER_TASK);
        let mut j = outputs.start;
        let mut padded = Vec::new();
        while j < outputs.end {
            let nr = 4.min(outputs.end - j);
            let ahead = w.as_ptr().wrapping_add((j + PREFETCH_ROWS) * k);
            let wt: &[u16] = if nr == 4 {
                &w[j * k..(j + 4) * k]
            } else {
                padded.clear();
                padded.extend_from_slice(&w[j * k..(j + nr) * k]);
                padded.resize(4 * k, 0);
                &padded
            };
            let mut i = 0;
            while i < m {
                let mr = tr.min(m - i);
                let sums = dot.tile(
                    &x[i * k..(i + mr) * k],
                    mr,
                    wt,
                    k,
                    (i == 0).then_some(ahead),
                );
                for (a, row) in sums.iter().enumerate().take(mr) {
                    for (b, &v) in row.iter().enumerate().take(nr) {
                        let v = v + bias.map_or(0.0, |bias| bias[j + b]);
                        // SAFETY: `i + a < m`, `j + b < n`: inside the `m · n` values of `y`,
                        // which outlive the loop; this task alone writes columns `outputs`
                        // (the tasks partition them).
                        unsafe {
                            *out.get().cast::<u16>().add((i + a) * n + j + b) =
                                half::bf16::from_f32(v).to_bits()
                        };
                    }
                }
                i += mr;
            }
            j += nr;
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

    /// A tile of `MR` rows of `x` × 4 rows of `w` (row stride `k`) at the AVX2 level: bf16
    /// widened to `f32` by a shift, `vfmadd`; the last `k % 8` inputs in scalar code.
    ///
    /// # Safety
    /// AVX2 and FMA are available; `x` holds `MR · k` and `w` `4 · k` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2<const MR: usize>(
        x: *const u16,
        w: *const u16,
        k: usize,
        ahead: Option<*const u16>,
    ) -> [[f32; 4]; 4] {
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        let mut c = 0;
        while c + 8 <= k {
            if let Some(p) = ahead {
                if c % 32 == 0 {
                    for b in 0..4 {
                        // A hint, never a fault.
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(b * k + c).cast());
                    }
                }
            }
            let wv: [__m256; 4] = std::array::from_fn(|b| widen8(w.add(b * k + c)));
            for (a, acc) in acc.iter_mut().enumerate() {
                let xv = widen8(x.add(a * k + c));
                for (s, &wv) in acc.iter_mut().zip(&wv) {
                    *s = _mm256_fmadd_ps(xv, wv, *s);
                }
            }
            c += 8;
        }
        let mut sums = [[0f32; 4]; 4];
        for (a, row) in acc.iter().enumerate() {
            for (b, v) in row.iter().enumerate() {
                let s = _mm_add_ps(_mm256_castps256_ps128(*v), _mm256_extractf128_ps::<1>(*v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                let mut sum = _mm_cvtss_f32(s);
                for cc in c..k {
                    sum += super::widen(*x.add(a * k + cc)) * super::widen(*w.add(b * k + cc));
                }
                sums[a][b] = sum;
            }
        }
        sums
    }

    /// A tile of `MR` rows of `x` × 4 rows of `w` (row stride `k`) with `vdpbf16ps`, 32
    /// inputs a step, the tail masked.
    ///
    /// # Safety
    /// AVX-512 F, BW and BF16 are available; `x` holds `MR · k` and `w` `4 · k` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn tile_avx512_bf16<const MR: usize>(
        x: *const u16,
        w: *const u16,
        k: usize,
        ahead: Option<*const u16>,
    ) -> [[f32; 4]; 4] {
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        let mut c = 0;
        while c < k {
            if let Some(p) = ahead {
                for b in 0..4 {
                    // A hint, never a fault.
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(b * k + c).cast());
                }
            }
            let rest = (k - c).min(32);
            // Lanes past the row read as zeros (masked loads touch only their lanes).
            let mask: __mmask32 = if rest == 32 { !0 } else { (1u32 << rest) - 1 };
            let wv: [__m512bh; 4] = std::array::from_fn(|b| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(
                    mask,
                    w.add(b * k + c).cast(),
                ))
            });
            for (a, acc) in acc.iter_mut().enumerate() {
                let xv = std::mem::transmute::<__m512i, __m512bh>(_mm512_maskz_loadu_epi16(
                    mask,
                    x.add(a * k + c).cast(),
                ));
                for (s, &wv) in acc.iter_mut().zip(&wv) {
                    *s = _mm512_dpbf16_ps(*s, xv, wv);
                }
            }
            c += rest;
        }
        // The 4 · MR horizontal sums together (`sums_16`: 45 instructions for 16, where one
        // `_mm512_reduce_add_ps` each took a third of a 32-row tile's time).
        let mut all = [_mm512_setzero_ps(); 16];
        for (a, row) in acc.iter().enumerate() {
            all[4 * a..4 * a + 4].copy_from_slice(row);
        }
        let mut flat = [0f32; 16];
        _mm512_storeu_ps(flat.as_mut_ptr(), crate::simd::avx512::sums_16(all));
        std::array::from_fn(|a| std::array::from_fn(|b| flat[4 * a + b]))
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
            if x86::has_avx512_bf16() && n >= 4 {
                for mr in 1..=m.min(4) {
                    let got = Dot::Avx512Bf16.tile(&x, mr, &w, k, None);
                    let want = Dot::Portable.tile(&x, mr, &w, k, None);
                    for (g, r) in got.iter().flatten().zip(want.iter().flatten()) {
                        assert!((g - r).abs() <= 1e-3 * (1.0 + r.abs()), "{mr}: {g} vs {r}");
                    }
                }
            }
        }
    }
}

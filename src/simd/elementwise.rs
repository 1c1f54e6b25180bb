//! The element-wise passes of inference on CPU `f32` tensors: the feed-forward activations
//! ([`activation`]), layer normalisation ([`layer_norm`]) and the residual sums ([`add`]), computed here rather than with
//! candle's ops, on the calling thread or on rayon's pool.
//!
//! candle's element-wise ops split large tensors over candle's own thread pool, whose workers
//! busy-wait for a while after each op; on a machine with as many cores as threads they then
//! spin against the rayon tasks of the projections that follow (measured on MarianMT beam
//! search, 2 threads: about 15% of the CPU time spent spinning). Its layer norm runs one
//! rayon task per row with serial sums.
//!
//! Kernels per instruction set:
//! * ReLU: one `max` per lane, vectorised by the compiler (plain Rust, compiled a second time
//!   with AVX2 for the AVX2 level);
//! * SiLU `x / (1 + e^-x)`: on AVX2 and AVX-512 eight lanes with the `2^x` polynomial of
//!   [`super::EXP2_POLY`] and the exponent's rounding error carried (relative error about
//!   3e-7 against the exact value; candle's scalar `expf` per element was 2% of a MarianMT
//!   beam search); portable keeps candle's own scalar formula, bit for bit;
//! * layer norm: two passes over each row (the mean, then the variance of the deviations, as
//!   torch computes it; candle's `E[x²] - E[x]²` loses digits when the mean is large) with
//!   8-lane partial sums, then `(x - mean) · rstd · weight + bias`; the same lane-array code
//!   compiled for the baseline and for AVX2 + FMA.

use super::isa::Isa;
use super::storage::cpu_f32;
use candle::{DType, Tensor};
use rayon::prelude::*;

/// Below this many elements a pass runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// The activations this module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// `max(0, x)`.
    Relu,
    /// `x · sigmoid(x)`.
    Silu,
}

/// `true` for a CPU `f32` tensor outside any autograd graph.
fn takes(xs: &Tensor) -> bool {
    xs.device().is_cpu() && xs.dtype() == DType::F32 && !xs.track_op()
}

/// `kernel(src, dst)` over the elements of a CPU `f32` tensor outside any autograd graph, in
/// chunks (on rayon's pool when large), as a new contiguous tensor of the same shape; `None`
/// for anything else (another device or dtype, a tensor tracking its gradient), which the
/// caller computes with candle's ops.
fn map_slices(
    xs: &Tensor,
    kernel: impl Fn(&[f32], &mut [f32]) + Sync,
) -> candle::Result<Option<Tensor>> {
    if !takes(xs) {
        return Ok(None);
    }
    let xs = xs.contiguous()?;
    let n = xs.elem_count();
    let mut ys = vec![0f32; n];
    {
        let (storage, layout) = xs.storage_and_layout();
        let src = &cpu_f32(&storage)?[layout.start_offset()..][..n];
        if n >= PARALLEL_MIN {
            let chunk = PARALLEL_MIN / 2;
            src.par_chunks(chunk)
                .zip(ys.par_chunks_mut(chunk))
                .for_each(|(s, d)| kernel(s, d));
        } else {
            kernel(src, &mut ys);
        }
    }
    Tensor::from_vec(ys, xs.shape(), xs.device()).map(Some)
}

/// `f` applied to every element (see [`map_slices`]).
pub(crate) fn map_cpu_f32(
    xs: &Tensor,
    f: impl Fn(f32) -> f32 + Sync,
) -> candle::Result<Option<Tensor>> {
    map_slices(xs, |s, d| {
        for (d, &s) in d.iter_mut().zip(s) {
            *d = f(s);
        }
    })
}

/// `a + b` for two tensors of one shape (the residual connections): on CPU `f32` tensors
/// outside any autograd graph an element-wise pass on the calling thread or rayon's pool (the
/// same sums as candle's op); otherwise candle's op. candle's own add runs large tensors on
/// its barrier pool, whose worker spins against our rayon tasks (about 6% of the CPU time of
/// a MarianMT beam search on 2 threads).
pub(crate) fn add(a: &Tensor, b: &Tensor) -> candle::Result<Tensor> {
    if !takes(a) || !takes(b) || a.dims() != b.dims() {
        return a + b;
    }
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    let n = a.elem_count();
    let mut ys = vec![0f32; n];
    {
        let (a_storage, a_layout) = a.storage_and_layout();
        let (b_storage, b_layout) = b.storage_and_layout();
        let x = &cpu_f32(&a_storage)?[a_layout.start_offset()..][..n];
        let y = &cpu_f32(&b_storage)?[b_layout.start_offset()..][..n];
        let kernel = |x: &[f32], y: &[f32], d: &mut [f32]| {
            for ((d, x), y) in d.iter_mut().zip(x).zip(y) {
                *d = x + y;
            }
        };
        if n >= PARALLEL_MIN {
            let chunk = PARALLEL_MIN / 2;
            x.par_chunks(chunk)
                .zip(y.par_chunks(chunk))
                .zip(ys.par_chunks_mut(chunk))
                .for_each(|((x, y), d)| kernel(x, y, d));
        } else {
            kernel(x, y, &mut ys);
        }
    }
    Tensor::from_vec(ys, a.shape(), a.device())
}

/// candle's `Silu::f32`, what the portable and AVX-512 levels compute.
#[inline(always)]
fn silu_scalar(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// `act` applied element-wise to a CPU `f32` tensor outside any autograd graph with the
/// kernels of `isa`; `None` for anything else (see [`map_slices`]).
pub(crate) fn activation(isa: Isa, act: Act, xs: &Tensor) -> candle::Result<Option<Tensor>> {
    match (act, isa) {
        // SAFETY: `Isa::Avx2` exists only after avx2 and fma were detected.
        #[cfg(target_arch = "x86_64")]
        (Act::Relu, Isa::Avx2 | Isa::Avx512) => map_slices(xs, |s, d| unsafe { avx2::relu(s, d) }),
        (Act::Relu, _) => map_slices(xs, relu_portable),
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (Act::Silu, Isa::Avx2 | Isa::Avx512) => map_slices(xs, |s, d| unsafe { avx2::silu(s, d) }),
        (Act::Silu, _) => map_cpu_f32(xs, silu_scalar),
    }
}

/// `dst[i]` = the bf16 bits of `src[i]` ([`super::scalar::round_bf16`]: nearest even, exactly as
/// `half::bf16::from_f32`) with the kernels of `isa`, on rayon's pool when long: an `f32`
/// checkpoint rounded to bf16 at load.
pub(crate) fn round_to_bf16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "round_to_bf16: lengths differ");
    let kernel = |s: &[f32], d: &mut [u16]| match isa {
        // SAFETY: `Isa::Avx2` and `Isa::Avx512` exist only after avx2 and fma were detected.
        // (Memory bound: AVX2's 8 lanes serve the AVX-512 level as well, as for ReLU.)
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => unsafe { avx2::round_to_bf16(s, d) },
        _ => round_to_bf16_portable(s, d),
    };
    if src.len() < PARALLEL_MIN {
        kernel(src, dst);
    } else {
        dst.par_chunks_mut(PARALLEL_MIN)
            .zip(src.par_chunks(PARALLEL_MIN))
            .for_each(|(d, s)| kernel(s, d));
    }
}

#[inline(always)]
fn round_to_bf16_portable(s: &[f32], d: &mut [u16]) {
    for (d, &s) in d.iter_mut().zip(s) {
        *d = super::scalar::round_bf16(s);
    }
}

/// `d[i] = max(0, s[i])` (NaN stays NaN, as candle's `relu`).
#[inline(always)]
fn relu_portable(s: &[f32], d: &mut [f32]) {
    for (d, &s) in d.iter_mut().zip(s) {
        *d = s.max(0.0);
    }
}

/// Layer normalisation over the last dimension of a CPU `f32` tensor outside any autograd
/// graph: `(x - mean) / sqrt(var + eps) · weight + bias` (`weight`, `bias` `(d)` CPU `f32`),
/// with the kernels of `isa`; `None` for anything else (the caller uses candle's op).
pub(crate) fn layer_norm(
    isa: Isa,
    xs: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    eps: f64,
) -> candle::Result<Option<Tensor>> {
    let Some(&d) = xs.dims().last() else {
        return Ok(None);
    };
    if !takes(xs)
        || !takes(weight)
        || bias.is_some_and(|b| !takes(b))
        || weight.dims() != [d]
        || bias.is_some_and(|b| b.dims() != [d])
        || d == 0
    {
        return Ok(None);
    }
    let xs = xs.contiguous()?;
    let (weight, bias) = (
        weight.contiguous()?,
        bias.map(|b| b.contiguous()).transpose()?,
    );
    let n = xs.elem_count();
    let mut ys = vec![0f32; n];
    {
        let (xs_s, xl) = xs.storage_and_layout();
        let src = &cpu_f32(&xs_s)?[xl.start_offset()..][..n];
        let (ws, wl) = weight.storage_and_layout();
        let w = &cpu_f32(&ws)?[wl.start_offset()..][..d];
        let bias_guard = bias.as_ref().map(|b| b.storage_and_layout());
        let b = match &bias_guard {
            Some((bs, bl)) => Some(&cpu_f32(bs)?[bl.start_offset()..][..d]),
            None => None,
        };
        let eps = eps as f32;
        let row = |s: &[f32], o: &mut [f32]| match isa {
            // SAFETY: `Isa::Avx2`/`Avx512` exist only after avx2 and fma were detected.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => unsafe { avx2::layer_norm_row(s, w, b, eps, o) },
            Isa::Portable => layer_norm_row::<false>(s, w, b, eps, o),
        };
        if n >= PARALLEL_MIN {
            let rows_per_task = (PARALLEL_MIN / 4).div_ceil(d).max(1) * d;
            src.par_chunks(rows_per_task)
                .zip(ys.par_chunks_mut(rows_per_task))
                .for_each(|(s, o)| {
                    for (s, o) in s.chunks_exact(d).zip(o.chunks_exact_mut(d)) {
                        row(s, o)
                    }
                });
        } else {
            for (s, o) in src.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
                row(s, o)
            }
        }
    }
    Tensor::from_vec(ys, xs.shape(), xs.device()).map(Some)
}

/// Lanes of the portable passes.
const L: usize = 8;

/// The sum of `s`, in 8 lanes then pairwise.
#[inline(always)]
fn lane_sum(s: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; L];
    let mut chunks = s.chunks_exact(L);
    for c in &mut chunks {
        for j in 0..L {
            acc[j] += f(c[j]);
        }
    }
    let h: [f32; 4] = std::array::from_fn(|j| acc[j] + acc[j + 4]);
    let mut t = (h[0] + h[2]) + (h[1] + h[3]);
    for &x in chunks.remainder() {
        t += f(x);
    }
    t
}

/// One row of [`layer_norm`]: `o = (s - mean) · rstd · w + b`.
#[inline(always)]
fn layer_norm_row<const FMA: bool>(
    s: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    eps: f32,
    o: &mut [f32],
) {
    let n = s.len() as f32;
    let mean = lane_sum(s, |x| x) / n;
    let var = lane_sum(s, |x| (x - mean) * (x - mean)) / n;
    let rstd = 1.0 / (var + eps).sqrt();
    let (w, o) = (&w[..s.len()], &mut o[..s.len()]);
    match b {
        Some(b) => {
            let b = &b[..s.len()];
            for i in 0..s.len() {
                o[i] = super::scalar::fma::<FMA>((s[i] - mean) * rstd, w[i], b[i]);
            }
        }
        None => {
            for i in 0..s.len() {
                o[i] = (s[i] - mean) * rstd * w[i];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::simd::avx2::{exp_ps, lanes8};
    use core::arch::x86_64::*;

    /// [`super::relu_portable`] compiled with AVX2 (`vmaxps` on 8 lanes).
    ///
    /// # Safety
    /// AVX2 available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn relu(s: &[f32], d: &mut [f32]) {
        super::relu_portable(s, d)
    }

    /// [`super::round_to_bf16_portable`] compiled with AVX2 (8 lanes).
    ///
    /// # Safety
    /// AVX2 available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn round_to_bf16(s: &[f32], d: &mut [u16]) {
        super::round_to_bf16_portable(s, d)
    }

    /// [`super::layer_norm_row`] compiled with AVX2 and FMA (8-lane sums, `vfmadd`).
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn layer_norm_row(
        s: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        eps: f32,
        o: &mut [f32],
    ) {
        super::layer_norm_row::<true>(s, w, b, eps, o)
    }

    /// `d[i] = s[i] / (1 + e^-s[i])`, 8 lanes at a time (see the module documentation).
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu(s: &[f32], d: &mut [f32]) {
        let n = s.len().min(d.len());
        let one = _mm256_set1_ps(1.0);
        let silu = |x: __m256| {
            _mm256_div_ps(
                x,
                _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x))),
            )
        };
        let mut i = 0;
        // Whole vectors with plain loads and stores: a masked store (`vmaskmovps`) is
        // microcoded on AMD cores, and storing every vector that way made this pass 2.3% of a
        // bulk beam search instead of about 1% (`perf`, Zen 4).
        while i + 8 <= n {
            // SAFETY: floats i .. i + 8 <= n of both slices.
            let x = _mm256_loadu_ps(s.as_ptr().add(i));
            _mm256_storeu_ps(d.as_mut_ptr().add(i), silu(x));
            i += 8;
        }
        if i < n {
            let mask = lanes8(n - i);
            // SAFETY: the masked load and store touch only the floats i .. n.
            let x = _mm256_maskload_ps(s.as_ptr().add(i), mask);
            _mm256_maskstore_ps(d.as_mut_ptr().add(i), mask, silu(x));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transformer::Activation;
    use candle::{Device, Var};

    /// Rounding to bf16 at every level, serial and on the pool, gives `half::bf16::from_f32`'s
    /// bits for every kind of value: ties both ways, values that round up into the next
    /// binade or to infinity, subnormals (kept, not flushed), infinities, NaNs of either sign
    /// and payload, and a sweep of bit patterns.
    #[test]
    fn rounding_to_bf16_is_halfs_at_every_level() {
        let mut values = vec![
            0.0f32,
            -0.0,
            1.0,
            1.0 + f32::EPSILON * 64.0,  // a tie at an odd bf16: up
            1.0 + f32::EPSILON * 192.0, // a tie at an even bf16: down
            f32::MAX,
            -f32::MAX,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x8001_7fff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc1_2345),
        ];
        let mut state = 0x9e37_79b9u32;
        values.extend((0..(PARALLEL_MIN * 3 + 17)).map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f32::from_bits(state)
        }));
        let want: Vec<u16> = values
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_bits())
            .collect();
        for isa in crate::simd::isas() {
            for len in [values.len(), 17, 3] {
                let mut got = vec![0u16; len];
                round_to_bf16(isa, &values[..len], &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g,
                        w,
                        "{isa:?}: {:e} ({:#x})",
                        values[i],
                        values[i].to_bits()
                    );
                }
            }
        }
    }

    /// The CPU paths of the activations (serial and on the pool), at every level: ReLU exactly
    /// candle's, SiLU exactly candle's at the portable level and within 4e-7 relative (plus
    /// 1e-38 absolute, for the underflowing tail) on AVX2 and AVX-512; tensors they do not take (tracking
    /// a gradient, another dtype) still get candle's op.
    #[test]
    fn activations_on_the_cpu_path_equal_candles_ops() -> candle::Result<()> {
        // 70 000 values take the pool; under Miri (minutes per thousand) only the serial path.
        let lens: &[usize] = if cfg!(miri) { &[7] } else { &[7, 70_000] };
        for &len in lens {
            let mut xs = Tensor::randn(0f32, 3.0, (len,), &Device::Cpu)?.to_vec1::<f32>()?;
            let n = xs.len();
            xs[n - 1] = -100.0;
            xs[0] = 100.0;
            let xs = Tensor::from_vec(xs, (len,), &Device::Cpu)?;
            for isa in crate::simd::isas() {
                for (act, want) in [(Act::Silu, xs.silu()?), (Act::Relu, xs.relu()?)] {
                    let got = activation(isa, act, &xs)?.expect("a CPU f32 tensor");
                    let (got, want) = (got.to_vec1::<f32>()?, want.to_vec1::<f32>()?);
                    let exact = act == Act::Relu || isa == Isa::Portable;
                    if cfg!(miri) || !exact {
                        // Miri adds a few ulps of random error to every `exp` on purpose (a
                        // platform's libm may differ).
                        let rel = if cfg!(miri) { 8.0 * f32::EPSILON } else { 4e-7 };
                        for (g, w) in got.iter().zip(&want) {
                            let tol = rel * w.abs() + 1e-38;
                            assert!((g - w).abs() <= tol, "{isa:?} {act:?}, {len}: {g} vs {w}");
                        }
                    } else {
                        assert_eq!(got, want, "{isa:?} {act:?}, {len}");
                    }
                }
            }
            for act in [Activation::Silu, Activation::Relu] {
                // A strided view is made contiguous first.
                let view = xs.reshape((len, 1))?.t()?;
                assert_eq!(act.apply(&view)?.dims(), &[1, len]);
            }
        }
        let var = Var::randn(0f32, 1.0, (3, 4), &Device::Cpu)?;
        assert!(map_cpu_f32(var.as_tensor(), |v| v)?.is_none());
        let half = Tensor::ones((2,), DType::F16, &Device::Cpu)?;
        assert!(map_cpu_f32(&half, |v| v)?.is_none());
        assert_eq!(Activation::Silu.apply(&half)?.dtype(), DType::F16);
        Ok(())
    }

    /// The residual sum equals candle's, serial and on the pool, with a strided operand;
    /// what it does not take (a gradient-tracking operand, other shapes, another dtype) goes
    /// to candle's op.
    #[test]
    fn add_equals_candles_sum() -> candle::Result<()> {
        let lens: &[usize] = if cfg!(miri) { &[7] } else { &[7, 70_000] };
        for &len in lens {
            let a = Tensor::randn(0f32, 3.0, (len, 2), &Device::Cpu)?;
            let b = Tensor::randn(0f32, 3.0, (2, len), &Device::Cpu)?.t()?;
            let want = (&a + &b)?.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(add(&a, &b)?.flatten_all()?.to_vec1::<f32>()?, want);
        }
        let var = Var::randn(0f32, 1.0, (3, 4), &Device::Cpu)?;
        let sum = add(var.as_tensor(), var.as_tensor())?;
        assert!(sum.track_op(), "autograd keeps candle's op");
        let half = Tensor::ones((2,), DType::F16, &Device::Cpu)?;
        assert_eq!(add(&half, &half)?.dtype(), DType::F16);
        let row = Tensor::ones((1, 4), DType::F32, &Device::Cpu)?;
        let err = add(&row, &Tensor::ones((4, 1), DType::F32, &Device::Cpu)?);
        assert!(err.is_err(), "shapes that differ get candle's error");
        Ok(())
    }

    /// Layer norm at every level against the formula in f64, rows of awkward widths, with and
    /// without a bias, serial and on the pool; a large mean does not cost digits.
    #[test]
    fn layer_norm_matches_the_formula_at_every_level() -> candle::Result<()> {
        let dev = Device::Cpu;
        let shapes: &[(usize, usize)] = if cfg!(miri) {
            &[(2, 11)]
        } else {
            &[(1, 1), (3, 7), (2, 16), (5, 37), (4, 512), (70, 512)]
        };
        for &(m, d) in shapes {
            let x = (Tensor::randn(0f32, 2.0, (m, d), &dev)? + 100.0)?;
            let w = Tensor::randn(1f32, 0.5, (d,), &dev)?;
            let b = Tensor::randn(0f32, 0.5, (d,), &dev)?;
            let (xv, wv, bv) = (
                x.flatten_all()?.to_vec1::<f32>()?,
                w.to_vec1::<f32>()?,
                b.to_vec1::<f32>()?,
            );
            for isa in crate::simd::isas() {
                for bias in [None, Some(&b)] {
                    let got = layer_norm(isa, &x, &w, bias, 1e-5)?.expect("CPU f32");
                    let got = got.flatten_all()?.to_vec1::<f32>()?;
                    for (r, row) in xv.chunks(d).enumerate() {
                        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                        let var =
                            row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
                        for c in 0..d {
                            let mut want =
                                (row[c] as f64 - mean) / (var + 1e-5).sqrt() * wv[c] as f64;
                            if bias.is_some() {
                                want += bv[c] as f64;
                            }
                            let g = got[r * d + c] as f64;
                            assert!(
                                (g - want).abs() <= 2e-4 * (1.0 + want.abs()),
                                "{isa:?} ({m}, {d}) bias {} at ({r}, {c}): {g} vs {want}",
                                bias.is_some()
                            );
                        }
                    }
                }
            }
        }
        let var = Var::randn(0f32, 1.0, (3, 4), &dev)?;
        let w = Tensor::ones((4,), DType::F32, &dev)?;
        assert!(layer_norm(Isa::get(), var.as_tensor(), &w, None, 1e-5)?.is_none());
        Ok(())
    }
}

//! CPU building blocks shared by the attention kernels ([`crate::sdpa`]) and the projection
//! GEMM ([`crate::projection`]): which instruction set to run ([`Isa`]), the per-thread
//! [scratch](with_scratch) buffer, borrowing a CPU tensor's floats ([`cpu_f32`]), the portable
//! [`fma`], the `2^x` polynomial, row operations over long score vectors ([`rows`]: the
//! generation loops' `log_softmax`, argmax, top-k scan), and (x86-64) the AVX-512 helpers of
//! the micro-kernels.
//!
//! Nothing here is attention- or GEMM-specific; the kernels themselves stay with their module.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod rows;
mod scratch;

pub(crate) use scratch::with_scratch;

use candle::Storage;

/// Coefficients (highest degree first) of the polynomial approximating `2^f` on
/// `[-0.5, 0.5]`, relative error 2.2e-9 (least squares on Chebyshev nodes).
pub(crate) const EXP2_POLY: [f32; 7] = [
    1.537_071_6e-4,
    1.339_985_8e-3,
    9.618_374e-3,
    5.550_329e-2,
    0.240_226_49,
    std::f32::consts::LN_2,
    1.0,
];

/// Coefficients (highest degree first) of a degree-4 polynomial approximating `2^f` on
/// `[-0.5, 0.5]`, relative error 3.1e-6 and exactly 1 at 0 (least squares on Chebyshev nodes,
/// weighted by `2^-f`): for probabilities that are rounded to bf16 (relative error up to 2^-9 = 2e-3)
/// before they are used, where [`EXP2_POLY`]'s precision would be rounded away.
pub(crate) const EXP2_POLY_BF16: [f32; 5] = [
    9.600_395e-3,
    5.591_689_4e-2,
    0.240_237_19,
    0.693_121_97,
    1.0,
];

/// The instruction set the kernels run with. `Avx512` and `Avx2` are only ever constructed by
/// [`Isa::detect`] after a successful runtime check, which is what makes calling their
/// `#[target_feature]` functions sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU has (`Portable` when `force_portable`): AVX-512F
    /// (with AVX2 and FMA), else AVX2 with FMA, else portable Rust.
    pub(crate) fn detect(force_portable: bool) -> Isa {
        if force_portable {
            return Isa::Portable;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }
}

/// The `f32` elements of a CPU storage (the whole buffer: index it from the layout's start
/// offset). An error for other devices or dtypes.
pub(crate) fn cpu_f32(storage: &Storage) -> candle::Result<&[f32]> {
    match storage {
        Storage::Cpu(s) => s.as_slice::<f32>(),
        _ => candle::bail!(
            "the CPU kernels (tiled attention, packed projection) run on CPU tensors only"
        ),
    }
}

/// Below this many elements [`map_cpu_f32`] runs on the calling thread.
const MAP_PARALLEL_MIN: usize = 1 << 15;

/// `f` applied to every element of a CPU `f32` tensor outside any autograd graph, as a new
/// contiguous tensor of the same shape, on rayon's pool when large; `None` for anything else
/// (another device or dtype, a tensor tracking its gradient), which the caller computes with
/// candle's ops.
pub(crate) fn map_cpu_f32(
    xs: &candle::Tensor,
    f: fn(f32) -> f32,
) -> candle::Result<Option<candle::Tensor>> {
    use rayon::prelude::*;
    if !xs.device().is_cpu() || xs.dtype() != candle::DType::F32 || xs.track_op() {
        return Ok(None);
    }
    let xs = xs.contiguous()?;
    let ys: Vec<f32> = {
        let (storage, layout) = xs.storage_and_layout();
        let src = &cpu_f32(&storage)?[layout.start_offset()..][..xs.elem_count()];
        if src.len() >= MAP_PARALLEL_MIN {
            // An indexed parallel collect writes each element once, in place.
            src.par_iter()
                .with_min_len(MAP_PARALLEL_MIN / 2)
                .map(|&v| f(v))
                .collect()
        } else {
            src.iter().map(|&v| f(v)).collect()
        }
    };
    candle::Tensor::from_vec(ys, xs.shape(), xs.device()).map(Some)
}

/// The elements of a CPU f16 or bf16 storage as their 16-bit patterns (the whole buffer: index
/// it from the layout's start offset). An error for other devices or dtypes.
pub(crate) fn cpu_half_bits(storage: &Storage) -> candle::Result<&[u16]> {
    use half::slice::HalfFloatSliceExt;
    match storage {
        Storage::Cpu(candle::CpuStorage::F16(x)) => Ok(x.reinterpret_cast()),
        Storage::Cpu(candle::CpuStorage::BF16(x)) => Ok(x.reinterpret_cast()),
        Storage::Cpu(_) => candle::bail!(
            "the half-precision CPU kernels need f16 or bf16 tensors, got {:?}",
            storage.dtype()
        ),
        _ => candle::bail!(
            "the CPU kernels (tiled attention, half-precision projection) run on CPU tensors only"
        ),
    }
}

/// `a · b + c`, fused (one rounding) when `FMA`: only use `FMA = true` in code compiled with
/// the `fma` target feature, where it is a single instruction (a libm call otherwise).
#[inline(always)]
pub(crate) fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

#[cfg(test)]
mod tests {
    use crate::transformer::Activation;
    use candle::{Device, Tensor, Var};

    /// The CPU path of the activations (`map_cpu_f32`, serial and on the pool) gives exactly
    /// candle's values; tensors it does not take (tracking a gradient, another dtype) still get
    /// candle's op.
    #[test]
    fn activations_on_the_cpu_path_equal_candles_ops() -> candle::Result<()> {
        // 70 000 values take the pool; under Miri (minutes per thousand) only the serial path.
        let lens: &[usize] = if cfg!(miri) { &[7] } else { &[7, 70_000] };
        for &len in lens {
            let xs = Tensor::randn(0f32, 3.0, (len,), &Device::Cpu)?;
            for (act, want) in [
                (Activation::Silu, xs.silu()?),
                (Activation::Relu, xs.relu()?),
            ] {
                let (got, want) = (act.apply(&xs)?.to_vec1::<f32>()?, want.to_vec1::<f32>()?);
                if cfg!(miri) {
                    // Miri adds a few ulps of random error to every `exp` on purpose (a
                    // platform's libm may differ), so two evaluations of the same formula
                    // differ there by that much; natively they are bit-for-bit equal.
                    for (g, w) in got.iter().zip(&want) {
                        let tol = 8.0 * f32::EPSILON * w.abs().max(1.0);
                        assert!((g - w).abs() <= tol, "{act:?}, {len}: {g} vs {w}");
                    }
                } else {
                    assert_eq!(got, want, "{act:?}, {len}");
                }
                // A strided view is made contiguous first.
                let view = xs.reshape((len, 1))?.t()?;
                assert_eq!(act.apply(&view)?.dims(), &[1, len]);
            }
        }
        let var = Var::randn(0f32, 1.0, (3, 4), &Device::Cpu)?;
        assert!(super::map_cpu_f32(var.as_tensor(), |v| v)?.is_none());
        let half = Tensor::ones((2,), candle::DType::F16, &Device::Cpu)?;
        assert!(super::map_cpu_f32(&half, |v| v)?.is_none());
        assert_eq!(Activation::Silu.apply(&half)?.dtype(), candle::DType::F16);
        Ok(())
    }
}

//! Scaled dot-product attention, `softmax(Q Kᵀ · scale + mask) V` (Vaswani et al., eq. 1).
//!
//! [`scaled_dot_product_attention`] validates its inputs, resolves the [`Mask`] and hands the
//! work to a kernel. Every kernel gives the same answer up to floating-point round-off:
//!
//! * the CPU kernels (`src/sdpa/cpu/`): a memory-efficient tiled online-softmax kernel
//!   (FlashAttention-2 style, never the `(L, S)` matrix) and its split-over-keys variant for a
//!   few queries against a long key sequence (incremental decoding), with micro-kernels per
//!   instruction set;
//! * the blocked kernel (`blocked.rs`): the same online softmax written in candle tensor ops
//!   (query blocks × key blocks), for every device: memory linear in the sequence length, no
//!   host round trip;
//! * the naive kernel (`naive.rs`): materialises the `(B, H, L, S)` score matrix, returns the
//!   attention weights and supports autograd on every candle device;
//! * the CUDA paths (`src/sdpa/cuda/`, feature `flash-attn`): FlashAttention-2 from
//!   `candle-flash-attn` for CUDA `f16`/`bf16` tensors without weights, dropout or autograd,
//!   when the mask is none, causal aligned bottom-right (`offset = S − L`) or key padding it
//!   can pack into the variable-length layout; it runs first and declines everything else.
//!
//! The choice is automatic when the weights are not requested, dropout is 0 and no input (mask
//! included) tracks gradients: CPU tensors of dtype `f32`, `f16` or `bf16` take the CPU
//! kernels (the few-queries one for at most 4 queries), everything else (CUDA, Metal, `f64`)
//! the blocked one. Weights, training and autograd take the naive path. The kernels are not
//! public API (they are reachable for tests through the hidden `candle_attention::testing`).
//!
//! ## Fully masked rows
//! A query whose keys are all blocked (every score `-inf`) has no defined softmax. We define
//! its attention weights as zeros and so its output row as zeros (torch gives NaN on its
//! weights path and zeros on its fused path). Nothing here ever turns a mask into NaN, in the
//! forward pass or the backward one: such a row passes a zero gradient to the queries, keys,
//! values and mask (the naive path softmaxes a neutral row there and zeroes it afterwards,
//! instead of computing `-inf - (-inf)`).
//!
//! ## Grouped-query attention
//! Keys and values may have fewer heads `Hkv` than the queries `H` when `Hkv` divides `H`
//! (GQA; MQA for `Hkv = 1`): query head `h` uses key/value head `h / (H / Hkv)`. The naive path
//! groups the query heads of one key/value head into one matrix product; the CPU kernels
//! pick the key/value head per task. Neither copies K or V per query head.
//!
//! ## Precision
//! For `f16`/`bf16` inputs, scores, softmax statistics and the weighted sum are accumulated in
//! `f32` and the result is cast back to the input dtype. The naive path converts the inputs to
//! `f32`; the CPU kernels read them in place and convert per tile, and for bf16 on
//! CPUs with AVX-512 BF16 multiply bf16 pairs directly (`vdpbf16ps`), rounding the softmax
//! probabilities to bf16 before `P·V` (`src/sdpa/cpu/half.rs` says where every rounding happens).

pub(crate) mod blocked;
pub(crate) mod cpu;
pub(crate) mod cuda;
pub(crate) mod naive;
mod shapes;

use crate::mask::{AttentionShape, Mask};
use candle::{DType, Device, Tensor};
use shapes::check_qkv;

/// Options of [`scaled_dot_product_attention`]. `Default` is: no mask, scale
/// `1 / sqrt(head_dim)`, no weights, no dropout.
#[derive(Clone, Debug, Default)]
pub struct SdpaArgs {
    /// Which keys each query may attend to.
    pub mask: Mask,
    /// Multiplies `Q Kᵀ`; `None` means `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Return the attention weights `(B, H, L, S)`.
    pub need_weights: bool,
    /// Dropout probability applied to the attention weights (training only: pass 0 in eval).
    pub dropout: f32,
}

/// What attention returns.
#[derive(Clone, Debug)]
pub struct AttentionOutput {
    /// The attended values. For [`scaled_dot_product_attention`]: `(B, H, L, Dv)`.
    pub output: Tensor,
    /// The attention weights when requested. For [`scaled_dot_product_attention`]:
    /// `(B, H, L, S)`, each row summing to 1 (0 for a fully masked row).
    pub weights: Option<Tensor>,
}

/// Scaled dot-product attention on `(batch, heads, seq, head_dim)` tensors.
///
/// * `q`: `(B, H, L, D)`, `k`: `(B, Hkv, S, D)`, `v`: `(B, Hkv, S, Dv)`, all of one dtype
///   (`f32`, `f64`, `f16` or `bf16`) on one device.
/// * `Hkv` may be smaller than `H` when it divides it: grouped-query attention (multi-query
///   for `Hkv = 1`), as torch's `enable_gqa=True`. Query head `h` attends with key/value
///   head `h / (H / Hkv)`; the CPU kernels read that head in place (K and V are never
///   repeated per query head). Masks with a heads dimension refer to the `H` query heads.
/// * Returns `output` `(B, H, L, Dv)` in the input dtype and, if `args.need_weights`, the
///   weights `(B, H, L, S)`.
///
/// **Mask polarity.** A boolean [`Mask`] here means what it means in torch's
/// `nn.MultiheadAttention`: non-zero = *blocked*. torch's `F.scaled_dot_product_attention`
/// and Hugging Face `attention_mask`s use the opposite (true / 1 = *attend*). Say which one you
/// have: [`Mask::blocked`] or [`Mask::allowed`] for attention masks,
/// [`Mask::key_padding`] (1 = padding) or [`Mask::key_padding_from_attention_mask`]
/// (1 = token) for padding.
///
/// ```
/// use candle::{Device, Tensor};
/// use candle_attention::{scaled_dot_product_attention, Mask, SdpaArgs};
/// # fn main() -> candle::Result<()> {
/// let q = Tensor::randn(0f32, 1., (1, 2, 3, 8), &Device::Cpu)?;
/// let (k, v) = (q.clone(), q.clone());
/// // Ported from torch: F.scaled_dot_product_attention(q, k, v, attn_mask=keep), keep = True to attend.
/// let keep = Tensor::new(&[[1u8, 0, 0], [1, 1, 0], [1, 1, 1]], &Device::Cpu)?;
/// let args = SdpaArgs { mask: Mask::allowed(keep)?, ..Default::default() };
/// let out = scaled_dot_product_attention(&q, &k, &v, &args)?.output; // causal, written out
/// let causal = scaled_dot_product_attention(&q, &k, &v, &SdpaArgs { mask: Mask::causal(), ..Default::default() })?.output;
/// let diff = (out - causal)?.abs()?.max_all()?.to_scalar::<f32>()?;
/// assert!(diff < 1e-6);
/// # Ok(()) }
/// ```
///
/// Errors name the offending shapes when the inputs disagree, and the mask when it does not
/// fit `(B, H, L, S)`.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    args: &SdpaArgs,
) -> candle::Result<AttentionOutput> {
    let shape = check_qkv(q, k, v)?;
    if !(0.0..1.0).contains(&args.dropout) {
        candle::bail!(
            "dropout probability must be in [0, 1), got {}",
            args.dropout
        )
    }
    let scale = match args.scale {
        Some(s) if !s.is_finite() => candle::bail!("attention scale must be finite, got {s}"),
        Some(s) => s,
        None => default_scale(q.dim(3)?),
    };
    args.mask.validate(shape)?;
    // ---- flash-attn hook (feature `flash-attn`; src/sdpa/cuda/flash.rs) ----
    // CUDA f16/bf16 through candle-flash-attn. It returns None for whatever it cannot compute
    // exactly (other devices and dtypes, head sizes, masks), and the dispatch below goes on.
    #[cfg(feature = "flash-attn")]
    if !args.need_weights && args.dropout == 0.0 && ![q, k, v].iter().any(|t| t.track_op()) {
        if let Some(output) = cuda::flash::try_attention(q, k, v, &args.mask, shape, scale)? {
            return Ok(AttentionOutput {
                output,
                weights: None,
            });
        }
    }
    // ---- end of the flash-attn hook ----
    let fast = uses_memory_efficient_kernel(q.device(), q.dtype(), args.need_weights)
        && args.dropout == 0.0
        && ![q, k, v].iter().any(|t| t.track_op());
    if fast {
        let parts = args.mask.decompose(shape, q.device())?;
        if !parts_track(&parts) {
            let output = if !uses_cpu_kernels(q.device(), q.dtype()) {
                Some(blocked::attention(q, k, v, &parts, scale)?)
            } else if portable_prefers_naive(crate::simd::Isa::get(), shape, q.dtype()) {
                None
            } else {
                Some(cpu::attention(q, k, v, &parts, scale)?)
            };
            if let Some(output) = output {
                return Ok(AttentionOutput {
                    output,
                    weights: None,
                });
            }
        }
    }
    let bias = args.mask.to_bias(shape, q.device())?;
    let (output, weights) = naive::attention(
        q,
        k,
        v,
        bias.as_ref(),
        scale,
        args.dropout,
        args.need_weights,
    )?;
    Ok(AttentionOutput { output, weights })
}

/// [`scaled_dot_product_attention`] of `q` `(B, H, L, D)` over keys and values that a cache
/// holds in shared slots (`kv`, of shapes `kv_dims` = `(Hkv, S, D, Dv)`), in eval mode, without
/// weights, at the default scale: `(B, H, L, Dv)`, the floats that call gives on the same keys
/// and values as tensors. `None` where it would not take the CPU few-queries kernel (another
/// device or dtype, autograd, the portable level's naive path, more queries or keys than that
/// kernel takes in one piece): the caller then passes them as tensors.
pub(crate) fn attention_over_slots(
    q: &Tensor,
    kv: std::sync::Arc<dyn cpu::paged::GatherHeads>,
    kv_dims: (usize, usize, usize, usize),
    mask: &Mask,
) -> candle::Result<Option<Tensor>> {
    let (b, h, l, d) = q.dims4()?;
    if !uses_cpu_kernels(q.device(), q.dtype()) || q.dtype() != DType::F32 || q.track_op() {
        return Ok(None);
    }
    let shape = AttentionShape {
        batch: b,
        heads: h,
        q_len: l,
        k_len: kv_dims.1,
    };
    if portable_prefers_naive(crate::simd::Isa::get(), shape, q.dtype()) {
        return Ok(None);
    }
    let parts = mask.decompose(shape, q.device())?;
    if parts_track(&parts) {
        return Ok(None);
    }
    cpu::paged::attention(
        q,
        kv,
        kv_dims,
        &parts,
        default_scale(d),
        &Default::default(),
    )
}

/// The scale of the scores when none is given: `1 / sqrt(head_dim)` (1 for empty heads).
fn default_scale(head_dim: usize) -> f64 {
    if head_dim == 0 {
        1.0
    } else {
        1.0 / (head_dim as f64).sqrt()
    }
}

/// True when a mask's bias tensors track gradients (only the naive path keeps them).
fn parts_track(parts: &crate::mask::MaskParts) -> bool {
    [&parts.bias, &parts.key_bias]
        .iter()
        .any(|t| t.as_ref().is_some_and(|t| t.track_op()))
}

/// True when [`scaled_dot_product_attention`] runs inputs on `device` of `dtype` with a
/// memory-efficient kernel (extra memory linear in `L` and `S`) rather than the naive path,
/// which materialises the `(B, H, L, S)` scores: on every device and float dtype (the tiled
/// CPU kernels or the blocked one) unless the weights are requested. Also needed: no dropout and
/// no autograd. (On a CPU without AVX2, `f32` shapes of at most 4 Mi scores `B·H·L·S` take the
/// naive path, which is faster there; its extra memory is then bounded by 48 MiB.)
pub fn uses_memory_efficient_kernel(device: &Device, dtype: DType, need_weights: bool) -> bool {
    let _ = (device, dtype);
    !need_weights
}

/// Scores `B·H·L·S` up to which `f32` attention at the portable level (no AVX2) takes the
/// naive path: 4 Mi floats, whose three `(B, H, L, S)` buffers take 48 MiB at most.
const PORTABLE_NAIVE_MAX_SCORES: usize = 1 << 22;

/// True when `f32` CPU attention of `shape` at `isa` runs faster through candle's own ops (the naive
/// path) than through the tiled kernel: at the portable level (a CPU without AVX2, or
/// `ATTN_CPU_ISA=portable`) the tiled kernel's plain-Rust micro-kernels, vectorised for the
/// baseline (SSE2 / NEON), lose to candle's matmul (the `gemm` crate detects its own
/// instruction set) while the scores are small enough to stay in cache; past
/// [`PORTABLE_NAIVE_MAX_SCORES`] the naive path's memory traffic and page faults make the
/// tiled kernel faster, and its memory stays linear. (`bench/compare_torch.py --isa portable`
/// and `attn bench attention --impl naive,tiled,auto` measure the crossover.)
fn portable_prefers_naive(isa: crate::simd::Isa, shape: AttentionShape, dtype: DType) -> bool {
    dtype == DType::F32
        && isa == crate::simd::Isa::Portable
        && [shape.batch, shape.heads, shape.q_len, shape.k_len]
            .iter()
            .try_fold(1usize, |acc, &x| acc.checked_mul(x))
            .is_some_and(|n| n <= PORTABLE_NAIVE_MAX_SCORES)
}

/// True when inputs on `device` of `dtype` take the CPU kernels ([`cpu`]) rather than
/// the blocked kernel on the memory-efficient path.
fn uses_cpu_kernels(device: &Device, dtype: DType) -> bool {
    matches!(device, Device::Cpu) && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Bytes the naive path allocates at its peak for `shape`: the `f32` scores, their
/// probabilities and the masked/biased copy, `3 × 4 × B·H·L·S` (saturating).
pub fn naive_attention_bytes(shape: AttentionShape) -> u64 {
    [shape.batch, shape.heads, shape.q_len, shape.k_len, 12]
        .iter()
        .fold(1u64, |acc, &x| acc.saturating_mul(x as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Isa;

    fn shape(b: usize, h: usize, l: usize, s: usize) -> AttentionShape {
        AttentionShape {
            batch: b,
            heads: h,
            q_len: l,
            k_len: s,
        }
    }

    #[test]
    fn only_small_f32_shapes_at_the_portable_level_take_the_naive_path() {
        let small = shape(1, 8, 512, 512);
        assert!(portable_prefers_naive(Isa::Portable, small, DType::F32));
        // Past 4 Mi scores (N = 1024 at 8 heads), and for half inputs, the tiled kernel.
        assert!(!portable_prefers_naive(
            Isa::Portable,
            shape(1, 8, 1024, 1024),
            DType::F32
        ));
        assert!(!portable_prefers_naive(Isa::Portable, small, DType::BF16));
        // Overflowing sizes are large, not small.
        let huge = shape(usize::MAX, 2, 2, 2);
        assert!(!portable_prefers_naive(Isa::Portable, huge, DType::F32));
        #[cfg(target_arch = "x86_64")]
        assert!(!portable_prefers_naive(Isa::Avx2, small, DType::F32));
    }
}

//! The kernels behind [`crate::scaled_dot_product_attention`], reachable for this repository's
//! property tests, benchmarks and fuzzers: **not API**. Hidden from the documentation and
//! outside any semver promise; every item may change or go in any release. Use
//! [`crate::scaled_dot_product_attention`] and the layers built on it instead.
//!
//! The paths mirror the kernels: `sdpa::tiled` (the CPU tiled kernel and its knobs),
//! `sdpa::few_queries` (the CPU split-over-keys kernel), `sdpa::blocked` (device-generic),
//! `sdpa::naive` (the reference with weights and autograd); [`decompose`] splits a [`Mask`]
//! into the [`MaskParts`] the fused kernels take.
//!
//! **Instruction sets.** [`available_isas`] lists the levels the kernels can run at in this
//! process (every level up to the CPU's best, lowered by `ATTN_CPU_ISA`); tests run each kernel
//! at each of them through the per-call knobs: `TiledConfig::isa` for the attention kernels,
//! [`projection::forward`] for a [`crate::projection::Projection`], [`rows`] for the generation loops' row
//! scans (the activations and layer norm are tested at every level by their unit tests).

use crate::mask::{AttentionShape, Mask};
use candle::{Device, Tensor};
use std::collections::HashMap;

pub use crate::mask::MaskParts;
// The instruction-set levels come from the public `cpu` module (one definition); the
// property tests loop over `available_isas()`: every level up to the CPU's best, capped by
// `ATTN_CPU_ISA`.
pub use crate::cpu::{available_levels as available_isas, IsaLevel, ISA_ENV};

/// The tensors of `varmap` as plain tensors (detached: no gradient tracked), by name, to load
/// a layer as inference code gets it (`VarBuilder::from_tensors`): fresh weights made under a
/// `VarMap` are variables, and a layer built on variables tracks gradients through every call.
pub fn detached_weights(varmap: &candle_nn::VarMap) -> HashMap<String, Tensor> {
    varmap
        .data()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .map(|(name, var)| (name.clone(), var.as_tensor().detach()))
        .collect()
}

/// A [`crate::mha::MultiHeadAttention`] of `cfg` with fresh random weights in `dtype` on `device`,
/// loaded from [`detached_weights`] as inference code gets it (its projections track no
/// gradient, so the inference kernels and caches run as in a real decode).
pub fn inference_attention(
    cfg: crate::mha::MultiHeadAttentionConfig,
    dtype: candle::DType,
    device: &Device,
) -> candle::Result<crate::mha::MultiHeadAttention> {
    use candle_nn::{VarBuilder, VarMap};
    let varmap = VarMap::new();
    crate::mha::MultiHeadAttention::new(
        cfg.clone(),
        VarBuilder::from_varmap(&varmap, dtype, device),
    )?;
    let weights = detached_weights(&varmap);
    crate::mha::MultiHeadAttention::load(cfg, VarBuilder::from_tensors(weights, dtype, device))
}

/// [`crate::projection::Projection`] at a chosen instruction set.
pub mod projection {
    use super::*;

    /// `p.forward(x)` with the CPU kernels of at most `isa`.
    pub fn forward(
        p: &crate::projection::Projection,
        x: &Tensor,
        isa: IsaLevel,
    ) -> candle::Result<Tensor> {
        p.forward_at(x, crate::simd::Isa::at_most(Some(isa)))
    }
}

/// The generation loops' passes over a row of scores, at a chosen instruction set.
pub mod rows {
    use super::IsaLevel;
    use crate::simd::{rows, Isa};

    /// `log_softmax` in place (as torch's, `f32`).
    pub fn log_softmax_in_place(isa: IsaLevel, row: &mut [f32]) {
        rows::log_softmax_with(Isa::at_most(Some(isa)), row)
    }

    /// `torch.argmax` (first maximum, NaN first).
    pub fn argmax(isa: IsaLevel, row: &[f32]) -> usize {
        rows::argmax_with(Isa::at_most(Some(isa)), row)
    }

    /// The first index from `from` whose value is above `threshold` or NaN.
    pub fn next_above(isa: IsaLevel, row: &[f32], from: usize, threshold: f32) -> Option<usize> {
        rows::next_above_with(Isa::at_most(Some(isa)), row, from, threshold)
    }
}

/// `mask` split into its causal offset, per-key bias and general bias for `shape`, on `device`
/// (validated against `shape`).
pub fn decompose(mask: &Mask, shape: AttentionShape, device: &Device) -> candle::Result<MaskParts> {
    mask.decompose(shape, device)
}

/// The attention kernels, one module each.
pub mod sdpa {
    /// The CPU tiled kernel (`src/sdpa/cpu/tiled.rs`).
    pub mod tiled {
        use crate::testing::MaskParts;
        use candle::Tensor;

        pub use crate::sdpa::cpu::tile::{TiledConfig, BQ};
        pub use crate::sdpa::cpu::tiled::attention_with;

        /// [`attention_with`] with the default [`TiledConfig`]: `q` `(B, H, L, D)`, `k`
        /// `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` → `(B, H, L, Dv)`.
        pub fn attention(
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            mask: &MaskParts,
            scale: f64,
        ) -> candle::Result<Tensor> {
            attention_with(q, k, v, mask, scale, &TiledConfig::default())
        }
    }

    /// The CPU few-queries (split-over-keys) kernel (`src/sdpa/cpu/few_queries.rs`).
    pub mod few_queries {
        use crate::testing::MaskParts;
        use candle::Tensor;

        pub use crate::sdpa::cpu::few_queries::{attention_with, MAX_QUERIES};
        pub use crate::sdpa::cpu::tile::TiledConfig;

        /// [`attention_with`] with the default [`TiledConfig`].
        pub fn attention(
            q: &Tensor,
            k: &Tensor,
            v: &Tensor,
            mask: &MaskParts,
            scale: f64,
        ) -> candle::Result<Tensor> {
            attention_with(q, k, v, mask, scale, &TiledConfig::default())
        }
    }

    /// The device-generic blocked kernel (`src/sdpa/blocked.rs`).
    pub mod blocked {
        pub use crate::sdpa::blocked::{attention, attention_with, BlockedConfig};
    }

    /// The naive reference kernel (`src/sdpa/naive.rs`): weights and autograd.
    pub mod naive {
        pub use crate::sdpa::naive::attention;
    }

    /// FlashAttention-2 on CUDA (`src/sdpa/cuda/flash.rs`).
    #[cfg(feature = "flash-attn")]
    pub mod flash {
        pub use crate::sdpa::cuda::flash::{attention, try_attention, unsupported_reason};
    }
}

//! Attention on CPU tensors: a memory-efficient tiled kernel with an online softmax
//! (FlashAttention-2 style), `O(block)` scratch per thread instead of the `(L, S)` matrix, and
//! its split-over-keys variant for a few queries against long keys ([`few_queries`]).
//!
//! Where things are: [`prepare`] validates the inputs and borrows their storage; [`tiled`]
//! schedules the tasks and walks the key blocks of one task; [`kernels`] picks the micro-kernel
//! of the instruction set (the `portable`, `avx2`, `avx512` and `avx512_half` modules, and
//! [`half`] for the f16/bf16 conversions and the bf16 dot-product kernels); [`tile`] holds the
//! tile sizes they share.
//!
//! The tiled kernel splits the work into tasks of one `(batch, head)` and up to four blocks of [`BQ`] = 64
//! queries, run in parallel with rayon. A task transposes each query block once, `qt`
//! `(D, BQ)`, then walks the keys in blocks of `block_k` (64 at AVX2, 128 otherwise); every
//! key/value block is used by all the task's query blocks while it is in cache:
//!
//! 1. scores `Sᵀ = K_blk · Qᵀ` `(block_k, BQ)`, times `scale · log2(e)`: a register-blocked
//!    micro-kernel (6 keys × 64 queries, 24 accumulators on AVX-512) that reads the keys in
//!    place, so neither `K` nor `V` is ever copied or packed;
//! 2. masks applied inside the tile: key padding as a per-key bias row, general biases
//!    element by element, causal only on the diagonal blocks (blocks wholly above the diagonal
//!    are never visited, blocks wholly below need nothing); key blocks that are entirely
//!    padding are skipped, and so is everything after a batch row's last real key;
//! 3. the online-softmax update, vectorised across 16 queries (max, `exp2`, sum), in the log2
//!    domain;
//! 4. `O = alpha · O + P · V_blk` with a register-blocked micro-kernel (6 queries × 64 values).
//!
//! Scratch (`qt`, the score tile, row statistics) lives in a per-thread buffer reused across
//! tiles, tasks and calls; the output accumulator is the output block itself. The output is
//! laid out `(B, L, H, Dv)` and returned as its `(B, H, L, Dv)` transposed view: multi-head
//! attention reads it as the concatenated heads `(B, L, H · Dv)` without a copy. Extra memory is
//! therefore the output plus `threads × (4 · (D + 3) + block_k) · 64` floats, and for half
//! inputs the key/value tiles per thread (`max(block_k, 64) · (D + Dv)` floats converted, or
//! `block_k / 2 · Dv` packed bf16 pairs) and the `f32` output before its final rounding; bf16
//! on the `vdpbf16ps` path packs the values of each head once instead when more than one task
//! walks its keys (one more copy of `V`, as many bytes).
//!
//! Instruction sets are chosen at run time: AVX-512F micro-kernels (the private `avx512` module) when
//! `is_x86_feature_detected!` finds AVX-512F (with AVX2 and FMA), otherwise portable Rust
//! kernels, compiled a second time with AVX2+FMA enabled for CPUs that have them. No
//! `target-cpu` flag is needed.
//!
//! `f16`/`bf16` inputs are read in place and converted per tile, never as a whole tensor
//! ([`half`]): bf16 on a CPU with AVX-512 BF16 runs both products
//! with `vdpbf16ps` (bf16 pairs, `f32` accumulation, probabilities rounded to bf16 for
//! `P·V`); f16, and bf16 elsewhere, convert each key/value block and query block to `f32` as
//! a task loads it. The softmax statistics and the output accumulator are always `f32`; the
//! output is rounded to the input dtype at the end.
//!
//! Fully masked query rows give zeros, as in [`super::naive`]. Inputs may be strided views
//! (e.g. the `(B, L, H, D) → (B, H, L, D)` transpose of a projection) as long as the head
//! dimension is contiguous; otherwise they are made contiguous first.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_half;
pub(crate) mod few_queries;
mod half;
mod kernels;
pub(crate) mod paged;
mod portable;
mod prepare;
pub(crate) mod tile;
pub(crate) mod tiled;

#[cfg(test)]
mod tests;

use crate::mask::MaskParts;
use candle::Tensor;

pub(crate) use tile::TiledConfig;

/// Attention of `q` `(B, H, L, D)` over `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` (CPU
/// tensors of one dtype, `f32`, `f16` or `bf16`) under `mask` (from
/// `Mask::decompose`), scores scaled by `scale`: the few-queries kernel for at most
/// [`few_queries::MAX_QUERIES`] queries, the tiled one otherwise. Returns `(B, H, L, Dv)`.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
) -> candle::Result<Tensor> {
    let cfg = TiledConfig::default();
    if q.rank() == 4 && q.dim(2)? <= few_queries::MAX_QUERIES {
        few_queries::attention_with(q, k, v, mask, scale, &cfg)
    } else {
        tiled::attention_with(q, k, v, mask, scale, &cfg)
    }
}

//! Attention over keys and values that a cache holds position by position in shared slots
//! (the beams of a beam search share the positions of their common history; see
//! `crate::kv_cache`), for the few-queries shape of a decoding step.
//!
//! Each task (one batch row and head) runs the micro-kernels of [`super::tiled`] over its
//! head's `S` keys and values in position order, exactly as it would over a contiguous cache:
//! the same key blocks, the same arithmetic, the same floats. At the AVX-512 level, when every
//! query block takes the row-wise score kernel (decoding), the kernels read each position's
//! keys and values where its slot lies, through a table of their addresses
//! ([`GatherHeads::head_rows`], which also asks for every slot's lines at once). Elsewhere the
//! task first copies them into contiguous rows in its scratch ([`GatherHeads::gather_head`]:
//! `S · (D + Dv)` floats, 32 KiB for 64 positions of 64-wide heads). Reading in place saved
//! 1.7% of a serving step's time (the copies were 7.1% of a 32-client load's samples;
//! `continuous_load` with the two paths on alternate steps, six pairs of runs, 0.978–0.993×,
//! AMD EPYC Zen 4 at the AVX-512 level, 2 threads, 2026-12-07): most of a copy's time was the
//! wait for the slots' lines, which the kernels now wait for instead. The rows of one
//! sentence's beams are neighbours, so the positions they share are read from the cache after
//! the first beam.

use super::few_queries::{key_chunks, MAX_QUERIES};
use super::half::Kind;
pub(crate) use super::prepare::GatherHeads;
use super::prepare::Prepared;
use super::tile::{TiledConfig, BQ};
use crate::mask::MaskParts;
use crate::simd::Isa;
use candle::Tensor;
use std::sync::Arc;

/// Attention of `q` `(B, H, L, D)` (`f32`, CPU) over the keys and values in `kv`, whose
/// shapes `kv_dims` are `(Hkv, S, D, Dv)` (`Hkv` dividing `H`, `D` that of `q`), under `mask` (from
/// `Mask::decompose`), scores scaled by `scale`: `(B, H, L, Dv)`, the floats
/// [`super::attention`] gives on the same keys and values as tensors. `None` where that call
/// would take another kernel than the few-queries one with one key chunk per (batch, head)
/// (more than [`MAX_QUERIES`] queries, or keys long enough to be split): the caller then
/// gathers the keys and values into tensors and calls it. `cfg` as for
/// [`super::few_queries::attention_with`] (the default for that call).
pub(crate) fn attention(
    q: &Tensor,
    kv: Arc<dyn GatherHeads>,
    (hkv, s, d, dv): (usize, usize, usize, usize),
    mask: &MaskParts,
    scale: f64,
    cfg: &TiledConfig,
) -> candle::Result<Option<Tensor>> {
    let (b, h, l, qd) = q.dims4()?;
    if qd != d {
        candle::bail!("paged attention: queries of {qd} features against keys of {d}")
    }
    if l > MAX_QUERIES || key_chunks(b * h, s).1 != 1 {
        return Ok(None);
    }
    if cfg.block_k == Some(0) {
        candle::bail!("paged attention: block_k must be at least 1")
    }
    let prep = Prepared::paged(q, kv, (hkv, s, dv), mask, scale)?;
    let isa = Isa::at_most(cfg.isa);
    let bk = cfg.block_k_at(isa);
    let g = l.div_ceil(BQ);
    prep.run(isa, Kind::F32, |inp, out| {
        super::tiled::run_tiled(isa, inp, out, bk, g, false)
    })
    .map(Some)
}

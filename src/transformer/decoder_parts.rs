//! One cached decoding step of several independent batches ("parts") at once: what continuous
//! batching runs when texts that started decoding at different steps share the machine.
//!
//! Each part keeps its own caches, encoder memory and length (its rows sit at their own
//! position), so the parts cannot be one batch for attention. Everything else in a decoder
//! layer works row by row: the projections, the feed-forward network, the norms and the
//! residual additions. Those run once over the rows of every part, stacked (one pass over
//! each weight matrix per step, not one per part), and only the attention itself runs part by
//! part, each over its own caches. Each row's result is what a step of its part alone gives:
//! the row kernels compute every output row on its own (see `crate::projection::rows`).

use super::decoder::{DecoderCache, TransformerDecoder, TransformerDecoderLayer};
use crate::mha::AttentionArgs;
use crate::simd::elementwise::add;
use candle::{Module, Tensor};
use rayon::prelude::*;

/// One batch of a step over several: its rows' encoder memory and decoder caches.
pub(crate) struct DecoderPart<'a> {
    /// Rows of this part in the stacked input, one after the other in part order.
    pub rows: usize,
    /// `(M, S, d_model)`: `M` divides `rows`; row `r` reads memory row `r / (rows / M)` (the
    /// beams of one sentence share it, as in [`TransformerDecoder::forward_cached`]).
    pub memory: &'a Tensor,
    /// `(M, S)` `U8`, 1 = source padding.
    pub memory_padding: &'a Tensor,
    pub cache: &'a mut DecoderCache,
}

impl TransformerDecoder {
    /// One decoding step of every part at once: `tgt` `(R, T, d_model)` holds the new tokens
    /// of the parts' rows, part after part (`R` = the sum of their rows); returns
    /// `(R, T, d_model)`, each part's rows equal to [`TransformerDecoder::forward_cached`] on
    /// that part alone (causal from each part's own cached length, no other mask).
    pub(crate) fn forward_cached_parts(
        &self,
        tgt: &Tensor,
        parts: &mut [DecoderPart<'_>],
    ) -> candle::Result<Tensor> {
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        if tgt.rank() != 3 || tgt.dim(0)? != rows {
            candle::bail!(
                "a step of {} parts holding {rows} rows got input {:?}",
                parts.len(),
                tgt.dims()
            )
        }
        for part in parts.iter_mut() {
            let m = part.memory.dim(0)?;
            if m == 0 || !part.rows.is_multiple_of(m) {
                candle::bail!(
                    "a part of {} rows cannot share {m} memory rows in equal groups",
                    part.rows
                )
            }
            part.cache.ensure_layers(self.layers.len())?;
        }
        let mut x = tgt.clone();
        for (index, layer) in self.layers.iter().enumerate() {
            x = layer.forward_parts(&x, parts, index)?;
        }
        self.final_norm(x)
    }
}

impl TransformerDecoderLayer {
    /// [`TransformerDecoder::forward_cached_parts`] for layer `index` (eval mode).
    fn forward_parts(
        &self,
        x: &Tensor,
        parts: &mut [DecoderPart<'_>],
        index: usize,
    ) -> candle::Result<Tensor> {
        let x = if self.norm_first {
            add(
                x,
                &self.self_attention_parts(&self.norm1.forward(x)?, parts, index)?,
            )?
        } else {
            self.norm1
                .forward(&add(x, &self.self_attention_parts(x, parts, index)?)?)?
        };
        let x = if self.norm_first {
            add(
                &x,
                &self.cross_attention_parts(&self.norm2.forward(&x)?, parts, index)?,
            )?
        } else {
            self.norm2
                .forward(&add(&x, &self.cross_attention_parts(&x, parts, index)?)?)?
        };
        if self.norm_first {
            add(
                &x,
                &self.feed_forward.forward(&self.norm3.forward(&x)?, false)?,
            )
        } else {
            self.norm3
                .forward(&add(&x, &self.feed_forward.forward(&x, false)?)?)
        }
    }

    /// Masked self-attention: the projections over all rows, attention part by part over
    /// each part's cache (appending the new keys and values). `(R, T, E)` → `(R, T, E)`.
    fn self_attention_parts(
        &self,
        x: &Tensor,
        parts: &mut [DecoderPart<'_>],
        index: usize,
    ) -> candle::Result<Tensor> {
        let (q, k, v) = self.self_attn.project_self(x)?;
        let heads = each_part(parts, |part, start| {
            let rows = |t: &Tensor| t.narrow(0, start, part.rows);
            self.self_attn.attend_cached_heads(
                &rows(&q)?,
                &rows(&k)?,
                &rows(&v)?,
                &mut part.cache.layers[index].self_attn,
                None,
            )
        })?;
        self.self_attn.project_output(&Tensor::cat(&heads, 0)?)
    }

    /// Encoder-decoder attention: the query and output projections over all rows, attention
    /// part by part over each part's projected memory (projected at its first step); the rows
    /// of a part that share a memory row attend it together. `(R, T, E)` → `(R, T, E)`.
    fn cross_attention_parts(
        &self,
        x: &Tensor,
        parts: &mut [DecoderPart<'_>],
        index: usize,
    ) -> candle::Result<Tensor> {
        let (_, t, e) = x.dims3()?;
        let attn = &self.multihead_attn;
        let q = attn.project_query_rows(x)?;
        let heads = each_part(parts, |part, start| {
            let n = part.rows;
            let m = part.memory.dim(0)?;
            let cache = &mut part.cache.layers[index].cross_attn;
            let (k, v) = attn.cross_keys_values(part.memory, cache)?;
            // The `n / m` rows of a memory row attend it as one sequence of their queries.
            let q =
                attn.split_query_heads(&q.narrow(0, start, n)?.reshape((m, n / m * t, e))?)?;
            let args = AttentionArgs {
                key_padding: Some(part.memory_padding),
                ..Default::default()
            };
            attn.attend_heads(&q, &k, &v, &args)?
                .output
                .reshape((n, t, e))
        })?;
        attn.project_output(&Tensor::cat(&heads, 0)?)
    }
}

/// `f(part, start)` for every part, `start` its first row in the stacked input: the parts'
/// results in part order. On the CPU the parts run side by side on the thread pool (each call
/// also splits its own work across it): one pool-wide join for all of them rather than one
/// per part, so that a thread done with a small part takes up another part instead of waiting
/// at that part's join (with 4 cohorts, a 32-client serving load ran ~5% faster;
/// `examples/continuous_load`, AMD EPYC Zen 4, 2 threads). Elsewhere one part after the
/// other: a GPU's kernels queue on one stream.
fn each_part<F>(parts: &mut [DecoderPart<'_>], f: F) -> candle::Result<Vec<Tensor>>
where
    F: Fn(&mut DecoderPart<'_>, usize) -> candle::Result<Tensor> + Sync,
{
    let on_cpu = parts.iter().all(|p| p.memory.device().is_cpu());
    let mut start = 0;
    let mut work: Vec<(&mut DecoderPart<'_>, usize)> = Vec::with_capacity(parts.len());
    for part in parts.iter_mut() {
        let first = start;
        start += part.rows;
        work.push((part, first));
    }
    if on_cpu {
        work.into_par_iter()
            .map(|(part, start)| f(part, start))
            .collect()
    } else {
        work.into_iter()
            .map(|(part, start)| f(part, start))
            .collect()
    }
}

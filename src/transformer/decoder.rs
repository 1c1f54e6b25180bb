//! The decoder: masked self-attention, encoder-decoder attention and feed-forward layers (paper
//! section 3.1), exactly `torch.nn.TransformerDecoderLayer` / `TransformerDecoder`, plus
//! incremental decoding through a [`DecoderCache`].

use super::config::TransformerConfig;
use super::feed_forward::{dropout, FeedForward};
use super::norm::LayerNorm;
use crate::kv_cache::KvCache;
use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use candle::{Module, Tensor};
use candle_nn::VarBuilder;

/// Masks of a decoder pass.
#[derive(Clone, Debug, Default)]
pub struct DecoderMasks<'a> {
    /// Self-attention mask over the target, `(T, T')` or `(B * nhead, T, T')` (torch's
    /// `tgt_mask`; usually [`Mask::causal`]). With a cache, `T'` counts cached positions too.
    pub tgt_mask: Mask,
    /// Encoder-decoder attention mask `(T, S)` or `(B * nhead, T, S)` (torch's `memory_mask`).
    pub memory_mask: Mask,
    /// `(B, T')`, true = padding (torch's `tgt_key_padding_mask`; with a cache it covers the
    /// cached positions and the new ones).
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    /// `(B, S)`, true = padding (torch's `memory_key_padding_mask`).
    pub memory_key_padding_mask: Option<&'a Tensor>,
}

/// What one decoder layer keeps between steps: its self-attention keys/values and the projected
/// encoder memory (computed once per sequence).
#[derive(Clone, Debug, Default)]
pub struct DecoderLayerCache {
    self_attn: KvCache,
    memory_kv: Option<(Tensor, Tensor)>,
}

/// The state of incremental decoding for a whole decoder: one [`DecoderLayerCache`] per layer.
#[derive(Clone, Debug, Default)]
pub struct DecoderCache {
    layers: Vec<DecoderLayerCache>,
}

impl DecoderCache {
    /// Number of target positions already decoded.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.self_attn.len())
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps batch rows `rows` (`U32`, e.g. surviving beams), in that order.
    pub fn select_rows(&mut self, rows: &Tensor) -> candle::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.select_rows(rows)?;
            if let Some((k, v)) = &layer.memory_kv {
                layer.memory_kv = Some((
                    k.contiguous()?.index_select(rows, 0)?,
                    v.contiguous()?.index_select(rows, 0)?,
                ));
            }
        }
        Ok(())
    }
}

/// One decoder layer. Tensor names: `self_attn.*`, `multihead_attn.*`, `linear1.*`,
/// `linear2.*`, `norm1.*`, `norm2.*`, `norm3.*`.
#[derive(Clone, Debug)]
pub struct TransformerDecoderLayer {
    self_attn: MultiHeadAttention,
    multihead_attn: MultiHeadAttention,
    feed_forward: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm3: LayerNorm,
    norm_first: bool,
    dropout: f32,
}

impl TransformerDecoderLayer {
    pub(crate) fn build(
        cfg: &TransformerConfig,
        vb: VarBuilder,
        fresh: bool,
    ) -> candle::Result<Self> {
        let attn = if fresh {
            MultiHeadAttention::new
        } else {
            MultiHeadAttention::load
        };
        let norm =
            |name: &str| LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp(name));
        Ok(Self {
            self_attn: attn(cfg.attention(), vb.pp("self_attn"))?,
            multihead_attn: attn(cfg.attention(), vb.pp("multihead_attn"))?,
            feed_forward: FeedForward::new(cfg, &vb)?,
            norm1: norm("norm1")?,
            norm2: norm("norm2")?,
            norm3: norm("norm3")?,
            norm_first: cfg.norm_first,
            dropout: cfg.dropout,
        })
    }

    /// `tgt` `(B, T, d_model)` attending to itself (and, with `cache`, to the cached positions
    /// before it) and to `memory` `(B, S, d_model)` → `(B, T, d_model)`.
    pub fn forward(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        train: bool,
        cache: Option<&mut DecoderLayerCache>,
    ) -> candle::Result<Tensor> {
        Ok(self
            .forward_inner(tgt, memory, masks, train, cache, false)?
            .0)
    }

    /// [`TransformerDecoderLayer::forward`], also returning the encoder-decoder attention
    /// weights per head `(B, H, T, S)` when `cross_weights`.
    fn forward_inner(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        train: bool,
        mut cache: Option<&mut DecoderLayerCache>,
        cross_weights: bool,
    ) -> candle::Result<(Tensor, Option<Tensor>)> {
        let mut weights = None;
        let mut self_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let q = self.self_attn.project_query(x)?;
            let (mut k, mut v) = self.self_attn.project_key_value(x, x)?;
            if let Some(cache) = cache.as_deref_mut() {
                (k, v) = cache.self_attn.append(&k, &v)?;
            }
            let args = AttentionArgs {
                mask: masks.tgt_mask.clone(),
                key_padding: masks.tgt_key_padding_mask,
                train,
                ..Default::default()
            };
            let out = self.self_attn.attend_projected(&q, &k, &v, &args)?.output;
            dropout(&out, self.dropout, train)
        };
        let x = if self.norm_first {
            (tgt + self_attention(&self.norm1.forward(tgt)?)?)?
        } else {
            self.norm1.forward(&(tgt + self_attention(tgt)?)?)?
        };
        let mut cross_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let q = self.multihead_attn.project_query(x)?;
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => match &cache.memory_kv {
                    Some(kv) => kv.clone(),
                    None => {
                        let kv = self.multihead_attn.project_key_value(memory, memory)?;
                        cache.memory_kv = Some(kv.clone());
                        kv
                    }
                },
                None => self.multihead_attn.project_key_value(memory, memory)?,
            };
            let args = AttentionArgs {
                mask: masks.memory_mask.clone(),
                key_padding: masks.memory_key_padding_mask,
                train,
                need_weights: cross_weights,
                average_weights: false,
            };
            let out = self.multihead_attn.attend_projected(&q, &k, &v, &args)?;
            weights = out.weights;
            dropout(&out.output, self.dropout, train)
        };
        let x = if self.norm_first {
            (&x + cross_attention(&self.norm2.forward(&x)?)?)?
        } else {
            self.norm2.forward(&(&x + cross_attention(&x)?)?)?
        };
        let feed_forward =
            |x: &Tensor| dropout(&self.feed_forward.forward(x, train)?, self.dropout, train);
        let out = if self.norm_first {
            (&x + feed_forward(&self.norm3.forward(&x)?)?)?
        } else {
            self.norm3.forward(&(&x + feed_forward(&x)?)?)?
        };
        Ok((out, weights))
    }
}

/// The decoder stack with its final LayerNorm. Tensor names: `layers.{i}.*`, `norm.*`.
#[derive(Clone, Debug)]
pub struct TransformerDecoder {
    layers: Vec<TransformerDecoderLayer>,
    norm: LayerNorm,
}

impl TransformerDecoder {
    pub(crate) fn build(
        cfg: &TransformerConfig,
        vb: VarBuilder,
        fresh: bool,
    ) -> candle::Result<Self> {
        let layers = (0..cfg.num_decoder_layers)
            .map(|i| TransformerDecoderLayer::build(cfg, vb.pp(format!("layers.{i}")), fresh))
            .collect::<candle::Result<_>>()?;
        let norm = LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp("norm"))?;
        Ok(Self { layers, norm })
    }

    /// Full pass: `tgt` `(B, T, d_model)`, `memory` `(B, S, d_model)` → `(B, T, d_model)`.
    pub fn forward(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        let mut x = tgt.clone();
        for layer in &self.layers {
            x = layer.forward(&x, memory, masks, train, None)?;
        }
        self.norm.forward(&x)
    }

    /// The encoder-decoder attention weights of every layer, per head: one `(B, H, T, S)`
    /// tensor per layer, from a full (eval) pass over `tgt` `(B, T, d_model)`. Row `t` says where
    /// target position `t` looked in the source; this is what attention heatmaps draw.
    pub fn cross_attention_weights(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
    ) -> candle::Result<Vec<Tensor>> {
        let mut x = tgt.clone();
        let mut all = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (out, weights) = layer.forward_inner(&x, memory, masks, false, None, true)?;
            all.push(
                weights
                    .ok_or_else(|| candle::Error::Msg("cross-attention weights missing".into()))?,
            );
            x = out;
        }
        Ok(all)
    }

    /// Incremental pass: the new target positions `tgt` `(B, T, d_model)` after the `cache.len()`
    /// cached ones. `masks.tgt_mask` must cover `(T, cache.len() + T)`; use
    /// `Mask::causal_with_offset(cache.len())` for ordinary decoding. Appends to `cache` and
    /// returns `(B, T, d_model)`, equal to the matching rows of a full pass.
    pub fn forward_cached(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        cache: &mut DecoderCache,
    ) -> candle::Result<Tensor> {
        if cache.layers.is_empty() {
            cache.layers = vec![DecoderLayerCache::default(); self.layers.len()];
        }
        if cache.layers.len() != self.layers.len() {
            candle::bail!(
                "decoder cache has {} layers, the decoder {}",
                cache.layers.len(),
                self.layers.len()
            )
        }
        let mut x = tgt.clone();
        for (layer, layer_cache) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward(&x, memory, masks, false, Some(layer_cache))?;
        }
        self.norm.forward(&x)
    }
}

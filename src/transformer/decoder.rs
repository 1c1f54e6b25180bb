//! The decoder: masked self-attention, encoder-decoder attention and feed-forward layers (paper
//! section 3.1), exactly `torch.nn.TransformerDecoderLayer` / `TransformerDecoder`, plus
//! incremental decoding through a [`DecoderCache`].

use super::config::TransformerConfig;
use super::feed_forward::{dropout, FeedForward};
use super::norm::LayerNorm;
use super::trace::{AttentionTrace, DecoderLayerTrace};
use crate::kv_cache::{CachedAttentionArgs, CrossAttentionCache, KvCache};
use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use crate::sdpa::AttentionOutput;
use crate::simd::elementwise::add;
use crate::weights::WeightSource;
use candle::{Module, Tensor};
use candle_nn::VarBuilder;

/// Masks of a decoder pass.
#[derive(Clone, Debug, Default)]
pub struct DecoderMasks<'a> {
    /// Self-attention mask over the target, `(T, T)` or `(B * nhead, T, T)` (torch's
    /// `tgt_mask`; usually [`Mask::causal`]). In a cached pass the causal mask comes from the
    /// cache and this holds only further constraints over `(T, cached + T)`.
    pub tgt_mask: Mask,
    /// Encoder-decoder attention mask `(T, S)` or `(B * nhead, T, S)` (torch's `memory_mask`).
    pub memory_mask: Mask,
    /// `(B, T')`, true = padding (torch's `tgt_key_padding_mask`; with a cache it covers the
    /// cached positions and the new ones).
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    /// `(B, S)`, true = padding (torch's `memory_key_padding_mask`).
    pub memory_key_padding_mask: Option<&'a Tensor>,
}

/// Where a traced decoder layer records its self-attention and encoder-decoder attention.
type LayerTraceSlots = (Option<AttentionTrace>, Option<AttentionTrace>);

/// What one decoder layer keeps between steps: its self-attention keys/values and the projected
/// encoder memory (computed once per sequence).
#[derive(Clone, Debug, Default)]
pub struct DecoderLayerCache {
    pub(super) self_attn: KvCache,
    pub(super) cross_attn: CrossAttentionCache,
}

/// The state of incremental decoding for a whole decoder: one cache per layer. Clones are
/// independent (forking a decode).
#[derive(Clone, Debug, Default)]
pub struct DecoderCache {
    pub(super) layers: Vec<DecoderLayerCache>,
    /// Positions each self-attention cache reserves (see [`DecoderCache::reserve`]).
    reserved: usize,
}

impl DecoderCache {
    /// One layer cache per decoder layer, made on first use; an error when the cache was
    /// built for a decoder of another depth.
    pub(super) fn ensure_layers(&mut self, layers: usize) -> candle::Result<()> {
        if self.layers.is_empty() {
            let mut fresh = DecoderLayerCache::default();
            fresh.self_attn.reserve(self.reserved);
            self.layers = vec![fresh; layers];
        }
        if self.layers.len() != layers {
            candle::bail!(
                "this decoder cache holds {} layers but the decoder has {layers}: a cache \
                 serves the decoder (and model) it was first used with",
                self.layers.len()
            )
        }
        Ok(())
    }

    /// Asks every layer's self-attention cache to make room for `positions` target positions
    /// at once when it is next allocated ([`KvCache::reserve`]): for a decode of known
    /// maximum length, one allocation per buffer instead of a doubling every time it is full.
    pub fn reserve(&mut self, positions: usize) {
        self.reserved = positions;
        for layer in &mut self.layers {
            layer.self_attn.reserve(positions);
        }
    }

    /// Number of target positions already decoded.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.self_attn.len())
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps batch rows `rows` (`U32`, e.g. surviving beams), in that order. `memory` is the
    /// encoder memory reordered the same way (`(rows.len(), S, d_model)`): the cross-attention
    /// caches will hold it from now on.
    pub fn select_rows(&mut self, rows: &Tensor, memory: &Tensor) -> candle::Result<()> {
        self.select_rows_shared_memory(rows, rows, memory)
    }

    /// Keeps rows `rows` of the self-attention caches and memory rows `memory_rows` of the
    /// cross-attention caches (`U32`, in that order), for a decode whose groups of
    /// `rows.len() / memory_rows.len()` consecutive rows share one memory row (see
    /// [`TransformerDecoder::forward_cached`]). `memory` `(memory_rows.len(), S, d_model)` is
    /// the memory reordered the same way: the cross-attention caches will hold it from now on.
    pub fn select_rows_shared_memory(
        &mut self,
        rows: &Tensor,
        memory_rows: &Tensor,
        memory: &Tensor,
    ) -> candle::Result<()> {
        // In place: a decoder cache hands out no views of its caches (see
        // `KvCache::select_rows_in_place`).
        for layer in &mut self.layers {
            layer.self_attn.select_rows_in_place(rows)?;
            layer.cross_attn.select_rows_in_place(memory_rows, memory)?;
        }
        Ok(())
    }

    /// Keeps batch rows `rows` of the self-attention caches only, leaving the cross-attention
    /// caches as they are. Valid when the memory rows do not move: memory row `rows[i]` equals
    /// memory row `i` for every `i` (e.g. beam search reordering hypotheses of one source
    /// sentence, whose memory rows are copies of each other). Saves copying the projected
    /// memory of every layer on every step.
    pub fn select_rows_same_memory(&mut self, rows: &Tensor) -> candle::Result<()> {
        for layer in &mut self.layers {
            layer.self_attn.select_rows_in_place(rows)?;
        }
        Ok(())
    }
}

/// One decoder layer, `torch.nn.TransformerDecoderLayer`. Tensor names: `self_attn.*`,
/// `multihead_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*`, `norm3.*` (or the Hugging
/// Face names, see [`super::LayerNaming`]).
#[derive(Clone, Debug)]
// Fields are pub(super): `decoder_parts` runs these layers over several batches at once.
pub struct TransformerDecoderLayer {
    pub(super) self_attn: MultiHeadAttention,
    pub(super) multihead_attn: MultiHeadAttention,
    pub(super) feed_forward: FeedForward,
    pub(super) norm1: LayerNorm,
    pub(super) norm2: LayerNorm,
    pub(super) norm3: LayerNorm,
    pub(super) norm_first: bool,
    dropout: f32,
}

impl TransformerDecoderLayer {
    /// Loads the layer under `vb` (every tensor must be there with the shapes `cfg` implies).
    pub fn load(cfg: &TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::load(vb))
    }

    /// Fresh, torch-initialised weights (trainable with a `VarMap`).
    pub fn new(cfg: &TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::init(vb))
    }

    /// The layer from `source` (under its prefix): loaded or created, as the source says.
    pub fn from_source(cfg: &TransformerConfig, source: &WeightSource) -> candle::Result<Self> {
        cfg.validate()?;
        let attn = |src: WeightSource| MultiHeadAttention::from_source(cfg.attention(), &src);
        let vb = source.var_builder();
        let norm =
            |name: &str| LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp(name));
        Ok(Self {
            self_attn: attn(source.pp("self_attn"))?,
            multihead_attn: attn(source.pp(cfg.naming.cross_attn()))?,
            feed_forward: FeedForward::new(cfg, source)?,
            norm1: norm(cfg.naming.self_attn_norm())?,
            norm2: norm(cfg.naming.cross_attn_norm())?,
            norm3: norm(cfg.naming.feed_forward_norm(true))?,
            norm_first: cfg.norm_first,
            dropout: cfg.dropout,
        })
    }

    /// The masked self-attention block.
    pub fn self_attn(&self) -> &MultiHeadAttention {
        &self.self_attn
    }

    /// The encoder-decoder attention block.
    pub fn cross_attn(&self) -> &MultiHeadAttention {
        &self.multihead_attn
    }

    /// Full pass: `tgt` `(B, T, d_model)` attending to itself under `masks.tgt_mask` and to
    /// `memory` `(B, S, d_model)` → `(B, T, d_model)`; dropout only when `train`.
    pub fn forward(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        Ok(self
            .forward_inner(tgt, memory, masks, train, None, false, None)?
            .0)
    }

    /// Incremental pass: the new positions `tgt` `(B, T, d_model)` after the ones in `cache`.
    /// The causal mask comes from the cache (`masks.tgt_mask` holds only further constraints,
    /// usually none); `masks.tgt_key_padding_mask`, if any, covers `(B, cached + T)`. The memory
    /// must be the one the cache was filled from (an error otherwise). Returns `(B, T, d_model)`,
    /// equal to the matching rows of a full causal pass.
    pub fn forward_cached(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        cache: &mut DecoderLayerCache,
    ) -> candle::Result<Tensor> {
        Ok(self
            .forward_inner(tgt, memory, masks, false, Some(cache), false, None)?
            .0)
    }

    /// The cached encoder-decoder attention of `x` `(B, T, E)` over `memory` `(M, S, E)`: one
    /// memory row per row (`M = B`), or one per group of `B / M` consecutive rows (the beams of
    /// one sentence), whose `B / M · T` queries then attend that row's keys and values
    /// together, read once for the group. Exact: rows of a cross-attention never see each
    /// other. Returns `(B, T, E)`.
    fn attend_cross_cached(
        &self,
        x: &Tensor,
        memory: &Tensor,
        cache: &mut CrossAttentionCache,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        let (b, t, e) = x.dims3()?;
        let m = memory.dim(0)?;
        if m == b || m == 0 || !b.is_multiple_of(m) {
            // One memory row per row, or a mismatch `attend_cross` names.
            return self.multihead_attn.attend_cross(x, memory, cache, args);
        }
        if !args.mask.is_none() || args.need_weights {
            candle::bail!(
                "{b} decoder rows share {m} memory rows (groups of {}), which takes neither a \
                 memory_mask nor attention weights: give one memory row per decoder row",
                b / m
            )
        }
        let grouped = x.reshape((m, b / m * t, e))?;
        let mut out = self
            .multihead_attn
            .attend_cross(&grouped, memory, cache, args)?;
        out.output = out.output.reshape((b, t, e))?;
        Ok(out)
    }

    /// [`TransformerDecoderLayer::forward`], also returning the encoder-decoder attention
    /// weights per head `(B, H, T, S)` when `cross_weights`, and recording both attention
    /// blocks (self, cross) into `trace` when given (full passes only).
    #[allow(clippy::too_many_arguments)]
    fn forward_inner(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        train: bool,
        mut cache: Option<&mut DecoderLayerCache>,
        cross_weights: bool,
        mut trace: Option<&mut LayerTraceSlots>,
    ) -> candle::Result<(Tensor, Option<Tensor>)> {
        let mut weights = None;
        let mut self_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let out = match cache.as_deref_mut() {
                Some(cache) => {
                    let args = CachedAttentionArgs {
                        causal: true,
                        key_padding: masks.tgt_key_padding_mask,
                        mask: masks.tgt_mask.clone(),
                        train,
                        ..Default::default()
                    };
                    self.self_attn
                        .attend_cached(x, &mut cache.self_attn, &args)?
                        .output
                }
                None => {
                    let args = AttentionArgs {
                        mask: masks.tgt_mask.clone(),
                        key_padding: masks.tgt_key_padding_mask,
                        train,
                        ..Default::default()
                    };
                    let out = self.self_attn.attend(x, x, x, &args)?.output;
                    if let Some(slots) = trace.as_deref_mut() {
                        slots.0 = Some(AttentionTrace::new(
                            x,
                            x,
                            &args.mask,
                            args.key_padding,
                            &out,
                        )?);
                    }
                    out
                }
            };
            dropout(&out, self.dropout, train)
        };
        let x = if self.norm_first {
            add(tgt, &self_attention(&self.norm1.forward(tgt)?)?)?
        } else {
            self.norm1.forward(&add(tgt, &self_attention(tgt)?)?)?
        };
        let mut cross_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let args = AttentionArgs {
                mask: masks.memory_mask.clone(),
                key_padding: masks.memory_key_padding_mask,
                train,
                need_weights: cross_weights,
                average_weights: false,
            };
            let out = match cache.as_deref_mut() {
                Some(cache) => self.attend_cross_cached(x, memory, &mut cache.cross_attn, &args)?,
                None => {
                    let out = self.multihead_attn.attend(x, memory, memory, &args)?;
                    if let Some(slots) = trace.as_deref_mut() {
                        slots.1 = Some(AttentionTrace::new(
                            x,
                            memory,
                            &args.mask,
                            args.key_padding,
                            &out.output,
                        )?);
                    }
                    out
                }
            };
            weights = out.weights;
            dropout(&out.output, self.dropout, train)
        };
        let x = if self.norm_first {
            add(&x, &cross_attention(&self.norm2.forward(&x)?)?)?
        } else {
            self.norm2.forward(&add(&x, &cross_attention(&x)?)?)?
        };
        let feed_forward =
            |x: &Tensor| dropout(&self.feed_forward.forward(x, train)?, self.dropout, train);
        let out = if self.norm_first {
            add(&x, &feed_forward(&self.norm3.forward(&x)?)?)?
        } else {
            self.norm3.forward(&add(&x, &feed_forward(&x)?)?)?
        };
        Ok((out, weights))
    }
}

/// The decoder stack, `torch.nn.TransformerDecoder`, with an optional final LayerNorm. Tensor
/// names: `layers.{i}.*`, `norm.*`.
///
/// ```
/// use candle::{DType, Device, Tensor};
/// use candle_attention::transformer::{DecoderCache, DecoderMasks, TransformerConfig, TransformerDecoder};
/// use candle_attention::Mask;
/// use candle_nn::{VarBuilder, VarMap};
/// # fn main() -> candle::Result<()> {
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let mut cfg = TransformerConfig::new(32, 4);
/// cfg.num_decoder_layers = 2;
/// let decoder = TransformerDecoder::new(&cfg, vb.pp("decoder"), false)?; // no final norm
/// let memory = Tensor::randn(0f32, 1., (1, 5, 32), &Device::Cpu)?;
/// let tgt = Tensor::randn(0f32, 1., (1, 3, 32), &Device::Cpu)?;
/// let masks = DecoderMasks { tgt_mask: Mask::causal(), ..Default::default() };
/// let full = decoder.forward(&tgt, &memory, &masks, false)?;
/// // The same, one position at a time through the caches (causal offset from the cache).
/// let mut cache = DecoderCache::default();
/// for t in 0..3 {
///     let step = decoder.forward_cached(&tgt.narrow(1, t, 1)?, &memory, &DecoderMasks::default(), &mut cache)?;
///     let diff = (step - full.narrow(1, t, 1)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
///     assert!(diff < 1e-5);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct TransformerDecoder {
    pub(super) layers: Vec<TransformerDecoderLayer>,
    norm: Option<LayerNorm>,
}

impl TransformerDecoder {
    /// Loads `cfg.num_decoder_layers` layers under `vb`, and the final norm (`norm.*`, or
    /// `layer_norm.*` with Hugging Face names) when the weights have one.
    pub fn load(cfg: &TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        let final_norm = vb.contains_tensor(&format!("{}.weight", cfg.naming.stack_norm()));
        Self::from_source(cfg, &WeightSource::load(vb), final_norm)
    }

    /// Fresh, torch-initialised weights, with a final norm when `final_norm`.
    pub fn new(cfg: &TransformerConfig, vb: VarBuilder, final_norm: bool) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::init(vb), final_norm)
    }

    /// `cfg.num_decoder_layers` layers (`layers.{i}`) and, when `final_norm`, the final norm
    /// (`norm.*`, or `layer_norm.*` with Hugging Face names), from `source` (under its prefix).
    pub fn from_source(
        cfg: &TransformerConfig,
        source: &WeightSource,
        final_norm: bool,
    ) -> candle::Result<Self> {
        let layers = source.stack("layers", cfg.num_decoder_layers, |layer| {
            TransformerDecoderLayer::from_source(cfg, layer)
        })?;
        let vb = source.var_builder();
        let norm = final_norm
            .then(|| {
                let name = cfg.naming.stack_norm();
                LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp(name))
            })
            .transpose()?;
        Ok(Self { layers, norm })
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[TransformerDecoderLayer] {
        &self.layers
    }

    /// True when the stack ends with a LayerNorm.
    pub fn has_final_norm(&self) -> bool {
        self.norm.is_some()
    }

    pub(super) fn final_norm(&self, x: Tensor) -> candle::Result<Tensor> {
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
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
            x = layer.forward(&x, memory, masks, train)?;
        }
        self.final_norm(x)
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
            let (out, weights) = layer.forward_inner(&x, memory, masks, false, None, true, None)?;
            all.push(
                weights
                    .ok_or_else(|| candle::Error::Msg("cross-attention weights missing".into()))?,
            );
            x = out;
        }
        Ok(all)
    }

    /// An eval pass ([`TransformerDecoder::forward`] with `train = false`) that also returns
    /// what each layer's two attention blocks received and returned, one
    /// [`DecoderLayerTrace`] per layer. The output is the same tensor the plain pass computes.
    pub fn forward_traced(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
    ) -> candle::Result<(Tensor, Vec<DecoderLayerTrace>)> {
        let mut x = tgt.clone();
        let mut traces = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut slots: LayerTraceSlots = (None, None);
            x = layer
                .forward_inner(&x, memory, masks, false, None, false, Some(&mut slots))?
                .0;
            match slots {
                (Some(self_attn), Some(cross_attn)) => traces.push(DecoderLayerTrace {
                    self_attn,
                    cross_attn,
                }),
                _ => candle::bail!("decoder attention trace missing"),
            }
        }
        Ok((self.final_norm(x)?, traces))
    }

    /// Incremental pass: the new target positions `tgt` `(B, T, d_model)` after the `cache.len()`
    /// cached ones. The causal mask is applied from the cache (`masks.tgt_mask` holds only
    /// further constraints over `(T, cache.len() + T)`, usually none);
    /// `masks.tgt_key_padding_mask`, if any, covers `(B, cache.len() + T)`. Appends to `cache`
    /// and returns `(B, T, d_model)`, equal to the matching rows of a full causal pass.
    ///
    /// `memory` `(M, S, d_model)` holds one row per target row (`M = B`) or one per group of
    /// `B / M` consecutive target rows (the beams of one sentence share their encoder output
    /// and its projected keys and values; `masks.memory_key_padding_mask` is then `(M, S)` and
    /// `masks.memory_mask` must be empty).
    pub fn forward_cached(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        masks: &DecoderMasks,
        cache: &mut DecoderCache,
    ) -> candle::Result<Tensor> {
        if masks.tgt_mask.has_causal() {
            candle::bail!(
                "forward_cached applies the causal mask itself, offset by the {} cached positions; \
                 leave tgt_mask without a causal term (usually Mask::none())",
                cache.len()
            )
        }
        cache.ensure_layers(self.layers.len())?;
        let mut x = tgt.clone();
        for (layer, layer_cache) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = layer.forward_cached(&x, memory, masks, layer_cache)?;
        }
        self.final_norm(x)
    }
}

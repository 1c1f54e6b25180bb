//! `Seq2Seq`: token ids in, next-token logits out. Embeddings (scaled by `sqrt(d_model)`) plus
//! sinusoidal positions feed a [`Transformer`]; a linear layer (optionally tied to the target
//! embedding) maps the decoder output to the vocabulary.

use candle::{DType, Module, Tensor};
use candle_attention::explain::ExplainModel;
use candle_attention::generation::{
    generate_hypotheses, GenerationConfig, Hypothesis, StepDecoder,
};
use candle_attention::transformer::{
    sinusoidal_positions, DecoderCache, DecoderMasks, EncoderMasks, ModelTrace, TokenEmbedding,
    Transformer, TransformerConfig, TransformerDecoder, TransformerEncoder,
};
use candle_attention::Mask;
use candle_nn::{Linear, VarBuilder};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Everything needed to rebuild a [`Seq2Seq`]; saved as JSON next to the weights.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Seq2SeqConfig {
    /// The encoder-decoder.
    pub transformer: TransformerConfig,
    /// Source vocabulary size.
    pub src_vocab_size: usize,
    /// Target vocabulary size.
    pub tgt_vocab_size: usize,
    /// One embedding table `embed.weight` for source and target (needs equal vocabularies);
    /// otherwise `src_embed.weight` and `tgt_embed.weight`.
    pub share_embeddings: bool,
    /// The output projection reuses the target embedding table (paper section 3.4); otherwise
    /// it is `output.weight` `(tgt_vocab, d_model)` and `output.bias`.
    pub tie_output: bool,
    /// Padding id (never attended to, never generated).
    pub pad_id: u32,
    /// Beginning-of-sequence id, the first decoder input.
    pub bos_id: u32,
    /// End-of-sequence id.
    pub eos_id: u32,
}

impl Seq2SeqConfig {
    /// Reads a config written by [`Seq2SeqConfig::save`].
    pub fn load(path: impl AsRef<Path>) -> candle::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| candle::Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!(
                "{} is not a valid Seq2Seq config: {e}",
                path.display()
            ))
        })
    }

    /// Writes the config as pretty JSON.
    pub fn save(&self, path: impl AsRef<Path>) -> candle::Result<()> {
        let path = path.as_ref();
        let text =
            serde_json::to_string_pretty(self).map_err(|e| candle::Error::Msg(e.to_string()))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", path.display())))
    }

    /// Checks the transformer, the vocabularies and the special ids.
    pub fn validate(&self) -> candle::Result<()> {
        self.transformer.validate()?;
        if self.share_embeddings && self.src_vocab_size != self.tgt_vocab_size {
            candle::bail!(
                "share_embeddings needs equal vocabularies, got source {} and target {}",
                self.src_vocab_size,
                self.tgt_vocab_size
            )
        }
        for (name, id) in [
            ("pad_id", self.pad_id),
            ("bos_id", self.bos_id),
            ("eos_id", self.eos_id),
        ] {
            let id = id as usize;
            if id >= self.tgt_vocab_size || id >= self.src_vocab_size {
                candle::bail!(
                    "{name} {id} is outside the vocabularies (source {}, target {})",
                    self.src_vocab_size,
                    self.tgt_vocab_size
                )
            }
        }
        Ok(())
    }
}

/// The encoder output and decoder caches of sentences being decoded one token at a time, one
/// row per hypothesis.
#[derive(Clone, Debug)]
pub struct DecodeState {
    /// Encoder output `(rows, S, d_model)`.
    memory: Tensor,
    /// `(rows, S)` `U8`, 1 where the source is padding.
    src_padding: Tensor,
    /// `(rows, T)` `U8`, 1 where a fed target token was padding.
    tgt_padding: Option<Tensor>,
    cache: DecoderCache,
    /// Positional encodings `(P, d_model)` on the device for positions `0..P`, grown by
    /// doubling: a step narrows it instead of uploading its positions.
    positions: Option<Tensor>,
}

impl DecodeState {
    /// Number of rows (hypotheses).
    pub fn rows(&self) -> usize {
        self.memory.dim(0).unwrap_or(0)
    }

    /// Number of target tokens fed so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Keeps rows `rows` (`U32` indices, may repeat), in that order.
    pub fn select_rows(&mut self, rows: &Tensor) -> candle::Result<()> {
        self.memory = self.memory.index_select(rows, 0)?;
        self.src_padding = self.src_padding.index_select(rows, 0)?;
        self.tgt_padding = self
            .tgt_padding
            .as_ref()
            .map(|t| t.index_select(rows, 0))
            .transpose()?;
        self.cache.select_rows(rows, &self.memory)
    }
}

/// A sequence-to-sequence Transformer over token ids. Tensor names: `embed.weight` (shared) or
/// `src_embed.weight` / `tgt_embed.weight`; `transformer.*` (torch's `nn.Transformer` names);
/// `output.weight`, `output.bias` unless tied.
#[derive(Clone, Debug)]
pub struct Seq2Seq {
    cfg: Seq2SeqConfig,
    src_embed: TokenEmbedding,
    tgt_embed: TokenEmbedding,
    transformer: Transformer,
    output: Linear,
}

impl Seq2Seq {
    /// Loads the weights under `vb` (see the type's tensor names).
    pub fn load(cfg: Seq2SeqConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::build(cfg, vb, false)
    }

    /// Fresh weights for training (with a `VarBuilder` over a `VarMap`).
    pub fn new(cfg: Seq2SeqConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::build(cfg, vb, true)
    }

    fn build(cfg: Seq2SeqConfig, vb: VarBuilder, fresh: bool) -> candle::Result<Self> {
        cfg.validate()?;
        let d = cfg.transformer.d_model;
        let (src_embed, tgt_embed) = if cfg.share_embeddings {
            let shared = TokenEmbedding::new(cfg.src_vocab_size, d, vb.pp("embed"))?;
            (shared.clone(), shared)
        } else {
            (
                TokenEmbedding::new(cfg.src_vocab_size, d, vb.pp("src_embed"))?,
                TokenEmbedding::new(cfg.tgt_vocab_size, d, vb.pp("tgt_embed"))?,
            )
        };
        let transformer = if fresh {
            Transformer::new(cfg.transformer.clone(), vb.pp("transformer"))?
        } else {
            Transformer::load(cfg.transformer.clone(), vb.pp("transformer"))?
        };
        let output = if cfg.tie_output {
            Linear::new(tgt_embed.weight().clone(), None)
        } else {
            candle_nn::linear(d, cfg.tgt_vocab_size, vb.pp("output"))?
        };
        Ok(Self {
            cfg,
            src_embed,
            tgt_embed,
            transformer,
            output,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Seq2SeqConfig {
        &self.cfg
    }

    /// The underlying Transformer.
    pub fn transformer(&self) -> &Transformer {
        &self.transformer
    }

    /// Embeds ids `(B, T)` at positions `start..start + T`: `(B, T, d_model)`.
    fn embed(
        &self,
        table: &TokenEmbedding,
        ids: &Tensor,
        start: usize,
        train: bool,
    ) -> candle::Result<Tensor> {
        let x = table.forward(ids)?;
        let (_, t, d) = x.dims3()?;
        let pe = sinusoidal_positions(start, t, d, x.dtype(), x.device())?;
        dropout(&x.broadcast_add(&pe)?, self.cfg.transformer.dropout, train)
    }

    fn check_ids(name: &str, ids: &Tensor) -> candle::Result<()> {
        if ids.rank() != 2 || ids.dtype() != DType::U32 {
            candle::bail!(
                "{name} must be (batch, seq) U32 token ids, got shape {:?} {:?}",
                ids.dims(),
                ids.dtype()
            )
        }
        Ok(())
    }

    /// Encodes source ids `(B, S)` `U32` (padding = `pad_id`): the memory `(B, S, d_model)` and
    /// the source padding mask `(B, S)` `U8`.
    pub fn encode(&self, src: &Tensor, train: bool) -> candle::Result<(Tensor, Tensor)> {
        Self::check_ids("source ids", src)?;
        let padding = src.eq(self.cfg.pad_id)?;
        let x = self.embed(&self.src_embed, src, 0, train)?;
        let masks = EncoderMasks {
            src_mask: Mask::none(),
            src_key_padding_mask: Some(&padding),
        };
        let memory = self.transformer.encoder().forward(&x, &masks, train)?;
        Ok((memory, padding))
    }

    /// Teacher forcing: source ids `(B, S)`, decoder input ids `(B, T)` (starting with
    /// `bos_id`) → logits `(B, T, tgt_vocab)`. Padding in either is masked; the decoder is
    /// causal.
    pub fn forward(&self, src: &Tensor, tgt: &Tensor, train: bool) -> candle::Result<Tensor> {
        let (memory, src_padding) = self.encode(src, train)?;
        self.decode(&memory, &src_padding, tgt, train)
    }

    /// The decoder half of [`Seq2Seq::forward`]: `memory` `(B, S, d_model)` and `src_padding`
    /// `(B, S)` from [`Seq2Seq::encode`], target ids `(B, T)` → logits `(B, T, tgt_vocab)`.
    pub fn decode(
        &self,
        memory: &Tensor,
        src_padding: &Tensor,
        tgt: &Tensor,
        train: bool,
    ) -> candle::Result<Tensor> {
        Self::check_ids("target ids", tgt)?;
        if memory.dim(0)? != tgt.dim(0)? {
            candle::bail!(
                "source batch {} and target ids {:?} have different batch sizes",
                memory.dim(0)?,
                tgt.dims()
            )
        }
        let tgt_padding = tgt.eq(self.cfg.pad_id)?;
        let x = self.embed(&self.tgt_embed, tgt, 0, train)?;
        let masks = DecoderMasks {
            tgt_mask: Mask::causal(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: Some(&tgt_padding),
            memory_key_padding_mask: Some(src_padding),
        };
        let h = self
            .transformer
            .decoder()
            .forward(&x, memory, &masks, train)?;
        self.output.forward(&h)
    }

    /// Where each target position looked in the source: per decoder layer, the encoder-decoder
    /// attention weights `(B, H, T, S)` of a teacher-forced pass over source ids `(B, S)` and
    /// decoder inputs `tgt` `(B, T)` (BOS then the output tokens).
    pub fn cross_attention(&self, src: &Tensor, tgt: &Tensor) -> candle::Result<Vec<Tensor>> {
        Self::check_ids("target ids", tgt)?;
        let (memory, src_padding) = self.encode(src, false)?;
        let tgt_padding = tgt.eq(self.cfg.pad_id)?;
        let x = self.embed(&self.tgt_embed, tgt, 0, false)?;
        let masks = DecoderMasks {
            tgt_mask: Mask::causal(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: Some(&tgt_padding),
            memory_key_padding_mask: Some(&src_padding),
        };
        self.transformer
            .decoder()
            .cross_attention_weights(&x, &memory, &masks)
    }

    /// A teacher-forced eval pass over source ids `(B, S)` and decoder inputs `tgt` `(B, T)`
    /// (BOS then the output tokens) that records every attention block: what each received,
    /// the mask it was given and what it returned. `logits` equals [`Seq2Seq::forward`] and
    /// `memory` [`Seq2Seq::encode`] (eval mode).
    pub fn trace(&self, src: &Tensor, tgt: &Tensor) -> candle::Result<ModelTrace> {
        Self::check_ids("source ids", src)?;
        Self::check_ids("target ids", tgt)?;
        if src.dim(0)? != tgt.dim(0)? {
            candle::bail!(
                "source ids {:?} and target ids {:?} have different batch sizes",
                src.dims(),
                tgt.dims()
            )
        }
        let src_padding = src.eq(self.cfg.pad_id)?;
        let x = self.embed(&self.src_embed, src, 0, false)?;
        let (memory, encoder) = self.transformer.encoder().forward_traced(
            &x,
            &EncoderMasks {
                src_mask: Mask::none(),
                src_key_padding_mask: Some(&src_padding),
            },
        )?;
        let tgt_padding = tgt.eq(self.cfg.pad_id)?;
        let y = self.embed(&self.tgt_embed, tgt, 0, false)?;
        let masks = DecoderMasks {
            tgt_mask: Mask::causal(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: Some(&tgt_padding),
            memory_key_padding_mask: Some(&src_padding),
        };
        let (h, decoder) = self
            .transformer
            .decoder()
            .forward_traced(&y, &memory, &masks)?;
        Ok(ModelTrace {
            encoder,
            decoder,
            logits: self.output.forward(&h)?,
            memory,
        })
    }

    /// Encodes `src` `(B, S)` and returns the state for [`Seq2Seq::step`].
    pub fn start(&self, src: &Tensor) -> candle::Result<DecodeState> {
        let (memory, src_padding) = self.encode(src, false)?;
        Ok(DecodeState {
            memory,
            src_padding,
            tgt_padding: None,
            cache: DecoderCache::default(),
            positions: None,
        })
    }

    /// Feeds the next target ids `(rows, T)` (usually `T = 1`) and returns their logits
    /// `(rows, T, tgt_vocab)`, equal to the matching rows of [`Seq2Seq::forward`] on the whole
    /// prefix. Each step costs time proportional to the prefix length (the KV cache holds the
    /// earlier keys and values; the encoder memory is projected once).
    pub fn step(&self, state: &mut DecodeState, tgt: &Tensor) -> candle::Result<Tensor> {
        Self::check_ids("target ids", tgt)?;
        let embedded = self.tgt_embed.forward(tgt)?;
        self.step_embedded(state, tgt, embedded)
    }

    /// [`Seq2Seq::step`] with the target ids `tgt` `(rows, T)` already embedded
    /// (`(rows, T, d_model)`, unscaled positions not yet added).
    fn step_embedded(
        &self,
        state: &mut DecodeState,
        tgt: &Tensor,
        tokens: Tensor,
    ) -> candle::Result<Tensor> {
        if tgt.dim(0)? != state.rows() {
            candle::bail!(
                "step got {} rows of target ids but the state has {}",
                tgt.dim(0)?,
                state.rows()
            )
        }
        let past = state.len();
        // Compared on the device with a device-filled pad id (a scalar operand would be
        // copied from the host at every step).
        let pad = Tensor::full(self.cfg.pad_id, (), tgt.device())?.broadcast_as(tgt.shape())?;
        let new_padding = tgt.eq(&pad)?;
        let tgt_padding = match &state.tgt_padding {
            Some(p) => Tensor::cat(&[p, &new_padding], 1)?,
            None => new_padding,
        };
        let (_, t, d) = tokens.dims3()?;
        let have = state
            .positions
            .as_ref()
            .map_or(0, |p| p.dim(0).unwrap_or(0));
        if have < past + t {
            let rows = (past + t).max(2 * have).max(64);
            state.positions = Some(sinusoidal_positions(
                0,
                rows,
                d,
                tokens.dtype(),
                tokens.device(),
            )?);
        }
        let pe = state
            .positions
            .as_ref()
            .expect("just filled")
            .narrow(0, past, t)?;
        let x = tokens.broadcast_add(&pe)?;
        let masks = DecoderMasks {
            // The cached pass applies the causal mask itself, offset by the cache length.
            tgt_mask: Mask::none(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: Some(&tgt_padding),
            memory_key_padding_mask: Some(&state.src_padding),
        };
        let h = self.transformer.decoder().forward_cached(
            &x,
            &state.memory,
            &masks,
            &mut state.cache,
        )?;
        state.tgt_padding = Some(tgt_padding);
        self.output.forward(&h)
    }
}

/// Generation (`candle_attention::generation`) drives the model through the KV cache: each
/// step feeds one token per row and returns the log-softmax of the next-token logits.
impl StepDecoder for Seq2Seq {
    type State = DecodeState;

    fn step(&self, state: &mut DecodeState, tokens: &[u32]) -> candle::Result<Tensor> {
        // The only upload of a step: the tokens just chosen, checked on the host.
        let embedded = self.tgt_embed.forward_host_ids(tokens, (tokens.len(), 1))?;
        let ids = Tensor::from_slice(tokens, (tokens.len(), 1), state.memory.device())?;
        let logits = self.step_embedded(state, &ids, embedded)?.squeeze(1)?;
        candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, candle::D::Minus1)
    }

    fn reorder(&self, state: &mut DecodeState, rows: &[u32]) -> candle::Result<()> {
        let rows = Tensor::from_slice(rows, rows.len(), state.memory.device())?;
        state.select_rows(&rows)
    }
}

impl Seq2Seq {
    /// The search rules of this model as a [`GenerationConfig`]: decoding starts from
    /// `bos_id`, ends at `eos_id`, `pad_id` and `bos_id` are never generated (unless one of
    /// them is the EOS id), at most `max_len` tokens (EOS included), `beam_size` beams (1:
    /// greedy) ranked with `length_penalty`.
    pub fn generation_config(
        &self,
        max_len: usize,
        beam_size: usize,
        length_penalty: f64,
    ) -> GenerationConfig {
        let c = &self.cfg;
        GenerationConfig {
            decoder_start_token_id: Some(c.bos_id),
            eos_token_id: Some(vec![c.eos_id]),
            pad_token_id: Some(c.pad_id),
            bad_words_ids: Some(vec![vec![c.pad_id], vec![c.bos_id]]),
            max_new_tokens: Some(max_len),
            num_beams: Some(beam_size),
            length_penalty: Some(length_penalty),
            ..Default::default()
        }
    }

    /// Translates a batch of source id rows `(B, S)` (right-padded with `pad_id`): the best
    /// hypothesis per row under [`Seq2Seq::generation_config`], greedy for `beam_size` 1 and
    /// beam search otherwise.
    pub fn generate(
        &self,
        src: &Tensor,
        max_len: usize,
        beam_size: usize,
        length_penalty: f64,
    ) -> candle::Result<Vec<Hypothesis>> {
        let batch = src.dim(0)?;
        let cfg = self.generation_config(max_len, beam_size, length_penalty);
        generate_hypotheses(self, self.start(src)?, batch, &cfg)?
            .into_iter()
            .map(|hyps| {
                hyps.into_iter()
                    .next()
                    .ok_or_else(|| candle::Error::Msg("generation returned no hypothesis".into()))
            })
            .collect()
    }
}

/// The stacks and a traced pass over one text, for `candle_attention::explain::Explanation`.
impl ExplainModel for Seq2Seq {
    fn encoder(&self) -> &TransformerEncoder {
        self.transformer.encoder()
    }

    fn decoder(&self) -> &TransformerDecoder {
        self.transformer.decoder()
    }

    fn trace_ids(&self, source_ids: &[u32], decoder_ids: &[u32]) -> candle::Result<ModelTrace> {
        let device = self.output.weight().device();
        let src = Tensor::new(source_ids, device)?.unsqueeze(0)?;
        let tgt = Tensor::new(decoder_ids, device)?.unsqueeze(0)?;
        self.trace(&src, &tgt)
    }
}

/// Dropout with probability `p` when `train`, identity otherwise.
fn dropout(xs: &Tensor, p: f32, train: bool) -> candle::Result<Tensor> {
    if train && p > 0.0 {
        candle_nn::ops::dropout(xs, p)
    } else {
        Ok(xs.clone())
    }
}

//! `Transformer`: encoder + decoder over embedded sequences, exactly `torch.nn.Transformer`.

use super::config::TransformerConfig;
use super::decoder::{DecoderMasks, TransformerDecoder};
use super::encoder::{EncoderMasks, TransformerEncoder};
use crate::mask::Mask;
use crate::weights::WeightSource;
use candle::Tensor;
use candle_nn::VarBuilder;

/// The six masks of `torch.nn.Transformer.forward`, same names and semantics (boolean: true =
/// blocked; float: additive). `Default`: no masks.
#[derive(Clone, Debug, Default)]
pub struct TransformerMasks<'a> {
    /// Encoder self-attention, `(S, S)` or `(B * nhead, S, S)`.
    pub src_mask: Mask,
    /// Decoder self-attention, `(T, T)` or `(B * nhead, T, T)`; usually [`Mask::causal`].
    pub tgt_mask: Mask,
    /// Encoder-decoder attention, `(T, S)` or `(B * nhead, T, S)`.
    pub memory_mask: Mask,
    /// `(B, S)`, true = padding.
    pub src_key_padding_mask: Option<&'a Tensor>,
    /// `(B, T)`, true = padding.
    pub tgt_key_padding_mask: Option<&'a Tensor>,
    /// `(B, S)`, true = padding.
    pub memory_key_padding_mask: Option<&'a Tensor>,
}

impl<'a> TransformerMasks<'a> {
    /// The encoder's share.
    pub fn encoder(&self) -> EncoderMasks<'a> {
        EncoderMasks {
            src_mask: self.src_mask.clone(),
            src_key_padding_mask: self.src_key_padding_mask,
        }
    }

    /// The decoder's share.
    pub fn decoder(&self) -> DecoderMasks<'a> {
        DecoderMasks {
            tgt_mask: self.tgt_mask.clone(),
            memory_mask: self.memory_mask.clone(),
            tgt_key_padding_mask: self.tgt_key_padding_mask,
            memory_key_padding_mask: self.memory_key_padding_mask,
        }
    }
}

/// Encoder-decoder Transformer. Tensor names as in `torch.nn.Transformer.state_dict()`:
/// `encoder.layers.{i}.*`, `encoder.norm.*`, `decoder.layers.{i}.*`, `decoder.norm.*`.
#[derive(Clone, Debug)]
pub struct Transformer {
    cfg: TransformerConfig,
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
}

impl Transformer {
    /// Loads a `torch.nn.Transformer.state_dict()` under `vb`'s prefix. Every tensor must be
    /// there with the shapes `cfg` implies (see [`TransformerConfig::from_weights`]).
    pub fn load(cfg: TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::load(vb))
    }

    /// Fresh, torch-initialised weights (trainable with a `VarMap`), named as torch names them.
    pub fn new(cfg: TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::init(vb))
    }

    /// The encoder and decoder stacks from `source` (under its prefix), loaded or created.
    pub fn from_source(cfg: TransformerConfig, source: &WeightSource) -> candle::Result<Self> {
        cfg.validate()?;
        Ok(Self {
            // nn.Transformer always has both final norms.
            encoder: TransformerEncoder::from_source(&cfg, &source.pp("encoder"), true)?,
            decoder: TransformerDecoder::from_source(&cfg, &source.pp("decoder"), true)?,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// The encoder stack.
    pub fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    /// The decoder stack (for incremental decoding see [`TransformerDecoder::forward_cached`]).
    pub fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    /// `src` `(B, S, d_model)`, `tgt` `(B, T, d_model)` → `(B, T, d_model)`. Dropout is active
    /// only when `train`.
    pub fn forward(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        masks: &TransformerMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        self.check_input("src", src)?;
        self.check_input("tgt", tgt)?;
        if src.dim(0)? != tgt.dim(0)? {
            candle::bail!(
                "src and tgt must have the same batch size: src {:?}, tgt {:?}",
                src.dims(),
                tgt.dims()
            )
        }
        let memory = self.encoder.forward(src, &masks.encoder(), train)?;
        self.decoder.forward(tgt, &memory, &masks.decoder(), train)
    }

    /// Checks that `t` is `(B, N, d_model)` in the weights' dtype.
    pub fn check_input(&self, name: &str, t: &Tensor) -> candle::Result<()> {
        let d = self.cfg.d_model;
        match t.dims() {
            [_, _, e] if *e == d => {}
            [_, _, e] => candle::bail!(
                "{name} has {e} features (shape {:?}) but d_model is {d}",
                t.dims()
            ),
            dims => candle::bail!("{name} must be (batch, seq, {d}), got shape {dims:?}"),
        }
        Ok(())
    }
}

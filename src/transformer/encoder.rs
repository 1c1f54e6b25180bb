//! The encoder: a stack of self-attention + feed-forward layers (paper section 3.1), exactly
//! `torch.nn.TransformerEncoderLayer` / `TransformerEncoder`.

use super::config::TransformerConfig;
use super::feed_forward::{dropout, FeedForward};
use super::norm::LayerNorm;
use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use candle::{Module, Tensor};
use candle_nn::VarBuilder;

/// Masks of an encoder pass.
#[derive(Clone, Debug, Default)]
pub struct EncoderMasks<'a> {
    /// Self-attention mask `(S, S)` or `(B * nhead, S, S)` (torch's `src_mask`).
    pub src_mask: Mask,
    /// `(B, S)`, true = padding (torch's `src_key_padding_mask`).
    pub src_key_padding_mask: Option<&'a Tensor>,
}

/// One encoder layer. Tensor names (under its prefix): `self_attn.*`, `linear1.*`, `linear2.*`,
/// `norm1.*`, `norm2.*`.
#[derive(Clone, Debug)]
pub struct TransformerEncoderLayer {
    self_attn: MultiHeadAttention,
    feed_forward: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm_first: bool,
    dropout: f32,
}

impl TransformerEncoderLayer {
    /// Loads the layer under `vb` (`fresh`: create torch-initialised weights instead).
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
        Ok(Self {
            self_attn: attn(cfg.attention(), vb.pp("self_attn"))?,
            feed_forward: FeedForward::new(cfg, &vb)?,
            norm1: LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp("norm1"))?,
            norm2: LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp("norm2"))?,
            norm_first: cfg.norm_first,
            dropout: cfg.dropout,
        })
    }

    /// `src` `(B, S, d_model)` → `(B, S, d_model)`.
    pub fn forward(
        &self,
        src: &Tensor,
        masks: &EncoderMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        let self_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let args = AttentionArgs {
                mask: masks.src_mask.clone(),
                key_padding: masks.src_key_padding_mask,
                train,
                ..Default::default()
            };
            dropout(
                &self.self_attn.attend(x, x, x, &args)?.output,
                self.dropout,
                train,
            )
        };
        let feed_forward =
            |x: &Tensor| dropout(&self.feed_forward.forward(x, train)?, self.dropout, train);
        if self.norm_first {
            let x = (src + self_attention(&self.norm1.forward(src)?)?)?;
            &x + feed_forward(&self.norm2.forward(&x)?)?
        } else {
            let x = self.norm1.forward(&(src + self_attention(src)?)?)?;
            self.norm2.forward(&(&x + feed_forward(&x)?)?)
        }
    }
}

/// The encoder stack with its final LayerNorm. Tensor names: `layers.{i}.*`, `norm.*`.
#[derive(Clone, Debug)]
pub struct TransformerEncoder {
    layers: Vec<TransformerEncoderLayer>,
    norm: LayerNorm,
}

impl TransformerEncoder {
    pub(crate) fn build(
        cfg: &TransformerConfig,
        vb: VarBuilder,
        fresh: bool,
    ) -> candle::Result<Self> {
        let layers = (0..cfg.num_encoder_layers)
            .map(|i| TransformerEncoderLayer::build(cfg, vb.pp(format!("layers.{i}")), fresh))
            .collect::<candle::Result<_>>()?;
        let norm = LayerNorm::new(cfg.d_model, cfg.layer_norm_eps, cfg.bias, vb.pp("norm"))?;
        Ok(Self { layers, norm })
    }

    /// `src` `(B, S, d_model)` → the memory `(B, S, d_model)`.
    pub fn forward(
        &self,
        src: &Tensor,
        masks: &EncoderMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        let mut x = src.clone();
        for layer in &self.layers {
            x = layer.forward(&x, masks, train)?;
        }
        self.norm.forward(&x)
    }
}

//! The encoder: a stack of self-attention + feed-forward layers (paper section 3.1), exactly
//! `torch.nn.TransformerEncoderLayer` / `TransformerEncoder`.

use super::config::TransformerConfig;
use super::feed_forward::{dropout, FeedForward};
use super::norm::LayerNorm;
use super::trace::AttentionTrace;
use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use crate::simd::elementwise::add;
use crate::weights::WeightSource;
use candle::{Module, ModuleT, Tensor};
use candle_nn::VarBuilder;

/// Masks of an encoder pass.
#[derive(Clone, Debug, Default)]
pub struct EncoderMasks<'a> {
    /// Self-attention mask `(S, S)` or `(B * nhead, S, S)` (torch's `src_mask`).
    pub src_mask: Mask,
    /// `(B, S)`, true = padding (torch's `src_key_padding_mask`).
    pub src_key_padding_mask: Option<&'a Tensor>,
}

/// One encoder layer, `torch.nn.TransformerEncoderLayer`. Tensor names (under its prefix):
/// `self_attn.*`, `linear1.*`, `linear2.*`, `norm1.*`, `norm2.*` (or the Hugging Face names,
/// see [`super::LayerNaming`]).
///
/// ```
/// use candle::{DType, Device, ModuleT, Tensor};
/// use candle_attention::transformer::{EncoderMasks, TransformerConfig, TransformerEncoderLayer};
/// use candle_nn::{VarBuilder, VarMap};
/// # fn main() -> candle::Result<()> {
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
/// let layer = TransformerEncoderLayer::new(&TransformerConfig::new(32, 4), vb.pp("layer"))?;
/// let x = Tensor::randn(0f32, 1., (2, 7, 32), &Device::Cpu)?;
/// let y = layer.forward(&x, &EncoderMasks::default(), false)?; // eval, no mask
/// assert_eq!(y.dims(), &[2, 7, 32]);
/// let y_train = layer.forward_t(&x, true)?; // ModuleT: dropout in training mode
/// # let _ = y_train;
/// # Ok(()) }
/// ```
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
            feed_forward: FeedForward::new(cfg, source)?,
            norm1: norm(cfg.naming.self_attn_norm())?,
            norm2: norm(cfg.naming.feed_forward_norm(false))?,
            norm_first: cfg.norm_first,
            dropout: cfg.dropout,
        })
    }

    /// The self-attention block.
    pub fn self_attn(&self) -> &MultiHeadAttention {
        &self.self_attn
    }

    /// `src` `(B, S, d_model)` → `(B, S, d_model)`; dropout only when `train`.
    pub fn forward(
        &self,
        src: &Tensor,
        masks: &EncoderMasks,
        train: bool,
    ) -> candle::Result<Tensor> {
        self.forward_inner(src, masks, train, None)
    }

    /// [`TransformerEncoderLayer::forward`], recording the self-attention block's inputs, mask
    /// and output into `trace` when given.
    fn forward_inner(
        &self,
        src: &Tensor,
        masks: &EncoderMasks,
        train: bool,
        mut trace: Option<&mut Option<AttentionTrace>>,
    ) -> candle::Result<Tensor> {
        let mut self_attention = |x: &Tensor| -> candle::Result<Tensor> {
            let args = AttentionArgs {
                mask: masks.src_mask.clone(),
                key_padding: masks.src_key_padding_mask,
                train,
                ..Default::default()
            };
            let out = self.self_attn.attend(x, x, x, &args)?.output;
            if let Some(slot) = trace.as_deref_mut() {
                *slot = Some(AttentionTrace::new(
                    x,
                    x,
                    &args.mask,
                    args.key_padding,
                    &out,
                )?);
            }
            dropout(&out, self.dropout, train)
        };
        let feed_forward =
            |x: &Tensor| dropout(&self.feed_forward.forward(x, train)?, self.dropout, train);
        if self.norm_first {
            let x = add(src, &self_attention(&self.norm1.forward(src)?)?)?;
            add(&x, &feed_forward(&self.norm2.forward(&x)?)?)
        } else {
            let x = self.norm1.forward(&add(src, &self_attention(src)?)?)?;
            self.norm2.forward(&add(&x, &feed_forward(&x)?)?)
        }
    }
}

/// Unmasked pass `(B, S, d_model)` → `(B, S, d_model)`; dropout only when `train`.
impl ModuleT for TransformerEncoderLayer {
    fn forward_t(&self, xs: &Tensor, train: bool) -> candle::Result<Tensor> {
        self.forward(xs, &EncoderMasks::default(), train)
    }
}

/// The encoder stack, `torch.nn.TransformerEncoder`, with an optional final LayerNorm (torch's
/// standalone encoder has none by default; `nn.Transformer`'s always has one). Tensor names:
/// `layers.{i}.*`, `norm.*`.
#[derive(Clone, Debug)]
pub struct TransformerEncoder {
    layers: Vec<TransformerEncoderLayer>,
    norm: Option<LayerNorm>,
}

impl TransformerEncoder {
    /// Loads `cfg.num_encoder_layers` layers under `vb`, and the final norm (`norm.*`, or
    /// `layer_norm.*` with Hugging Face names) when the weights have one.
    pub fn load(cfg: &TransformerConfig, vb: VarBuilder) -> candle::Result<Self> {
        let final_norm = vb.contains_tensor(&format!("{}.weight", cfg.naming.stack_norm()));
        Self::from_source(cfg, &WeightSource::load(vb), final_norm)
    }

    /// Fresh, torch-initialised weights, with a final norm when `final_norm`.
    pub fn new(cfg: &TransformerConfig, vb: VarBuilder, final_norm: bool) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::init(vb), final_norm)
    }

    /// `cfg.num_encoder_layers` layers (`layers.{i}`) and, when `final_norm`, the final norm
    /// (`norm.*`, or `layer_norm.*` with Hugging Face names), from `source` (under its prefix).
    pub fn from_source(
        cfg: &TransformerConfig,
        source: &WeightSource,
        final_norm: bool,
    ) -> candle::Result<Self> {
        let layers = source.stack("layers", cfg.num_encoder_layers, |layer| {
            TransformerEncoderLayer::from_source(cfg, layer)
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
    pub fn layers(&self) -> &[TransformerEncoderLayer] {
        &self.layers
    }

    /// True when the stack ends with a LayerNorm.
    pub fn has_final_norm(&self) -> bool {
        self.norm.is_some()
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
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }

    /// An eval pass ([`TransformerEncoder::forward`] with `train = false`) that also returns
    /// what each layer's self-attention received and returned, one [`AttentionTrace`] per
    /// layer. The output is the same tensor the plain pass computes.
    pub fn forward_traced(
        &self,
        src: &Tensor,
        masks: &EncoderMasks,
    ) -> candle::Result<(Tensor, Vec<AttentionTrace>)> {
        let mut x = src.clone();
        let mut traces = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let mut slot = None;
            x = layer.forward_inner(&x, masks, false, Some(&mut slot))?;
            traces.push(
                slot.ok_or_else(|| candle::Error::Msg("self-attention trace missing".into()))?,
            );
        }
        let out = match &self.norm {
            Some(norm) => norm.forward(&x)?,
            None => x,
        };
        Ok((out, traces))
    }
}

/// Unmasked pass `(B, S, d_model)` → `(B, S, d_model)`; dropout only when `train`.
impl ModuleT for TransformerEncoder {
    fn forward_t(&self, xs: &Tensor, train: bool) -> candle::Result<Tensor> {
        self.forward(xs, &EncoderMasks::default(), train)
    }
}

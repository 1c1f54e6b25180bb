//! Hyper-parameters of the encoder-decoder Transformer, named as in `torch.nn.Transformer`.

use crate::mha::MultiHeadAttentionConfig;
use crate::weights::{join_name, TensorFile};
use serde::{Deserialize, Serialize};

/// The position-wise feed-forward activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(0, x)`, the paper's choice and torch's default.
    Relu,
    /// The exact (erf) GELU, as torch's `F.gelu` (not candle's tanh approximation).
    Gelu,
    /// The tanh approximation of GELU (Hugging Face `gelu_new`, `gelu_pytorch_tanh`,
    /// `gelu_fast`).
    #[serde(alias = "gelu_new")]
    GeluTanh,
    /// `x · sigmoid(x)` (Hugging Face `swish` / `silu`; MarianMT's default).
    #[serde(alias = "swish")]
    Silu,
}

impl Activation {
    /// Applies the activation element-wise.
    ///
    /// A CPU `f32` tensor outside any autograd graph takes the same formula as candle's op,
    /// computed here (on rayon's pool when large; vectorised, see `crate::simd::elementwise`:
    /// SiLU on AVX2 within 4e-7 relative of candle's, otherwise exactly candle's values):
    /// candle's element-wise ops split large
    /// tensors over candle's own thread pool, whose workers busy-wait for a while after each
    /// op, and on a machine with as many cores as threads they then spin against the rayon
    /// tasks of the projections that follow (measured on MarianMT beam search, 2 threads:
    /// about 15% of the CPU time spent spinning).
    pub fn apply(&self, xs: &candle::Tensor) -> candle::Result<candle::Tensor> {
        use crate::simd::elementwise::{activation, Act};
        let cpu = match self {
            Activation::Relu => Some(Act::Relu),
            Activation::Silu => Some(Act::Silu),
            Activation::Gelu | Activation::GeluTanh => None,
        };
        if let Some(act) = cpu {
            if let Some(ys) = activation(crate::simd::Isa::get(), act, xs)? {
                return Ok(ys);
            }
        }
        match self {
            Activation::Relu => xs.relu(),
            Activation::Gelu => xs.gelu_erf(),
            Activation::GeluTanh => xs.gelu(),
            Activation::Silu => xs.silu(),
        }
    }
}

impl std::str::FromStr for Activation {
    type Err = String;
    /// torch's names (`relu`, `gelu`) and Hugging Face's `activation_function` values (`swish`,
    /// `silu`, `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "relu" => Ok(Activation::Relu),
            "gelu" => Ok(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelutanh" => Ok(Activation::GeluTanh),
            "swish" | "silu" => Ok(Activation::Silu),
            other => Err(format!(
                "unknown activation '{other}' (expected relu, gelu, gelu_new, gelu_pytorch_tanh, \
                 gelu_fast, swish or silu)"
            )),
        }
    }
}

/// How the tensors inside a layer are named: `torch.nn.Transformer*Layer` or the Hugging Face
/// BART family (BART, Marian, mBART, Whisper...). The attention blocks themselves are detected
/// by [`crate::MultiHeadAttention::load`] (fused torch or `q_proj`/`k_proj`/... names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerNaming {
    /// `self_attn`, `multihead_attn`, `linear1`, `linear2`, `norm1`, `norm2` (`norm3`); a
    /// stack's own norm is `norm`.
    #[default]
    Torch,
    /// `self_attn`, `encoder_attn`, `fc1`, `fc2`, `self_attn_layer_norm`,
    /// `encoder_attn_layer_norm`, `final_layer_norm`; a stack's own norm is `layer_norm`.
    HuggingFace,
}

impl LayerNaming {
    /// The encoder-decoder attention block of a decoder layer.
    pub fn cross_attn(self) -> &'static str {
        match self {
            Self::Torch => "multihead_attn",
            Self::HuggingFace => "encoder_attn",
        }
    }

    /// The two feed-forward linear layers.
    pub fn linears(self) -> (&'static str, &'static str) {
        match self {
            Self::Torch => ("linear1", "linear2"),
            Self::HuggingFace => ("fc1", "fc2"),
        }
    }

    /// The norm after (post-norm) or before (pre-norm) self-attention.
    pub fn self_attn_norm(self) -> &'static str {
        match self {
            Self::Torch => "norm1",
            Self::HuggingFace => "self_attn_layer_norm",
        }
    }

    /// The norm around a decoder's encoder-decoder attention.
    pub fn cross_attn_norm(self) -> &'static str {
        match self {
            Self::Torch => "norm2",
            Self::HuggingFace => "encoder_attn_layer_norm",
        }
    }

    /// The norm around the feed-forward block: `decoder` layers have one more norm in torch.
    pub fn feed_forward_norm(self, decoder: bool) -> &'static str {
        match (self, decoder) {
            (Self::Torch, false) => "norm2",
            (Self::Torch, true) => "norm3",
            (Self::HuggingFace, _) => "final_layer_norm",
        }
    }

    /// The norm at the end of a stack (torch's `nn.TransformerEncoder(norm=...)`, the BART
    /// family's pre-norm models).
    pub fn stack_norm(self) -> &'static str {
        match self {
            Self::Torch => "norm",
            Self::HuggingFace => "layer_norm",
        }
    }
}

/// Sizes and options of a [`crate::transformer::Transformer`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformerConfig {
    /// Model size `d_model` (512 in the paper).
    pub d_model: usize,
    /// Heads per attention block (8 in the paper).
    pub nhead: usize,
    /// Encoder layers (6 in the paper).
    pub num_encoder_layers: usize,
    /// Decoder layers (6 in the paper).
    pub num_decoder_layers: usize,
    /// Inner size of the feed-forward network (2048 in the paper).
    pub dim_feedforward: usize,
    /// Dropout on attention weights, sub-layer outputs and the feed-forward inner layer, in
    /// training only (0.1 in the paper).
    pub dropout: f32,
    /// Feed-forward activation.
    pub activation: Activation,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Pre-norm (`x + f(norm(x))`) instead of the paper's post-norm (`norm(x + f(x))`).
    pub norm_first: bool,
    /// Biases in linear layers and LayerNorms.
    pub bias: bool,
    /// Tensor names inside each layer (torch unless said; old config files have no such field).
    #[serde(default)]
    pub naming: LayerNaming,
}

impl TransformerConfig {
    /// `d_model` and `nhead` with torch's defaults for the rest: 6 + 6 layers, feed-forward
    /// 2048, dropout 0.1, relu, eps 1e-5, post-norm, biases.
    pub fn new(d_model: usize, nhead: usize) -> Self {
        Self {
            d_model,
            nhead,
            num_encoder_layers: 6,
            num_decoder_layers: 6,
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: Activation::Relu,
            layer_norm_eps: 1e-5,
            norm_first: false,
            bias: true,
            naming: LayerNaming::Torch,
        }
    }

    /// Reads what the weights of a `torch.nn.Transformer.state_dict()` under `prefix` tell:
    /// layer counts, `d_model`, `dim_feedforward` and biases. `nhead` is given; the activation,
    /// `norm_first`, `layer_norm_eps` and dropout keep [`TransformerConfig::new`]'s defaults
    /// (set them after). Errors name the missing tensor or the layer that is absent.
    pub fn from_weights(file: &TensorFile, prefix: &str, nhead: usize) -> candle::Result<Self> {
        let name = |n: &str| join_name(prefix, n);
        let num_encoder_layers = count_layers(file, &name("encoder.layers"))?;
        let num_decoder_layers = count_layers(file, &name("decoder.layers"))?;
        if num_encoder_layers == 0 || num_decoder_layers == 0 {
            let what = if num_encoder_layers == 0 {
                "encoder"
            } else {
                "decoder"
            };
            return Err(candle::Error::Msg(format!(
                "no {what} layers found under '{}': {}",
                name(&format!("{what}.layers")),
                file.not_found(&name(&format!("{what}.layers.0.self_attn.in_proj_weight")))
            )));
        }
        let norm = file.shape_of(&name("encoder.layers.0.norm1.weight"))?;
        let d_model = match norm.as_slice() {
            [d] => *d,
            s => candle::bail!(
                "'{}' must be a vector, got shape {s:?}",
                name("encoder.layers.0.norm1.weight")
            ),
        };
        let linear1 = file.shape_of(&name("encoder.layers.0.linear1.weight"))?;
        let dim_feedforward = match linear1.as_slice() {
            [f, d] if *d == d_model => *f,
            s => candle::bail!(
                "'{}' has shape {s:?}, expected (dim_feedforward, {d_model}) for d_model {d_model}",
                name("encoder.layers.0.linear1.weight")
            ),
        };
        let bias = file.contains(&name("encoder.layers.0.linear1.bias"));
        Ok(Self {
            num_encoder_layers,
            num_decoder_layers,
            dim_feedforward,
            bias,
            ..Self::new(d_model, nhead)
        })
    }

    /// Checks sizes: positive, `nhead` divides `d_model`, dropout in `[0, 1)`, eps > 0.
    pub fn validate(&self) -> candle::Result<()> {
        self.attention().validate()?;
        if self.dim_feedforward == 0 {
            candle::bail!("dim_feedforward must be at least 1")
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite()) {
            candle::bail!(
                "layer_norm_eps must be positive, got {}",
                self.layer_norm_eps
            )
        }
        Ok(())
    }

    /// The configuration of every attention block (self and cross attention).
    pub fn attention(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.nhead)
            .with_bias(self.bias)
            .with_dropout(self.dropout)
    }
}

/// Number of layers `prefix.0`, `prefix.1`, ... present in `file`; an error if the indices
/// have a gap (a missing layer).
fn count_layers(file: &TensorFile, prefix: &str) -> candle::Result<usize> {
    let mut indices: Vec<usize> = file
        .names_under(prefix)
        .iter()
        .filter_map(|n| n[prefix.len() + 1..].split('.').next()?.parse().ok())
        .collect();
    indices.sort_unstable();
    indices.dedup();
    for (expected, &found) in indices.iter().enumerate() {
        if expected != found {
            candle::bail!(
                "layer {prefix}.{expected} is missing: found layers {:?} under '{prefix}'",
                indices
            )
        }
    }
    Ok(indices.len())
}

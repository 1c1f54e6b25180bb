//! The position-wise feed-forward network, `linear2(dropout(act(linear1(x))))` (paper eq. 2).

use super::config::{Activation, TransformerConfig};
use crate::projection::Projection;
use crate::weights::WeightSource;
use candle::{Module, Tensor};
use candle_nn::Init;

/// Two linear layers around an activation. Tensor names: `linear1.{weight,bias}`
/// `(dim_feedforward, d_model)`, `linear2.{weight,bias}` `(d_model, dim_feedforward)`, which is
/// how torch's Transformer layers name them (directly under the layer's prefix); `fc1`, `fc2`
/// with [`crate::transformer::LayerNaming::HuggingFace`].
#[derive(Clone, Debug)]
pub struct FeedForward {
    linear1: Projection,
    linear2: Projection,
    activation: Activation,
    dropout: f32,
}

impl FeedForward {
    /// `linear1` and `linear2` under `source`'s prefix: read (a projection weight in place
    /// where the source has it so), or created with candle-nn's `linear` initialisation
    /// (kaiming-normal weights, biases uniform in `±1/sqrt(in)`).
    pub fn new(cfg: &TransformerConfig, source: &WeightSource) -> candle::Result<Self> {
        let linear = |inp: usize, out: usize, name: &str| -> candle::Result<Projection> {
            let src = source.pp(name);
            let w = src.matrix(
                (out, inp),
                "weight",
                candle_nn::init::DEFAULT_KAIMING_NORMAL,
            )?;
            let bound = 1. / (inp as f64).sqrt();
            let bias = cfg
                .bias
                .then(|| {
                    src.tensor(
                        out,
                        "bias",
                        Init::Uniform {
                            lo: -bound,
                            up: bound,
                        },
                    )
                })
                .transpose()?;
            Projection::from_matrix(w, bias)
        };
        let (name1, name2) = cfg.naming.linears();
        Ok(Self {
            linear1: linear(cfg.d_model, cfg.dim_feedforward, name1)?,
            linear2: linear(cfg.dim_feedforward, cfg.d_model, name2)?,
            activation: cfg.activation,
            dropout: cfg.dropout,
        })
    }

    /// `xs` `(B, T, d_model)` → `(B, T, d_model)`; dropout on the inner layer when `train`.
    pub fn forward(&self, xs: &Tensor, train: bool) -> candle::Result<Tensor> {
        let h = self.activation.apply(&self.linear1.forward(xs)?)?;
        self.linear2.forward(&dropout(&h, self.dropout, train)?)
    }
}

/// Dropout with probability `p` when `train`, identity otherwise.
pub(crate) fn dropout(xs: &Tensor, p: f32, train: bool) -> candle::Result<Tensor> {
    if train && p > 0.0 {
        candle_nn::ops::dropout(xs, p)
    } else {
        Ok(xs.clone())
    }
}

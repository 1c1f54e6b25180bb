//! The position-wise feed-forward network, `linear2(dropout(act(linear1(x))))` (paper eq. 2).

use super::config::{Activation, TransformerConfig};
use crate::projection::Projection;
use candle::{Module, Tensor};
use candle_nn::VarBuilder;

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
    /// Reads (or, from a `VarMap`, creates with torch's initialisation) `linear1` and `linear2`
    /// under `vb`.
    pub fn new(cfg: &TransformerConfig, vb: &VarBuilder) -> candle::Result<Self> {
        let linear = |inp, out, name: &str| -> candle::Result<Projection> {
            // Inside `with_mapped_weights`, the weight stays in the mapped file.
            let weight_name = crate::weights::join_name(&vb.prefix(), &format!("{name}.weight"));
            if let Some(w) = crate::projection::mapped::mapped_matrix(&weight_name, out, inp) {
                let bias = cfg.bias.then(|| vb.pp(name).get(out, "bias")).transpose()?;
                return Projection::from_mapped(w, bias);
            }
            let lin = if cfg.bias {
                candle_nn::linear(inp, out, vb.pp(name))?
            } else {
                candle_nn::linear_no_bias(inp, out, vb.pp(name))?
            };
            Projection::new(lin.weight(), lin.bias().cloned())
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

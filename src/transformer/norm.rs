//! Layer normalisation that keeps gradients.
//!
//! candle-nn's fused `layer_norm` kernel records no backward pass: a model trained through it
//! silently gets no gradient through its norms. [`LayerNorm`] uses a fused kernel for
//! inference (ours for CPU `f32`, `crate::simd::elementwise::layer_norm`, vectorised per
//! instruction set; candle-nn's otherwise) and the composed formula whenever the input is
//! tracked by autograd.

use candle::{DType, Module, Tensor, D};
use candle_nn::VarBuilder;

/// `y = (x - mean) / sqrt(var + eps) * weight + bias` over the last dimension, as
/// `torch.nn.LayerNorm`. Tensor names: `weight`, `bias` (`(d)` each).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    inner: candle_nn::LayerNorm,
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
}

impl LayerNorm {
    /// Reads (or, from a `VarMap`, creates as ones/zeros) `weight` and, if `bias`, `bias`.
    pub fn new(size: usize, eps: f64, bias: bool, vb: VarBuilder) -> candle::Result<Self> {
        let weight = vb.get_with_hints(size, "weight", candle_nn::Init::Const(1.0))?;
        let bias = bias
            .then(|| vb.get_with_hints(size, "bias", candle_nn::Init::Const(0.0)))
            .transpose()?;
        let inner = match &bias {
            Some(b) => candle_nn::LayerNorm::new(weight.clone(), b.clone(), eps),
            None => candle_nn::LayerNorm::new_no_bias(weight.clone(), eps),
        };
        Ok(Self {
            inner,
            weight,
            bias,
            eps,
        })
    }
}

impl Module for LayerNorm {
    /// `xs` `(..., d)` → same shape.
    fn forward(&self, xs: &Tensor) -> candle::Result<Tensor> {
        let tracked = xs.track_op() || self.weight.track_op();
        if !tracked {
            // CPU f32: our vectorised two-pass kernel (`crate::simd::elementwise`); anything
            // else candle's fused op.
            let isa = crate::simd::Isa::get();
            if let Some(ys) = crate::simd::elementwise::layer_norm(
                isa,
                xs,
                &self.weight,
                self.bias.as_ref(),
                self.eps,
            )? {
                return Ok(ys);
            }
            return self.inner.forward(xs);
        }
        let dtype = xs.dtype();
        let internal = match dtype {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let x = xs.to_dtype(internal)?;
        let x = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let var = x.sqr()?.mean_keepdim(D::Minus1)?;
        let x = x.broadcast_div(&(var + self.eps)?.sqrt()?)?;
        let x = x.to_dtype(dtype)?.broadcast_mul(&self.weight)?;
        match &self.bias {
            Some(b) => x.broadcast_add(b),
            None => Ok(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{Device, Var};
    use candle_nn::VarMap;

    #[test]
    fn fused_and_composed_agree_and_gradients_flow() {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let norm = LayerNorm::new(
            8,
            1e-5,
            true,
            VarBuilder::from_varmap(&varmap, DType::F32, &dev),
        )
        .unwrap();
        let x = Tensor::randn(0f32, 2., (3, 5, 8), &dev).unwrap();
        let fused = norm.inner.forward(&x).unwrap();
        let var = Var::from_tensor(&x).unwrap();
        let composed = norm.forward(var.as_tensor()).unwrap();
        let diff = (fused - &composed)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
        let loss = (composed.sqr().unwrap() * 0.5).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        assert!(
            grads.get(var.as_tensor()).is_some(),
            "gradient reaches the input"
        );
    }
}

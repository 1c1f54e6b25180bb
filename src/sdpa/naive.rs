//! The reference kernel: materialise the `(B, H, L, S)` scores, softmax, multiply by `V`.
//!
//! Built only from candle tensor ops, so it runs on every device and supports autograd. Its
//! memory grows as `B · H · L · S`; it is the path to use when the weights are needed.

use candle::{DType, Tensor, D};

/// Computes attention from validated inputs.
///
/// * `q` `(B, H, L, D)`, `k` `(B, H, S, D)`, `v` `(B, H, S, Dv)`, one float dtype.
/// * `bias`: optional additive `f32` mask broadcastable to `(B, H, L, S)` (`-inf` = blocked),
///   as produced by [`crate::Mask::to_bias`].
/// * Returns the output `(B, H, L, Dv)` and, if `need_weights`, the weights `(B, H, L, S)`,
///   both in the input dtype. Rows whose keys are all blocked are zeros.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    scale: f64,
    dropout: f32,
    need_weights: bool,
) -> candle::Result<(Tensor, Option<Tensor>)> {
    let in_dtype = q.dtype();
    let (b, h, l, _) = q.dims4()?;
    let s = k.dim(2)?;
    let dv = v.dim(3)?;
    if l == 0 || s == 0 {
        // No query, or no key to attend to: every row is "fully masked", hence zeros.
        let output = Tensor::zeros((b, h, l, dv), in_dtype, q.device())?;
        let weights = need_weights
            .then(|| Tensor::zeros((b, h, l, s), in_dtype, q.device()))
            .transpose()?;
        return Ok((output, weights));
    }
    // Half-precision inputs are computed in f32: the softmax of f16 scores loses too much.
    let compute_dtype = match in_dtype {
        DType::F16 | DType::BF16 => DType::F32,
        dt => dt,
    };
    let q = q.to_dtype(compute_dtype)?;
    let k = k.to_dtype(compute_dtype)?;
    let v = v.to_dtype(compute_dtype)?;

    let scores = (q.contiguous()?.matmul(&k.contiguous()?.t()?)? * scale)?;
    let scores = match bias {
        Some(bias) => scores.broadcast_add(&bias.to_dtype(compute_dtype)?)?,
        None => scores,
    };
    // candle-nn's fused softmax has no backward pass; use the composed one under autograd.
    let tracks_grad = [&q, &k, &v].iter().any(|t| t.track_op());
    let mut weights = if tracks_grad {
        candle_nn::ops::softmax(&scores, D::Minus(1))?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    if let Some(bias) = bias {
        weights = zero_fully_masked_rows(&weights, bias)?;
    }
    if dropout > 0.0 {
        weights = candle_nn::ops::dropout(&weights, dropout)?;
    }
    let output = weights.matmul(&v.contiguous()?)?.to_dtype(in_dtype)?;
    let weights = need_weights
        .then(|| weights.to_dtype(in_dtype))
        .transpose()?;
    Ok((output, weights))
}

/// Replaces the rows whose bias is `-inf` everywhere (softmax gives NaN there) by zeros.
/// `weights` `(B, H, L, S)`, `bias` broadcastable to it.
fn zero_fully_masked_rows(weights: &Tensor, bias: &Tensor) -> candle::Result<Tensor> {
    // "Every entry is -inf", not "the maximum is -inf": a max can skip NaN, and a NaN in the
    // bias must make the row NaN (as in torch), not zeros.
    let dead_rows = bias.eq(f64::NEG_INFINITY)?.min_keepdim(D::Minus1)?; // (B|1, H|1, L, 1), U8
    let dead = dead_rows.broadcast_as(weights.shape())?;
    let zeros =
        Tensor::zeros((), weights.dtype(), weights.device())?.broadcast_as(weights.shape())?;
    dead.where_cond(&zeros, weights)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::Device;

    #[test]
    fn a_fully_masked_row_gives_zeros_not_nan() {
        let dev = Device::Cpu;
        let q = Tensor::ones((1, 1, 2, 4), DType::F32, &dev).unwrap();
        let k = Tensor::ones((1, 1, 3, 4), DType::F32, &dev).unwrap();
        let v = Tensor::arange(0f32, 12., &dev)
            .unwrap()
            .reshape((1, 1, 3, 4))
            .unwrap();
        let inf = f32::NEG_INFINITY;
        let bias = Tensor::new(&[[inf, inf, inf], [0., inf, 0.]], &dev).unwrap();
        let (out, w) = attention(&q, &k, &v, Some(&bias), 0.5, 0.0, true).unwrap();
        let out: Vec<Vec<f32>> = out
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        let w: Vec<Vec<f32>> = w
            .unwrap()
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2()
            .unwrap();
        assert_eq!(out[0], vec![0.0; 4]);
        assert_eq!(w[0], vec![0.0; 3]);
        assert_eq!(w[1], vec![0.5, 0.0, 0.5]);
        assert_eq!(out[1], vec![4.0, 5.0, 6.0, 7.0]);
    }

    #[test]
    fn empty_key_sequence_gives_zeros() {
        let dev = Device::Cpu;
        let q = Tensor::ones((2, 3, 4, 8), DType::F32, &dev).unwrap();
        let k = Tensor::ones((2, 3, 0, 8), DType::F32, &dev).unwrap();
        let v = Tensor::ones((2, 3, 0, 5), DType::F32, &dev).unwrap();
        let (out, w) = attention(&q, &k, &v, None, 1.0, 0.0, true).unwrap();
        assert_eq!(out.dims(), &[2, 3, 4, 5]);
        assert_eq!(
            out.abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
        assert_eq!(w.unwrap().dims(), &[2, 3, 4, 0]);
    }
}

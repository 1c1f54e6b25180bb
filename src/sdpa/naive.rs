//! The reference kernel: materialise the `(B, H, L, S)` scores, softmax, multiply by `V`.
//!
//! Built only from candle tensor ops, so it runs on every device and supports autograd. Its
//! memory grows as `B · H · L · S`; it is the path to use when the weights are needed.

use candle::{DType, Tensor, D};

/// Computes attention from validated inputs.
///
/// * `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)`, one float dtype, `Hkv`
///   dividing `H` (grouped-query attention: query head `h` uses key/value head
///   `h / (H / Hkv)`).
/// * `bias`: optional additive `f32` mask broadcastable to `(B, H, L, S)` (`-inf` = blocked),
///   as produced by [`crate::Mask::to_bias`].
/// * Returns the output `(B, H, L, Dv)` and, if `need_weights`, the weights `(B, H, L, S)`,
///   both in the input dtype. Rows whose keys are all blocked are zeros, and so is their
///   gradient.
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
    let (b, h, l, d) = q.dims4()?;
    let (hkv, s) = (k.dim(1)?, k.dim(2)?);
    let dv = v.dim(3)?;
    if l == 0 || s == 0 {
        // No query, or no key to attend to: every row is "fully masked", hence zeros.
        let output = Tensor::zeros((b, h, l, dv), in_dtype, q.device())?;
        let weights = need_weights
            .then(|| Tensor::zeros((b, h, l, s), in_dtype, q.device()))
            .transpose()?;
        return Ok((output, weights));
    }
    if hkv == 0 || !h.is_multiple_of(hkv) {
        candle::bail!(
            "the {h} query heads must be a multiple of the {hkv} key/value heads: query {:?}, key {:?}",
            q.dims(),
            k.dims()
        )
    }
    let group = h / hkv;
    // Half-precision inputs are computed in f32: the softmax of f16 scores loses too much.
    let compute_dtype = match in_dtype {
        DType::F16 | DType::BF16 => DType::F32,
        dt => dt,
    };
    let q = q.to_dtype(compute_dtype)?;
    let k = k.to_dtype(compute_dtype)?;
    let v = v.to_dtype(compute_dtype)?;

    // The `group` query heads of one key/value head are consecutive: as one `(G·L, D)` matrix
    // they take one product with that head's keys, so K and V are never repeated per head.
    let q_grouped = q.contiguous()?.reshape((b, hkv, group * l, d))?;
    let scores = (q_grouped.matmul(&k.contiguous()?.t()?)? * scale)?.reshape((b, h, l, s))?;
    // A row whose keys are all blocked would softmax `-inf - (-inf)` = NaN, and the backward
    // pass would carry that NaN into every key of the head even though the row is zeroed
    // afterwards. Such rows get a neutral bias (all 0) instead, and zero weights below.
    let (scores, dead_rows) = match bias {
        Some(bias) => {
            let bias = bias.to_dtype(compute_dtype)?;
            match fully_masked_rows(&bias)? {
                Some(dead) => {
                    let zeros = Tensor::zeros((), bias.dtype(), bias.device())?
                        .broadcast_as(bias.shape())?;
                    let safe_bias = dead.broadcast_as(bias.shape())?.where_cond(&zeros, &bias)?;
                    (scores.broadcast_add(&safe_bias)?, Some(dead))
                }
                None => (scores.broadcast_add(&bias)?, None),
            }
        }
        None => (scores, None),
    };
    // candle-nn's fused softmax has no backward pass; use the composed one under autograd.
    let tracks_grad =
        [&q, &k, &v].iter().any(|t| t.track_op()) || bias.is_some_and(|t| t.track_op());
    let mut weights = if tracks_grad {
        candle_nn::ops::softmax(&scores, D::Minus(1))?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    if let Some(dead) = dead_rows {
        let dead = dead.broadcast_as(weights.shape())?;
        let zeros =
            Tensor::zeros((), weights.dtype(), weights.device())?.broadcast_as(weights.shape())?;
        weights = dead.where_cond(&zeros, &weights)?;
    }
    if dropout > 0.0 {
        weights = candle_nn::ops::dropout(&weights, dropout)?;
    }
    let output = weights
        .reshape((b, hkv, group * l, s))?
        .matmul(&v.contiguous()?)?
        .reshape((b, h, l, dv))?
        .to_dtype(in_dtype)?;
    let weights = need_weights
        .then(|| weights.to_dtype(in_dtype))
        .transpose()?;
    Ok((output, weights))
}

/// The rows of `bias` (shape `(.., S)`) that are `-inf` everywhere, as a `U8` tensor of its
/// shape with the last dimension 1; `None` when there is no such row.
fn fully_masked_rows(bias: &Tensor) -> candle::Result<Option<Tensor>> {
    // "Every entry is -inf", not "the maximum is -inf": a max can skip NaN, and a NaN in the
    // bias must make the row NaN (as in torch), not zeros.
    let neg_inf = Tensor::full(f32::NEG_INFINITY, (), bias.device())?
        .to_dtype(bias.dtype())?
        .broadcast_as(bias.shape())?;
    let dead = bias.eq(&neg_inf)?.min_keepdim(D::Minus1)?;
    if !bias.device().is_cpu() {
        // Off the CPU, reading `any` back would wait for the device: always take the
        // (harmless when no row is dead) zeroing path instead.
        return Ok(Some(dead));
    }
    let any = dead.max_all()?.to_scalar::<u8>()? != 0;
    Ok(any.then_some(dead))
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

    #[test]
    fn a_fully_masked_row_has_a_zero_gradient_and_no_nan_anywhere() {
        let dev = Device::Cpu;
        let var = |shape: (usize, usize, usize, usize), seed: f64| {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            let v: Vec<f64> = (0..n).map(|i| ((i as f64 + seed) * 0.7).sin()).collect();
            candle::Var::from_vec(v, shape, &dev).unwrap()
        };
        let (q, k, v) = (
            var((1, 2, 2, 3), 0.5),
            var((1, 2, 3, 3), 1.5),
            var((1, 2, 3, 3), 2.5),
        );
        let inf = f64::NEG_INFINITY;
        // Query 0 sees no key; query 1 sees keys 0 and 2.
        let bias = Tensor::new(&[[inf, inf, inf], [0., inf, 0.]], &dev).unwrap();
        let (out, w) = attention(
            q.as_tensor(),
            k.as_tensor(),
            v.as_tensor(),
            Some(&bias),
            0.5,
            0.0,
            true,
        )
        .unwrap();
        let loss = (out.sum_all().unwrap() + w.unwrap().sqr().unwrap().sum_all().unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
            let g: Vec<f64> = grads
                .get(t.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert!(g.iter().all(|x| x.is_finite()), "{name}: {g:?}");
            if name == "q" {
                // Query 0 of each head has a constant (zero) output: zero gradient.
                for head in 0..2 {
                    assert_eq!(&g[head * 6..head * 6 + 3], &[0.0; 3], "{g:?}");
                }
            }
            if name == "k" {
                // Key 1 is blocked for every query: zero gradient.
                for head in 0..2 {
                    assert_eq!(&g[head * 9 + 3..head * 9 + 6], &[0.0; 3], "{g:?}");
                }
            }
        }
    }

    #[test]
    fn grouped_heads_equal_key_values_repeated_per_head() {
        let dev = Device::Cpu;
        let t = |shape: (usize, usize, usize, usize), seed: f32| {
            let n = shape.0 * shape.1 * shape.2 * shape.3;
            let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).cos()).collect();
            Tensor::from_vec(v, shape, &dev).unwrap()
        };
        let (q, k, v) = (
            t((2, 6, 3, 4), 0.1),
            t((2, 2, 5, 4), 0.2),
            t((2, 2, 5, 7), 0.3),
        );
        let repeat = |x: &Tensor| {
            let (b, h, s, d) = x.dims4().unwrap();
            x.unsqueeze(2)
                .unwrap()
                .broadcast_as((b, h, 3, s, d))
                .unwrap()
                .reshape((b, h * 3, s, d))
                .unwrap()
        };
        let (o1, w1) = attention(&q, &k, &v, None, 0.5, 0.0, true).unwrap();
        let (o2, w2) = attention(&q, &repeat(&k), &repeat(&v), None, 0.5, 0.0, true).unwrap();
        assert_eq!(o1.dims(), &[2, 6, 3, 7]);
        let diff = |a: &Tensor, b: &Tensor| -> Vec<f32> {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        assert!(diff(&o1, &o2).iter().all(|d| *d <= 1e-6));
        assert!(diff(&w1.unwrap(), &w2.unwrap()).iter().all(|d| *d <= 1e-6));
    }
}

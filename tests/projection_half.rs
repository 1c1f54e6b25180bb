//! `Projection` on bf16 and f16 weights (the half-precision GEMM: `vdpbf16ps` for bf16 where
//! the CPU has AVX-512 BF16, f16 converted into the f32 kernel's tiles), as a user meets it:
//! against an f64 reference computed from the same half-precision values, across shapes that
//! are not multiples of the kernel's tiles (6 rows, 64 columns, 2 inputs per bf16 pair, 128-
//! pair chunks), narrowed outputs (the fused Q/K/V projection), and ranks 1 to 3.
//!
//! The bound: the output is the exact sum rounded once to the dtype (round to nearest even,
//! half an ulp: 2⁻⁹ relative for bf16, 2⁻¹¹ for f16), plus the f32 accumulation's error
//! (well under 1e-6 of `Σ |x w|` at these sizes); the test allows one ulp of the dtype
//! (`2⁻⁸` resp. `2⁻¹⁰` of `|y|`), so a result rounded to the wrong neighbour by an
//! accumulation-order difference still passes, while any error in packing, pairing or
//! bias (a missing or doubled input) fails.

mod common;

use candle::{DType, Device, Module, Tensor};
use candle_attention::projection::Projection;
use candle_attention::testing::{self, available_isas};
use candle_attention::{MultiHeadAttention, MultiHeadAttentionConfig};
use candle_nn::VarBuilder;
use std::collections::HashMap;

/// Uniform values in [-1, 1) rounded to `dtype`.
fn rand(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    common::uniform(shape, seed).to_dtype(dtype).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Checks `y` `(m, n)` against `x` `(m, k)` · `w[rows]ᵀ` + `b[rows]` in f64.
fn check(y: &Tensor, x: &Tensor, w: &Tensor, b: Option<&Tensor>, ulp: f64, what: &str) {
    let (m, k) = x.dims2().unwrap();
    let n = y.dim(1).unwrap();
    let (yv, xv, wv) = (values(y), values(x), values(w));
    let bv = b.map(values);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut mag) = (bv.as_ref().map_or(0.0, |b| b[j]), 0.0);
            for kk in 0..k {
                s += xv[i * k + kk] * wv[j * k + kk];
                mag += (xv[i * k + kk] * wv[j * k + kk]).abs();
            }
            let got = yv[i * n + j];
            let bound = ulp * s.abs() + 1e-6 * mag + 1e-30;
            assert!(
                (got - s).abs() <= bound,
                "{what}: m={m} k={k} n={n} at ({i}, {j}): {got} vs {s} (bound {bound:e})"
            );
        }
    }
}

const SHAPES: [(usize, usize, usize); 9] = [
    (1, 1, 1),
    (1, 3, 5),
    (5, 7, 63),
    (6, 2, 64),
    (7, 255, 65),
    (13, 257, 130),
    (73, 64, 17),
    (130, 300, 129),
    (150, 513, 200),
];

#[test]
fn half_projection_matches_f64_at_odd_shapes() {
    for (dtype, ulp) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-10))] {
        for (s, &(m, k, n)) in SHAPES.iter().enumerate() {
            let s = s as u64 * 10;
            let w = rand(&[n, k], s + 1, dtype);
            let b = rand(&[n], s + 2, dtype);
            let x = rand(&[m, k], s + 3, dtype);
            for bias in [None, Some(b.clone())] {
                let p = Projection::new(&w, bias.clone()).unwrap();
                assert_eq!(p.dtype(), dtype);
                // At every instruction set the process can run.
                for isa in available_isas() {
                    let y = testing::projection::forward(&p, &x, isa).unwrap();
                    assert_eq!(y.dtype(), dtype);
                    assert_eq!(y.dims(), &[m, n]);
                    let what = format!("{dtype:?} {isa} bias={}", bias.is_some());
                    check(&y, &x, &w, bias.as_ref(), ulp, &what);
                }
            }
        }
    }
}

/// Outputs `start .. start + len` of a packed weight, at offsets inside a panel and across
/// panel edges: what the fused Q/K/V projection hands to each of Q, K and V.
#[test]
fn narrowed_half_projections_equal_their_rows() {
    for (dtype, ulp) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-10))] {
        let (n, k, m) = (200, 37, 11);
        let w = rand(&[n, k], 40, dtype);
        let b = rand(&[n], 41, dtype);
        let x = rand(&[m, k], 42, dtype);
        let p = Projection::new(&w, Some(b.clone())).unwrap();
        for (start, len) in [(0, 64), (1, 63), (37, 100), (64, 64), (130, 70), (199, 1)] {
            let q = p.narrow_outputs(start, len).unwrap();
            let wn = w.narrow(0, start, len).unwrap();
            let bn = b.narrow(0, start, len).unwrap();
            for isa in available_isas() {
                check(
                    &testing::projection::forward(&q, &x, isa).unwrap(),
                    &x,
                    &wn,
                    Some(&bn),
                    ulp,
                    &format!("{dtype:?} {isa} outputs {start}..{}", start + len),
                );
            }
            // The weight and bias a user reads back are the rows given, exactly.
            let back = q.weight().unwrap();
            assert_eq!(back.dtype(), dtype);
            assert_eq!(
                values(&back),
                values(&wn),
                "{dtype:?} weight() rows {start}"
            );
            assert_eq!(values(q.bias().unwrap()), values(&bn));
        }
    }
}

/// Batched (rank 3), unbatched rank 1 and strided inputs give the rows of the matrix product.
#[test]
fn half_projection_takes_any_rank_and_strided_inputs() {
    for dtype in [DType::BF16, DType::F16] {
        let w = rand(&[70, 33], 50, dtype);
        let b = rand(&[70], 51, dtype);
        let p = Projection::new(&w, Some(b)).unwrap();
        let x = rand(&[2, 9, 33], 52, dtype);
        let flat = p.forward(&x.reshape((18, 33)).unwrap()).unwrap();
        let y3 = p.forward(&x).unwrap();
        assert_eq!(y3.dims(), &[2, 9, 70]);
        assert_eq!(values(&y3), values(&flat));
        let y1 = p.forward(&x.get(1).unwrap().get(4).unwrap()).unwrap();
        assert_eq!(y1.dims(), &[70]);
        assert_eq!(values(&y1), values(&flat.get(13).unwrap()));
        // A transposed (non-contiguous) input.
        let xt = rand(&[33, 9], 53, dtype).t().unwrap();
        let want = p.forward(&xt.contiguous().unwrap()).unwrap();
        assert_eq!(values(&p.forward(&xt).unwrap()), values(&want));
        // Mixed dtypes are an error that names both.
        let err = p
            .forward(&x.to_dtype(DType::F32).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("F32") && err.contains(&format!("{dtype:?}")),
            "{err}"
        );
    }
}

/// Values where rounding matters: a large bias with small products (the sum must be rounded
/// once, from f32, not after the bias alone), infinities and NaN propagate.
#[test]
fn half_projection_rounds_once_and_propagates_non_finite_values() {
    for dtype in [DType::BF16, DType::F16] {
        // y = 256 + 0.75 + 0.75: exact 257.5; rounded twice (256 + 0.75 → 256, + 0.75 → 256)
        // it would be 256 in bf16 (spacing 2 at 256).
        let w = Tensor::new(&[[1f32, 1.0]], &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let b = Tensor::new(&[256f32], &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let x = Tensor::new(
            &[[0.75f32, 0.75], [f32::INFINITY, 1.0], [f32::NAN, 0.0]],
            &Device::Cpu,
        )
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
        let p = Projection::new(&w, Some(b)).unwrap();
        let y = values(&p.forward(&x).unwrap());
        let want = half_round(257.5, dtype);
        assert_eq!(y[0], want, "{dtype:?}");
        assert_eq!(y[1], f64::INFINITY, "{dtype:?}");
        assert!(y[2].is_nan(), "{dtype:?}");
    }
}

fn half_round(v: f32, dtype: DType) -> f64 {
    Tensor::new(&[v], &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()[0]
}

/// Self-attention in bf16/f16 through the fused projection equals the same weights run in
/// f32 within the dtype's precision (2e-2 bf16, 2e-3 f16, the tolerances of the crate's
/// half-precision attention tests; inputs in [-1, 1], weights scaled as torch initialises
/// them, `±1/sqrt(E)`, so that every activation is of order one).
#[test]
fn half_self_attention_follows_f32() {
    let (e, h, n) = (64, 4, 13);
    let scaled =
        |shape: &[usize], seed| (rand(shape, seed, DType::F32) / (e as f64).sqrt()).unwrap();
    let mut tensors = HashMap::new();
    tensors.insert("in_proj_weight".to_string(), scaled(&[3 * e, e], 60));
    tensors.insert("in_proj_bias".to_string(), scaled(&[3 * e], 61));
    tensors.insert("out_proj.weight".to_string(), scaled(&[e, e], 62));
    tensors.insert("out_proj.bias".to_string(), scaled(&[e], 63));
    let x = rand(&[2, n, e], 64, DType::F32);
    let load = |dtype: DType| {
        let t: HashMap<String, Tensor> = tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.to_dtype(dtype).unwrap()))
            .collect();
        let vb = VarBuilder::from_tensors(t, dtype, &Device::Cpu);
        MultiHeadAttention::load(MultiHeadAttentionConfig::new(e, h), vb).unwrap()
    };
    let want = load(DType::F32).forward(&x).unwrap();
    for (dtype, tol) in [(DType::BF16, 2e-2), (DType::F16, 2e-3)] {
        // The f32 reference runs on the half-precision inputs and weights, so the difference
        // is the half-precision computation's own error.
        let xh = x.to_dtype(dtype).unwrap();
        let mha = load(dtype);
        let want32 = {
            let t: HashMap<String, Tensor> = tensors
                .iter()
                .map(|(k, v)| {
                    let v = v.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap();
                    (k.clone(), v)
                })
                .collect();
            let vb = VarBuilder::from_tensors(t, DType::F32, &Device::Cpu);
            MultiHeadAttention::load(MultiHeadAttentionConfig::new(e, h), vb)
                .unwrap()
                .forward(&xh.to_dtype(DType::F32).unwrap())
                .unwrap()
        };
        let got = mha.forward(&xh).unwrap();
        assert_eq!(got.dtype(), dtype);
        let got = got.to_dtype(DType::F32).unwrap();
        let d = common::max_abs_diff(&got, &want32);
        eprintln!("{dtype:?}: max |Δ| {d} against f32 on the same values");
        assert!(d <= tol, "{dtype:?}: max |Δ| {d} > {tol}");
        assert!(common::max_abs_diff(&got, &want) <= 2.0 * tol);
    }
}

/// A shared (tied) half-precision table is packed as `Projection::new` packs it (a copy:
/// candle's half-precision matmul on a view of it transposed the whole table at every call, 10x
/// slower at a decoding step of an opus-mt model) and computes exactly as that projection.
#[test]
fn shared_half_tables_compute_as_packed_ones() {
    for dtype in [DType::BF16, DType::F16] {
        let (n, k, m) = (90, 40, 7);
        let w = rand(&[n, k], 70, dtype);
        let b = rand(&[n], 71, dtype);
        let x = rand(&[m, k], 72, dtype);
        let shared = Projection::shared(&w, Some(b.clone())).unwrap();
        assert_eq!(shared.dtype(), dtype);
        assert_eq!(values(&shared.weight().unwrap()), values(&w), "{dtype:?}");
        let packed = Projection::new(&w, Some(b)).unwrap();
        assert_eq!(
            values(&shared.forward(&x).unwrap()),
            values(&packed.forward(&x).unwrap()),
            "{dtype:?}"
        );
    }
}

//! `Projection` (the linear layers of attention and the feed-forward network) as a user meets
//! it: the same answers as candle-nn's `Linear` on every path (the packed CPU GEMM, candle's
//! ops for `Var`s and other dtypes), the fused Q/K/V projection of `MultiHeadAttention`, and
//! errors that name the shapes.

mod common;

use candle::{DType, Device, Module, Tensor, Var};
use candle_attention::projection::Projection;
use candle_attention::testing::{self, available_isas};
use candle_attention::{AttentionArgs, MultiHeadAttention, MultiHeadAttentionConfig};
use candle_nn::VarBuilder;
use common::compare;
use proptest::prelude::*;
use std::collections::HashMap;

fn randn(shape: &[usize], seed: u64) -> Tensor {
    common::uniform(shape, seed)
}

/// `x Wᵀ + b` with candle-nn's `Linear`, the reference (which needs a matrix: other ranks
/// are flattened to one and back).
fn reference(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let k = *x.dims().last().unwrap();
    let mut out_shape = x.dims().to_vec();
    *out_shape.last_mut().unwrap() = w.dim(0).unwrap();
    candle_nn::Linear::new(w.clone(), b.cloned())
        .forward(&x.reshape(((), k)).unwrap())
        .unwrap()
        .reshape(out_shape)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The packed GEMM equals candle-nn's `Linear` for any sizes (across the 72-row blocks,
    /// 64-column panels, 16-column slices and 512-input chunks), with or without bias, for
    /// inputs of rank 1 to 4, at every instruction set.
    #[test]
    fn packed_projection_equals_candle_linear(
        m in 1usize..150, k in 1usize..300, n in 1usize..140,
        bias in any::<bool>(), rank in 1usize..5, seed in 0u64..1000,
    ) {
        let w = randn(&[n, k], seed);
        let b = bias.then(|| randn(&[n], seed + 1));
        let lead: Vec<usize> = match rank {
            1 => vec![],
            2 => vec![m],
            3 => vec![2, m.div_ceil(2)],
            _ => vec![1, 2, m.div_ceil(2)],
        };
        let mut shape = lead.clone();
        shape.push(k);
        let x = randn(&shape, seed + 2);
        let p = Projection::new(&w, b.clone()).unwrap();
        let mut want_shape = lead;
        want_shape.push(n);
        let want = reference(&x, &w, b.as_ref());
        // At every instruction set the process can run (portable, AVX2, AVX-512...).
        for isa in available_isas() {
            let got = testing::projection::forward(&p, &x, isa).unwrap();
            prop_assert_eq!(got.dims(), &want_shape[..]);
            compare(&got, &want, 1e-5, 1e-5).map_err(|e| TestCaseError::fail(format!("{isa}: {e}")))?;
        }
    }
}

#[test]
fn narrowed_outputs_equal_the_rows_of_the_weight_at_any_offset() {
    // 300 outputs: the narrowings start inside the 64-column panels; 15 rows, and the one or
    // two rows of decoding (whose AVX2 tiles take 32-column slices), at every level.
    let (k, n) = (70, 300);
    let w = randn(&[n, k], 1);
    let b = randn(&[n], 2);
    let inputs = [randn(&[3, 5, k], 3), randn(&[1, k], 4), randn(&[2, k], 5)];
    let p = Projection::new(&w, Some(b.clone())).unwrap();
    for (start, len) in [
        (0, 100),
        (100, 100),
        (37, 1),
        (200, 100),
        (63, 130),
        (299, 1),
        (5, 27),
        (40, 33),
    ] {
        let part = p.narrow_outputs(start, len).unwrap();
        assert_eq!((part.in_features(), part.out_features()), (k, len));
        for x in &inputs {
            let want = reference(
                x,
                &w.narrow(0, start, len).unwrap(),
                Some(&b.narrow(0, start, len).unwrap()),
            );
            for isa in available_isas() {
                let got = testing::projection::forward(&part, x, isa).unwrap();
                compare(&got, &want, 1e-5, 1e-5)
                    .unwrap_or_else(|e| panic!("{isa} {:?} {start}+{len}: {e}", x.dims()));
            }
        }
        compare(
            &part.weight().unwrap(),
            &w.narrow(0, start, len).unwrap(),
            0.0,
            0.0,
        )
        .unwrap();
    }
    let err = p.narrow_outputs(250, 51).unwrap_err().to_string();
    assert!(
        err.contains("250..301") && err.contains("300 outputs"),
        "{err}"
    );
}

#[test]
fn strided_inputs_and_other_dtypes_give_the_same_answer() {
    let w = randn(&[48, 40], 4);
    let b = randn(&[48], 5);
    let p = Projection::new(&w, Some(b.clone())).unwrap();
    // A transposed (non-contiguous) input.
    let xt = randn(&[40, 9], 6).t().unwrap();
    let want = reference(&xt.contiguous().unwrap(), &w, Some(&b));
    compare(&p.forward(&xt).unwrap(), &want, 1e-5, 1e-5).unwrap();
    // f64 weights take candle's ops.
    let w64 = w.to_dtype(DType::F64).unwrap();
    let b64 = b.to_dtype(DType::F64).unwrap();
    let p64 = Projection::new(&w64, Some(b64)).unwrap();
    assert_eq!(p64.dtype(), DType::F64);
    let got = p64
        .forward(&xt.to_dtype(DType::F64).unwrap())
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    compare(&got, &want, 1e-5, 1e-5).unwrap();
}

#[test]
fn empty_inputs_and_zero_input_features() {
    let p = Projection::new(&randn(&[6, 4], 7), Some(randn(&[6], 8))).unwrap();
    let y = p
        .forward(&Tensor::zeros((2, 0, 4), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(y.dims(), &[2, 0, 6]);
    // No input features: the output is the bias.
    let b = randn(&[3], 9);
    let p0 = Projection::new(
        &Tensor::zeros((3, 0), DType::F32, &Device::Cpu).unwrap(),
        Some(b.clone()),
    )
    .unwrap();
    let y0 = p0
        .forward(&Tensor::zeros((2, 0), DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    compare(
        &y0,
        &b.unsqueeze(0).unwrap().broadcast_as((2, 3)).unwrap(),
        0.0,
        0.0,
    )
    .unwrap();
}

#[test]
fn bad_shapes_and_dtypes_are_errors_that_name_them() {
    let w = randn(&[6, 4], 10);
    let err = Projection::new(&w, Some(randn(&[5], 11)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("(6)") && err.contains("[5]"), "{err}");
    let err = Projection::new(&randn(&[2, 3, 4], 12), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[2, 3, 4]"), "{err}");
    let p = Projection::new(&w, None).unwrap();
    let err = p.forward(&randn(&[2, 5], 13)).unwrap_err().to_string();
    assert!(
        err.contains("expects 4 input features") && err.contains("[2, 5]"),
        "{err}"
    );
    let err = p
        .forward(&randn(&[2, 4], 14).to_dtype(DType::F64).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("F64") && err.contains("F32"), "{err}");
}

#[test]
fn a_var_weight_is_trained_in_place_and_gets_gradients() {
    let w = Var::from_tensor(&randn(&[5, 3], 15)).unwrap();
    let p = Projection::new(w.as_tensor(), None).unwrap();
    let x = randn(&[4, 3], 16);
    let before = p.forward(&x).unwrap();
    compare(&before, &reference(&x, w.as_tensor(), None), 1e-6, 1e-6).unwrap();
    // Gradients reach the Var through the projection.
    let grads = p
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gw = grads.get(w.as_tensor()).expect("a gradient for the weight");
    // d/dW Σ x Wᵀ = 1ᵀ x for every output row.
    let want = x
        .sum_keepdim(0)
        .unwrap()
        .broadcast_as((5, 3))
        .unwrap()
        .contiguous()
        .unwrap();
    compare(gw, &want, 1e-6, 1e-6).unwrap();
    // An optimizer's update is seen by the next forward pass.
    w.set(&randn(&[5, 3], 17)).unwrap();
    compare(
        &p.forward(&x).unwrap(),
        &reference(&x, w.as_tensor(), None),
        1e-6,
        1e-6,
    )
    .unwrap();
}

fn hf_block(e: usize, h: usize, seed: u64) -> (MultiHeadAttention, HashMap<String, Tensor>) {
    let mut ts = HashMap::new();
    for (i, name) in ["q_proj", "k_proj", "v_proj", "out_proj"]
        .iter()
        .enumerate()
    {
        ts.insert(
            format!("{name}.weight"),
            randn(&[e, e], seed + 2 * i as u64),
        );
        ts.insert(format!("{name}.bias"), randn(&[e], seed + 2 * i as u64 + 1));
    }
    let vb = VarBuilder::from_tensors(ts.clone(), DType::F32, &Device::Cpu);
    (
        MultiHeadAttention::load(MultiHeadAttentionConfig::new(e, h), vb).unwrap(),
        ts,
    )
}

#[test]
fn self_attention_through_the_fused_projection_equals_separate_projections() {
    // E = 100: Q, K and V start inside the packed panels of the fused (3E, E) weight.
    for (e, h) in [(100, 4), (128, 8)] {
        let (mha, _) = hf_block(e, h, 20);
        let x = randn(&[2, 9, e], 21);
        // The same tensor three times takes the fused path; copies (other tensors with the
        // same values) take the three separate projections.
        let fused = mha.attend(&x, &x, &x, &AttentionArgs::default()).unwrap();
        let (xk, xv) = (x.copy().unwrap(), x.copy().unwrap());
        let separate = mha.attend(&x, &xk, &xv, &AttentionArgs::default()).unwrap();
        compare(&fused.output, &separate.output, 1e-6, 1e-6).unwrap();
        // Encoder-decoder attention: key and value are the same memory tensor.
        let memory = randn(&[2, 13, e], 22);
        let kv = mha
            .attend(&x, &memory, &memory, &AttentionArgs::default())
            .unwrap();
        let m2 = memory.copy().unwrap();
        let kv_separate = mha
            .attend(&x, &memory, &m2, &AttentionArgs::default())
            .unwrap();
        compare(&kv.output, &kv_separate.output, 1e-6, 1e-6).unwrap();
    }
}

#[test]
fn hugging_face_projections_equal_the_tensors_they_were_loaded_from() {
    // The separate q/k/v tensors are concatenated into one packed weight: each projection
    // must still be exactly `x Wᵀ + b` of its own tensors.
    let (e, h) = (96, 4);
    let (mha, ts) = hf_block(e, h, 30);
    let x = randn(&[1, 5, e], 31);
    let q = mha.project_query(&x).unwrap();
    let (k, v) = mha.project_key_value(&x, &x).unwrap();
    for (name, got) in [("q_proj", q), ("k_proj", k), ("v_proj", v)] {
        let want = reference(
            &x,
            &ts[&format!("{name}.weight")],
            Some(&ts[&format!("{name}.bias")]),
        )
        .reshape((1, 5, h, e / h))
        .unwrap()
        .transpose(1, 2)
        .unwrap();
        compare(&got, &want, 1e-5, 1e-5).unwrap_or_else(|m| panic!("{name}: {m}"));
    }
}

/// A projection sharing its weight tensor (a tied output head) computes what a packed one does,
/// at every instruction set (the in-place row kernel below 96 rows, strips transposed into the
/// packed GEMM from 96 on).
#[test]
fn shared_weight_projection_equals_the_packed_one() {
    use candle::{Device, Tensor};
    use candle_attention::projection::Projection;
    let dev = Device::Cpu;
    for (m, out, inp) in [
        (1, 70, 33),
        (2, 67, 40),
        (3, 9, 7),
        (5, 130, 64),
        (32, 9, 16),
        (97, 131, 71),
    ] {
        let w = Tensor::randn(0f32, 1., (out, inp), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., out, &dev).unwrap();
        let x = Tensor::randn(0f32, 1., (m, inp), &dev).unwrap();
        let packed = Projection::new(&w, Some(b.clone())).unwrap();
        let shared = Projection::shared(&w, Some(b)).unwrap();
        assert_eq!(shared.weight().unwrap().dims(), &[out, inp]);
        for (p, q) in [
            (packed.clone(), shared.clone()),
            (
                packed.narrow_outputs(3, 5).unwrap(),
                shared.narrow_outputs(3, 5).unwrap(),
            ),
        ] {
            for isa in available_isas() {
                let y = testing::projection::forward(&p, &x, isa).unwrap();
                let z = testing::projection::forward(&q, &x, isa).unwrap();
                let d: Vec<f32> = (y - z)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                assert!(d.iter().all(|v| *v <= 1e-4), "{isa} {m}x{out}x{inp}: {d:?}");
            }
        }
    }
}

/// A weight read in place that keeps being multiplied by 96 rows or more is packed once (on
/// the second such product) and read from the panels after: the answers stay the same, bit for
/// bit, at every instruction set, whole and narrowed.
#[test]
fn a_shared_weight_packed_after_repeated_large_products_gives_the_same_answers() {
    let dev = Device::Cpu;
    for (m, out, inp) in [(96, 70, 33), (130, 200, 512), (200, 65, 700)] {
        let w = Tensor::randn(0f32, 1., (out, inp), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., out, &dev).unwrap();
        let x = Tensor::randn(0f32, 1., (m, inp), &dev).unwrap();
        let want = reference(&x, &w, Some(&b));
        for isa in available_isas() {
            // Fresh projections for each level, so each one packs with its own kernels.
            let shared = Projection::shared(&w, Some(b.clone())).unwrap();
            let narrowed = shared.narrow_outputs(5, out - 7).unwrap();
            let first = testing::projection::forward(&shared, &x, isa).unwrap();
            let first_narrowed = testing::projection::forward(&narrowed, &x, isa).unwrap();
            compare(&first, &want, 1e-4, 1e-4).unwrap();
            for call in 0..3 {
                let again = testing::projection::forward(&shared, &x, isa).unwrap();
                let again_narrowed = testing::projection::forward(&narrowed, &x, isa).unwrap();
                let same = |a: &Tensor, b: &Tensor| {
                    a.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                        == b.flatten_all().unwrap().to_vec1::<f32>().unwrap()
                };
                assert!(same(&again, &first), "{isa} {m}x{out}x{inp}, call {call}");
                assert!(
                    same(&again_narrowed, &first_narrowed),
                    "{isa} {m}x{out}x{inp} narrowed, call {call}"
                );
            }
        }
    }
}

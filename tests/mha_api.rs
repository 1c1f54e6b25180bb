//! The public API as a user meets it: Module, masks, fresh weights and training, dropout, and
//! the invariants that tie the mask kinds together.

mod common;

use candle::{DType, Device, Tensor, D};
use candle_attention::{
    scaled_dot_product_attention, AttentionArgs, Mask, MhaLayout, MultiHeadAttention,
    MultiHeadAttentionConfig, SdpaArgs, TensorFile,
};
use candle_nn::{VarBuilder, VarMap};
use common::{compare, mha_fixtures};
use proptest::prelude::*;

fn paper_block() -> MultiHeadAttention {
    let file = TensorFile::open(mha_fixtures().join("paper_e512_h8.weights.safetensors")).unwrap();
    MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(512, 8),
        file.var_builder(DType::F32, &Device::Cpu),
    )
    .unwrap()
}

/// Largest `|x|`, NaN if any entry is NaN (candle's `max` and `f32::max` skip NaN, which would
/// let `max_abs(..) == 0.0` or `<= bound` pass on a NaN tensor).
fn max_abs(t: &Tensor) -> f32 {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .fold(0f32, |m, x| {
            if x.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(x.abs())
            }
        })
}

#[test]
fn module_forward_is_unmasked_self_attention_batched_or_not() {
    let mha = paper_block();
    let x = Tensor::randn(0f32, 1., (2, 7, 512), &Device::Cpu).unwrap();
    let y = mha.forward(&x).unwrap();
    let z = mha.attend(&x, &x, &x, &AttentionArgs::default()).unwrap();
    assert_eq!(y.dims(), &[2, 7, 512]);
    assert!(z.weights.is_none());
    assert_eq!(max_abs(&(&y - &z.output).unwrap()), 0.0);
    let row = x.get(1).unwrap();
    let y1 = mha.forward(&row).unwrap();
    compare(&y1, &y.get(1).unwrap(), 1e-5, 1e-5).unwrap();
}

#[test]
fn a_query_with_every_key_masked_gets_zero_attention() {
    let dev = Device::Cpu;
    let file = TensorFile::open(mha_fixtures().join("self_default.weights.safetensors")).unwrap();
    let mha = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(16, 4),
        file.var_builder(DType::F32, &dev),
    )
    .unwrap();
    let out_bias = file.load("out_proj.bias", &dev).unwrap();
    let x = Tensor::randn(0f32, 1., (2, 3, 16), &dev).unwrap();
    // Batch 1: every key is padding. Batch 0: query 0 blocked everywhere by the attention mask.
    let pad = Tensor::new(&[[0u8, 0, 0], [1, 1, 1]], &dev).unwrap();
    let blocked = Tensor::new(&[[1u8, 1, 1], [0, 0, 0], [0, 1, 0]], &dev).unwrap();
    for need_weights in [true, false] {
        let args = AttentionArgs {
            mask: Mask::boolean(blocked.clone()).unwrap(),
            key_padding: Some(&pad),
            need_weights,
            ..Default::default()
        };
        let out = mha.attend(&x, &x, &x, &args).unwrap();
        let output = out.output;
        assert_eq!(
            output
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .filter(|v| v.is_nan())
                .count(),
            0
        );
        for (b, q) in [(0, 0), (1, 0), (1, 1), (1, 2)] {
            let row = output.get(b).unwrap().get(q).unwrap();
            assert_eq!(
                max_abs(&(row - &out_bias).unwrap()),
                0.0,
                "batch {b} query {q} is out_proj.bias"
            );
        }
        if let Some(w) = out.weights {
            let w: Vec<Vec<Vec<f32>>> = w.to_vec3().unwrap();
            assert_eq!(w[0][0], vec![0.0; 3]);
            assert_eq!(w[1], vec![vec![0.0; 3]; 3]);
            assert!((w[0][1].iter().sum::<f32>() - 1.0).abs() < 1e-6);
            assert_eq!(w[0][2][1], 0.0);
        }
    }
    // An additive mask of -inf everywhere is the same as blocked.
    let minus_inf = Tensor::full(f32::NEG_INFINITY, (3, 3), &dev).unwrap();
    let args = AttentionArgs {
        mask: Mask::additive(minus_inf).unwrap(),
        need_weights: true,
        ..Default::default()
    };
    let out = mha.attend(&x, &x, &x, &args).unwrap();
    assert_eq!(max_abs(&out.weights.unwrap()), 0.0);
}

#[test]
fn fresh_weights_are_named_and_initialised_like_torch_and_train() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let cfg = MultiHeadAttentionConfig::new(32, 4).with_add_bias_kv(true);
    let mha = MultiHeadAttention::new(cfg.clone(), vb.pp("attn")).unwrap();
    assert_eq!(mha.layout(), MhaLayout::TorchFused);
    let vars = varmap.data().lock().unwrap().clone();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "attn.bias_k",
            "attn.bias_v",
            "attn.in_proj_bias",
            "attn.in_proj_weight",
            "attn.out_proj.bias",
            "attn.out_proj.weight"
        ]
    );
    let w = vars["attn.in_proj_weight"].as_tensor();
    assert_eq!(w.dims(), &[96, 32]);
    let bound = (6.0f32 / (32.0 + 96.0)).sqrt();
    assert!(
        max_abs(w) <= bound && max_abs(w) > bound * 0.8,
        "xavier-uniform bound {bound}"
    );
    assert_eq!(max_abs(vars["attn.in_proj_bias"].as_tensor()), 0.0);
    assert_eq!(max_abs(vars["attn.out_proj.bias"].as_tensor()), 0.0);

    // Gradients reach every projection through the attention.
    let x = Tensor::randn(0f32, 1., (2, 5, 32), &dev).unwrap();
    let args = AttentionArgs {
        mask: Mask::causal(),
        ..Default::default()
    };
    let loss = mha
        .attend(&x, &x, &x, &args)
        .unwrap()
        .output
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap();
    let grads = loss.backward().unwrap();
    for name in [
        "attn.in_proj_weight",
        "attn.in_proj_bias",
        "attn.out_proj.weight",
        "attn.bias_k",
    ] {
        let g = grads
            .get(vars[name].as_tensor())
            .unwrap_or_else(|| panic!("no gradient for {name}"));
        assert!(max_abs(g) > 0.0, "zero gradient for {name}");
    }

    // Saved as a torch state dict, it loads back with the same answers.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mha.safetensors");
    varmap.save(&path).unwrap();
    let file = TensorFile::open(&path).unwrap();
    let loaded =
        MultiHeadAttention::load(cfg, file.var_builder(DType::F32, &dev).pp("attn")).unwrap();
    for name in ["attn.in_proj_weight", "attn.out_proj.weight", "attn.bias_k"] {
        let saved = file.load(name, &dev).unwrap();
        assert_eq!(
            max_abs(&(saved - vars[name].as_tensor()).unwrap()),
            0.0,
            "{name} saved as is"
        );
    }
    let a = mha.forward(&x).unwrap();
    let b = loaded.forward(&x).unwrap();
    compare(&a, &b, 1e-6, 1e-6).unwrap();

    // kdim/vdim different from embed_dim: torch's separate layout.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mha = MultiHeadAttention::new(
        MultiHeadAttentionConfig::new(16, 2)
            .with_kdim(6)
            .with_vdim(10),
        vb,
    )
    .unwrap();
    assert_eq!(mha.layout(), MhaLayout::TorchSeparate);
    let k_w = varmap.data().lock().unwrap()["k_proj_weight"]
        .as_tensor()
        .clone();
    assert_eq!(k_w.dims(), &[16, 6]);
}

#[test]
fn dropout_acts_in_training_only() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(16, 2).with_dropout(0.5), vb)
        .unwrap();
    let x = Tensor::randn(0f32, 1., (1, 20, 16), &dev).unwrap();
    let eval = AttentionArgs {
        need_weights: true,
        average_weights: false,
        ..Default::default()
    };
    let a = mha.attend(&x, &x, &x, &eval).unwrap();
    let b = mha.attend(&x, &x, &x, &eval).unwrap();
    assert_eq!(
        max_abs(&(&a.output - &b.output).unwrap()),
        0.0,
        "eval is deterministic"
    );
    let train = AttentionArgs {
        train: true,
        ..eval.clone()
    };
    let t = mha.attend(&x, &x, &x, &train).unwrap();
    let (w_eval, w_train) = (a.weights.unwrap(), t.weights.unwrap());
    let eval_v: Vec<f32> = w_eval.flatten_all().unwrap().to_vec1().unwrap();
    let train_v: Vec<f32> = w_train.flatten_all().unwrap().to_vec1().unwrap();
    let dropped = train_v.iter().filter(|&&v| v == 0.0).count();
    assert!(
        dropped > eval_v.len() / 4 && dropped < eval_v.len() * 3 / 4,
        "about half dropped: {dropped}"
    );
    for (e, t) in eval_v.iter().zip(&train_v) {
        assert!(
            *t == 0.0 || (t - 2.0 * e).abs() < 1e-6,
            "kept weights are scaled by 1/(1-p)"
        );
    }
}

fn randn(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
    common::uniform(&[shape.0, shape.1, shape.2, shape.3], seed)
}

fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, mask: Mask) -> (Tensor, Tensor) {
    let out = scaled_dot_product_attention(
        q,
        k,
        v,
        &SdpaArgs {
            mask,
            need_weights: true,
            ..Default::default()
        },
    )
    .unwrap();
    (out.output, out.weights.unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Causal with an offset equals the explicit boolean mask `j > i + offset`, and the last
    /// rows of a full causal pass equal a pass over those queries alone with the offset
    /// (what incremental decoding relies on).
    #[test]
    fn causal_offset_matches_explicit_mask_and_suffix(b in 1usize..3, h in 1usize..3, l in 1usize..7, extra in 0usize..5, d in 1usize..9, seed in 0u64..1000) {
        let s = l + extra;
        let q = randn((b, h, s, d), seed);
        let k = randn((b, h, s, d), seed + 1);
        let v = randn((b, h, s, d), seed + 2);
        let q_tail = q.narrow(2, extra, l).unwrap();
        let blocked: Vec<u8> = (0..l).flat_map(|i| (0..s).map(move |j| u8::from(j > i + extra))).collect();
        let blocked = Tensor::from_vec(blocked, (l, s), &Device::Cpu).unwrap();
        let (o1, w1) = sdpa(&q_tail, &k, &v, Mask::causal_with_offset(extra));
        let (o2, w2) = sdpa(&q_tail, &k, &v, Mask::boolean(blocked).unwrap());
        compare(&o1, &o2, 0.0, 0.0).unwrap();
        compare(&w1, &w2, 0.0, 0.0).unwrap();
        let (full, _) = sdpa(&q, &k, &v, Mask::causal());
        compare(&o1, &full.narrow(2, extra, l).unwrap(), 1e-6, 1e-6).unwrap();
    }

    /// Key padding `(B, S)` equals the same mask written as a 3-D `(B * H, L, S)` boolean mask
    /// and as an additive `-inf` mask; padded keys get zero weight.
    #[test]
    fn key_padding_equals_its_boolean_and_additive_forms(b in 1usize..4, h in 1usize..3, l in 1usize..5, s in 1usize..7, seed in 0u64..1000) {
        let q = randn((b, h, l, 4), seed);
        let k = randn((b, h, s, 4), seed + 1);
        let v = randn((b, h, s, 3), seed + 2);
        let lens: Vec<usize> = (0..b).map(|i| 1 + (seed as usize + i * 7) % s).collect();
        let pad: Vec<u8> = lens.iter().flat_map(|&n| (0..s).map(move |j| u8::from(j >= n))).collect();
        let pad = Tensor::from_vec(pad, (b, s), &Device::Cpu).unwrap();
        let as_3d = pad.reshape((b, 1, 1, s)).unwrap().broadcast_as((b, h, l, s)).unwrap().reshape((b * h, l, s)).unwrap();
        let additive = pad.where_cond(&Tensor::full(f32::NEG_INFINITY, (b, s), &Device::Cpu).unwrap(), &Tensor::zeros((b, s), DType::F32, &Device::Cpu).unwrap()).unwrap();
        let (o1, w1) = sdpa(&q, &k, &v, Mask::key_padding(pad.clone()).unwrap());
        let (o2, w2) = sdpa(&q, &k, &v, Mask::boolean(as_3d).unwrap());
        let (o3, _) = sdpa(&q, &k, &v, Mask::key_padding(additive).unwrap());
        compare(&o1, &o2, 0.0, 0.0).unwrap();
        compare(&w1, &w2, 0.0, 0.0).unwrap();
        compare(&o1, &o3, 1e-6, 1e-6).unwrap();
        let padded_weight = w1.broadcast_mul(&pad.to_dtype(DType::F32).unwrap().reshape((b, 1, 1, s)).unwrap()).unwrap();
        prop_assert_eq!(max_abs(&padded_weight), 0.0);
        let row_sums = w1.sum(D::Minus1).unwrap();
        compare(&row_sums, &Tensor::ones((b, h, l), DType::F32, &Device::Cpu).unwrap(), 1e-6, 1e-6).unwrap();
    }

    /// f16 and bf16 follow f32 within their precision (softmax in f32; inputs in [-1, 1]).
    #[test]
    fn half_precision_follows_f32(l in 1usize..9, s in 1usize..9, seed in 0u64..1000) {
        let q = randn((2, 2, l, 8), seed);
        let k = randn((2, 2, s, 8), seed + 1);
        let v = randn((2, 2, s, 8), seed + 2);
        let (reference, _) = sdpa(&q, &k, &v, Mask::causal());
        for (dtype, tol) in [(DType::F16, 2e-3), (DType::BF16, 2e-2)] {
            let cast = |t: &Tensor| t.to_dtype(dtype).unwrap();
            let (out, w) = sdpa(&cast(&q), &cast(&k), &cast(&v), Mask::causal());
            prop_assert_eq!(out.dtype(), dtype);
            prop_assert_eq!(w.dtype(), dtype);
            compare(&out.to_dtype(DType::F32).unwrap(), &reference, tol, tol).unwrap();
        }
    }
}

#[test]
fn scale_can_be_overridden() {
    let q = randn((1, 2, 3, 4), 1);
    let k = randn((1, 2, 5, 4), 2);
    let v = randn((1, 2, 5, 4), 3);
    let default = scaled_dot_product_attention(&q, &k, &v, &SdpaArgs::default())
        .unwrap()
        .output;
    // Scale 1 on queries pre-multiplied by 1/sqrt(4) is the default scale.
    let q_half = (&q * 0.5).unwrap();
    let args = SdpaArgs {
        scale: Some(1.0),
        ..Default::default()
    };
    let explicit = scaled_dot_product_attention(&q_half, &k, &v, &args)
        .unwrap()
        .output;
    compare(&explicit, &default, 1e-6, 1e-6).unwrap();
}

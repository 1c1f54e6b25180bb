//! Grouped-query and multi-query attention (`Hkv` key/value heads dividing `H` query heads)
//! and partial Hugging Face biases, against PyTorch (`tests/fixtures/make_gqa_fixtures.py`
//! writes `tests/fixtures/gqa/`: `F.scaled_dot_product_attention(..., enable_gqa=True)` and
//! hand-computed HF-layout attention), on every path: the naive one (forced by asking for the
//! weights, and by `f64`), the tiled and decode CPU kernels (the default for `f32` on the
//! CPU), and the kernels called directly at every instruction set the process can run.
//! A property test checks GQA against the naive path on K/V repeated per query head.

mod common;

use candle::{DType, Device, IndexOp, Tensor};
use candle_attention::testing::decompose;
use candle_attention::testing::sdpa::{few_queries, tiled};
use candle_attention::{
    scaled_dot_product_attention, AttentionArgs, AttentionShape, Mask, MhaLayout,
    MultiHeadAttention, MultiHeadAttentionConfig, SdpaArgs, TensorFile,
};
use common::{compare, uniform};
use proptest::prelude::*;
use serde::Deserialize;
use std::path::{Path, PathBuf};

const TOL: f64 = 1e-5;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gqa")
}

#[derive(Deserialize, Debug)]
struct SdpaCase {
    name: String,
    h: usize,
    hkv: usize,
    l: usize,
    causal: bool,
    description: String,
}

#[derive(Deserialize, Debug)]
struct MhaCase {
    name: String,
    embed_dim: usize,
    num_heads: usize,
    num_kv_heads: usize,
    kdim: usize,
    vdim: usize,
    biases: Vec<String>,
    self_attention: bool,
    causal: bool,
    description: String,
}

#[derive(Deserialize)]
struct Manifest {
    sdpa: Vec<SdpaCase>,
    mha: Vec<MhaCase>,
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("valid manifest")
}

fn check(what: &str, actual: &Tensor, expected: &Tensor) {
    if let Err(e) = compare(actual, expected, TOL, TOL) {
        panic!("{what}: {e}");
    }
}

/// The case's mask as the crate spells it (`blocked` is already in the crate's polarity).
fn sdpa_mask(case: &SdpaCase, file: &TensorFile) -> Mask {
    let dev = Device::Cpu;
    let mut mask = if case.causal {
        Mask::causal()
    } else {
        Mask::none()
    };
    if file.contains("blocked") {
        mask = mask.and(Mask::boolean(file.load("blocked", &dev).unwrap()).unwrap());
    }
    if file.contains("additive") {
        mask = mask.and(Mask::additive(file.load("additive", &dev).unwrap()).unwrap());
    }
    if file.contains("key_padding") {
        mask = mask.and(Mask::key_padding(file.load("key_padding", &dev).unwrap()).unwrap());
    }
    mask
}

#[test]
fn sdpa_matches_torch_enable_gqa_on_every_path() {
    let dev = Device::Cpu;
    let cases = manifest().sdpa;
    assert!(
        cases.len() >= 7,
        "manifest lists {} sdpa cases",
        cases.len()
    );
    let (mut saw_decode, mut saw_tiled) = (false, false);
    for case in &cases {
        let file = TensorFile::open(fixtures().join(format!("{}.safetensors", case.name))).unwrap();
        let (q, k, v) = (
            file.load("q", &dev).unwrap(),
            file.load("k", &dev).unwrap(),
            file.load("v", &dev).unwrap(),
        );
        let expected = file.load("output", &dev).unwrap();
        assert_eq!(q.dim(1).unwrap(), case.h);
        assert_eq!(k.dim(1).unwrap(), case.hkv, "{}", case.description);
        let mask = sdpa_mask(case, &file);
        let args = |need_weights| SdpaArgs {
            mask: mask.clone(),
            need_weights,
            ..Default::default()
        };
        let what = |path: &str| format!("{} ({}), {path}", case.name, case.description);

        // Default on the CPU: the tiled kernel, or the decode one for at most 4 queries.
        let fast = scaled_dot_product_attention(&q, &k, &v, &args(false)).unwrap();
        assert!(fast.weights.is_none());
        check(&what("default (tiled/decode)"), &fast.output, &expected);
        if case.l <= few_queries::MAX_QUERIES {
            saw_decode = true;
        } else {
            saw_tiled = true;
        }

        // Asking for the weights forces the naive path; they sum to 1 per row.
        let naive = scaled_dot_product_attention(&q, &k, &v, &args(true)).unwrap();
        check(&what("naive"), &naive.output, &expected);
        let w = naive.weights.unwrap();
        assert_eq!(
            w.dims()[1],
            case.h,
            "weights have one row block per query head"
        );
        let ones = Tensor::ones(w.dims()[..3].to_vec(), DType::F32, &dev).unwrap();
        check(&what("weight sums"), &w.sum(3).unwrap(), &ones);

        // f64 takes the naive path too (and is more exact than torch's f32).
        let as64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
        let out64 = scaled_dot_product_attention(&as64(&q), &as64(&k), &as64(&v), &args(false))
            .unwrap()
            .output;
        check(&what("naive f64"), &out64, &expected);

        // The kernels themselves, at every instruction set this process can run, odd block sizes.
        let shape = AttentionShape {
            batch: q.dim(0).unwrap(),
            heads: case.h,
            q_len: q.dim(2).unwrap(),
            k_len: k.dim(2).unwrap(),
        };
        let parts = decompose(&mask, shape, &dev).unwrap();
        for isa in candle_attention::testing::available_isas() {
            let cfg = tiled::TiledConfig {
                block_k: Some(48),
                isa: Some(isa),
                ..Default::default()
            };
            let t = tiled::attention_with(
                &q,
                &k,
                &v,
                &parts,
                1.0 / (q.dim(3).unwrap() as f64).sqrt(),
                &cfg,
            )
            .unwrap();
            check(&what(&format!("tiled {isa}")), &t, &expected);
            let d = few_queries::attention_with(
                &q,
                &k,
                &v,
                &parts,
                1.0 / (q.dim(3).unwrap() as f64).sqrt(),
                &cfg,
            )
            .unwrap();
            check(&what(&format!("decode {isa}")), &d, &expected);
        }
    }
    assert!(saw_decode && saw_tiled, "the cases cover both kernels");
}

#[test]
fn half_precision_gqa_agrees_with_f32() {
    // No torch fixture in f16: the f16 kernels compute in f32, so the GQA result on rounded
    // inputs equals the f32 result on the same rounded inputs up to the output's rounding.
    let dev = Device::Cpu;
    let file = TensorFile::open(fixtures().join("gqa_tiled_causal_ragged.safetensors")).unwrap();
    let round = |n: &str| file.load(n, &dev).unwrap().to_dtype(DType::F16).unwrap();
    let (q, k, v) = (round("q"), round("k"), round("v"));
    let f32_of = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let args = SdpaArgs {
        mask: Mask::causal(),
        ..Default::default()
    };
    let half = scaled_dot_product_attention(&q, &k, &v, &args)
        .unwrap()
        .output;
    let full = scaled_dot_product_attention(&f32_of(&q), &f32_of(&k), &f32_of(&v), &args)
        .unwrap()
        .output;
    // f16 has an 11-bit significand: one rounding of an |x| <= 4 output is at most 2e-3.
    compare(&f32_of(&half), &full, 2e-3, 1e-3).unwrap();
}

#[test]
fn mha_matches_hand_computed_torch_reference() {
    let dev = Device::Cpu;
    let cases = manifest().mha;
    assert!(cases.len() >= 5);
    for case in &cases {
        let weights =
            TensorFile::open(fixtures().join(format!("{}.weights.safetensors", case.name)))
                .unwrap();
        let io =
            TensorFile::open(fixtures().join(format!("{}.io.safetensors", case.name))).unwrap();
        let cfg = MultiHeadAttentionConfig::new(case.embed_dim, case.num_heads)
            .with_num_kv_heads(case.num_kv_heads)
            .with_kdim(case.kdim)
            .with_vdim(case.vdim)
            .with_bias(!case.biases.is_empty());
        let mha = MultiHeadAttention::load(cfg, weights.var_builder(DType::F32, &dev).pp("attn"))
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_eq!(mha.layout(), MhaLayout::HuggingFace);
        let query = io.load("query", &dev).unwrap();
        let (key, value) = if case.self_attention {
            (query.clone(), query.clone())
        } else {
            (
                io.load("key", &dev).unwrap(),
                io.load("value", &dev).unwrap(),
            )
        };
        let key_padding = io
            .contains("key_padding")
            .then(|| io.load("key_padding", &dev).unwrap());
        let expected = io.load("output", &dev).unwrap();
        let what = |path: &str| format!("{} ({}), {path}", case.name, case.description);
        let mask = if case.causal {
            Mask::causal()
        } else {
            Mask::none()
        };
        for need_weights in [false, true] {
            let args = AttentionArgs {
                mask: mask.clone(),
                key_padding: key_padding.as_ref(),
                need_weights,
                ..Default::default()
            };
            // The same tensor three times takes the fused self-attention projection.
            let out = if case.self_attention {
                mha.attend(&query, &query, &query, &args).unwrap()
            } else {
                mha.attend(&query, &key, &value, &args).unwrap()
            };
            check(
                &what(&format!("need_weights={need_weights}")),
                &out.output,
                &expected,
            );
            // Separate key and value tensors take the separate projections.
            let separate = mha
                .attend(&query, &key.copy().unwrap(), &value.copy().unwrap(), &args)
                .unwrap();
            check(&what("separate projections"), &separate.output, &expected);
        }
        // The cache-facing pieces: K/V come out with the key/value heads only.
        let (k, v) = mha.project_key_value(&key, &value).unwrap();
        let hd = case.embed_dim / case.num_heads;
        let (b, s) = (key.dim(0).unwrap(), key.dim(1).unwrap());
        assert_eq!(k.dims(), &[b, case.num_kv_heads, s, hd]);
        assert_eq!(v.dims(), &[b, case.num_kv_heads, s, hd]);
        if case.kdim == case.embed_dim && case.vdim == case.embed_dim {
            // One tensor as key and value takes the fused (narrower) K/V projection: it must
            // split into the same heads as the separate projections.
            let (kf, vf) = mha.project_key_value(&key, &key).unwrap();
            let (ks, vs) = mha.project_key_value(&key, &key.copy().unwrap()).unwrap();
            assert_eq!(kf.dims(), &[b, case.num_kv_heads, s, hd]);
            compare(&kf, &ks, 1e-6, 1e-6).unwrap();
            compare(&vf, &vs, 1e-6, 1e-6).unwrap();
        }
        let q = mha.project_query(&query).unwrap();
        assert_eq!(q.dim(1).unwrap(), case.num_heads);
        let args = AttentionArgs {
            mask,
            key_padding: key_padding.as_ref(),
            ..Default::default()
        };
        let out = mha.attend_projected(&q, &k, &v, &args).unwrap();
        check(&what("attend_projected"), &out.output, &expected);
    }
}

#[test]
fn gqa_weights_load_from_a_varbuilder_over_a_varmap_and_train() {
    // `new` names fresh GQA weights in the Hugging Face layout with the narrow K/V shapes.
    let dev = Device::Cpu;
    let varmap = candle_nn::VarMap::new();
    let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let cfg = MultiHeadAttentionConfig::new(32, 8).with_num_kv_heads(2);
    let mha = MultiHeadAttention::new(cfg, vb.pp("attn")).unwrap();
    assert_eq!(mha.layout(), MhaLayout::HuggingFace);
    let vars = varmap.data().lock().unwrap();
    assert_eq!(vars["attn.k_proj.weight"].dims(), &[8, 32]);
    assert_eq!(vars["attn.v_proj.bias"].dims(), &[8]);
    assert_eq!(vars["attn.q_proj.weight"].dims(), &[32, 32]);
    drop(vars);
    let x = uniform(&[2, 5, 32], 3);
    let out = mha
        .attend(&x, &x, &x, &AttentionArgs::default())
        .unwrap()
        .output;
    assert_eq!(out.dims(), &[2, 5, 32]);
}

#[test]
fn head_counts_that_do_not_divide_are_clear_errors() {
    let q = uniform(&[1, 6, 3, 8], 1);
    let k = uniform(&[1, 4, 5, 8], 2);
    let err = scaled_dot_product_attention(&q, &k, &k, &SdpaArgs::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("6 query heads") && err.contains("4 key/value heads"),
        "{err}"
    );
    let v = uniform(&[1, 2, 5, 8], 3);
    let err =
        scaled_dot_product_attention(&q, &uniform(&[1, 3, 5, 8], 4), &v, &SdpaArgs::default())
            .unwrap_err()
            .to_string();
    assert!(err.contains("same number of heads"), "{err}");

    let err = MultiHeadAttentionConfig::new(48, 6)
        .with_num_kv_heads(4)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("num_heads 6") && err.contains("num_kv_heads 4"),
        "{err}"
    );
    let err = MultiHeadAttentionConfig::new(48, 6)
        .with_num_kv_heads(0)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_kv_heads 0"), "{err}");
    let err = MultiHeadAttentionConfig::new(48, 6)
        .with_num_kv_heads(2)
        .with_add_bias_kv(true)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("add_bias_kv"), "{err}");
}

#[test]
fn loading_gqa_weights_with_the_wrong_kv_heads_names_the_sizes() {
    let dev = Device::Cpu;
    let weights =
        TensorFile::open(fixtures().join("mha_gqa_self_causal.weights.safetensors")).unwrap();
    // The file has 2 key/value heads of 8 features (k_proj.weight (16, 64)); a config without
    // GQA expects (64, 64).
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(64, 8),
        weights.var_builder(DType::F32, &dev).pp("attn"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("k_proj.weight") && err.contains("16"), "{err}");
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(64, 8).with_num_kv_heads(4),
        weights.var_builder(DType::F32, &dev).pp("attn"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("k_proj.weight") && err.contains("num_kv_heads 4") && err.contains("= 32"),
        "{err}"
    );
}

#[test]
fn partial_biases_need_bias_on_and_still_reject_a_bias_free_config() {
    let dev = Device::Cpu;
    let weights =
        TensorFile::open(fixtures().join("whisper_partial_bias.weights.safetensors")).unwrap();
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(32, 4).with_bias(false),
        weights.var_builder(DType::F32, &dev).pp("attn"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("q_proj.bias, v_proj.bias, out_proj.bias") && err.contains("bias = false"),
        "{err}"
    );
    // A file without any bias still refuses `bias = true`, naming what it looked for.
    let bias_free = TensorFile::open(fixtures().join("mha_mqa_kdim.weights.safetensors")).unwrap();
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(32, 4)
            .with_num_kv_heads(1)
            .with_kdim(24)
            .with_vdim(20),
        bias_free.var_builder(DType::F32, &dev).pp("attn"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("have no projection biases") && err.contains("k_proj.bias"),
        "{err}"
    );
}

#[test]
fn whisper_layout_written_from_rust_matches_a_manual_computation() {
    // A Whisper-like file made here (no k_proj.bias); the reference is computed by hand from
    // the same tensors with plain candle ops, K/V repeated per head for MQA.
    let dev = Device::Cpu;
    let (e, h, hkv) = (16, 4, 1);
    let hd = e / h;
    let t = |shape: &[usize], seed| uniform(shape, seed);
    let tensors = [
        ("enc.q_proj.weight", t(&[e, e], 1)),
        ("enc.q_proj.bias", t(&[e], 2)),
        ("enc.k_proj.weight", t(&[hkv * hd, e], 3)),
        ("enc.v_proj.weight", t(&[hkv * hd, e], 4)),
        ("enc.v_proj.bias", t(&[hkv * hd], 5)),
        ("enc.out_proj.weight", t(&[e, e], 6)),
        ("enc.out_proj.bias", t(&[e], 7)),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("whisper.safetensors");
    candle::safetensors::save(
        &tensors
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect(),
        &path,
    )
    .unwrap();
    let file = TensorFile::open(&path).unwrap();
    let cfg = MultiHeadAttentionConfig::new(e, h).with_num_kv_heads(hkv);
    let mha = MultiHeadAttention::load(cfg, file.var_builder(DType::F32, &dev).pp("enc")).unwrap();
    let x = t(&[2, 5, e], 8);
    let got = mha
        .attend(&x, &x, &x, &AttentionArgs::default())
        .unwrap()
        .output;

    let w = |n: &str| tensors.iter().find(|(m, _)| *m == n).unwrap().1.clone();
    let lin = |x: &Tensor, p: &str, bias: bool| {
        let y = x
            .broadcast_matmul(&w(&format!("enc.{p}.weight")).t().unwrap())
            .unwrap();
        if bias {
            y.broadcast_add(&w(&format!("enc.{p}.bias"))).unwrap()
        } else {
            y
        }
    };
    let heads = |y: Tensor, n: usize| y.reshape((2, 5, n, hd)).unwrap().transpose(1, 2).unwrap();
    let q = heads(lin(&x, "q_proj", true), h);
    let k = heads(lin(&x, "k_proj", false), hkv);
    let v = heads(lin(&x, "v_proj", true), hkv);
    let mut rows = Vec::new();
    for head in 0..h {
        let (qh, kh, vh) = (
            q.i((.., head)).unwrap(),
            k.i((.., head / (h / hkv))).unwrap(),
            v.i((.., head / (h / hkv))).unwrap(),
        );
        let scores = (qh.matmul(&kh.t().unwrap()).unwrap() / (hd as f64).sqrt()).unwrap();
        let p = candle_nn::ops::softmax_last_dim(&scores).unwrap();
        rows.push(p.matmul(&vh).unwrap());
    }
    let att = Tensor::cat(&rows, 2).unwrap(); // (B, L, H·hd), heads concatenated
    let want = lin(&att, "out_proj", true);
    check("whisper-like MQA", &got, &want);
}

/// `t` `(B, Hkv, S, D)` with each key/value head repeated `g` times: `(B, Hkv·g, S, D)`, head
/// `h` being key/value head `h / g` (torch's `repeat_interleave`).
fn repeat_kv(t: &Tensor, g: usize) -> Tensor {
    let (b, hkv, s, d) = t.dims4().unwrap();
    t.unsqueeze(2)
        .unwrap()
        .broadcast_as((b, hkv, g, s, d))
        .unwrap()
        .reshape((b, hkv * g, s, d))
        .unwrap()
}

#[derive(Debug, Clone)]
struct Case {
    b: usize,
    hkv: usize,
    g: usize,
    l: usize,
    s: usize,
    d: usize,
    causal: bool,
    per_head_mask: bool,
    padding: bool,
    seed: u64,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        1usize..3,
        1usize..4,
        prop_oneof![Just(1usize), Just(2), Just(3), Just(4)],
        prop_oneof![1usize..5, 60usize..80, 120usize..140],
        prop_oneof![1usize..40, 120usize..140, 500usize..700],
        prop_oneof![Just(8usize), Just(13), Just(16), Just(33)],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(b, hkv, g, l, s, d, causal, per_head_mask, padding, seed)| Case {
                b,
                hkv,
                g,
                l,
                s,
                d,
                causal,
                per_head_mask,
                padding,
                seed,
            },
        )
}

fn case_mask(c: &Case) -> Mask {
    let h = c.hkv * c.g;
    let mut mask = Mask::none();
    if c.causal {
        // Offset so that every query sees at least key 0 and the diagonal is inside S.
        mask = mask.and(Mask::causal_with_offset(c.s.saturating_sub(c.l)));
    }
    if c.per_head_mask {
        // Differs per query head, so a kernel that indexed it by key/value head would fail.
        let blocked = uniform(&[c.b, h, c.l, c.s], c.seed ^ 7).gt(0.5).unwrap();
        mask = mask.and(Mask::boolean(blocked).unwrap());
    }
    if c.padding {
        // Ragged right padding; the last batch row is entirely padding (fully masked rows).
        let rows: Vec<u8> = (0..c.b)
            .flat_map(|bi| {
                let valid = if bi + 1 == c.b && c.b > 1 {
                    0
                } else {
                    c.s - (c.seed as usize + bi) % c.s.max(1)
                };
                (0..c.s).map(move |j| u8::from(j >= valid))
            })
            .collect();
        let pad = Tensor::from_vec(rows, (c.b, c.s), &Device::Cpu).unwrap();
        mask = mask.and(Mask::key_padding(pad).unwrap());
    }
    mask
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// GQA through every path equals the naive path on K/V repeated per query head.
    #[test]
    fn gqa_equals_naive_attention_on_repeated_kv(c in case_strategy()) {
        let h = c.hkv * c.g;
        let q = uniform(&[c.b, h, c.l, c.d], c.seed);
        let k = uniform(&[c.b, c.hkv, c.s, c.d], c.seed ^ 1);
        let v = uniform(&[c.b, c.hkv, c.s, c.d], c.seed ^ 2);
        let mask = case_mask(&c);
        let args = |need_weights| SdpaArgs { mask: mask.clone(), need_weights, ..Default::default() };
        let want = scaled_dot_product_attention(&q, &repeat_kv(&k, c.g), &repeat_kv(&v, c.g), &args(true))
            .unwrap();
        let fast = scaled_dot_product_attention(&q, &k, &v, &args(false)).unwrap();
        prop_assert!(compare(&fast.output, &want.output, TOL, TOL).is_ok(),
            "fast path: {:?}", compare(&fast.output, &want.output, TOL, TOL));
        let naive = scaled_dot_product_attention(&q, &k, &v, &args(true)).unwrap();
        // The same grouping of products on both sides: equal up to summation order.
        prop_assert!(compare(&naive.output, &want.output, TOL, TOL).is_ok());
        prop_assert!(compare(naive.weights.as_ref().unwrap(), want.weights.as_ref().unwrap(), TOL, TOL).is_ok());
        // Strided inputs, as multi-head attention hands them over (a transposed projection).
        let strided = |t: &Tensor| t.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
        let fast_strided = scaled_dot_product_attention(&strided(&q), &strided(&k), &strided(&v), &args(false)).unwrap();
        prop_assert!(compare(&fast_strided.output, &want.output, TOL, TOL).is_ok());
    }
}

//! Bad input gets a clear error that names the problem, in the library and in `attn` (non-zero
//! exit, message on stderr, never a panic).

#[path = "../../tests/common/mod.rs"]
mod common;

use attn_cli::torch_io::TorchMhaInputs;
use candle::{DType, Device, Tensor};
use candle_attention::{
    scaled_dot_product_attention, AttentionArgs, Mask, MhaWeightsInfo, MultiHeadAttention,
    MultiHeadAttentionConfig, SdpaArgs, TensorFile,
};
use common::mha_fixtures;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    mha_fixtures().join(name)
}

/// All tensors of a fixture file, to be edited and saved again.
fn tensors_of(path: &Path) -> HashMap<String, Tensor> {
    let file = TensorFile::open(path).unwrap();
    file.names()
        .iter()
        .map(|n| (n.to_string(), file.load(n, &Device::Cpu).unwrap()))
        .collect()
}

fn save(dir: &Path, name: &str, tensors: &HashMap<String, Tensor>) -> PathBuf {
    let path = dir.join(name);
    candle::safetensors::save(tensors, &path).unwrap();
    path
}

/// Runs `attn` with `args`; asserts failure without a panic and returns stderr.
fn attn_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "attn {args:?} should fail; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "attn {args:?} panicked: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "attn {args:?}: {stderr}");
    stderr
}

fn run_mha_args<'a>(
    weights: &'a str,
    inputs: &'a str,
    output: &'a str,
    heads: &'a str,
) -> Vec<&'a str> {
    vec![
        "run",
        "mha",
        "--weights",
        weights,
        "--inputs",
        inputs,
        "--output",
        output,
        "--num-heads",
        heads,
    ]
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn missing_tensor_is_named_with_the_names_under_its_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tensors_of(&fixture("hf_prefix_encoder.weights.safetensors"));
    t.remove("encoder.layers.0.self_attn.k_proj.weight");
    let path = save(dir.path(), "w.safetensors", &t);

    let file = TensorFile::open(&path).unwrap();
    let err = MhaWeightsInfo::from_file(&file, "encoder.layers.0.self_attn")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'encoder.layers.0.self_attn.k_proj.weight' not found"),
        "{err}"
    );
    assert!(
        err.contains("encoder.layers.0.self_attn.q_proj.weight"),
        "lists existing names: {err}"
    );

    let cfg = MultiHeadAttentionConfig::new(16, 4);
    let vb = file
        .var_builder(DType::F32, &Device::Cpu)
        .pp("encoder.layers.0.self_attn");
    let err = MultiHeadAttention::load(cfg, vb).unwrap_err().to_string();
    assert!(
        err.contains("k_proj.weight' not found") && err.contains("v_proj.weight"),
        "{err}"
    );

    let inputs = fixture("hf_prefix_encoder.inputs.safetensors");
    let out = dir.path().join("o.safetensors");
    let mut args = run_mha_args(s(&path), s(&inputs), s(&out), "4");
    args.extend(["--prefix", "encoder.layers.0.self_attn", "--batch-first"]);
    let err = attn_fails(&args);
    assert!(
        err.contains("k_proj.weight' not found") && err.contains("q_proj.bias"),
        "{err}"
    );
}

#[test]
fn wrong_prefix_says_what_was_looked_for_and_what_exists() {
    let path = fixture("hf_prefix_encoder.weights.safetensors");
    let file = TensorFile::open(&path).unwrap();
    let err = MhaWeightsInfo::from_file(&file, "decoder.layers.0.self_attn")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no multi-head attention weights under 'decoder.layers.0.self_attn'"),
        "{err}"
    );
    assert!(
        err.contains("in_proj_weight") && err.contains("q_proj.weight"),
        "{err}"
    );
    assert!(
        err.contains("encoder.layers.0.self_attn.q_proj.weight"),
        "lists the file: {err}"
    );

    let vb = file.var_builder(DType::F32, &Device::Cpu).pp("nowhere");
    let err = MultiHeadAttention::load(MultiHeadAttentionConfig::new(16, 4), vb)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no multi-head attention weights under 'nowhere'"),
        "{err}"
    );
}

#[test]
fn weight_shapes_that_disagree_name_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let path = fixture("self_default.weights.safetensors");
    // Config says 32 features, the file has 16.
    let file = TensorFile::open(&path).unwrap();
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(32, 4),
        file.var_builder(DType::F32, &Device::Cpu),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("in_proj_weight") && err.contains("[48, 16]") && err.contains("[96, 32]"),
        "{err}"
    );

    // A file whose out_proj does not match its in_proj.
    let mut t = tensors_of(&path);
    t.insert(
        "out_proj.weight".into(),
        Tensor::zeros((8, 8), DType::F32, &Device::Cpu).unwrap(),
    );
    let bad = save(dir.path(), "w.safetensors", &t);
    let err = MhaWeightsInfo::from_file(&TensorFile::open(&bad).unwrap(), "")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("in_proj_weight")
            && err.contains("[48, 16]")
            && err.contains("(24, in_features)"),
        "{err}"
    );
    let inputs = fixture("self_default.inputs.safetensors");
    let out = dir.path().join("o.safetensors");
    let err = attn_fails(&run_mha_args(s(&bad), s(&inputs), s(&out), "4"));
    assert!(err.contains("[48, 16]"), "{err}");
}

#[test]
fn config_that_disagrees_with_the_file_is_refused() {
    let file = TensorFile::open(fixture("self_default.weights.safetensors")).unwrap();
    let vb = file.var_builder(DType::F32, &Device::Cpu);
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(16, 4).with_bias(false),
        vb.clone(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("have projection biases") && err.contains("bias = false"),
        "{err}"
    );
    let err = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(16, 4).with_add_bias_kv(true),
        vb,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("have no bias_k/bias_v"), "{err}");
}

#[test]
fn num_heads_that_do_not_divide_embed_dim() {
    let err = MultiHeadAttentionConfig::new(16, 3)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("embed_dim 16 is not divisible by num_heads 3"),
        "{err}"
    );
    let err = MultiHeadAttentionConfig::new(16, 0)
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_heads must be at least 1"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.safetensors");
    let w = fixture("self_default.weights.safetensors");
    let i = fixture("self_default.inputs.safetensors");
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "3"));
    assert!(err.contains("not divisible by num_heads 3"), "{err}");
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "0"));
    assert!(err.contains("num_heads must be at least 1"), "{err}");
    assert!(!out.exists(), "no output is written on error");
}

fn tiny_mha() -> MultiHeadAttention {
    let file = TensorFile::open(fixture("self_default.weights.safetensors")).unwrap();
    MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(16, 4),
        file.var_builder(DType::F32, &Device::Cpu),
    )
    .unwrap()
}

#[test]
fn input_shapes_that_disagree_name_both_shapes() {
    let dev = Device::Cpu;
    let mha = tiny_mha();
    let x = Tensor::zeros((2, 5, 16), DType::F32, &dev).unwrap();
    let args = AttentionArgs::default();
    let err = mha
        .attend(
            &Tensor::zeros((2, 5, 12), DType::F32, &dev).unwrap(),
            &x,
            &x,
            &args,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("query has 12 features")
            && err.contains("[2, 5, 12]")
            && err.contains("expects 16"),
        "{err}"
    );
    let k = Tensor::zeros((3, 5, 16), DType::F32, &dev).unwrap();
    let err = mha.attend(&x, &k, &k, &args).unwrap_err().to_string();
    assert!(
        err.contains("same batch size") && err.contains("[2, 5, 16]") && err.contains("[3, 5, 16]"),
        "{err}"
    );
    let v = Tensor::zeros((2, 4, 16), DType::F32, &dev).unwrap();
    let err = mha.attend(&x, &x, &v, &args).unwrap_err().to_string();
    assert!(
        err.contains("[2, 5, 16]") && err.contains("[2, 4, 16]"),
        "{err}"
    );
    let unbatched_key = Tensor::zeros((5, 16), DType::F32, &dev).unwrap();
    let err = mha
        .attend(&x, &unbatched_key, &x, &args)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("all three must be batched") && err.contains("[5, 16]"),
        "{err}"
    );
    let half = x.to_dtype(DType::F16).unwrap();
    let err = mha
        .attend(&half, &half, &half, &args)
        .unwrap_err()
        .to_string();
    assert!(err.contains("F16") && err.contains("F32"), "{err}");

    let q = Tensor::zeros((1, 2, 3, 8), DType::F32, &dev).unwrap();
    let k = Tensor::zeros((1, 2, 4, 6), DType::F32, &dev).unwrap();
    let err = scaled_dot_product_attention(&q, &k, &k, &SdpaArgs::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("[1, 2, 3, 8]") && err.contains("[1, 2, 4, 6]"),
        "{err}"
    );
}

#[test]
fn masks_of_the_wrong_shape_or_dtype() {
    let dev = Device::Cpu;
    let mha = tiny_mha();
    let x = Tensor::zeros((2, 5, 16), DType::F32, &dev).unwrap();
    let bad_mask = Mask::boolean(Tensor::zeros((3, 3), DType::U8, &dev).unwrap()).unwrap();
    let args = AttentionArgs {
        mask: bad_mask,
        ..Default::default()
    };
    let err = mha.attend(&x, &x, &x, &args).unwrap_err().to_string();
    assert!(err.contains("[3, 3]") && err.contains("(5, 5)"), "{err}");
    let pad = Tensor::zeros((2, 4), DType::U8, &dev).unwrap();
    let args = AttentionArgs {
        key_padding: Some(&pad),
        ..Default::default()
    };
    let err = mha.attend(&x, &x, &x, &args).unwrap_err().to_string();
    assert!(
        err.contains("key padding mask of shape [2, 4]") && err.contains("(2, 5)"),
        "{err}"
    );
    let err = Mask::attn_mask(Tensor::zeros((5, 5), DType::I64, &dev).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("I64"), "{err}");

    // Through the CLI: a (3, 3) mask for 5 queries, and an integer mask.
    let dir = tempfile::tempdir().unwrap();
    let w = fixture("self_default.weights.safetensors");
    let out = dir.path().join("o.safetensors");
    let mut t = tensors_of(&fixture("self_default.inputs.safetensors"));
    t.insert(
        "attn_mask".into(),
        Tensor::zeros((3, 3), DType::U8, &dev).unwrap(),
    );
    let i = save(dir.path(), "i.safetensors", &t);
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "4"));
    assert!(err.contains("attention mask of shape [3, 3]"), "{err}");
    t.insert(
        "attn_mask".into(),
        Tensor::zeros((5, 5), DType::I64, &dev).unwrap(),
    );
    let i = save(dir.path(), "i.safetensors", &t);
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "4"));
    assert!(err.contains("'attn_mask'") && err.contains("I64"), "{err}");
    t.remove("attn_mask");
    t.insert(
        "key_padding_mask".into(),
        Tensor::zeros((2, 7), DType::U8, &dev).unwrap(),
    );
    let i = save(dir.path(), "i.safetensors", &t);
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "4"));
    assert!(err.contains("key padding mask of shape [2, 7]"), "{err}");
}

#[test]
fn truncated_corrupt_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("self_default.weights.safetensors")).unwrap();
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &good[..good.len() - 10]).unwrap();
    let err = TensorFile::open(&truncated).unwrap_err().to_string();
    assert!(
        err.contains("truncated.safetensors is not a valid safetensors file"),
        "{err}"
    );
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a safetensors file at all").unwrap();
    let err = TensorFile::open(&garbage).unwrap_err().to_string();
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let mut huge_header = (u64::MAX / 2).to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    std::fs::write(&garbage, &huge_header).unwrap();
    assert!(TensorFile::open(&garbage).is_err());
    let err = TensorFile::open(dir.path().join("absent.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot read") && err.contains("absent.safetensors"),
        "{err}"
    );

    let i = fixture("self_default.inputs.safetensors");
    let out = dir.path().join("o.safetensors");
    let err = attn_fails(&run_mha_args(s(&truncated), s(&i), s(&out), "4"));
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let err = attn_fails(&run_mha_args(
        s(&fixture("self_default.weights.safetensors")),
        s(&truncated),
        s(&out),
        "4",
    ));
    assert!(err.contains("truncated.safetensors"), "{err}");
    let err = attn_fails(&["inspect", s(&garbage)]);
    assert!(err.contains("not a valid safetensors file"), "{err}");
}

#[test]
fn input_file_without_query() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tensors_of(&fixture("cross_l_ne_s.inputs.safetensors"));
    t.remove("query");
    let i = save(dir.path(), "i.safetensors", &t);
    let err = TorchMhaInputs::from_file(&TensorFile::open(&i).unwrap(), DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no 'query' tensor") && err.contains("key, value"),
        "{err}"
    );
    let w = fixture("cross_l_ne_s.weights.safetensors");
    let out = dir.path().join("o.safetensors");
    let err = attn_fails(&run_mha_args(s(&w), s(&i), s(&out), "4"));
    assert!(err.contains("no 'query' tensor"), "{err}");
}

#[test]
fn cuda_without_the_feature_is_a_clear_error() {
    if cfg!(feature = "cuda") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let w = fixture("self_default.weights.safetensors");
    let i = fixture("self_default.inputs.safetensors");
    let out = dir.path().join("o.safetensors");
    let mut args = run_mha_args(s(&w), s(&i), s(&out), "4");
    args.extend(["--device", "cuda"]);
    let err = attn_fails(&args);
    assert!(err.contains("CUDA"), "{err}");
}

/// Every command that computes takes `--device cpu|cuda|metal`; a backend this build lacks is
/// refused up front with the cargo feature that enables it (no model is loaded first).
#[test]
fn every_computing_command_refuses_a_device_not_compiled_in() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = dir.path().join("o.safetensors");
    let out = s(&out);
    let commands: Vec<Vec<&str>> = vec![
        vec!["translate", "seven"],
        vec!["translate", "--model", d, "seven"],
        vec!["train", "--out", d, "--steps", "1"],
        vec!["generate", "--model", d, "--inputs", out, "--output", out],
        vec![
            "run", "marian", "--model", d, "--inputs", out, "--output", out,
        ],
        vec![
            "run", "seq2seq", "--model", d, "--inputs", out, "--output", out,
        ],
        vec!["bench", "attention", "--iters", "1"],
        vec!["bench", "mha", "--iters", "1"],
        vec!["bench", "decode", "--lengths", "2"],
    ];
    for (device, feature, compiled) in [
        ("cuda", "--features cuda", cfg!(feature = "cuda")),
        ("metal", "--features metal", cfg!(feature = "metal")),
    ] {
        if compiled {
            continue;
        }
        for cmd in &commands {
            let mut args = cmd.clone();
            args.extend(["--device", device]);
            let err = attn_fails(&args);
            assert!(err.contains(feature), "attn {args:?}: {err}");
        }
    }
}

fn transformer_fixture(name: &str) -> PathBuf {
    common::transformer_fixtures().join(name)
}

fn run_transformer_args<'a>(weights: &'a str, inputs: &'a str, output: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "transformer",
        "--weights",
        weights,
        "--inputs",
        inputs,
        "--output",
        output,
        "--num-heads",
        "4",
    ]
}

#[test]
fn transformer_inputs_with_the_wrong_d_model() {
    let dir = tempfile::tempdir().unwrap();
    let w = transformer_fixture("post_norm_relu.weights.safetensors");
    let mut t = tensors_of(&transformer_fixture("post_norm_relu.inputs.safetensors"));
    let src = t["src"].clone();
    let (src_len, n, _) = src.dims3().unwrap();
    t.insert(
        "src".into(),
        Tensor::zeros((src_len, n, 12), DType::F32, &Device::Cpu).unwrap(),
    );
    let i = save(dir.path(), "i.safetensors", &t);
    let out = dir.path().join("o.safetensors");
    let err = attn_fails(&run_transformer_args(s(&w), s(&i), s(&out)));
    assert!(
        err.contains("src has 12 features") && err.contains("d_model is 16"),
        "{err}"
    );
    t.remove("tgt");
    let i = save(dir.path(), "i.safetensors", &t);
    let err = attn_fails(&run_transformer_args(s(&w), s(&i), s(&out)));
    assert!(
        err.contains("no 'tgt' tensor") && err.contains("it holds: src"),
        "{err}"
    );
}

#[test]
fn transformer_with_a_missing_layer_or_norm() {
    use candle_attention::transformer::{Transformer, TransformerConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut t = tensors_of(&transformer_fixture(
        "enc2_dec1_eps1e-6.weights.safetensors",
    ));
    let full = t.clone();
    t.retain(|name, _| !name.starts_with("encoder.layers.0."));
    let w = save(dir.path(), "w.safetensors", &t);
    let err = TransformerConfig::from_weights(&TensorFile::open(&w).unwrap(), "", 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer encoder.layers.0 is missing"), "{err}");
    let i = transformer_fixture("enc2_dec1_eps1e-6.inputs.safetensors");
    let out = dir.path().join("o.safetensors");
    let mut args = run_transformer_args(s(&w), s(&i), s(&out));
    args[8] = "--num-heads";
    args[9] = "3";
    let err = attn_fails(&args);
    assert!(err.contains("layer encoder.layers.0 is missing"), "{err}");

    let mut t = full.clone();
    t.remove("decoder.norm.weight");
    let w = save(dir.path(), "w2.safetensors", &t);
    let file = TensorFile::open(&w).unwrap();
    let cfg = TransformerConfig::from_weights(&file, "", 3).unwrap();
    let err = Transformer::load(cfg, file.var_builder(DType::F32, &Device::Cpu))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'decoder.norm.weight' not found") && err.contains("decoder.norm.bias"),
        "{err}"
    );

    let mut t = full;
    t.retain(|name, _| !name.starts_with("decoder."));
    let w = save(dir.path(), "w3.safetensors", &t);
    let err = TransformerConfig::from_weights(&TensorFile::open(&w).unwrap(), "", 3)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no decoder layers found under 'decoder.layers'"),
        "{err}"
    );
}

#[test]
fn transformer_masks_of_the_wrong_shape() {
    let dir = tempfile::tempdir().unwrap();
    let w = transformer_fixture("batch_first_padding.weights.safetensors");
    let mut t = tensors_of(&transformer_fixture(
        "batch_first_padding.inputs.safetensors",
    ));
    let out = dir.path().join("o.safetensors");
    let mut args = run_transformer_args(s(&w), "", s(&out));
    args.push("--batch-first");
    let original = t.clone();
    t.insert(
        "tgt_mask".into(),
        Tensor::zeros((4, 4), DType::U8, &Device::Cpu).unwrap(),
    );
    let i = save(dir.path(), "i.safetensors", &t);
    args[5] = s(&i);
    let err = attn_fails(&args);
    assert!(
        err.contains("attention mask of shape [4, 4]") && err.contains("(5, 5)"),
        "{err}"
    );
    let mut t = original;
    t.insert(
        "memory_key_padding_mask".into(),
        Tensor::zeros((3, 2), DType::U8, &Device::Cpu).unwrap(),
    );
    let i = save(dir.path(), "i2.safetensors", &t);
    args[5] = s(&i);
    let err = attn_fails(&args);
    assert!(
        err.contains("key padding mask of shape [3, 2]") && err.contains("(3, 6)"),
        "{err}"
    );
}

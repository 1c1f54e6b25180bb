//! Hostile but plausible inputs, and exactly what each one gets: a table of cases run through
//! the public API (the rows that go through `attn` are in `attn-cli/tests/cli.rs`). Every row either names the error
//! it must produce or states the defined answer it must give.
//!
//! | input | answer |
//! |---|---|
//! | zero-length query sequence | empty output `(B, 0, E)` and weights `(B, 0, S)` |
//! | zero-length key sequence | every query sees no key: zero attention, output = `out_proj.bias`, weights `(B, L, 0)` |
//! | `num_heads = 0` | error "num_heads must be at least 1" |
//! | head_dim 0 (`embed_dim = 0`) | error "embed_dim must be at least 1" |
//! | head_dim 0 in `scaled_dot_product_attention` | scores are all 0: uniform weights, output = mean of the values |
//! | NaN in one query token | NaN in that token's output row only, as torch |
//! | +inf in a key | NaN in every output row, as torch (`inf - inf` in the softmax) |
//! | NaN in an additive mask entry | NaN in that query's row, as torch |
//! | +inf in an additive mask at a visible key | NaN in that query's row, as torch |
//! | +inf / NaN in an additive mask where another mask blocks | blocked: `-inf` wins (torch: NaN) |
//! | every key blocked for a query | zero weights, output row = `out_proj.bias` (torch: NaN) |
//! | batch sizes of query and key differ | error naming the three shapes |
//! | right names, wrong shapes | error naming the tensor and both shapes |
//! | f16 weights, f32 inputs (library) | error naming both dtypes |
//! | f16 weights, f32 inputs (`attn run mha --dtype f32`) | weights converted to f32, runs |
//! | a file that is not safetensors | error "... is not a valid safetensors file" naming the file |
//! | naive attention above `--max-attention-memory` | error with the sizes and the way out (`--no-weights`) |

mod common;

use candle::{DType, Device, IndexOp, Tensor, D};
use candle_attention::{
    scaled_dot_product_attention, AttentionArgs, Mask, MultiHeadAttention,
    MultiHeadAttentionConfig, SdpaArgs, TensorFile,
};
use candle_nn::{VarBuilder, VarMap};

const E: usize = 8;
const H: usize = 2;

/// A seeded-random `MultiHeadAttention(8, 2)` in `dtype`, with non-zero biases.
fn mha(dtype: DType) -> MultiHeadAttention {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = MultiHeadAttention::new(MultiHeadAttentionConfig::new(E, H), vb).unwrap();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        if name.ends_with("bias") {
            let n = var.elem_count();
            let values: Vec<f32> = (0..n).map(|i| 0.1 * (i as f32 + 1.0)).collect();
            var.set(&Tensor::from_vec(values, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    if dtype == DType::F32 {
        return layer;
    }
    let tensors = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().to_dtype(dtype).unwrap()))
        .collect();
    MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(E, H),
        VarBuilder::from_tensors(tensors, dtype, &Device::Cpu),
    )
    .unwrap()
}

fn input(b: usize, n: usize) -> Tensor {
    let values: Vec<f32> = (0..b * n * E).map(|i| (i as f32 * 0.731).sin()).collect();
    Tensor::from_vec(values, (b, n, E), &Device::Cpu).unwrap()
}

fn args(mask: Mask, need_weights: bool) -> AttentionArgs<'static> {
    AttentionArgs {
        mask,
        key_padding: None,
        need_weights,
        average_weights: true,
        train: false,
    }
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.flatten_to(D::Minus2).unwrap().to_vec2::<f32>().unwrap()
}

/// What every output row is when a query attends to nothing: the projection of zeros,
/// i.e. `out_proj.bias` as [`mha`] set it.
fn out_proj_bias(n: usize) -> Vec<Vec<f32>> {
    let bias: Vec<f32> = (0..E).map(|i| 0.1 * (i as f32 + 1.0)).collect();
    vec![bias; n]
}

fn err_of<T: std::fmt::Debug>(r: candle::Result<T>) -> String {
    r.expect_err("must be an error").to_string()
}

fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should mention {p:?}");
    }
}

/// Runs the case on both attention paths: the memory-efficient kernel (no weights) and the
/// naive one (weights requested).
fn both_paths(
    layer: &MultiHeadAttention,
    q: &Tensor,
    kv: &Tensor,
    mask: Mask,
) -> [(Tensor, Option<Tensor>); 2] {
    [false, true].map(|w| {
        let out = layer.attend(q, kv, kv, &args(mask.clone(), w)).unwrap();
        (out.output, out.weights)
    })
}

#[test]
fn zero_length_query_sequence_gives_empty_output() {
    let layer = mha(DType::F32);
    for (out, weights) in both_paths(&layer, &input(2, 0), &input(2, 3), Mask::none()) {
        assert_eq!(out.dims(), &[2, 0, E]);
        if let Some(w) = weights {
            assert_eq!(w.dims(), &[2, 0, 3]);
        }
    }
}

#[test]
fn zero_length_key_sequence_attends_to_nothing() {
    let layer = mha(DType::F32);
    for (out, weights) in both_paths(&layer, &input(1, 3), &input(1, 0), Mask::none()) {
        assert_eq!(rows(&out), out_proj_bias(3));
        if let Some(w) = weights {
            assert_eq!(w.dims(), &[1, 3, 0]);
        }
    }
}

#[test]
fn zero_heads_or_zero_width_is_refused() {
    let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
    let msg = err_of(MultiHeadAttention::new(
        MultiHeadAttentionConfig::new(8, 0),
        vb.clone(),
    ));
    assert_mentions(&msg, &["num_heads must be at least 1"]);
    let msg = err_of(MultiHeadAttention::new(
        MultiHeadAttentionConfig::new(0, 1),
        vb.clone(),
    ));
    assert_mentions(&msg, &["embed_dim must be at least 1"]);
    let msg = err_of(MultiHeadAttention::new(
        MultiHeadAttentionConfig::new(8, 2).with_kdim(0),
        vb,
    ));
    assert_mentions(&msg, &["kdim and vdim must be at least 1"]);
}

#[test]
fn head_dim_zero_in_sdpa_gives_the_mean_of_the_values() {
    let dev = Device::Cpu;
    let q = Tensor::zeros((1, 1, 2, 0), DType::F32, &dev).unwrap();
    let k = Tensor::zeros((1, 1, 4, 0), DType::F32, &dev).unwrap();
    let v = Tensor::arange(0f32, 12.0, &dev)
        .unwrap()
        .reshape((1, 1, 4, 3))
        .unwrap();
    for need_weights in [false, true] {
        let sdpa = SdpaArgs {
            need_weights,
            ..SdpaArgs::default()
        };
        let out = scaled_dot_product_attention(&q, &k, &v, &sdpa).unwrap();
        assert_eq!(
            out.output.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![4.5, 5.5, 6.5, 4.5, 5.5, 6.5]
        );
    }
}

#[test]
fn nan_in_one_query_token_stays_in_its_row() {
    let layer = mha(DType::F32);
    let q = input(1, 4);
    let poisoned = q
        .slice_assign(
            &[0..1, 2..3, 0..1],
            &Tensor::new(&[[[f32::NAN]]], &Device::Cpu).unwrap(),
        )
        .unwrap();
    for (out, _) in both_paths(&layer, &poisoned, &input(1, 70), Mask::none()) {
        for (i, row) in rows(&out).iter().enumerate() {
            assert_eq!(row.iter().all(|x| x.is_nan()), i == 2, "row {i}: {row:?}");
            assert!(
                i == 2 || row.iter().all(|x| x.is_finite()),
                "row {i}: {row:?}"
            );
        }
    }
}

#[test]
fn inf_in_a_key_poisons_every_row_as_in_torch() {
    let layer = mha(DType::F32);
    let kv = input(1, 70)
        .slice_assign(
            &[0..1, 5..6, 0..E],
            &Tensor::full(f32::INFINITY, (1, 1, E), &Device::Cpu).unwrap(),
        )
        .unwrap();
    for (out, _) in both_paths(&layer, &input(1, 4), &kv, Mask::none()) {
        for row in rows(&out) {
            assert!(row.iter().all(|x| x.is_nan()), "{row:?}");
        }
    }
}

#[test]
fn nan_in_an_additive_mask_poisons_that_query_only() {
    let layer = mha(DType::F32);
    let mut bias = vec![0f32; 4 * 70];
    bias[70 + 3] = f32::NAN; // query 1, key 3
    let mask = Mask::additive(Tensor::from_vec(bias, (4, 70), &Device::Cpu).unwrap()).unwrap();
    for (out, _) in both_paths(&layer, &input(1, 4), &input(1, 70), mask) {
        for (i, row) in rows(&out).iter().enumerate() {
            assert_eq!(row.iter().all(|x| x.is_nan()), i == 1, "row {i}: {row:?}");
        }
    }
}

#[test]
fn a_query_with_every_key_blocked_gets_zero_attention() {
    let layer = mha(DType::F32);
    let mut blocked = vec![0u8; 4 * 70];
    blocked[2 * 70..3 * 70].iter_mut().for_each(|b| *b = 1); // query 2 sees nothing
    let mask = Mask::boolean(Tensor::from_vec(blocked, (4, 70), &Device::Cpu).unwrap()).unwrap();
    for (out, weights) in both_paths(&layer, &input(1, 4), &input(1, 70), mask) {
        let out = rows(&out);
        assert_eq!(out[2], out_proj_bias(1)[0]);
        assert!(out.iter().flatten().all(|x| x.is_finite()));
        if let Some(w) = weights {
            let w = w.i((0, 2)).unwrap().to_vec1::<f32>().unwrap();
            assert!(w.iter().all(|&x| x == 0.0), "{w:?}");
        }
    }
}

#[test]
fn batch_sizes_that_differ_name_all_three_shapes() {
    let layer = mha(DType::F32);
    let msg = err_of(layer.attend(
        &input(2, 3),
        &input(3, 3),
        &input(3, 3),
        &args(Mask::none(), false),
    ));
    assert_mentions(&msg, &["same batch size", "[2, 3, 8]", "[3, 3, 8]"]);
}

#[test]
fn right_names_with_wrong_shapes_name_the_tensor_and_both_shapes() {
    let dev = Device::Cpu;
    let tensors = [
        (
            "in_proj_weight",
            Tensor::zeros((24, 8), DType::F32, &dev).unwrap(),
        ),
        ("in_proj_bias", Tensor::zeros(24, DType::F32, &dev).unwrap()),
        (
            "out_proj.weight",
            Tensor::zeros((8, 6), DType::F32, &dev).unwrap(),
        ),
        ("out_proj.bias", Tensor::zeros(8, DType::F32, &dev).unwrap()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &dev);
    let msg = err_of(MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(8, 2),
        vb,
    ));
    assert_mentions(&msg, &["out_proj.weight", "[8, 6]", "[8, 8]"]);
}

#[test]
fn f16_weights_with_f32_inputs_are_refused_by_the_library() {
    let layer = mha(DType::F16);
    let msg = err_of(layer.attend(
        &input(1, 3),
        &input(1, 3),
        &input(1, 3),
        &args(Mask::none(), false),
    ));
    assert_mentions(
        &msg,
        &["query has dtype F32", "weights are F16", "to_dtype"],
    );
}

#[test]
fn a_file_that_is_not_safetensors_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        (
            "text.safetensors",
            b"hello, this is not a tensor file at all".to_vec(),
        ),
        ("png.safetensors", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec()),
        ("empty.safetensors", Vec::new()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let msg = err_of(TensorFile::open(&path));
        assert_mentions(&msg, &[name, "is not a valid safetensors file"]);
    }
}

#[test]
fn plus_inf_in_an_additive_mask_is_nan_unless_another_mask_blocks_it() {
    let layer = mha(DType::F32);
    let mut bias = vec![0f32; 4 * 70];
    bias[70 + 3] = f32::INFINITY; // query 1, key 3: visible under causal + offset 66
    bias[2 * 70 + 69] = f32::INFINITY; // query 2, key 69: in its causal future
    bias[3 * 70 + 10] = f32::NAN; // query 3, key 10: padding
    let additive = Tensor::from_vec(bias, (4, 70), &Device::Cpu).unwrap();
    let mut padding = vec![0u8; 70];
    padding[10] = 1;
    let padding = Tensor::from_vec(padding, (1, 70), &Device::Cpu).unwrap();
    let mask = Mask::additive(additive)
        .unwrap()
        .and(Mask::causal_with_offset(66))
        .and(Mask::key_padding(padding).unwrap());
    for (out, _) in both_paths(&layer, &input(1, 4), &input(1, 70), mask) {
        for (i, row) in rows(&out).iter().enumerate() {
            assert_eq!(row.iter().all(|x| x.is_nan()), i == 1, "row {i}: {row:?}");
            assert!(
                i == 1 || row.iter().all(|x| x.is_finite()),
                "row {i}: {row:?}"
            );
        }
    }
}

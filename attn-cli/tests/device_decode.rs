//! Incremental decoding on the test device (`ATTN_TEST_DEVICE`, CPU by default): the KV-cached
//! steps equal the full teacher-forced pass, and greedy / beam search give the tokens the CPU
//! gives. In `f64` on the CPU the attention takes the device-generic blocked kernel (the tiled
//! CPU kernels take `f32`, `f16`, `bf16`), so one test runs the path GPUs take, reading the
//! KV cache's buffer views in place, even without a GPU.

#[path = "../../tests/common/mod.rs"]
mod common;

use attn_cli::number_translator::{Seq2Seq, Seq2SeqConfig};
use candle::{DType, Device, Tensor};
use candle_attention::transformer::TransformerConfig;
use candle_attention::{
    AttentionArgs, CachedAttentionArgs, KvCache, Mask, MultiHeadAttentionConfig,
};
use candle_nn::{VarBuilder, VarMap};
use common::{test_device, tolerance};
use std::collections::HashMap;

const PAD: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;

fn config() -> Seq2SeqConfig {
    Seq2SeqConfig {
        transformer: TransformerConfig {
            num_encoder_layers: 2,
            num_decoder_layers: 2,
            dim_feedforward: 32,
            dropout: 0.0,
            ..TransformerConfig::new(16, 4)
        },
        src_vocab_size: 13,
        tgt_vocab_size: 11,
        share_embeddings: false,
        tie_output: false,
        pad_id: PAD,
        bos_id: BOS,
        eos_id: EOS,
    }
}

/// Fresh weights (seeded through the VarMap's initialisers), detached so that no gradient is
/// tracked (the inference kernels only run then), loaded on `dev` in `dtype`.
fn models(dtypes_devices: &[(DType, Device)]) -> Vec<Seq2Seq> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    Seq2Seq::new(config(), vb).unwrap();
    let tensors = candle_attention::testing::detached_weights(&varmap);
    dtypes_devices
        .iter()
        .map(|(dtype, dev)| {
            let on: HashMap<String, Tensor> = tensors
                .iter()
                .map(|(k, v)| (k.clone(), v.to_device(dev).unwrap()))
                .collect();
            Seq2Seq::load(config(), VarBuilder::from_tensors(on, *dtype, dev)).unwrap()
        })
        .collect()
}

fn ids(rows: &[&[u32]], dev: &Device) -> Tensor {
    let width = rows.iter().map(|r| r.len()).max().unwrap();
    let flat: Vec<u32> = rows
        .iter()
        .flat_map(|r| r.iter().copied().chain(std::iter::repeat(PAD)).take(width))
        .collect();
    Tensor::from_vec(flat, (rows.len(), width), dev).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let flat = |t: &Tensor| -> Vec<f64> {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    flat(a).iter().zip(flat(b)).fold(0f64, |m, (x, y)| {
        if (x - y).is_nan() {
            f64::NAN
        } else {
            m.max((x - y).abs())
        }
    })
}

/// Step-by-step logits equal the full pass, on `model`'s device and dtype.
fn check_steps_equal_full_pass(model: &Seq2Seq, dev: &Device, tol: f64) {
    let src = ids(&[&[5, 6, 7, 8, 9], &[3, 4]], dev);
    let tgt = ids(&[&[BOS, 5, 6, 7, 8, 3], &[BOS, 9, 10]], dev);
    let full = model.forward(&src, &tgt, false).unwrap();
    let mut state = model.start(&src).unwrap();
    for pos in 0..tgt.dim(1).unwrap() {
        let step = model
            .step(&mut state, &tgt.narrow(1, pos, 1).unwrap())
            .unwrap();
        let err = max_abs_diff(&step, &full.narrow(1, pos, 1).unwrap());
        assert!(err <= tol, "position {pos}: {err} > {tol}");
    }
}

#[test]
fn cached_steps_equal_the_full_pass_on_the_test_device() {
    let dev = test_device();
    let model = models(&[(DType::F32, dev.clone())]).pop().unwrap();
    check_steps_equal_full_pass(&model, &dev, 10.0 * tolerance(DType::F32, &dev) as f64);
}

/// `f64` multi-head attention through a KV cache (the Transformer's layer norms have no `f64`
/// kernel in candle, the attention does): on the CPU this is the blocked kernel reading the
/// cache's `(B, H, len, D)` views of its `(B, H, capacity, D)` buffers, chunk after chunk, and
/// it equals the naive kernel's full causal pass.
#[test]
fn f64_cached_attention_runs_the_blocked_path_over_the_cache_view() {
    let cpu = Device::Cpu;
    let cfg = MultiHeadAttentionConfig::new(16, 4);
    let attn = candle_attention::testing::inference_attention(cfg, DType::F64, &cpu).unwrap();
    let (batch, len) = (2, 11);
    let x = Tensor::randn(0f64, 1., (batch, len, 16), &cpu).unwrap();
    let mut pad = vec![0u8; batch * len];
    pad[len - 2..len].fill(1);
    let pad = Tensor::from_vec(pad, (batch, len), &cpu).unwrap();
    // need_weights: the naive kernel.
    let full = attn
        .attend(
            &x,
            &x,
            &x,
            &AttentionArgs {
                mask: Mask::causal(),
                key_padding: Some(&pad),
                need_weights: true,
                ..Default::default()
            },
        )
        .unwrap()
        .output;
    let mut cache = KvCache::new();
    let mut start = 0;
    for chunk in [1, 3, 1, 1, 4, 1] {
        let seen = pad.narrow(1, 0, start + chunk).unwrap();
        let step = attn
            .attend_cached(
                &x.narrow(1, start, chunk).unwrap(),
                &mut cache,
                &CachedAttentionArgs {
                    key_padding: Some(&seen),
                    ..Default::default()
                },
            )
            .unwrap()
            .output;
        let err = max_abs_diff(&step, &full.narrow(1, start, chunk).unwrap());
        assert!(err <= 1e-10, "positions {start}..{}: {err}", start + chunk);
        start += chunk;
    }
    assert_eq!(cache.len(), len);
}

#[test]
fn search_on_the_test_device_gives_the_cpu_tokens() {
    let dev = test_device();
    let mut m = models(&[(DType::F32, dev.clone()), (DType::F32, Device::Cpu)]);
    let (cpu_model, dev_model) = (m.pop().unwrap(), m.pop().unwrap());
    let src_rows: [&[u32]; 3] = [&[5, 6, 7, 8, 9], &[3, 4], &[12, 11, 10]];
    for beam in [1, 3] {
        let want = cpu_model
            .generate(&ids(&src_rows, &Device::Cpu), 8, beam, 1.0)
            .unwrap();
        let got = dev_model
            .generate(&ids(&src_rows, &dev), 8, beam, 1.0)
            .unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "beam {beam}");
            assert!((g.log_prob - w.log_prob).abs() < 1e-3, "beam {beam}");
        }
    }
}

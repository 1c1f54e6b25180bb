//! The token-level model: incremental decoding equals the full pass, configs round-trip through
//! JSON, and training through autograd reaches every parameter.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::max_abs_diff;

use attn_cli::number_translator::{Seq2Seq, Seq2SeqConfig};
use candle::{DType, Device, Tensor, D};
use candle_attention::transformer::{Activation, TransformerConfig};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use proptest::prelude::*;

const PAD: u32 = 0;
const BOS: u32 = 1;
const EOS: u32 = 2;

fn tiny_config(norm_first: bool, share: bool) -> Seq2SeqConfig {
    Seq2SeqConfig {
        transformer: TransformerConfig {
            num_encoder_layers: 2,
            num_decoder_layers: 2,
            dim_feedforward: 32,
            dropout: 0.1,
            norm_first,
            activation: if norm_first {
                Activation::Gelu
            } else {
                Activation::Relu
            },
            ..TransformerConfig::new(16, 4)
        },
        src_vocab_size: 13,
        tgt_vocab_size: if share { 13 } else { 11 },
        share_embeddings: share,
        tie_output: share,
        pad_id: PAD,
        bos_id: BOS,
        eos_id: EOS,
    }
}

fn fresh_model(cfg: Seq2SeqConfig) -> (Seq2Seq, VarMap) {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    (Seq2Seq::new(cfg, vb).unwrap(), varmap)
}

/// Right-padded id rows `(batch, max_len)` with the given lengths; ids in `3..vocab`.
fn ids(lengths: &[usize], vocab: u32, seed: u64, first: Option<u32>) -> Tensor {
    let max = *lengths.iter().max().unwrap();
    let mut state = seed;
    let mut rows = Vec::new();
    for &len in lengths {
        for j in 0..max {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = match (j, first) {
                (0, Some(f)) => f,
                _ if j < len => 3 + ((state >> 33) as u32 % (vocab - 3)),
                _ => PAD,
            };
            rows.push(id);
        }
    }
    Tensor::from_vec(rows, (lengths.len(), max), &Device::Cpu).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    /// Feeding the target one token at a time through the KV cache gives the logits of the full
    /// teacher-forced pass (1e-5), with padded sources and targets, post- and pre-norm.
    #[test]
    fn incremental_decoding_equals_the_full_pass(
        src_lens in prop::collection::vec(1usize..7, 1..4),
        tgt_extra in prop::collection::vec(0usize..6, 3),
        norm_first in any::<bool>(),
        share in any::<bool>(),
        chunk in 1usize..3,
        seed in 0u64..1000,
    ) {
        let cfg = tiny_config(norm_first, share);
        let (model, _) = fresh_model(cfg.clone());
        let batch = src_lens.len();
        let tgt_lens: Vec<usize> = (0..batch).map(|i| 1 + tgt_extra[i % 3]).collect();
        let src = ids(&src_lens, cfg.src_vocab_size as u32, seed, None);
        let tgt = ids(&tgt_lens, cfg.tgt_vocab_size as u32, seed + 7, Some(BOS));
        let full = model.forward(&src, &tgt, false).unwrap();
        let mut state = model.start(&src).unwrap();
        let t = tgt.dim(1).unwrap();
        let mut pos = 0;
        while pos < t {
            let n = chunk.min(t - pos);
            let step = model.step(&mut state, &tgt.narrow(1, pos, n).unwrap()).unwrap();
            let err = max_abs_diff(&step, &full.narrow(1, pos, n).unwrap());
            prop_assert!(err < 1e-5, "positions {pos}..{}: {err}", pos + n);
            pos += n;
        }
        prop_assert_eq!(state.len(), t);
    }
}

#[test]
fn decode_state_rows_can_be_selected_like_beams() {
    let cfg = tiny_config(false, false);
    let (model, _) = fresh_model(cfg.clone());
    let src = ids(&[4, 2], 13, 3, None);
    let tgt = ids(&[3, 3], 11, 4, Some(BOS));
    let full = model.forward(&src, &tgt, false).unwrap();
    let mut state = model.start(&src).unwrap();
    model
        .step(&mut state, &tgt.narrow(1, 0, 2).unwrap())
        .unwrap();
    // Keep row 1 twice and row 0 once, then take the last step.
    let rows = Tensor::new(&[1u32, 0, 1], &Device::Cpu).unwrap();
    state.select_rows(&rows).unwrap();
    let last = tgt
        .narrow(1, 2, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .index_select(&rows, 0)
        .unwrap();
    let step = model.step(&mut state, &last).unwrap();
    let expected = full
        .narrow(1, 2, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .index_select(&rows, 0)
        .unwrap();
    assert!(max_abs_diff(&step, &expected) < 1e-5);
}

#[test]
fn config_round_trips_through_json_and_bad_configs_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    let cfg = tiny_config(true, true);
    cfg.save(&path).unwrap();
    assert_eq!(Seq2SeqConfig::load(&path).unwrap(), cfg);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"activation\": \"gelu\""), "{text}");

    let mut bad = tiny_config(false, true);
    bad.tgt_vocab_size = 7;
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("share_embeddings needs equal vocabularies"));
    let mut bad = tiny_config(false, false);
    bad.eos_id = 11;
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("eos_id 11"));
    std::fs::write(&path, "{ not json").unwrap();
    assert!(Seq2SeqConfig::load(&path)
        .unwrap_err()
        .to_string()
        .contains("not a valid Seq2Seq config"));
}

#[test]
fn out_of_range_ids_and_bad_shapes_are_errors() {
    let (model, _) = fresh_model(tiny_config(false, false));
    let src = Tensor::new(&[[3u32, 40]], &Device::Cpu).unwrap();
    let tgt = Tensor::new(&[[BOS]], &Device::Cpu).unwrap();
    let err = model.forward(&src, &tgt, false).unwrap_err().to_string();
    assert!(
        err.contains("token id 40 is out of range for a vocabulary of 13"),
        "{err}"
    );
    let err = model
        .forward(&Tensor::new(&[3i64, 4], &Device::Cpu).unwrap(), &tgt, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("(batch, seq) U32"), "{err}");
    let two = Tensor::new(&[[3u32], [4]], &Device::Cpu).unwrap();
    let err = model.forward(&two, &tgt, false).unwrap_err().to_string();
    assert!(err.contains("different batch sizes"), "{err}");
}

#[test]
fn training_reaches_every_parameter_and_lowers_the_loss() {
    let cfg = tiny_config(false, false);
    let (model, varmap) = fresh_model(cfg);
    let src = ids(&[5, 3], 13, 11, None);
    let tgt_in = ids(&[4, 4], 11, 12, Some(BOS));
    let tgt_out = ids(&[4, 4], 11, 13, None);
    let loss_of = |train: bool| -> Tensor {
        let logits = model.forward(&src, &tgt_in, train).unwrap();
        candle_nn::loss::cross_entropy(
            &logits.flatten_to(1).unwrap(),
            &tgt_out.flatten_all().unwrap(),
        )
        .unwrap()
    };
    let loss = loss_of(true);
    let grads = loss.backward().unwrap();
    let data = varmap.data().lock().unwrap().clone();
    let missing: Vec<&String> = data
        .iter()
        .filter(|(_, v)| {
            grads.get(v.as_tensor()).is_none_or(|g| {
                g.abs()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
                    == 0.0
            })
        })
        .map(|(n, _)| n)
        .collect();
    assert!(missing.is_empty(), "no gradient for {missing:?}");
    for name in [
        "transformer.encoder.layers.0.norm1.weight",
        "transformer.decoder.norm.bias",
        "tgt_embed.weight",
        "output.weight",
    ] {
        assert!(
            data.contains_key(name),
            "{name} among {:?}",
            data.keys().collect::<Vec<_>>()
        );
    }
    let before = loss_of(false).to_scalar::<f32>().unwrap();
    let mut opt = candle_nn::AdamW::new_lr(varmap.all_vars(), 1e-2).unwrap();
    for _ in 0..20 {
        opt.backward_step(&loss_of(true)).unwrap();
    }
    let after = loss_of(false).to_scalar::<f32>().unwrap();
    assert!(after < before * 0.7, "loss {before} -> {after}");
}

/// Greedy search through the cache picks, at every step, the argmax of the full teacher-forced
/// pass over the prefix it has produced; a beam hypothesis's log-probability is what the full
/// pass gives its tokens.
#[test]
fn search_follows_the_model() {
    let cfg = tiny_config(false, false);
    let (model, _) = fresh_model(cfg.clone());
    let src = ids(&[5, 2, 4], 13, 21, None);
    let greedy = model.generate(&src, 6, 1, 1.0).unwrap();
    for (row, hyp) in greedy.iter().enumerate() {
        let src_row = src.narrow(0, row, 1).unwrap();
        let mut prefix = vec![BOS];
        // Every generated token, EOS included when the model produced it.
        for (i, &token) in hyp.tokens[1..].iter().enumerate() {
            let tgt = Tensor::new(prefix.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let logits = model
                .forward(&src_row, &tgt, false)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .get(i)
                .unwrap();
            let mut scores: Vec<(f32, u32)> = logits
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .zip(0u32..)
                .collect();
            scores.retain(|(_, id)| *id != PAD && *id != BOS);
            let best =
                scores
                    .iter()
                    .cloned()
                    .fold((f32::NEG_INFINITY, 0), |a, b| if b.0 > a.0 { b } else { a });
            assert_eq!(token, best.1, "row {row} step {i}");
            prefix.push(token);
        }
    }
    let beam = model.generate(&src, 6, 4, 1.0).unwrap();
    for (row, hyp) in beam.iter().enumerate() {
        // BOS, the generated tokens and EOS when the model produced it.
        let seq = hyp.tokens.clone();
        assert_eq!(seq[0], BOS);
        let input = Tensor::new(&seq[..seq.len() - 1], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = model
            .forward(&src.narrow(0, row, 1).unwrap(), &input, false)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        let total: f32 = (1..seq.len())
            .map(|i| {
                log_probs
                    .get(i - 1)
                    .unwrap()
                    .get(seq[i] as usize)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap()
            })
            .sum();
        assert!(
            (total - hyp.log_prob).abs() < 1e-4,
            "row {row}: {total} vs {}",
            hyp.log_prob
        );
    }
    assert!(model.generate(&src, 6, 0, 1.0).is_err());
}

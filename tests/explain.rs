//! `candle_attention::explain`: the step-by-step computation equals the library's attention
//! (`MultiHeadAttention::attend` with per-head weights) on the same inputs, and, for every block
//! of a MarianMT directory, the block's output in the model's own forward pass, whose logits
//! are those of the plain forward pass. (The number translator of the `attn` command is
//! explained in `attn-cli/tests/number_translator_explain.rs`.)

mod common;
use common::explain::check_model_blocks;
use common::max_abs_diff;

use candle::{DType, Device, Tensor};
use candle_attention::explain::{explain_attention, AttentionUse, Explanation, RowStats};
use candle_attention::marian::MarianTranslator;
use candle_attention::{AttentionArgs, Mask, MultiHeadAttention, MultiHeadAttentionConfig};
use candle_nn::{VarBuilder, VarMap};
use std::path::{Path, PathBuf};

const TOL: f32 = 1e-5;

fn marian_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian_e2e")
}

/// The steps against `attend(need_weights, per head)` on the same inputs and mask.
fn check_against_attend(
    mha: &MultiHeadAttention,
    query: &Tensor,
    kv: &Tensor,
    mask: &Mask,
    what: &str,
) {
    let steps = explain_attention(mha, query, kv, kv, mask).unwrap();
    let batched = |t: &Tensor| {
        if t.rank() == 2 {
            t.unsqueeze(0).unwrap()
        } else {
            t.clone()
        }
    };
    let (q, kv) = (batched(query), batched(kv));
    let out = mha
        .attend(
            &q,
            &kv,
            &kv,
            &AttentionArgs {
                mask: mask.clone(),
                need_weights: true,
                average_weights: false,
                ..Default::default()
            },
        )
        .unwrap();
    let d_out = max_abs_diff(&steps.output, &out.output.squeeze(0).unwrap());
    let d_w = max_abs_diff(&steps.weights, &out.weights.unwrap().squeeze(0).unwrap());
    assert!(d_out < TOL, "{what}: output differs by {d_out}");
    assert!(d_w < TOL, "{what}: weights differ by {d_w}");
    // The intermediate steps are what they claim to be.
    let (h, l, s) = steps.scores.dims3().unwrap();
    assert_eq!(h, mha.config().num_heads);
    let by_hand = steps.q.matmul(&steps.k.t().unwrap()).unwrap();
    assert!(
        max_abs_diff(&steps.scores, &by_hand) < TOL,
        "{what}: scores"
    );
    let scaled = (&steps.scores * steps.scale).unwrap();
    assert!(max_abs_diff(&steps.scaled, &scaled) < TOL, "{what}: scaled");
    assert_eq!(steps.concat.dims(), &[l, h * steps.value_dim]);
    assert_eq!(steps.blended.dims(), &[h, l, steps.value_dim]);
    assert_eq!(steps.weights.dims(), &[h, l, s]);
    for head in 0..h {
        for row in steps.head_rows(&steps.weights, head).unwrap() {
            let sum: f32 = row.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-5 || sum == 0.0,
                "{what}: a row sums to {sum}"
            );
        }
    }
}

fn fresh_mha(cfg: MultiHeadAttentionConfig) -> MultiHeadAttention {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    MultiHeadAttention::new(cfg, vb).unwrap()
}

#[test]
fn steps_equal_attend_with_weights_for_every_kind_of_mask() {
    let dev = Device::Cpu;
    let mha = fresh_mha(MultiHeadAttentionConfig::new(32, 4));
    let x = Tensor::randn(0f32, 1., (6, 32), &dev).unwrap();
    let m = Tensor::randn(0f32, 1., (9, 32), &dev).unwrap();
    check_against_attend(&mha, &x, &x, &Mask::none(), "self, no mask");
    check_against_attend(&mha, &x, &x, &Mask::causal(), "self, causal");
    check_against_attend(&mha, &x, &m, &Mask::none(), "cross, L != S");
    let pad = Tensor::new(&[[0u8, 0, 0, 0, 0, 0, 1, 1, 1]], &dev).unwrap();
    check_against_attend(
        &mha,
        &x,
        &m,
        &Mask::key_padding(pad).unwrap(),
        "cross, key padding",
    );
    // A row with every key blocked: zeros, as attend defines it.
    let all = Tensor::ones((6, 6), DType::U8, &dev).unwrap();
    check_against_attend(
        &mha,
        &x,
        &x,
        &Mask::boolean(all).unwrap(),
        "everything blocked",
    );
    let gqa = fresh_mha(MultiHeadAttentionConfig::new(32, 4).with_num_kv_heads(2));
    check_against_attend(&gqa, &x, &x, &Mask::causal(), "grouped-query");
}

#[test]
fn add_bias_kv_is_refused_with_a_reason() {
    let mha = fresh_mha(MultiHeadAttentionConfig::new(16, 2).with_add_bias_kv(true));
    let x = Tensor::zeros((3, 16), DType::F32, &Device::Cpu).unwrap();
    let err = explain_attention(&mha, &x, &x, &x, &Mask::none())
        .unwrap_err()
        .to_string();
    assert!(err.contains("add_bias_kv"), "{err}");
}

#[test]
fn marian_blocks_equal_its_forward_pass() {
    let t = MarianTranslator::from_dir(marian_dir(), &Device::Cpu).unwrap();
    let text = "I see three hundred twelve birds.";
    let cfg = t.model().config().clone();
    check_model_blocks(
        |u, l| Explanation::of_model(t.model(), t.teacher_forcing(text)?, u, l),
        (cfg.encoder_layers, cfg.decoder_layers),
    );
    let e = Explanation::of_model(
        t.model(),
        t.teacher_forcing(text).unwrap(),
        AttentionUse::DecoderSelf,
        0,
    )
    .unwrap();
    assert_eq!(e.example.source_tokens.last().unwrap(), "</s>");
    assert_eq!(Some(e.example.decoder_ids[0]), cfg.decoder_start_token_id);
    // The trace's logits are the model's forward pass.
    let dev = Device::Cpu;
    let ids = Tensor::new(e.example.source_ids.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let dec = Tensor::new(e.example.decoder_ids.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let mask = ids.ones_like().unwrap();
    let (logits, memory) = t.model().forward(&ids, &mask, &dec).unwrap();
    let trace = t.model().trace(&ids, &mask, &dec).unwrap();
    assert_eq!(max_abs_diff(&trace.logits, &logits), 0.0);
    assert_eq!(max_abs_diff(&trace.memory, &memory), 0.0);
    assert_eq!(max_abs_diff(&e.logits, &logits.squeeze(0).unwrap()), 0.0);
}

#[test]
fn bad_layers_heads_and_uses_are_errors_that_say_what_is_valid() {
    let t = MarianTranslator::from_dir(marian_dir(), &Device::Cpu).unwrap();
    let example = || t.teacher_forcing("Is it forty-two?").unwrap();
    let err = Explanation::of_model(t.model(), example(), AttentionUse::EncoderSelf, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer 2") && err.contains("0..=1"), "{err}");
    let e = Explanation::of_model(t.model(), example(), AttentionUse::EncoderSelf, 0).unwrap();
    let heads = e.steps.num_heads;
    let err = e.steps.check_head(heads).unwrap_err().to_string();
    assert!(
        err.contains(&format!("head {heads}")) && err.contains(&format!("0..={}", heads - 1)),
        "{err}"
    );
    let err = "sideways".parse::<AttentionUse>().unwrap_err().to_string();
    assert!(
        err.contains("encoder-self") && err.contains("decoder-self") && err.contains("cross"),
        "{err}"
    );
}

#[test]
fn row_statistics_of_known_rows() {
    let one_hot = RowStats::of(&[0.0, 1.0, 0.0]);
    assert_eq!(one_hot.argmax, 1);
    assert_eq!(one_hot.entropy_bits, 0.0);
    assert_eq!(one_hot.max_gradient, 0.0);
    let half = RowStats::of(&[0.5, 0.5]);
    assert!((half.entropy_bits - 1.0).abs() < 1e-6);
    assert!((half.max_gradient - 0.25).abs() < 1e-6);
    let quarter = RowStats::of(&[0.25; 4]);
    assert!((quarter.entropy_bits - 2.0).abs() < 1e-6);
    // p_i (1 - p_i) = 0.1875 on the diagonal beats p_i p_j = 0.0625 off it.
    assert!((quarter.max_gradient - 0.1875).abs() < 1e-6);
}

/// Against transformers (tests/fixtures/make_explain_fixture.py): the same decoder input (our
/// tokenizer and greedy search), every block's weights equal `output_attentions`, and every
/// block's input equals `output_hidden_states`.
#[test]
fn marian_steps_equal_transformers_attentions_and_hidden_states() {
    let dev = Device::Cpu;
    let fixture = candle::safetensors::load(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/explain/marian_e2e.safetensors"),
        &dev,
    )
    .unwrap();
    let ids = |name: &str| -> Vec<u32> {
        fixture[name]
            .squeeze(0)
            .unwrap()
            .to_vec1::<i64>()
            .unwrap()
            .into_iter()
            .map(|i| i as u32)
            .collect()
    };
    let t = MarianTranslator::from_dir(marian_dir(), &dev).unwrap();
    let text = "I see three hundred twelve birds.";
    let mut compared = 0;
    for attention in AttentionUse::ALL {
        for layer in 0..2 {
            let e = Explanation::of_model(
                t.model(),
                t.teacher_forcing(text).unwrap(),
                attention,
                layer,
            )
            .unwrap();
            assert_eq!(e.example.source_ids, ids("input_ids"));
            assert_eq!(e.example.decoder_ids, ids("decoder_input_ids"));
            let (weights, hidden) = match attention {
                AttentionUse::EncoderSelf => ("encoder_attentions", "encoder_hidden_states"),
                AttentionUse::DecoderSelf => ("decoder_attentions", "decoder_hidden_states"),
                AttentionUse::Cross => ("cross_attentions", "encoder_hidden_states"),
            };
            let want = fixture[&format!("{weights}.{layer}")].squeeze(0).unwrap();
            let d = max_abs_diff(&e.steps.weights, &want);
            assert!(d < TOL, "{attention} layer {layer}: weights differ by {d}");
            // Post-norm Marian: a layer's input is its self-attention's input; cross-attention
            // reads the encoder output (the last hidden state).
            let (input, want) = match attention {
                AttentionUse::Cross => (&e.steps.key_input, format!("{hidden}.2")),
                _ => (&e.steps.query_input, format!("{hidden}.{layer}")),
            };
            let want = fixture[&want].squeeze(0).unwrap();
            let d = max_abs_diff(input, &want);
            assert!(
                d < 1e-4,
                "{attention} layer {layer}: block input differs by {d}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 6);
}

//! The number translator under `candle_attention::explain`: for every block of the shipped
//! model, the explained output equals the block's output in the model's own forward pass, whose
//! logits are those of the plain forward pass; the weights it reports for heatmaps are the
//! explained ones.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::explain::check_model_blocks;
use common::max_abs_diff;

use attn_cli::number_translator::translator::Translator;
use candle::{Device, Tensor};
use candle_attention::explain::{AttentionUse, Explanation};

const TOL: f32 = 1e-5;

fn shipped() -> Translator {
    Translator::load(common::repo_root().join("weights"), &Device::Cpu).unwrap()
}

/// What `attn explain` runs for the number translator.
fn explain(
    t: &Translator,
    text: &str,
    attention: AttentionUse,
    layer: usize,
) -> candle::Result<Explanation> {
    Explanation::of_model(t.model(), t.teacher_forcing(text)?, attention, layer)
}

#[test]
fn shipped_model_blocks_equal_its_forward_pass() {
    let t = shipped();
    let text = "three hundred and forty-two";
    let cfg = t.model().config().transformer.clone();
    check_model_blocks(
        |u, l| explain(&t, text, u, l),
        (cfg.num_encoder_layers, cfg.num_decoder_layers),
    );
    let e = explain(&t, text, AttentionUse::Cross, 1).unwrap();
    assert_eq!(e.example.translation, "dreihundertzweiundvierzig");
    assert_eq!(e.example.decoder_tokens[0], "<bos>");
    assert_eq!(
        e.example.source_tokens,
        ["three", "hundred", "and", "forty", "-", "two"]
    );
    assert_eq!(e.steps.head_dim, 16);
    assert_eq!(e.steps.scores.dims(), &[8, e.example.decoder_ids.len(), 6]);
}

#[test]
fn shipped_trace_is_the_forward_pass() {
    let t = shipped();
    let ex = t.teacher_forcing("nine hundred and one").unwrap();
    let dev = Device::Cpu;
    let src = Tensor::new(ex.source_ids.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let tgt = Tensor::new(ex.decoder_ids.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let trace = t.model().trace(&src, &tgt).unwrap();
    let logits = t.model().forward(&src, &tgt, false).unwrap();
    assert_eq!(max_abs_diff(&trace.logits, &logits), 0.0);
    let (memory, _) = t.model().encode(&src, false).unwrap();
    assert_eq!(max_abs_diff(&trace.memory, &memory), 0.0);
    // Cross-attention reads the encoder output; self-attention its own input.
    for layer in &trace.decoder {
        assert_eq!(max_abs_diff(&layer.cross_attn.key_value, &memory), 0.0);
        assert_eq!(
            max_abs_diff(&layer.self_attn.key_value, &layer.self_attn.query),
            0.0
        );
    }
    // The greedy translation is what the logits predict, position by position.
    let predicted: Vec<u32> = logits
        .squeeze(0)
        .unwrap()
        .argmax(1)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(&predicted[..predicted.len() - 1], &ex.decoder_ids[1..]);
    assert_eq!(*predicted.last().unwrap(), t.model().config().eos_id);
    // The weights the model reports for its heatmaps are the explained ones.
    let cross = t.model().cross_attention(&src, &tgt).unwrap();
    for (layer, w) in cross.iter().enumerate() {
        let e = explain(&t, "nine hundred and one", AttentionUse::Cross, layer).unwrap();
        assert!(max_abs_diff(&e.steps.weights, &w.squeeze(0).unwrap()) < TOL);
    }
}

#[test]
fn texts_it_cannot_take_are_errors_that_say_why() {
    let t = shipped();
    let err = explain(&t, "fourty", AttentionUse::EncoderSelf, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fourty"), "{err}");
    let err = explain(&t, "seven", AttentionUse::EncoderSelf, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer 2") && err.contains("0..=1"), "{err}");
}

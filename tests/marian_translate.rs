//! Text to text with a complete MarianMT directory (tests/fixtures/marian_e2e, made by
//! tests/fixtures/make_marian_e2e_fixture.py): [`Translator`] (our tokenizer, model and
//! generate(), batched by length) against the transformers pipeline
//! `tokenizer(texts, padding=True)` → `generate()` → `batch_decode(skip_special_tokens=True)`,
//! for every recorded setting.

use candle::Device;
use candle_attention::marian::MarianTranslator;
use candle_attention::{ErrorKind, TranslateOptions, Translator};
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian_e2e")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap()).unwrap()
}

/// The options of a recorded case: the directory's settings, overridden by its kwargs.
fn options(kwargs: &serde_json::Value) -> TranslateOptions {
    TranslateOptions {
        beam: kwargs
            .get("num_beams")
            .map(|b| b.as_u64().unwrap() as usize),
        max_new_tokens: kwargs
            .get("max_new_tokens")
            .map(|t| t.as_u64().unwrap() as usize),
        ..TranslateOptions::default()
    }
}

#[test]
fn translations_equal_the_transformers_pipeline() {
    let translator = Translator::from_dir(dir()).unwrap();
    let exp = expected();
    let texts: Vec<String> = exp["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let mut compared = 0;
    let mut mismatches = Vec::new();
    for setting in exp["settings"].as_array().unwrap() {
        let name = setting["name"].as_str().unwrap();
        let got = translator
            .translate(&texts, &options(&setting["generate_kwargs"]))
            .unwrap();
        let want = setting["batched"]["texts"].as_array().unwrap();
        for ((text, got), want) in texts.iter().zip(got).zip(want) {
            let got = got.unwrap().text;
            compared += 1;
            if got != want.as_str().unwrap() {
                mismatches.push(format!("{name}: {text:?} -> {got:?}, transformers {want}"));
            }
        }
    }
    println!(
        "{compared} translations compared, {} mismatches",
        mismatches.len()
    );
    assert!(compared >= 100);
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn the_tokenizer_gives_the_pipelines_padded_batch() {
    let translator = MarianTranslator::from_dir(dir(), &Device::Cpu).unwrap();
    let exp = expected();
    let texts: Vec<&str> = exp["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let batch = translator.tokenizer().encode_batch_padded(&texts).unwrap();
    let want_ids: Vec<Vec<u32>> =
        serde_json::from_value(exp["tokenized"]["input_ids"].clone()).unwrap();
    let want_mask: Vec<Vec<u32>> =
        serde_json::from_value(exp["tokenized"]["attention_mask"].clone()).unwrap();
    assert_eq!(batch.input_ids, want_ids);
    assert_eq!(batch.attention_mask, want_mask);
}

#[test]
fn a_text_too_long_fails_alone() {
    let translator = Translator::from_dir(dir()).unwrap();
    let long = "nine hundred ninety-nine ".repeat(200);
    let out = translator
        .translate(
            &[
                "Is it forty-two?",
                long.as_str(),
                "over five hundred twenty-two bridges",
            ],
            &TranslateOptions::default(),
        )
        .unwrap();
    assert_eq!(out[0].as_ref().unwrap().text, "Ist es zweiundvierzig?");
    let err = out[1].as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Input);
    assert!(
        err.message().contains("max_position_embeddings = 512"),
        "{err}"
    );
    assert!(out[2].is_ok());
}

#[test]
fn a_vocabulary_that_disagrees_with_the_model_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
    }
    // Drop one piece from vocab.json: 323 entries for a model of 324 tokens.
    let vocab_path = tmp.path().join("vocab.json");
    let mut vocab: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&vocab_path).unwrap()).unwrap();
    let victim = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(100))
        .map(|(k, _)| k.clone())
        .unwrap();
    vocab.remove(&victim);
    std::fs::write(&vocab_path, serde_json::to_string(&vocab).unwrap()).unwrap();
    let err = Translator::from_dir(tmp.path())
        .expect_err("a vocabulary of the wrong size must be refused")
        .to_string();
    assert!(err.contains("323 tokens") && err.contains("324"), "{err}");
}

/// The n-best hypotheses of one padded batch and their scores are transformers'
/// `generate(..., num_return_sequences=K, output_scores=True)`: sequences and
/// `sequences_scores` (1e-4), for every beam setting of `nbest.json`.
#[test]
fn n_best_hypotheses_and_scores_equal_transformers() {
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("nbest.json")).unwrap()).unwrap();
    let base = MarianTranslator::from_dir(dir(), &Device::Cpu).unwrap();
    let texts: Vec<&str> = fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let encoded: Vec<Vec<u32>> = texts.iter().map(|t| base.encode(t).unwrap()).collect();
    let mut compared = 0;
    for setting in fx["beam"].as_array().unwrap() {
        let kw = &setting["generate_kwargs"];
        let mut cfg = base
            .generation_config()
            .clone()
            .with_num_beams(kw["num_beams"].as_u64().unwrap() as usize)
            .with_num_return_sequences(kw["num_return_sequences"].as_u64().unwrap() as usize);
        if let Some(p) = kw.get("length_penalty") {
            cfg = cfg.with_length_penalty(p.as_f64().unwrap());
        }
        let t = base.clone().with_generation_config(cfg);
        let got = t.generate_encoded(&encoded).unwrap();
        for (i, (hyps, want)) in got
            .into_iter()
            .zip(setting["items"].as_array().unwrap())
            .enumerate()
        {
            let hyps = hyps.unwrap();
            for (k, h) in hyps.iter().enumerate() {
                let seq: Vec<u32> = want["sequences"][k]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as u32)
                    .collect();
                assert_eq!(h.tokens, seq, "{} text {i} hypothesis {k}", setting["name"]);
                let w = want["sequences_scores"][k].as_f64().unwrap() as f32;
                assert!(
                    (h.score - w).abs() <= 1e-4,
                    "{} text {i} hypothesis {k}: {} vs {w}",
                    setting["name"],
                    h.score
                );
                assert_eq!(t.decode(h).unwrap(), want["texts"][k].as_str().unwrap());
                compared += 1;
            }
        }
    }
    eprintln!("{compared} hypotheses: sequences equal, scores within 1e-4");
}

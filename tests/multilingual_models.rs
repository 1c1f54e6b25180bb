//! M2M100 (NLLB-200 dense) and mBART against transformers 5.24: logits and encoder states of
//! padded batches (right and left padding), `generate()` sequences (greedy and beam 4) on the
//! same batches, M2M100's sinusoidal table, and the refusals (unknown `model_type`, unknown
//! config key, missing tensor). Fixtures: tests/fixtures/make_multilingual_model_fixtures.py;
//! the trained text-to-text directories of tests/fixtures/make_multilingual_e2e_fixtures.py
//! through `MultilingualTranslator` (ids and sequences).

use candle::{DType, Device, Tensor};
use candle_attention::generation::{generate_padded, GenerationConfig};
use candle_attention::models::encoder_decoder::{m2m100_position_ids, m2m100_positions};
use candle_attention::models::family_config::FamilyConfig;
use candle_attention::models::m2m100::M2M100;
use candle_attention::models::mbart::MBART;
use candle_attention::models::seq2seq::{Family, Seq2SeqModel};
use candle_attention::tokenizers::load_multilingual_tokenizer;
use candle_attention::TensorFile;
use candle_attention::{TranslateOptions, Translator};
use std::path::{Path, PathBuf};

const VARIANTS: [&str; 3] = ["m2m100_tied", "m2m100_untied", "mbart"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/multilingual")
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    a.iter().zip(&b).fold(0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}

fn ids(file: &TensorFile, name: &str) -> Tensor {
    file.load(name, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap()
}

#[test]
fn families_are_detected_from_model_type() {
    let dir = fixtures();
    assert_eq!(
        Family::of_dir(dir.join("m2m100_tied")).unwrap(),
        Family::M2M100
    );
    assert_eq!(Family::of_dir(dir.join("mbart")).unwrap(), Family::MBart);
    let marian = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian/base");
    assert_eq!(Family::of_dir(&marian).unwrap(), Family::Marian);
    let err = Seq2SeqModel::from_dir(&marian, &Device::Cpu).unwrap_err();
    assert!(err.to_string().contains("MarianMT"), "{err}");
}

#[test]
fn logits_and_encoder_states_match_transformers() {
    for variant in VARIANTS {
        let dir = fixtures().join(variant);
        let model =
            Seq2SeqModel::from_dir(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{variant}: {e}"));
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        for side in ["right", "left"] {
            let (logits, memory) = model
                .forward(
                    &ids(&inputs, &format!("input_ids_{side}")),
                    &ids(&inputs, &format!("attention_mask_{side}")),
                    &ids(&inputs, "decoder_input_ids"),
                )
                .unwrap();
            let want_logits = expected
                .load(&format!("logits_{side}"), &Device::Cpu)
                .unwrap();
            let want_memory = expected
                .load(&format!("encoder_last_hidden_state_{side}"), &Device::Cpu)
                .unwrap();
            let (dl, dm) = (
                max_abs_diff(&logits, &want_logits),
                max_abs_diff(&memory, &want_memory),
            );
            println!("{variant} {side}: logits {dl:.2e}, encoder {dm:.2e}");
            assert!(dl <= 1e-4, "{variant} {side}: logits differ by {dl}");
            assert!(
                dm <= 1e-4,
                "{variant} {side}: encoder states differ by {dm}"
            );
        }
    }
}

#[test]
fn step_by_step_decoding_matches_the_full_pass() {
    // The decoder fed one token at a time through its caches gives the full pass's logits,
    // pads included (M2M100 positions continue from the cache length; pads take the zero row).
    for variant in VARIANTS {
        let dir = fixtures().join(variant);
        let model = Seq2SeqModel::from_dir(&dir, &Device::Cpu).unwrap();
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let input_ids = ids(&inputs, "input_ids_right");
        let mask = ids(&inputs, "attention_mask_right");
        let dec = ids(&inputs, "decoder_input_ids");
        let (full, _) = model.forward(&input_ids, &mask, &dec).unwrap();
        let mut state = model.start(&input_ids, &mask).unwrap();
        for t in 0..dec.dim(1).unwrap() {
            let step = model
                .step_logits(&mut state, &dec.narrow(1, t, 1).unwrap())
                .unwrap();
            let d = max_abs_diff(&step, &full.narrow(1, t, 1).unwrap());
            assert!(d <= 1e-4, "{variant} step {t}: {d}");
        }
    }
}

#[test]
fn generate_matches_transformers_greedy_and_beam4() {
    for variant in VARIANTS {
        let dir = fixtures().join(variant);
        let model = Seq2SeqModel::from_dir(&dir, &Device::Cpu).unwrap();
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        let base = GenerationConfig::from_model_dir(&dir).unwrap();
        for side in ["right", "left"] {
            let input_ids = ids(&inputs, &format!("input_ids_{side}"));
            let mask = ids(&inputs, &format!("attention_mask_{side}"));
            for (case, beams) in [("greedy", 1), ("beam4", 4)] {
                let cfg = base.clone().with_num_beams(beams).with_max_new_tokens(10);
                let state = model.start(&input_ids, &mask).unwrap();
                let (got, shape) = generate_padded(&model, state, 3, &cfg).unwrap();
                let want = expected
                    .load(&format!("sequences.{case}_{side}"), &Device::Cpu)
                    .unwrap();
                let want_shape = want.dims2().unwrap();
                let want: Vec<i64> = want.flatten_all().unwrap().to_vec1().unwrap();
                let got: Vec<i64> = got.into_iter().map(i64::from).collect();
                assert_eq!(shape, want_shape, "{variant} {case}_{side}: shape");
                assert_eq!(got, want, "{variant} {case}_{side}: sequences");
            }
        }
    }
}

#[test]
fn m2m100_table_matches_transformers_get_embedding() {
    let file = TensorFile::open(fixtures().join("m2m100_positions.safetensors")).unwrap();
    for (name, rows, dim, pad) in [
        ("table_1100x8_pad1", 1100, 8, 1),
        ("table_40x13_pad5", 40, 13, 5),
    ] {
        let want = file.load(name, &Device::Cpu).unwrap();
        let got = m2m100_positions(rows, dim, Some(pad), DType::F32, &Device::Cpu).unwrap();
        let d = max_abs_diff(&got, &want);
        println!("{name}: {d:.2e}");
        assert!(d <= 1e-6, "{name}: differs by {d}");
    }
    assert!(m2m100_positions(4, 3, None, DType::F32, &Device::Cpu).is_err());
}

#[test]
fn m2m100_position_ids_count_tokens_per_row() {
    // transformers: (cumsum(ids != pad) + past) * (ids != pad) + pad
    assert_eq!(
        m2m100_position_ids(&[1, 1, 7, 8, 2], 1, 0),
        vec![1, 1, 2, 3, 4]
    );
    assert_eq!(m2m100_position_ids(&[2, 5, 1, 7], 1, 0), vec![2, 3, 1, 4]);
    assert_eq!(m2m100_position_ids(&[9], 1, 4), vec![6]);
    assert_eq!(m2m100_position_ids(&[1], 1, 4), vec![1]);
}

fn config_text(variant: &str) -> String {
    std::fs::read_to_string(fixtures().join(variant).join("config.json")).unwrap()
}

fn with_key(text: &str, key: &str, value: serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
    v[key] = value;
    v.to_string()
}

#[test]
fn config_keys_are_honoured_or_refused_by_name() {
    let text = config_text("m2m100_tied");
    let cfg = FamilyConfig::from_json(&text, &M2M100).unwrap();
    assert_eq!(
        (cfg.d_model, cfg.vocab_size, cfg.encoder_layers),
        (32, 128, 2)
    );
    assert_eq!(cfg.decoder_start_token_id, Some(2));
    // Unknown keys are refused with their name.
    let err = FamilyConfig::from_json(&with_key(&text, "rope_theta", 1e4.into()), &M2M100)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rope_theta"), "{err}");
    // Keys that ask for another model.
    let err = FamilyConfig::from_json(&with_key(&text, "is_decoder", true.into()), &M2M100)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is_decoder"), "{err}");
    let arch = serde_json::json!(["M2M100ForSequenceClassification"]);
    let err = FamilyConfig::from_json(&with_key(&text, "architectures", arch), &M2M100)
        .unwrap_err()
        .to_string();
    assert!(err.contains("M2M100ForSequenceClassification"), "{err}");
    // Aliases (transformers' attribute_map) and contradictions.
    let cfg = FamilyConfig::from_json(&with_key(&text, "hidden_size", 32.into()), &M2M100).unwrap();
    assert_eq!(cfg.d_model, 32);
    let err = FamilyConfig::from_json(&with_key(&text, "hidden_size", 64.into()), &M2M100)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hidden_size") && err.contains("d_model"),
        "{err}"
    );
    // Sizes and ids are checked.
    let err = FamilyConfig::from_json(
        &with_key(&text, "encoder_attention_heads", 5.into()),
        &M2M100,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("divisible"), "{err}");
    let err = FamilyConfig::from_json(
        &with_key(&text, "decoder_start_token_id", 500.into()),
        &M2M100,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("decoder_start_token_id"), "{err}");
    let err = FamilyConfig::from_json(
        &with_key(&text, "activation_function", "tanhh".into()),
        &M2M100,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("tanhh"), "{err}");
    // The wrong family's model_type.
    let err = FamilyConfig::from_json(&text, &MBART)
        .unwrap_err()
        .to_string();
    assert!(err.contains("m2m_100") && err.contains("mBART"), "{err}");
    // mBART's legacy fairseq keys are inert in transformers, and here.
    let mbart = with_key(&config_text("mbart"), "normalize_before", true.into());
    let mbart = with_key(&mbart, "static_position_embeddings", false.into());
    FamilyConfig::from_json(&mbart, &MBART).unwrap();
}

/// A copy of a fixture directory in a temporary place, with `edit` applied.
fn edited_copy(variant: &str, edit: impl Fn(&Path)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "attn-multilingual-{variant}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixtures().join(variant)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    edit(&dir);
    dir
}

#[test]
fn unsupported_model_type_names_it_and_the_supported_ones() {
    let dir = edited_copy("mbart", |d| {
        let text = with_key(&config_text("mbart"), "model_type", "t5".into());
        std::fs::write(d.join("config.json"), text).unwrap();
    });
    let err = Seq2SeqModel::from_dir(&dir, &Device::Cpu)
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.contains("\"t5\""), "{err}");
    for supported in ["marian", "m2m_100", "mbart"] {
        assert!(err.contains(supported), "{err}");
    }
}

#[test]
fn a_missing_tensor_is_named() {
    // mBART without its decoder's learned positions.
    let dir = edited_copy("mbart", |d| {
        let file = TensorFile::open(d.join("model.safetensors")).unwrap();
        let names: Vec<String> = file
            .names()
            .into_iter()
            .filter(|n| *n != "model.decoder.embed_positions.weight")
            .map(str::to_string)
            .collect();
        let tensors: Vec<(String, Tensor)> = names
            .iter()
            .map(|n| (n.clone(), file.load(n, &Device::Cpu).unwrap()))
            .collect();
        drop(file);
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        candle_attention::save_tensors(&refs, d.join("model.safetensors")).unwrap();
    });
    let err = Seq2SeqModel::from_dir(&dir, &Device::Cpu)
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        err.contains("model.decoder.embed_positions.weight"),
        "{err}"
    );
}

#[test]
fn hub_style_configs_are_accepted() {
    // The key sets of the hub's config.json files (nllb-200-distilled-600M, m2m100_418M,
    // mbart-large-50-many-to-many-mmt), written from memory of those files: every key is one
    // transformers acts on, or one it keeps without acting on at inference.
    let nllb = r#"{"_name_or_path": "nllb", "activation_dropout": 0.0, "activation_function": "relu",
        "architectures": ["M2M100ForConditionalGeneration"], "attention_dropout": 0.1,
        "bos_token_id": 0, "d_model": 1024, "decoder_attention_heads": 16, "decoder_ffn_dim": 4096,
        "decoder_layerdrop": 0, "decoder_layers": 12, "decoder_start_token_id": 2, "dropout": 0.1,
        "encoder_attention_heads": 16, "encoder_ffn_dim": 4096, "encoder_layerdrop": 0,
        "encoder_layers": 12, "eos_token_id": 2, "init_std": 0.02, "is_encoder_decoder": true,
        "max_length": 200, "max_position_embeddings": 1024, "model_type": "m2m_100",
        "num_hidden_layers": 12, "pad_token_id": 1, "scale_embedding": true,
        "tokenizer_class": "NllbTokenizer", "torch_dtype": "float32",
        "transformers_version": "4.21.0.dev0", "use_cache": true, "vocab_size": 256206}"#;
    let cfg = FamilyConfig::from_json(nllb, &M2M100).unwrap();
    assert_eq!((cfg.vocab_size, cfg.d_model), (256206, 1024));
    let m2m = r#"{"activation_function": "relu", "architectures": ["M2M100ForConditionalGeneration"],
        "d_model": 1024, "early_stopping": true, "gradient_checkpointing": false, "max_length": 200,
        "model_type": "m2m_100", "num_beams": 5, "vocab_size": 128112}"#;
    let cfg = FamilyConfig::from_json(m2m, &M2M100).unwrap();
    assert_eq!(cfg.decoder_start_token_id, Some(2));
    let mbart = r#"{"_name_or_path": "mbart", "_num_labels": 3, "activation_dropout": 0.0,
        "activation_function": "gelu", "add_bias_logits": false, "add_final_layer_norm": true,
        "architectures": ["MBartForConditionalGeneration"], "attention_dropout": 0.0,
        "bos_token_id": 0, "classif_dropout": 0.0, "classifier_dropout": 0.0, "d_model": 1024,
        "decoder_attention_heads": 16, "decoder_ffn_dim": 4096, "decoder_layerdrop": 0.0,
        "decoder_layers": 12, "decoder_start_token_id": 2, "dropout": 0.1, "early_stopping": true,
        "encoder_attention_heads": 16, "encoder_ffn_dim": 4096, "encoder_layerdrop": 0.0,
        "encoder_layers": 12, "eos_token_id": 2, "forced_eos_token_id": 2,
        "gradient_checkpointing": false, "id2label": {"0": "LABEL_0"}, "init_std": 0.02,
        "is_encoder_decoder": true, "label2id": {"LABEL_0": 0}, "max_length": 200,
        "max_position_embeddings": 1024, "model_type": "mbart", "normalize_before": true,
        "normalize_embedding": true, "num_beams": 5, "num_hidden_layers": 12, "output_past": true,
        "pad_token_id": 1, "scale_embedding": true, "static_position_embeddings": false,
        "tokenizer_class": "MBart50Tokenizer", "transformers_version": "4.4.0.dev0",
        "use_cache": true, "vocab_size": 250054}"#;
    let cfg = FamilyConfig::from_json(mbart, &MBART).unwrap();
    assert_eq!(
        (cfg.vocab_size, cfg.activation_function.as_str()),
        (250054, "gelu")
    );
}

#[test]
fn half_precision_weights_load_and_compute_in_f32() {
    // The mBART fixture's weights stored as f16 (and bf16): loaded, upcast, and within the
    // weights' rounding of transformers' f32 logits.
    for (dtype, tol) in [(DType::F16, 2e-2), (DType::BF16, 2e-1)] {
        let dir = edited_copy("mbart", |d| {
            let file = TensorFile::open(d.join("model.safetensors")).unwrap();
            let tensors: Vec<(String, Tensor)> = file
                .names()
                .into_iter()
                .map(|n| {
                    let t = file.load(n, &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
                    (n.to_string(), t)
                })
                .collect();
            drop(file);
            let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            candle_attention::save_tensors(&refs, d.join("model.safetensors")).unwrap();
        });
        let model = Seq2SeqModel::from_dir(&dir, &Device::Cpu).unwrap();
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        let (logits, _) = model
            .forward(
                &ids(&inputs, "input_ids_right"),
                &ids(&inputs, "attention_mask_right"),
                &ids(&inputs, "decoder_input_ids"),
            )
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(logits.dtype(), DType::F32);
        let want = expected.load("logits_right", &Device::Cpu).unwrap();
        let d = max_abs_diff(&logits, &want);
        println!("{dtype:?} weights: logits within {d:.2e}");
        assert!(d <= tol, "{dtype:?}: {d}");
    }
}

/// The trained text-to-text directories of tests/fixtures/multilingual_e2e (NLLB-200 on
/// M2M100, mBART-50; tiny models trained on a copy task by
/// tests/fixtures/make_multilingual_e2e_fixtures.py): the texts in several scripts encode to
/// transformers' ids, and [`Translator::translate_pair`] generates its sequences and texts
/// exactly, greedy and beam 4 (attn-cli/tests/multilingual_cli.rs checks the command).
#[test]
fn trained_e2e_directories_encode_and_generate_as_transformers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/multilingual_e2e");
    for family in ["nllb", "mbart50"] {
        let dir = root.join(family);
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let texts: Vec<&str> = expected["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        let as_rows = |v: &serde_json::Value, pad: u32| -> Vec<Vec<u32>> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    let mut row: Vec<u32> = row
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as u32)
                        .collect();
                    while row.len() > 1 && row.last() == Some(&pad) {
                        row.pop();
                    }
                    row
                })
                .collect()
        };
        let tokenizer = load_multilingual_tokenizer(&dir).unwrap();
        let translator = Translator::from_dir(&dir).unwrap();
        let pad = tokenizer.pad_id();
        for case in expected["cases"].as_array().unwrap() {
            let (src, tgt) = (
                case["source_lang"].as_str().unwrap(),
                case["target_lang"].as_str().unwrap(),
            );
            let beams = case["beams"].as_u64().unwrap() as usize;
            let max_new = case["max_new_tokens"].as_u64().unwrap() as usize;
            let what = format!("{family} {src} -> {tgt}, {beams} beam(s)");
            let encoded: Vec<Vec<u32>> = texts
                .iter()
                .map(|s| tokenizer.encode(s, src).unwrap())
                .collect();
            assert_eq!(encoded, as_rows(&case["input_ids"], pad), "{what}: ids");
            let options = TranslateOptions {
                beam: Some(beams),
                max_new_tokens: Some(max_new),
                ..TranslateOptions::default()
            };
            let out: Vec<_> = translator
                .translate_pair(&texts, src, tgt, &options)
                .unwrap()
                .into_iter()
                .map(Result::unwrap)
                .collect();
            let got: Vec<Vec<u32>> = out.iter().map(|t| t.tokens.clone()).collect();
            assert_eq!(got, as_rows(&case["sequences"], pad), "{what}: sequences");
            let decoded: Vec<&str> = out.iter().map(|t| t.text.as_str()).collect();
            let want: Vec<&str> = case["translations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap())
                .collect();
            assert_eq!(decoded, want, "{what}: texts");
        }
    }
}

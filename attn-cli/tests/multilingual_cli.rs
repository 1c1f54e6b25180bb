//! The M2M100 / NLLB-200 and mBART directories through the commands scripts call:
//! `attn run seq2seq`, `attn generate` (with `--forced-bos-token-id`), `attn inspect DIR`, and
//! their refusals (exit code 1, a message on stderr, never a panic). Fixtures:
//! tests/fixtures/make_multilingual_model_fixtures.py.

#[path = "../../tests/common/mod.rs"]
mod common;
use common::max_abs_diff;

use candle::{DType, Device, Tensor};
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VARIANTS: [&str; 3] = ["m2m100_tied", "m2m100_untied", "mbart"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .output()
        .unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = attn(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn ok(args: &[&str]) -> String {
    let out = attn(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The fixture's `side`-padded batch under the names the commands read.
fn inputs_file(dir: &Path, side: &str, to: &Path) -> PathBuf {
    let file = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
    let load = |n: &str| file.load(n, &Device::Cpu).unwrap();
    let path = to.join(format!("inputs_{side}.safetensors"));
    candle_attention::save_tensors(
        &[
            ("input_ids", &load(&format!("input_ids_{side}"))),
            ("attention_mask", &load(&format!("attention_mask_{side}"))),
            ("decoder_input_ids", &load("decoder_input_ids")),
        ],
        &path,
    )
    .unwrap();
    path
}

#[test]
fn run_seq2seq_writes_logits_and_encoder_states() {
    let tmp = tempfile::tempdir().unwrap();
    for variant in VARIANTS {
        let dir = fixtures().join("multilingual").join(variant);
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        for side in ["right", "left"] {
            let inputs = inputs_file(&dir, side, tmp.path());
            let out = tmp.path().join("out.safetensors");
            ok(&[
                "run",
                "seq2seq",
                "--model",
                dir.to_str().unwrap(),
                "--inputs",
                inputs.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
            ]);
            let got = TensorFile::open(&out).unwrap();
            for name in ["logits", "encoder_last_hidden_state"] {
                let g = got.load(name, &Device::Cpu).unwrap();
                assert_eq!(g.dtype(), DType::F32);
                let want = expected
                    .load(&format!("{name}_{side}"), &Device::Cpu)
                    .unwrap();
                let d = max_abs_diff(&g, &want);
                assert!(d <= 1e-4, "{variant} {side} {name}: {d}");
            }
        }
    }
    // A MarianMT directory runs through the same command.
    let dir = fixtures().join("marian/base");
    let out = tmp.path().join("marian.safetensors");
    ok(&[
        "run",
        "seq2seq",
        "--model",
        dir.to_str().unwrap(),
        "--inputs",
        dir.join("inputs.safetensors").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let got = TensorFile::open(&out).unwrap();
    let want = TensorFile::open(dir.join("expected.safetensors")).unwrap();
    let d = max_abs_diff(
        &got.load("logits", &Device::Cpu).unwrap(),
        &want.load("logits", &Device::Cpu).unwrap(),
    );
    assert!(d <= 1e-4, "marian logits: {d}");
}

#[test]
fn generate_writes_what_transformers_generate_returns() {
    let tmp = tempfile::tempdir().unwrap();
    for variant in VARIANTS {
        let dir = fixtures().join("multilingual").join(variant);
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        for side in ["right", "left"] {
            let inputs = inputs_file(&dir, side, tmp.path());
            for (case, beams) in [("greedy", "1"), ("beam4", "4")] {
                let out = tmp.path().join("seq.safetensors");
                ok(&[
                    "generate",
                    "--model",
                    dir.to_str().unwrap(),
                    "--inputs",
                    inputs.to_str().unwrap(),
                    "--output",
                    out.to_str().unwrap(),
                    "--beams",
                    beams,
                    "--max-new-tokens",
                    "10",
                ]);
                let got = TensorFile::open(&out)
                    .unwrap()
                    .load("sequences", &Device::Cpu)
                    .unwrap();
                assert_eq!(got.dtype(), DType::I64);
                let want = expected
                    .load(&format!("sequences.{case}_{side}"), &Device::Cpu)
                    .unwrap();
                assert_eq!(
                    got.to_vec2::<i64>().unwrap(),
                    want.to_vec2::<i64>().unwrap(),
                    "{variant} {case}_{side}"
                );
            }
        }
    }
}

#[test]
fn forced_bos_token_id_picks_the_target_language() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fixtures().join("multilingual/m2m100_tied");
    let inputs = inputs_file(&dir, "right", tmp.path());
    let out = tmp.path().join("seq.safetensors");
    let args = |id: &'static str| {
        vec![
            "generate".to_string(),
            "--model".into(),
            dir.to_str().unwrap().into(),
            "--inputs".into(),
            inputs.to_str().unwrap().into(),
            "--output".into(),
            out.to_str().unwrap().into(),
            "--beams".into(),
            "1".into(),
            "--max-new-tokens".into(),
            "3".into(),
            "--forced-bos-token-id".into(),
            id.into(),
        ]
    };
    let a = args("124"); // __zh__
    ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let got = TensorFile::open(&out)
        .unwrap()
        .load("sequences", &Device::Cpu)
        .unwrap()
        .to_vec2::<i64>()
        .unwrap();
    for row in &got {
        assert_eq!(&row[..2], &[2, 124], "{got:?}");
    }
    let a = args("128");
    let err = fails(&a.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(err.contains("forced_bos_token_id 128"), "{err}");
}

#[test]
fn inspect_names_the_family_and_sizes() {
    let dir = fixtures().join("multilingual");
    let text = ok(&["inspect", dir.join("m2m100_tied").to_str().unwrap()]);
    assert!(text.contains("M2M100 (model_type m2m_100"), "{text}");
    assert!(text.contains("d_model 32"), "{text}");
    assert!(text.contains("forced bos (target language) 121"), "{text}");
    let text = ok(&["inspect", dir.join("m2m100_untied").to_str().unwrap()]);
    assert!(text.contains("pytorch_model.bin"), "{text}");
    assert!(
        text.contains("separate encoder, decoder and output tables"),
        "{text}"
    );
    let json = ok(&["inspect", "--json", dir.join("mbart").to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["family"], "mBART");
    assert_eq!(v["vocab_size"], 160);
    assert_eq!(v["decoder_start_token_id"], 2);
    // MarianMT directories are described as before.
    let text = ok(&["inspect", fixtures().join("marian/base").to_str().unwrap()]);
    assert!(text.contains("MarianMT"), "{text}");
}

#[test]
fn bad_directories_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("multilingual/mbart");
    let inputs = inputs_file(&src, "right", tmp.path());
    let out = tmp.path().join("out.safetensors");
    let edited = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["model.safetensors", "generation_config.json"] {
            std::fs::copy(src.join(f), d.join(f)).unwrap();
        }
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap())
                .unwrap();
        edit(&mut cfg);
        std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
        d
    };
    let t5 = edited("t5", &|c| c["model_type"] = "t5".into());
    let unknown = edited("unknown", &|c| c["alibi"] = true.into());
    for (dir, needles) in [
        (&t5, vec!["\"t5\"", "marian", "m2m_100", "mbart"]),
        (&unknown, vec!["alibi"]),
    ] {
        for cmd in [vec!["generate"], vec!["run", "seq2seq"]] {
            let mut args = cmd.clone();
            args.extend([
                "--model",
                dir.to_str().unwrap(),
                "--inputs",
                inputs.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
            ]);
            let err = fails(&args);
            for n in &needles {
                assert!(err.contains(n), "{args:?}: {err}");
            }
        }
        let err = fails(&["inspect", dir.to_str().unwrap()]);
        assert!(err.contains(needles[0]), "{err}");
    }
    // Ids outside the vocabulary (160) are refused.
    let t = Tensor::new(&[[5i64, 160, 2]], &Device::Cpu).unwrap();
    let bad = tmp.path().join("bad.safetensors");
    candle_attention::save_tensors(
        &[
            ("input_ids", &t),
            ("attention_mask", &t.ones_like().unwrap()),
            ("decoder_input_ids", &t),
        ],
        &bad,
    )
    .unwrap();
    let err = fails(&[
        "run",
        "seq2seq",
        "--model",
        src.to_str().unwrap(),
        "--inputs",
        bad.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(err.contains("id 160"), "{err}");
}

#[test]
fn without_generation_config_the_family_defaults_apply() {
    // No generation_config.json, and a config.json without the special ids: transformers builds
    // the generation settings from M2M100Config (decoder start </s> = 2, eos 2, pad 1), so
    // with the target language given the sequences are the fixture's.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("multilingual/m2m100_tied");
    let d = tmp.path().join("bare");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(src.join("model.safetensors"), d.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    for key in [
        "decoder_start_token_id",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
    ] {
        cfg.as_object_mut().unwrap().remove(key);
    }
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    let inputs = inputs_file(&src, "right", tmp.path());
    let out = tmp.path().join("seq.safetensors");
    for (case, beams) in [("greedy", "1"), ("beam4", "4")] {
        ok(&[
            "generate",
            "--model",
            d.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--beams",
            beams,
            "--max-new-tokens",
            "10",
            "--forced-bos-token-id",
            "121",
        ]);
        let got = TensorFile::open(&out)
            .unwrap()
            .load("sequences", &Device::Cpu)
            .unwrap();
        let want = TensorFile::open(src.join("expected.safetensors"))
            .unwrap()
            .load(&format!("sequences.{case}_right"), &Device::Cpu)
            .unwrap();
        assert_eq!(
            got.to_vec2::<i64>().unwrap(),
            want.to_vec2::<i64>().unwrap(),
            "{case}"
        );
    }
}

/// `attn translate --model DIR --source-lang X --target-lang Y`: text to text on a directory
/// that holds a tokenizer and a model of its family (NLLB-200 on M2M100, mBART-50), equal to
/// transformers' `tokenizer(texts, padding=True)` → `generate(forced_bos_token_id=…)` →
/// `batch_decode(skip_special_tokens=True)`, greedy and beam 4, for two language pairs
/// (fixtures: tests/fixtures/make_multilingual_e2e_fixtures.py: tiny models trained on a copy
/// task, so the output depends on the input and mostly reproduces it; the texts are a padded
/// batch of different lengths in Latin with diacritics, Cyrillic, CJK and Arabic).
#[test]
fn translate_with_source_and_target_languages_is_transformers_text_to_text() {
    for family in ["nllb", "mbart50"] {
        let dir = fixtures().join("multilingual_e2e").join(family);
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let texts: Vec<String> = expected["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect();
        for case in expected["cases"].as_array().unwrap() {
            let (src, tgt) = (
                case["source_lang"].as_str().unwrap(),
                case["target_lang"].as_str().unwrap(),
            );
            let beams = case["beams"].as_u64().unwrap().to_string();
            let max_new = case["max_new_tokens"].as_u64().unwrap().to_string();
            let mut args = vec![
                "translate",
                "--model",
                dir.to_str().unwrap(),
                "--source-lang",
                src,
                "--target-lang",
                tgt,
                "--beam",
                &beams,
                "--max-new-tokens",
                &max_new,
            ];
            args.extend(texts.iter().map(String::as_str));
            let got = ok(&args);
            let want: Vec<&str> = case["translations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(
                got.lines().collect::<Vec<_>>(),
                want,
                "{family} {src} -> {tgt}, {beams} beam(s)"
            );
        }
    }
}

/// The languages are required for a multilingual directory, refused for a MarianMT one, and
/// an unknown code names close matches.
#[test]
fn translate_refuses_missing_unknown_and_misplaced_languages() {
    let nllb = fixtures().join("multilingual_e2e/nllb");
    let nllb = nllb.to_str().unwrap();
    let err = fails(&["translate", "--model", nllb, "Hello"]);
    assert!(
        err.contains("--source-lang") && err.contains("--target-lang"),
        "{err}"
    );
    let err = fails(&[
        "translate",
        "--model",
        nllb,
        "--source-lang",
        "eng_Latn",
        "--target-lang",
        "deu_latn",
        "Hello",
    ]);
    assert!(
        err.contains("deu_latn") && err.contains("deu_Latn"),
        "{err}"
    );
    let marian = fixtures().join("marian_e2e");
    let err = fails(&[
        "translate",
        "--model",
        marian.to_str().unwrap(),
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "Hello",
    ]);
    assert!(err.contains("MarianMT"), "{err}");
}

/// `attn inspect DIR` lists the languages of the directory's tokenizer (what --source-lang and
/// --target-lang take), and says why when the tokenizer is missing.
#[test]
fn inspect_lists_the_languages() {
    let nllb = fixtures().join("multilingual_e2e/nllb");
    let out = ok(&["inspect", nllb.to_str().unwrap()]);
    assert!(out.contains("languages (202): ace_Arab"), "{out}");
    assert!(out.contains("deu_Latn"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", nllb.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(json["languages"].as_array().unwrap().len(), 202);
    let mbart = fixtures().join("multilingual_e2e/mbart50");
    assert!(ok(&["inspect", mbart.to_str().unwrap()]).contains("languages (52): ar_AR"));
    let bare = fixtures().join("multilingual/mbart");
    assert!(ok(&["inspect", bare.to_str().unwrap()])
        .contains("languages: unknown (no tokenizer files)"));
}

//! The MarianMT commands as scripts call them: `attn run marian`, `attn generate`,
//! `attn inspect DIR`, `attn translate --model DIR`, and their errors (exit code 1, a message on
//! stderr, never a panic).

#[path = "../../tests/common/mod.rs"]
mod common;
use common::max_abs_diff;

use candle::{DType, Device, Tensor};
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

#[test]
fn run_marian_writes_logits_and_encoder_states() {
    let dir = fixtures().join("marian/gelu_noscale"); // pytorch_model.bin only
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.safetensors");
    ok(&[
        "run",
        "marian",
        "--model",
        dir.to_str().unwrap(),
        "--inputs",
        dir.join("inputs.safetensors").to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    let got = TensorFile::open(&out).unwrap();
    let want = TensorFile::open(dir.join("expected.safetensors")).unwrap();
    for name in ["logits", "encoder_last_hidden_state"] {
        let g = got.load(name, &Device::Cpu).unwrap();
        assert_eq!(g.dtype(), DType::F32);
        let d = max_abs_diff(&g, &want.load(name, &Device::Cpu).unwrap());
        assert!(d <= 1e-4, "{name}: {d}");
    }
}

#[test]
fn generate_writes_what_transformers_generate_returns() {
    let dir = fixtures().join("marian/base");
    let tmp = tempfile::tempdir().unwrap();
    let want = TensorFile::open(dir.join("expected.safetensors")).unwrap();
    let inputs = dir.join("inputs.safetensors");
    for (flags, case) in [
        (vec![], "beam4"), // num_beams 4 from generation_config.json
        (vec!["--beams", "1"], "greedy"),
        (vec!["--beams", "2"], "beam2"),
        (
            vec!["--beams", "1", "--max-new-tokens", "4"],
            "greedy_max_new_tokens",
        ),
        (
            vec!["--beams", "1", "--min-new-tokens", "9"],
            "greedy_min_new_tokens",
        ),
        (
            vec![
                "--beams",
                "1",
                "--min-new-tokens",
                "7",
                "--max-new-tokens",
                "7",
            ],
            "greedy_min_max_equal",
        ),
    ] {
        let out = tmp.path().join(format!("{case}.safetensors"));
        let mut args = vec![
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "--inputs",
            inputs.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        args.extend(flags);
        let cases: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap())
                .unwrap();
        let rows = cases["cases"][case]["rows"].as_array().unwrap().len();
        if rows != 3 {
            continue; // the CLI runs the whole batch; this case used other rows
        }
        ok(&args);
        let got = TensorFile::open(&out)
            .unwrap()
            .load("sequences", &Device::Cpu)
            .unwrap();
        assert_eq!(got.dtype(), DType::I64);
        let want = want
            .load(&format!("sequences.{case}"), &Device::Cpu)
            .unwrap();
        assert_eq!(got.dims(), want.dims(), "{case}");
        let (g, w): (Vec<Vec<i64>>, Vec<Vec<i64>>) =
            (got.to_vec2().unwrap(), want.to_vec2().unwrap());
        assert_eq!(g, w, "{case}");
    }
}

#[test]
fn inspect_recognises_a_marian_directory() {
    let dir = fixtures().join("marian/separate_vocab");
    let text = ok(&["inspect", dir.to_str().unwrap()]);
    assert!(
        text.contains("MarianMT") && text.contains("parameters:"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", dir.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(json["model_type"], "marian");
    assert_eq!(json["target_vocab_size"], 72);
    assert!(json["parameters"].as_u64().unwrap() > 100_000);
}

#[test]
fn inspect_reads_a_torch_checkpoint_and_refuses_one_that_lies() {
    let bin = fixtures().join("marian/gelu_noscale/pytorch_model.bin");
    let text = ok(&["inspect", bin.to_str().unwrap()]);
    assert!(
        text.contains("torch checkpoint") && text.contains("lm_head.weight"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", bin.to_str().unwrap(), "--json"])).unwrap();
    assert!(json["parameters"].as_u64().unwrap() > 10_000);
    let text = ok(&[
        "inspect",
        fixtures().join("marian/gelu_noscale").to_str().unwrap(),
    ]);
    assert!(text.contains("pytorch_model.bin"), "{text}");

    // A checkpoint with no tensor, one whose storage claims 10^12 elements, one that names
    // posix.system: errors, as a file and as the weights of a Marian directory.
    for (file, why) in [
        ("empty.pt", "holds no tensor"),
        ("huge_storage.pt", "1000000000000 elements"),
        ("smuggled_posix_system.pt", "'posix.system'"),
    ] {
        let path = fixtures().join("pth/refused").join(file);
        let err = fails(&["inspect", path.to_str().unwrap()]);
        assert!(err.contains(why) && err.contains(file), "{file}: {err}");
        let dir = tempfile::tempdir().unwrap();
        let src = fixtures().join("marian/gelu_noscale");
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        std::fs::copy(&path, dir.path().join("pytorch_model.bin")).unwrap();
        let err = fails(&["inspect", dir.path().to_str().unwrap()]);
        assert!(
            err.contains(why) && err.contains("pytorch_model.bin"),
            "{file}: {err}"
        );
    }
}

#[test]
fn translate_with_a_marian_directory_equals_the_pipeline() {
    let dir = fixtures().join("marian_e2e");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let texts: Vec<&str> = exp["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for setting in exp["settings"].as_array().unwrap() {
        let kwargs = &setting["generate_kwargs"];
        let mut args = vec![
            "translate".to_string(),
            "--model".into(),
            dir.to_str().unwrap().into(),
        ];
        if let Some(b) = kwargs.get("num_beams") {
            args.extend(["--beam".into(), b.to_string()]);
        }
        if let Some(t) = kwargs.get("max_new_tokens") {
            args.extend(["--max-new-tokens".into(), t.to_string()]);
        }
        // One line per input: texts with a line break cannot be told apart in the output.
        let kept: Vec<usize> = (0..texts.len())
            .filter(|&i| !texts[i].contains('\n'))
            .collect();
        args.extend(kept.iter().map(|&i| texts[i].to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdout = ok(&refs);
        let lines: Vec<&str> = stdout.split('\n').collect();
        let want = setting["batched"]["texts"].as_array().unwrap();
        for (n, &i) in kept.iter().enumerate() {
            assert_eq!(
                lines[n],
                want[i].as_str().unwrap(),
                "{}: {:?}",
                setting["name"],
                texts[i]
            );
        }
    }
}

#[test]
fn bad_marian_input_is_a_clear_error() {
    let base = fixtures().join("marian/base");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out.safetensors");
    let inputs = base.join("inputs.safetensors");
    let (inp, o) = (inputs.to_str().unwrap(), out.to_str().unwrap());
    // A directory that is not a MarianMT model.
    let err = fails(&[
        "generate",
        "--model",
        tmp.path().to_str().unwrap(),
        "--inputs",
        inp,
        "--output",
        o,
    ]);
    assert!(err.contains("config.json"), "{err}");
    // Ids outside the vocabulary, and a source longer than max_position_embeddings (64).
    for (ids, needle) in [
        (vec![5i64, 96, 0], "id 96"),
        (vec![5i64; 70], "max_position_embeddings = 64"),
    ] {
        let n = ids.len();
        let t = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
        let path = tmp.path().join("bad.safetensors");
        candle_attention::save_tensors(
            &[
                ("input_ids", &t),
                ("attention_mask", &t.ones_like().unwrap()),
                ("decoder_input_ids", &t),
            ],
            &path,
        )
        .unwrap();
        for cmd in [vec!["generate"], vec!["run", "marian"]] {
            let mut args = cmd.clone();
            args.extend([
                "--model",
                base.to_str().unwrap(),
                "--inputs",
                path.to_str().unwrap(),
                "--output",
                o,
            ]);
            let err = fails(&args);
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
    // A missing input tensor is named.
    let path = tmp.path().join("partial.safetensors");
    let t = Tensor::new(&[[5i64, 0]], &Device::Cpu).unwrap();
    candle_attention::save_tensors(&[("input_ids", &t)], &path).unwrap();
    let err = fails(&[
        "generate",
        "--model",
        base.to_str().unwrap(),
        "--inputs",
        path.to_str().unwrap(),
        "--output",
        o,
    ]);
    assert!(err.contains("attention_mask"), "{err}");
    // translate: a directory without tokenizer files says which are missing.
    let err = fails(&["translate", "--model", base.to_str().unwrap(), "hello"]);
    assert!(err.contains("source.spm"), "{err}");
}

#[test]
fn translate_draws_the_cross_attention_over_the_pieces() {
    let dir = fixtures().join("marian_e2e");
    let tmp = tempfile::tempdir().unwrap();
    let svg = tmp.path().join("attention.svg");
    let text = "Is it forty-two?";
    let stdout = ok(&[
        "translate",
        "--model",
        dir.to_str().unwrap(),
        "--heatmap",
        svg.to_str().unwrap(),
        text,
    ]);
    assert_eq!(stdout.trim_end(), "Ist es zweiundvierzig?");
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("cross-attention"), "a titled figure");
    // Columns are the source's sentencepiece pieces, rows the generated ones.
    let tokenizer = candle_attention::marian::MarianTokenizer::from_dir(&dir).unwrap();
    for piece in tokenizer.pieces(text).unwrap() {
        assert!(
            drawn.contains(&format!(">{piece}<")),
            "source piece {piece:?} is labelled"
        );
    }
    assert!(
        drawn.contains("&lt;/s&gt;") || drawn.contains("</s><"),
        "EOS is labelled"
    );
}

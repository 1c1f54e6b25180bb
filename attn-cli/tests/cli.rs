//! The `attn` command end to end: translation (arguments, stdin, heatmaps, the built-in model),
//! dtype conversion and the memory limit of `attn run mha`. Error messages are in `errors.rs`.

#[path = "../../tests/common/mod.rs"]
mod common;

use candle::{DType, Device, Tensor};
use candle_attention::TensorFile;
use common::{mha_fixtures, repo_root};
use std::process::Command;

fn assert_mentions(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(msg.contains(part), "expected {part:?} in: {msg}");
    }
}

#[test]
fn the_cli_translates_arguments_and_stdin() {
    // From a directory without weights/: the built-in model, as for an installed `attn`.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .current_dir(elsewhere.path())
        .args(["translate", "seven", "one thousand and one"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "sieben\neintausendeins\n"
    );

    let mut child = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["translate", "--beam", "3"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"twenty-one\nbanana\nsix hundred\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an untranslatable line makes the exit status non-zero"
    );
    assert!(stdout.starts_with("einundzwanzig\n"), "{stdout}");
    assert!(stdout.ends_with("sechshundert\n"), "{stdout}");
    assert!(stderr.contains("banana"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `attn translate --weights DIR` end to end: one line out per line in, an error on stderr (and
/// exit 1) for bad input, and a heatmap file of the first translation.
#[test]
fn translate_command_lines_errors_and_heatmap() {
    let dir = tempfile::tempdir().unwrap();
    let weights = repo_root().join("weights");
    for ext in ["svg", "png"] {
        let map = dir.path().join(format!("heat.{ext}"));
        let out = Command::new(env!("CARGO_BIN_EXE_attn"))
            .args(["translate", "--weights"])
            .arg(&weights)
            .arg("--heatmap")
            .arg(&map)
            .args([
                "--heads",
                "all",
                "--beam",
                "2",
                "three hundred forty-two",
                "seven million",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stdout.lines().count(), 2, "one line per input: {stdout:?}");
        assert!(
            stderr.contains("\"seven million\": unknown word 'million'")
                && stderr.contains("of 2 inputs"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        let bytes = std::fs::read(&map).unwrap();
        match ext {
            "svg" => assert!(String::from_utf8_lossy(&bytes).contains("forty")),
            _ => assert_eq!(&bytes[..4], b"\x89PNG"),
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["translate", "--weights", "/nonexistent", "one"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent") && stderr.contains("config.json"),
        "{stderr}"
    );
}

#[test]
fn f16_weights_file_runs_in_f32_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = mha_fixtures();
    let src = TensorFile::open(fixtures.join("self_default.weights.safetensors")).unwrap();
    let half: std::collections::HashMap<String, Tensor> = src
        .names()
        .iter()
        .map(|n| {
            let t = src
                .load(n, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::F16)
                .unwrap();
            (n.to_string(), t)
        })
        .collect();
    let weights = dir.path().join("half.safetensors");
    candle::safetensors::save(&half, &weights).unwrap();
    let output = dir.path().join("out.safetensors");
    let status = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args([
            "run",
            "mha",
            "--num-heads",
            "4",
            "--dtype",
            "f32",
            "--weights",
        ])
        .arg(&weights)
        .arg("--inputs")
        .arg(fixtures.join("self_default.inputs.safetensors"))
        .arg("--output")
        .arg(&output)
        .status()
        .unwrap();
    assert!(status.success());
    let out = TensorFile::open(&output).unwrap();
    assert_eq!(out.summary("output").unwrap().dtype, "F32");
}

#[test]
fn naive_attention_above_the_memory_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = mha_fixtures();
    // L = S = 4096, one batch, 4 heads: 4 * 4096² * 12 bytes = 768 MiB of naive scores.
    let query = Tensor::zeros((4096, 1, 16), DType::F32, &Device::Cpu).unwrap();
    let inputs = dir.path().join("long.safetensors");
    candle::safetensors::save(
        &[("query".to_string(), query)].into_iter().collect(),
        &inputs,
    )
    .unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_attn"))
            .args(["run", "mha", "--num-heads", "4", "--weights"])
            .arg(fixtures.join("self_default.weights.safetensors"))
            .arg("--inputs")
            .arg(&inputs)
            .arg("--output")
            .arg(dir.path().join("out.safetensors"))
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = run(&["--max-attention-memory", "0.5"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_mentions(
        &stderr,
        &[
            "4096 queries x 4096 keys",
            "0.75 GiB",
            "limit of 0.50 GiB",
            "--no-weights",
        ],
    );
    assert!(!dir.path().join("out.safetensors").exists());
    // The memory-efficient kernel is not limited.
    let tiled = run(&["--max-attention-memory", "0.5", "--no-weights"]);
    assert!(
        tiled.status.success(),
        "{}",
        String::from_utf8_lossy(&tiled.stderr)
    );
}

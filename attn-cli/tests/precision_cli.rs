//! `--dtype`, `--quantize int8` and `attn convert` as scripts call them: the flags on every
//! pretrained path, a converted directory used in place of the original, and the errors (exit
//! code 1, a message on stderr, never a panic).

mod run_attn;
use run_attn::{attn, fails, ok};
use std::path::{Path, PathBuf};

fn e2e() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/marian_e2e")
}

const TEXTS: [&str; 3] = [
    "Is it forty-two?",
    "Street seven, please.",
    "I see three hundred twelve birds.",
];

fn translate(model: &Path, extra: &[&str]) -> String {
    let model = model.to_str().unwrap();
    let mut args = vec!["translate", "--model", model, "--beam", "1"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&TEXTS);
    ok(&args)
}

#[test]
fn every_precision_translates_and_a_converted_directory_needs_no_flag() {
    let f32 = translate(&e2e(), &[]);
    assert_eq!(f32.lines().count(), 3);
    let int8 = translate(&e2e(), &["--quantize", "int8"]);
    let bf16 = translate(&e2e(), &["--dtype", "bf16"]);
    for out in [&int8, &bf16, &translate(&e2e(), &["--dtype", "f16"])] {
        assert_eq!(out.lines().count(), 3, "{out}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir8 = tmp.path().join("int8");
    let report = ok(&[
        "convert",
        "--model",
        e2e().to_str().unwrap(),
        "--output",
        dir8.to_str().unwrap(),
        "--quantize",
        "int8",
    ]);
    assert!(
        report.contains("int8") && report.contains("MiB"),
        "{report}"
    );
    assert_eq!(translate(&dir8, &[]), int8);
    assert_eq!(
        translate(&dir8, &["--quantize", "int8"]),
        int8,
        "a no-op on an int8 directory"
    );
    let dir16 = tmp.path().join("bf16");
    ok(&[
        "convert",
        "--model",
        e2e().to_str().unwrap(),
        "--output",
        dir16.to_str().unwrap(),
        "--quantize",
        "bf16",
    ]);
    assert_eq!(translate(&dir16, &["--dtype", "bf16"]), bf16);
    // generate and run take the flags too.
    let err = fails(&[
        "generate",
        "--model",
        dir8.to_str().unwrap(),
        "--inputs",
        "/nonexistent.safetensors",
        "--output",
        "/tmp/never.safetensors",
        "--quantize",
        "int8",
    ]);
    assert!(err.contains("nonexistent"), "{err}");
    let err = fails(&[
        "translate",
        "--model",
        dir8.to_str().unwrap(),
        "--dtype",
        "bf16",
        "one",
    ]);
    assert!(err.contains("int8") && err.contains("BF16"), "{err}");
    let err = fails(&[
        "convert",
        "--model",
        e2e().to_str().unwrap(),
        "--output",
        dir8.to_str().unwrap(),
        "--quantize",
        "int8",
    ]);
    assert!(err.contains("--force"), "{err}");
}

#[test]
fn bad_precision_requests_are_clear_errors() {
    let e2e = e2e();
    let model = e2e.to_str().unwrap();
    let err = fails(&[
        "translate",
        "--model",
        model,
        "--quantize",
        "int8",
        "--dtype",
        "f16",
        "x",
    ]);
    assert!(err.contains("int8") && err.contains("F16"), "{err}");
    let err = fails(&["translate", "--quantize", "int8", "three"]);
    assert!(err.contains("--model"), "{err}");
    let out = attn(
        &["translate", "--model", model, "--quantize", "int4", "x"],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "clap refuses an unknown value");
    let err = fails(&[
        "convert",
        "--model",
        "/nonexistent",
        "--output",
        "/tmp/x",
        "--quantize",
        "int8",
    ]);
    assert!(err.contains("/nonexistent"), "{err}");
}

//! Hostile inputs against the pretrained-model commands (issue "Hardening, round 2"): a stream
//! whose lines fail in every way still gets exactly one output line per input line, in order;
//! sizes a user controls are refused at once; ids that do not fit are refused, not truncated;
//! a config that promises a huge position table does not allocate it.

#[path = "../../tests/common/mod.rs"]
mod common;
mod run_attn;

use candle::{Device, Tensor};
use candle_attention::save_tensors;
use run_attn::attn as attn_with_stdin;
use std::path::{Path, PathBuf};
use std::process::Output;

fn e2e() -> PathBuf {
    common::repo_root().join("tests/fixtures/marian_e2e")
}

fn attn(args: &[&str]) -> Output {
    attn_with_stdin(args, b"")
}

fn stderr_of(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!s.contains("panicked"), "{s}");
    s
}

/// A copy of the e2e fixture directory with `config.json` edited by `edit`.
fn edited_copy(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(e2e()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    let path = tmp.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, cfg.to_string()).unwrap();
    tmp
}

/// The translations of `lines`, one process each, as the reference for the stream.
fn alone(dir: &Path, line: &str) -> String {
    let out = attn(&[
        "translate",
        "--model",
        dir.to_str().unwrap(),
        "--beam",
        "1",
        line,
    ]);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_stream_keeps_one_line_per_input_line_whatever_fails() {
    // Positions for 9 tokens: short sentences fit the encoder, and the translation of
    // "It is five." runs past the positions while it is generated (an error for that line
    // only, found in the middle of a batch).
    let dir = edited_copy(|c| c["max_position_embeddings"] = 9.into());
    let d = dir.path().to_str().unwrap();
    let good = ["Is it forty-two?", "nine hundred ninety-nine"];
    let too_long = "Is it forty-two? Street seven, please. Is it forty-two? Street seven.";
    let mut input = Vec::new();
    for line in [good[0], "", too_long, "It is five.", good[1]] {
        input.extend_from_slice(line.as_bytes());
        input.push(b'\n');
    }
    input.extend_from_slice(&[b'a', 0xff, b'z', b'\n']);
    input.extend_from_slice(good[0].as_bytes());
    let out = attn_with_stdin(&["translate", "--model", d, "--beam", "1"], &input);
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.split('\n').collect();
    assert_eq!(lines.len(), 8, "7 lines and the final newline: {stdout:?}");
    assert_eq!(lines[1], "", "a blank line stays blank");
    assert_eq!(
        lines[2], "",
        "a line the model cannot take is an empty line"
    );
    assert_eq!(lines[3], "");
    assert_eq!(lines[5], "", "invalid UTF-8 is an empty line");
    assert!(
        stderr.contains("line 3") && stderr.contains("max_position_embeddings"),
        "{stderr}"
    );
    assert!(
        stderr.contains("line 6") && stderr.contains("UTF-8"),
        "{stderr}"
    );
    // The good lines are what they are alone, and not empty.
    for (i, text) in [(0, good[0]), (4, good[1]), (6, good[0])] {
        let want = alone(dir.path(), text);
        assert!(!lines[i].is_empty(), "line {}", i + 1);
        assert_eq!(format!("{}\n", lines[i]), want, "line {}", i + 1);
    }
}

#[test]
fn ten_thousand_blank_lines_are_generated_once_per_window() {
    // Blank lines encode to the same ids, so each window generates them once; each line still
    // gets exactly what it gets alone (transformers translates blank input too).
    let input = "\n".repeat(5_000) + &"  \t \n".repeat(5_000);
    let d = e2e();
    let out = attn_with_stdin(
        &["translate", "--model", d.to_str().unwrap()],
        input.as_bytes(),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 10_000);
    let empty = alone_with_defaults(&d, "");
    let spaces = alone_with_defaults(&d, "  \t ");
    assert!(
        lines[..5_000].iter().all(|l| *l == empty),
        "{:?}",
        &lines[..3]
    );
    assert!(
        lines[5_000..].iter().all(|l| *l == spaces),
        "{:?}",
        &lines[5_000..5_003]
    );
}

/// The translation of `text` alone with the directory's own generation settings.
fn alone_with_defaults(dir: &Path, text: &str) -> String {
    let out = attn_with_stdin(
        &["translate", "--model", dir.to_str().unwrap()],
        format!("{text}\n").as_bytes(),
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end_matches('\n')
        .to_string()
}

#[test]
fn sizes_a_user_controls_are_refused_at_once() {
    let d = e2e();
    let d = d.to_str().unwrap();
    let out = attn(&["translate", "--model", d, "--beam", "1000000", "hello"]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("beams") && err.contains("tokens"), "{err}");
    let out = attn(&[
        "translate",
        "--model",
        d,
        "--max-new-tokens",
        "100000",
        "hello",
    ]);
    let err = stderr_of(&out);
    assert!(err.contains("max_position_embeddings"), "{err}");
    let out = attn(&[
        "translate",
        "--model",
        d,
        "--n-best",
        "3",
        "--beam",
        "2",
        "--format",
        "jsonl",
    ]);
    let err = stderr_of(&out);
    assert!(err.contains("--n-best 3"), "{err}");
    for flag in ["--max-batch-tokens", "--window", "--n-best"] {
        let out = attn(&["translate", "--model", d, flag, "0", "hello"]);
        assert_eq!(out.status.code(), Some(1), "{flag}");
        assert!(stderr_of(&out).contains("at least 1"), "{flag}");
    }
}

/// `input_ids` / `attention_mask` of `ids` (int64), written to a file in `dir`.
fn ids_file(dir: &Path, ids: &[i64], cols: usize) -> PathBuf {
    let rows = ids.len() / cols.max(1);
    let t = Tensor::from_vec(ids.to_vec(), (rows, cols), &Device::Cpu).unwrap();
    let mask = t.ones_like().unwrap();
    let path = dir.join("in.safetensors");
    save_tensors(
        &[
            ("input_ids", &t),
            ("attention_mask", &mask),
            ("decoder_input_ids", &t),
        ],
        &path,
    )
    .unwrap();
    path
}

#[test]
fn ids_that_do_not_fit_and_empty_inputs_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = e2e();
    let out_path = tmp.path().join("out.safetensors");
    let huge = ids_file(tmp.path(), &[(1i64 << 32) + 18, 0], 2);
    for cmd in [vec!["generate"], vec!["run", "marian"]] {
        let mut args = cmd.clone();
        args.extend([
            "--model",
            d.to_str().unwrap(),
            "--inputs",
            huge.to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
        ]);
        let out = attn(&args);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        assert!(err.contains("4294967314"), "{cmd:?}: {err}");
    }
    let empty = ids_file(tmp.path(), &[], 0);
    let out = attn(&[
        "generate",
        "--model",
        d.to_str().unwrap(),
        "--inputs",
        empty.to_str().unwrap(),
        "--output",
        out_path.to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("no tokens"), "{err}");
}

#[test]
fn a_huge_position_count_is_a_promise_not_an_allocation() {
    let dir = edited_copy(|c| c["max_position_embeddings"] = serde_json::json!(1u64 << 40));
    let d = dir.path().to_str().unwrap();
    let out = attn(&["translate", "--model", d, "--beam", "1", "Is it forty-two?"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        alone(&e2e(), "Is it forty-two?")
    );
    let out = attn(&["inspect", d]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

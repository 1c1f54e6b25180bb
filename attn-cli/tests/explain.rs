//! `attn explain` end to end: the sections of the text output, truncation at a small width,
//! `--json` with every matrix in the right shape, the figure, and errors for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn attn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .env_remove("COLUMNS")
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = attn(args);
    assert!(
        out.status.success(),
        "attn {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// stderr of a run that must fail with exit code 1 and no panic.
fn fails(args: &[&str]) -> String {
    let out = attn(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "attn {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.starts_with("error:"), "{stderr}");
    stderr
}

fn marian_dir() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/marian_e2e"
    ))
}

#[test]
fn text_output_has_every_step_with_token_labels() {
    let text = ok(&[
        "explain",
        "--use",
        "decoder-self",
        "--layer",
        "1",
        "--head",
        "3",
        "--width",
        "120",
        "three hundred and forty-two",
    ]);
    for section in [
        "decoder self-attention, layer 1 of 2 (0-based), head 3 of 8",
        "d_k = d_v = 128 / 8 = 16",
        "Q (6×16) · Kᵀ (16×6) = scores (6×6)",
        "√d_k = √16 = 4.00",
        "4. Mask: causal",
        "-inf",
        "5. Softmax",
        "attends most to",
        "6. Blend the values",
        "out[",
        "7. 8 heads side by side",
        "max |difference|",
        "8. Why divide by √d_k?",
        "9. 8 perspectives",
        "head 7",
        "dreihundertzweiundvierzig",
    ] {
        assert!(text.contains(section), "missing {section:?} in:\n{text}");
    }
    // Decoder positions label the rows and columns.
    assert!(text.contains("<bos>") && text.contains("vierzig"), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 120, "line too long: {line:?}");
    }
}

#[test]
fn a_narrow_width_cuts_matrices_with_a_note_and_never_wraps() {
    let text = ok(&[
        "explain",
        "--width",
        "44",
        "seven hundred and seventy-seven thousand, seven hundred and seventy-seven",
    ]);
    assert!(text.contains("not shown"), "{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= 44, "line too long: {line:?}");
    }
    // $COLUMNS is the default width.
    let out = Command::new(env!("CARGO_BIN_EXE_attn"))
        .env("COLUMNS", "50")
        .args(["explain", "seven hundred and seventy-seven thousand"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().all(|l| l.chars().count() <= 50), "{text}");
}

fn shape(v: &serde_json::Value) -> (usize, usize) {
    let rows = v.as_array().unwrap();
    (rows.len(), rows[0].as_array().unwrap().len())
}

#[test]
fn json_has_every_matrix_in_its_shape() {
    let out = ok(&[
        "explain",
        "--json",
        "--use",
        "cross",
        "twelve thousand, three hundred forty-five",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let l = v["query_tokens"].as_array().unwrap().len();
    let s = v["key_tokens"].as_array().unwrap().len();
    assert_eq!(v["use"], "cross");
    assert_eq!(s, v["source_tokens"].as_array().unwrap().len());
    assert_eq!(l, v["decoder_tokens"].as_array().unwrap().len());
    let (h, d, e) = (8, 16, 128);
    assert_eq!(v["num_heads"], h);
    assert_eq!(v["d_k"], d);
    let heads = v["heads"].as_array().unwrap();
    assert_eq!(heads.len(), h);
    for head in heads {
        assert_eq!(shape(&head["q"]), (l, d));
        assert_eq!(shape(&head["k"]), (s, d));
        assert_eq!(shape(&head["v"]), (s, d));
        for m in ["scores", "scaled", "mask", "masked", "weights"] {
            assert_eq!(shape(&head[m]), (l, s), "{m}");
        }
        assert_eq!(shape(&head["output"]), (l, d));
        for row in head["weights"].as_array().unwrap() {
            let sum: f64 = row
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_f64().unwrap())
                .sum();
            assert!((sum - 1.0).abs() < 1e-5);
        }
    }
    assert_eq!(shape(&v["query_input"]), (l, e));
    assert_eq!(shape(&v["key_input"]), (s, e));
    assert_eq!(shape(&v["concat"]), (l, e));
    assert_eq!(shape(&v["output"]), (l, e));
    assert_eq!(shape(&v["forward_output"]), (l, e));
    assert!(v["max_forward_difference"].as_f64().unwrap() < 1e-5);
    assert_eq!(v["scaling"]["scaled"].as_array().unwrap().len(), l);
    assert_eq!(v["head_summaries"].as_array().unwrap().len(), h);

    // Decoder self-attention: the causal mask, and null (JSON has no -inf) where it blocks.
    let out = ok(&["explain", "--json", "--use", "decoder-self", "forty-two"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let head = &v["heads"][0];
    let mask = head["mask"].as_array().unwrap();
    for (i, row) in mask.iter().enumerate() {
        for (j, b) in row.as_array().unwrap().iter().enumerate() {
            assert_eq!(b.as_bool().unwrap(), j > i);
            assert_eq!(head["masked"][i][j].is_null(), j > i);
        }
    }
}

#[test]
fn marian_directory_is_explained_too() {
    let dir = marian_dir();
    let text = ok(&[
        "explain",
        "--model",
        dir.to_str().unwrap(),
        "--use",
        "cross",
        "--layer",
        "1",
        "Is it forty-two?",
    ]);
    assert!(
        text.contains("encoder-decoder (cross) attention, layer 1 of 2"),
        "{text}"
    );
    // Lines wrap at the width, and the model line holds the directory's path: compare the
    // text with its line breaks folded.
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("d_k = d_v = 64 / 4 = 16"), "{text}");
    assert!(text.contains("</s>"), "{text}");
}

#[test]
fn svg_and_png_draw_the_four_steps() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("steps.svg");
    let png = dir.path().join("steps.png");
    ok(&[
        "explain",
        "--use",
        "decoder-self",
        "--svg",
        svg.to_str().unwrap(),
        "--png",
        png.to_str().unwrap(),
        "forty-two",
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(text.matches("class=\"panel\"").count(), 4);
    for title in ["scores", "scaled", "softmax", "output"] {
        assert!(text.contains(title), "{title}");
    }
    assert!(text.contains("masked (-inf)"));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
    let err = fails(&["explain", "--svg", "x.png", "forty-two"]);
    assert!(err.contains(".svg"), "{err}");
}

#[test]
fn bad_input_lists_what_is_valid() {
    let err = fails(&["explain", "--layer", "5", "seven"]);
    assert!(err.contains("layer 5") && err.contains("0..=1"), "{err}");
    let err = fails(&["explain", "--use", "cross", "--head", "8", "seven"]);
    assert!(err.contains("head 8") && err.contains("0..=7"), "{err}");
    let err = fails(&["explain", "--use", "sideways", "seven"]);
    assert!(err.contains("encoder-self, decoder-self, cross"), "{err}");
    let err = fails(&["explain", "fourty-two"]);
    assert!(err.contains("fourty"), "{err}");
    let err = fails(&["explain", "--query", "9", "seven"]);
    assert!(err.contains("query 9") && err.contains("0..=0"), "{err}");
}

/// `attn explain ... | head -c 100`: the reader goes away after a few bytes; attn ends without
/// a panic message (it used to panic in `print!` on the closed pipe).
#[test]
fn a_closed_stdout_ends_attn_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(["explain", "--json", "forty-two"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here: attn's remaining output has nowhere to go.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(first.starts_with(b"{"));
}

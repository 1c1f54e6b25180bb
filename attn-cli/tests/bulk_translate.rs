//! The bulk path of `attn translate --model DIR` as scripts use it: JSONL in and out, n-best
//! hypotheses whose scores are transformers' `sequences_scores`, greedy log-probabilities as
//! the sum of transformers' `output_scores`, alignments, order and one line per input under
//! sorting with failing lines interleaved, files in and out.

#[path = "../../tests/common/mod.rs"]
mod common;
mod run_attn;

use run_attn::attn;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;

fn e2e() -> PathBuf {
    common::repo_root().join("tests/fixtures/marian_e2e")
}

fn nbest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(e2e().join("nbest.json")).unwrap()).unwrap()
}

fn jsonl(texts: &[&str]) -> Vec<u8> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "text": t, "tag": format!("t{i}")}).to_string() + "\n"
        })
        .collect::<String>()
        .into_bytes()
}

/// The fixture's texts.
fn fixture_texts(fx: &Value) -> Vec<&str> {
    fx["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect()
}

fn objects(out: &Output) -> Vec<Value> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn n_best_scores_are_transformers_sequences_scores() {
    let fx = nbest();
    let texts = fixture_texts(&fx);
    let setting = &fx["beam"][0];
    assert_eq!(setting["name"], "beam4_nbest4");
    let d = e2e();
    let out = attn(
        &[
            "translate",
            "--model",
            d.to_str().unwrap(),
            "--format",
            "jsonl",
            "--beam",
            "4",
            "--n-best",
            "4",
        ],
        &jsonl(&texts),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = objects(&out);
    assert_eq!(got.len(), texts.len());
    let mut compared = 0;
    for (i, (obj, want)) in got
        .iter()
        .zip(setting["items"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(obj["id"], i);
        assert_eq!(
            obj["tag"],
            format!("t{i}"),
            "extra fields are passed through"
        );
        let list = obj["n_best"].as_array().unwrap();
        assert_eq!(list.len(), 4);
        for (k, h) in list.iter().enumerate() {
            assert_eq!(
                h["translation"], want["texts"][k],
                "text {i} hypothesis {k}"
            );
            let (g, w) = (
                h["score"].as_f64().unwrap(),
                want["sequences_scores"][k].as_f64().unwrap(),
            );
            assert!((g - w).abs() <= 1e-4, "text {i} hypothesis {k}: {g} vs {w}");
            compared += 1;
        }
        assert_eq!(obj["translation"], want["texts"][0]);
        assert_eq!(obj["score"], list[0]["score"]);
    }
    eprintln!("n-best: {compared} scores within 1e-4 of transformers' sequences_scores");
}

#[test]
fn greedy_log_probs_are_the_sum_of_transformers_scores() {
    let fx = nbest();
    let texts = fixture_texts(&fx);
    let d = e2e();
    let out = attn(
        &[
            "translate",
            "--model",
            d.to_str().unwrap(),
            "--format",
            "jsonl",
            "--beam",
            "1",
            "--alignments",
        ],
        &jsonl(&texts),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (i, (obj, want)) in objects(&out)
        .iter()
        .zip(fx["greedy"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(obj["translation"], want["text"], "text {i}");
        let (g, w) = (
            obj["log_prob"].as_f64().unwrap(),
            want["log_prob"].as_f64().unwrap(),
        );
        assert!((g - w).abs() <= 1e-4, "text {i}: {g} vs {w}");
        // One alignment per generated token (EOS included), each pointing into the source.
        let steps = want["step_scores"].as_array().unwrap().len();
        let alignments = obj["alignments"].as_array().unwrap();
        assert_eq!(alignments.len(), steps, "text {i}");
        for a in alignments {
            assert!(a["source"].is_string() && a["target"].is_string());
            assert!(a["source_index"].as_u64().is_some());
        }
    }
}

#[test]
fn sorting_keeps_input_order_with_failing_lines_interleaved() {
    let d = e2e();
    // Long and short lines mixed, failures between them, a small window and budget so that
    // sorting, batching and reordering all happen.
    let mut lines: Vec<String> = Vec::new();
    let good = [
        "I see three hundred twelve birds.",
        "Is it 42?",
        "Street seven, please.",
        "nine hundred ninety-nine",
    ];
    for i in 0..40 {
        lines.push(match i % 5 {
            0 => "{\"id\": 1, \"text\": 5}".to_string(),
            3 => "not json".to_string(),
            _ => serde_json::json!({"id": i, "text": good[i % 4]}).to_string(),
        });
    }
    let input = lines.join("\n") + "\n";
    let out = attn(
        &[
            "translate",
            "--model",
            d.to_str().unwrap(),
            "--format",
            "jsonl",
            "--beam",
            "1",
            "--window",
            "7",
            "--max-batch-tokens",
            "20",
        ],
        input.as_bytes(),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "failing lines make the exit code 1"
    );
    let got = objects(&out);
    assert_eq!(got.len(), 40);
    let alone = attn(
        &["translate", "--model", d.to_str().unwrap(), "--beam", "1"],
        good.join("\n").as_bytes(),
    );
    let want: Vec<String> = String::from_utf8(alone.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    for (i, obj) in got.iter().enumerate() {
        match i % 5 {
            0 | 3 => assert!(obj["error"].is_string(), "line {i}: {obj}"),
            _ => {
                assert_eq!(obj["id"], i, "in input order");
                assert_eq!(obj["translation"], want[i % 4].as_str(), "line {i}");
            }
        }
    }
}

#[test]
fn files_in_and_out_and_no_progress_bar_without_a_terminal() {
    let d = e2e();
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    let output = tmp.path().join("out.txt");
    std::fs::write(&input, "Is it 42?\n\nIt is five.\n").unwrap();
    let out = attn(
        &[
            "translate",
            "--model",
            d.to_str().unwrap(),
            "--beam",
            "1",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "stderr is not a terminal: no bar"
    );
    let text = std::fs::read_to_string(&output).unwrap();
    assert_eq!(text.lines().count(), 3);
}

//! The pure-Rust MarianTokenizer / SentencePieceModel against transformers 5.24.0 and
//! sentencepiece 0.2.3: fixtures written by `tests/fixtures/make_marian_tokenizer_fixtures.py`
//! (three tokenizer directories: en-de, multilingual, separate vocabularies).

use candle_attention::marian::MarianTokenizer;
use candle_attention::tokenizers::SentencePieceModel;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian_tokenizer")
}

fn load(name: &str) -> Value {
    let path = fixtures().join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

/// Counts disagreements, printing each one.
#[derive(Default)]
struct Tally {
    checks: usize,
    mismatches: usize,
}

impl Tally {
    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, text: &str, got: T, want: T) {
        self.checks += 1;
        if got != want {
            self.mismatches += 1;
            eprintln!("MISMATCH {what} for {text:?}:\n   rust: {got:?}\n  python: {want:?}");
        }
    }
}

/// `None` where transformers raised (the fixture holds null): Rust must return an error.
fn decoded_or_none(r: candle::Result<String>) -> Option<String> {
    r.ok()
}

fn check_spm(t: &mut Tally, side: &str, sp: &SentencePieceModel, text: &str, rec: &Value) {
    let pieces = sp.encode_pieces(text).unwrap();
    t.check(
        &format!("{side} spm pieces"),
        text,
        pieces.clone(),
        strings(&rec["pieces"]),
    );
    let spm_ids = sp.encode_ids(text).unwrap();
    t.check(
        &format!("{side} spm ids"),
        text,
        spm_ids.clone(),
        ids(&rec["ids"]),
    );
    let want_ids = ids(&rec["ids"]);
    t.check(
        &format!("{side} spm decode(ids)"),
        text,
        sp.decode_ids(&want_ids).unwrap(),
        rec["decoded_ids"].as_str().unwrap().to_string(),
    );
    t.check(
        &format!("{side} spm decode_pieces"),
        text,
        sp.decode_pieces(&strings(&rec["pieces"])),
        rec["decoded_pieces"].as_str().unwrap().to_string(),
    );
}

fn check_dir(name: &str) -> Tally {
    let fx = load(name);
    let tok = MarianTokenizer::from_dir(fixtures().join(name)).unwrap();
    let mut t = Tally::default();
    t.check(
        "vocab_size",
        name,
        tok.vocab_size() as u64,
        fx["vocab_size"].as_u64().unwrap(),
    );
    t.check(
        "pad_id",
        name,
        tok.pad_id() as u64,
        fx["pad_id"].as_u64().unwrap(),
    );
    t.check(
        "eos_id",
        name,
        tok.eos_id() as u64,
        fx["eos_id"].as_u64().unwrap(),
    );
    t.check(
        "unk_id",
        name,
        tok.unk_id() as u64,
        fx["unk_id"].as_u64().unwrap(),
    );
    t.check(
        "source piece size",
        name,
        tok.source_spm().piece_size() as u64,
        fx["source_piece_size"].as_u64().unwrap(),
    );
    t.check(
        "target piece size",
        name,
        tok.target_spm().piece_size() as u64,
        fx["target_piece_size"].as_u64().unwrap(),
    );
    t.check(
        "language codes",
        name,
        tok.language_codes().to_vec(),
        strings(&fx["supported_language_codes"]),
    );
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        t.check(
            "tokens",
            text,
            tok.pieces(text).unwrap(),
            strings(&case["tokens"]),
        );
        let input_ids = tok.encode(text).unwrap();
        t.check(
            "input_ids",
            text,
            input_ids.clone(),
            ids(&case["input_ids"]),
        );
        let labels = tok.encode_target(text).unwrap();
        t.check("labels", text, labels.clone(), ids(&case["labels"]));
        let want = |k: &str| case[k].as_str().map(str::to_string);
        // Decode the reference ids, so a decoding check does not depend on encoding.
        let ref_ids = ids(&case["input_ids"]);
        let ref_labels = ids(&case["labels"]);
        t.check(
            "decoded",
            text,
            decoded_or_none(tok.decode(&ref_ids, true)),
            want("decoded"),
        );
        t.check(
            "decoded with special",
            text,
            decoded_or_none(tok.decode(&ref_ids, false)),
            want("decoded_with_special"),
        );
        t.check(
            "labels decoded",
            text,
            decoded_or_none(tok.decode(&ref_labels, true)),
            want("labels_decoded"),
        );
        check_spm(
            &mut t,
            "source",
            tok.source_spm(),
            text,
            &case["source_spm"],
        );
        check_spm(
            &mut t,
            "target",
            tok.target_spm(),
            text,
            &case["target_spm"],
        );
    }
    for d in fx["decodes"].as_array().unwrap() {
        let seq = ids(&d["ids"]);
        let label = format!("{seq:?}");
        let batch = tok
            .decode_batch(std::slice::from_ref(&seq), true)
            .ok()
            .map(|mut v| v.remove(0));
        t.check(
            "batch_decode(skip)",
            &label,
            batch,
            d["skip_special"].as_str().map(Into::into),
        );
        t.check(
            "decode(keep special)",
            &label,
            decoded_or_none(tok.decode(&seq, false)),
            d["with_special"].as_str().map(Into::into),
        );
    }
    for b in fx["batches"].as_array().unwrap() {
        let texts = strings(&b["texts"]);
        let enc = tok.encode_batch_padded(&texts).unwrap();
        let want_ids: Vec<Vec<u32>> = b["input_ids"].as_array().unwrap().iter().map(ids).collect();
        let want_mask: Vec<Vec<u32>> = b["attention_mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(ids)
            .collect();
        let label = format!("{texts:?}");
        t.check("padded input_ids", &label, enc.input_ids.clone(), want_ids);
        t.check(
            "attention_mask",
            &label,
            enc.attention_mask.clone(),
            want_mask,
        );
        let (ids_t, mask_t) = enc.to_tensors(&candle::Device::Cpu).unwrap();
        t.check(
            "tensor shape",
            &label,
            ids_t.dims().to_vec(),
            mask_t.dims().to_vec(),
        );
        t.check(
            "tensor ids",
            &label,
            ids_t.to_vec2::<u32>().unwrap(),
            enc.input_ids.clone(),
        );
    }
    println!(
        "{name}: {} checks against transformers/sentencepiece, {} mismatches",
        t.checks, t.mismatches
    );
    t
}

#[test]
fn en_de_matches_transformers() {
    let t = check_dir("en-de");
    assert!(t.checks > 900, "too few checks: {}", t.checks);
    assert_eq!(t.mismatches, 0, "mismatches on en-de (see stderr)");
}

#[test]
fn multilingual_matches_transformers() {
    let t = check_dir("mul");
    assert!(t.checks > 900, "too few checks: {}", t.checks);
    assert_eq!(t.mismatches, 0, "mismatches on mul (see stderr)");
}

#[test]
fn separate_vocabs_match_transformers() {
    let t = check_dir("sep");
    assert!(t.checks > 900, "too few checks: {}", t.checks);
    assert_eq!(t.mismatches, 0, "mismatches on sep (see stderr)");
}

/// Copies the en-de fixture directory to a temporary one, to break it.
fn scratch_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("en-de")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    for f in ["source.spm", "target.spm", "vocab.json"] {
        assert!(err.contains(f), "{err}");
    }
    let dir = scratch_copy();
    std::fs::remove_file(dir.path().join("target.spm")).unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing target.spm"), "{err}");
    assert!(!err.contains("source.spm"), "{err}");
}

#[test]
fn broken_spm_is_an_error() {
    let dir = scratch_copy();
    let path = dir.path().join("source.spm");
    // Truncated in the middle of the model.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("source.spm"), "{err}");
    assert!(err.contains("corrupt") || err.contains("broken"), "{err}");
    // Not a protobuf at all.
    std::fs::write(&path, b"this is not a sentencepiece model\n").unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("source.spm"), "{err}");
    // Empty file: no pieces.
    std::fs::write(&path, b"").unwrap();
    let err = SentencePieceModel::from_file(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no pieces"), "{err}");
}

#[test]
fn bad_vocab_json_is_an_error() {
    let dir = scratch_copy();
    let path = dir.path().join("vocab.json");
    std::fs::write(&path, "{\"<unk>\": 1, ").unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocab.json"), "{err}");
    std::fs::write(&path, "{\"<unk>\": 1, \"a\": \"x\"}").unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"a\""), "{err}");
    std::fs::write(&path, "[\"<unk>\"]").unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocab.json"), "{err}");
    std::fs::write(&path, "{\"</s>\": 0, \"<pad>\": 1}").unwrap();
    let err = MarianTokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("<unk>"), "{err}");
}

#[test]
fn vocab_size_check_against_model() {
    let tok = MarianTokenizer::from_dir(fixtures().join("en-de")).unwrap();
    tok.check_model_vocab_size(tok.vocab_size()).unwrap();
    let err = tok
        .check_model_vocab_size(tok.vocab_size() - 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&tok.vocab_size().to_string()), "{err}");
    assert!(tok.check_model_vocab_size(tok.vocab_size() + 1).is_err());
}

#[test]
fn ids_and_tokens_round_trip() {
    let tok = MarianTokenizer::from_dir(fixtures().join("mul")).unwrap();
    assert_eq!(tok.token_to_id("</s>"), Some(tok.eos_id()));
    assert_eq!(tok.token_to_id(">>deu<<"), Some(2));
    assert_eq!(tok.id_to_token(tok.pad_id()), Some("<pad>"));
    assert_eq!(tok.token_to_id("no such token"), None);
    assert_eq!(tok.id_to_token(u32::MAX), None);
    let err = tok.decode(&[u32::MAX], false).unwrap_err().to_string();
    assert!(err.contains(&u32::MAX.to_string()), "{err}");
}

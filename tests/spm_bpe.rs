//! The pure-Rust SentencePiece BPE segmenter against sentencepiece 0.2.3: models trained here
//! and the pieces, ids, normalised text and decodings sentencepiece gives for them, written by
//! `tests/fixtures/make_spm_bpe_fixtures.py` (plain nmt_nfkc, byte fallback, user-defined and
//! control symbols, whitespace as suffix, identity, and three crafted variants: unused pieces,
//! tied scores, all scores equal).

use candle_attention::tokenizers::sentencepiece::model_proto::{
    ModelProto, NormalizerSpec, Piece, TrainerSpec,
};
use candle_attention::tokenizers::{PieceType, SentencePieceModel, SentencePieceType};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spm_bpe")
}

fn cases() -> Value {
    let path = fixtures().join("cases.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
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

/// Checks every recorded text of `fx["cases"]` against `sp`; returns how many there are.
fn check_cases(t: &mut Tally, sp: &SentencePieceModel, fx: &Value) -> usize {
    let texts = fx["cases"].as_array().unwrap();
    for case in texts {
        let text = case["text"].as_str().unwrap();
        if case.get("error").is_some() {
            t.check("error", text, sp.encode(text).is_err(), true);
            continue;
        }
        t.check(
            "normalized",
            text,
            sp.normalize(text).unwrap(),
            case["normalized"].as_str().unwrap().to_string(),
        );
        t.check(
            "pieces",
            text,
            sp.encode_pieces(text).unwrap(),
            strings(&case["pieces"]),
        );
        t.check("ids", text, sp.encode_ids(text).unwrap(), ids(&case["ids"]));
        t.check(
            "decode(ids)",
            text,
            sp.decode_ids(&ids(&case["ids"])).unwrap(),
            case["decoded_ids"].as_str().unwrap().to_string(),
        );
        t.check(
            "decode_pieces",
            text,
            sp.decode_pieces(&strings(&case["pieces"])),
            case["decoded_pieces"].as_str().unwrap().to_string(),
        );
    }
    texts.len()
}

/// Checks one trained model of the fixture: its type, size, texts and decode-only id lists.
fn check_model(name: &str) -> (usize, usize) {
    let all = cases();
    let fx = &all[name];
    let sp = SentencePieceModel::from_file(fixtures().join(fx["file"].as_str().unwrap()))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut t = Tally::default();
    t.check("model type", name, sp.model_type(), SentencePieceType::Bpe);
    t.check(
        "piece size",
        name,
        sp.piece_size() as u64,
        fx["piece_size"].as_u64().unwrap(),
    );
    let texts = check_cases(&mut t, &sp, fx);
    for case in fx["decode_only"].as_array().unwrap() {
        let want = ids(&case["ids"]);
        t.check(
            "decode-only ids",
            &format!("{want:?}"),
            sp.decode_ids(&want).unwrap(),
            case["decoded"].as_str().unwrap().to_string(),
        );
    }
    eprintln!(
        "{name}: {texts} texts, {} checks, {} mismatches",
        t.checks, t.mismatches
    );
    assert!(texts >= 60, "{name}: only {texts} texts");
    assert_eq!(t.mismatches, 0, "{name}: {} mismatches", t.mismatches);
    (texts, t.checks)
}

/// The tiny models of the fixture's "crafted" part, rebuilt from their pieces: the identity
/// rule without dummy prefix, so each text is segmented as it is.
#[test]
fn crafted_corners_of_bpe_model_cc() {
    let all = cases();
    let crafted = all["crafted"].as_object().unwrap();
    assert!(crafted.len() >= 13);
    let mut t = Tally::default();
    let mut texts = 0;
    for (name, fx) in crafted {
        let pieces = fx["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let score = match &p[1] {
                    Value::String(s) if s == "nan" => f32::NAN,
                    Value::String(s) if s == "-nan" => -f32::NAN,
                    v => v.as_f64().unwrap() as f32,
                };
                let kind = match p[2].as_u64().unwrap() {
                    1 => PieceType::Normal,
                    2 => PieceType::Unknown,
                    3 => PieceType::Control,
                    4 => PieceType::UserDefined,
                    5 => PieceType::Unused,
                    6 => PieceType::Byte,
                    k => panic!("piece type {k}"),
                };
                piece(p[0].as_str().unwrap(), score, kind)
            })
            .collect();
        let proto = ModelProto {
            pieces,
            trainer_spec: TrainerSpec {
                model_type: 2,
                byte_fallback: fx["byte_fallback"].as_bool().unwrap(),
                ..TrainerSpec::default()
            },
            normalizer_spec: NormalizerSpec {
                name: "identity".into(),
                add_dummy_prefix: false,
                ..NormalizerSpec::default()
            },
            denormalizer_spec: None,
        };
        let sp = SentencePieceModel::from_proto(proto).unwrap_or_else(|e| panic!("{name}: {e}"));
        let before = t.mismatches;
        texts += check_cases(&mut t, &sp, fx);
        if t.mismatches > before {
            eprintln!("^ crafted model {name}");
        }
    }
    eprintln!(
        "crafted: {} models, {texts} texts, {} checks, {} mismatches",
        crafted.len(),
        t.checks,
        t.mismatches
    );
    assert_eq!(t.mismatches, 0);
}

#[test]
fn plain_nmt_nfkc() {
    check_model("plain");
}

#[test]
fn byte_fallback() {
    check_model("bytes");
}

#[test]
fn user_defined_and_control_symbols() {
    check_model("user");
}

#[test]
fn whitespace_as_suffix_across_words() {
    check_model("suffix");
}

#[test]
fn identity_rule_and_moved_special_ids() {
    check_model("identity");
}

#[test]
fn unused_pieces_are_resegmented() {
    check_model("unused");
}

#[test]
fn tied_scores_merge_leftmost_first() {
    check_model("ties");
    check_model("flat");
}

#[test]
fn every_model_in_the_fixture_is_checked() {
    let all = cases();
    let names: Vec<&String> = all.as_object().unwrap().keys().collect();
    assert_eq!(
        names,
        ["bytes", "crafted", "flat", "identity", "plain", "suffix", "ties", "unused", "user"]
    );
}

/// The model type comes from the file, never its name: Marian's unigram `.spm` stays unigram.
#[test]
fn unigram_files_still_dispatch_to_unigram() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian_tokenizer/en-de");
    let sp = SentencePieceModel::from_file(dir.join("source.spm")).unwrap();
    assert_eq!(sp.model_type(), SentencePieceType::Unigram);
}

fn piece(s: &str, score: f32, kind: PieceType) -> Piece {
    Piece {
        piece: s.into(),
        score,
        kind,
    }
}

fn tiny(model_type: i32, pieces: Vec<Piece>) -> ModelProto {
    ModelProto {
        pieces,
        trainer_spec: TrainerSpec {
            model_type,
            ..TrainerSpec::default()
        },
        ..ModelProto::default()
    }
}

fn small_pieces() -> Vec<Piece> {
    vec![
        piece("<unk>", 0.0, PieceType::Unknown),
        piece("▁", -1.0, PieceType::Normal),
        piece("a", -2.0, PieceType::Normal),
        piece("▁a", -0.5, PieceType::Normal),
    ]
}

#[test]
fn word_char_and_unknown_model_types_are_refused_by_name() {
    for (t, name) in [(3, "WORD"), (4, "CHAR"), (0, "0"), (7, "7")] {
        let err = SentencePieceModel::from_proto(tiny(t, small_pieces()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(name), "type {t}: {err}");
        assert!(err.contains("BPE") && err.contains("UNIGRAM"), "{err}");
    }
    let sp = SentencePieceModel::from_proto(tiny(2, small_pieces())).unwrap();
    assert_eq!(sp.model_type(), SentencePieceType::Bpe);
    assert_eq!(sp.encode_pieces("a a").unwrap(), ["▁a", "▁a"]);
}

#[test]
fn bad_bpe_models_are_errors_naming_the_problem() {
    let mut p = small_pieces();
    p.push(piece("a", -3.0, PieceType::Normal));
    let err = SentencePieceModel::from_proto(tiny(2, p))
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"a\"") && err.contains("twice"), "{err}");

    let mut p = small_pieces();
    p.push(piece("<0x41>", 0.0, PieceType::Byte));
    let err = SentencePieceModel::from_proto(tiny(2, p))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("<0x41>") && err.contains("byte_fallback"),
        "{err}"
    );

    let mut p = small_pieces();
    p.push(piece("", 0.0, PieceType::Normal));
    let err = SentencePieceModel::from_proto(tiny(2, p))
        .unwrap_err()
        .to_string();
    assert!(err.contains("piece 4") && err.contains("empty"), "{err}");

    let p = small_pieces()[1..].to_vec();
    let err = SentencePieceModel::from_proto(tiny(2, p))
        .unwrap_err()
        .to_string();
    assert!(err.contains("<unk>"), "{err}");

    let sp = SentencePieceModel::from_proto(tiny(2, small_pieces())).unwrap();
    let err = sp.decode_ids(&[1, 99]).unwrap_err().to_string();
    assert!(err.contains("99"), "{err}");
}

#[test]
fn truncated_and_corrupted_bpe_files_are_errors_not_panics() {
    let path = fixtures().join("identity.model");
    let bytes = std::fs::read(&path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.model");
    for len in (0..bytes.len()).step_by(97) {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        if let Err(e) = SentencePieceModel::from_file(&cut) {
            assert!(e.to_string().contains("cut.model"), "{e}");
        }
    }
    // Flipped bytes: loading and encoding may fail, never panic.
    for i in (0..bytes.len()).step_by(131) {
        let mut b = bytes.clone();
        b[i] ^= 0x5a;
        if let Ok(sp) = SentencePieceModel::from_bytes(&b) {
            let _ = sp.encode("Hello, мир! 世界 مرحبا 🙂");
        }
    }
    let err = SentencePieceModel::from_file(dir.path().join("missing.model"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.model"), "{err}");
}

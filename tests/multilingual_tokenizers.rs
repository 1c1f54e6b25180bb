//! The NLLB-200, M2M100 and mBART-50 tokenizers against what transformers 5.24 gives on the
//! fixtures of `tests/fixtures/make_multilingual_tokenizer_fixtures.py` (directories without
//! tokenizer.json; ids, tokens, target ids, decodes with and without special tokens, a padded
//! batch, generated-like id sequences, the special ids and the language ids).

use candle_attention::tokenizers::{
    load_multilingual_tokenizer, M2M100Tokenizer, MBart50Tokenizer, MultilingualFamily,
    MultilingualTokenizer, NllbTokenizer,
};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/multilingual_tokenizer")
}

fn load_cases(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn strs(v: &Value) -> Vec<Option<String>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// Checks every recorded value; returns the number of cases checked.
fn check_family(tok: &dyn MultilingualTokenizer, name: &str) -> usize {
    let data = load_cases(name);
    let mut failures: Vec<String> = Vec::new();
    let cases = data["cases"].as_array().unwrap();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let src = c["src_lang"].as_str().unwrap();
        let tgt = c["tgt_lang"].as_str().unwrap();
        let want = ids(&c["ids"]);
        let got = tok.encode(text, src).unwrap();
        if got != want {
            failures.push(format!("{text:?} [{src}] ids: got {got:?}, want {want:?}"));
            continue;
        }
        let tokens: Vec<Option<String>> = got.iter().map(|&i| tok.id_to_token(i)).collect();
        let want_tokens = strs(&c["tokens"]);
        if tokens != want_tokens {
            failures.push(format!(
                "{text:?} tokens: got {tokens:?}, want {want_tokens:?}"
            ));
        }
        let target = tok.encode_target(text, tgt).unwrap();
        if target != ids(&c["target_ids"]) {
            failures.push(format!("{text:?} [{tgt}] target ids: got {target:?}"));
        }
        for (skip, key) in [(false, "decoded"), (true, "decoded_skip")] {
            let d = tok.decode(&got, skip).unwrap();
            if d != c[key].as_str().unwrap() {
                failures.push(format!("{text:?} {key}: got {d:?}, want {:?}", c[key]));
            }
        }
    }
    for d in data["decodes"].as_array().unwrap() {
        let seq = ids(&d["ids"]);
        for (skip, key) in [(false, "decoded"), (true, "decoded_skip")] {
            let got = tok.decode(&seq, skip).unwrap();
            if got != d[key].as_str().unwrap() {
                failures.push(format!(
                    "decode {seq:?} {key}: got {got:?}, want {:?}",
                    d[key]
                ));
            }
        }
        let tokens: Vec<Option<String>> = seq.iter().map(|&i| tok.id_to_token(i)).collect();
        if tokens != strs(&d["tokens"]) {
            failures.push(format!("tokens of {seq:?}: got {tokens:?}"));
        }
    }
    let b = &data["batch"];
    let texts: Vec<&str> = b["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let batch = tok
        .encode_batch_padded(&texts, b["src_lang"].as_str().unwrap())
        .unwrap();
    let want_ids: Vec<Vec<u32>> = b["input_ids"].as_array().unwrap().iter().map(ids).collect();
    let want_mask: Vec<Vec<u32>> = b["attention_mask"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    if batch.input_ids != want_ids || batch.attention_mask != want_mask {
        failures.push(format!("padded batch: got {batch:?}"));
    }
    let s = &data["summary"];
    let check = |what: &str, got: u64, want: &Value, failures: &mut Vec<String>| {
        if Some(got) != want.as_u64() {
            failures.push(format!("{what}: got {got}, want {want}"));
        }
    };
    check("len", tok.len() as u64, &s["len"], &mut failures);
    check(
        "vocab_size",
        tok.vocab_size() as u64,
        &s["vocab_size"],
        &mut failures,
    );
    check("pad", tok.pad_id() as u64, &s["pad_id"], &mut failures);
    check("eos", tok.eos_id() as u64, &s["eos_id"], &mut failures);
    check("unk", tok.unk_id() as u64, &s["unk_id"], &mut failures);
    check("bos", tok.bos_id() as u64, &s["bos_id"], &mut failures);
    if let Some(mask) = s["mask_id"].as_u64() {
        check(
            "mask",
            tok.token_to_id("<mask>").unwrap_or(u32::MAX) as u64,
            &Value::from(mask),
            &mut failures,
        );
    }
    for (code, id) in s["lang_ids"].as_object().unwrap() {
        check(code, tok.lang_id(code).unwrap() as u64, id, &mut failures);
    }
    if tok.special_ids() != ids(&s["skipped_ids"]) {
        failures.push(format!("special ids: got {:?}", tok.special_ids()));
    }
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

#[test]
fn nllb_matches_transformers() {
    let tok = NllbTokenizer::from_dir(fixtures().join("nllb")).unwrap();
    assert!(!tok.legacy_behaviour());
    assert!(check_family(&tok, "nllb") >= 60);
}

#[test]
fn nllb_without_added_tokens_decoder_shifts_the_codes() {
    // transformers puts <mask> first, then the codes: every code one id further.
    let tok = NllbTokenizer::from_dir(fixtures().join("nllb_nodecoder")).unwrap();
    assert!(check_family(&tok, "nllb_nodecoder") >= 60);
    let with = NllbTokenizer::from_dir(fixtures().join("nllb")).unwrap();
    assert_eq!(
        tok.lang_id("eng_Latn").unwrap(),
        with.lang_id("eng_Latn").unwrap() + 1
    );
}

#[test]
fn nllb_codes_only_in_added_tokens_decoder() {
    let tok = NllbTokenizer::from_dir(fixtures().join("nllb_decoder_only")).unwrap();
    assert_eq!(tok.language_codes().len(), 202);
    assert!(check_family(&tok, "nllb_decoder_only") >= 60);
}

#[test]
fn nllb_legacy_behaviour_puts_the_code_last() {
    let tok = NllbTokenizer::from_dir(fixtures().join("nllb_legacy")).unwrap();
    assert!(tok.legacy_behaviour());
    assert!(check_family(&tok, "nllb_legacy") >= 60);
}

#[test]
fn mbart50_matches_transformers() {
    let tok = MBart50Tokenizer::from_dir(fixtures().join("mbart50")).unwrap();
    assert_eq!(tok.language_codes().len(), 52);
    assert!(check_family(&tok, "mbart50") >= 60);
}

#[test]
fn mbart50_cleans_up_tokenization_spaces_when_asked() {
    let tok = MBart50Tokenizer::from_dir(fixtures().join("mbart50_cleanup")).unwrap();
    assert!(check_family(&tok, "mbart50_cleanup") >= 60);
    let ids = tok.encode("a , b .", "en_XX").unwrap();
    assert_eq!(tok.decode(&ids, true).unwrap(), "a, b.");
}

#[test]
fn a_tokenizer_json_is_used_when_present() {
    // As transformers: vocabulary, merges (NLLB) or scores (mBART-50) and the charsmap come
    // from tokenizer.json; no sentencepiece file is needed. The fixture files are edited so
    // that this shows (fewer merges and no normaliser; other unigram scores).
    let dir = fixtures().join("nllb_tokjson");
    assert!(!dir.join("sentencepiece.bpe.model").exists());
    let tok = NllbTokenizer::from_dir(&dir).unwrap();
    assert!(check_family(&tok, "nllb_tokjson") >= 60);
    let tok = MBart50Tokenizer::from_dir(fixtures().join("mbart50_tokjson")).unwrap();
    assert!(check_family(&tok, "mbart50_tokjson") >= 60);
}

/// M2M100 segments with the `sentencepiece` library's BPE (`SentencePieceModel`'s BPE segmenter).
#[test]
fn m2m100_matches_transformers() {
    let tok = M2M100Tokenizer::from_dir(fixtures().join("m2m100")).unwrap();
    assert_eq!(tok.language_codes().len(), 100);
    assert!(check_family(&tok, "m2m100") >= 60);
}

#[test]
fn the_family_is_detected() {
    for (dir, family) in [
        ("nllb", MultilingualFamily::Nllb),
        ("mbart50", MultilingualFamily::MBart50),
    ] {
        let tok = load_multilingual_tokenizer(fixtures().join(dir)).unwrap();
        assert_eq!(tok.family(), family);
    }
}

#[test]
fn unknown_language_codes_list_close_matches() {
    let tok = NllbTokenizer::from_dir(fixtures().join("nllb")).unwrap();
    let err = tok.encode("Hello", "eng_latn").unwrap_err().to_string();
    assert!(err.contains("eng_Latn"), "{err}");
    assert!(err.contains("language_codes()"), "{err}");
    let err = tok.lang_id("deu").unwrap_err().to_string();
    assert!(err.contains("deu_Latn"), "{err}");
    let tok = MBart50Tokenizer::from_dir(fixtures().join("mbart50")).unwrap();
    let err = tok.lang_id("en_US").unwrap_err().to_string();
    assert!(err.contains("en_XX"), "{err}");
    assert!(err.contains("52 codes"), "{err}");
    // A code of another family is no code of this one.
    assert!(tok.lang_id("eng_Latn").is_err());
    assert!(tok.language_codes().contains(&"sl_SI".to_string()));
}

#[test]
fn a_directory_without_language_codes_is_refused() {
    // Only sentencepiece.bpe.model: transformers would map every code to <unk>.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures().join("nllb/sentencepiece.bpe.model"),
        dir.path().join("sentencepiece.bpe.model"),
    )
    .unwrap();
    let err = NllbTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("no language codes"), "{err}");
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = NllbTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("sentencepiece.bpe.model"), "{err}");
    assert!(err.contains("NLLB-200"), "{err}");
    let err = M2M100Tokenizer::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("vocab.json"), "{err}");
    std::fs::copy(
        fixtures().join("mbart50/tokenizer_config.json"),
        dir.path().join("tokenizer_config.json"),
    )
    .unwrap();
    let err = load_multilingual_tokenizer(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mBART-50") && err.contains("sentencepiece.bpe.model"),
        "{err}"
    );
}

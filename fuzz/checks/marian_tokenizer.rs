//! Arbitrary bytes through a MarianTokenizer (the committed opus-mt-style fixture,
//! `tests/fixtures/marian_e2e`): the text read as UTF-8 (lossily) is split on special tokens,
//! normalised, segmented and mapped through `vocab.json`; the bytes read as ids are decoded.
//!
//! Invariants: no panic; every id encoded is inside the vocabulary and the encoding ends with
//! `</s>`; decoding any id list, in range or not, with or without special tokens, does not
//! panic.

use candle_attention::tokenizers::MarianTokenizer;
use std::sync::OnceLock;

fn tokenizer() -> &'static MarianTokenizer {
    static T: OnceLock<MarianTokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = [
            manifest.join("tests/fixtures/marian_e2e"),
            manifest.join("../tests/fixtures/marian_e2e"),
        ]
        .into_iter()
        .find(|d| d.is_dir())
        .expect("tests/fixtures/marian_e2e");
        MarianTokenizer::from_dir(dir).unwrap()
    })
}

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let tok = tokenizer();
    let text = String::from_utf8_lossy(data);
    let vocab = tok.vocab_size() as u32;
    match tok.encode(&text) {
        Ok(ids) => {
            assert!(
                ids.iter().all(|&id| id < vocab),
                "an id outside the vocabulary"
            );
            assert_eq!(
                ids.last(),
                Some(&tok.eos_id()),
                "the encoding must end with </s>"
            );
            let _ = tok.decode(&ids, true);
        }
        Err(e) => panic!("encode refused a text: {e}"),
    }
    let _ = tok.pieces(&text);
    let ids: Vec<u32> = data
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
        .collect();
    let _ = tok.decode(&ids, true);
    let _ = tok.decode(&ids, false);
}

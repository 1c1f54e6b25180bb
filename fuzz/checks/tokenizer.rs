//! Arbitrary UTF-8 through the translation front end: English normalisation, tokenisation
//! and parsing, German tokenisation, decoding of arbitrary ids, vocabulary JSON, and the
//! translator itself on whatever parses.
//!
//! Invariants: no panic; an English text the parser accepts round-trips to its number's
//! canonical words; the tokenizer encodes every text the parser accepts; the translator
//! answers every text with a translation or an error, one per input.

use attn_cli::number_translator::numbers::{english, parse_english};
use attn_cli::number_translator::translator::Translator;
use attn_cli::number_translator::{EnglishTokenizer, GermanTokenizer, Vocab};
use candle::Device;
use std::sync::OnceLock;

struct Fixture {
    en: EnglishTokenizer,
    de: GermanTokenizer,
    translator: Option<Translator>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // The repository's weights/, from the fuzz crate or from the main crate's tests.
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let weights = [manifest.join("weights"), manifest.join("../weights")]
            .into_iter()
            .find(|d| d.join("config.json").exists())
            .unwrap_or_default();
        Fixture {
            en: EnglishTokenizer::build().unwrap(),
            de: GermanTokenizer::build().unwrap(),
            translator: Translator::load(&weights, &Device::Cpu).ok(),
        }
    })
}

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = fixture();
    let _ = f.en.normalize(text);
    let _ = f.en.tokens(text);
    let encoded = f.en.encode(text);
    let _ = f.de.tokens(text);
    let _ = f.de.encode(text);
    if let Ok(n) = parse_english(text) {
        assert!(n <= 999_999, "parsed {n} from {text:?}");
        assert!(encoded.is_ok(), "parsed {n} but cannot tokenize {text:?}");
        assert_eq!(parse_english(&english(n).unwrap()).unwrap(), n);
    }
    let ids: Vec<u32> = data.iter().map(|&b| b as u32 % 40).collect();
    let _ = f.en.decode(&ids);
    let _ = f.de.decode(&ids);
    let _ = Vocab::from_json(text);
    if let Some(t) = &f.translator {
        // Whole lines as `attn translate` reads them from stdin, at most a few per input.
        let lines: Vec<&str> = text.lines().take(4).collect();
        if !lines.is_empty() {
            let out = t
                .translate(&lines, 1)
                .expect("per-line errors, not a batch error");
            assert_eq!(out.len(), lines.len());
        }
    }
}

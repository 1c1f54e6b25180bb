//! Arbitrary bytes as the JSON files of an NLLB-200, M2M100 or mBART-50 directory: the first
//! byte picks the file, the rest is its content.
//!
//! * 0, 1: `config.json` read as an M2M100 (and NLLB-200) or an mBART configuration, then
//!   validated and turned into the stacks' configurations, as `Seq2SeqModel` does.
//! * 2–7: `tokenizer_config.json`, `special_tokens_map.json` or `tokenizer.json` of the
//!   committed NLLB-200 (2–4) or mBART-50 (5–7) fixture directories
//!   (`tests/fixtures/multilingual_e2e`), replaced in a private copy that is then loaded as a
//!   tokenizer and used with its first language code.
//!
//! Invariants: no panic; whatever parses resolves (or is refused) without panicking; a
//! tokenizer that loads encodes, encodes targets and decodes.
use candle_attention::models::family_config::{FamilyConfig, FamilyDef};
use candle_attention::models::{m2m100::M2M100, mbart::MBART};
use candle_attention::tokenizers::load_multilingual_tokenizer;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// The files of a fixture directory the tokenizer reads (the model is not needed).
const COPIED: [&str; 3] = [
    "sentencepiece.bpe.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// The files an input may replace, in the order of the kind byte.
const REPLACED: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
];

/// Private copies of the NLLB-200 and mBART-50 fixture directories, shared by every input of
/// this process.
fn fixture_copies() -> &'static Mutex<[PathBuf; 2]> {
    static DIRS: OnceLock<Mutex<[PathBuf; 2]>> = OnceLock::new();
    DIRS.get_or_init(|| {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = [
            manifest.join("tests/fixtures/multilingual_e2e"),
            manifest.join("../tests/fixtures/multilingual_e2e"),
        ]
        .into_iter()
        .find(|d| d.is_dir())
        .expect("tests/fixtures/multilingual_e2e");
        let copy = |family: &str| {
            let dst = std::env::temp_dir().join(format!(
                "attn-fuzz-multilingual-hub-{family}-{}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dst).unwrap();
            for name in COPIED {
                std::fs::copy(root.join(family).join(name), dst.join(name)).unwrap();
            }
            dst
        };
        Mutex::new([copy("nllb"), copy("mbart50")])
    })
}

/// Reads `text` as a `config.json` of `family` and goes as far as the model's loader goes
/// before it needs weights.
fn family_config(text: &str, family: &FamilyDef) {
    let Ok(cfg) = FamilyConfig::from_json(text, family) else {
        return;
    };
    if cfg.validate(family).is_ok() {
        let _ = cfg.spec(family);
        let _ = cfg.encoder_config();
        let _ = cfg.decoder_config();
        let _ = cfg.activation();
        let _ = cfg.pad_id();
    }
}

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 8 {
        k @ (0 | 1) => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            family_config(text, if k == 0 { &M2M100 } else { &MBART });
        }
        k => {
            let dirs = fixture_copies().lock().unwrap_or_else(|e| e.into_inner());
            let dir = &dirs[usize::from(k >= 5)];
            let name = REPLACED[usize::from((k - 2) % 3)];
            let original = std::fs::read(dir.join(name)).ok();
            std::fs::write(dir.join(name), body).unwrap();
            if let Ok(tok) = load_multilingual_tokenizer(dir) {
                let codes = tok.language_codes();
                if let Some(code) = codes.first() {
                    if let Ok(ids) = tok.encode("Grüße, Привет 東京 </s> <unk>", code) {
                        let _ = tok.decode(&ids, true);
                        let _ = tok.decode(&ids, false);
                    }
                    let _ = tok.encode_target("Hello", code);
                    let _ = tok.lang_id(code);
                }
                let _ = tok.decode(&[0, 1, 2, 3, u32::MAX], true);
                let _ = tok.id_to_token(u32::MAX);
            }
            match original {
                Some(bytes) => std::fs::write(dir.join(name), bytes).unwrap(),
                None => {
                    let _ = std::fs::remove_file(dir.join(name));
                }
            }
        }
    }
}

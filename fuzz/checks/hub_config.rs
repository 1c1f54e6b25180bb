//! Arbitrary bytes as the JSON files of a Hugging Face model directory: the first byte picks
//! the file (`config.json`, `generation_config.json`, `tokenizer_config.json`,
//! `special_tokens_map.json`, `vocab.json`), the rest is its content. `config.json` and
//! `generation_config.json` are parsed as the model and the generation engine parse them;
//! the tokenizer files replace their namesakes in a copy of the committed opus-mt-style
//! fixture (`tests/fixtures/marian_e2e`), which is then loaded as a tokenizer.
//!
//! Invariants: no panic; whatever parses resolves (or is refused) without panicking; a
//! tokenizer that loads encodes and decodes.

use candle_attention::generation::GenerationConfig;
use candle_attention::marian::MarianConfig;
use candle_attention::tokenizers::MarianTokenizer;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// A private copy of the fixture directory, shared by every input of this process.
fn fixture_copy() -> &'static Mutex<PathBuf> {
    static DIR: OnceLock<Mutex<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let src = [
            manifest.join("tests/fixtures/marian_e2e"),
            manifest.join("../tests/fixtures/marian_e2e"),
        ]
        .into_iter()
        .find(|d| d.is_dir())
        .expect("tests/fixtures/marian_e2e");
        let dst = std::env::temp_dir().join(format!("attn-fuzz-hub-config-{}", std::process::id()));
        std::fs::create_dir_all(&dst).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
        }
        Mutex::new(dst)
    })
}

const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
];

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 5 {
        0 => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            if let Ok(cfg) = MarianConfig::from_json(text) {
                let _ = cfg.spec();
                let _ = cfg.target_vocab_size();
            }
        }
        1 => {
            let Ok(text) = std::str::from_utf8(body) else {
                return;
            };
            if let Ok(cfg) = GenerationConfig::from_json_str(text) {
                let _ = cfg.search_size();
                let _ = cfg.output_pad_token_id();
                let _ = cfg.clone().with_num_beams(3).search_size();
            }
        }
        k => {
            let dir = fixture_copy().lock().unwrap_or_else(|e| e.into_inner());
            let name = TOKENIZER_FILES[(k - 2) as usize];
            let original = std::fs::read(dir.join(name)).ok();
            std::fs::write(dir.join(name), body).unwrap();
            if let Ok(tok) = MarianTokenizer::from_dir(&*dir) {
                if let Ok(ids) = tok.encode("Is it forty-two? </s> >>deu<<") {
                    let _ = tok.decode(&ids, true);
                    let _ = tok.decode(&ids, false);
                }
                let _ = tok.decode(&[0, 1, 2, u32::MAX], true);
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

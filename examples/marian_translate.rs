//! Translate with a Hugging Face model directory (MarianMT / opus-mt, NLLB-200, M2M100,
//! mBART-50), text to text, in pure Rust.
//!
//! `cargo run --release --example marian_translate -- [DIR] [TEXT...]`
//! (default: the small English → German model in tests/fixtures/marian_e2e; a multilingual
//! directory translates from its first language into its second).

use anyhow::Context;
use candle_attention::{TranslateOptions, Translator};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/marian_e2e").into()
    });
    let mut texts: Vec<String> = args.collect();
    if texts.is_empty() {
        texts = vec![
            "Is it forty-two?".into(),
            "over five hundred twenty-two bridges".into(),
        ];
    }
    let translator = Translator::from_dir(&dir).with_context(|| format!("loading {dir}"))?;
    let options = TranslateOptions::default();
    let results = match translator.default_pair() {
        Some(_) => translator.translate(&texts, &options)?,
        None => {
            let languages = translator.target_languages();
            let (source, target) = match languages {
                [first, second, ..] => (&first.code, &second.code),
                _ => anyhow::bail!("{dir}: the model names fewer than two languages"),
            };
            translator.translate_pair(&texts, source, target, &options)?
        }
    };
    for (text, result) in texts.iter().zip(results) {
        println!("{text} -> {}", result?.text);
    }
    Ok(())
}

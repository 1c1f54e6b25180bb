//! Translate with a Hugging Face MarianMT (opus-mt) directory, text to text, in pure Rust.
//!
//! `cargo run --release --example marian_translate -- [DIR] [TEXT...]`
//! (default: the small English → German model in tests/fixtures/marian_e2e).

use anyhow::Context;
use candle_attention::marian::MarianTranslator;

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
    let translator = MarianTranslator::from_dir(&dir, &candle::Device::Cpu)
        .with_context(|| format!("loading {dir}"))?;
    for (text, result) in texts.iter().zip(translator.translate(&texts)?) {
        println!("{text} -> {}", result?);
    }
    Ok(())
}

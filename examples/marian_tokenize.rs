//! Tokenize → ids → decode with the pure-Rust MarianTokenizer.
//!
//! ```text
//! cargo run --example marian_tokenize -- [DIR] [TEXT...]
//! ```
//! `DIR` is a MarianMT tokenizer directory (source.spm, target.spm, vocab.json); it defaults to
//! the small multilingual test fixture `tests/fixtures/marian_tokenizer/mul`.

use anyhow::Context;
use candle_attention::marian::MarianTokenizer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| "tests/fixtures/marian_tokenizer/mul".to_string());
    let mut texts: Vec<String> = args.collect();
    if texts.is_empty() {
        texts = vec![
            ">>deu<< Die Straße ist groß, Grüße aus München!".into(),
            "ﬁnancial ½ Ｆｕｌｌ width, CJK 日本語 and emoji 😀".into(),
        ];
    }
    let tok = MarianTokenizer::from_dir(&dir)
        .with_context(|| format!("loading the tokenizer from {dir}"))?;
    println!(
        "{dir}: vocab {} tokens, pad {}, eos {}, unk {}, language codes {:?}",
        tok.vocab_size(),
        tok.pad_id(),
        tok.eos_id(),
        tok.unk_id(),
        tok.language_codes()
    );
    for text in &texts {
        let pieces = tok.pieces(text)?;
        let ids = tok.encode(text)?;
        let decoded = tok.decode(&ids, true)?;
        println!(
            "\ntext:    {text:?}\npieces:  {pieces:?}\nids:     {ids:?}\ndecoded: {decoded:?}"
        );
    }
    let batch = tok.encode_batch_padded(&texts)?;
    println!("\npadded batch:");
    for (ids, mask) in batch.input_ids.iter().zip(&batch.attention_mask) {
        println!("  {ids:?}\n  {mask:?}");
    }
    Ok(())
}

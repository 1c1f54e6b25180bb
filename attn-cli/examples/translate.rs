//! The shortest program that translates with the shipped model:
//!
//! ```text
//! cargo run --release --example translate -- "three hundred and forty-two" "twelve thousand, three hundred forty-five"
//! ```

use anyhow::Result;
use attn_cli::number_translator::translator::Translator;

fn main() -> Result<()> {
    let translator = Translator::load(
        concat!(env!("CARGO_MANIFEST_DIR"), "/../weights"),
        &candle::Device::Cpu,
    )?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let texts: Vec<&str> = if args.is_empty() {
        vec!["three hundred and forty-two"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    for (text, german) in texts.iter().zip(translator.translate(&texts, 1)?) {
        match german {
            Ok(german) => println!("{text} -> {german}"),
            Err(e) => println!("{text} -> error: {e}"),
        }
    }
    Ok(())
}

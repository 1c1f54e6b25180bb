//! Held-out quality of a translation model: exact match and chrF over every held-out number
//! (19,900 of them), greedy and, with `--beam N`, beam search.
//!
//! ```text
//! cargo run --release --example evaluate_translation -- [MODEL_DIR] [--beam N]
//! ```

use anyhow::{Context, Result};
use attn_cli::number_translator::metrics::{chrf, exact_match};
use attn_cli::number_translator::translator::Translator;
use attn_cli::number_translator::{english, german, numbers, Split};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let beam = match args.iter().position(|a| a == "--beam") {
        Some(i) => args.get(i + 1).context("--beam needs a number")?.parse()?,
        None => 1,
    };
    let dir = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../weights").to_string());
    let translator = Translator::load(&dir, &candle::Device::Cpu)?;
    let held: Vec<u32> = numbers(Split::HeldOut).collect();
    let sources: Vec<String> = held
        .iter()
        .map(|&n| english(n))
        .collect::<candle::Result<_>>()?;
    let references: Vec<String> = held
        .iter()
        .map(|&n| german(n))
        .collect::<candle::Result<_>>()?;
    let started = Instant::now();
    let mut hypotheses = Vec::with_capacity(held.len());
    for chunk in sources.chunks(512) {
        let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for out in translator.translate(&texts, beam)? {
            hypotheses.push(out.unwrap_or_default());
        }
    }
    let hyps: Vec<&str> = hypotheses.iter().map(String::as_str).collect();
    let refs: Vec<&str> = references.iter().map(String::as_str).collect();
    println!(
        "{dir}: {} held-out numbers, beam {beam}: exact match {:.2}%, chrF {:.2}, {:.1} s",
        held.len(),
        100.0 * exact_match(&hyps, &refs),
        chrf(&hyps, &refs),
        started.elapsed().as_secs_f64()
    );
    for ((n, h), r) in held
        .iter()
        .zip(&hyps)
        .zip(&refs)
        .filter(|((_, h), r)| h != r)
        .take(10)
    {
        println!("  {n}: got {h:?}, expected {r:?}");
    }
    Ok(())
}

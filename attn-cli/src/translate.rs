//! `attn translate`: English number words to German with the shipped model.

use anyhow::Context;
use attn_cli::heatmap::{self, AttentionMap, Heads};
use attn_cli::number_translator::translator::Translator;
use attn_cli::shipped;
use candle_attention::marian::MarianTranslator;
use std::io::BufRead;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TranslateArgs {
    /// Model directory (model.safetensors, config.json, vocab.en.json, vocab.de.json);
    /// default: the shipped model of weights/, built into this binary.
    #[arg(long, conflicts_with = "model")]
    weights: Option<PathBuf>,
    /// A Hugging Face MarianMT directory (opus-mt: config.json, model.safetensors or
    /// pytorch_model.bin, source.spm, target.spm, vocab.json) to translate with instead.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Beam width (1 = greedy). Default: 1 for the shipped model; the directory's
    /// generation_config.json for --model.
    #[arg(long)]
    beam: Option<usize>,
    /// With --model: most tokens to generate per text (default: generation_config.json).
    #[arg(long, requires = "model")]
    max_new_tokens: Option<usize>,
    /// Draw the cross-attention of the first translation to FILE (.svg or .png).
    #[arg(long)]
    heatmap: Option<PathBuf>,
    /// Heads in the heatmap: avg (mean over heads), all (one panel each) or a head number.
    #[arg(long, default_value = "avg")]
    heads: String,
    /// Decoder layer of the heatmap (0-based; default: the last).
    #[arg(long)]
    layer: Option<usize>,
    /// Where to compute: cpu, cuda or metal (the GPU ones need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
    /// Texts to translate; without any, one per line from standard input.
    texts: Vec<String>,
}

fn parse_heads(s: &str) -> anyhow::Result<Heads> {
    Ok(match s {
        "avg" | "average" | "mean" => Heads::Average,
        "all" => Heads::All,
        n => Heads::One(
            n.parse()
                .with_context(|| format!("--heads takes avg, all or a head number, got '{n}'"))?,
        ),
    })
}

/// The texts: the arguments, or one per line of standard input.
fn input_texts(args: &TranslateArgs) -> anyhow::Result<Vec<String>> {
    if !args.texts.is_empty() {
        return Ok(args.texts.clone());
    }
    std::io::stdin()
        .lock()
        .lines()
        .collect::<Result<_, _>>()
        .context("reading standard input")
}

/// Prints one line per input (an empty line for a failure, whose reason goes to stderr) and
/// returns the number of failures.
fn print_results(texts: &[String], results: Vec<candle::Result<String>>) -> usize {
    let mut failed = 0;
    for (text, result) in texts.iter().zip(results) {
        match result {
            Ok(translation) => println!("{translation}"),
            Err(e) => {
                // Keep one output line per input line, so scripts stay aligned.
                println!();
                eprintln!("error: {text:?}: {e}");
                failed += 1;
            }
        }
    }
    failed
}

pub fn run(args: &TranslateArgs) -> anyhow::Result<()> {
    let heads = parse_heads(&args.heads)?;
    if args.beam == Some(0) {
        anyhow::bail!("--beam must be at least 1");
    }
    if let Some(dir) = &args.model {
        return run_marian(args, dir, heads);
    }
    let beam = args.beam.unwrap_or(1);
    let device = args.device.device()?;
    let translator = match &args.weights {
        Some(dir) => Translator::load(dir, &device)
            .with_context(|| format!("loading the translation model from {}", dir.display()))?,
        None => shipped::translator(&device).context("loading the built-in translation model")?,
    };
    let texts = input_texts(args)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let failed = print_results(&texts, translator.translate(&refs, beam)?);
    draw_first(args, heads, &texts, |text| {
        Ok(translator.attention(text, args.layer, beam)?)
    })?;
    finish(failed, texts.len())
}

/// `attn translate --model DIR`: a Hugging Face MarianMT directory, text to text, as the
/// transformers pipeline does it.
fn run_marian(args: &TranslateArgs, dir: &std::path::Path, heads: Heads) -> anyhow::Result<()> {
    let device = args.device.device()?;
    let translator = MarianTranslator::from_dir(dir, &device)
        .with_context(|| format!("loading the MarianMT model in {}", dir.display()))?;
    let generation = crate::marian::generation_config(dir, args.beam, args.max_new_tokens, None)?;
    let translator = translator.with_generation_config(generation);
    let texts = input_texts(args)?;
    // On rayon's pool, as `attn generate` (see `on_rayon_pool`).
    let translations = crate::pool::on_rayon_pool(|| translator.translate(&texts))?;
    let failed = print_results(&texts, translations);
    draw_first(args, heads, &texts, |text| {
        Ok(translator.cross_attention(text, args.layer)?)
    })?;
    finish(failed, texts.len())
}

/// With `--heatmap FILE`: draws the cross-attention of the first text, as `attention` computes
/// it, to FILE.
fn draw_first(
    args: &TranslateArgs,
    heads: Heads,
    texts: &[String],
    attention: impl FnOnce(&str) -> anyhow::Result<AttentionMap>,
) -> anyhow::Result<()> {
    let Some(path) = &args.heatmap else {
        return Ok(());
    };
    let first = texts
        .first()
        .context("--heatmap needs a text to translate")?;
    heatmap::save(&attention(first)?, heads, path)?;
    eprintln!("cross-attention of {first:?} drawn to {}", path.display());
    Ok(())
}

/// The exit status: an error when some of the `total` texts could not be translated.
fn finish(failed: usize, total: usize) -> anyhow::Result<()> {
    if failed > 0 {
        anyhow::bail!("{failed} of {total} inputs could not be translated");
    }
    Ok(())
}

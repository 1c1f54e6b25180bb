//! `attn translate`: English number words to German with the shipped model.

use anyhow::Context;
use attn_cli::heatmap::{self, AttentionMap, Heads};
use attn_cli::shipped;
use candle_attention::translate::translator::Translator;
use std::io::BufRead;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TranslateArgs {
    /// Model directory (model.safetensors, config.json, vocab.en.json, vocab.de.json);
    /// default: the shipped model of weights/, built into this binary.
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Beam width (1 = greedy).
    #[arg(long, default_value_t = 1)]
    beam: usize,
    /// Draw the cross-attention of the first translation to FILE (.svg or .png).
    #[arg(long)]
    heatmap: Option<PathBuf>,
    /// Heads in the heatmap: avg (mean over heads), all (one panel each) or a head number.
    #[arg(long, default_value = "avg")]
    heads: String,
    /// Decoder layer of the heatmap (0-based; default: the last).
    #[arg(long)]
    layer: Option<usize>,
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

pub fn run(args: &TranslateArgs) -> anyhow::Result<()> {
    let heads = parse_heads(&args.heads)?;
    if args.beam == 0 {
        anyhow::bail!("--beam must be at least 1");
    }
    let device = candle::Device::Cpu;
    let translator = match &args.weights {
        Some(dir) => Translator::load(dir, &device)
            .with_context(|| format!("loading the translation model from {}", dir.display()))?,
        None => shipped::translator(&device).context("loading the built-in translation model")?,
    };
    let texts: Vec<String> = if args.texts.is_empty() {
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("reading standard input")?
    } else {
        args.texts.clone()
    };
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let mut failed = 0;
    for (text, result) in refs.iter().zip(translator.translate(&refs, args.beam)?) {
        match result {
            Ok(german) => println!("{german}"),
            Err(e) => {
                // Keep one output line per input line, so scripts stay aligned.
                println!();
                eprintln!("error: {text:?}: {e}");
                failed += 1;
            }
        }
    }
    if let Some(path) = &args.heatmap {
        let first = refs
            .first()
            .context("--heatmap needs a text to translate")?;
        let att = translator.attention(first, args.layer, args.beam)?;
        let map = AttentionMap {
            source: att.source,
            output: att.output,
            weights: att.weights,
            layer: att.layer,
            num_layers: att.num_layers,
        };
        heatmap::save(&map, heads, path)?;
        eprintln!("cross-attention of {first:?} drawn to {}", path.display());
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} inputs could not be translated", refs.len());
    }
    Ok(())
}

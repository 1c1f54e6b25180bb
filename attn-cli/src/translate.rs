//! `attn translate`: English number words to German with the shipped model.

use crate::bulk;
use anyhow::Context;
use attn_cli::heatmap::{self, AttentionMap, Heads};
use attn_cli::number_translator::translator::Translator as NumberTranslator;
use attn_cli::shipped;
use candle_attention::{TranslateOptions, Translator};
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

/// Default of `--max-batch-tokens`.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = candle_attention::translator::DEFAULT_MAX_BATCH_TOKENS;
/// The library's default row cap.
pub const MAX_BATCH_ROWS: usize = candle_attention::translator::MAX_BATCH_ROWS;

/// Default of `--window`.
pub const DEFAULT_WINDOW: usize = 1024;

#[derive(clap::Args, Debug)]
pub struct TranslateArgs {
    /// Model directory (model.safetensors, config.json, vocab.en.json, vocab.de.json);
    /// default: the shipped model of weights/, built into this binary.
    #[arg(long, conflicts_with = "model")]
    weights: Option<PathBuf>,
    /// A Hugging Face model to translate with instead: a directory, or a hub id
    /// ORG/NAME or ORG/NAME@REVISION (e.g. Helsinki-NLP/opus-mt-en-de), taken from the Hugging Face cache
    /// and downloaded when missing (never with HF_HUB_OFFLINE=1). MarianMT (opus-mt), or
    /// NLLB-200 / M2M100 / mBART-50 with --source-lang and --target-lang.
    #[arg(long, value_name = "DIR|ORG/NAME")]
    model: Option<PathBuf>,
    /// With a multilingual --model (NLLB-200, M2M100, mBART-50, a multi-target opus-mt model):
    /// the language of the texts, as the family spells it (eng_Latn, en, en_XX; `attn inspect
    /// DIR` lists them) or as ISO 639-1 (en).
    #[arg(long, requires = "model", value_name = "CODE")]
    source_lang: Option<String>,
    /// With a multilingual --model: the language to translate into (as --source-lang; for a
    /// multi-target opus-mt model, one of its >>xx<< targets, e.g. fra or fr).
    #[arg(long, requires = "model", value_name = "CODE")]
    target_lang: Option<String>,
    /// Beam width (1 = greedy). Default: 1 for the shipped model; the directory's
    /// generation_config.json for --model.
    #[arg(long)]
    beam: Option<usize>,
    /// With --model: most tokens to generate per text (default: generation_config.json).
    #[arg(long, requires = "model")]
    max_new_tokens: Option<usize>,
    /// With --model: read the texts from FILE instead of the arguments or standard input.
    #[arg(
        long,
        requires = "model",
        conflicts_with = "texts",
        value_name = "FILE"
    )]
    input: Option<PathBuf>,
    /// With --model: write the translations to FILE instead of standard output.
    #[arg(long, requires = "model", value_name = "FILE")]
    output: Option<PathBuf>,
    /// With --model: `text` (one text per line in, one translation per line out) or `jsonl`
    /// (objects with "text" in; "translation", "score", "log_prob" and the other fields out;
    /// a line that fails gets "error").
    #[arg(long, requires = "model", value_enum, default_value = "text")]
    format: bulk::Format,
    /// With --model and --format jsonl: also write the K best hypotheses of each line
    /// ("n_best": translation, score, log_prob); needs --beam K or more.
    #[arg(long, requires = "model", value_name = "K", default_value_t = 1)]
    n_best: usize,
    /// With --model and --format jsonl: for each generated token of the best translation, the
    /// source token it attends to most in the last decoder layer ("alignments": target,
    /// source, source_index). Costs one teacher-forced pass per line.
    #[arg(long, requires = "model")]
    alignments: bool,
    /// With --model: the most padded source tokens (lines × longest line, per cohort) of the
    /// lines decoding at once. Lines are read ahead, sorted by length and batched within it.
    #[arg(long, requires = "model", value_name = "N", default_value_t = DEFAULT_MAX_BATCH_TOKENS)]
    max_batch_tokens: usize,
    /// With --model: the most decoder rows (lines × beams) decoding at once; working memory
    /// grows with it.
    #[arg(long, requires = "model", value_name = "ROWS", default_value_t = MAX_BATCH_ROWS)]
    max_batch_rows: usize,
    /// With --model: lines read ahead and sorted together (memory grows with it, not with
    /// the input).
    #[arg(long, requires = "model", value_name = "LINES", default_value_t = DEFAULT_WINDOW)]
    window: usize,
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
    /// With --model: --dtype and --quantize.
    #[command(flatten)]
    precision: crate::model_args::PrecisionArgs,
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
        return run_model(args, dir, heads);
    }
    if args.precision.precision() != candle_attention::weights::Precision::default() {
        anyhow::bail!("--dtype and --quantize apply to a Hugging Face --model directory");
    }
    let beam = args.beam.unwrap_or(1);
    let device = args.device.device()?;
    let translator = match &args.weights {
        Some(dir) => NumberTranslator::load(dir, &device)
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

/// `attn translate --model DIR|ORG/NAME`: a Hugging Face directory or hub id, text to text,
/// as the transformers pipeline does it, through the bulk path ([`bulk`]) over the library's
/// [`Translator`]: MarianMT (its own pair, or `--source-lang`/`--target-lang` naming it or a
/// `>>xx<<` target), or a multilingual family (NLLB-200, M2M100, mBART-50) with
/// `--source-lang` / `--target-lang`.
fn run_model(args: &TranslateArgs, model: &std::path::Path, heads: Heads) -> anyhow::Result<()> {
    if args.n_best == 0 {
        anyhow::bail!("--n-best must be at least 1");
    }
    if args.n_best > 1 && args.format != bulk::Format::Jsonl {
        anyhow::bail!(
            "--n-best {} needs --format jsonl (plain text has one translation per line)",
            args.n_best
        );
    }
    if args.alignments && args.format != bulk::Format::Jsonl {
        anyhow::bail!("--alignments needs --format jsonl");
    }
    if args.max_batch_tokens == 0 || args.max_batch_rows == 0 || args.window == 0 {
        anyhow::bail!("--max-batch-tokens, --max-batch-rows and --window must be at least 1");
    }
    if args.max_new_tokens == Some(0) {
        anyhow::bail!("--max-new-tokens must be at least 1");
    }
    // A directory, or a hub id resolved through the Hugging Face cache (feature `hub`).
    let mut builder = Translator::builder(model)
        .precision(args.precision.precision())
        .device(args.device.device()?)
        .max_batch_tokens(args.max_batch_tokens)
        .max_batch_rows(args.max_batch_rows);
    if let Some(beam) = args.beam {
        builder = builder.beam(beam);
    }
    if let Some(n) = args.max_new_tokens {
        builder = builder.max_new_tokens(n);
    }
    let translator = builder.build()?;
    let beams = translator.generation_config().num_beams.unwrap_or(1);
    if args.n_best > beams {
        anyhow::bail!(
            "--n-best {} needs at least as many beams, got {beams} (--beam)",
            args.n_best
        );
    }
    // A one-pair model (an opus-mt directory) translates its pair and takes no languages;
    // a multilingual one (or a multi-target opus-mt model) needs them named.
    let one_pair = translator.default_pair().is_some() || translator.source_languages().is_empty();
    let pair = match (&args.source_lang, &args.target_lang) {
        (Some(_), _) | (_, Some(_)) if one_pair => anyhow::bail!(
            "{} is a {} directory, which translates one language pair{}: --source-lang and \
             --target-lang are for multilingual models (NLLB-200, M2M100, mBART-50)",
            model.display(),
            translator.family_name(),
            translator
                .default_pair()
                .map_or(String::new(), |(s, t)| format!(" ({s} -> {t})"))
        ),
        (Some(source), Some(target)) => Some((source.clone(), target.clone())),
        (None, None) if one_pair => None,
        (None, None) => anyhow::bail!(
            "{} is a {} model: give the languages with --source-lang and --target-lang \
             (codes as the family spells them, e.g. {}, or ISO 639-1; `attn inspect {}` lists \
             them)",
            model.display(),
            translator.family_name(),
            translator
                .source_languages()
                .iter()
                .take(2)
                .map(|l| l.code.as_str())
                .collect::<Vec<_>>()
                .join(" / "),
            model.display()
        ),
        _ => anyhow::bail!("--source-lang and --target-lang go together: give both"),
    };
    let options = TranslateOptions {
        beam: None,
        max_new_tokens: None,
        n_best: args.n_best,
        alignments: args.alignments,
    };
    let bulk_options = bulk::Options {
        window: args.window,
        format: args.format,
        translate: options.clone(),
        pair,
    };
    // Refuse options that cannot run before reading any input (e.g. --n-best above --beam).
    let pair = bulk_options
        .pair
        .as_ref()
        .map(|(s, t)| (s.as_str(), t.as_str()));
    match pair {
        Some((s, t)) => translator.translate_pair(&[] as &[&str], s, t, &options)?,
        None => translator.translate(&[] as &[&str], &options)?,
    };
    run_bulk(args, heads, &translator, &bulk_options, |text| {
        Ok(translator.cross_attention(text, pair, &TranslateOptions::default(), args.layer)?)
    })
}

/// The bulk path over `translator`: lines from the arguments, `--input` or standard input,
/// results to `--output` or standard output, a progress bar on a terminal, and the `--heatmap`
/// of the first text drawn from `heatmap`.
fn run_bulk(
    args: &TranslateArgs,
    heads: Heads,
    translator: &Translator,
    options: &bulk::Options,
    heatmap: impl FnOnce(&str) -> anyhow::Result<AttentionMap>,
) -> anyhow::Result<()> {
    let input: Box<dyn BufRead + Send> = match (&args.input, args.texts.is_empty()) {
        (Some(path), _) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        (None, false) => {
            // The arguments as lines (a newline inside one becomes a space: one line each).
            let joined: String = args
                .texts
                .iter()
                .map(|t| t.replace(['\n', '\r'], " ") + "\n")
                .collect();
            Box::new(std::io::Cursor::new(joined.into_bytes()))
        }
        (None, true) => Box::new(std::io::BufReader::new(std::io::stdin())),
    };
    let total_bytes = args
        .input
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.len());
    let output: Box<dyn Write + Send> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    let bar = progress_bar(total_bytes);
    let started = std::time::Instant::now();
    // The translator runs its batches on rayon's pool.
    let summary = {
        bulk::translate(
            translator,
            input,
            output,
            options,
            |line, reason| {
                let message = format!("error: line {line}: {reason}");
                match &bar {
                    Some(bar) => bar.println(message),
                    None => eprintln!("{message}"),
                }
            },
            |summary, bytes| {
                if let Some(bar) = &bar {
                    let secs = started.elapsed().as_secs_f64().max(1e-9);
                    bar.set_position(bytes);
                    bar.set_message(format!(
                        "{} lines, {:.0} tok/s",
                        summary.lines,
                        summary.generated_tokens as f64 / secs
                    ));
                }
            },
        )
    }?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if args.heatmap.is_some() {
        let texts = if args.texts.is_empty() {
            anyhow::bail!("--heatmap with --model needs the text as an argument")
        } else {
            &args.texts
        };
        draw_first(args, heads, texts, heatmap)?;
    }
    finish(summary.failed, summary.lines)
}

/// A progress bar on standard error when it is a terminal (none otherwise): bytes of the
/// input file with an ETA when its size is known, a spinner otherwise.
fn progress_bar(total_bytes: Option<u64>) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match total_bytes {
        Some(n) => indicatif::ProgressBar::new(n).with_style(
            indicatif::ProgressStyle::with_template("{bar:30} {percent:>3}% {msg}, ETA {eta}")
                .ok()?,
        ),
        None => indicatif::ProgressBar::new_spinner()
            .with_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").ok()?),
    };
    Some(bar)
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

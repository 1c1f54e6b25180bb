//! `attn translate`: English number words to German with the shipped model.

use crate::bulk;
use anyhow::Context;
use attn_cli::heatmap::{self, AttentionMap, Heads};
use attn_cli::number_translator::translator::Translator;
use attn_cli::shipped;
use candle_attention::marian::MarianTranslator;
use candle_attention::models::multilingual_translator::MultilingualTranslator;
use candle_attention::models::seq2seq::Family;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

/// Default of `--max-batch-tokens`.
pub const DEFAULT_MAX_BATCH_TOKENS: usize = 4096;

/// Default of `--window`.
pub const DEFAULT_WINDOW: usize = 1024;

#[derive(clap::Args, Debug)]
pub struct TranslateArgs {
    /// Model directory (model.safetensors, config.json, vocab.en.json, vocab.de.json);
    /// default: the shipped model of weights/, built into this binary.
    #[arg(long, conflicts_with = "model")]
    weights: Option<PathBuf>,
    /// A Hugging Face model directory to translate with instead: MarianMT (opus-mt:
    /// config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm,
    /// vocab.json), or NLLB-200 / M2M100 / mBART-50 (with --source-lang and --target-lang).
    #[arg(long)]
    model: Option<PathBuf>,
    /// With an NLLB-200, M2M100 or mBART-50 --model: the language of the texts, as the family
    /// spells it (eng_Latn, en, en_XX; `attn inspect DIR` lists them).
    #[arg(long, requires = "model", value_name = "CODE")]
    source_lang: Option<String>,
    /// With an NLLB-200, M2M100 or mBART-50 --model: the language to translate into.
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
    /// With --model: the most padded source tokens (rows × longest row) in one batch. Lines
    /// are read ahead, sorted by length and batched within this budget.
    #[arg(long, requires = "model", value_name = "N", default_value_t = DEFAULT_MAX_BATCH_TOKENS)]
    max_batch_tokens: usize,
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

/// `attn translate --model DIR`: a Hugging Face directory, text to text, as the transformers
/// pipeline does it, through the bulk path ([`bulk`]): MarianMT, or a multilingual family
/// (NLLB-200, M2M100, mBART-50) with `--source-lang` / `--target-lang`.
fn run_model(args: &TranslateArgs, dir: &std::path::Path, heads: Heads) -> anyhow::Result<()> {
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
    if args.max_batch_tokens == 0 || args.window == 0 {
        anyhow::bail!("--max-batch-tokens and --window must be at least 1");
    }
    let device = args.device.device()?;
    let family = Family::of_dir(dir)?;
    if family == Family::Marian {
        if args.source_lang.is_some() || args.target_lang.is_some() {
            anyhow::bail!(
                "{} is a MarianMT directory, which translates one language pair: \
                 --source-lang and --target-lang are for NLLB-200, M2M100 and mBART-50",
                dir.display()
            )
        }
        let translator = MarianTranslator::from_dir_with(dir, args.precision.precision(), &device)
            .with_context(|| format!("loading the MarianMT model in {}", dir.display()))?;
        let generation =
            crate::generate::generation_config(dir, args.beam, args.max_new_tokens, None)?;
        let translator = translator.with_generation_config(n_best(args, generation)?);
        crate::generate::check_generation_limits(
            translator.model(),
            translator.generation_config(),
        )?;
        return run_bulk(args, heads, &translator, |text| {
            Ok(translator.cross_attention(text, args.layer)?)
        });
    }
    let (Some(src), Some(tgt)) = (&args.source_lang, &args.target_lang) else {
        anyhow::bail!(
            "{} is a {} directory: give the languages with --source-lang and --target-lang \
             (codes as the family spells them; `attn inspect {}` lists them)",
            dir.display(),
            family.name(),
            dir.display()
        )
    };
    let translator =
        MultilingualTranslator::from_dir_with(dir, src, tgt, args.precision.precision(), &device)
            .with_context(|| format!("loading the {} model in {}", family.name(), dir.display()))?;
    let generation = crate::generate::with_overrides(
        translator.generation_config().clone(),
        args.beam,
        args.max_new_tokens,
        None,
    )?;
    let translator = translator.with_generation_config(n_best(args, generation)?);
    crate::generate::check_generation_limits(translator.model(), translator.generation_config())?;
    run_bulk(args, heads, &translator, |text| {
        let ids = translator.encode(text)?;
        let hypothesis = translator
            .generate_encoded(std::slice::from_ref(&ids))?
            .swap_remove(0)?
            .swap_remove(0);
        Ok(translator.attention_map(&ids, &hypothesis, args.layer)?)
    })
}

/// `generation` returning `--n-best` sequences (checked against the beams).
fn n_best(
    args: &TranslateArgs,
    generation: candle_attention::GenerationConfig,
) -> anyhow::Result<candle_attention::GenerationConfig> {
    if args.n_best <= 1 {
        return Ok(generation);
    }
    let beams = generation.num_beams.unwrap_or(1);
    if args.n_best > beams {
        anyhow::bail!(
            "--n-best {} needs at least as many beams, got {beams} (--beam)",
            args.n_best
        );
    }
    Ok(generation.with_num_return_sequences(args.n_best))
}

/// The bulk path over `engine`: lines from the arguments, `--input` or standard input, results
/// to `--output` or standard output, a progress bar on a terminal, and the `--heatmap` of the
/// first text drawn from `heatmap`.
fn run_bulk<E: bulk::Engine + Sync>(
    args: &TranslateArgs,
    heads: Heads,
    engine: &E,
    heatmap: impl FnOnce(&str) -> anyhow::Result<AttentionMap>,
) -> anyhow::Result<()> {
    let options = bulk::Options {
        window: args.window,
        max_batch_tokens: args.max_batch_tokens,
        format: args.format,
        n_best: args.n_best,
        alignments: args.alignments,
    };
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
    // On rayon's pool, as `attn generate` (see `on_rayon_pool`).
    let summary = crate::pool::on_rayon_pool(|| {
        bulk::translate(
            engine,
            input,
            output,
            &options,
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
    })?;
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

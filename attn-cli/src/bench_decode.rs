//! `attn bench decode`: autoregressive decoding with the KV cache against recomputing the
//! whole prefix at every step, on a randomly initialised Seq2Seq model.

use anyhow::Result;
use attn_cli::number_translator::{Seq2Seq, Seq2SeqConfig};
use candle::{DType, Tensor, D};
use candle_attention::transformer::TransformerConfig;
use candle_nn::{VarBuilder, VarMap};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct DecodeBenchArgs {
    /// Numbers of tokens to generate, comma separated: one measurement (result line) each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "32,128,512",
        value_name = "N,..."
    )]
    lengths: Vec<usize>,
    /// Model size d_model of the random model.
    #[arg(long, default_value_t = 256, value_name = "E")]
    d_model: usize,
    /// Attention heads per block (d_model must be divisible by it).
    #[arg(long, default_value_t = 8, value_name = "H")]
    heads: usize,
    /// Encoder layers, and as many decoder layers.
    #[arg(long, default_value_t = 3, value_name = "N")]
    layers: usize,
    /// Inner size of each feed-forward block.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    dim_feedforward: usize,
    /// Vocabulary size (source and target, shared), in tokens.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    vocab: usize,
    /// Source length, in tokens (random ids).
    #[arg(long, default_value_t = 32, value_name = "N")]
    src_len: usize,
    /// Sequences decoded together (batch size).
    #[arg(long, default_value_t = 1, value_name = "B")]
    batch: usize,
    /// Time the recomputing baseline only up to this many generated tokens (its cost grows
    /// with the square of the length); longer lengths report the KV cache alone.
    #[arg(long, default_value_t = 512, value_name = "N")]
    max_recompute: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Where to compute: cpu, or cuda / metal in a build with that cargo feature.
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
}

/// Timings of one decoding run.
struct Run {
    total_s: f64,
    /// Mean step time over the first and the last tenth of the steps.
    first_steps_ms: f64,
    last_steps_ms: f64,
}

pub fn run(args: &DecodeBenchArgs) -> Result<()> {
    let device = args.device.device()?;
    let cfg = Seq2SeqConfig {
        transformer: TransformerConfig {
            num_encoder_layers: args.layers,
            num_decoder_layers: args.layers,
            dim_feedforward: args.dim_feedforward,
            dropout: 0.0,
            ..TransformerConfig::new(args.d_model, args.heads)
        },
        src_vocab_size: args.vocab,
        tgt_vocab_size: args.vocab,
        share_embeddings: true,
        tie_output: true,
        pad_id: 0,
        bos_id: 1,
        eos_id: 2,
    };
    let varmap = VarMap::new();
    let model = Seq2Seq::new(cfg, VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    let src = Tensor::rand(3f32, args.vocab as f32, (args.batch, args.src_len), &device)?
        .to_dtype(DType::U32)?;
    if !args.json {
        println!(
            "decode bench: d_model {} heads {} layers {}+{} ffn {} vocab {} src_len {} batch {}",
            args.d_model,
            args.heads,
            args.layers,
            args.layers,
            args.dim_feedforward,
            args.vocab,
            args.src_len,
            args.batch
        );
        println!(
            "{:>7} {:>10} {:>12} {:>14} {:>14} {:>9}",
            "tokens", "mode", "tokens/s", "first steps ms", "last steps ms", "speedup"
        );
    }
    for &n in &args.lengths {
        let cached = decode(&model, &src, n, true)?;
        let recomputed = (n <= args.max_recompute)
            .then(|| decode(&model, &src, n, false))
            .transpose()?;
        let tokens = (n * args.batch) as f64;
        for (mode, run) in [
            ("cached", Some(&cached)),
            ("recompute", recomputed.as_ref()),
        ] {
            let Some(run) = run else { continue };
            let speedup = recomputed.as_ref().map(|r| r.total_s / cached.total_s);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "bench": "decode", "mode": mode, "tokens": n, "batch": args.batch,
                        "tokens_per_s": tokens / run.total_s, "total_ms": run.total_s * 1e3,
                        "first_steps_ms": run.first_steps_ms, "last_steps_ms": run.last_steps_ms,
                        "d_model": args.d_model, "heads": args.heads, "layers": args.layers,
                    })
                );
            } else {
                let speedup = if mode == "cached" {
                    speedup.map_or("-".into(), |s| format!("{s:.1}x"))
                } else {
                    String::new()
                };
                println!(
                    "{:>7} {:>10} {:>12.1} {:>14.3} {:>14.3} {:>9}",
                    n,
                    mode,
                    tokens / run.total_s,
                    run.first_steps_ms,
                    run.last_steps_ms,
                    speedup
                );
            }
        }
    }
    Ok(())
}

/// Generates `n` tokens greedily (EOS ignored, so every run has the same length), with the
/// cache or by re-running the decoder over the whole prefix at each step.
fn decode(model: &Seq2Seq, src: &Tensor, n: usize, cached: bool) -> Result<Run> {
    let batch = src.dim(0)?;
    let bos = Tensor::full(model.config().bos_id, (batch, 1), src.device())?;
    let mut step_ms = Vec::with_capacity(n);
    let start = Instant::now();
    if cached {
        let mut state = model.start(src)?;
        let mut tokens = bos;
        for _ in 0..n {
            let t = Instant::now();
            let logits = model.step(&mut state, &tokens)?;
            tokens = logits.argmax(D::Minus1)?.to_dtype(DType::U32)?;
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    } else {
        // The encoder runs once in both modes; only the decoder work differs.
        let (memory, src_padding) = model.encode(src, false)?;
        let mut prefix = bos;
        for _ in 0..n {
            let t = Instant::now();
            let logits = model.decode(&memory, &src_padding, &prefix, false)?;
            let last = logits.narrow(1, prefix.dim(1)? - 1, 1)?;
            let next = last.argmax(D::Minus1)?.to_dtype(DType::U32)?;
            prefix = Tensor::cat(&[&prefix, &next], 1)?;
            step_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let total_s = start.elapsed().as_secs_f64();
    let tenth = (n / 10).max(1);
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    Ok(Run {
        total_s,
        first_steps_ms: mean(&step_ms[..tenth]),
        last_steps_ms: mean(&step_ms[n - tenth..]),
    })
}

//! `attn train`: trains the shipped English → German number translator.

use anyhow::Context;
use attn_cli::number_translator::train::{train, TrainConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// The shipped configuration: the defaults of the options.
fn shipped() -> TrainConfig {
    TrainConfig::default()
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Output directory (created if missing): checkpoints while training, resumed from when
    /// present, then the model (model.safetensors, config.json, vocab.en.json, vocab.de.json)
    /// for `attn translate --weights DIR`.
    #[arg(long, default_value = "runs/translate", value_name = "DIR")]
    out: PathBuf,
    /// Optimiser steps in all (a resumed run continues up to this many).
    #[arg(long, default_value_t = shipped().steps, value_name = "N")]
    steps: usize,
    /// Batch size, in source + target tokens (padding included).
    #[arg(long, default_value_t = shipped().batch_tokens, value_name = "N")]
    batch_tokens: usize,
    /// Warm-up steps of the learning-rate schedule (the rate grows linearly, then decays as
    /// 1/sqrt(step)).
    #[arg(long, default_value_t = shipped().warmup, value_name = "N")]
    warmup: usize,
    /// Multiplier of the paper's learning rate d_model^-0.5 · min(step^-0.5,
    /// step · warmup^-1.5).
    #[arg(long, default_value_t = shipped().lr_scale, value_name = "X")]
    lr_scale: f64,
    /// Model size d_model.
    #[arg(long, default_value_t = shipped().d_model, value_name = "E")]
    d_model: usize,
    /// Attention heads per block (d_model must be divisible by it).
    #[arg(long, default_value_t = shipped().heads, value_name = "H")]
    heads: usize,
    /// Encoder layers, and as many decoder layers.
    #[arg(long, default_value_t = shipped().layers, value_name = "N")]
    layers: usize,
    /// Inner size of each feed-forward block.
    #[arg(long, default_value_t = shipped().dim_feedforward, value_name = "N")]
    dim_feedforward: usize,
    /// Dropout probability, 0 to 1 (0 keeps the run reproducible).
    #[arg(long, default_value_t = shipped().dropout, value_name = "P")]
    dropout: f32,
    /// Label smoothing of the loss, 0 to 1.
    #[arg(long, default_value_t = shipped().label_smoothing, value_name = "EPS")]
    label_smoothing: f64,
    /// Seed of the initial weights and of the batch order.
    #[arg(long, default_value_t = shipped().seed)]
    seed: u64,
    /// Evaluate on held-out numbers every N steps (greedy exact match, printed); 0: never.
    #[arg(long, default_value_t = shipped().eval_every, value_name = "N")]
    eval_every: usize,
    /// Held-out numbers per evaluation.
    #[arg(long, default_value_t = shipped().eval_samples, value_name = "N")]
    eval_samples: usize,
    /// Write a checkpoint into --out every N steps.
    #[arg(long, default_value_t = shipped().checkpoint_every, value_name = "N")]
    checkpoint_every: usize,
    /// Write the average of the weights of the last N checkpoints as the model (1: the final
    /// weights).
    #[arg(long, default_value_t = shipped().average_last, value_name = "N")]
    average_last: usize,
    /// Train on this many numbers only; 0: the whole training split.
    #[arg(long, default_value_t = shipped().max_examples, value_name = "N")]
    max_examples: usize,
    /// Repeats per epoch of each number below 1,000 (and a tenth as many of each below
    /// 10,000), so the few short numbers are learnt too.
    #[arg(long, default_value_t = shipped().oversample_small, value_name = "N")]
    oversample_small: usize,
    /// Where to compute: cpu, or cuda / metal in a build with that cargo feature.
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
}

impl TrainArgs {
    /// The configuration the options give.
    fn config(&self) -> TrainConfig {
        TrainConfig {
            d_model: self.d_model,
            heads: self.heads,
            layers: self.layers,
            dim_feedforward: self.dim_feedforward,
            dropout: self.dropout,
            batch_tokens: self.batch_tokens,
            steps: self.steps,
            warmup: self.warmup,
            lr_scale: self.lr_scale,
            label_smoothing: self.label_smoothing,
            seed: self.seed,
            eval_every: self.eval_every,
            eval_samples: self.eval_samples,
            checkpoint_every: self.checkpoint_every,
            average_last: self.average_last,
            max_examples: self.max_examples,
            oversample_small: self.oversample_small,
        }
    }
}

pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let cfg = args.config();
    let device = args.device.device()?;
    eprintln!(
        "training into {} with {}",
        args.out.display(),
        serde_json::to_string(&cfg)?
    );
    let bar = ProgressBar::new(cfg.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    let mut smoothed: Option<f64> = None;
    let started = std::time::Instant::now();
    let out = train(
        &cfg,
        &args.out,
        &device,
        |s| {
            let loss = smoothed.map_or(s.loss as f64, |l| 0.95 * l + 0.05 * s.loss as f64);
            smoothed = Some(loss);
            bar.set_position(s.step as u64);
            let msg = format!("loss {loss:.3} lr {:.2e} {:.0} tok/s", s.lr, s.tokens_per_s);
            // Without a terminal the bar is hidden: log a line now and then instead.
            if bar.is_hidden() && (s.step % 25 == 0 || s.step == 1) {
                eprintln!(
                    "step {:>6}/{}: {msg}, {:.0} s",
                    s.step,
                    cfg.steps,
                    started.elapsed().as_secs_f64()
                );
            }
            bar.set_message(msg);
        },
        |e| {
            let line = format!(
                "step {:>6}: held-out exact match {:.2}% ({} numbers, greedy), {:.0} s",
                e.step,
                100.0 * e.exact_match,
                e.samples,
                started.elapsed().as_secs_f64()
            );
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        },
    )
    .with_context(|| format!("training into {}", args.out.display()))?;
    bar.finish();
    eprintln!(
        "done in {:.0} s; model written to {} (attn translate --weights {} ...)",
        started.elapsed().as_secs_f64(),
        out.display(),
        out.display()
    );
    Ok(())
}

//! `attn train`: trains the shipped English → German number translator.

use anyhow::Context;
use attn_cli::number_translator::train::{train, TrainConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Output directory: checkpoints while training (resumed if present), then the model
    /// (model.safetensors, config.json, vocab.en.json, vocab.de.json).
    #[arg(long, default_value = "runs/translate")]
    out: PathBuf,
    /// Optimiser steps.
    #[arg(long)]
    steps: Option<usize>,
    /// Source + target tokens per batch.
    #[arg(long)]
    batch_tokens: Option<usize>,
    /// Warm-up steps of the learning-rate schedule.
    #[arg(long)]
    warmup: Option<usize>,
    /// Multiplier of the paper's learning-rate schedule.
    #[arg(long)]
    lr_scale: Option<f64>,
    /// Model size.
    #[arg(long)]
    d_model: Option<usize>,
    /// Attention heads.
    #[arg(long)]
    heads: Option<usize>,
    /// Encoder and decoder layers (each).
    #[arg(long)]
    layers: Option<usize>,
    /// Feed-forward inner size.
    #[arg(long)]
    dim_feedforward: Option<usize>,
    /// Dropout (0 keeps the run reproducible).
    #[arg(long)]
    dropout: Option<f32>,
    /// Label smoothing.
    #[arg(long)]
    label_smoothing: Option<f64>,
    /// Seed of the weights and the batch order.
    #[arg(long)]
    seed: Option<u64>,
    /// Evaluate on held-out numbers every N steps (0: never).
    #[arg(long)]
    eval_every: Option<usize>,
    /// Held-out numbers per evaluation.
    #[arg(long)]
    eval_samples: Option<usize>,
    /// Checkpoint every N steps.
    #[arg(long)]
    checkpoint_every: Option<usize>,
    /// Write the average of the weights at the last N checkpoints as the model (1: the final
    /// weights).
    #[arg(long)]
    average_last: Option<usize>,
    /// Train on this many numbers only (0: all).
    #[arg(long)]
    max_examples: Option<usize>,
    /// Repeats per epoch of each number below 1,000 (a tenth of it below 10,000).
    #[arg(long)]
    oversample_small: Option<usize>,
    /// Where to compute: cpu, cuda or metal (the GPU ones need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
}

impl TrainArgs {
    /// The shipped configuration with the given overrides.
    fn config(&self) -> TrainConfig {
        let d = TrainConfig::default();
        TrainConfig {
            d_model: self.d_model.unwrap_or(d.d_model),
            heads: self.heads.unwrap_or(d.heads),
            layers: self.layers.unwrap_or(d.layers),
            dim_feedforward: self.dim_feedforward.unwrap_or(d.dim_feedforward),
            dropout: self.dropout.unwrap_or(d.dropout),
            batch_tokens: self.batch_tokens.unwrap_or(d.batch_tokens),
            steps: self.steps.unwrap_or(d.steps),
            warmup: self.warmup.unwrap_or(d.warmup),
            lr_scale: self.lr_scale.unwrap_or(d.lr_scale),
            label_smoothing: self.label_smoothing.unwrap_or(d.label_smoothing),
            seed: self.seed.unwrap_or(d.seed),
            eval_every: self.eval_every.unwrap_or(d.eval_every),
            eval_samples: self.eval_samples.unwrap_or(d.eval_samples),
            checkpoint_every: self.checkpoint_every.unwrap_or(d.checkpoint_every),
            average_last: self.average_last.unwrap_or(d.average_last),
            max_examples: self.max_examples.unwrap_or(d.max_examples),
            oversample_small: self.oversample_small.unwrap_or(d.oversample_small),
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

//! Training the translation [`Seq2Seq`] with candle's autograd (paper section 5): Adam with
//! `β = (0.9, 0.98)`, `ε = 1e-9` and the warm-up schedule
//! `lr = scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)`, label smoothing, batches
//! of similar lengths under a token budget, periodic greedy evaluation on the held-out numbers,
//! safetensors checkpoints, exact resumption, and the paper's checkpoint averaging (section
//! 6.1: the model written is the mean of the weights at the last 5 checkpoints).
//!
//! Reproducibility: weights are initialised from the seed (xavier-uniform matrices, `N(0,
//! d_model^-0.5)` embeddings, unit norms, zero biases) and batches are drawn from the seed, so
//! two runs with the same config give the same model. candle cannot seed its CPU random
//! generator, so a config with `dropout > 0` is not bit-reproducible; the shipped model uses
//! dropout 0 (the data has a million distinct pairs, so it does not over-fit).

use super::model::{Seq2Seq, Seq2SeqConfig};
use super::numbers::{german, numbers, Split};
use super::tokenizer::{EnglishTokenizer, GermanTokenizer, BOS, EOS, PAD};
use candle::{DType, Device, Tensor, Var, D};
use candle_attention::transformer::TransformerConfig;
use candle_attention::TensorFile;
use candle_nn::{VarBuilder, VarMap};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Everything that determines a training run. Saved as `train.json` in the output directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Model size.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Encoder layers and decoder layers (each).
    pub layers: usize,
    /// Feed-forward inner size.
    pub dim_feedforward: usize,
    /// Dropout (0 keeps runs reproducible; see the module docs).
    pub dropout: f32,
    /// Source plus target tokens per batch (padding included).
    pub batch_tokens: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Warm-up steps of the learning-rate schedule.
    pub warmup: usize,
    /// Multiplier of the paper's learning-rate schedule.
    pub lr_scale: f64,
    /// Label smoothing `ε` (0.1 in the paper).
    pub label_smoothing: f64,
    /// Seed of the initial weights and of the batch order.
    pub seed: u64,
    /// Evaluate on held-out numbers every this many steps (0: never).
    pub eval_every: usize,
    /// Held-out numbers used by each evaluation.
    pub eval_samples: usize,
    /// Write a checkpoint every this many steps (0: only at the end).
    pub checkpoint_every: usize,
    /// The model written at the end is the average of the weights at this many checkpoints:
    /// the final step and every `checkpoint_every` steps before it (section 6.1 of the paper
    /// averages the last 5). 1 (or `checkpoint_every` 0): the final weights alone. Averaging
    /// smooths out where on its last oscillation the optimiser happens to stop.
    #[serde(default = "one")]
    pub average_last: usize,
    /// Train on this many numbers, spread evenly over the training split (0: all of them);
    /// for quick runs and tests.
    pub max_examples: usize,
    /// How many times each training number below 1,000 appears per epoch; numbers below
    /// 10,000 appear a tenth as often (at least once), the rest once. Short numbers are 0.1%
    /// of `0..=999_999` but what people type most, and a model that has seen too few short
    /// targets does not learn to stop after one or two words ("seven" came out as
    /// "siebensiebensieben..." without it). 1: no oversampling.
    #[serde(default = "one")]
    pub oversample_small: usize,
}

impl Default for TrainConfig {
    /// The configuration of the shipped model.
    fn default() -> Self {
        Self {
            d_model: 128,
            heads: 8,
            layers: 2,
            dim_feedforward: 512,
            dropout: 0.0,
            batch_tokens: 6000,
            steps: 2400,
            warmup: 600,
            lr_scale: 0.3,
            label_smoothing: 0.1,
            seed: 1234,
            eval_every: 200,
            eval_samples: 1000,
            checkpoint_every: 200,
            average_last: 5,
            max_examples: 0,
            oversample_small: 40,
        }
    }
}

impl TrainConfig {
    /// The model this configuration trains, for the given vocabulary sizes.
    pub fn model_config(&self, src_vocab: usize, tgt_vocab: usize) -> Seq2SeqConfig {
        Seq2SeqConfig {
            transformer: TransformerConfig {
                num_encoder_layers: self.layers,
                num_decoder_layers: self.layers,
                dim_feedforward: self.dim_feedforward,
                dropout: self.dropout,
                ..TransformerConfig::new(self.d_model, self.heads)
            },
            src_vocab_size: src_vocab,
            tgt_vocab_size: tgt_vocab,
            share_embeddings: false,
            tie_output: true,
            pad_id: PAD,
            bos_id: BOS,
            eos_id: EOS,
        }
    }

    /// The learning rate at `step` (1-based).
    pub fn learning_rate(&self, step: usize) -> f64 {
        let step = step.max(1) as f64;
        let warmup = self.warmup.max(1) as f64;
        self.lr_scale
            * (self.d_model as f64).powf(-0.5)
            * step.powf(-0.5).min(step * warmup.powf(-1.5))
    }

    /// True when a checkpoint written under `self` can continue as `other`: everything that
    /// shapes the model, the data and the optimisation is equal; only the step count, the
    /// evaluation and checkpoint intervals and the averaging may differ (so a run can be
    /// extended).
    pub fn resumable_as(&self, other: &TrainConfig) -> bool {
        let normalise = |c: &TrainConfig| TrainConfig {
            steps: 0,
            eval_every: 0,
            eval_samples: 0,
            checkpoint_every: 0,
            average_last: 0,
            ..c.clone()
        };
        normalise(self) == normalise(other)
    }

    /// The steps whose weights the final model averages: the final step and every
    /// `checkpoint_every` steps before it, `average_last` in all (fewer if the run is short).
    pub fn averaged_steps(&self) -> Vec<usize> {
        if self.checkpoint_every == 0 || self.average_last <= 1 {
            return vec![self.steps];
        }
        let mut steps: Vec<usize> = (0..self.average_last)
            .map(|i| i * self.checkpoint_every)
            .take_while(|&back| back < self.steps)
            .map(|back| self.steps - back)
            .collect();
        steps.reverse();
        steps
    }

    fn validate(&self) -> candle::Result<()> {
        if self.steps == 0 || self.batch_tokens < 64 {
            candle::bail!(
                "steps must be > 0 and batch_tokens >= 64 (got {} and {})",
                self.steps,
                self.batch_tokens
            )
        }
        if !(0.0..1.0).contains(&self.label_smoothing) {
            candle::bail!(
                "label_smoothing must be in [0, 1), got {}",
                self.label_smoothing
            )
        }
        Ok(())
    }
}

fn one() -> usize {
    1
}

/// A small, seedable generator (SplitMix64): batch order and initial weights.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_f64() * n as f64) as usize % n.max(1)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// One training pair: source ids and target ids, without BOS/EOS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// English token ids.
    pub src: Vec<u32>,
    /// German token ids.
    pub tgt: Vec<u32>,
}

/// The tokenised training numbers (`Split::Train`); with `limit > 0`, that many spread evenly
/// over the split. Each number below 1,000 is repeated `oversample_small` times and each
/// below 10,000 `oversample_small / 10` times (see [`TrainConfig::oversample_small`]).
pub fn training_examples(
    en: &EnglishTokenizer,
    de: &GermanTokenizer,
    limit: usize,
    oversample_small: usize,
) -> candle::Result<Vec<Example>> {
    let all: Vec<u32> = numbers(Split::Train).collect();
    let stride = all.len().checked_div(limit).unwrap_or(1).max(1);
    let repeats = |n: u32| match n {
        0..=999 => oversample_small.max(1),
        1_000..=9_999 => (oversample_small / 10).max(1),
        _ => 1,
    };
    let mut examples = Vec::with_capacity(all.len());
    for &n in all
        .iter()
        .step_by(stride)
        .take(if limit == 0 { usize::MAX } else { limit })
    {
        let example = Example {
            src: en.encode_number(n)?,
            tgt: de.encode_number(n)?,
        };
        for _ in 1..repeats(n) {
            examples.push(example.clone());
        }
        examples.push(example);
    }
    Ok(examples)
}

/// Groups example indices into batches of similar lengths whose padded size (source plus
/// target with BOS/EOS) stays under `batch_tokens`, in an order drawn from `rng`: shuffle,
/// sort pools of 100 batches' worth by length, cut, shuffle the batches.
pub fn length_batches(
    examples: &[Example],
    batch_tokens: usize,
    rng: &mut SplitMix64,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..examples.len()).collect();
    rng.shuffle(&mut order);
    let len = |i: usize| (examples[i].src.len(), examples[i].tgt.len() + 1);
    let mean = examples
        .iter()
        .map(|e| e.src.len() + e.tgt.len() + 1)
        .sum::<usize>()
        / examples.len().max(1);
    let pool = (100 * batch_tokens / mean.max(1)).max(1);
    let mut batches = Vec::new();
    for chunk in order.chunks_mut(pool) {
        chunk.sort_by_key(|&i| len(i));
        let mut batch: Vec<usize> = Vec::new();
        let (mut max_src, mut max_tgt) = (0, 0);
        for &i in chunk.iter() {
            let (s, t) = len(i);
            let (ns, nt) = (max_src.max(s), max_tgt.max(t));
            if !batch.is_empty() && (batch.len() + 1) * (ns + nt) > batch_tokens {
                batches.push(std::mem::take(&mut batch));
                (max_src, max_tgt) = (s, t);
            } else {
                (max_src, max_tgt) = (ns, nt);
            }
            batch.push(i);
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
    }
    rng.shuffle(&mut batches);
    batches
}

/// Right-padded tensors of one batch: source `(B, S)`, decoder input `BOS y` and target
/// `y EOS`, both `(B, T + 1)`.
pub fn batch_tensors(
    examples: &[Example],
    batch: &[usize],
    device: &Device,
) -> candle::Result<(Tensor, Tensor, Tensor)> {
    let s = batch
        .iter()
        .map(|&i| examples[i].src.len())
        .max()
        .unwrap_or(0);
    let t = batch
        .iter()
        .map(|&i| examples[i].tgt.len())
        .max()
        .unwrap_or(0)
        + 1;
    let (mut src, mut tgt_in, mut tgt_out) = (Vec::new(), Vec::new(), Vec::new());
    for &i in batch {
        let e = &examples[i];
        src.extend(e.src.iter().copied().chain(std::iter::repeat(PAD)).take(s));
        tgt_in.extend(
            std::iter::once(BOS)
                .chain(e.tgt.iter().copied())
                .chain(std::iter::repeat(PAD))
                .take(t),
        );
        tgt_out.extend(
            e.tgt
                .iter()
                .copied()
                .chain(std::iter::once(EOS))
                .chain(std::iter::repeat(PAD))
                .take(t),
        );
    }
    let b = batch.len();
    Ok((
        Tensor::from_vec(src, (b, s), device)?,
        Tensor::from_vec(tgt_in, (b, t), device)?,
        Tensor::from_vec(tgt_out, (b, t), device)?,
    ))
}

/// Label-smoothed cross-entropy over non-padding targets: `logits` `(B, T, V)`, `targets`
/// `(B, T)` `U32`. Returns the mean loss (a scalar with gradient) and the number of target
/// tokens. With `ε`, the target distribution is `(1 - ε)·onehot + ε/V`.
pub fn label_smoothed_loss(
    logits: &Tensor,
    targets: &Tensor,
    pad: u32,
    epsilon: f64,
) -> candle::Result<(Tensor, usize)> {
    let v = logits.dim(D::Minus1)?;
    let log_probs = candle_nn::ops::log_softmax(&logits.reshape(((), v))?, D::Minus1)?;
    let targets = targets.flatten_all()?;
    let nll = log_probs
        .gather(&targets.unsqueeze(1)?, 1)?
        .squeeze(1)?
        .neg()?;
    let smooth = log_probs.mean(1)?.neg()?;
    let per_token = ((nll * (1.0 - epsilon))? + (smooth * epsilon)?)?;
    let keep = targets.ne(pad)?.to_dtype(DType::F32)?;
    let count = keep.sum_all()?.to_scalar::<f32>()? as usize;
    let loss = (per_token * &keep)?
        .sum_all()?
        .affine(1.0 / count.max(1) as f64, 0.0)?;
    Ok((loss, count))
}

/// Adam (Kingma & Ba) with bias correction, whose moments can be saved and restored.
pub struct Adam {
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: usize,
    beta1: f64,
    beta2: f64,
    eps: f64,
}

impl Adam {
    /// The paper's Adam (`β1 = 0.9`, `β2 = 0.98`, `ε = 1e-9`) over every variable of `varmap`.
    pub fn new(varmap: &VarMap) -> candle::Result<Self> {
        let mut vars: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .map_err(|_| candle::Error::Msg("varmap lock poisoned".into()))?
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        Ok(Self {
            m: vars
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<candle::Result<_>>()?,
            v: vars
                .iter()
                .map(|(_, v)| zeros(v))
                .collect::<candle::Result<_>>()?,
            vars,
            step: 0,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-9,
        })
    }

    /// One update with learning rate `lr` from the gradients of a loss.
    pub fn step(&mut self, grads: &candle::backprop::GradStore, lr: f64) -> candle::Result<()> {
        self.step += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let correction1 = 1.0 - b1.powi(self.step as i32);
        let correction2 = 1.0 - b2.powi(self.step as i32);
        for (i, (_, var)) in self.vars.iter().enumerate() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            self.m[i] = ((&self.m[i] * b1)? + (g * (1.0 - b1))?)?;
            self.v[i] = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let m_hat = (&self.m[i] / correction1)?;
            let v_hat = (&self.v[i] / correction2)?;
            let update = (m_hat / (v_hat.sqrt()? + self.eps)?)?;
            var.set(&(var.as_tensor() - (update * lr)?)?)?;
        }
        Ok(())
    }

    /// Saves the moments (`m.NAME`, `v.NAME`) to a safetensors file.
    pub fn save(&self, path: &Path) -> candle::Result<()> {
        let mut map = HashMap::new();
        for (i, (name, _)) in self.vars.iter().enumerate() {
            map.insert(format!("m.{name}"), self.m[i].clone());
            map.insert(format!("v.{name}"), self.v[i].clone());
        }
        candle::safetensors::save(&map, path)
    }

    /// Restores moments saved by [`Adam::save`] after `step` updates.
    pub fn load(&mut self, path: &Path, step: usize) -> candle::Result<()> {
        let file = TensorFile::open(path)?;
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let device = var.device();
            self.m[i] = file.load_as(&format!("m.{name}"), DType::F32, device)?;
            self.v[i] = file.load_as(&format!("v.{name}"), DType::F32, device)?;
        }
        self.step = step;
        Ok(())
    }
}

/// Re-initialises every variable from `seed` (sorted by name, so the result depends on the
/// seed only): norms' weights 1, biases 0, embeddings `N(0, d^-0.5)`, other matrices
/// xavier-uniform.
pub fn seeded_init(varmap: &VarMap, seed: u64) -> candle::Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| candle::Error::Msg("varmap lock poisoned".into()))?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut rng = SplitMix64::new(seed);
    for name in names {
        let var = &data[name];
        let dims = var.dims().to_vec();
        let n: usize = dims.iter().product();
        let values: Vec<f32> = if name.contains("norm") && name.ends_with(".weight") {
            vec![1.0; n]
        } else if dims.len() == 1 {
            vec![0.0; n]
        } else if name.contains("embed") {
            let std = (dims[1] as f64).powf(-0.5);
            (0..n).map(|_| (rng.normal() * std) as f32).collect()
        } else {
            let bound = (6.0 / (dims[0] + dims[1]) as f64).sqrt();
            (0..n)
                .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                .collect()
        };
        var.set(&Tensor::from_vec(values, dims.as_slice(), var.device())?)?;
    }
    Ok(())
}

/// Where training stands; saved as `state.json` with every checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimiser steps done.
    pub step: usize,
    /// Passes over the data started.
    pub epoch: usize,
    /// Batches of the current epoch done.
    pub batch_in_epoch: usize,
}

/// What the training loop reports after every step.
#[derive(Clone, Debug)]
pub struct StepReport {
    /// Steps done.
    pub step: usize,
    /// Label-smoothed loss of this batch.
    pub loss: f32,
    /// Learning rate used.
    pub lr: f64,
    /// Source and target tokens per second over this step (padding excluded).
    pub tokens_per_s: f64,
}

/// An evaluation on held-out numbers.
#[derive(Clone, Debug)]
pub struct EvalReport {
    /// Steps done.
    pub step: usize,
    /// Fraction of held-out numbers translated exactly (greedy).
    pub exact_match: f64,
    /// Numbers evaluated.
    pub samples: usize,
}

/// The files of a trained model directory (what `weights/` ships).
pub struct ModelFiles;

impl ModelFiles {
    /// Weights.
    pub const WEIGHTS: &'static str = "model.safetensors";
    /// [`Seq2SeqConfig`] as JSON.
    pub const CONFIG: &'static str = "config.json";
    /// English vocabulary.
    pub const SRC_VOCAB: &'static str = "vocab.en.json";
    /// German vocabulary.
    pub const TGT_VOCAB: &'static str = "vocab.de.json";
}

/// Greedy exact match on the first `samples` held-out numbers (spread over the range).
pub fn evaluate(
    model: &Seq2Seq,
    en: &EnglishTokenizer,
    de: &GermanTokenizer,
    samples: usize,
    device: &Device,
) -> candle::Result<f64> {
    let held: Vec<u32> = numbers(Split::HeldOut).collect();
    let stride = (held.len() / samples.max(1)).max(1);
    let picked: Vec<u32> = held.iter().step_by(stride).take(samples).copied().collect();
    let mut correct = 0;
    for chunk in picked.chunks(256) {
        let examples: Vec<Example> = chunk
            .iter()
            .map(|&n| {
                Ok(Example {
                    src: en.encode_number(n)?,
                    tgt: Vec::new(),
                })
            })
            .collect::<candle::Result<_>>()?;
        let idx: Vec<usize> = (0..examples.len()).collect();
        let (src, _, _) = batch_tensors(&examples, &idx, device)?;
        let hyps = model.generate(&src, 40, 1, 1.0)?;
        for (&n, hyp) in chunk.iter().zip(&hyps) {
            if de.decode(hyp.generated()).ok().as_deref() == Some(german(n)?.as_str()) {
                correct += 1;
            }
        }
    }
    Ok(correct as f64 / picked.len().max(1) as f64)
}

/// Trains (or resumes, when `out_dir` holds a checkpoint of the same config) and writes the
/// model directory: weights, config, vocabularies. `on_step` and `on_eval` report progress.
pub fn train(
    cfg: &TrainConfig,
    out_dir: &Path,
    device: &Device,
    mut on_step: impl FnMut(&StepReport),
    mut on_eval: impl FnMut(&EvalReport),
) -> candle::Result<PathBuf> {
    cfg.validate()?;
    let io = |e: std::io::Error| candle::Error::Msg(format!("{}: {e}", out_dir.display()));
    std::fs::create_dir_all(out_dir).map_err(io)?;
    let en = EnglishTokenizer::build()?;
    let de = GermanTokenizer::build()?;
    let examples = training_examples(&en, &de, cfg.max_examples, cfg.oversample_small)?;
    let model_cfg = cfg.model_config(en.vocab().len(), de.vocab().len());
    let mut varmap = VarMap::new();
    let model = Seq2Seq::new(
        model_cfg.clone(),
        VarBuilder::from_varmap(&varmap, DType::F32, device),
    )?;
    seeded_init(&varmap, cfg.seed)?;
    let mut adam = Adam::new(&varmap)?;

    let train_json = out_dir.join("train.json");
    let state_json = out_dir.join("state.json");
    let mut state = TrainState::default();
    if state_json.exists() {
        let saved: TrainConfig = read_json(&train_json)?;
        if !saved.resumable_as(cfg) {
            candle::bail!(
                "{} holds a checkpoint of a different configuration ({}); use another directory or the same settings",
                out_dir.display(),
                train_json.display()
            )
        }
        state = read_json(&state_json)?;
        varmap.load(out_dir.join("checkpoint.safetensors"))?;
        adam.load(&out_dir.join("optimizer.safetensors"), state.step)?;
    }
    write_json(&train_json, cfg)?;

    let checkpoint = |state: &TrainState, adam: &Adam| -> candle::Result<()> {
        varmap.save(out_dir.join("checkpoint.safetensors"))?;
        adam.save(&out_dir.join("optimizer.safetensors"))?;
        write_json(&state_json, state)
    };
    // Weights of the averaged steps, kept on disk so that a resumed run averages the same.
    let averaged = cfg.averaged_steps();
    let average_dir = out_dir.join("average");
    if averaged.len() > 1 {
        std::fs::create_dir_all(&average_dir).map_err(io)?;
    }
    while state.step < cfg.steps {
        let mut rng = SplitMix64::new(
            cfg.seed ^ (state.epoch as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        let batches = length_batches(&examples, cfg.batch_tokens, &mut rng);
        for batch in batches.iter().skip(state.batch_in_epoch) {
            let started = Instant::now();
            let (src, tgt_in, tgt_out) = batch_tensors(&examples, batch, device)?;
            let logits = model.forward(&src, &tgt_in, true)?;
            let (loss, target_tokens) =
                label_smoothed_loss(&logits, &tgt_out, PAD, cfg.label_smoothing)?;
            let grads = loss.backward()?;
            let lr = cfg.learning_rate(state.step + 1);
            adam.step(&grads, lr)?;
            state.step += 1;
            state.batch_in_epoch += 1;
            let source_tokens: usize = batch.iter().map(|&i| examples[i].src.len()).sum();
            on_step(&StepReport {
                step: state.step,
                loss: loss.to_scalar::<f32>()?,
                lr,
                tokens_per_s: (source_tokens + target_tokens) as f64
                    / started.elapsed().as_secs_f64(),
            });
            if cfg.eval_every > 0 && state.step % cfg.eval_every == 0 {
                let exact_match = evaluate(&model, &en, &de, cfg.eval_samples, device)?;
                on_eval(&EvalReport {
                    step: state.step,
                    exact_match,
                    samples: cfg.eval_samples,
                });
            }
            if cfg.checkpoint_every > 0 && state.step % cfg.checkpoint_every == 0 {
                checkpoint(&state, &adam)?;
            }
            if averaged.len() > 1 && averaged.contains(&state.step) {
                varmap.save(average_dir.join(format!("step-{}.safetensors", state.step)))?;
            }
            if state.step >= cfg.steps {
                break;
            }
        }
        if state.step < cfg.steps {
            state.epoch += 1;
            state.batch_in_epoch = 0;
        }
    }
    checkpoint(&state, &adam)?;
    if averaged.len() > 1 {
        let files: Vec<PathBuf> = averaged
            .iter()
            .map(|s| average_dir.join(format!("step-{s}.safetensors")))
            .collect();
        average_weights(&files, &out_dir.join(ModelFiles::WEIGHTS))?;
    } else {
        varmap.save(out_dir.join(ModelFiles::WEIGHTS))?;
    }
    model_cfg.save(out_dir.join(ModelFiles::CONFIG))?;
    en.save(out_dir.join(ModelFiles::SRC_VOCAB))?;
    de.save(out_dir.join(ModelFiles::TGT_VOCAB))?;
    Ok(out_dir.to_path_buf())
}

/// Writes to `out` the element-wise mean of the weights in `files` (safetensors files with the
/// same tensor names and shapes), summed in `f32` in file order. Errors name the file that is
/// missing or disagrees.
pub fn average_weights(files: &[PathBuf], out: &Path) -> candle::Result<()> {
    let Some((first, rest)) = files.split_first() else {
        candle::bail!("no weight files to average")
    };
    let load = |p: &PathBuf| TensorFile::open(p);
    let first_file = load(first)?;
    let names: Vec<String> = first_file.names().iter().map(|n| n.to_string()).collect();
    let mut sums: Vec<Tensor> = names
        .iter()
        .map(|n| first_file.load_as(n, DType::F32, &Device::Cpu))
        .collect::<candle::Result<_>>()?;
    for path in rest {
        let file = load(path)?;
        if file.names().len() != names.len() {
            candle::bail!(
                "{} holds {} tensors but {} holds {}: not checkpoints of one model",
                path.display(),
                file.names().len(),
                first.display(),
                names.len()
            )
        }
        for (sum, name) in sums.iter_mut().zip(&names) {
            let t = file.load_as(name, DType::F32, &Device::Cpu)?;
            if t.dims() != sum.dims() {
                candle::bail!(
                    "'{name}' is {:?} in {} but {:?} in {}",
                    t.dims(),
                    path.display(),
                    sum.dims(),
                    first.display()
                )
            }
            *sum = (&*sum + t)?;
        }
    }
    let n = files.len() as f64;
    let mut tensors = HashMap::new();
    for (name, sum) in names.into_iter().zip(sums) {
        tensors.insert(name, (sum / n)?);
    }
    candle::safetensors::save(&tensors, out)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> candle::Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| candle::Error::Msg(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| candle::Error::Msg(format!("{} is not valid: {e}", path.display())))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> candle::Result<()> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| candle::Error::Msg(e.to_string()))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", path.display())))
}

//! Generation for encoder-decoder models, one engine for every model: greedy search and beam
//! search as `transformers`' `generate()` (version 5.24) does them, token for token, over any
//! model that implements [`StepDecoder`], configured by a [`GenerationConfig`] loaded the way
//! `transformers` loads `generation_config.json` / `config.json` (or built in code, as the
//! number translator of the `attn` command builds its rules).
//!
//! A model implements [`StepDecoder`]: it is fed one token per *row* (a hypothesis being
//! extended) and answers `(rows, vocab)` next-token log-probabilities;
//! [`StepDecoder::reorder`] rebuilds its per-row state (KV caches, encoder memory) when rows
//! are expanded to beams, reordered or dropped. Then [`generate`] (sequences, as
//! `generate()`'s output tensor holds them), [`generate_hypotheses`] (with their scores, as
//! `output_scores=True` gives them) and [`generate_padded`] drive it.
//!
//! What is reproduced, and how `transformers` counts:
//!
//! * Every sequence starts with `decoder_start_token_id`; `max_length` and `min_length` count
//!   it, `max_new_tokens` / `min_new_tokens` do not (`max_length = max_new_tokens + 1`). The
//!   default is 20 new tokens, capped by `max_position_embeddings`.
//! * Processors run in `transformers`' order on the model's log-probabilities: no-repeat
//!   n-gram, bad words (single- and multi-token; the prefix may include the start token),
//!   min length, forced BOS (first step), forced EOS (when the sequence has
//!   `max_length - 1` tokens), `renormalize_logits`.
//! * Greedy takes `torch.argmax` (the first maximum); a row that emitted EOS is padded with
//!   `pad_token_id` until every row is done. `transformers` decides on the processed *logits*
//!   and [`StepDecoder`] answers log-probabilities: the same argmax except for a rounding tie.
//! * Beam search: see the `beam` module's documentation for the exact bookkeeping (top
//!   `2 * num_beams` candidates, finished hypotheses scored `sum / generated_len^length_penalty`
//!   where `generated_len` excludes the start token and includes EOS, the `early_stopping`
//!   heuristics, `f32` arithmetic as torch does it).
//!
//! The searches work on the host in `f32`; the state is reordered only when rows change
//! (never with the identity), and finished rows (greedy) or settled batch items (beam search)
//! are dropped from it, so a batch of sentences of different lengths does no wasted work.
//!
//! ```
//! use candle::{Device, Result, Tensor};
//! use candle_attention::generation::{generate_padded, GenerationConfig, StepDecoder};
//!
//! /// A bigram model: the next token depends only on the token fed.
//! struct Bigram(Vec<Vec<f32>>);
//! impl StepDecoder for Bigram {
//!     type State = ();
//!     fn step(&self, _: &mut (), tokens: &[u32]) -> Result<Tensor> {
//!         let rows: Vec<Vec<f32>> = tokens.iter().map(|&t| self.0[t as usize].clone()).collect();
//!         Tensor::new(rows, &Device::Cpu)
//!     }
//!     fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
//!         Ok(())
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! // 0 = EOS, 1 = "a", 2 = decoder start and padding.
//! let model = Bigram(vec![
//!     vec![-0.1, -2.4, -9.0], // after EOS
//!     vec![-0.2, -1.7, -9.0], // after "a": EOS
//!     vec![-2.0, -0.2, -9.0], // after the start: "a"
//! ]);
//! let cfg = GenerationConfig::from_json_str(
//!     r#"{"decoder_start_token_id": 2, "eos_token_id": 0, "pad_token_id": 2, "bad_words_ids": [[2]]}"#,
//! )?;
//! let (ids, shape) = generate_padded(&model, (), 1, &cfg)?;
//! assert_eq!((ids, shape), (vec![2, 1, 0], (1, 3)));
//! let (ids, _) = generate_padded(&model, (), 1, &cfg.with_num_beams(2))?;
//! assert_eq!(ids, vec![2, 1, 0]);
//! # Ok(()) }
//! ```

mod beam;
mod config;
mod greedy;
mod hypothesis;
mod processors;
mod step;

pub use config::{EarlyStopping, GenerationConfig};
pub use hypothesis::Hypothesis;
pub use step::StepDecoder;
pub(crate) use step::StepStart;

use config::Resolved;

use candle::Result;

/// Generates like `transformers`' `model.generate(input_ids, attention_mask, ...)` with the
/// settings `cfg` (after [`GenerationConfig::from_model_dir`] and the per-call `with_*`
/// overrides): greedy search when `num_beams` is 1, beam search otherwise.
///
/// `state` holds `batch` rows, one per source sentence, with the encoder already run; the first
/// step feeds `decoder_start_token_id` to each. [`StepDecoder::step`] answers `(rows, vocab)`
/// next-token log-probabilities (`log_softmax` of the logits); [`StepDecoder::reorder`] is
/// called when rows are expanded to beams, reordered or dropped (never with the identity).
///
/// Returns `batch * num_return_sequences` sequences (item-major), each starting with the
/// decoder start token and ending with EOS (included) or at `max_length` tokens, *unpadded*:
/// [`pad_sequences`] with [`GenerationConfig::output_pad_token_id`] (or [`generate_padded`])
/// gives `generate()`'s `(B, T')` tensor exactly. `batch == 0` returns nothing without calling
/// the model.
pub fn generate<M: StepDecoder>(
    model: &M,
    state: M::State,
    batch: usize,
    cfg: &GenerationConfig,
) -> Result<Vec<Vec<u32>>> {
    Ok(generate_hypotheses(model, state, batch, cfg)?
        .into_iter()
        .flatten()
        .map(|h| h.tokens)
        .collect())
}

/// [`generate`] with the scores: for each of the `batch` items, its `num_return_sequences`
/// hypotheses, best first (beam search: by [`Hypothesis::score`], as `transformers` returns
/// them; greedy search: the one sequence).
pub fn generate_hypotheses<M: StepDecoder>(
    model: &M,
    mut state: M::State,
    batch: usize,
    cfg: &GenerationConfig,
) -> Result<Vec<Vec<Hypothesis>>> {
    // Search::new resolves the settings (an error even for an empty batch, which it then
    // hands back at once) and reserves the caches for lengths 1 .. max_length - 1.
    let mut search = Search::new(model, &mut state, batch, cfg)?;
    let mut out: Vec<Vec<Hypothesis>> = vec![Vec::new(); batch];
    while !search.is_done() {
        for (item, hypotheses) in search.step(model, &mut state)? {
            out[item] = hypotheses;
        }
    }
    Ok(out)
}

/// A search in progress over a batch of items, one decoding step at a time: what continuous
/// batching drives. Items are handed out at the step they end (greedy: EOS or `max_length`;
/// beam search: when their result can no longer change), and an item can be cancelled between
/// steps (its rows leave the state). Each item's result is exactly what [`generate_hypotheses`]
/// gives it: items of a batch are independent.
pub struct Search {
    cfg: Resolved,
    kind: SearchKind,
}

enum SearchKind {
    Greedy(greedy::Greedy),
    Beam(beam::Beam),
}

impl Search {
    /// Starts a search over the `batch` rows of `state` (the encoder already run, one row per
    /// item) with the settings `cfg`; reserves the state's caches for its longest sequence.
    pub fn new<M: StepDecoder>(
        model: &M,
        state: &mut M::State,
        batch: usize,
        cfg: &GenerationConfig,
    ) -> Result<Self> {
        let cfg = cfg.resolve()?;
        if batch > 0 {
            model.reserve(state, cfg.max_length.saturating_sub(1))?;
        }
        let kind = if cfg.num_beams == 1 {
            SearchKind::Greedy(greedy::Greedy::new(batch, &cfg))
        } else {
            SearchKind::Beam(beam::Beam::new(batch, &cfg))
        };
        Ok(Self { cfg, kind })
    }

    /// One decoding step: the items that ended with it, each with its hypotheses (best first,
    /// `num_return_sequences` of them).
    pub fn step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
    ) -> Result<Vec<(usize, Vec<Hypothesis>)>> {
        match self.begin_step(model, state)? {
            StepStart::Ended(items) => Ok(items),
            StepStart::Feed(tokens) => {
                let log_probs = model.step(state, &tokens)?;
                self.end_step(model, state, log_probs)
            }
        }
    }

    /// The first half of [`Search::step`], for a caller that steps the model of several
    /// searches at once: drops cancelled items from `state`, then returns the tokens to feed
    /// (one per state row), or the items handed out when the search ends without a step.
    pub(crate) fn begin_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
    ) -> Result<StepStart> {
        match &mut self.kind {
            SearchKind::Greedy(g) => g.begin_step(model, state, &self.cfg),
            SearchKind::Beam(b) => b.begin_step(model, state, &self.cfg),
        }
    }

    /// The second half of [`Search::step`]: the model's answer `log_probs` `(rows, vocab)` to
    /// the tokens [`Search::begin_step`] returned; the items that ended with the step.
    pub(crate) fn end_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        log_probs: candle::Tensor,
    ) -> Result<Vec<(usize, Vec<Hypothesis>)>> {
        match &mut self.kind {
            SearchKind::Greedy(g) => g.end_step(model, state, log_probs, &self.cfg),
            SearchKind::Beam(b) => b.end_step(model, state, log_probs, &self.cfg),
        }
    }

    /// Drops `item` before the next step; it is never handed out, and the others' results do
    /// not change.
    pub fn cancel(&mut self, item: usize) {
        match &mut self.kind {
            SearchKind::Greedy(g) => g.cancel(item),
            SearchKind::Beam(b) => b.cancel(item),
        }
    }

    /// Whether every item has been handed out or cancelled.
    pub fn is_done(&self) -> bool {
        match &self.kind {
            SearchKind::Greedy(g) => g.is_done(),
            SearchKind::Beam(b) => b.is_done(),
        }
    }

    /// The decoder rows the state holds now (items × beams still running).
    pub fn rows(&self) -> usize {
        match &self.kind {
            SearchKind::Greedy(g) => g.rows(),
            SearchKind::Beam(b) => b.rows(),
        }
    }
}

/// [`generate`] followed by [`pad_sequences`] with the padding `generate()` uses: returns the
/// `(rows, cols)` row-major ids of `generate()`'s output tensor and its shape.
pub fn generate_padded<M: StepDecoder>(
    model: &M,
    state: M::State,
    batch: usize,
    cfg: &GenerationConfig,
) -> Result<(Vec<u32>, (usize, usize))> {
    let seqs = generate(model, state, batch, cfg)?;
    let longest = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let pad = match cfg.output_pad_token_id() {
        Some(pad) => pad,
        None if seqs.iter().all(|s| s.len() == longest) => 0,
        None => candle::bail!(
            "generate: sequences of different lengths need pad_token_id or eos_token_id to pad with"
        ),
    };
    Ok(pad_sequences(&seqs, pad))
}

/// Pads `seqs` on the right with `pad_id` to the longest one: returns the row-major ids and
/// the shape `(seqs.len(), longest)`, ready for `Tensor::from_vec(ids, shape, device)`.
pub fn pad_sequences(seqs: &[Vec<u32>], pad_id: u32) -> (Vec<u32>, (usize, usize)) {
    let cols = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * cols);
    for s in seqs {
        ids.extend_from_slice(s);
        ids.extend(std::iter::repeat_n(pad_id, cols - s.len()));
    }
    (ids, (seqs.len(), cols))
}

#[cfg(test)]
mod tests;

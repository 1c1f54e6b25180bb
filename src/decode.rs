//! Greedy and beam search over a model decoded one token at a time.
//!
//! A model implements [`StepDecoder`]: it is fed one token per *row* (a hypothesis being
//! extended) and answers `(rows, vocab)` next-token log-probabilities; [`StepDecoder::reorder`]
//! rebuilds its per-row state (KV caches, encoder memory) when hypotheses are copied, moved or
//! dropped. [`greedy`] and [`beam_search`] drive it from `BOS` until `EOS` or
//! [`SearchConfig::max_len`] generated tokens.
//!
//! Conventions shared by both searches:
//!
//! * The state starts with `batch` rows, one per source sentence; the first step feeds `BOS` to
//!   every row. At most `max_len` tokens are generated per sequence, `EOS` included.
//! * `PAD` and `BOS` are never generated: their log-probabilities are treated as `-inf` before
//!   choosing. If one of them is also the `EOS` id, `EOS` wins and it can be generated.
//! * Choices are made on the host: each step's log-probabilities are converted to `f32` and
//!   copied off the device. The vocabularies here are small, so this is cheap and keeps the
//!   searches exact and device independent.
//! * Ties are broken towards the lower token id (in beam search: equal totals go to the better
//!   token log-probability, then the lower beam index, then the lower token id), so a search
//!   with `beam_size == 1` gives exactly the result of [`greedy`].
//! * Finished rows are dropped from the state with [`StepDecoder::reorder`] rather than fed
//!   padding, so a batch of sentences of different lengths does no wasted work; `reorder` is
//!   never called with the identity permutation, nor after the last step.
//! * A log-probability of `-inf` marks an impossible token; `NaN` or `+inf` from the model is an
//!   error, and so is a step where every allowed token of a sequence is impossible.
//!
//! A [`Hypothesis`]'s `score` is `log_prob / len^length_penalty`, where `len` counts the
//! generated tokens including `EOS`.
//!
//! ```
//! use candle::{Device, Result, Tensor};
//! use candle_attention::decode::{beam_search, greedy, SearchConfig, StepDecoder};
//!
//! /// A bigram model: the next token depends only on the token fed; no state is needed.
//! struct Bigram(Vec<Vec<f32>>);
//!
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
//! // Tokens: 0 = PAD, 1 = BOS, 2 = EOS, 3 = "a".
//! let ninf = f32::NEG_INFINITY;
//! let model = Bigram(vec![
//!     vec![ninf, ninf, 0.0, ninf],  // after PAD: EOS
//!     vec![-9.0, -9.0, -2.0, -0.2], // after BOS: "a"
//!     vec![ninf, ninf, 0.0, ninf],  // after EOS: EOS
//!     vec![-9.0, -9.0, -0.1, -3.0], // after "a": EOS
//! ]);
//! let cfg = SearchConfig::new(1, 2, 0); // bos, eos, pad
//! let best = greedy(&model, &mut (), 1, &cfg)?;
//! assert_eq!(best[0].tokens, vec![3]);
//! assert!(best[0].finished);
//! let nbest = beam_search(&model, (), 1, &cfg.with_beam_size(2))?;
//! assert_eq!(nbest[0][0].tokens, vec![3]);
//! # Ok(()) }
//! ```

use candle::{DType, Result, Tensor};
use std::cmp::Ordering;

/// A model decoded one token at a time. The state holds one row per hypothesis being extended
/// (e.g. the per-layer KV caches and the encoder memory of each row).
pub trait StepDecoder {
    /// Per-row decoding state.
    type State;

    /// Feeds one token per row (`tokens.len()` == number of rows) and returns the
    /// log-probabilities of the next token, a `(rows, vocab)` tensor (any float dtype, any
    /// device).
    fn step(&self, state: &mut Self::State, tokens: &[u32]) -> Result<Tensor>;

    /// Rebuilds the state so that new row `i` is old row `rows[i]` (rows may repeat or be
    /// dropped; the number of rows may change).
    fn reorder(&self, state: &mut Self::State, rows: &[u32]) -> Result<()>;
}

/// How to search: special token ids, length limit, beam width and length penalty.
///
/// The token ids have no meaningful default: set them with [`SearchConfig::new`] or
/// `SearchConfig { bos_id, eos_id, pad_id, ..Default::default() }`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchConfig {
    /// Token fed to every row at the first step (never generated).
    pub bos_id: u32,
    /// Token that ends a sequence.
    pub eos_id: u32,
    /// Padding token (never generated).
    pub pad_id: u32,
    /// Most tokens generated per sequence, `EOS` included; at least 1. Default 128.
    pub max_len: usize,
    /// Beam width, at least 1 (1 is greedy); also the most hypotheses returned per sentence
    /// by [`beam_search`]. Default 1.
    pub beam_size: usize,
    /// Exponent `p` in `score = log_prob / len^p`; finite. 0 ranks by total log-probability,
    /// larger values favour longer sequences. Default 1.0.
    pub length_penalty: f64,
}

impl Default for SearchConfig {
    /// `beam_size` 1, `max_len` 128, `length_penalty` 1.0; the token ids are 0 placeholders
    /// that the caller must set.
    fn default() -> Self {
        Self {
            bos_id: 0,
            eos_id: 0,
            pad_id: 0,
            max_len: 128,
            beam_size: 1,
            length_penalty: 1.0,
        }
    }
}

impl SearchConfig {
    /// The given special token ids, everything else as [`SearchConfig::default`].
    pub fn new(bos_id: u32, eos_id: u32, pad_id: u32) -> Self {
        Self {
            bos_id,
            eos_id,
            pad_id,
            ..Default::default()
        }
    }

    /// The same config with `beam_size` set.
    pub fn with_beam_size(mut self, beam_size: usize) -> Self {
        self.beam_size = beam_size;
        self
    }

    /// The same config with `max_len` set.
    pub fn with_max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len;
        self
    }

    /// The same config with `length_penalty` set.
    pub fn with_length_penalty(mut self, length_penalty: f64) -> Self {
        self.length_penalty = length_penalty;
        self
    }

    /// Checks what can be checked without the model: `beam_size >= 1`, `max_len >= 1` and a
    /// finite `length_penalty`. The token ids are checked against the vocabulary at the first
    /// step.
    pub fn validate(&self) -> Result<()> {
        if self.beam_size == 0 {
            candle::bail!("SearchConfig: beam_size must be at least 1, got 0")
        }
        if self.max_len == 0 {
            candle::bail!("SearchConfig: max_len must be at least 1, got 0")
        }
        if !self.length_penalty.is_finite() {
            candle::bail!(
                "SearchConfig: length_penalty must be finite, got {}",
                self.length_penalty
            )
        }
        Ok(())
    }

    /// The score of a hypothesis with total log-probability `log_prob` and `len` generated
    /// tokens (`EOS` included): `log_prob / len^length_penalty`.
    pub fn normalized_score(&self, log_prob: f64, len: usize) -> f64 {
        log_prob / (len as f64).powf(self.length_penalty)
    }

    fn check_vocab(&self, vocab: usize) -> Result<()> {
        for (name, id) in [
            ("bos_id", self.bos_id),
            ("eos_id", self.eos_id),
            ("pad_id", self.pad_id),
        ] {
            if id as usize >= vocab {
                candle::bail!(
                    "SearchConfig: {name} {id} is outside the model's vocabulary of {vocab} tokens"
                )
            }
        }
        Ok(())
    }

    /// Whether `token` may never be generated (`PAD`, `BOS`, unless it is `EOS`).
    fn is_banned(&self, token: u32) -> bool {
        token != self.eos_id && (token == self.pad_id || token == self.bos_id)
    }
}

/// One decoded sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    /// The generated tokens, without `BOS` and without `EOS`.
    pub tokens: Vec<u32>,
    /// Sum of the log-probabilities of the generated tokens, `EOS` included.
    pub log_prob: f64,
    /// `log_prob / len^length_penalty`, where `len` counts the generated tokens including `EOS`.
    pub score: f64,
    /// Whether the sequence ended with `EOS` (false if it was cut at `max_len`).
    pub finished: bool,
}

/// Checks one step's output `(rows, vocab)` of a [`StepDecoder`] fed `rows` tokens, the
/// vocabulary (`check_vocab` at the first step, the same size afterwards), and copies it to the
/// host as `f32`: `(rows · vocab values, vocab)`. Shared by [`greedy`], [`beam_search`] and
/// [`crate::marian::generation`].
pub(crate) fn step_to_host(
    log_probs: &Tensor,
    rows: usize,
    vocab: &mut Option<usize>,
    check_vocab: impl FnOnce(usize) -> Result<()>,
) -> Result<(Vec<f32>, usize)> {
    let (got_rows, v) = match log_probs.dims() {
        &[r, v] => (r, v),
        dims => candle::bail!(
            "StepDecoder::step must return (rows, vocab) log-probabilities, got shape {dims:?} for {rows} rows"
        ),
    };
    if got_rows != rows {
        candle::bail!(
            "StepDecoder::step was fed {rows} tokens but returned log-probabilities for {got_rows} rows"
        )
    }
    match *vocab {
        None => {
            check_vocab(v)?;
            *vocab = Some(v);
        }
        Some(prev) if prev != v => candle::bail!(
            "StepDecoder::step changed the vocabulary size from {prev} to {v} between steps"
        ),
        Some(_) => {}
    }
    let data = log_probs
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok((data, v))
}

/// One step's log-probabilities on the host, `rows * vocab` values, row major.
struct HostLogProbs {
    data: Vec<f32>,
    vocab: usize,
}

impl HostLogProbs {
    /// Checks the shape of a step's output, the vocabulary (ids at the first step, the same
    /// size afterwards), and copies it to the host as `f32`.
    fn fetch(
        log_probs: &Tensor,
        rows: usize,
        vocab: &mut Option<usize>,
        cfg: &SearchConfig,
    ) -> Result<Self> {
        let (data, vocab) = step_to_host(log_probs, rows, vocab, |v| cfg.check_vocab(v))?;
        Ok(Self { data, vocab })
    }

    fn row(&self, row: usize) -> &[f32] {
        &self.data[row * self.vocab..(row + 1) * self.vocab]
    }
}

/// `Ok(false)` for `-inf` (an impossible token), `Ok(true)` for a finite value, an error for
/// `NaN` and `+inf`.
fn usable(x: f32, item: usize, token: usize) -> Result<bool> {
    if x.is_finite() {
        Ok(true)
    } else if x == f32::NEG_INFINITY {
        Ok(false)
    } else {
        candle::bail!(
            "the model returned log-probability {x} for token {token} of batch item {item}"
        )
    }
}

fn no_candidate(item: usize, step: usize) -> candle::Error {
    candle::Error::Msg(format!(
        "batch item {item}: at step {step} the model gave log-probability -inf to every token that may be generated"
    ))
}

/// Calls `reorder` unless `rows` is the identity on `current_rows` rows (shared with
/// [`crate::marian::generation`]).
pub(crate) fn reorder_unless_identity<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    rows: &[u32],
    current_rows: usize,
) -> Result<()> {
    let identity =
        rows.len() == current_rows && rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    if identity {
        Ok(())
    } else {
        model.reorder(state, rows)
    }
}

/// Greedy decoding: at each step every unfinished sequence takes its most likely allowed token
/// (the lowest id on ties).
///
/// `state` must hold `batch` rows (one per source sentence). Returns one [`Hypothesis`] per
/// batch item, in order. A sequence that emits `EOS` is finished and its row is dropped from
/// the state with [`StepDecoder::reorder`] (only on steps where some row finished); decoding
/// stops when every sequence is finished or `max_len` tokens were generated. On return the
/// state holds the rows that were still being extended at the last step; it is not meant to be
/// reused. `cfg.beam_size` is validated but not used. `batch == 0` returns an empty vector
/// without calling the model.
pub fn greedy<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    batch: usize,
    cfg: &SearchConfig,
) -> Result<Vec<Hypothesis>> {
    cfg.validate()?;
    let mut hyps: Vec<Hypothesis> = (0..batch)
        .map(|_| Hypothesis {
            tokens: Vec::new(),
            log_prob: 0.0,
            score: 0.0,
            finished: false,
        })
        .collect();
    // `active[row]` is the batch item of each row of the state.
    let mut active: Vec<usize> = (0..batch).collect();
    let mut feed = vec![cfg.bos_id; batch];
    let mut vocab = None;
    for step in 1..=cfg.max_len {
        if active.is_empty() {
            break;
        }
        let log_probs = model.step(state, &feed)?;
        let log_probs = HostLogProbs::fetch(&log_probs, feed.len(), &mut vocab, cfg)?;
        let mut keep: Vec<u32> = Vec::with_capacity(active.len());
        for (row, &item) in active.iter().enumerate() {
            let mut best: Option<(u32, f32)> = None;
            for (token, &x) in log_probs.row(row).iter().enumerate() {
                if cfg.is_banned(token as u32) || !usable(x, item, token)? {
                    continue;
                }
                if best.is_none_or(|(_, b)| x > b) {
                    best = Some((token as u32, x));
                }
            }
            let (token, x) = best.ok_or_else(|| no_candidate(item, step))?;
            let hyp = &mut hyps[item];
            hyp.log_prob += x as f64;
            if token == cfg.eos_id {
                hyp.finished = true;
            } else {
                hyp.tokens.push(token);
                keep.push(row as u32);
            }
        }
        if keep.is_empty() || step == cfg.max_len {
            break;
        }
        reorder_unless_identity(model, state, &keep, active.len())?;
        active = keep.iter().map(|&row| active[row as usize]).collect();
        feed = active
            .iter()
            .map(|&item| hyps[item].tokens.last().copied().unwrap_or(cfg.pad_id))
            .collect();
    }
    for hyp in &mut hyps {
        let len = hyp.tokens.len() + usize::from(hyp.finished);
        hyp.score = cfg.normalized_score(hyp.log_prob, len);
    }
    Ok(hyps)
}

/// A row of the beam-search state: a live hypothesis, or a dead filler (`log_prob == -inf`).
#[derive(Clone)]
struct Beam {
    tokens: Vec<u32>,
    log_prob: f64,
}

impl Beam {
    fn dead() -> Self {
        Self {
            tokens: Vec::new(),
            log_prob: f64::NEG_INFINITY,
        }
    }

    fn is_live(&self) -> bool {
        self.log_prob > f64::NEG_INFINITY
    }
}

/// A candidate extension: total log-probability, the token's own log-probability, beam index
/// within its batch item, token.
type Candidate = (f64, f32, u32, u32);

/// Best total first; ties (also those made by rounding the sum) go to the better token
/// log-probability, then the lower beam index, then the lower token id. With a single beam this
/// is exactly greedy's order.
fn candidate_order(a: &Candidate, b: &Candidate) -> Ordering {
    b.0.total_cmp(&a.0)
        .then(b.1.total_cmp(&a.1))
        .then(a.2.cmp(&b.2))
        .then(a.3.cmp(&b.3))
}

/// Keeps the best `k` candidates, sorted best first.
fn top_k(cands: &mut Vec<Candidate>, k: usize) {
    if k == 0 {
        cands.clear();
        return;
    }
    if cands.len() > k {
        cands.select_nth_unstable_by(k - 1, candidate_order);
        cands.truncate(k);
    }
    cands.sort_unstable_by(candidate_order);
}

/// Adds `hyp` to the at most `capacity` best hypotheses of a batch item (Hugging Face's
/// `BeamHypotheses.add`: a full list only takes a strictly better score, evicting the worst).
fn add_hypothesis(list: &mut Vec<Hypothesis>, hyp: Hypothesis, capacity: usize) {
    if list.len() < capacity {
        list.push(hyp);
        return;
    }
    let worst = list
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.score.total_cmp(&b.1.score))
        .map(|(i, h)| (i, h.score));
    if let Some((i, worst_score)) = worst {
        if hyp.score > worst_score {
            list[i] = hyp;
        }
    }
}

fn worst_score(list: &[Hypothesis]) -> f64 {
    list.iter().map(|h| h.score).fold(f64::INFINITY, f64::min)
}

/// Beam search: keeps the `beam_size` most likely partial sequences per batch item and returns
/// up to `beam_size` hypotheses per item, best score first.
///
/// `state` must hold `batch` rows (one per source sentence); it is first expanded to
/// `batch * beam_size` rows with [`StepDecoder::reorder`] (`[0, 0, .., 1, 1, ..]`, each row
/// repeated `beam_size` times), of which only the first copy of each item is live at the first
/// step. Each step, for each batch item, the best `2 * beam_size` (live beam, token) candidates
/// by total log-probability are taken in order: one ending in `EOS` becomes a finished
/// hypothesis if it ranks within the first `beam_size` (and the item keeps its `beam_size`
/// best finished ones by score), the others fill the live beams. The state is then reordered
/// once for the whole batch to the chosen parent rows. An item is done when it has `beam_size`
/// finished hypotheses and its best live beam cannot beat the worst of them (Hugging Face's
/// heuristic: `best live log_prob / cur_len^length_penalty <= worst finished score`, `cur_len`
/// being the number of tokens generated so far), or when it has no live beam left; its rows are
/// then dropped from the state. At `max_len` the live beams of unfinished items are added as
/// hypotheses with `finished == false`.
///
/// Rows of an item with fewer live beams than `beam_size` (tiny vocabularies) are fed `PAD` and
/// ignored. With `beam_size == 1` the result is exactly [`greedy`]'s. `batch == 0` returns an
/// empty vector without calling the model.
pub fn beam_search<M: StepDecoder>(
    model: &M,
    mut state: M::State,
    batch: usize,
    cfg: &SearchConfig,
) -> Result<Vec<Vec<Hypothesis>>> {
    cfg.validate()?;
    let beam = cfg.beam_size;
    let mut results: Vec<Vec<Hypothesis>> = vec![Vec::new(); batch];
    if batch == 0 {
        return Ok(results);
    }
    let expand: Vec<u32> = (0..batch as u32)
        .flat_map(|item| std::iter::repeat_n(item, beam))
        .collect();
    reorder_unless_identity(model, &mut state, &expand, batch)?;

    // The state holds `beam` rows for each item of `items`, in order.
    let mut items: Vec<usize> = (0..batch).collect();
    let mut beams: Vec<Beam> = (0..batch)
        .flat_map(|_| {
            (0..beam).map(|j| Beam {
                tokens: Vec::new(),
                log_prob: if j == 0 { 0.0 } else { f64::NEG_INFINITY },
            })
        })
        .collect();
    let mut feed = vec![cfg.bos_id; batch * beam];
    let mut vocab = None;
    let mut cands: Vec<Candidate> = Vec::new();
    let mut live: Vec<(usize, u32, f64)> = Vec::with_capacity(beam);

    for cur_len in 1..=cfg.max_len {
        let log_probs = model.step(&mut state, &feed)?;
        let log_probs = HostLogProbs::fetch(&log_probs, feed.len(), &mut vocab, cfg)?;
        let mut next_items = Vec::with_capacity(items.len());
        let mut next_beams = Vec::with_capacity(beams.len());
        let mut parents: Vec<u32> = Vec::with_capacity(beams.len());

        for (k, &item) in items.iter().enumerate() {
            cands.clear();
            for j in 0..beam {
                let row = k * beam + j;
                let base = beams[row].log_prob;
                if base == f64::NEG_INFINITY {
                    continue;
                }
                for (token, &x) in log_probs.row(row).iter().enumerate() {
                    if cfg.is_banned(token as u32) || !usable(x, item, token)? {
                        continue;
                    }
                    cands.push((base + x as f64, x, j as u32, token as u32));
                }
            }
            if cands.is_empty() {
                return Err(no_candidate(item, cur_len));
            }
            top_k(&mut cands, 2 * beam);

            live.clear();
            for (rank, &(total, _, j, token)) in cands.iter().enumerate() {
                let row = k * beam + j as usize;
                if token == cfg.eos_id {
                    if rank < beam {
                        let hyp = Hypothesis {
                            tokens: beams[row].tokens.clone(),
                            log_prob: total,
                            score: cfg.normalized_score(total, cur_len),
                            finished: true,
                        };
                        add_hypothesis(&mut results[item], hyp, beam);
                    }
                } else {
                    live.push((row, token, total));
                    if live.len() == beam {
                        break;
                    }
                }
            }

            let done = match live.first() {
                None => true,
                Some(&(_, _, best)) => {
                    results[item].len() >= beam
                        && cfg.normalized_score(best, cur_len) <= worst_score(&results[item])
                }
            };
            if done {
                continue;
            }
            if cur_len == cfg.max_len {
                for &(row, token, total) in &live {
                    let mut tokens = beams[row].tokens.clone();
                    tokens.push(token);
                    let hyp = Hypothesis {
                        tokens,
                        log_prob: total,
                        score: cfg.normalized_score(total, cur_len),
                        finished: false,
                    };
                    add_hypothesis(&mut results[item], hyp, beam);
                }
                continue;
            }
            next_items.push(item);
            for &(row, token, total) in &live {
                let mut tokens = beams[row].tokens.clone();
                tokens.push(token);
                parents.push(row as u32);
                next_beams.push(Beam {
                    tokens,
                    log_prob: total,
                });
            }
            let filler = live[0].0 as u32;
            for _ in live.len()..beam {
                parents.push(filler);
                next_beams.push(Beam::dead());
            }
        }

        if next_items.is_empty() {
            break;
        }
        reorder_unless_identity(model, &mut state, &parents, feed.len())?;
        feed = next_beams
            .iter()
            .map(|b| match b.tokens.last() {
                Some(&t) if b.is_live() => t,
                _ => cfg.pad_id,
            })
            .collect();
        items = next_items;
        beams = next_beams;
    }

    for list in &mut results {
        list.sort_by(|a, b| b.score.total_cmp(&a.score));
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hyp(score: f64) -> Hypothesis {
        Hypothesis {
            tokens: vec![],
            log_prob: score,
            score,
            finished: true,
        }
    }

    #[test]
    fn top_k_sorts_and_breaks_ties() {
        let mut c = vec![
            (-1.0, -0.5, 1, 5),
            (-0.5, -0.5, 0, 9),
            (-1.0, -0.5, 0, 7),
            (-3.0, -0.5, 0, 1),
            (-1.0, -0.5, 0, 2),
            (-1.0, -0.25, 1, 8),
        ];
        top_k(&mut c, 4);
        assert_eq!(
            c,
            vec![
                (-0.5, -0.5, 0, 9),
                (-1.0, -0.25, 1, 8),
                (-1.0, -0.5, 0, 2),
                (-1.0, -0.5, 0, 7)
            ]
        );
        let mut c = vec![(-2.0, -2.0, 0, 1), (-1.0, -1.0, 0, 0)];
        top_k(&mut c, 4);
        assert_eq!(c, vec![(-1.0, -1.0, 0, 0), (-2.0, -2.0, 0, 1)]);
    }

    #[test]
    fn add_hypothesis_keeps_the_best_capacity() {
        let mut list = Vec::new();
        add_hypothesis(&mut list, hyp(-3.0), 2);
        add_hypothesis(&mut list, hyp(-1.0), 2);
        add_hypothesis(&mut list, hyp(-3.0), 2); // not strictly better than the worst
        assert_eq!(worst_score(&list), -3.0);
        add_hypothesis(&mut list, hyp(-2.0), 2);
        let mut scores: Vec<f64> = list.iter().map(|h| h.score).collect();
        scores.sort_by(f64::total_cmp);
        assert_eq!(scores, vec![-2.0, -1.0]);
    }

    #[test]
    fn banned_tokens_yield_to_eos() {
        let cfg = SearchConfig::new(1, 2, 0);
        assert!(cfg.is_banned(0) && cfg.is_banned(1) && !cfg.is_banned(2) && !cfg.is_banned(3));
        let cfg = SearchConfig::new(0, 2, 2);
        assert!(cfg.is_banned(0) && !cfg.is_banned(2));
    }

    #[test]
    fn identity_reorders_are_skipped() {
        struct Counter(std::cell::Cell<usize>);
        impl StepDecoder for Counter {
            type State = ();
            fn step(&self, _: &mut (), _: &[u32]) -> Result<Tensor> {
                unreachable!()
            }
            fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
                self.0.set(self.0.get() + 1);
                Ok(())
            }
        }
        let m = Counter(std::cell::Cell::new(0));
        reorder_unless_identity(&m, &mut (), &[0, 1, 2], 3).unwrap();
        assert_eq!(m.0.get(), 0);
        reorder_unless_identity(&m, &mut (), &[0, 1], 3).unwrap();
        reorder_unless_identity(&m, &mut (), &[0, 0, 1], 3).unwrap();
        assert_eq!(m.0.get(), 2);
    }
}

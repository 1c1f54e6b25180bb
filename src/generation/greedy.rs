//! Greedy search as `transformers`' `_sample` with `do_sample=False`, one step at a time
//! ([`Greedy`]): items that end are handed out at the step they end, items can be cancelled
//! between steps; [`greedy`] runs it to the end.

use super::config::Resolved;
use super::hypothesis::{length_normalize, Hypothesis};
use super::processors::process;
use super::step::{host_step, reorder_unless_identity, StepDecoder, StepStart};
/// `torch.argmax`: the first maximum, NaN above everything ([`crate::simd::rows::argmax`]).
use crate::simd::rows::argmax;
use candle::Result;
use rayon::prelude::*;

/// Greedy search over `batch` items in progress.
pub(crate) struct Greedy {
    seqs: Vec<Vec<u32>>,
    sums: Vec<f32>,
    /// `active[row]`: the batch item of each row of the state. Rows that emitted EOS are
    /// dropped; transformers keeps feeding them padding, which changes nothing else.
    active: Vec<usize>,
    /// Items to drop from the state before the next step.
    cancelled: Vec<usize>,
    /// Items already finished that the next step hands out (a search of
    /// `max_length` 1 generates nothing).
    ready: Vec<usize>,
    /// Between the two halves of a step: the items it hands out whatever the model answers,
    /// and the tokens fed.
    finishing: Vec<usize>,
    fed: Vec<u32>,
    vocab: Option<usize>,
    cur_len: usize,
}

impl Greedy {
    pub(crate) fn new(batch: usize, cfg: &Resolved) -> Self {
        let runs = cfg.max_length > 1;
        Self {
            seqs: vec![vec![cfg.start]; batch],
            sums: vec![0f32; batch],
            active: if runs {
                (0..batch).collect()
            } else {
                Vec::new()
            },
            cancelled: Vec::new(),
            ready: if runs {
                Vec::new()
            } else {
                (0..batch).collect()
            },
            finishing: Vec::new(),
            fed: Vec::new(),
            vocab: None,
            cur_len: 1,
        }
    }

    /// Whether every item has been handed out (or cancelled).
    pub(crate) fn is_done(&self) -> bool {
        self.active.is_empty() && self.ready.is_empty()
    }

    /// Decoder rows in the state.
    pub(crate) fn rows(&self) -> usize {
        self.active.len()
    }

    /// Drops `item` from the search before the next step (it is never handed out).
    pub(crate) fn cancel(&mut self, item: usize) {
        self.cancelled.push(item);
    }

    /// The first half of a step ([`super::Search::step`]): drops the cancelled items from the
    /// state, then returns the tokens to feed (one per state row), or the items handed out when no
    /// row is left to step.
    pub(crate) fn begin_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        cfg: &Resolved,
    ) -> Result<StepStart> {
        let finished: Vec<usize> = std::mem::take(&mut self.ready);
        if !self.cancelled.is_empty() {
            let keep: Vec<u32> = (0..self.active.len() as u32)
                .filter(|&r| !self.cancelled.contains(&self.active[r as usize]))
                .collect();
            let rows = self.active.len();
            self.active = keep.iter().map(|&r| self.active[r as usize]).collect();
            self.cancelled.clear();
            if !self.active.is_empty() {
                reorder_unless_identity(model, state, &keep, rows)?;
            }
        }
        if self.active.is_empty() {
            return Ok(StepStart::Ended(self.hand_out(finished, cfg)));
        }
        self.finishing = finished;
        self.fed = self
            .active
            .iter()
            .map(|&i| *self.seqs[i].last().unwrap())
            .collect();
        Ok(StepStart::Feed(self.fed.clone()))
    }

    /// The second half of a step ([`super::Search::step`]): the model's answer `log_probs` `(rows,
    /// vocab)` to the tokens [`Greedy::begin_step`] returned.
    pub(crate) fn end_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        log_probs: candle::Tensor,
        cfg: &Resolved,
    ) -> Result<Vec<(usize, Vec<Hypothesis>)>> {
        let mut finished = std::mem::take(&mut self.finishing);
        let feed = std::mem::take(&mut self.fed);
        let step = host_step(log_probs, feed.len(), &mut self.vocab, cfg)?;
        // Rows are independent: their processors and maxima run in parallel.
        let seqs = &self.seqs;
        let picks: Vec<(u32, f32)> = step.with_values(|values| {
            Ok(values
                .par_chunks(step.vocab.max(1))
                .zip(self.active.par_iter())
                .map(|(row, &item)| {
                    let mut scores = row.to_vec();
                    process(cfg, &seqs[item], &mut scores);
                    let token = argmax(&scores);
                    (token as u32, scores[token])
                })
                .collect())
        })?;
        let mut keep = Vec::with_capacity(self.active.len());
        for (row, (&item, (token, score))) in self.active.iter().zip(picks).enumerate() {
            self.sums[item] += score;
            self.seqs[item].push(token);
            if cfg.eos.contains(&token) {
                finished.push(item);
            } else {
                keep.push(row as u32);
            }
        }
        self.cur_len += 1;
        if self.cur_len >= cfg.max_length {
            // The rows still running are cut at max_length.
            finished.extend(keep.iter().map(|&r| self.active[r as usize]));
            self.active.clear();
            return Ok(self.hand_out(finished, cfg));
        }
        if keep.len() < self.active.len() {
            self.active = keep.iter().map(|&r| self.active[r as usize]).collect();
            if !self.active.is_empty() {
                reorder_unless_identity(model, state, &keep, feed.len())?;
            }
        }
        Ok(self.hand_out(finished, cfg))
    }

    /// The hypotheses of finished `items`.
    fn hand_out(&self, items: Vec<usize>, cfg: &Resolved) -> Vec<(usize, Vec<Hypothesis>)> {
        items
            .into_iter()
            .map(|item| {
                let tokens = self.seqs[item].clone();
                let log_prob = self.sums[item];
                let ended_with_eos = tokens.len() > 1 && cfg.eos.contains(tokens.last().unwrap());
                let score = length_normalize(log_prob, tokens.len() - 1, cfg.length_penalty);
                let hypothesis = Hypothesis {
                    tokens,
                    log_prob,
                    score,
                    ended_with_eos,
                };
                (item, vec![hypothesis])
            })
            .collect()
    }
}

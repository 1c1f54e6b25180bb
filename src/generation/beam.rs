//! Beam search as `transformers`' `_beam_search` (5.24, `num_beam_groups=1`, no sampling),
//! per batch item, with its `f32` arithmetic reproduced operation for operation.
//!
//! Per item: `num_beams` running beams (scores start at 0 for beam 0 and `-1e9` for the others,
//! so the first step only expands beam 0) and `num_beams` finished-hypothesis slots (scores
//! start at `-1e9`, "not finished"). Each step:
//!
//! 1. Every beam's processed log-probabilities plus its running score (an `f32` addition).
//! 2. The top `K = max(2, 1 + #eos) * num_beams` of the `num_beams * vocab` candidates.
//! 3. A candidate *hits a stopping criterion* when its token is an EOS id or its length reaches
//!    `max_length`. The next running beams are the top `num_beams` candidates after adding
//!    `-1e9` to the ones that hit.
//! 4. Among the first `num_beams` candidates, those that hit are new finished hypotheses with
//!    score `sum / generated_len^length_penalty` (`generated_len` counts the new token and not
//!    the start token, an `f32` division by the `f64` power rounded to `f32`); `-1e9` is added
//!    when the slots are full under `early_stopping=true` or when the stop heuristic already
//!    said no improvement is possible, and the best `num_beams` of slots and candidates are kept.
//! 5. The stop heuristic: the best running score divided by `len^length_penalty` (`len` = the
//!    generated length, or `max_length - 1` for `"never"` with a positive penalty) must beat
//!    the worst slot score (of *all* slots) for some finished slot, or any unfinished slot
//!    counts (against `-1e9`). It is sticky: once false it stays false.
//!
//! The loop stops at `max_length` or when no item can still change (`transformers`' global
//! condition: some item's heuristic still true, and not every item full under
//! `early_stopping=true`).
//!
//! `torch.topk` does not specify the order of equal values; here equal values are ranked by
//! the lower flat index (lower beam, then lower token; finished slots before new candidates).
//! Exact ties between real scores do not happen with real models; the ones that do happen
//! (beams that all sit at `-1e9`, unused slots) do not change the returned sequences.
//!
//! Items whose result can no longer change ("settled": stop condition met, every slot holding a
//! finished hypothesis with a real score above `-1e8`) are dropped from the model state.
//!
//! Each open item's beams occupy consecutive state rows (so a model can share one encoder
//! output per item, see `DecodeState`), and a beam stays on its source beam's row where it can
//! ([`place_beams`]): the reorder after a step then copies only the rows whose beam changed.

use super::config::{EarlyStopping, Resolved};
use super::hypothesis::{length_normalize, Hypothesis};
use super::processors::process;
use super::step::{host_step, reorder_unless_identity, StepDecoder, StepStart};
use candle::Result;
use rayon::prelude::*;

/// `transformers`' stand-in for "impossible" in beam bookkeeping.
const NEG_LARGE: f32 = -1.0e9;

/// A finished-hypothesis slot.
#[derive(Clone, Debug)]
struct Slot {
    seq: Vec<u32>,
    /// The length-normalised score the slots are ranked by (`-1e9` adjustments included).
    score: f32,
    /// The sequence's summed log-probability (the candidate's running score).
    sum: f32,
    finished: bool,
}

/// One batch item's beams.
struct Item {
    /// Running sequences (start token included), best first.
    running: Vec<Vec<u32>>,
    running_scores: Vec<f32>,
    /// The state row of each running beam.
    rows: Vec<usize>,
    slots: Vec<Slot>,
    /// `is_early_stop_heuristic_unsatisfied`: an improvement is still possible.
    heuristic: bool,
    settled: bool,
}

/// A candidate continuation.
struct Candidate {
    beam: usize,
    token: u32,
    score: f32,
    hits: bool,
}

/// Whether `a` ranks before `b` in `torch.topk` order: NaN first, larger values first, equal
/// values by lower index.
fn ranks_before(a: (f32, usize), b: (f32, usize)) -> bool {
    match (a.0.is_nan(), b.0.is_nan()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => a.1 < b.1,
        (false, false) => a.0 > b.0 || (a.0 == b.0 && a.1 < b.1),
    }
}

/// Indices of the `k` largest values, best first (see [`ranks_before`]).
pub(crate) fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    if k == 0 {
        return Vec::new();
    }
    let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
    let mut i = 0;
    while i < values.len() {
        if best.len() == k {
            // Full: a later value enters only when it is NaN or larger than the k-th best
            // (an equal one ranks after it, having the higher index). Skip the others 16 at a
            // time: over `num_beams × vocabulary` values per step this scan is most of the
            // selection's time.
            match crate::simd::rows::next_above(values, i, best[k - 1].0) {
                Some(next) => i = next,
                None => break,
            }
        }
        let v = values[i];
        if best.len() < k || ranks_before((v, i), best[k - 1]) {
            let pos = best
                .iter()
                .position(|&b| ranks_before((v, i), b))
                .unwrap_or(best.len());
            best.insert(pos, (v, i));
            best.truncate(k);
        }
        i += 1;
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// `torch.topk` needs at least `k` candidates.
fn check_candidates(num_beams: usize, vocab: usize, k: usize) -> Result<()> {
    if num_beams * vocab < k {
        candle::bail!(
            "beam search keeps {k} candidates per step but num_beams ({num_beams}) x vocabulary ({vocab}) is only {}",
            num_beams * vocab
        )
    }
    Ok(())
}

/// Beam search over `batch` items in progress, one step at a time: an item is handed out at
/// the step it settles (or when the search stops), and items can be cancelled between steps.
pub(crate) struct Beam {
    items: Vec<Item>,
    /// Whether each item was handed out (or cancelled).
    out: Vec<bool>,
    /// The token each state row is fed next.
    feed: Vec<u32>,
    vocab: Option<usize>,
    cur_len: usize,
    /// Items to drop from the state before the next step.
    cancelled: Vec<usize>,
    /// Whether the search has stopped (everything handed out).
    stopped: bool,
}

impl Beam {
    pub(crate) fn new(batch: usize, cfg: &Resolved) -> Self {
        let nb = cfg.num_beams;
        let items = (0..batch)
            .map(|i| Item {
                running: vec![vec![cfg.start]; nb],
                running_scores: (0..nb)
                    .map(|b| if b == 0 { 0.0 } else { NEG_LARGE })
                    .collect(),
                // The state starts with one row per item: every beam reads it at the first step.
                rows: vec![i; nb],
                slots: vec![
                    Slot {
                        seq: vec![cfg.start],
                        score: NEG_LARGE,
                        sum: NEG_LARGE,
                        finished: false,
                    };
                    nb
                ],
                heuristic: true,
                settled: false,
            })
            .collect();
        Self {
            items,
            out: vec![false; batch],
            feed: vec![cfg.start; batch],
            vocab: None,
            cur_len: 1,
            cancelled: Vec::new(),
            stopped: batch == 0,
        }
    }

    /// Whether every item has been handed out (or cancelled).
    pub(crate) fn is_done(&self) -> bool {
        self.stopped
    }

    /// Decoder rows in the state.
    pub(crate) fn rows(&self) -> usize {
        self.feed.len()
    }

    /// Drops `item` from the search before the next step (it is never handed out). Other
    /// items' results do not change: an item leaves the global stop rule only when it can no
    /// longer change either way.
    pub(crate) fn cancel(&mut self, item: usize) {
        self.cancelled.push(item);
    }

    /// The first half of a step ([`super::Search::step`]): drops the cancelled items from the
    /// state, then returns the tokens to feed (one per state row), or the items handed out when the
    /// search ends without a step.
    pub(crate) fn begin_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        cfg: &Resolved,
    ) -> Result<StepStart> {
        if self.stopped {
            return Ok(StepStart::Ended(Vec::new()));
        }
        if !self.cancelled.is_empty() {
            let rows_now = self.feed.len();
            for &i in &self.cancelled {
                self.out[i] = true;
                self.items[i].settled = true;
            }
            self.cancelled.clear();
            if !self.place_open(model, state, cfg.num_beams, rows_now)? {
                return Ok(StepStart::Ended(self.stop(cfg)));
            }
        }
        Ok(StepStart::Feed(self.feed.clone()))
    }

    /// The second half of a step ([`super::Search::step`]): the model's answer `log_probs` `(rows,
    /// vocab)` to the tokens [`Beam::begin_step`] returned.
    pub(crate) fn end_step<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        log_probs: candle::Tensor,
        cfg: &Resolved,
    ) -> Result<Vec<(usize, Vec<Hypothesis>)>> {
        let nb = cfg.num_beams;
        let keep = 2.max(1 + cfg.eos.len()) * nb;
        let early = cfg.early_stopping;
        let step = host_step(log_probs, self.feed.len(), &mut self.vocab, cfg)?;
        let v = step.vocab;
        check_candidates(nb, v, keep)?;
        let cur_len = self.cur_len;
        // Items are independent: their processors, scores and selections run in parallel
        // (at beam-search sizes this host work is as long as the model's step).
        step.with_values(|values| {
            self.items
                .par_iter_mut()
                .filter(|it| !it.settled)
                .for_each(|item| {
                    let mut acc = vec![0f32; nb * v];
                    for b in 0..nb {
                        let row = &mut acc[b * v..(b + 1) * v];
                        let source = item.rows[b] * v;
                        row.copy_from_slice(&values[source..source + v]);
                        process(cfg, &item.running[b], row);
                        let running = item.running_scores[b];
                        row.iter_mut().for_each(|x| *x += running);
                    }
                    step_item(item, &acc, v, keep, cur_len, cfg);
                });
            Ok(())
        })?;
        self.cur_len += 1;
        if self.cur_len >= cfg.max_length {
            return Ok(self.stop(cfg));
        }
        let mut settled_now = Vec::new();
        for (i, item) in self
            .items
            .iter_mut()
            .enumerate()
            .filter(|(_, it)| !it.settled)
        {
            let full = item.slots.iter().all(|s| s.finished);
            let done = !item.heuristic || (early == EarlyStopping::True && full);
            item.settled = done && full && item.slots.iter().all(|s| s.score > -1.0e8);
            if item.settled {
                settled_now.push(i);
            }
        }
        // transformers' global stop (`_beam_search_has_unfinished_sequences`) over the items
        // that can still change; settled items are full.
        let open: Vec<&Item> = self.items.iter().filter(|it| !it.settled).collect();
        let improvement_possible = open.iter().any(|it| it.heuristic);
        let all_full = early == EarlyStopping::True
            && open.iter().all(|it| it.slots.iter().all(|s| s.finished));
        if open.is_empty() || !improvement_possible || all_full {
            return Ok(self.stop(cfg));
        }
        let handed = self.hand_out(settled_now, cfg);
        self.place_open(model, state, nb, step.rows)?;
        Ok(handed)
    }

    /// Lays the open items' beams on consecutive state rows and reorders the state (from
    /// `rows_now` rows); false when no item is open.
    fn place_open<M: StepDecoder>(
        &mut self,
        model: &M,
        state: &mut M::State,
        nb: usize,
        rows_now: usize,
    ) -> Result<bool> {
        let open_items = self.items.iter().filter(|it| !it.settled).count();
        if open_items == 0 {
            return Ok(false);
        }
        let mut rows = vec![0u32; open_items * nb];
        self.feed.clear();
        self.feed.resize(open_items * nb, 0);
        for (n, item) in self.items.iter_mut().filter(|it| !it.settled).enumerate() {
            let base = n * nb;
            for (b, offset) in place_beams(&item.rows, base).into_iter().enumerate() {
                rows[base + offset] = item.rows[b] as u32;
                self.feed[base + offset] = *item.running[b].last().unwrap();
                item.rows[b] = base + offset;
            }
        }
        reorder_unless_identity(model, state, &rows, rows_now)?;
        Ok(true)
    }

    /// Stops the search: every item not yet handed out, as its slots stand.
    fn stop(&mut self, cfg: &Resolved) -> Vec<(usize, Vec<Hypothesis>)> {
        self.stopped = true;
        self.feed.clear();
        let left: Vec<usize> = (0..self.items.len()).filter(|&i| !self.out[i]).collect();
        self.hand_out(left, cfg)
    }

    /// The hypotheses of `items`, marked handed out.
    fn hand_out(&mut self, items: Vec<usize>, cfg: &Resolved) -> Vec<(usize, Vec<Hypothesis>)> {
        let items: Vec<usize> = items.into_iter().filter(|&i| !self.out[i]).collect();
        items
            .into_iter()
            .map(|i| {
                self.out[i] = true;
                let hypotheses = self.items[i]
                    .slots
                    .iter()
                    .take(cfg.num_return)
                    .map(|s| Hypothesis {
                        ended_with_eos: s.seq.len() > 1 && cfg.eos.contains(s.seq.last().unwrap()),
                        tokens: s.seq.clone(),
                        log_prob: s.sum,
                        score: s.score,
                    })
                    .collect();
                (i, hypotheses)
            })
            .collect()
    }
}

/// Where an item's running beams go among its next state rows `base..base + sources.len()`,
/// given the state row each one continues (`sources`, best beam first): the offset of each
/// beam. A beam whose source row lies in that range keeps it (the first such beam per source),
/// so that reordering the state leaves the row where it is; the others take the free rows in
/// beam order. Which row a beam occupies changes nothing else: rows are decoded independently.
fn place_beams(sources: &[usize], base: usize) -> Vec<usize> {
    let nb = sources.len();
    let mut offsets = vec![usize::MAX; nb];
    let mut taken = vec![false; nb];
    for (offset, &src) in offsets.iter_mut().zip(sources) {
        if let Some(o) = src.checked_sub(base).filter(|&o| o < nb && !taken[o]) {
            taken[o] = true;
            *offset = o;
        }
    }
    let mut free = (0..nb).filter(|&o| !taken[o]);
    for offset in offsets.iter_mut().filter(|o| **o == usize::MAX) {
        *offset = free.next().expect("as many rows as beams");
    }
    offsets
}

/// One step of one item: `acc` holds the `num_beams * vocab` accumulated scores. Updates the
/// running beams (their `rows` now name the *old* state row of their source beam), the slots
/// and the heuristic.
fn step_item(item: &mut Item, acc: &[f32], v: usize, keep: usize, cur_len: usize, cfg: &Resolved) {
    let nb = cfg.num_beams;
    let at_max = cur_len + 1 >= cfg.max_length;
    let cands: Vec<Candidate> = top_k(acc, keep)
        .into_iter()
        .map(|idx| {
            let token = (idx % v) as u32;
            Candidate {
                beam: idx / v,
                token,
                score: acc[idx],
                hits: at_max || cfg.eos.contains(&token),
            }
        })
        .collect();
    let seq_of = |c: &Candidate| {
        let mut s = item.running[c.beam].clone();
        s.push(c.token);
        s
    };

    // Next running beams: candidates that hit a stopping criterion sink by 1e9.
    let sunk: Vec<f32> = cands
        .iter()
        .map(|c| c.score + if c.hits { NEG_LARGE } else { -0.0 })
        .collect();
    let next = top_k(&sunk, nb);

    // Finished slots: candidates in the top `num_beams` that hit, length-normalised.
    let full = cfg.early_stopping == EarlyStopping::True && item.slots.iter().all(|s| s.finished);
    let mut merged: Vec<f32> = item.slots.iter().map(|s| s.score).collect();
    for (j, c) in cands.iter().enumerate() {
        let did = c.hits && j < nb;
        let mut s = length_normalize(c.score, cur_len, cfg.length_penalty);
        s += if full { NEG_LARGE } else { -0.0 };
        s += if item.heuristic { -0.0 } else { NEG_LARGE };
        s += if did { -0.0 } else { NEG_LARGE };
        merged.push(s);
    }
    let slots: Vec<Slot> = top_k(&merged, nb)
        .into_iter()
        .map(|m| {
            if m < nb {
                item.slots[m].clone()
            } else {
                let j = m - nb;
                Slot {
                    seq: seq_of(&cands[j]),
                    score: merged[m],
                    sum: cands[j].score,
                    finished: cands[j].hits && j < nb,
                }
            }
        })
        .collect();

    let running: Vec<Vec<u32>> = next.iter().map(|&j| seq_of(&cands[j])).collect();
    let rows: Vec<usize> = next.iter().map(|&j| item.rows[cands[j].beam]).collect();
    item.running_scores = next.iter().map(|&j| sunk[j]).collect();
    item.running = running;
    item.rows = rows;
    item.slots = slots;

    // The stop heuristic, after the step (cur_len + 1 tokens).
    if item.heuristic {
        let generated = cur_len; // (cur_len + 1) - 1 start token
        let len = if cfg.early_stopping == EarlyStopping::Never && cfg.length_penalty > 0.0 {
            cfg.max_length - 1
        } else {
            generated
        };
        let best = length_normalize(item.running_scores[0], len, cfg.length_penalty);
        let worst = item
            .slots
            .iter()
            .map(|s| s.score)
            .fold(f32::INFINITY, |a, b| {
                // torch.min propagates NaN.
                if a.is_nan() || !(b.is_nan() || b < a) {
                    a
                } else {
                    b
                }
            });
        item.heuristic = item
            .slots
            .iter()
            .any(|s| best > if s.finished { worst } else { NEG_LARGE });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_like_torch() {
        assert_eq!(
            top_k(&[1.0, 5.0, 3.0, 5.0, f32::NEG_INFINITY], 3),
            vec![1, 3, 2]
        );
        assert_eq!(top_k(&[f32::NEG_INFINITY; 3], 2), vec![0, 1]);
        assert_eq!(top_k(&[1.0, f32::NAN, 2.0], 2), vec![1, 2]);
        assert_eq!(top_k(&[1.0, 2.0], 0), Vec::<usize>::new());
        // Long rows go through the vector scan: compare with a sort.
        let long: Vec<f32> = (0..1000).map(|i| ((i * 7919 % 251) as f32) * 0.5).collect();
        let mut order: Vec<usize> = (0..long.len()).collect();
        order.sort_by(|&a, &b| long[b].total_cmp(&long[a]).then(a.cmp(&b)));
        assert_eq!(top_k(&long, 8), order[..8].to_vec());
        let mut with_nan = long.clone();
        with_nan[700] = f32::NAN;
        assert_eq!(top_k(&with_nan, 3)[0], 700);
    }

    #[test]
    fn beams_keep_their_source_rows_where_they_can() {
        // Beams 0 and 2 continue row 5, beam 1 row 4, beam 3 row 9 (another item's range).
        assert_eq!(place_beams(&[5, 4, 5, 9], 4), vec![1, 0, 2, 3]);
        // The first step: every beam continues the item's single row.
        assert_eq!(place_beams(&[0, 0, 0], 0), vec![0, 1, 2]);
        assert_eq!(place_beams(&[1, 1, 1], 6), vec![0, 1, 2]);
        let offsets = place_beams(&[7, 7, 6, 6], 4);
        let mut sorted = offsets.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3]);
        assert_eq!((offsets[0], offsets[2]), (3, 2));
    }

    #[test]
    fn length_normalize_rounds_the_power_to_f32_first() {
        // torch: f32 tensor / Python float = f32 division by the rounded divisor.
        let x = -7.123_456_7f32;
        let d = 3f64.powf(0.6);
        assert_eq!(length_normalize(x, 3, 0.6), x / d as f32);
        assert_eq!(length_normalize(x, 5, 0.0), x);
    }
}

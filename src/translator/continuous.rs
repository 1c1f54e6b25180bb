//! Continuous batching: texts join a running decode as others leave it, not only at batch
//! boundaries.
//!
//! A [`Continuous`] holds texts waiting (encoded, first in first out) and *cohorts*: groups of
//! texts that started decoding together (one padded encoder pass, one model state, one
//! [`Search`]). Each [`Continuous::step`] first admits waiting texts as a new cohort when the
//! running batch has room (within the row cap and the token budget: the oldest waiting text and
//! those of like length among the next ones, so that a cohort's texts end at about the same
//! step and no long text holds a cohort open for a few rows), then advances every cohort
//! by one decoding step and hands out the texts that ended. The cohorts step in one model
//! call: the projections, feed-forward networks and output projection run once over the rows
//! of all of them, and only attention runs cohort by cohort, over each one's caches (so a new
//! cohort costs its rows, not another pass over the weights).
//! Finished rows leave their cohort's state at once (greedy: at EOS; beam search: when the
//! text's result can no longer change), so the room they free is taken by new texts at the
//! next step. Rows are independent, so a text's result does not depend on the texts it decodes
//! with: it is what it gets alone (the scores to f32 round-off: its encoder pass depends, by a
//! few ulp, on the length its cohort is padded to and on how many rows the encoder's products
//! have).

use super::core::{Core, Request};
use super::error::TranslateError;
use super::types::{TranslateOptions, Translation};
use crate::generation::{GenerationConfig, Hypothesis, Search, StepStart};
use crate::models::encoder_decoder::{DecodeState, EncoderDecoderModel};
use crate::projection::PACKED_MIN_ROWS;
use std::collections::VecDeque;

/// When a running batch starts a new cohort: at most `max_cohorts` decoding at once, and only
/// once 1 / `share` of the row cap is free (else it waits for more room rather than starting
/// a tiny cohort). The cohorts step in one model call (one pass over the weights); each costs
/// its own encoder pass when it starts and its own attention calls, and holds its own caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    max_cohorts: usize,
    share: usize,
}

impl Admission {
    /// Texts that arrive over time ([`Translator::continuous`](super::Translator::continuous):
    /// `attn serve`): more cohorts admitted sooner mean shorter waits for a place and fuller
    /// steps. `examples/continuous_load` (deterministic arrivals, opus-mt size, beam 4, 32
    /// clients, 200 requests, a budget of 768 tokens): 4 cohorts at a quarter gave 1,741 steps
    /// at 36.7 rows instead of 1,928 at 33.2 with [`Admission::SORTED`], the 99th percentile
    /// of request latency 445 steps instead of 540 (8.32 against 9.38 s, medians of 3
    /// alternating rounds, AMD EPYC Zen 4, AVX-512, 2 threads), for 11.80 against 11.91
    /// sentences/s. At `attn serve`'s budget of 1,024 tokens the cohort count binds instead:
    /// 4 cohorts, each kept open by its last texts, let the running batch fall to 43 rows a
    /// step on average. With 6 (100 requests, 1,024 tokens, 64 rows; 2026-12-06): 677 steps at
    /// 46.6 rows instead of 733 at 43.0, the 99th percentile 326 steps instead of 376, 2–12%
    /// more sentences/s in each of five alternating rounds, fewer CPU seconds in each, the same
    /// peak memory (1.20–1.21× the resident set after the warm-up against 1.22×); through
    /// `attn serve` at 32 and 128 clients, 3–19% more in each of two alternating rounds
    /// (docs/performance.md#serving). 8 cohorts: 666 steps at 47.4 rows, no faster than 6.
    /// The cohorts' attention runs side by side on the pool (`transformer::decoder_parts`);
    /// the memory that took at 128 clients (+27 MB: the workers' allocations in malloc arenas
    /// of their own) `attn` avoids with one arena for every thread.
    pub(crate) const ARRIVING: Self = Self {
        max_cohorts: 6,
        share: 4,
    };

    /// A known list sorted by length ([`Translator::translate`](super::Translator::translate):
    /// `attn translate`): 2 cohorts, the next one once half the rows are free. Its waits matter
    /// less than its memory: with [`Admission::ARRIVING`] the same output took 970 MB instead
    /// of 736 (greedy, 1,000 corpus lines) and 1.02 GB instead of 880 MB (beam 4, 300 lines),
    /// for 2–8% less time.
    pub(crate) const SORTED: Self = Self {
        max_cohorts: 2,
        share: 2,
    };
}

/// Up to this many rows in all, the cohorts of a step run as two model calls side by side
/// on the thread pool (each call's products and attention still split across the pool)
/// rather than one: every product of a step is short at these sizes (a 512 × 512 matrix times
/// 36 rows is ~0.1 ms on two threads), and each of the ~60 joins of one call leaves a thread
/// waiting, or asleep and to be woken, while the other finishes or runs the serial work
/// between them (norms, appends, beam bookkeeping). Two calls keep both threads busy with
/// work of their own. At the AVX2 and AVX-512 levels every row's floats are the same either
/// way: below [`PACKED_MIN_ROWS`] every product takes the row kernel, which computes each row
/// alone. At the portable level, whose packed kernel starts at 8 rows, a half of fewer rows
/// may differ from one call by f32 round-off, as any change of the rows batched together may
/// (see the module documentation).
const SPLIT_MAX_ROWS: usize = 64;
// The floats above hold only while a step split in two stays below the packed GEMM.
const _: () = assert!(SPLIT_MAX_ROWS < PACKED_MIN_ROWS);

/// The cohorts of one step: cohort index, cohort, tokens to feed (one per row).
type Stepping<'c> = Vec<(usize, &'c mut Cohort, &'c [u32])>;

/// Two groups of about equal rows out of items of `rows` rows each (the largest first into
/// the lighter group): whether each item goes to the first group.
fn halves(rows: &[usize]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i]));
    let mut in_first = vec![false; rows.len()];
    let (mut first, mut second) = (0, 0);
    for i in order {
        if first <= second {
            in_first[i] = true;
            first += rows[i];
        } else {
            second += rows[i];
        }
    }
    in_first
}

/// The halves ([`halves`]) of a step's cohorts of `rows` rows each when the step is worth
/// two model calls (see [`SPLIT_MAX_ROWS`]): two cohorts or more, at most
/// [`SPLIT_MAX_ROWS`] rows in all, and each half at least a quarter of them (each call reads
/// every weight: a smaller half would cost a pass over the weights for too few rows).
fn two_calls(rows: &[usize]) -> Option<Vec<bool>> {
    let total: usize = rows.iter().sum();
    if rows.len() < 2 || total > SPLIT_MAX_ROWS {
        return None;
    }
    let in_first = halves(rows);
    let first: usize = rows
        .iter()
        .zip(&in_first)
        .filter(|p| *p.1)
        .map(|p| p.0)
        .sum();
    (4 * first.min(total - first) >= total).then_some(in_first)
}

/// What a step did to one cohort: the texts that ended (item, hypotheses), or the error.
type StepOutcome = Result<Vec<(usize, Vec<Hypothesis>)>, String>;

/// One decoding step of `group` in one model call, then each cohort's search: per cohort,
/// the texts that ended or the error (a failed model call fails every cohort of the call:
/// their states may be half stepped).
fn step_group(model: &EncoderDecoderModel, group: Stepping<'_>) -> Vec<(usize, StepOutcome)> {
    let mut parts: Vec<(&mut DecodeState, &[u32])> = Vec::with_capacity(group.len());
    let mut searches = Vec::with_capacity(group.len());
    for (c, cohort, tokens) in group {
        let Cohort { state, search, .. } = cohort;
        parts.push((state, tokens));
        searches.push((c, search, tokens.len()));
    }
    if parts.is_empty() {
        return Vec::new();
    }
    let log_probs = match model.step_parts(&mut parts) {
        Ok(log_probs) => log_probs,
        Err(e) => {
            let e = e.to_string();
            return searches
                .into_iter()
                .map(|(c, ..)| (c, Err(e.clone())))
                .collect();
        }
    };
    let mut start = 0;
    let mut outcomes = Vec::with_capacity(searches.len());
    for ((c, search, n), (state, _)) in searches.into_iter().zip(parts) {
        let rows = log_probs.narrow(0, start, n);
        start += n;
        let ended = rows
            .and_then(|rows| search.end_step(model, state, rows))
            .map_err(|e| e.to_string());
        outcomes.push((c, ended));
    }
    outcomes
}

/// A cohort is filled from the oldest waiting text and the texts of like length among the next
/// `CANDIDATES_PER_PLACE` × its places (see [`Continuous::step`]).
const CANDIDATES_PER_PLACE: usize = 4;

/// A text waiting for a place in the running batch.
struct Waiting {
    tag: u64,
    ids: Vec<u32>,
    key: CohortKey,
    generation: GenerationConfig,
    options: TranslateOptions,
    /// Decode alone (its batch failed; it must not take others down again).
    alone: bool,
}

/// What texts must share to decode together: the target (forced first token), the beam and
/// the length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CohortKey {
    forced_bos: Option<u32>,
    beams: usize,
    max_new_tokens: Option<usize>,
    max_length: Option<usize>,
}

/// Texts decoding together.
struct Cohort {
    state: DecodeState,
    search: Search,
    /// Per item: its tag, source ids and options; `None` once handed out or cancelled.
    items: Vec<Option<(u64, Vec<u32>, TranslateOptions)>>,
    generation: GenerationConfig,
    /// Rows per text.
    beams: usize,
}

/// Continuous batching over one [`Translator`](super::Translator) (made by
/// [`Translator::continuous`](super::Translator::continuous)); see the module documentation. Texts are
/// identified by the caller's tags.
pub struct Continuous<'t> {
    translator: &'t Core,
    waiting: VecDeque<Waiting>,
    cohorts: Vec<Cohort>,
    max_rows: usize,
    max_tokens: usize,
    admission: Admission,
    tokens_generated: u64,
}

impl<'t> Continuous<'t> {
    /// An empty running batch over a translator's model (its token budget and row cap) that
    /// starts cohorts as `admission` says ([`Admission::ARRIVING`] for
    /// [`Translator::continuous`](super::Translator::continuous), [`Admission::SORTED`] for
    /// [`Translator::translate`](super::Translator::translate)).
    pub(crate) fn over(translator: &'t Core, admission: Admission) -> Self {
        Self {
            translator,
            waiting: VecDeque::new(),
            cohorts: Vec::new(),
            max_rows: translator.max_batch_rows,
            max_tokens: translator.max_batch_tokens,
            admission,
            tokens_generated: 0,
        }
    }

    /// This running batch with its own token budget: the most padded source tokens (texts ×
    /// longest source, per cohort) of the texts decoding at once, all cohorts together, instead
    /// of the translator's [`max_batch_tokens`](super::Translator::max_batch_tokens). A server
    /// sizes it from the memory it holds at rest (`attn serve`). A first cohort always takes
    /// its oldest text, however long. Zero is refused.
    pub fn with_max_batch_tokens(mut self, max_batch_tokens: usize) -> candle::Result<Self> {
        if max_batch_tokens == 0 {
            candle::bail!("max_batch_tokens must be at least 1")
        }
        self.max_tokens = max_batch_tokens;
        Ok(self)
    }

    /// The token budget of this running batch (see [`Continuous::with_max_batch_tokens`]).
    pub fn max_batch_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Queues `text` under `tag`, for `pair` (`None`: the model's own) with `options`. A text
    /// the model cannot take, or a request that cannot run, is refused at once.
    pub fn push(
        &mut self,
        tag: u64,
        text: &str,
        pair: Option<(&str, &str)>,
        options: &TranslateOptions,
    ) -> Result<(), TranslateError> {
        let request = self.translator.request(pair, options)?;
        let ids = self.translator.encode(&request, text)?;
        self.push_ids(tag, ids, &request, options);
        Ok(())
    }

    /// Queues already encoded ids.
    pub(crate) fn push_ids(
        &mut self,
        tag: u64,
        ids: Vec<u32>,
        request: &Request,
        options: &TranslateOptions,
    ) {
        let generation = &request.generation;
        let beams = generation.num_beams.unwrap_or(1).max(1);
        // Every beam hypothesis is kept (the search is the same whatever the number returned),
        // so texts asking for different n-best lists share a cohort.
        let generation = if beams > 1 {
            generation.clone().with_num_return_sequences(beams)
        } else {
            generation.clone()
        };
        self.waiting.push_back(Waiting {
            tag,
            ids,
            key: CohortKey {
                forced_bos: generation.forced_bos_token_id,
                beams,
                max_new_tokens: generation.max_new_tokens,
                max_length: generation.max_length,
            },
            generation,
            options: options.clone(),
            alone: false,
        });
    }

    /// Drops the text `tag`, waiting or decoding; it gets no result. False if it is unknown
    /// (already handed out).
    pub fn cancel(&mut self, tag: u64) -> bool {
        if let Some(pos) = self.waiting.iter().position(|w| w.tag == tag) {
            self.waiting.remove(pos);
            return true;
        }
        for cohort in &mut self.cohorts {
            for (i, item) in cohort.items.iter_mut().enumerate() {
                if item.as_ref().is_some_and(|(t, _, _)| *t == tag) {
                    *item = None;
                    cohort.search.cancel(i);
                    return true;
                }
            }
        }
        false
    }

    /// Whether nothing is waiting or decoding.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.cohorts.is_empty()
    }

    /// Texts waiting for a place in the running batch.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Decoder rows running: texts decoding × their beams (a beam search's first step holds
    /// one row per text, its later ones one per beam: counted at its width from the start).
    pub fn running_rows(&self) -> usize {
        self.cohorts
            .iter()
            .map(|c| c.items.iter().flatten().count() * c.beams)
            .sum()
    }

    /// Padded source tokens the running cohorts hold (texts × longest source, per cohort): what
    /// [`Continuous::max_batch_tokens`] bounds.
    pub fn source_tokens(&self) -> usize {
        self.cohorts
            .iter()
            .map(|c| c.items.iter().flatten().count() * c.state.memory().dim(1).unwrap_or(0))
            .sum()
    }

    /// Tokens generated so far (best hypotheses, EOS included).
    pub fn tokens_generated(&self) -> u64 {
        self.tokens_generated
    }

    /// Admits waiting texts if there is room, then advances every cohort by one step: the texts
    /// that ended, with their results (a text whose decoding failed gets its error).
    ///
    /// The cohorts step together: one model call whose projections and feed-forward networks
    /// run over the rows of every cohort at once, each cohort attending over its own caches
    /// (`EncoderDecoderModel::step_parts`), so that a cohort costs its rows, not a pass over
    /// the weights.
    pub fn step(&mut self) -> Vec<(u64, Result<Translation, TranslateError>)> {
        let mut done = Vec::new();
        self.admit(&mut done);
        let model = self.translator.model();
        let mut failed: Vec<(usize, String)> = Vec::new();
        // First halves: each cohort's tokens to feed (or its end without a step).
        let mut feeds: Vec<(usize, Vec<u32>)> = Vec::with_capacity(self.cohorts.len());
        for (c, cohort) in self.cohorts.iter_mut().enumerate() {
            match cohort.search.begin_step(model, &mut cohort.state) {
                Ok(StepStart::Feed(tokens)) => feeds.push((c, tokens)),
                Ok(StepStart::Ended(ended)) => Self::hand_out(
                    self.translator,
                    cohort,
                    ended,
                    &mut done,
                    &mut self.tokens_generated,
                ),
                Err(e) => failed.push((c, e.to_string())),
            }
        }
        // The cohorts that step, with their tokens, in cohort order.
        let mut stepping: Vec<(usize, &mut Cohort, &[u32])> = Vec::with_capacity(feeds.len());
        let mut rest = self.cohorts.iter_mut().enumerate();
        for (c, tokens) in &feeds {
            if let Some((_, cohort)) = rest.find(|(i, _)| i == c) {
                stepping.push((*c, cohort, tokens.as_slice()));
            }
        }
        let sizes: Vec<usize> = stepping.iter().map(|(_, _, t)| t.len()).collect();
        let halves = model.device().is_cpu().then(|| two_calls(&sizes)).flatten();
        let outcomes = if let Some(in_first) = halves {
            // Two model calls side by side, one per half of the rows (see SPLIT_MAX_ROWS).
            let (a, b): (Vec<_>, Vec<_>) = stepping
                .into_iter()
                .zip(in_first)
                .partition(|(_, first)| *first);
            let entries = |half: Vec<_>| half.into_iter().map(|(entry, _)| entry).collect();
            let (a, b) = (entries(a), entries(b));
            let (mut a, b) = rayon::join(|| step_group(model, a), || step_group(model, b));
            a.extend(b);
            // Texts that end at the same step are handed out in cohort order, as one call
            // does.
            a.sort_by_key(|(c, _)| *c);
            a
        } else {
            step_group(model, stepping)
        };
        for (c, outcome) in outcomes {
            match outcome {
                Ok(ended) => Self::hand_out(
                    self.translator,
                    &mut self.cohorts[c],
                    ended,
                    &mut done,
                    &mut self.tokens_generated,
                ),
                Err(e) => failed.push((c, e)),
            }
        }
        failed.sort_unstable_by_key(|f| f.0);
        for (c, error) in failed.into_iter().rev() {
            let mut cohort = self.cohorts.remove(c);
            // A cohort of one fails alone; a larger one is decoded again text by text, so
            // that only the text that caused it gets the error.
            let open: Vec<(u64, Vec<u32>, TranslateOptions)> =
                cohort.items.iter_mut().filter_map(Option::take).collect();
            if open.len() == 1 {
                done.push((open[0].0, Err(TranslateError::model(error))));
            } else {
                for (tag, ids, options) in open.into_iter().rev() {
                    self.waiting.push_front(Waiting {
                        tag,
                        ids,
                        key: key_of(&cohort.generation),
                        generation: cohort.generation.clone(),
                        options,
                        alone: true,
                    });
                }
            }
        }
        self.cohorts.retain(|c| !c.search.is_done());
        done
    }

    /// Hands out the texts of `cohort` that `ended`, with their translations.
    fn hand_out(
        translator: &Core,
        cohort: &mut Cohort,
        ended: Vec<(usize, Vec<Hypothesis>)>,
        done: &mut Vec<(u64, Result<Translation, TranslateError>)>,
        tokens_generated: &mut u64,
    ) {
        for (item, hypotheses) in ended {
            let Some((tag, ids, options)) = cohort.items[item].take() else {
                continue;
            };
            let result = translator.finish(&ids, hypotheses, &options);
            if let Ok(t) = &result {
                *tokens_generated += t.generated_tokens as u64;
            }
            done.push((tag, result));
        }
    }

    /// Starts a cohort of waiting texts (first in, first out, those sharing the first one's
    /// key) when the row cap, the cohort count and the admission share allow.
    fn admit(&mut self, done: &mut Vec<(u64, Result<Translation, TranslateError>)>) {
        while let Some(first) = self.waiting.front() {
            let running = self.running_rows();
            let free = self.max_rows.saturating_sub(running);
            let per_text = first.key.beams;
            let Admission { max_cohorts, share } = self.admission;
            if self.cohorts.len() >= max_cohorts
                || (!self.cohorts.is_empty() && free < per_text.max(self.max_rows / share))
            {
                return;
            }
            let key = first.key;
            let alone = first.alone;
            let max_texts = (free / per_text).max(1);
            // The token budget holds for the running batch as a whole, not for each cohort:
            // a cohort holds its padded source (the encoder memory and its keys and values)
            // and, roughly in proportion, its decoder caches, so the budget bounds what the
            // running texts keep in memory. A first cohort always takes its oldest text.
            let held = self.source_tokens();
            let budget = self.max_tokens.saturating_sub(held);
            if !self.cohorts.is_empty() && first.ids.len() > budget {
                return;
            }
            // The oldest text, then the texts of the same key among the next ones (a window
            // of CANDIDATES_PER_PLACE per place) whose length is closest to its own, while they
            // fit the budget: texts of like length end at about the same step, so a cohort
            // does not keep its place for one long text while its other rows are done.
            let first_len = first.ids.len();
            let mut take: Vec<usize> = vec![0];
            let mut longest = first_len;
            if !alone {
                let mut candidates: Vec<(usize, usize)> = self
                    .waiting
                    .iter()
                    .enumerate()
                    .skip(1)
                    .filter(|(_, w)| w.key == key && !w.alone)
                    .take(max_texts.saturating_mul(CANDIDATES_PER_PLACE))
                    .map(|(i, w)| (i, w.ids.len()))
                    .collect();
                // Stable: among texts as close, the older first.
                candidates.sort_by_key(|&(_, len)| len.abs_diff(first_len));
                for (i, len) in candidates {
                    if take.len() >= max_texts {
                        break;
                    }
                    let longer = longest.max(len);
                    if (take.len() + 1) * longer > budget {
                        continue;
                    }
                    longest = longer;
                    take.push(i);
                }
                take.sort_unstable();
            }
            // Removed from the back so that the indices still hold, then put in queue order.
            let mut group: Vec<Waiting> = Vec::with_capacity(take.len());
            for &i in take.iter().rev() {
                group.extend(self.waiting.remove(i));
            }
            group.reverse();
            let generation = group[0].generation.clone();
            let batch: Vec<Vec<u32>> = group.iter().map(|w| w.ids.clone()).collect();
            match self.start(&batch, &generation) {
                Ok((state, search)) => self.cohorts.push(Cohort {
                    state,
                    search,
                    items: group
                        .into_iter()
                        .map(|w| Some((w.tag, w.ids, w.options)))
                        .collect(),
                    generation,
                    beams: per_text,
                }),
                Err(e) if group.len() == 1 => {
                    done.push((group[0].tag, Err(TranslateError::model(e.to_string()))));
                }
                Err(_) => {
                    for mut w in group.into_iter().rev() {
                        w.alone = true;
                        self.waiting.push_front(w);
                    }
                }
            }
        }
    }

    /// Encodes a padded batch and starts its search.
    fn start(
        &self,
        batch: &[Vec<u32>],
        generation: &GenerationConfig,
    ) -> candle::Result<(DecodeState, Search)> {
        let model = self.translator.model();
        let mut state = self.translator.start_batch(batch, generation)?;
        let search = Search::new(model, &mut state, batch.len(), generation)?;
        Ok((state, search))
    }
}

/// The cohort key of a generation config (see [`CohortKey`]).
fn key_of(generation: &GenerationConfig) -> CohortKey {
    CohortKey {
        forced_bos: generation.forced_bos_token_id,
        beams: generation.num_beams.unwrap_or(1).max(1),
        max_new_tokens: generation.max_new_tokens,
        max_length: generation.max_length,
    }
}

impl Core {
    /// The translation of `hypotheses` (all of the search's, best first), trimmed to the
    /// options' n-best.
    pub(crate) fn finish(
        &self,
        ids: &[u32],
        mut hypotheses: Vec<Hypothesis>,
        options: &TranslateOptions,
    ) -> Result<Translation, TranslateError> {
        hypotheses.truncate(options.n_best.max(1));
        self.translation(ids, hypotheses, options)
    }
}

#[cfg(test)]
mod tests {
    use super::{halves, two_calls};

    #[test]
    fn steps_split_into_halves_of_the_rows() {
        // 20 | 12, then 8 to the lighter (12 + 8), then 4 to the lighter (20 + 4).
        assert_eq!(halves(&[4, 20, 8, 12]), [true, true, false, false]);
        assert_eq!(halves(&[36, 4]), [true, false]);
        assert_eq!(halves(&[5, 5, 5]), [true, false, true]);
        assert!(halves(&[]).is_empty());
    }

    #[test]
    fn steps_split_only_into_halves_worth_a_call() {
        assert_eq!(two_calls(&[20, 16]), Some(vec![true, false]));
        // 4 of 40 rows: under a quarter.
        assert_eq!(two_calls(&[36, 4]), None);
        // One cohort, or more rows than SPLIT_MAX_ROWS.
        assert_eq!(two_calls(&[32]), None);
        assert_eq!(two_calls(&[40, 40]), None);
    }
}

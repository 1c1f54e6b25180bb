//! The batching of [`Translator::translate`](super::Translator::translate): texts already
//! encoded, sorted by length and packed into batches within a token budget and a row cap.
//!
//! * **Sorted by length** (shortest first, ties in input order): a batch pads little, and its
//!   sentences end at about the same step; the generation engine drops finished rows from the
//!   running batch.
//! * **A token budget**: a batch's padded size (rows × its longest row) stays within
//!   `max_batch_tokens`, so memory follows the budget, not the input.
//! * **A row cap** ([`MAX_BATCH_ROWS`] decoder rows, texts × beams): past a few hundred rows a
//!   step is compute-bound, while every row holds caches and a step's log-probabilities.
//! * **Failures stay with their text**: a batch that fails is generated again row by row, so
//!   only the row that caused it gets the error ([`generate_rows`]).

use crate::generation::Hypothesis;
use crate::models::translation::generate_rows;
use std::ops::ControlFlow;

/// The most decoder rows (texts × beams) in one batch, whatever the token budget allows. Every
/// row holds its self- and cross-attention caches (beam search copies them at each step) and
/// a step's log-probabilities (232 KB a row for a 58,101-token vocabulary): the short texts of
/// a large call would otherwise make batches of a thousand rows, 1.2–1.6 GB resident for a
/// 282 MB opus-mt model at beam 4.
pub const MAX_BATCH_ROWS: usize = 256;

/// How texts are packed into batches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Batching {
    /// The most padded source tokens (rows × longest row) in one batch (at least one text).
    pub max_batch_tokens: usize,
    /// Decoder rows per text: the beam width.
    pub rows_per_text: usize,
}

/// Generates every `(index, ids)` of `todo` in sorted, budgeted batches: `generate` takes one
/// padded batch and answers one result per row (each its hypotheses, best first); `on_done`
/// gets each text's result as its batch finishes, and may stop the run (`Break`).
pub(crate) fn generate_sorted(
    mut todo: Vec<(usize, Vec<u32>)>,
    batching: Batching,
    generate: impl Fn(&[Vec<u32>]) -> candle::Result<Vec<Vec<Hypothesis>>>,
    mut on_done: impl FnMut(usize, &[u32], candle::Result<Vec<Hypothesis>>) -> ControlFlow<()>,
) -> ControlFlow<()> {
    todo.sort_by_key(|(i, ids)| (ids.len(), *i));
    let rows = batching.rows_per_text.max(1);
    let mut start = 0;
    while start < todo.len() {
        let mut end = start + 1;
        while end < todo.len()
            && (end + 1 - start) * rows <= MAX_BATCH_ROWS
            && (end + 1 - start) * todo[end].1.len() <= batching.max_batch_tokens
        {
            end += 1;
        }
        let batch: Vec<Vec<u32>> = todo[start..end]
            .iter()
            .map(|(_, ids)| ids.clone())
            .collect();
        for ((i, ids), result) in todo[start..end]
            .iter()
            .zip(generate_rows(&batch, &generate))
        {
            on_done(*i, ids, result)?;
        }
        start = end;
    }
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// "Generates" the ids reversed; a batch holding a row that says "fail" (id 0) fails
    /// whole, as a model error would, and that row alone fails too.
    fn reverse(
        largest: &Cell<usize>,
    ) -> impl Fn(&[Vec<u32>]) -> candle::Result<Vec<Vec<Hypothesis>>> + '_ {
        move |batch| {
            largest.set(largest.get().max(batch.len()));
            if batch.iter().any(|ids| ids.contains(&0)) {
                candle::bail!("the translation ran past the positions")
            }
            Ok(batch
                .iter()
                .map(|ids| {
                    let mut tokens = vec![u32::MAX];
                    tokens.extend(ids.iter().rev());
                    vec![Hypothesis {
                        tokens,
                        log_prob: -(ids.len() as f32),
                        score: -1.0,
                        ended_with_eos: false,
                    }]
                })
                .collect())
        }
    }

    fn run(
        todo: Vec<(usize, Vec<u32>)>,
        batching: Batching,
    ) -> (Vec<(usize, Result<Vec<u32>, String>)>, usize) {
        let largest = Cell::new(0);
        let mut done = Vec::new();
        let flow = generate_sorted(todo, batching, reverse(&largest), |i, _, r| {
            done.push((
                i,
                r.map(|h| h[0].tokens[1..].to_vec())
                    .map_err(|e| e.to_string()),
            ));
            ControlFlow::Continue(())
        });
        assert_eq!(flow, ControlFlow::Continue(()));
        (done, largest.get())
    }

    #[test]
    fn every_text_once_shortest_first_and_a_failure_only_for_its_own_row() {
        let todo = vec![
            (0, vec![1, 2, 3]),
            (1, vec![5]),
            (2, vec![7, 0]),
            (3, vec![4, 4]),
            (4, vec![9, 8, 7, 6]),
        ];
        for budget in [1, 3, 6, 1000] {
            let (done, _) = run(
                todo.clone(),
                Batching {
                    max_batch_tokens: budget,
                    rows_per_text: 1,
                },
            );
            let order: Vec<usize> = done.iter().map(|d| d.0).collect();
            assert_eq!(order, vec![1, 2, 3, 0, 4], "budget {budget}");
            assert_eq!(done[0].1, Ok(vec![5]));
            assert!(done[1].1.as_ref().unwrap_err().contains("ran past"));
            assert_eq!(done[2].1, Ok(vec![4, 4]));
            assert_eq!(done[3].1, Ok(vec![3, 2, 1]));
            assert_eq!(done[4].1, Ok(vec![6, 7, 8, 9]));
        }
    }

    /// However many short texts the token budget would take, a batch holds at most
    /// MAX_BATCH_ROWS decoder rows (texts × beams), and at least one text.
    #[test]
    fn batches_hold_at_most_max_batch_rows_rows() {
        let todo: Vec<(usize, Vec<u32>)> = (0..1000).map(|i| (i, vec![i as u32 + 1])).collect();
        for beams in [1, 4, 300] {
            let (done, largest) = run(
                todo.clone(),
                Batching {
                    max_batch_tokens: 1 << 30,
                    rows_per_text: beams,
                },
            );
            assert_eq!(done.len(), 1000);
            assert_eq!(largest, (MAX_BATCH_ROWS / beams).max(1), "beams {beams}");
        }
        let (_, largest) = run(
            todo,
            Batching {
                max_batch_tokens: 10,
                rows_per_text: 1,
            },
        );
        assert_eq!(largest, 10);
    }

    #[test]
    fn a_break_stops_the_run() {
        let largest = Cell::new(0);
        let mut seen = 0;
        let todo: Vec<(usize, Vec<u32>)> = (0..10).map(|i| (i, vec![1])).collect();
        let batching = Batching {
            max_batch_tokens: 2,
            rows_per_text: 1,
        };
        let flow = generate_sorted(todo, batching, reverse(&largest), |_, _, _| {
            seen += 1;
            if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!((flow, seen), (ControlFlow::Break(()), 3));
    }
}

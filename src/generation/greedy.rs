//! Greedy search as `transformers`' `_sample` with `do_sample=False`.

use super::config::Resolved;
use super::hypothesis::{length_normalize, Hypothesis};
use super::processors::process;
use super::step::{fetch_step, reorder_unless_identity, StepDecoder};
/// `torch.argmax`: the first maximum, NaN above everything ([`crate::simd::rows::argmax`]).
use crate::simd::rows::argmax;
use candle::Result;
use rayon::prelude::*;

/// Runs greedy search; returns each item's sequence (start token first, EOS included when
/// generated, unpadded) with its summed log-probability, one hypothesis per item.
pub(crate) fn greedy<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    batch: usize,
    cfg: &Resolved,
) -> Result<Vec<Vec<Hypothesis>>> {
    let mut seqs: Vec<Vec<u32>> = vec![vec![cfg.start]; batch];
    let mut sums = vec![0f32; batch];
    // `active[row]`: the batch item of each row of the state. Rows that emitted EOS are
    // dropped; transformers keeps feeding them padding, which changes nothing else.
    let mut active: Vec<usize> = (0..batch).collect();
    let mut vocab = None;
    let mut cur_len = 1;
    while !active.is_empty() && cur_len < cfg.max_length {
        let feed: Vec<u32> = active.iter().map(|&i| *seqs[i].last().unwrap()).collect();
        let step = fetch_step(model, state, &feed, &mut vocab, cfg)?;
        // Rows are independent: their processors and maxima run in parallel.
        let picks: Vec<(u32, f32)> = step.with_values(|values| {
            Ok(values
                .par_chunks(step.vocab.max(1))
                .zip(active.par_iter())
                .map(|(row, &item)| {
                    let mut scores = row.to_vec();
                    process(cfg, &seqs[item], &mut scores);
                    let token = argmax(&scores);
                    (token as u32, scores[token])
                })
                .collect())
        })?;
        let mut keep = Vec::with_capacity(active.len());
        for (row, (&item, (token, score))) in active.iter().zip(picks).enumerate() {
            sums[item] += score;
            seqs[item].push(token);
            if !cfg.eos.contains(&token) {
                keep.push(row as u32);
            }
        }
        cur_len += 1;
        if cur_len >= cfg.max_length {
            break;
        }
        if keep.len() < active.len() {
            active = keep.iter().map(|&r| active[r as usize]).collect();
            if !active.is_empty() {
                reorder_unless_identity(model, state, &keep, feed.len())?;
            }
        }
    }
    Ok(seqs
        .into_iter()
        .zip(sums)
        .map(|(tokens, log_prob)| {
            let ended_with_eos = tokens.len() > 1 && cfg.eos.contains(tokens.last().unwrap());
            let score = length_normalize(log_prob, tokens.len() - 1, cfg.length_penalty);
            vec![Hypothesis {
                tokens,
                log_prob,
                score,
                ended_with_eos,
            }]
        })
        .collect())
}

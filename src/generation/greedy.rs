//! Greedy search as `transformers`' `_sample` with `do_sample=False`.

use super::config::Resolved;
use super::hypothesis::{length_normalize, Hypothesis};
use super::processors::process;
use super::step::{fetch_step, reorder_unless_identity, StepDecoder};
/// `torch.argmax`: the first maximum, NaN above everything ([`crate::simd::rows::argmax`]).
use crate::simd::rows::argmax;
use candle::Result;

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
    // `rows[row]`: the batch item each row of the state decodes, and whether it is still
    // generating. transformers keeps feeding finished rows padding to the end, which changes
    // nothing else; here they are dropped from the state, in groups (see
    // [`drop_finished_rows_now`]). Until then a finished row is fed its EOS again and its
    // output is never read.
    let mut rows: Vec<(usize, bool)> = (0..batch).map(|item| (item, true)).collect();
    let mut vocab = None;
    let mut cur_len = 1;
    while rows.iter().any(|&(_, live)| live) && cur_len < cfg.max_length {
        let feed: Vec<u32> = rows
            .iter()
            .map(|&(item, _)| *seqs[item].last().unwrap())
            .collect();
        let step = fetch_step(model, state, &feed, &mut vocab, cfg)?;
        for (row, (item, live)) in rows.iter_mut().enumerate() {
            if !*live {
                continue;
            }
            let mut scores = step.row(row).to_vec();
            process(cfg, &seqs[*item], &mut scores);
            let token = argmax(&scores) as u32;
            sums[*item] += scores[token as usize];
            seqs[*item].push(token);
            *live = !cfg.eos.contains(&token);
        }
        cur_len += 1;
        if cur_len >= cfg.max_length {
            break;
        }
        let finished = rows.iter().filter(|&&(_, live)| !live).count();
        if finished < rows.len() && drop_finished_rows_now(finished, rows.len()) {
            let keep: Vec<u32> = (0..rows.len() as u32)
                .filter(|&r| rows[r as usize].1)
                .collect();
            rows.retain(|&(_, live)| live);
            reorder_unless_identity(model, state, &keep, feed.len())?;
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

/// Whether `finished` of the state's `rows` rows (some still generating) are dropped now.
/// Dropping rows copies every layer's self- and cross-attention cache of the rows kept, which
/// costs about as much as a step's attention; keeping a finished row costs its share of every
/// step. Finished rows are dropped once they are at least 1/[`DROP_FRACTION`] of the state,
/// which on a bulk run (batches of about 80 sentences that end a few steps apart) trades a
/// copy per finished sentence for one per few steps.
fn drop_finished_rows_now(finished: usize, rows: usize) -> bool {
    finished > 0 && finished * drop_fraction() >= rows
}

const DROP_FRACTION: usize = 16;
fn drop_fraction() -> usize {
    std::env::var("ATTN_DROP_FRACTION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DROP_FRACTION)
}

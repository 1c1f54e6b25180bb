//! Greedy search as `transformers`' `_sample` with `do_sample=False`.

use super::config::Resolved;
use super::fetch_step;
use super::processors::process;
use crate::decode::reorder_unless_identity;
use crate::decode::StepDecoder;
use candle::Result;

/// `torch.argmax`: the first maximum; NaN counts as larger than everything (the first NaN wins).
pub(crate) fn argmax(scores: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in scores.iter().enumerate().skip(1) {
        let b = scores[best];
        if !b.is_nan() && (x.is_nan() || x > b) {
            best = i;
        }
    }
    best
}

/// Runs greedy search; returns each item's sequence (start token first, EOS included when
/// generated), unpadded.
pub(crate) fn greedy<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    batch: usize,
    cfg: &Resolved,
) -> Result<Vec<Vec<u32>>> {
    let mut seqs: Vec<Vec<u32>> = vec![vec![cfg.start]; batch];
    // `active[row]`: the batch item of each row of the state. Rows that emitted EOS are
    // dropped; transformers keeps feeding them padding, which changes nothing else.
    let mut active: Vec<usize> = (0..batch).collect();
    let mut vocab = None;
    let mut cur_len = 1;
    while !active.is_empty() && cur_len < cfg.max_length {
        let feed: Vec<u32> = active.iter().map(|&i| *seqs[i].last().unwrap()).collect();
        let step = fetch_step(model, state, &feed, &mut vocab, cfg)?;
        let mut keep = Vec::with_capacity(active.len());
        for (row, &item) in active.iter().enumerate() {
            let mut scores = step.row(row).to_vec();
            process(cfg, &seqs[item], &mut scores);
            let token = argmax(&scores) as u32;
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
    Ok(seqs)
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_is_torchs() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 4]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0, f32::NAN]), 1);
    }
}

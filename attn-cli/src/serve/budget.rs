//! The token budget of `attn serve`'s running batches when `--max-batch-tokens` is not given:
//! sized from the memory the process holds at rest, so that a full running batch adds a fixed
//! share of it whatever the model's size and precision.
//!
//! What a running batch holds grows with its budget, not with the model's weights: an opus-mt
//! model's batch of 1,024 padded source tokens held ~75 MB at beam 4 in f32 and in int8
//! alike, 0.23× of the f32 model's resident set at rest but 0.73× of the int8 one's (AMD EPYC
//! Zen 4, 2026-12-06; docs/serving.md, "Memory"). One fixed default therefore either starves
//! the f32 model or lets the int8 one's memory under load reach 1.7× its memory at rest.

use candle_attention::models::encoder_decoder::EncoderDecoderModel;

/// The running batches of all models together may hold up to this share of the resident
/// memory at rest (the rest of the 1.3× that docs/serving.md promises is the requests' own
/// buffers, the queue and the allocator's slack).
const SHARE_OF_REST: f64 = 0.25;

/// The most tokens a budget is given. At 64 rows and 768 tokens it was the budget that bounded
/// a running batch of opus-mt-length sentences: 1,024 tokens decode 43 rows a step rather
/// than 36 (`examples/continuous_load`, 32 clients, four cohorts; six take it to 46.6, see
/// `Admission::ARRIVING`), and through `attn serve` at 32 clients 11.6 / 11.7 against
/// 10.9 / 11.1 sentences/s, for a peak at 128 clients of 1.20–1.21× the memory at rest instead
/// of 1.15–1.18× (f32, AMD EPYC Zen 4, AVX-512, 2 threads, 2026-12-06). Beyond it the cohort
/// count and the row cap bound the batch, so more tokens cost memory for no speed.
pub const MAX_AUTO_TOKENS: usize = 1024;

/// The fewest: a cohort of a few sentences.
const MIN_AUTO_TOKENS: usize = 128;

/// Budgets are multiples of this.
const TOKEN_STEP: usize = 64;

/// About the bytes a running batch of `model` at `beams` beams holds per token of its budget:
/// for texts of `T` padded source tokens in all, the cross-attention keys and values of the
/// `T` tokens (once per text: its beams share them) and the self-attention caches of `beams`
/// rows a text, which hold half a source length each on average (a running batch's texts are
/// halfway through, and a translation is about as long as its source), plus the beams'
/// logits; [`EncoderDecoderModel::generation_bytes`] over `beams` rows of `T / beams` source
/// tokens and `T / 2` positions. For the opus-mt-size model of `bench/compare_serve.py` at
/// beam 4 it says 74 KB a token; `attn serve` under 128 clients grew by 71–76 KB a token of
/// its 1,024-token budget.
pub fn bytes_per_token(model: &EncoderDecoderModel, beams: usize) -> u64 {
    const T: usize = 1024;
    let beams = beams.max(1);
    model.generation_bytes(beams, T.div_ceil(beams), T / 2) / T as u64
}

/// Each model's budget when the process holds `rest_bytes` at rest and a running batch of
/// model `i` holds `per_token[i]` bytes a token: every model's batch may be full at once, so
/// each gets an equal part of a quarter of `rest_bytes`, in tokens, rounded down to a multiple
/// of 64 and kept within 128..=1,024. Without a resident size (not Linux) every budget is
/// 1,024.
pub fn auto_budgets(rest_bytes: Option<u64>, per_token: &[u64]) -> Vec<usize> {
    let Some(rest) = rest_bytes else {
        return vec![MAX_AUTO_TOKENS; per_token.len()];
    };
    let share = rest as f64 * SHARE_OF_REST / per_token.len().max(1) as f64;
    per_token
        .iter()
        .map(|&bytes| {
            let tokens = (share / bytes.max(1) as f64) as usize;
            (tokens / TOKEN_STEP * TOKEN_STEP).clamp(MIN_AUTO_TOKENS, MAX_AUTO_TOKENS)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn the_budget_is_a_share_of_the_memory_at_rest() {
        // The opus-mt model of compare_serve.py: 74 KB a token; 328 MB at rest in f32, 98 MB
        // in int8.
        assert_eq!(auto_budgets(Some(328 * MB), &[74_000]), vec![1024]);
        assert_eq!(auto_budgets(Some(98 * MB), &[74_000]), vec![320]);
        // Two models that may both be full: each gets half.
        assert_eq!(
            auto_budgets(Some(98 * MB), &[74_000, 74_000]),
            vec![128, 128]
        );
        assert_eq!(
            auto_budgets(Some(2_000 * MB), &[74_000, 300_000]),
            vec![1024, 832]
        );
        // Never below a few sentences, never above 1,024; 1,024 when nothing says the size.
        assert_eq!(auto_budgets(Some(MB), &[74_000]), vec![128]);
        assert_eq!(auto_budgets(None, &[74_000, 1]), vec![1024, 1024]);
        assert_eq!(auto_budgets(Some(u64::MAX), &[0]), vec![1024]);
        assert!(auto_budgets(Some(MB), &[]).is_empty());
    }

    #[test]
    fn every_budget_is_a_multiple_of_64_within_bounds() {
        for rest in (0..4_000).map(|i| i * 1_234_567) {
            for per_token in [1, 1_000, 74_000, 1_000_000, u64::MAX] {
                for &b in &auto_budgets(Some(rest), &[per_token, per_token]) {
                    assert!((MIN_AUTO_TOKENS..=MAX_AUTO_TOKENS).contains(&b), "{b}");
                    assert_eq!(b % TOKEN_STEP, 0);
                }
            }
        }
    }
}

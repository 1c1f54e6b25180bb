//! The logits processors of `transformers` (5.24) that the generation config can switch on,
//! applied to one row of next-token scores on the host, in `_get_logits_processor`'s order:
//! no-repeat n-gram, bad words, min length (min new tokens), forced BOS, forced EOS,
//! renormalisation.
//!
//! `prefix` is the row's whole decoder sequence so far, decoder start token included
//! (`input_ids` in `transformers`), so `prefix.len()` is `cur_len`.

use super::config::Resolved;
/// `log_softmax` in `f32` (LogitNormalization), as torch computes it (vectorised; see
/// [`crate::simd::rows`]).
pub(crate) use crate::simd::rows::log_softmax_in_place;

/// Applies every enabled processor to `scores` (`vocab` values) in place.
pub(crate) fn process(cfg: &Resolved, prefix: &[u32], scores: &mut [f32]) {
    let cur_len = prefix.len();
    if cfg.no_repeat_ngram > 0 {
        no_repeat_ngram(cfg.no_repeat_ngram, prefix, scores);
    }
    if !cfg.bad_words.is_empty() {
        bad_words(&cfg.bad_words, prefix, scores);
    }
    // MinLengthLogitsProcessor (and MinNewTokensLengthLogitsProcessor, whose condition is the
    // same once `min_length = min_new_tokens + 1`): only when an EOS exists.
    if cur_len < cfg.min_length {
        for &eos in &cfg.eos {
            if let Some(s) = scores.get_mut(eos as usize) {
                *s = f32::NEG_INFINITY;
            }
        }
    }
    if let Some(bos) = cfg.forced_bos {
        if cur_len == 1 {
            force(scores, &[bos]);
        }
    }
    if let Some(eos) = &cfg.forced_eos {
        if cur_len + 1 == cfg.max_length {
            force(scores, eos);
        }
    }
    if cfg.renormalize {
        log_softmax_in_place(scores);
    }
}

/// Every score `-inf` except `ids`, which get 0 (ForcedBOS/ForcedEOS processors).
fn force(scores: &mut [f32], ids: &[u32]) {
    scores.fill(f32::NEG_INFINITY);
    for &id in ids {
        scores[id as usize] = 0.0;
    }
}

/// NoRepeatNGramLogitsProcessor: bans every token that would complete an n-gram already in
/// `prefix` (start token included).
fn no_repeat_ngram(n: usize, prefix: &[u32], scores: &mut [f32]) {
    let cur_len = prefix.len();
    if cur_len < n {
        return;
    }
    let tail = &prefix[cur_len + 1 - n..];
    for window in prefix.windows(n) {
        if &window[..n - 1] == tail {
            if let Some(s) = scores.get_mut(window[n - 1] as usize) {
                *s = f32::NEG_INFINITY;
            }
        }
    }
}

/// NoBadWordsLogitsProcessor (a SequenceBias of `-inf`): a single-token bad word is always
/// banned; the last token of a longer one is banned when the sequence ends with the others.
/// The bias is *added*, as in `transformers` (`-inf` plus anything but `+inf`/NaN is `-inf`).
fn bad_words(words: &[Vec<u32>], prefix: &[u32], scores: &mut [f32]) {
    for word in words {
        let (last, head) = word
            .split_last()
            .expect("bad words are non-empty (resolve)");
        if head.len() <= prefix.len() && prefix.ends_with(head) {
            scores[*last as usize] += f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::GenerationConfig;

    const NINF: f32 = f32::NEG_INFINITY;

    fn resolved(json: &str) -> Resolved {
        GenerationConfig::from_json_str(json)
            .unwrap()
            .resolve()
            .unwrap()
    }

    fn run(cfg: &Resolved, prefix: &[u32]) -> Vec<f32> {
        let mut s = vec![-1.0f32; 8];
        process(cfg, prefix, &mut s);
        s
    }

    #[test]
    fn bad_words_single_and_multi_token() {
        let cfg = resolved(
            r#"{"decoder_start_token_id": 7, "eos_token_id": 0, "bad_words_ids": [[7], [3, 4], [7, 5], [1, 2, 6]]}"#,
        );
        // After the start token: 7 always, 5 because the sequence ends with 7.
        assert_eq!(
            run(&cfg, &[7]),
            vec![-1., -1., -1., -1., -1., NINF, -1., NINF]
        );
        assert_eq!(
            run(&cfg, &[7, 3]),
            vec![-1., -1., -1., -1., NINF, -1., -1., NINF]
        );
        assert_eq!(
            run(&cfg, &[7, 1, 2]),
            vec![-1., -1., -1., -1., -1., -1., NINF, NINF]
        );
        assert_eq!(
            run(&cfg, &[7, 1, 3, 2]),
            vec![-1., -1., -1., -1., -1., -1., -1., NINF]
        );
    }

    #[test]
    fn min_length_counts_the_start_token() {
        let cfg = resolved(
            r#"{"decoder_start_token_id": 7, "eos_token_id": [0, 2], "min_new_tokens": 2}"#,
        );
        assert_eq!(cfg.min_length, 3);
        assert_eq!(run(&cfg, &[7])[..3], [NINF, -1., NINF]);
        assert_eq!(run(&cfg, &[7, 4])[..3], [NINF, -1., NINF]);
        assert_eq!(run(&cfg, &[7, 4, 4])[..3], [-1., -1., -1.]);
        // Without an EOS id the processor is not built.
        let no_eos = resolved(r#"{"decoder_start_token_id": 7, "min_length": 5}"#);
        assert_eq!(run(&no_eos, &[7]), vec![-1.0; 8]);
    }

    #[test]
    fn forced_bos_first_step_forced_eos_last_step() {
        let cfg = resolved(
            r#"{"decoder_start_token_id": 7, "eos_token_id": 0, "forced_bos_token_id": 4,
                "forced_eos_token_id": [0, 1], "max_length": 4}"#,
        );
        assert_eq!(
            run(&cfg, &[7]),
            vec![NINF, NINF, NINF, NINF, 0., NINF, NINF, NINF]
        );
        assert_eq!(run(&cfg, &[7, 4]), vec![-1.0; 8]);
        // cur_len 3 == max_length - 1: the token chosen now is the last one.
        assert_eq!(
            run(&cfg, &[7, 4, 5]),
            vec![0., 0., NINF, NINF, NINF, NINF, NINF, NINF]
        );
    }

    #[test]
    fn no_repeat_ngram_includes_the_start_token() {
        let cfg = resolved(r#"{"decoder_start_token_id": 7, "no_repeat_ngram_size": 2}"#);
        // Bigrams so far: (7,3) (3,7): after 7 the token 3 is banned.
        assert_eq!(run(&cfg, &[7, 3, 7])[3], NINF);
        assert_eq!(
            run(&cfg, &[7, 3, 7]).iter().filter(|x| **x == NINF).count(),
            1
        );
        let tri = resolved(r#"{"decoder_start_token_id": 7, "no_repeat_ngram_size": 3}"#);
        assert_eq!(run(&tri, &[7, 1, 2, 5, 1, 2])[5], NINF);
        assert_eq!(run(&tri, &[7, 1]), vec![-1.0; 8]);
    }

    #[test]
    fn renormalize_is_a_log_softmax() {
        let cfg = resolved(
            r#"{"decoder_start_token_id": 7, "eos_token_id": 0, "min_length": 3, "renormalize_logits": true}"#,
        );
        let s = run(&cfg, &[7]);
        assert_eq!(s[0], NINF);
        let total: f32 = s.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((s[1] - (1.0f32 / 7.0).ln()).abs() < 1e-6);
    }
}

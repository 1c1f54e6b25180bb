//! Translation quality: exact match and chrF.

use std::collections::HashMap;

/// Corpus-level chrF (Popović 2015) as sacrebleu 2 computes it by default: character n-grams
/// of orders 1 to 6 with whitespace removed, statistics summed over the corpus, precision and
/// recall averaged over the orders that occur, combined into an F-score with `β = 2`; 0–100.
pub fn chrf(hypotheses: &[&str], references: &[&str]) -> f64 {
    const MAX_ORDER: usize = 6;
    const BETA2: f64 = 4.0;
    let mut stats = [(0usize, 0usize, 0usize); MAX_ORDER]; // (hyp n-grams, ref n-grams, matches)
    for (hyp, reference) in hypotheses.iter().zip(references) {
        let hyp: Vec<char> = hyp.chars().filter(|c| !c.is_whitespace()).collect();
        let reference: Vec<char> = reference.chars().filter(|c| !c.is_whitespace()).collect();
        for (n, stat) in (1..=MAX_ORDER).zip(stats.iter_mut()) {
            let hyp_counts = ngram_counts(&hyp, n);
            let ref_counts = ngram_counts(&reference, n);
            stat.0 += hyp_counts.values().sum::<usize>();
            stat.1 += ref_counts.values().sum::<usize>();
            stat.2 += hyp_counts
                .iter()
                .map(|(g, &c)| c.min(ref_counts.get(g).copied().unwrap_or(0)))
                .sum::<usize>();
        }
    }
    // Precision and recall are averaged over the orders that occur, then combined (sacrebleu's
    // default, without eps smoothing).
    let (mut precision, mut recall, mut orders) = (0.0, 0.0, 0usize);
    for &(hyp, reference, matches) in &stats {
        if hyp > 0 && reference > 0 {
            precision += matches as f64 / hyp as f64;
            recall += matches as f64 / reference as f64;
            orders += 1;
        }
    }
    if orders == 0 {
        return 0.0;
    }
    let (precision, recall) = (precision / orders as f64, recall / orders as f64);
    if precision + recall == 0.0 {
        return 0.0;
    }
    100.0 * (1.0 + BETA2) * precision * recall / (BETA2 * precision + recall)
}

fn ngram_counts(chars: &[char], n: usize) -> HashMap<&[char], usize> {
    let mut counts = HashMap::new();
    for gram in chars.windows(n) {
        *counts.entry(gram).or_insert(0) += 1;
    }
    counts
}

/// Fraction of hypotheses equal to their reference.
pub fn exact_match(hypotheses: &[&str], references: &[&str]) -> f64 {
    let hits = hypotheses
        .iter()
        .zip(references)
        .filter(|(h, r)| h == r)
        .count();
    hits as f64 / references.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrf_matches_sacrebleu() {
        // Values from sacrebleu 2 `CHRF().corpus_score(hyps, [refs]).score`.
        let s = chrf(
            &["dreihundertzweiundvierzig", "zwölftausend"],
            &["dreihundertzweiundvierzig", "zwölftausendeins"],
        );
        assert!((s - 90.82404815340888).abs() < 1e-9, "{s}");
        let s = chrf(&["einhundert"], &["zweihundert"]);
        assert!((s - 56.91678603188189).abs() < 1e-9, "{s}");
        assert_eq!(chrf(&["abc d"], &["abcd"]), 100.0);
        assert_eq!(exact_match(&["a", "b"], &["a", "c"]), 0.5);
    }
}

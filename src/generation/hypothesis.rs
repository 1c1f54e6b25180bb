//! What a search returns: [`Hypothesis`], and the length normalisation its score uses (a leaf
//! that greedy and beam search share).

/// One generated sequence and its scores, as `generate(..., output_scores=True,
/// return_dict_in_generate=True)` gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct Hypothesis {
    /// The sequence as `generate()` returns it: the decoder start token first, then the
    /// generated tokens, EOS included when the model produced it; unpadded.
    pub tokens: Vec<u32>,
    /// The sum of the (processed) log-probabilities of the generated tokens, accumulated in
    /// `f32` as `transformers` does: the sequence's log-probability.
    pub log_prob: f32,
    /// `log_prob / generated_len ^ length_penalty` (`generated_len` counts the generated
    /// tokens, EOS included, not the start token): what beam search ranks finished
    /// hypotheses by, `transformers`' `sequences_scores`. Greedy search reports the same
    /// formula.
    pub score: f32,
    /// Whether the sequence ends with an EOS id (false when it was cut at `max_length`).
    pub ended_with_eos: bool,
}

impl Hypothesis {
    /// The generated tokens: without the start token and without a final EOS.
    pub fn generated(&self) -> &[u32] {
        let end = self.tokens.len() - usize::from(self.ended_with_eos);
        &self.tokens[1.min(end)..end]
    }
}

/// `x / (len ** p)` as torch does it: the power in `f64` (Python), the division in `f32`.
pub(crate) fn length_normalize(x: f32, len: usize, p: f64) -> f32 {
    x / (len as f64).powf(p) as f32
}

//! What a call asks for ([`TranslateOptions`]) and what it gets back ([`Translation`]).

/// Per call: what to generate. `None` fields take the translator's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateOptions {
    /// Beam width (1 = greedy); default: the builder's, else `generation_config.json`'s.
    pub beam: Option<usize>,
    /// Most tokens to generate per text; default: the builder's, else the directory's.
    pub max_new_tokens: Option<usize>,
    /// Hypotheses to return per text in [`Translation::alternatives`] (at most the beam
    /// width); 1 returns none.
    pub n_best: usize,
    /// Whether to align each generated token of the best hypothesis to the source token it
    /// attends to most in the last decoder layer ([`Translation::alignments`]); costs one
    /// teacher-forced pass per text.
    pub alignments: bool,
}

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            beam: None,
            max_new_tokens: None,
            n_best: 1,
            alignments: false,
        }
    }
}

impl TranslateOptions {
    /// The defaults with `beam` beams.
    pub fn beam(beam: usize) -> Self {
        Self {
            beam: Some(beam),
            ..Self::default()
        }
    }
}

/// One translated text.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    /// The best hypothesis's text (`batch_decode(..., skip_special_tokens=True)`).
    pub text: String,
    /// Its score: `log_prob / generated_len ^ length_penalty` (transformers'
    /// `sequences_scores`).
    pub score: f32,
    /// Its log-probability: the sum of the generated tokens' log-probabilities.
    pub log_prob: f32,
    /// With [`TranslateOptions::n_best`] > 1: the `n_best` hypotheses, best first (the first
    /// is the one above); empty otherwise.
    pub alternatives: Vec<Alternative>,
    /// With [`TranslateOptions::alignments`]: per generated token of the best hypothesis, the
    /// source token it attends to most.
    pub alignments: Option<Vec<AlignedToken>>,
    /// The best hypothesis's ids as `generate()` returns them: the decoder start token first,
    /// EOS last when the model ended the text (unpadded).
    pub tokens: Vec<u32>,
    /// Source tokens read (special tokens included).
    pub source_tokens: usize,
    /// Tokens generated for the best hypothesis (EOS included, the start token not).
    pub generated_tokens: usize,
}

/// One of the n best hypotheses of a text.
#[derive(Clone, Debug, PartialEq)]
pub struct Alternative {
    /// Its text.
    pub text: String,
    /// Its score (as [`Translation::score`]).
    pub score: f32,
    /// Its log-probability.
    pub log_prob: f32,
}

/// A generated token and the source token it attends to most.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignedToken {
    /// The generated token.
    pub target: String,
    /// The source token.
    pub source: String,
    /// The source token's position (0-based, special tokens counted).
    pub source_index: usize,
}

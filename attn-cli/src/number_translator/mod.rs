//! The number translator, the `attn` command's own model (shipped in `weights/`): English
//! number words to German number words for every integer `0..=999_999`, following the Python
//! `num2words` package (`lang='en'` as source, `lang='de'` as target). An application of the
//! library, kept out of it: a crate depending on candle-attention gets none of this.
//!
//! * [`numbers`](mod@numbers): the generators ([`english`], [`english_american`], [`german`],
//!   [`german_morphemes`]), the strict input parser [`parse_english`], and the fixed
//!   train / held-out [`split`] (19 900 numbers, 1.99 %, held out).
//! * [`tokenizer`]: the English word tokenizer (input normalised to num2words' form first) and
//!   the German morpheme tokenizer, with JSON vocabularies.
//! * [`model`]: the token-level [`Seq2Seq`] model (embeddings, sinusoidal positions and the
//!   library's `Transformer`, with a tied output projection), decoded through the library's
//!   generation engine.
//! * [`train`]: training it (Adam, warm-up, label smoothing, length batches, checkpoints) and
//!   [`translator`]: loading the trained model and translating.
//! * [`metrics`]: exact match and chrF.
//! * The cross-attention heatmaps of `attn translate --heatmap` are drawn by
//!   [`crate::heatmap`]; [`translator::Translator::attention`] gives the weights they draw.
//!
//! ```
//! use attn_cli::number_translator::{english, german, parse_english};
//! # fn main() -> candle::Result<()> {
//! assert_eq!(english(342)?, "three hundred and forty-two");
//! assert_eq!(german(342)?, "dreihundertzweiundvierzig");
//! assert_eq!(parse_english("Three hundred forty two")?, 342);
//! assert!(parse_english("two two").is_err());
//! # Ok(()) }
//! ```

pub mod metrics;
pub mod model;
pub mod numbers;
pub mod tokenizer;
pub mod train;
pub mod translator;

pub use model::{DecodeState, Seq2Seq, Seq2SeqConfig};
pub use numbers::{
    english, english_american, german, german_morphemes, numbers, parse_english, split, Split,
    HELD_OUT_COUNT, MAX,
};
pub use tokenizer::{EnglishTokenizer, GermanTokenizer, Vocab, BOS, EOS, PAD, UNK};

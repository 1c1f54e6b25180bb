//! Hugging Face MarianMT (Helsinki-NLP `opus-mt-*`), the first family on the shared
//! encoder-decoder ([`crate::models::encoder_decoder`]): its `config.json`
//! ([`MarianConfig`], turned into the shared model's spec), the model ([`MarianMTModel`]),
//! one text explained ([`MarianTranslator`]: [`MarianTokenizer`], the model and
//! [`crate::generation`], exactly as the transformers pipeline). Translating, batched, for
//! every family: [`crate::Translator`].

mod config;
mod model;
mod translator;

pub use crate::models::encoder_decoder::marian_positions;
pub use crate::tokenizers::MarianTokenizer;
pub use config::{MarianConfig, MarianExtras, TokenIds};
pub use model::MarianMTModel;
pub use translator::MarianTranslator;

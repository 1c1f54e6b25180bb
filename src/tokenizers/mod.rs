//! Exact, pure-Rust tokenizers of the pretrained families, as `transformers` 5.24 and
//! `sentencepiece` 0.2 tokenize (no Python, no `tokenizer.json` needed):
//!
//! * [`SentencePieceModel`] ([`sentencepiece`]): the protobuf model file, the normaliser, the
//!   unigram and BPE segmenters and the decoder;
//! * the family tokenizers on top of it: [`MarianTokenizer`] (opus-mt), and the multilingual
//!   ones ([`multilingual`]: [`NllbTokenizer`], [`M2M100Tokenizer`], [`MBart50Tokenizer`]),
//!   NLLB-200's and mBART-50's on a port of the `tokenizers` pipeline transformers 5 builds
//!   for them (`hf_models.rs`);
//! * what they share: the directory's JSON files (`vocab.json`, `tokenizer_config.json`,
//!   `special_tokens_map.json`: [`TokenizerConfig`]) and the splitting of text on special
//!   tokens typed in it (as transformers' `Trie.split`).

mod added_tokens;
mod files;
mod hf_models;
mod marian;
pub mod multilingual;
pub mod sentencepiece;

pub use files::TokenizerConfig;
pub use marian::{BatchEncoding, MarianTokenizer};
pub use multilingual::{
    load_multilingual_tokenizer, M2M100Tokenizer, MBart50Tokenizer, MultilingualFamily,
    MultilingualTokenizer, NllbTokenizer,
};
pub use sentencepiece::{PieceType, SentencePieceModel, SentencePieceType};

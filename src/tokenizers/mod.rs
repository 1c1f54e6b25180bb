//! Exact, pure-Rust tokenizers of the pretrained families, as `transformers` 5.24 and
//! `sentencepiece` 0.2 tokenize (no Python, no `tokenizer.json` needed):
//!
//! * [`SentencePieceModel`] ([`sentencepiece`]): the protobuf model file, the normaliser, the
//!   unigram and BPE segmenters and the decoder;
//! * the family tokenizers on top of it: [`MarianTokenizer`] (opus-mt);
//! * what they share: the directory's JSON files (`vocab.json`, `tokenizer_config.json`,
//!   `special_tokens_map.json`: [`TokenizerConfig`]) and the splitting of text on special
//!   tokens typed in it (as transformers' `Trie.split`).

mod added_tokens;
mod files;
mod marian;
pub mod sentencepiece;

pub use files::TokenizerConfig;
pub use marian::{BatchEncoding, MarianTokenizer};
pub use sentencepiece::{PieceType, SentencePieceModel, SentencePieceType};

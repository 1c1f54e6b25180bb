//! MarianMT (opus-mt) support: the tokenizer, in pure Rust.
pub mod tokenizer;
pub use tokenizer::MarianTokenizer;

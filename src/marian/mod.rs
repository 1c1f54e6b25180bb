//! Hugging Face MarianMT (Helsinki-NLP `opus-mt-*`) on this crate's layers: the config, the
//! weights of a hub directory (`model.safetensors` or `pytorch_model.bin`) mapped onto our
//! encoder, decoder and attention, step-by-step decoding through our KV caches,
//! transformers' `generate()` (greedy and beam search) token for token, and `MarianTokenizer`
//! (SentencePiece from `source.spm` / `target.spm` and `vocab.json`) in pure Rust.

pub mod config;
pub mod model;
pub mod tokenizer;
pub mod translator;
pub mod weights;

pub use config::{MarianConfig, TokenIds};
pub use model::{marian_positions, MarianDecodeState, MarianMTModel};
pub use tokenizer::MarianTokenizer;
pub use translator::MarianTranslator;
pub use weights::MarianWeights;

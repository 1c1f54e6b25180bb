//! Hugging Face MarianMT (Helsinki-NLP `opus-mt-*`) on this crate's layers: the config, the
//! weights of a hub directory (`model.safetensors` or `pytorch_model.bin`) mapped onto our
//! encoder, decoder and attention, step-by-step decoding through our KV caches, and
//! transformers' `generate()` (greedy and beam search) token for token.

pub mod config;
pub mod generation;
pub mod model;
pub mod weights;

pub use config::{MarianConfig, TokenIds};
pub use generation::{generate, generate_padded, GenerationConfig};
pub use model::{marian_positions, MarianDecodeState, MarianMTModel};
pub use weights::MarianWeights;

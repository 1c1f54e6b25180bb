//! The encoder-decoder Transformer of "Attention Is All You Need", layer for layer
//! `torch.nn.Transformer`, and its building blocks for pretrained models (embeddings,
//! positions, traces).
//!
//! Layout is batch first, `(batch, seq, d_model)`. The three uses of attention: encoder
//! self-attention, causal decoder self-attention, encoder-decoder attention.

pub mod config;
pub mod decoder;
pub(crate) mod decoder_parts;
pub mod embedding;
pub mod encoder;
pub mod feed_forward;
pub mod model;
pub mod norm;
pub mod trace;

pub use config::{Activation, LayerNaming, TransformerConfig};
pub use decoder::{
    DecoderCache, DecoderLayerCache, DecoderMasks, TransformerDecoder, TransformerDecoderLayer,
};
pub use embedding::{sinusoidal_positions, TokenEmbedding};
pub use encoder::{EncoderMasks, TransformerEncoder, TransformerEncoderLayer};
pub use model::{Transformer, TransformerMasks};
pub use trace::{AttentionTrace, DecoderLayerTrace, ModelTrace};

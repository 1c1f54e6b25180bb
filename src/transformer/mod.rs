//! The encoder-decoder Transformer of "Attention Is All You Need", layer for layer
//! `torch.nn.Transformer`, and a token-level [`Seq2Seq`] model around it.
//!
//! Layout is batch first, `(batch, seq, d_model)`. The three uses of attention: encoder
//! self-attention, causal decoder self-attention, encoder-decoder attention.

pub mod config;
pub mod decoder;
pub mod embedding;
pub mod encoder;
pub mod feed_forward;
pub mod model;
pub mod norm;
pub mod seq2seq;
pub mod trace;

pub use config::{Activation, LayerNaming, TransformerConfig};
pub use decoder::{
    DecoderCache, DecoderLayerCache, DecoderMasks, TransformerDecoder, TransformerDecoderLayer,
};
pub use embedding::{sinusoidal_positions, TokenEmbedding};
pub use encoder::{EncoderMasks, TransformerEncoder, TransformerEncoderLayer};
pub use model::{Transformer, TransformerMasks};
pub use seq2seq::{DecodeState, Seq2Seq, Seq2SeqConfig};
pub use trace::{AttentionTrace, DecoderLayerTrace, ModelTrace};

//! Stands for a user's crate that depends on candle-attention with default features:
//! `.ci/run` checks this crate's normal dependency tree (attention, masks, Transformer, KV
//! cache, decoding and weight loading, and no CLI, progress-bar, image or font crate).

pub use candle_attention;

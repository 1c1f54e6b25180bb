//! # candle-attention
//!
//! The attention of "Attention Is All You Need" for [candle](https://github.com/huggingface/candle):
//!
//! ```text
//! Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
//! ```
//!
//! * [`scaled_dot_product_attention`] on `(batch, heads, seq, head_dim)` tensors, with every
//!   [`Mask`] a model needs: causal (with a cache offset), boolean, additive and key padding.
//! * [`MultiHeadAttention`], a [`candle::ModuleT`] (dropout in training mode) with everything `torch.nn.MultiheadAttention`
//!   has, loading torch (`in_proj_weight`, `q_proj_weight`, ...) and Hugging Face
//!   (`q_proj.weight`, ...) weights through a [`candle_nn::VarBuilder`].
//! * [`TensorFile`] reads safetensors files, including torch's `BOOL` masks, with errors that
//!   list what the file holds.
//! * `hub` (feature `hub`): Hugging Face hub ids (`ORG/NAME[@REVISION]`) to model directories,
//!   from the local hub cache, downloading what is missing.
//!
//! Masks follow torch's `nn.MultiheadAttention`: in a boolean mask `true` (non-zero `U8`) means
//! *blocked*; float masks are added to the scores. A query whose keys are all blocked gets zero
//! attention weights (never NaN). Layout is batch first: `(batch, seq, embed)`.
//!
//! ## Quick start
//!
//! ```
//! use candle::{DType, Device, Tensor};
//! use candle_attention::{AttentionArgs, Mask, MultiHeadAttention, MultiHeadAttentionConfig};
//! use candle_nn::{VarBuilder, VarMap};
//! # fn main() -> candle::Result<()> {
//! let device = Device::Cpu;
//! // Fresh weights (torch's initialisation); use `VarBuilder::from_mmaped_safetensors` or
//! // `TensorFile::var_builder` to load a checkpoint instead.
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
//! let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(64, 8), vb.pp("self_attn"))?;
//!
//! let x = Tensor::randn(0f32, 1., (2, 10, 64), &device)?; // (batch, seq, embed)
//! let y = mha.forward(&x)?; // self-attention, no mask
//! assert_eq!(y.dims(), &[2, 10, 64]);
//!
//! let pad = Tensor::new(&[[0u8; 10], [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]], &device)?; // true = padding
//! let out = mha.attend(&x, &x, &x, &AttentionArgs {
//!     mask: Mask::causal(),
//!     key_padding: Some(&pad),
//!     need_weights: true,
//!     ..Default::default()
//! })?;
//! assert_eq!(out.weights.unwrap().dims(), &[2, 10, 10]); // averaged over heads
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
// Every `unsafe` block says why it is sound (issue 6); CI runs clippy with -D warnings.
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod cpu;
pub mod device;
pub mod explain;
pub mod generation;
#[cfg(feature = "hub")]
pub mod hub;
pub mod kv_cache;
mod mask;
pub mod mha;
pub mod models;
pub mod projection;
pub mod sdpa;
mod simd;
#[doc(hidden)]
pub mod testing;
pub mod tokenizers;
pub mod transformer;
pub mod weights;

pub use device::{available_memory, device_from_name};
pub use generation::{GenerationConfig, StepDecoder};
pub use kv_cache::{CachedAttentionArgs, CrossAttentionCache, KvCache};
pub use mask::{AttentionShape, Mask};
pub use mha::{AttentionArgs, MultiHeadAttention, MultiHeadAttentionConfig};
pub use models::marian;
pub use projection::Projection;
pub use sdpa::{scaled_dot_product_attention, AttentionOutput, SdpaArgs};
pub use weights::{save_tensors, MhaLayout, MhaWeightsInfo, TensorFile};

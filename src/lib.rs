//! # candle-attention
//!
//! The attention of "Attention Is All You Need" (Vaswani et al., 2017) for
//! [candle](https://github.com/huggingface/candle), exact to PyTorch's fp32 round-off, and the
//! pretrained translation models built on it.
//!
//! ```text
//! Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
//! MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W_O,  head_i = Attention(Q W_Q_i, K W_K_i, V W_V_i)
//! ```
//!
//! * [`scaled_dot_product_attention`] on `(batch, heads, seq, head_dim)` tensors, with every
//!   [`Mask`] a model needs: causal (with a cache offset), boolean, additive and key padding;
//!   tiled CPU kernels for AVX-512, AVX2 and portable code, chosen at run time.
//! * [`MultiHeadAttention`], a [`candle::Module`] (and [`candle::ModuleT`]: dropout in
//!   training) with everything `torch.nn.MultiheadAttention` has, loading torch
//!   (`in_proj_weight`, ...) and Hugging Face (`q_proj.weight`, ...) weights through a
//!   [`candle_nn::VarBuilder`]. The paper's three uses: encoder self-attention (no mask, key
//!   padding), decoder self-attention ([`Mask::causal`], with a [`kv_cache::KvCache`] while
//!   generating) and encoder-decoder attention (queries from the decoder, keys and values from
//!   the encoder's output, cached once per sentence).
//! * [`transformer`]: the encoder-decoder Transformer (torch `nn.Transformer` and Hugging Face
//!   BART-family names), [`generation`]: greedy and beam search exactly as transformers'
//!   `generate()`.
//! * [`Translator`]: MarianMT (opus-mt), NLLB-200, M2M100 and mBART-50 directories (or hub
//!   ids, feature `hub`), text to text as the transformers pipeline, token for token, batched
//!   for throughput, in f32, bf16 or int8.
//! * [`TensorFile`] reads safetensors files, including torch's `BOOL` masks, with errors that
//!   list what the file holds.
//! * `hub` (feature `hub`): Hugging Face hub ids (`ORG/NAME[@REVISION]`) to model directories,
//!   from the local hub cache, downloading what is missing.
//!
//! Masks follow torch's `nn.MultiheadAttention`: in a boolean mask `true` (non-zero `U8`) means
//! *blocked*; float masks are added to the scores. A query whose keys are all blocked gets zero
//! attention weights (never NaN). Layout is batch first: `(batch, seq, embed)`.
//!
//! ## Multi-head attention
//!
//! ```
//! use candle_attention::candle::{DType, Device, Tensor};
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
//!
//! ## Translating
//!
//! One type for every family; the same shape of program for a one-pair opus-mt model and a
//! multilingual one. With an opus-mt directory (or, feature `hub`,
//! `Translator::from_pretrained("Helsinki-NLP/opus-mt-en-de")`):
//!
//! ```
//! use candle_attention::{TranslateOptions, Translator};
//! # fn main() -> candle::Result<()> {
//! # let opus_mt_en_de = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/marian_e2e");
//! let translator = Translator::from_dir(opus_mt_en_de)?;
//! let texts = ["How are you?", "The weather is nice today."];
//! for result in translator.translate(&texts, &TranslateOptions::default())? {
//!     let translation = result?;
//!     println!("{} ({:.2})", translation.text, translation.score);
//! }
//! # Ok(()) }
//! ```
//!
//! NLLB-200 (`facebook/nllb-200-distilled-600M`), languages per call, as NLLB spells them or
//! by ISO 639-1, here in int8 with beam search:
//!
//! ```
//! use candle_attention::{Precision, TranslateOptions, Translator};
//! # fn main() -> candle::Result<()> {
//! # let nllb_200 = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/multilingual_e2e/nllb");
//! let translator = Translator::builder(nllb_200).precision(Precision::INT8).build()?;
//! let texts = ["How are you?", "The weather is nice today."];
//! let options = TranslateOptions::beam(4);
//! for result in translator.translate_pair(&texts, "eng_Latn", "deu_Latn", &options)? {
//!     println!("{}", result?.text);
//! }
//! # Ok(()) }
//! ```
//!
//! Each text gets its own `Result`: a text the model cannot take fails alone, with an
//! [`ErrorKind`] telling the caller's fault ([`ErrorKind::Input`]) from the model's.
//!
//! ## Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `hub` | `Translator::from_pretrained` and hub ids in [`Translator::builder`]: models from the Hugging Face cache, downloaded when missing (`hf-hub`) |
//! | `cuda`, `cudnn` | candle's CUDA backend: attention, models and generation on NVIDIA GPUs |
//! | `flash-attn` | Flash Attention v2 kernels as the CUDA path of [`scaled_dot_product_attention`] (f16/bf16) |
//! | `metal`, `mkl`, `accelerate` | candle's Metal backend, Intel MKL or Apple Accelerate |
//! | `gemm-avx512` | the gemm crate's AVX-512 kernels inside candle's own matmul |
//!
//! `ATTN_CPU_ISA=portable|avx2|avx512` lowers the instruction set the CPU kernels use (for
//! tests and benchmarks); results are the same at every level.

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
pub mod translator;
pub mod weights;

/// candle itself, so that a user of this crate needs no second dependency line (and always has
/// the version this crate is built on).
pub use candle;

pub use device::{available_memory, device_from_name, resident_memory};
pub use generation::{GenerationConfig, StepDecoder};
pub use kv_cache::{CachedAttentionArgs, CrossAttentionCache, KvCache};
pub use mask::{AttentionShape, Mask};
pub use mha::{AttentionArgs, MultiHeadAttention, MultiHeadAttentionConfig};
pub use models::marian;
pub use models::seq2seq::Family;
pub use sdpa::{scaled_dot_product_attention, AttentionOutput, SdpaArgs};
pub use translator::{
    AlignedToken, Alternative, ErrorKind, Language, TranslateError, TranslateOptions, Translation,
    Translator, TranslatorBuilder,
};
pub use weights::{save_tensors, MhaLayout, MhaWeightsInfo, Precision, TensorFile};

//! Reading safetensors files and recognising attention weight layouts.
//!
//! [`TensorFile`] memory-maps a `.safetensors` file (falling back to reading it where mapping
//! is not possible), validates it with the `safetensors` crate (header length, offsets,
//! sizes), loads any tensor on any device, including torch's `BOOL` tensors that candle's own
//! loader refuses, and serves as a [`VarBuilder`](candle_nn::VarBuilder) backend whose errors list the tensors that do
//! exist. Only the tensors asked for are copied out of the mapping, so loading a checkpoint
//! takes its tensors' memory once, not the file's twice.
//!
//! [`PthCheckpoint`] reads torch zip checkpoints (`pytorch_model.bin`, `torch.save(state_dict)`)
//! with this crate's own unpickler, which refuses any global outside a torch state dict's and
//! validates every tensor against its storage when the file opens (`weights/pth.rs`).
//!
//! Everywhere this crate takes a [`VarBuilder`](candle_nn::VarBuilder), candle's own
//! `VarBuilder::from_mmaped_safetensors` works as well (it cannot read `BOOL` tensors, which
//! only masks and inputs use).
//!
//! [`MhaLayout`] and [`MhaWeightsInfo`] recognise the three ways attention projections are
//! named:
//!
//! | layout | names (under a prefix) |
//! |---|---|
//! | torch fused | `in_proj_weight` `(3E, E)`, `in_proj_bias` `(3E)`, `out_proj.weight`, `out_proj.bias` |
//! | torch separate (kdim/vdim ≠ E) | `q_proj_weight` `(E, E)`, `k_proj_weight` `(E, kdim)`, `v_proj_weight` `(E, vdim)`, `in_proj_bias`, `out_proj.*` |
//! | Hugging Face | `q_proj.weight`, `q_proj.bias`, `k_proj.*`, `v_proj.*`, `out_proj.*` |
//!
//! Torch's optional `bias_k`, `bias_v` `(1, 1, E)` go with any of them.

pub(crate) mod int8;
mod int8_rule;
#[cfg(target_arch = "x86_64")]
mod int8_x86;
mod layout;
mod mapped;
mod pth;
mod source;
mod tensor_file;

pub use int8::Int8Matrix;
pub use layout::{MhaLayout, MhaWeightsInfo, MHA_TENSOR_NAMES};
pub use mapped::{MappedBf16Matrix, MappedMatrix};
pub use pth::{PthCheckpoint, PthTensorInfo};
pub(crate) use source::MatrixLog;
pub use source::{Precision, Quantization, WeightMatrix, WeightSource};
pub(crate) use tensor_file::refuse_int_as_float;
pub use tensor_file::{join_name, normalize_prefix, save_tensors, TensorFile, TensorSummary};

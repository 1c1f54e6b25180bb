//! The edge between PyTorch's conventions and ours.
//!
//! torch's `nn.MultiheadAttention` takes `(L, N, E)` by default, `(N, L, E)` with
//! `batch_first=True`, and `(L, E)` unbatched; this crate is batch first inside. The functions
//! here convert at the edge so that a file of tensors saved from Python
//! (`safetensors.torch.save_file`) runs through [`MultiHeadAttention`] exactly as torch would
//! run it. This is what `attn run mha` does.

use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use crate::weights::TensorFile;
use candle::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

/// The tensor names of an `attn run mha` input file.
pub const MHA_INPUT_NAMES: [&str; 5] = ["query", "key", "value", "attn_mask", "key_padding_mask"];

/// The inputs of one `nn.MultiheadAttention` call, in torch's layout.
#[derive(Clone, Debug)]
pub struct TorchMhaInputs {
    /// `(L, N, E)`, `(N, L, E)` with batch first, or `(L, E)` unbatched.
    pub query: Tensor,
    /// Same layout as `query` with `S` keys of `kdim` features; `None` means `query`.
    pub key: Option<Tensor>,
    /// Same layout as `key` with `vdim` features; `None` means `key` (or `query`).
    pub value: Option<Tensor>,
    /// `(L, S)` or `(N * H, L, S)`, `U8` (true = blocked) or float (additive).
    pub attn_mask: Option<Tensor>,
    /// `(N, S)` (`(S)` unbatched), `U8` (true = padding) or float (additive).
    pub key_padding_mask: Option<Tensor>,
}

impl TorchMhaInputs {
    /// Reads `query` and the optional `key`, `value`, `attn_mask`, `key_padding_mask` from
    /// `file`. Query, key and value are converted to `dtype`; masks keep their kind (torch
    /// `BOOL` becomes `U8`, float masks become `f32`). Other tensors in the file are ignored.
    pub fn from_file(file: &TensorFile, dtype: DType, device: &Device) -> candle::Result<Self> {
        if !file.contains("query") {
            candle::bail!(
                "{} has no 'query' tensor (an attn run mha input file holds query and optionally \
                 key, value, attn_mask, key_padding_mask); it holds: {}",
                file.origin(),
                if file.names().is_empty() {
                    "nothing".to_string()
                } else {
                    file.names().join(", ")
                }
            )
        }
        let data = |name: &str| -> candle::Result<Option<Tensor>> {
            if !file.contains(name) {
                return Ok(None);
            }
            let t = file.load(name, device)?;
            if !t.dtype().is_float() {
                candle::bail!(
                    "'{name}' in {} must be a float tensor, got {:?}",
                    file.origin(),
                    t.dtype()
                )
            }
            Ok(Some(t.to_dtype(dtype)?))
        };
        let mask = |name: &str| -> candle::Result<Option<Tensor>> {
            if !file.contains(name) {
                return Ok(None);
            }
            let t = file.load(name, device)?;
            Ok(Some(match t.dtype() {
                DType::U8 => t,
                dt if dt.is_float() => t.to_dtype(DType::F32)?,
                dt => candle::bail!(
                    "'{name}' in {} must be bool (true = blocked) or float (additive), got {dt:?}",
                    file.origin()
                ),
            }))
        };
        Ok(Self {
            query: data("query")?.ok_or_else(|| candle::Error::Msg("query vanished".into()))?,
            key: data("key")?,
            value: data("value")?,
            attn_mask: mask("attn_mask")?,
            key_padding_mask: mask("key_padding_mask")?,
        })
    }
}

/// How to run a torch-layout call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TorchMhaOptions {
    /// Inputs and output are `(N, L, E)` instead of `(L, N, E)`.
    pub batch_first: bool,
    /// Add a causal mask (query `i` sees keys `0..=i`) to any `attn_mask`.
    pub causal: bool,
    /// Return attention weights.
    pub need_weights: bool,
    /// Average weights over heads (torch's `average_attn_weights`).
    pub average_weights: bool,
}

/// What torch's `nn.MultiheadAttention.forward` returns.
#[derive(Clone, Debug)]
pub struct TorchMhaOutputs {
    /// Same layout as the query.
    pub output: Tensor,
    /// `(N, L, S')` averaged or `(N, H, L, S')` per head; `(L, S')` / `(H, L, S')` unbatched.
    pub attn_weights: Option<Tensor>,
}

/// Runs `mha` on torch-layout inputs and returns torch-layout outputs.
pub fn run_mha(
    mha: &MultiHeadAttention,
    inputs: &TorchMhaInputs,
    opts: TorchMhaOptions,
) -> candle::Result<TorchMhaOutputs> {
    let rank = inputs.query.rank();
    if rank != 2 && rank != 3 {
        candle::bail!(
            "query must be (L, N, E), (N, L, E) with --batch-first, or unbatched (L, E); got shape {:?}",
            inputs.query.dims()
        )
    }
    // torch's sequence-first layout is transposed to ours at the edge, and back.
    let seq_first = rank == 3 && !opts.batch_first;
    let to_ours = |t: &Tensor| -> candle::Result<Tensor> {
        if seq_first && t.rank() == 3 {
            t.transpose(0, 1)?.contiguous()
        } else {
            Ok(t.clone())
        }
    };
    let query = to_ours(&inputs.query)?;
    let key = match &inputs.key {
        Some(k) => to_ours(k)?,
        None => query.clone(),
    };
    let value = match &inputs.value {
        Some(v) => to_ours(v)?,
        None => key.clone(),
    };
    let mut mask = match &inputs.attn_mask {
        Some(m) => Mask::attn_mask(m.clone())?,
        None => Mask::none(),
    };
    if opts.causal {
        mask = mask.and(Mask::causal());
    }
    let args = AttentionArgs {
        mask,
        key_padding: inputs.key_padding_mask.as_ref(),
        need_weights: opts.need_weights,
        average_weights: opts.average_weights,
        train: false,
    };
    let out = mha.attend(&query, &key, &value, &args)?;
    let output = if seq_first {
        out.output.transpose(0, 1)?.contiguous()?
    } else {
        out.output
    };
    Ok(TorchMhaOutputs {
        output,
        attn_weights: out.weights,
    })
}

/// Writes tensors to a safetensors file (contiguous copies, names as given).
pub fn save_tensors(tensors: &[(&str, &Tensor)], path: impl AsRef<Path>) -> candle::Result<()> {
    let map: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(n, t)| Ok((n.to_string(), t.contiguous()?)))
        .collect::<candle::Result<_>>()?;
    let path = path.as_ref();
    candle::safetensors::save(&map, path)
        .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", path.display())))
}

//! The edge between PyTorch's conventions and ours.
//!
//! torch's `nn.MultiheadAttention` takes `(L, N, E)` by default, `(N, L, E)` with
//! `batch_first=True`, and `(L, E)` unbatched; this crate is batch first inside. The functions
//! here convert at the edge so that a file of tensors saved from Python
//! (`safetensors.torch.save_file`) runs through [`MultiHeadAttention`] exactly as torch would
//! run it. This is what `attn run mha` and `attn run transformer` do.

use candle::{DType, Device, Tensor};
use candle_attention::sdpa::{naive_attention_bytes, uses_memory_efficient_kernel};
use candle_attention::transformer::{Transformer, TransformerMasks};
use candle_attention::{AttentionArgs, AttentionShape, Mask, MultiHeadAttention, TensorFile};

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
        require(
            file,
            "query",
            "an attn run mha input file holds query and optionally key, value, attn_mask, key_padding_mask",
        )?;
        let data = |name: &str| load_data(file, name, dtype, device);
        let mask = |name: &str| load_mask(file, name, device);
        Ok(Self {
            query: data("query")?.ok_or_else(|| candle::Error::Msg("query vanished".into()))?,
            key: data("key")?,
            value: data("value")?,
            attn_mask: mask("attn_mask")?,
            key_padding_mask: mask("key_padding_mask")?,
        })
    }
}

/// Loads the float tensor `name` if present, converted to `dtype`.
fn load_data(
    file: &TensorFile,
    name: &str,
    dtype: DType,
    device: &Device,
) -> candle::Result<Option<Tensor>> {
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
}

/// Loads the mask `name` if present: torch `BOOL` as `U8` (true = blocked), float as `f32`.
fn load_mask(file: &TensorFile, name: &str, device: &Device) -> candle::Result<Option<Tensor>> {
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
}

/// Fails with the names the file does hold when a required tensor is absent.
fn require(file: &TensorFile, name: &str, what: &str) -> candle::Result<()> {
    if file.contains(name) {
        return Ok(());
    }
    let held = if file.names().is_empty() {
        "nothing".to_string()
    } else {
        file.names().join(", ")
    };
    candle::bail!(
        "{} has no '{name}' tensor ({what}); it holds: {held}",
        file.origin()
    )
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
    /// Refuse the call when attention would take the naive path (weights requested) and its
    /// scores would need more than this many bytes
    /// ([`naive_attention_bytes`]). `None`: no limit. The memory-efficient
    /// kernel is never limited: its memory grows linearly with the sequence lengths.
    pub max_attention_bytes: Option<u64>,
}

/// What to do when naive attention without weights is over the limit (kept for callers that
/// check such calls: every device now has a memory-efficient kernel, so it does not happen).
const OFF_CPU_HINT: &str =
    "without attention weights the memory-efficient kernels (any device) need no such memory";

/// The limit `attn run` applies by default: 4 GiB of naive attention scores.
pub const DEFAULT_MAX_ATTENTION_BYTES: u64 = 4 << 30;

/// Fails with a message naming the sizes when naive attention of `shape` on `device` would
/// exceed `limit` bytes; `hint` says how to avoid it.
pub fn check_attention_memory(
    shape: AttentionShape,
    device: &Device,
    dtype: DType,
    need_weights: bool,
    limit: Option<u64>,
    hint: &str,
) -> candle::Result<()> {
    let Some(limit) = limit else { return Ok(()) };
    if uses_memory_efficient_kernel(device, dtype, need_weights) {
        return Ok(());
    }
    let bytes = naive_attention_bytes(shape);
    if bytes > limit {
        candle::bail!(
            "attention over batch {} x {} heads x {} queries x {} keys would need {:.2} GiB for \
             its scores on the naive path, above the limit of {:.2} GiB; {hint}",
            shape.batch,
            shape.heads,
            shape.q_len,
            shape.k_len,
            bytes as f64 / (1u64 << 30) as f64,
            limit as f64 / (1u64 << 30) as f64
        )
    }
    Ok(())
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
    {
        // Sizes in our layout: (N, L, E) or unbatched (L, E).
        let (batch, q_len) = match query.dims() {
            [n, l, _] => (*n, *l),
            [l, _] => (1, *l),
            _ => (1, 0),
        };
        let k_len = key
            .dims()
            .get(key.rank().saturating_sub(2))
            .copied()
            .unwrap_or(0);
        let cfg = mha.config();
        let extra = usize::from(cfg.add_bias_kv) + usize::from(cfg.add_zero_attn);
        let shape = AttentionShape {
            batch,
            heads: cfg.num_heads,
            q_len,
            k_len: k_len.saturating_add(extra),
        };
        let hint = if opts.need_weights {
            "ask for no attention weights (attn run mha --no-weights) to use the memory-efficient kernel"
        } else {
            OFF_CPU_HINT
        };
        check_attention_memory(
            shape,
            query.device(),
            mha.dtype(),
            opts.need_weights,
            opts.max_attention_bytes,
            hint,
        )?;
    }
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

/// The inputs of one `nn.Transformer.forward` call, in torch's layout.
#[derive(Clone, Debug)]
pub struct TorchTransformerInputs {
    /// `(S, N, E)`, `(N, S, E)` with batch first, or `(S, E)` unbatched.
    pub src: Tensor,
    /// `(T, N, E)`, `(N, T, E)` with batch first, or `(T, E)` unbatched.
    pub tgt: Tensor,
    /// `(S, S)` or `(N * nhead, S, S)`.
    pub src_mask: Option<Tensor>,
    /// `(T, T)` or `(N * nhead, T, T)`.
    pub tgt_mask: Option<Tensor>,
    /// `(T, S)` or `(N * nhead, T, S)`.
    pub memory_mask: Option<Tensor>,
    /// `(N, S)` (`(S)` unbatched).
    pub src_key_padding_mask: Option<Tensor>,
    /// `(N, T)` (`(T)` unbatched).
    pub tgt_key_padding_mask: Option<Tensor>,
    /// `(N, S)` (`(S)` unbatched).
    pub memory_key_padding_mask: Option<Tensor>,
}

impl TorchTransformerInputs {
    /// Reads `src`, `tgt` and the optional six masks from `file`; `src`/`tgt` are converted to
    /// `dtype`, masks keep their kind.
    pub fn from_file(file: &TensorFile, dtype: DType, device: &Device) -> candle::Result<Self> {
        let what = "an attn run transformer input file holds src, tgt and optionally src_mask, tgt_mask, \
                    memory_mask, src_key_padding_mask, tgt_key_padding_mask, memory_key_padding_mask";
        require(file, "src", what)?;
        require(file, "tgt", what)?;
        let data = |name: &str| -> candle::Result<Tensor> {
            load_data(file, name, dtype, device)?
                .ok_or_else(|| candle::Error::Msg(format!("{name} vanished")))
        };
        let mask = |name: &str| load_mask(file, name, device);
        Ok(Self {
            src: data("src")?,
            tgt: data("tgt")?,
            src_mask: mask("src_mask")?,
            tgt_mask: mask("tgt_mask")?,
            memory_mask: mask("memory_mask")?,
            src_key_padding_mask: mask("src_key_padding_mask")?,
            tgt_key_padding_mask: mask("tgt_key_padding_mask")?,
            memory_key_padding_mask: mask("memory_key_padding_mask")?,
        })
    }
}

/// Runs `model` on torch-layout inputs (eval mode) and returns `output` in the layout of `tgt`.
/// `max_attention_bytes` is the limit of [`TorchMhaOptions::max_attention_bytes`], checked
/// for the encoder, decoder and cross attention. The Transformer requests no attention
/// weights, so its attention takes a memory-efficient kernel on every device (tiled on the CPU,
/// the blocked kernel elsewhere) and the limit does not bind.
pub fn run_transformer(
    model: &Transformer,
    inputs: &TorchTransformerInputs,
    batch_first: bool,
    max_attention_bytes: Option<u64>,
) -> candle::Result<Tensor> {
    let (src_rank, tgt_rank) = (inputs.src.rank(), inputs.tgt.rank());
    if src_rank != tgt_rank || !(src_rank == 2 || src_rank == 3) {
        candle::bail!(
            "src and tgt must both be (seq, N, E), (N, seq, E) with --batch-first, or unbatched (seq, E); got {:?} and {:?}",
            inputs.src.dims(),
            inputs.tgt.dims()
        )
    }
    let unbatched = src_rank == 2;
    let to_ours = |t: &Tensor| -> candle::Result<Tensor> {
        if unbatched {
            t.unsqueeze(0)
        } else if batch_first {
            Ok(t.clone())
        } else {
            t.transpose(0, 1)?.contiguous()
        }
    };
    let padding = |t: &Option<Tensor>| -> candle::Result<Option<Tensor>> {
        match t {
            Some(t) if unbatched && t.rank() == 1 => Ok(Some(t.unsqueeze(0)?)),
            t => Ok(t.clone()),
        }
    };
    let attn_mask = |t: &Option<Tensor>| -> candle::Result<Mask> {
        t.as_ref()
            .map_or(Ok(Mask::none()), |t| Mask::attn_mask(t.clone()))
    };
    let (src_kpm, tgt_kpm, mem_kpm) = (
        padding(&inputs.src_key_padding_mask)?,
        padding(&inputs.tgt_key_padding_mask)?,
        padding(&inputs.memory_key_padding_mask)?,
    );
    let masks = TransformerMasks {
        src_mask: attn_mask(&inputs.src_mask)?,
        tgt_mask: attn_mask(&inputs.tgt_mask)?,
        memory_mask: attn_mask(&inputs.memory_mask)?,
        src_key_padding_mask: src_kpm.as_ref(),
        tgt_key_padding_mask: tgt_kpm.as_ref(),
        memory_key_padding_mask: mem_kpm.as_ref(),
    };
    let (src, tgt) = (to_ours(&inputs.src)?, to_ours(&inputs.tgt)?);
    let seq = |t: &Tensor| t.dims().get(1).copied().unwrap_or(0);
    let heads = model.config().nhead;
    for (q_len, k_len) in [
        (seq(&src), seq(&src)),
        (seq(&tgt), seq(&tgt)),
        (seq(&tgt), seq(&src)),
    ] {
        let shape = AttentionShape {
            batch: src.dims().first().copied().unwrap_or(0),
            heads,
            q_len,
            k_len,
        };
        check_attention_memory(
            shape,
            src.device(),
            src.dtype(),
            false,
            max_attention_bytes,
            OFF_CPU_HINT,
        )?;
    }
    let out = model.forward(&src, &tgt, &masks, false)?;
    if unbatched {
        out.squeeze(0)
    } else if batch_first {
        Ok(out)
    } else {
        out.transpose(0, 1)?.contiguous()
    }
}

//! `attn run mha`: torch.nn.MultiheadAttention on saved tensors.

use anyhow::Context;
use attn_cli::torch_io::{run_mha, TorchMhaInputs, TorchMhaOptions};
use candle_attention::save_tensors;
use candle_attention::weights::normalize_prefix;
use candle_attention::{MhaWeightsInfo, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RunMhaArgs {
    /// The safetensors file of a torch.nn.MultiheadAttention state_dict (in_proj_weight or
    /// q/k/v_proj_weight, out_proj), or of Hugging Face q_proj / k_proj / v_proj / out_proj
    /// tensors. `attn inspect FILE` shows the blocks and layouts it recognises.
    #[arg(long, value_name = "FILE")]
    weights: PathBuf,
    /// Prefix of the block's tensor names in --weights (e.g. encoder.layers.0.self_attn; a
    /// trailing dot is optional). Default: none (the names start with in_proj / q_proj).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Number of heads H (the weights do not record it; embed_dim must be divisible by it).
    #[arg(long, value_name = "H")]
    num_heads: usize,
    /// Inputs and output are (N, L, E), as torch's batch_first=True. Default: (L, N, E).
    #[arg(long)]
    batch_first: bool,
    /// Append a zero key and value to every head, as torch's add_zero_attn=True.
    #[arg(long)]
    add_zero_attn: bool,
    /// Add a causal mask, query i seeing keys 0..=i (combined with any attn_mask), as torch's
    /// is_causal=True.
    #[arg(long)]
    causal: bool,
    /// Neither compute nor write `attn_weights` (torch's need_weights=False): the
    /// memory-efficient kernel, never refused by --max-attention-memory.
    #[arg(long, conflicts_with = "per_head_weights")]
    no_weights: bool,
    /// Write `attn_weights` per head, (N, H, L, S), as torch's average_attn_weights=False.
    /// Default: averaged over the heads, (N, L, S).
    #[arg(long)]
    per_head_weights: bool,
    /// The safetensors file of the forward() inputs: `query`, and optionally `key`, `value`
    /// (default: the query), `attn_mask` ((L, S) or (N·H, L, S)) and `key_padding_mask`
    /// ((N, S)); masks bool (true = blocked) or float (added to the scores).
    #[arg(long, value_name = "FILE")]
    inputs: PathBuf,
    /// The safetensors file to write (replaced if present): `output` in the query's layout,
    /// and `attn_weights` unless --no-weights.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    compute: crate::ComputeArgs,
}

pub fn run(args: &RunMhaArgs) -> anyhow::Result<()> {
    let device = args.compute.device.device()?;
    let dtype = args.compute.dtype.dtype();
    let weights = TensorFile::open(&args.weights)?;
    // `a.b` and torch's `a.b.` name the same block; `pp` would make `a.b..name` of the latter.
    let prefix = normalize_prefix(&args.prefix);
    let info = MhaWeightsInfo::from_file(&weights, prefix)?;
    let cfg = MultiHeadAttentionConfig::from_weights(&info, args.num_heads)
        .with_add_zero_attn(args.add_zero_attn);
    let vb = weights.var_builder(dtype, &device);
    let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
    let mha = MultiHeadAttention::load(cfg, vb)
        .with_context(|| format!("loading attention weights from {}", args.weights.display()))?;

    let inputs = TorchMhaInputs::from_file(&TensorFile::open(&args.inputs)?, dtype, &device)?;
    let opts = TorchMhaOptions {
        batch_first: args.batch_first,
        causal: args.causal,
        need_weights: !args.no_weights,
        average_weights: !args.per_head_weights,
        max_attention_bytes: crate::attention_limit(args.compute.max_attention_memory)?,
    };
    let out = run_mha(&mha, &inputs, opts).context("running multi-head attention")?;
    let mut tensors = vec![("output", &out.output)];
    if let Some(w) = &out.attn_weights {
        tensors.push(("attn_weights", w));
    }
    save_tensors(&tensors, &args.output)?;
    Ok(())
}

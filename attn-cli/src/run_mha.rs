//! `attn run mha`: torch.nn.MultiheadAttention on saved tensors.

use anyhow::Context;
use attn_cli::torch_io::{run_mha, TorchMhaInputs, TorchMhaOptions};
use candle_attention::save_tensors;
use candle_attention::weights::normalize_prefix;
use candle_attention::{MhaWeightsInfo, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RunMhaArgs {
    /// A torch.nn.MultiheadAttention state_dict (or Hugging Face q_proj/k_proj/v_proj/out_proj).
    #[arg(long)]
    weights: PathBuf,
    /// Prefix of the block's tensors in the weights file (e.g. encoder.layers.0.self_attn).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Number of heads (the weights do not record it).
    #[arg(long)]
    num_heads: usize,
    /// Inputs and output are (N, L, E) instead of (L, N, E).
    #[arg(long)]
    batch_first: bool,
    /// Append a zero key and value to every head, as torch's add_zero_attn.
    #[arg(long)]
    add_zero_attn: bool,
    /// Add a causal mask: query i sees keys 0..=i.
    #[arg(long)]
    causal: bool,
    /// Do not compute or write attn_weights.
    #[arg(long, conflicts_with = "per_head_weights")]
    no_weights: bool,
    /// Write attn_weights per head (N, H, L, S) instead of averaged (N, L, S).
    #[arg(long)]
    per_head_weights: bool,
    /// Input tensors: query, and optionally key, value, attn_mask, key_padding_mask.
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write output (and attn_weights).
    #[arg(long)]
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

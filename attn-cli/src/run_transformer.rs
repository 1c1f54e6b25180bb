//! `attn run transformer`: torch.nn.Transformer on saved tensors.

use anyhow::Context;
use attn_cli::torch_io::{run_transformer, TorchTransformerInputs};
use candle_attention::save_tensors;
use candle_attention::transformer::{Activation, Transformer, TransformerConfig};
use candle_attention::weights::normalize_prefix;
use candle_attention::TensorFile;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RunTransformerArgs {
    /// The safetensors file of a torch.nn.Transformer state_dict (encoder.layers.N...,
    /// decoder.layers.N..., the final norms); layer counts and sizes are read from it.
    #[arg(long, value_name = "FILE")]
    weights: PathBuf,
    /// Prefix of the model's tensor names in --weights (e.g. model.transformer; a trailing dot
    /// is optional). Default: none (the names start with encoder. / decoder.).
    #[arg(long, default_value = "")]
    prefix: String,
    /// Heads per attention block (the weights do not record it; d_model must be divisible by
    /// it).
    #[arg(long, value_name = "H")]
    num_heads: usize,
    /// Pre-norm layers, as torch's norm_first=True. Default: post-norm.
    #[arg(long)]
    norm_first: bool,
    /// Inputs and output are (N, seq, E), as torch's batch_first=True. Default: (seq, N, E).
    #[arg(long)]
    batch_first: bool,
    /// Feed-forward activation, as torch's activation= (relu or gelu, the exact erf form).
    #[arg(long, default_value = "relu", value_parser = ["relu", "gelu"])]
    activation: String,
    /// Epsilon of every LayerNorm, as torch's layer_norm_eps.
    #[arg(long, default_value_t = 1e-5, value_name = "EPS")]
    layer_norm_eps: f64,
    /// The safetensors file of the forward() inputs: `src` and `tgt`, and optionally
    /// `src_mask`, `tgt_mask`, `memory_mask` (bool, true = blocked, or float, added) and
    /// `src_key_padding_mask`, `tgt_key_padding_mask`, `memory_key_padding_mask`.
    #[arg(long, value_name = "FILE")]
    inputs: PathBuf,
    /// The safetensors file to write (replaced if present): `output` in the layout of `tgt`.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    compute: crate::ComputeArgs,
}

pub fn run(args: &RunTransformerArgs) -> anyhow::Result<()> {
    let device = args.compute.device.device()?;
    let dtype = args.compute.dtype.dtype();
    let weights = TensorFile::open(&args.weights)?;
    // `a.b` and torch's `a.b.` name the same block; `pp` would make `a.b..name` of the latter.
    let prefix = normalize_prefix(&args.prefix);
    let cfg = TransformerConfig {
        norm_first: args.norm_first,
        activation: args
            .activation
            .parse::<Activation>()
            .map_err(anyhow::Error::msg)?,
        layer_norm_eps: args.layer_norm_eps,
        ..TransformerConfig::from_weights(&weights, prefix, args.num_heads)?
    };
    let vb = weights.var_builder(dtype, &device);
    let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
    let model = Transformer::load(cfg, vb)
        .with_context(|| format!("loading the transformer from {}", args.weights.display()))?;
    let inputs =
        TorchTransformerInputs::from_file(&TensorFile::open(&args.inputs)?, dtype, &device)?;
    let output = run_transformer(
        &model,
        &inputs,
        args.batch_first,
        crate::attention_limit(args.compute.max_attention_memory)?,
    )
    .context("running the transformer")?;
    save_tensors(&[("output", &output)], &args.output)?;
    Ok(())
}

//! Load a `torch.nn.MultiheadAttention` checkpoint from safetensors and run causal
//! self-attention with key padding, as a user of the crate would.
//!
//! ```text
//! cargo run --release --example mha_from_safetensors [WEIGHTS] [INPUTS]
//! ```
//!
//! Defaults to `weights/mha_demo.safetensors` (exported from PyTorch by
//! `weights/make_mha_demo.py`) and `weights/mha_demo_io.safetensors`, which also holds
//! PyTorch's own answer, so the program ends by printing how far we are from it.

use anyhow::{Context, Result};
use candle::{DType, Device, D};
use candle_attention::{
    AttentionArgs, Mask, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile,
};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let weights_path = args
        .next()
        .unwrap_or_else(|| "weights/mha_demo.safetensors".into());
    let io_path = args
        .next()
        .unwrap_or_else(|| "weights/mha_demo_io.safetensors".into());
    let device = Device::Cpu;

    // 1. The checkpoint: torch's fused in_proj_weight under the prefix "self_attn".
    let weights = TensorFile::open(&weights_path)?;
    let vb = weights.var_builder(DType::F32, &device);
    let mha = MultiHeadAttention::load(MultiHeadAttentionConfig::new(64, 8), vb.pp("self_attn"))
        .with_context(|| format!("loading {weights_path}"))?;
    println!("loaded {weights_path}: {}", mha.layout().describe());

    // 2. Inputs: (batch, seq, embed) queries and a key padding mask (true = padding).
    let io = TensorFile::open(&io_path)?;
    let query = io.load("query", &device)?;
    let padding = io.load("key_padding_mask", &device)?; // torch BOOL, read as U8
    println!(
        "query {:?}, key_padding_mask {:?}",
        query.dims(),
        padding.dims()
    );

    // 3. Plain self-attention through candle's Module trait...
    let plain = mha.forward(&query)?;
    println!("Module::forward (no mask) -> {:?}", plain.dims());

    // 4. ... and the decoder's causal self-attention with padding and weights.
    let args = AttentionArgs {
        mask: Mask::causal(),
        key_padding: Some(&padding),
        need_weights: true,
        ..Default::default()
    };
    let out = mha.attend(&query, &query, &query, &args)?;
    let weights = out.weights.context("weights were requested")?;
    println!(
        "causal + padding -> output {:?}, weights {:?}",
        out.output.dims(),
        weights.dims()
    );
    let first: Vec<f32> = weights.get(1)?.get(5)?.to_vec1()?;
    println!("batch 1, query 5 attends to keys: {first:.3?} (keys 4 and 5 are padding)");

    // 5. Against PyTorch's answer for the same call.
    let expected = io.load("expected_output", &device)?;
    let expected_weights = io.load("expected_weights", &device)?;
    let max_err = |a: &candle::Tensor, b: &candle::Tensor| -> Result<f32> {
        Ok((a - b)?
            .abs()?
            .flatten_all()?
            .max(D::Minus1)?
            .to_scalar::<f32>()?)
    };
    println!(
        "max |ours - torch|: output {:.2e}, weights {:.2e}",
        max_err(&out.output, &expected)?,
        max_err(&weights, &expected_weights)?
    );
    Ok(())
}

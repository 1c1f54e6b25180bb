//! `attn run marian` and `attn generate`: a Hugging Face MarianMT directory on saved ids.

use anyhow::Context;
use candle::{DType, Device, Tensor};
use candle_attention::marian::MarianMTModel;
use candle_attention::torch_io::save_tensors;
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct RunMarianArgs {
    /// A MarianMT directory: config.json and model.safetensors or pytorch_model.bin.
    #[arg(long)]
    model: PathBuf,
    /// int64 `input_ids` and `attention_mask` (B, S), 1 = token, and `decoder_input_ids` (B, T).
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write f32 `logits` (B, T, V) and `encoder_last_hidden_state` (B, S, E).
    #[arg(long)]
    output: PathBuf,
}

/// Loads the model, with the directory in the error.
pub fn load_model(dir: &Path, device: &Device) -> anyhow::Result<MarianMTModel> {
    MarianMTModel::from_dir(dir, device)
        .with_context(|| format!("loading the MarianMT model in {}", dir.display()))
}

/// Reads the integer tensor `name` `(B, S)` of `file` as `U32` on `device`: ids and masks
/// must be non-negative.
pub fn read_ids(file: &TensorFile, name: &str, device: &Device) -> anyhow::Result<Tensor> {
    let t = file
        .load(name, device)
        .with_context(|| format!("reading '{name}' from {}", file.origin()))?;
    if t.dtype().is_float() {
        anyhow::bail!(
            "'{name}' in {} must be integer ids (int64), got {:?}",
            file.origin(),
            t.dtype()
        )
    }
    if t.rank() != 2 {
        anyhow::bail!(
            "'{name}' in {} must be (batch, seq), got shape {:?}",
            file.origin(),
            t.dims()
        )
    }
    if t.elem_count() > 0 {
        let min = t.to_dtype(DType::I64)?.flatten_all()?.min(0)?.to_scalar::<i64>()?;
        if min < 0 {
            anyhow::bail!("'{name}' in {} holds a negative value ({min})", file.origin())
        }
    }
    Ok(t.to_dtype(DType::U32)?)
}

pub fn run(args: &RunMarianArgs) -> anyhow::Result<()> {
    let device = Device::Cpu;
    let model = load_model(&args.model, &device)?;
    let inputs = TensorFile::open(&args.inputs)?;
    let input_ids = read_ids(&inputs, "input_ids", &device)?;
    let attention_mask = read_ids(&inputs, "attention_mask", &device)?;
    let decoder_input_ids = read_ids(&inputs, "decoder_input_ids", &device)?;
    let (logits, encoder_out) = model
        .forward(&input_ids, &attention_mask, &decoder_input_ids)
        .context("running the MarianMT model")?;
    save_tensors(
        &[
            ("logits", &logits.to_dtype(DType::F32)?),
            ("encoder_last_hidden_state", &encoder_out.to_dtype(DType::F32)?),
        ],
        &args.output,
    )?;
    Ok(())
}

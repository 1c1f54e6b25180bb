//! `attn run marian` and `attn run seq2seq`: one forward pass of a Hugging Face
//! encoder-decoder directory on saved ids, `model(input_ids, attention_mask,
//! decoder_input_ids)` as transformers computes it, written as logits and encoder states.

use crate::model_args::{load_marian, AnyModel, PrecisionArgs};
use anyhow::Context;
use candle::{DType, Device, Tensor};
use candle_attention::models::encoder_decoder::EncoderDecoderModel;
use candle_attention::save_tensors;
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};

/// What `run marian` and `run seq2seq` share: the ids in, the outputs out, where and how.
#[derive(clap::Args, Debug)]
pub struct ForwardArgs {
    /// A safetensors file with int64 `input_ids` and `attention_mask` (B, S; 1 = token, 0 =
    /// padding) and `decoder_input_ids` (B, T), as transformers' tokenizer returns them.
    #[arg(long, value_name = "FILE")]
    inputs: PathBuf,
    /// The safetensors file to write (replaced if present): f32 `logits` (B, T, V) and
    /// `encoder_last_hidden_state` (B, S, d_model).
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    /// Where to compute: cpu, cuda or metal (the GPU ones need a build with that cargo
    /// feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
    #[command(flatten)]
    precision: PrecisionArgs,
}

#[derive(clap::Args, Debug)]
pub struct RunMarianArgs {
    /// A MarianMT directory (config.json's model_type marian): config.json and
    /// model.safetensors or pytorch_model.bin.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    forward: ForwardArgs,
}

#[derive(clap::Args, Debug)]
pub struct RunSeq2SeqArgs {
    /// A Hugging Face encoder-decoder directory (config.json's model_type: marian, m2m_100 for
    /// M2M100 and NLLB-200, or mbart) with model.safetensors or pytorch_model.bin.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    #[command(flatten)]
    forward: ForwardArgs,
}

/// `attn run marian`: a MarianMT directory (refusing any other family).
pub fn run_marian(args: &RunMarianArgs) -> anyhow::Result<()> {
    let device = args.forward.device.device()?;
    let dir = crate::model_source::resolve_model(&args.model)?;
    let model = load_marian(&dir, &device, args.forward.precision.precision())?;
    forward_to_file(
        &model,
        "MarianMT",
        &args.forward.inputs,
        &args.forward.output,
        &device,
    )
}

/// `attn run seq2seq`: `model(input_ids, attention_mask, decoder_input_ids)` of any supported
/// family, as `attn run marian` does for MarianMT.
pub fn run_seq2seq(args: &RunSeq2SeqArgs) -> anyhow::Result<()> {
    let device = args.forward.device.device()?;
    let dir = crate::model_source::resolve_model(&args.model)?;
    let model = AnyModel::load(&dir, &device, args.forward.precision.precision())?;
    forward_to_file(
        model.model(),
        model.family_name(),
        &args.forward.inputs,
        &args.forward.output,
        &device,
    )
}

/// `model(input_ids, attention_mask, decoder_input_ids)` on the int64 tensors of `inputs`
/// (`(B, S)`, `(B, S)`, `(B, T)`), written to `output` as f32 `logits` `(B, T, V)` and
/// `encoder_last_hidden_state` `(B, S, E)`.
pub fn forward_to_file(
    model: &EncoderDecoderModel,
    family: &str,
    inputs: &Path,
    output: &Path,
    device: &Device,
) -> anyhow::Result<()> {
    let inputs = TensorFile::open(inputs)?;
    let input_ids = read_ids(&inputs, "input_ids", device)?;
    let attention_mask = read_ids(&inputs, "attention_mask", device)?;
    let decoder_input_ids = read_ids(&inputs, "decoder_input_ids", device)?;
    let (logits, encoder_out) = model
        .forward(&input_ids, &attention_mask, &decoder_input_ids)
        .with_context(|| format!("running the {family} model"))?;
    save_tensors(
        &[
            ("logits", &logits.to_dtype(DType::F32)?),
            (
                "encoder_last_hidden_state",
                &encoder_out.to_dtype(DType::F32)?,
            ),
        ],
        output,
    )?;
    Ok(())
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
    if t.dim(1)? == 0 {
        anyhow::bail!(
            "'{name}' in {} has no tokens (shape {:?}): transformers refuses an empty input",
            file.origin(),
            t.dims()
        )
    }
    if t.elem_count() > 0 {
        // Checked as int64 before narrowing: 2^32 + 18 must not become 18.
        let flat = t.to_dtype(DType::I64)?.flatten_all()?;
        let (min, max) = (
            flat.min(0)?.to_scalar::<i64>()?,
            flat.max(0)?.to_scalar::<i64>()?,
        );
        if min < 0 {
            anyhow::bail!(
                "'{name}' in {} holds a negative value ({min})",
                file.origin()
            )
        }
        if max > u32::MAX as i64 {
            anyhow::bail!(
                "'{name}' in {} holds {max}, beyond any vocabulary (at most {})",
                file.origin(),
                u32::MAX
            )
        }
    }
    Ok(t.to_dtype(DType::U32)?)
}

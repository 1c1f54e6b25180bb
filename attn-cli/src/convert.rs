//! `attn convert --model DIR --output DIR2 --quantize int8|bf16`: a model directory in a lower
//! precision that loads in place ([`candle_attention::models::convert`]).

use anyhow::Context;
use candle_attention::models::convert::{convert_dir, ConvertTo};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// The Hugging Face encoder-decoder directory to convert (MarianMT, M2M100 / NLLB-200,
    /// mBART), with model.safetensors or pytorch_model.bin in f32, f16 or bf16. It is only
    /// read.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// The directory to write (created if missing): model.safetensors and copies of the other
    /// files (config.json, generation_config.json, the tokenizer files).
    #[arg(long, value_name = "DIR")]
    output: PathBuf,
    /// The precision to write (required).
    #[arg(long, value_enum)]
    quantize: ConvertArg,
    /// Replace the model.safetensors --output already holds. Default: refuse to.
    #[arg(long)]
    force: bool,
}

/// `--quantize` values of `attn convert`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ConvertArg {
    /// Weight matrices in int8 with one scale per row (a quarter of the f32 bytes), the other
    /// tensors as stored; read in place by attn only, and run in int8 without --quantize.
    Int8,
    /// Every float tensor in bf16 (half the f32 bytes): an ordinary checkpoint any loader
    /// reads; run it with --dtype bf16.
    Bf16,
}

pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let to = match args.quantize {
        ConvertArg::Int8 => ConvertTo::Int8,
        ConvertArg::Bf16 => ConvertTo::Bf16,
    };
    let model = crate::model_source::resolve_model(&args.model)?;
    let report = convert_dir(&model, &args.output, to, args.force).with_context(|| {
        format!(
            "converting {} to {} in {}",
            args.model.display(),
            to.name(),
            args.output.display()
        )
    })?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "{}: {} tensors ({} matrices int8), {:.1} MiB (from {:.1} MiB){}{}; copied {}",
        args.output.join("model.safetensors").display(),
        report.tensors,
        report.quantized,
        mib(report.bytes_out),
        mib(report.bytes_in),
        if report.dropped.is_empty() {
            String::new()
        } else {
            format!("; left out the unread copies {}", report.dropped.join(", "))
        },
        if report.already {
            format!("; the model was {} already", to.name())
        } else {
            String::new()
        },
        if report.copied.is_empty() {
            "nothing else".to_string()
        } else {
            report.copied.join(", ")
        }
    );
    Ok(())
}

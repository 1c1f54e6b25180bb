//! `attn convert --model DIR --output DIR2 --quantize int8|bf16`: a model directory in a lower
//! precision that loads in place ([`candle_attention::models::convert`]).

use anyhow::Context;
use candle_attention::models::convert::{convert_dir, ConvertTo};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// A Hugging Face encoder-decoder directory (MarianMT, M2M100 / NLLB-200, mBART) with
    /// model.safetensors or pytorch_model.bin (f32, f16 or bf16).
    #[arg(long)]
    model: PathBuf,
    /// The directory to write (created if missing): model.safetensors and copies of the other
    /// files (config, generation config, tokenizer).
    #[arg(long)]
    output: PathBuf,
    /// int8: weight matrices quantized (a scale per row; a quarter of the f32 bytes; read in
    /// place, for attn only; runs int8 without --quantize). bf16: every float tensor in bf16
    /// (half the f32 bytes; an ordinary checkpoint; run it with --dtype bf16).
    #[arg(long, value_enum)]
    quantize: ConvertArg,
    /// Replace the weights --output already holds.
    #[arg(long)]
    force: bool,
}

/// `--quantize` values of `attn convert`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ConvertArg {
    Int8,
    Bf16,
}

pub fn run(args: &ConvertArgs) -> anyhow::Result<()> {
    let to = match args.quantize {
        ConvertArg::Int8 => ConvertTo::Int8,
        ConvertArg::Bf16 => ConvertTo::Bf16,
    };
    let report = convert_dir(&args.model, &args.output, to, args.force).with_context(|| {
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

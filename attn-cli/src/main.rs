//! `attn`: the command-line face of candle-attention. Thin: parses, calls the library, prints.
//! Errors go to stderr with a non-zero exit code, never a panic.

mod bench;
mod bench_decode;
mod bulk;
mod convert;
mod explain;
mod inspect;
mod marian;
mod model_source;
mod pool;
mod pretrained;
mod run_mha;
mod run_transformer;
mod train;
mod translate;

use clap::{Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "attn",
    version,
    long_version = long_version(),
    about = "Attention Is All You Need, on candle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `attn --version`: the version, then what this CPU offers the kernels and the level they run
/// at (`ATTN_CPU_ISA=portable|avx2|avx512` lowers it). Built once per process (clap wants a
/// `'static` string).
fn long_version() -> &'static str {
    let text = format!(
        "{}\n{}",
        env!("CARGO_PKG_VERSION"),
        candle_attention::cpu::describe_cpu()
    );
    Box::leak(text.into_boxed_str())
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a block on tensors saved from PyTorch and write its outputs.
    #[command(subcommand)]
    Run(RunCommand),
    /// List the tensors of a safetensors file, the parameter count and the detected layout;
    /// or describe a Hugging Face model directory (MarianMT, M2M100 / NLLB-200, mBART).
    Inspect(inspect::InspectArgs),
    /// Generate with a Hugging Face MarianMT, M2M100 / NLLB-200 or mBART directory on saved
    /// ids, as transformers' generate() does (greedy or beam search; defaults from
    /// generation_config.json).
    Generate(marian::GenerateArgs),
    /// Time attention kernels, multi-head attention and decoding on random inputs.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Train the English -> German number translator (progress bar; resumable).
    Train(train::TrainArgs),
    /// Translate English number words into German (arguments, or lines on stdin).
    Translate(translate::TranslateArgs),
    /// One attention block of a model on a text, step by step: Q·Kᵀ, ÷√d_k, mask, softmax,
    /// blend, heads; why √d_k, measured; every matrix with --json.
    Explain(explain::ExplainArgs),
    /// Rewrite a Hugging Face model directory in int8 or bf16, to load in place.
    Convert(convert::ConvertArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// scaled_dot_product_attention kernels on (B, H, N, D) inputs.
    Attention(bench::AttentionBenchArgs),
    /// MultiHeadAttention(E, H) self-attention forward (eval, no weights).
    Mha(bench::MhaBenchArgs),
    /// Autoregressive decoding: KV cache against recomputing the prefix.
    Decode(bench_decode::DecodeBenchArgs),
}

#[derive(Subcommand, Debug)]
enum RunCommand {
    /// torch.nn.MultiheadAttention: weights from its state_dict, inputs in torch's layout.
    Mha(run_mha::RunMhaArgs),
    /// torch.nn.Transformer: weights from its state_dict, inputs in torch's layout.
    Transformer(run_transformer::RunTransformerArgs),
    /// A Hugging Face MarianMT directory: logits and encoder states for saved ids.
    Marian(marian::RunMarianArgs),
    /// Any supported Hugging Face encoder-decoder directory (MarianMT, M2M100 / NLLB-200,
    /// mBART; detected from config.json's model_type): logits and encoder states for saved ids.
    Seq2seq(pretrained::RunSeq2SeqArgs),
}

/// Where to compute.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
    Metal,
}

impl DeviceArg {
    /// The device (ordinal 0), or an error naming the cargo feature when this build lacks the
    /// backend.
    pub fn device(self) -> anyhow::Result<candle::Device> {
        let name = match self {
            DeviceArg::Cpu => "cpu",
            DeviceArg::Cuda => "cuda",
            DeviceArg::Metal => "metal",
        };
        Ok(candle_attention::device_from_name(name)?)
    }
}

/// The compute dtype.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DTypeArg {
    F32,
    F16,
    Bf16,
}

impl DTypeArg {
    pub fn dtype(self) -> candle::DType {
        match self {
            DTypeArg::F32 => candle::DType::F32,
            DTypeArg::F16 => candle::DType::F16,
            DTypeArg::Bf16 => candle::DType::BF16,
        }
    }
}

/// Decoding allocates and frees buffers of a few MB every step (logits, caches). glibc hands
/// such blocks back to the kernel on free, and first-touching fresh pages costs about 1 ms per MB
/// on this kind of machine: 5–10% of a beam-search step. Keep freed memory for reuse instead
/// (blocks up to 32 MiB from the heap, no trimming); peak RSS is unchanged.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any thread starts
    // and before anything is allocated through the settings it changes.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

/// `attn ... | head` closes the pipe early: end quietly, as Unix tools do, instead of the panic
/// Rust's `print!` raises on a closed stdout (Rust ignores SIGPIPE by default).
fn die_quietly_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // candle attaches a backtrace to its errors when RUST_BACKTRACE is set; a user-facing error
    // message should not carry one. (Set before any thread starts.)
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    keep_freed_memory();
    die_quietly_on_closed_pipe();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(RunCommand::Mha(args)) => run_mha::run(&args),
        Command::Run(RunCommand::Transformer(args)) => run_transformer::run(&args),
        Command::Run(RunCommand::Marian(args)) => marian::run(&args),
        Command::Run(RunCommand::Seq2seq(args)) => pretrained::run(&args),
        Command::Generate(args) => marian::generate(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Bench(BenchCommand::Attention(args)) => bench::attention(&args),
        Command::Bench(BenchCommand::Mha(args)) => bench::mha(&args),
        Command::Bench(BenchCommand::Decode(args)) => bench_decode::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Translate(args) => translate::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Convert(args) => convert::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Where and in what dtype `attn run mha` and `attn run transformer` compute, and how much
/// memory the naive attention path may take.
#[derive(clap::Args, Debug)]
pub struct ComputeArgs {
    /// Where to compute.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Refuse to run when attention would take the naive path (attention weights requested)
    /// and its scores would need more than this many GiB; 0 for no limit.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTENTION_GIB, value_name = "GIB")]
    pub max_attention_memory: f64,
    /// Compute dtype: inputs and weights are converted, outputs written in it.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

/// Default of `--max-attention-memory`: the library's `DEFAULT_MAX_ATTENTION_BYTES` in GiB.
pub const DEFAULT_MAX_ATTENTION_GIB: f64 =
    attn_cli::torch_io::DEFAULT_MAX_ATTENTION_BYTES as f64 / (1u64 << 30) as f64;

/// `--max-attention-memory` in bytes (`None` for 0: no limit).
pub fn attention_limit(gib: f64) -> anyhow::Result<Option<u64>> {
    if !gib.is_finite() || gib < 0.0 {
        anyhow::bail!("--max-attention-memory must be a non-negative number of GiB, got {gib}")
    }
    Ok((gib > 0.0).then_some((gib * (1u64 << 30) as f64) as u64))
}

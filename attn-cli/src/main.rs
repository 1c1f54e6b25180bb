//! `attn`: the command-line face of candle-attention. Thin: parses, calls the library, prints.
//! Errors go to stderr with a non-zero exit code, never a panic.

mod bench;
mod bench_decode;
mod bulk;
mod completions;
mod convert;
mod explain;
mod generate;
mod inspect;
mod model_args;
mod model_source;
mod pool;
mod run_mha;
mod run_seq2seq;
mod run_transformer;
mod serve_cmd;
mod train;
mod translate;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "attn",
    version,
    long_version = long_version(),
    about = "Attention Is All You Need, on candle",
    long_about = LONG_ABOUT,
    after_help = "Run `attn COMMAND --help` for a command's options; `attn man` prints the \
                  manual page.",
    after_long_help = EXAMPLES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `attn --help`: what the command does, before the list of commands.
const LONG_ABOUT: &str = "\
Attention Is All You Need, on candle: the transformer's attention and the models built on it, \
from the command line.

attn runs PyTorch's nn.MultiheadAttention and nn.Transformer on tensors saved from torch, and \
Hugging Face translation models (MarianMT / opus-mt, M2M100, NLLB-200, mBART-50) on saved ids \
or on text; it inspects safetensors files, torch checkpoints and model directories, times the \
attention kernels, trains and runs the small English -> German number translator it ships \
with, and explains one attention head step by step.

Tensors are read from and written to .safetensors files; models are Hugging Face directories \
(config.json and model.safetensors or pytorch_model.bin). Errors go to standard error with a \
non-zero exit status.";

/// `attn --help`: examples, after the options.
const EXAMPLES: &str = "\
Examples:
  attn translate \"three hundred and twelve\"
      English number words to German with the built-in model
  attn translate --model opus-mt-en-de --beam 4 < input.txt > output.txt
      a Hugging Face MarianMT directory, one text per line
  attn translate --model nllb-200-distilled-600M --source-lang eng_Latn --target-lang deu_Latn \"Hello\"
      a multilingual model (`attn inspect DIR` lists its languages)
  attn inspect opus-mt-en-de
      what a model directory, safetensors file or torch checkpoint holds
  attn bench attention --seq-q 1024 --seq-k 1024
      time the attention kernels
  attn completions bash > ~/.local/share/bash-completion/completions/attn
      install tab completion (bash; also zsh, fish, powershell, elvish)

Run `attn COMMAND --help` for a command's options; `attn man --output DIR` writes the manual \
pages.";

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
    /// Run a PyTorch block or a Hugging Face model on saved tensors and write its outputs.
    ///
    /// Inputs and outputs are safetensors files in torch's layouts (written and read in Python
    /// with safetensors.torch), computed as torch / transformers compute them.
    #[command(subcommand)]
    Run(RunCommand),
    /// Describe a safetensors file, a torch checkpoint or a Hugging Face model directory.
    ///
    /// A file: its tensors (name, dtype, shape), the parameter count and the attention layout
    /// recognised (torch's MultiheadAttention, Hugging Face q/k/v projections). A directory
    /// (MarianMT, M2M100 / NLLB-200, mBART): the family, layer sizes, vocabulary, special
    /// ids, weights and, for the multilingual families, the language codes --source-lang and
    /// --target-lang of `attn translate` take.
    Inspect(inspect::InspectArgs),
    /// Generate token ids with a Hugging Face translation model on saved ids, as
    /// transformers' generate() does.
    ///
    /// Greedy or beam search with the settings of the directory's generation_config.json (or
    /// config.json), which the options override; writes the sequences transformers returns,
    /// token for token. To translate text, use `attn translate --model DIR`.
    Generate(generate::GenerateArgs),
    /// Time the attention kernels, multi-head attention or decoding on random inputs.
    ///
    /// Threads: rayon's pool (RAYON_NUM_THREADS). Every result names the instruction set the
    /// kernels ran at; ATTN_CPU_ISA=portable|avx2|avx512 lowers it.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Train the English -> German number translator (resumable; progress bar).
    ///
    /// The small Transformer that `attn translate` ships with, trained from scratch on the
    /// numbers 0 to 999,999 in words. Checkpoints go to --out and a stopped run resumes from
    /// them; then `attn translate --weights DIR TEXT` uses the result.
    Train(train::TrainArgs),
    /// Translate English number words into German, or any text with a Hugging Face model.
    ///
    /// The built-in number translator by default; --model DIR translates with a MarianMT
    /// (opus-mt), NLLB-200, M2M100 or mBART-50 directory (the multilingual ones with
    /// --source-lang and --target-lang). Texts come from the arguments, else one per line from
    /// standard input; translations go to standard output, one per line in input order. With
    /// --model also from --input FILE, to --output FILE, and as JSON lines (--format jsonl).
    Translate(translate::TranslateArgs),
    /// Explain one attention head of a model on a text, step by step.
    ///
    /// Q·Kᵀ, ÷√d_k, mask, softmax, the blend of values and the heads, and why √d_k
    /// (measured); every matrix of every head with --json, the figure with --svg / --png.
    Explain(explain::ExplainArgs),
    /// Rewrite a Hugging Face model directory in int8 or bf16, to load in place.
    ///
    /// The result loads like the original (--model DIR2): an int8 directory runs int8 without
    /// --quantize, a bf16 one is an ordinary checkpoint (run it with --dtype bf16).
    Convert(convert::ConvertArgs),
    /// Serve translations over HTTP with LibreTranslate's API (Mastodon, Discourse, Weblate and
    /// LibreTranslate's other clients work unchanged), batching across requests.
    Serve(serve_cmd::ServeArgs),
    /// Print the tab-completion script of attn for a shell to standard output.
    Completions(completions::CompletionsArgs),
    /// Print the manual page of attn (roff) to standard output, or write one page per command
    /// into a directory.
    Man(completions::ManArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Time scaled_dot_product_attention kernels on random (B, H, N, D) inputs.
    Attention(bench::AttentionBenchArgs),
    /// Time a MultiHeadAttention(E, H) self-attention forward on random inputs (eval mode,
    /// no attention weights returned).
    Mha(bench::MhaBenchArgs),
    /// Time autoregressive decoding of a random model: KV cache against recomputing the
    /// prefix at every step.
    Decode(bench_decode::DecodeBenchArgs),
}

#[derive(Subcommand, Debug)]
enum RunCommand {
    /// torch.nn.MultiheadAttention on saved tensors: its state_dict and forward() inputs in,
    /// `output` and `attn_weights` out.
    Mha(run_mha::RunMhaArgs),
    /// torch.nn.Transformer on saved tensors: its state_dict, `src`, `tgt` and masks in,
    /// `output` out (eval mode).
    Transformer(run_transformer::RunTransformerArgs),
    /// A Hugging Face MarianMT directory on saved ids: logits and encoder states, as
    /// transformers' MarianMTModel returns them.
    Marian(run_seq2seq::RunMarianArgs),
    /// Any supported Hugging Face encoder-decoder directory on saved ids (MarianMT, M2M100 /
    /// NLLB-200, mBART; the family from config.json's model_type): logits and encoder states.
    Seq2seq(run_seq2seq::RunSeq2SeqArgs),
}

/// Where to compute.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DeviceArg {
    /// The CPU (every build).
    Cpu,
    /// The first NVIDIA GPU (a build with the cargo feature cuda).
    Cuda,
    /// The first Apple GPU (a build with the cargo feature metal).
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
    /// 32-bit float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 16-bit bfloat (f32's range, 8 bits of mantissa).
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
///
/// One heap for every thread: a step's tensors are allocated on whichever pool thread runs
/// the call that makes them (the three self-attention projections and the cohorts' attention
/// run side by side), and glibc gives each such thread an arena of its own, which, untrimmed,
/// keeps its own high-water mark. Under a 128-client serving load that took the peak from
/// 1.17× to 1.25× the resident set at rest (+27 MB, `examples/continuous_load`); with one
/// arena it is 1.17× again, at the same speed.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before any thread starts
    // and before anything is allocated through the settings it changes.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
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
        Command::Run(RunCommand::Marian(args)) => run_seq2seq::run_marian(&args),
        Command::Run(RunCommand::Seq2seq(args)) => run_seq2seq::run_seq2seq(&args),
        Command::Generate(args) => generate::generate(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Bench(BenchCommand::Attention(args)) => bench::attention(&args),
        Command::Bench(BenchCommand::Mha(args)) => bench::mha(&args),
        Command::Bench(BenchCommand::Decode(args)) => bench_decode::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Translate(args) => translate::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Serve(args) => serve_cmd::run(&args),
        Command::Completions(args) => completions::completions(&args, Cli::command()),
        Command::Man(args) => completions::man(&args, Cli::command()),
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
    /// Where to compute: cpu, or cuda / metal in a build with that cargo feature.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Memory limit of the naive attention path, in GiB: refuse to run when attention weights
    /// are written (the naive path) and their (B, H, L, S) scores would need more than this;
    /// 0 for no limit. Without weights attention runs in memory linear in the lengths and is
    /// never refused.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTENTION_GIB, value_name = "GIB")]
    pub max_attention_memory: f64,
    /// Compute dtype: inputs and weights are converted to it and the outputs are written in
    /// it (masks keep their kind).
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

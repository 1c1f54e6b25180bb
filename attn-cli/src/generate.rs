//! `attn generate`: transformers' `generate()` with a Hugging Face encoder-decoder directory
//! on saved ids, and the generation settings every decoding command shares
//! ([`generation_config`], [`with_overrides`], [`check_generation_limits`]).

use crate::model_args::{AnyModel, PrecisionArgs};
use crate::pool::on_rayon_pool;
use crate::run_seq2seq::read_ids;
use anyhow::Context;
use candle::Tensor;
use candle_attention::generation::{generate_padded, GenerationConfig};
use candle_attention::models::encoder_decoder::EncoderDecoderModel;
use candle_attention::models::seq2seq::Family;
use candle_attention::save_tensors;
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A Hugging Face encoder-decoder directory (config.json's model_type: marian, m2m_100 for
    /// M2M100 and NLLB-200, or mbart): config.json, optional generation_config.json, and
    /// model.safetensors or pytorch_model.bin.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// A safetensors file with int64 `input_ids` and `attention_mask` (B, S; 1 = token, 0 =
    /// padding), as transformers' tokenizer returns them.
    #[arg(long, value_name = "FILE")]
    inputs: PathBuf,
    /// The safetensors file to write (replaced if present): int64 `sequences` (B, T'), the
    /// decoder start token first, padded with pad_token_id, exactly as transformers'
    /// generate() returns them.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    /// Beam width: 1 for greedy search, more for beam search. Default: num_beams of
    /// generation_config.json (else config.json, else 1).
    #[arg(long, value_name = "N")]
    beams: Option<usize>,
    /// Most tokens to generate after the decoder start (wins over max_length). Default: the
    /// directory's max_new_tokens, else its max_length - 1, else 20; at most
    /// max_position_embeddings - 1.
    #[arg(long, value_name = "N")]
    max_new_tokens: Option<usize>,
    /// Fewest tokens to generate before end-of-sequence may come. Default: the directory's
    /// min_new_tokens / min_length, else 0.
    #[arg(long, value_name = "N")]
    min_new_tokens: Option<usize>,
    /// The token forced first after the decoder start (the target language's id for NLLB,
    /// M2M100, mBART-50; `attn inspect DIR` shows the default). Default: forced_bos_token_id
    /// of generation_config.json (else config.json), else none.
    #[arg(long, value_name = "ID")]
    forced_bos_token_id: Option<u32>,
    /// Where to compute: cpu, or cuda / metal in a build with that cargo feature.
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
    #[command(flatten)]
    precision: PrecisionArgs,
}

/// Refuses at once what the model cannot do with these settings (instead of minutes of work
/// and an error at the end): more beams than the vocabulary has tokens, a `max_new_tokens`
/// past the model's positions.
pub fn check_generation_limits(
    model: &EncoderDecoderModel,
    cfg: &GenerationConfig,
) -> anyhow::Result<()> {
    let (beams, _) = cfg.search_size()?;
    let vocab = model.spec().target_vocab_size;
    if beams > vocab {
        anyhow::bail!("{beams} beams are more than the model's {vocab} tokens (--beam / --beams)")
    }
    if let Some(id) = cfg.forced_bos_token_id {
        if id as usize >= vocab {
            anyhow::bail!(
                "forced_bos_token_id {id} is outside the model's vocabulary of {vocab} tokens \
                 (--forced-bos-token-id / generation_config.json)"
            )
        }
    }
    let positions = model.spec().max_position_embeddings;
    if let Some(n) = cfg.max_new_tokens {
        if n + 1 > positions {
            anyhow::bail!(
                "--max-new-tokens {n} runs past the model's max_position_embeddings ({positions}): \
                 at most {} new tokens",
                positions.saturating_sub(1)
            )
        }
    }
    Ok(())
}

/// The generation settings of `dir` with the command line's overrides.
pub fn generation_config(
    dir: &Path,
    beams: Option<usize>,
    max_new_tokens: Option<usize>,
    min_new_tokens: Option<usize>,
) -> anyhow::Result<GenerationConfig> {
    let cfg = GenerationConfig::from_model_dir(dir)
        .with_context(|| format!("reading the generation settings of {}", dir.display()))?;
    with_overrides(cfg, beams, max_new_tokens, min_new_tokens)
}

/// `cfg` with the command line's overrides (`--beam(s)`, `--max-new-tokens`,
/// `--min-new-tokens`), each checked.
pub fn with_overrides(
    mut cfg: GenerationConfig,
    beams: Option<usize>,
    max_new_tokens: Option<usize>,
    min_new_tokens: Option<usize>,
) -> anyhow::Result<GenerationConfig> {
    if let Some(b) = beams {
        if b == 0 {
            anyhow::bail!("--beams must be at least 1")
        }
        cfg = cfg.with_num_beams(b);
    }
    if let Some(t) = max_new_tokens {
        if t == 0 {
            anyhow::bail!("--max-new-tokens must be at least 1")
        }
        cfg = cfg.with_max_new_tokens(t);
    }
    if let Some(t) = min_new_tokens {
        cfg = cfg.with_min_new_tokens(t);
    }
    Ok(cfg)
}

pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let device = args.device.device()?;
    let dir = crate::model_source::resolve_model(&args.model)?;
    // A directory that is none (missing, no config.json, another model_type) is said so first,
    // before its generation settings are looked for.
    Family::of_dir(&dir)?;
    let mut cfg = generation_config(&dir, args.beams, args.max_new_tokens, args.min_new_tokens)?;
    if let Some(id) = args.forced_bos_token_id {
        cfg.forced_bos_token_id = Some(id);
    }
    let (ids, shape) = on_rayon_pool(|| -> anyhow::Result<_> {
        let model = AnyModel::load(&dir, &device, args.precision.precision())?;
        if let AnyModel::Family(m) = &model {
            // The family config's special ids where the directory has no
            // generation_config.json (transformers builds it from the config object).
            if !dir.join("generation_config.json").is_file() {
                m.config().fill_generation_ids(&mut cfg);
            }
        }
        let model = model.model();
        check_generation_limits(model, &cfg)?;
        let inputs = TensorFile::open(&args.inputs)?;
        let input_ids = read_ids(&inputs, "input_ids", &device)?;
        let attention_mask = read_ids(&inputs, "attention_mask", &device)?;
        let (batch, source_len) = input_ids.dims2()?;
        let (beams, max_length) = cfg.search_size()?;
        model.check_generation_memory(batch, beams, source_len, max_length)?;
        let state = model
            .start(&input_ids, &attention_mask)
            .context("encoding the inputs")?;
        generate_padded(model, state, batch, &cfg).context("generating")
    })?;
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
    let sequences = Tensor::from_vec(ids, shape, &device)?;
    save_tensors(&[("sequences", &sequences)], &args.output)?;
    Ok(())
}

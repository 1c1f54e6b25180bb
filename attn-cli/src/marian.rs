//! `attn run marian` and `attn generate`: a Hugging Face MarianMT directory on saved ids.

use crate::pool::on_rayon_pool;
use anyhow::Context;
use candle::{DType, Device, Tensor};
use candle_attention::generation::{generate_padded, GenerationConfig};
use candle_attention::marian::MarianMTModel;
use candle_attention::models::encoder_decoder::EncoderDecoderModel;
use candle_attention::save_tensors;
use candle_attention::weights::Precision;
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
    /// Where to compute: cpu, cuda or metal (the GPU ones need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
    #[command(flatten)]
    precision: crate::pretrained::PrecisionArgs,
}

/// Loads the model, with the directory in the error.
pub fn load_model(
    dir: &Path,
    device: &Device,
    precision: Precision,
) -> anyhow::Result<MarianMTModel> {
    MarianMTModel::from_dir_with(dir, precision, device)
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

pub fn run(args: &RunMarianArgs) -> anyhow::Result<()> {
    let device = args.device.device()?;
    let model = load_model(&args.model, &device, args.precision.precision())?;
    forward_to_file(&model, "MarianMT", &args.inputs, &args.output, &device)
}

/// `model(input_ids, attention_mask, decoder_input_ids)` on the int64 tensors of `inputs`
/// (`(B, S)`, `(B, S)`, `(B, T)`), written to `output` as f32 `logits` `(B, T, V)` and
/// `encoder_last_hidden_state` `(B, S, E)`: `attn run marian` and `attn run seq2seq`.
pub fn forward_to_file(
    model: &EncoderDecoderModel,
    family: &str,
    inputs: &Path,
    output: &Path,
    device: &candle::Device,
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

/// `attn inspect DIR`: a MarianMT directory's config, weights and parameter count.
pub fn inspect_dir(dir: &Path, json: bool) -> anyhow::Result<()> {
    use candle_attention::marian::MarianConfig;
    use candle_attention::models::checkpoint::Checkpoint;
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        anyhow::bail!(
            "{} is a directory without config.json: not a Hugging Face model directory",
            dir.display()
        )
    }
    let cfg = MarianConfig::load(&config_path)?;
    let weights = Checkpoint::open_dir(dir)?;
    let parameters = weights.parameter_count();
    let stored = weights
        .stored_dtype()
        .map_or("unknown".to_string(), |d| format!("{d:?}").to_lowercase());
    let tokenizer: Vec<&str> = ["source.spm", "target.spm", "vocab.json"]
        .into_iter()
        .filter(|f| dir.join(f).is_file())
        .collect();
    let generation = dir.join("generation_config.json").is_file();
    if json {
        let out = serde_json::json!({
            "directory": dir.display().to_string(),
            "model_type": "marian",
            "weights": weights.origin(),
            "stored_dtype": stored,
            "parameters": parameters,
            "tensors": weights.names().len(),
            "d_model": cfg.d_model,
            "encoder_layers": cfg.encoder_layers,
            "decoder_layers": cfg.decoder_layers,
            "encoder_attention_heads": cfg.encoder_attention_heads,
            "decoder_attention_heads": cfg.decoder_attention_heads,
            "encoder_ffn_dim": cfg.encoder_ffn_dim,
            "decoder_ffn_dim": cfg.decoder_ffn_dim,
            "vocab_size": cfg.vocab_size,
            "target_vocab_size": cfg.target_vocab_size(),
            "share_encoder_decoder_embeddings": cfg.share_encoder_decoder_embeddings,
            "activation_function": cfg.activation_function,
            "scale_embedding": cfg.scale_embedding,
            "max_position_embeddings": cfg.max_position_embeddings,
            "pad_token_id": cfg.pad_token_id,
            "eos_token_id": cfg.eos_token_id.as_ref().map(|e| e.to_vec()),
            "decoder_start_token_id": cfg.decoder_start_token_id,
            "generation_config": generation,
            "tokenizer_files": tokenizer,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: Hugging Face MarianMT (model_type marian)",
        dir.display()
    );
    println!(
        "weights: {} ({} tensors, stored as {stored})",
        weights.origin(),
        weights.names().len()
    );
    println!(
        "parameters: {parameters} ({:.1} M)",
        parameters as f64 / 1e6
    );
    println!(
        "d_model {}, encoder {} layers × {} heads (ffn {}), decoder {} layers × {} heads (ffn {})",
        cfg.d_model,
        cfg.encoder_layers,
        cfg.encoder_attention_heads,
        cfg.encoder_ffn_dim,
        cfg.decoder_layers,
        cfg.decoder_attention_heads,
        cfg.decoder_ffn_dim
    );
    println!(
        "vocabulary {} (target {}, {}), activation {}, scale_embedding {}, max positions {}",
        cfg.vocab_size,
        cfg.target_vocab_size(),
        if cfg.share_encoder_decoder_embeddings {
            "shared embeddings"
        } else {
            "separate decoder embeddings"
        },
        cfg.activation_function,
        cfg.scale_embedding,
        cfg.max_position_embeddings
    );
    let id = |v: Option<u32>| v.map_or("none".to_string(), |v| v.to_string());
    let eos = cfg
        .eos_token_id
        .as_ref()
        .map_or("none".to_string(), |e| format!("{:?}", e.to_vec()));
    println!(
        "special ids: pad {}, eos {eos}, decoder start {}",
        id(cfg.pad_token_id),
        id(cfg.decoder_start_token_id)
    );
    println!(
        "generation_config.json: {}; tokenizer files: {}",
        if generation {
            "yes"
        } else {
            "no (config.json defaults)"
        },
        if tokenizer.is_empty() {
            "none".to_string()
        } else {
            tokenizer.join(", ")
        }
    );
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A Hugging Face encoder-decoder directory (config.json's model_type: marian, m2m_100 for
    /// M2M100 and NLLB-200, or mbart): config.json, optional generation_config.json, and
    /// model.safetensors or pytorch_model.bin.
    #[arg(long)]
    model: PathBuf,
    /// int64 `input_ids` and `attention_mask` (B, S), 1 = token.
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write int64 `sequences` (B, T'): decoder start token first, padded with
    /// pad_token_id, exactly as transformers' generate() returns them.
    #[arg(long)]
    output: PathBuf,
    /// Beam width (1 = greedy); default from generation_config.json / config.json.
    #[arg(long)]
    beams: Option<usize>,
    /// Most tokens to generate (wins over max_length).
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Fewest tokens to generate before EOS may come.
    #[arg(long)]
    min_new_tokens: Option<usize>,
    /// The token forced first after the decoder start (the target language's id for NLLB,
    /// M2M100, mBART-50); default: forced_bos_token_id of generation_config.json / config.json.
    #[arg(long, value_name = "ID")]
    forced_bos_token_id: Option<u32>,
    /// Where to compute: cpu, cuda or metal (the GPU ones need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: crate::DeviceArg,
    #[command(flatten)]
    precision: crate::pretrained::PrecisionArgs,
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
    let mut cfg = generation_config(
        &args.model,
        args.beams,
        args.max_new_tokens,
        args.min_new_tokens,
    )?;
    if let Some(id) = args.forced_bos_token_id {
        cfg.forced_bos_token_id = Some(id);
    }
    let (ids, shape) = on_rayon_pool(|| -> anyhow::Result<_> {
        let model =
            crate::pretrained::AnyModel::load(&args.model, &device, args.precision.precision())?;
        if let crate::pretrained::AnyModel::Family(m) = &model {
            // The family config's special ids where the directory has no
            // generation_config.json (transformers builds it from the config object).
            if !args.model.join("generation_config.json").is_file() {
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

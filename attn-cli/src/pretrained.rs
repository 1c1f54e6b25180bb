//! Any supported Hugging Face encoder-decoder directory, by its `config.json`'s `model_type`:
//! MarianMT, M2M100 / NLLB-200 (dense) or mBART. `attn run seq2seq`, `attn generate` and
//! `attn inspect DIR` load through here.

use anyhow::Context;
use candle::Device;
use candle_attention::marian::MarianMTModel;
use candle_attention::models::checkpoint::Checkpoint;
use candle_attention::models::encoder_decoder::EncoderDecoderModel;
use candle_attention::models::family_config::FamilyConfig;
use candle_attention::models::seq2seq::{Family, Seq2SeqModel};
use candle_attention::weights::{Precision, Quantization};
use std::path::{Path, PathBuf};

/// A loaded model of any supported family.
/// How a pretrained model is held and computed: `--dtype` and `--quantize` (the names scripts
/// use; the README's "Precision" section gives the costs).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct PrecisionArgs {
    /// Compute dtype. f32: exact (the parity suites' dtype). bf16: half the weight bytes and
    /// a faster memory-bound decoding step, outputs differing from f32 in ~1 % of tokens;
    /// AVX-512 BF16 multiplies it natively, other CPUs convert it (bf16's memory, f32's
    /// speed). f16: half the bytes, f32's speed on the CPU.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::DTypeArg,
    /// Quantize the weight matrices: int8 (one scale per output row, inputs quantized per row
    /// at run time, as CTranslate2's int8): a quarter of the f32 weight bytes and the fastest
    /// decoding step, outputs differing from f32 slightly more than bf16's; computes in f32 on
    /// the CPU (not with --dtype bf16/f16).
    #[arg(long, value_enum)]
    pub quantize: Option<QuantizeArg>,
}

/// `--quantize` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum QuantizeArg {
    Int8,
}

impl PrecisionArgs {
    /// The library's [`Precision`].
    pub fn precision(&self) -> Precision {
        Precision {
            dtype: self.dtype.dtype(),
            quantize: self.quantize.map(|q| match q {
                QuantizeArg::Int8 => Quantization::Int8,
            }),
        }
    }
}

pub enum AnyModel {
    /// A MarianMT directory.
    Marian(MarianMTModel),
    /// An M2M100 / NLLB-200 or mBART directory.
    Family(Seq2SeqModel),
}

impl AnyModel {
    /// Loads `dir`, detecting the family from `config.json` (an unsupported `model_type` is an
    /// error naming it and the supported ones).
    pub fn load(dir: &Path, device: &Device, precision: Precision) -> anyhow::Result<Self> {
        let family = Family::of_dir(dir)?;
        let model = match family {
            Family::Marian => {
                MarianMTModel::from_dir_with(dir, precision, device).map(Self::Marian)
            }
            _ => Seq2SeqModel::from_dir_with(dir, precision, device).map(Self::Family),
        };
        model.with_context(|| format!("loading the {} model in {}", family.name(), dir.display()))
    }

    /// The family's name.
    pub fn family_name(&self) -> &'static str {
        match self {
            Self::Marian(_) => Family::Marian.name(),
            Self::Family(m) => m.family().name(),
        }
    }

    /// The shared encoder-decoder.
    pub fn model(&self) -> &EncoderDecoderModel {
        match self {
            Self::Marian(m) => m,
            Self::Family(m) => m,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct RunSeq2SeqArgs {
    /// A Hugging Face encoder-decoder directory (config.json's model_type: marian, m2m_100 for
    /// M2M100 and NLLB-200, or mbart) with model.safetensors or pytorch_model.bin.
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
    precision: PrecisionArgs,
}

/// `attn run seq2seq`: `model(input_ids, attention_mask, decoder_input_ids)` of any supported
/// family, as `attn run marian` does for MarianMT.
pub fn run(args: &RunSeq2SeqArgs) -> anyhow::Result<()> {
    let device = args.device.device()?;
    let model = AnyModel::load(&args.model, &device, args.precision.precision())?;
    crate::marian::forward_to_file(
        model.model(),
        model.family_name(),
        &args.inputs,
        &args.output,
        &device,
    )
}

/// `attn inspect DIR`: the family, sizes, weights and special ids of a model directory.
pub fn inspect_dir(dir: &Path, json: bool) -> anyhow::Result<()> {
    let family = Family::of_dir(dir)?;
    let Some(def) = family.definition() else {
        return crate::marian::inspect_dir(dir, json);
    };
    let cfg = FamilyConfig::load(dir.join("config.json"), def)?;
    let weights = Checkpoint::open_dir(dir)?;
    let parameters = weights.parameter_count();
    let stored = weights
        .stored_dtype()
        .map_or("unknown".to_string(), |d| format!("{d:?}").to_lowercase());
    let generation = candle_attention::GenerationConfig::from_model_dir(dir)?;
    let tokenizer: Vec<&str> = [
        "sentencepiece.bpe.model",
        "vocab.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
    ]
    .into_iter()
    .filter(|f| dir.join(f).is_file())
    .collect();
    let eos = cfg.eos_token_id.as_ref().map(|e| e.to_vec());
    // The languages the directory's tokenizer knows (for --source-lang / --target-lang); a
    // tokenizer that does not load is reported, not fatal: the model can still be inspected.
    let languages = if tokenizer.is_empty() {
        Err("no tokenizer files".to_string())
    } else {
        candle_attention::tokenizers::load_multilingual_tokenizer(dir)
            .map(|t| t.language_codes())
            .map_err(|e| e.to_string())
    };
    if json {
        let out = serde_json::json!({
            "directory": dir.display().to_string(),
            "family": family.name(),
            "model_type": family.model_type(),
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
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "activation_function": cfg.activation_function,
            "scale_embedding": cfg.scale_embedding,
            "max_position_embeddings": cfg.max_position_embeddings,
            "pad_token_id": cfg.pad_token_id,
            "eos_token_id": eos,
            "decoder_start_token_id": generation.decoder_start_token_id.or(cfg.decoder_start_token_id),
            "forced_bos_token_id": generation.forced_bos_token_id,
            "generation_config": dir.join("generation_config.json").is_file(),
            "tokenizer_files": tokenizer,
            "languages": languages.as_ref().ok(),
            "tokenizer_error": languages.as_ref().err(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: Hugging Face {} (model_type {}, {})",
        dir.display(),
        family.name(),
        family.model_type(),
        def.architecture
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
        "d_model {}, encoder {} layers × {} heads (ffn {}), decoder {} layers × {} heads (ffn {}), pre-norm",
        cfg.d_model,
        cfg.encoder_layers,
        cfg.encoder_attention_heads,
        cfg.encoder_ffn_dim,
        cfg.decoder_layers,
        cfg.decoder_attention_heads,
        cfg.decoder_ffn_dim
    );
    println!(
        "vocabulary {} ({}), activation {}, scale_embedding {}, max positions {}",
        cfg.vocab_size,
        if cfg.tie_word_embeddings {
            "shared embeddings, tied output"
        } else {
            "separate encoder, decoder and output tables"
        },
        cfg.activation_function,
        cfg.scale_embedding,
        cfg.max_position_embeddings
    );
    let id = |v: Option<u32>| v.map_or("none".to_string(), |v| v.to_string());
    println!(
        "special ids: pad {}, eos {}, decoder start {}, forced bos (target language) {}",
        id(cfg.pad_token_id),
        eos.map_or("none".to_string(), |e| format!("{e:?}")),
        id(generation
            .decoder_start_token_id
            .or(cfg.decoder_start_token_id)),
        id(generation.forced_bos_token_id)
    );
    println!(
        "generation_config.json: {}; tokenizer files: {}",
        if dir.join("generation_config.json").is_file() {
            "yes"
        } else {
            "no (config.json)"
        },
        if tokenizer.is_empty() {
            "none".to_string()
        } else {
            tokenizer.join(", ")
        }
    );
    match &languages {
        Ok(codes) => println!("languages ({}): {}", codes.len(), codes.join(" ")),
        Err(e) => println!("languages: unknown ({e})"),
    }
    Ok(())
}

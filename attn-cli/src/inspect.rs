//! `attn inspect`: what a safetensors file or a torch checkpoint holds and which layout it
//! follows; or what a Hugging Face model directory is (family, sizes, weights, special ids),
//! one description for every family over the config keys they share.

use candle_attention::marian::MarianConfig;
use candle_attention::models::checkpoint::Checkpoint;
use candle_attention::models::config::{BartConfig, ConfigExtras};
use candle_attention::models::family_config::FamilyConfig;
use candle_attention::models::seq2seq::Family;
use candle_attention::weights::PthCheckpoint;
use candle_attention::{GenerationConfig, MhaWeightsInfo, TensorFile};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// What to describe: a .safetensors file, a torch checkpoint (pytorch_model.bin, *.pt,
    /// *.pth: the zip archive torch.save writes), or a Hugging Face model directory
    /// (MarianMT, M2M100 / NLLB-200, mBART: config.json and its weights).
    #[arg(value_name = "PATH")]
    file: PathBuf,
    /// Print one JSON object (pretty-printed) instead of the text: the same facts, with the
    /// config's key names for a model directory.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &InspectArgs) -> anyhow::Result<()> {
    // A missing path that does not name a tensor file may be a hub id (ORG/NAME[@REVISION]):
    // the directory of its cached snapshot.
    let tensor_file = matches!(
        args.file.extension().and_then(|e| e.to_str()),
        Some("safetensors" | "bin" | "pt" | "pth" | "ckpt")
    );
    if !args.file.exists() && !tensor_file {
        let dir = crate::model_source::resolve_model(&args.file)?;
        return inspect_dir(&dir, args.json);
    }
    if args.file.is_dir() {
        return inspect_dir(&args.file, args.json);
    }
    if is_torch_checkpoint(&args.file) {
        return inspect_pth(&args.file, args.json);
    }
    let file = TensorFile::open(&args.file)?;
    let tensors = file.summaries();
    let parameters: usize = tensors.iter().map(|t| t.elem_count()).sum();
    let blocks = MhaWeightsInfo::find_all(&file);
    let layout = overall_layout(&blocks);
    if args.json {
        let json = serde_json::json!({
            "file": file.origin(),
            "tensors": tensors.iter().map(|t| serde_json::json!({
                "name": t.name, "dtype": t.dtype, "shape": t.shape, "parameters": t.elem_count(),
            })).collect::<Vec<_>>(),
            "parameters": parameters,
            "layout": layout,
            "attention_blocks": blocks.iter().map(|b| match b {
                Ok(b) => serde_json::json!({
                    "prefix": b.prefix, "layout": b.layout.describe(), "embed_dim": b.embed_dim,
                    "kdim": b.kdim, "vdim": b.vdim, "bias": b.bias, "add_bias_kv": b.add_bias_kv,
                    "parameters": b.parameters,
                }),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "{}: {} tensors, {} parameters",
        file.origin(),
        tensors.len(),
        parameters
    );
    let width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:width$}  {:5}  shape", "name", "dtype");
    for t in &tensors {
        println!("{:width$}  {:5}  {:?}", t.name, t.dtype, t.shape);
    }
    println!("layout: {layout}");
    for block in &blocks {
        match block {
            Ok(b) => println!(
                "attention block '{}': {}, embed_dim {}, kdim {}, vdim {}, bias {}, bias_kv {}, {} parameters",
                b.prefix, b.layout.describe(), b.embed_dim, b.kdim, b.vdim, yes_no(b.bias), yes_no(b.add_bias_kv), b.parameters
            ),
            Err(e) => println!("attention block with inconsistent weights: {e}"),
        }
    }
    Ok(())
}

/// What `attn inspect DIR` says of a model directory beyond the config keys every family
/// shares.
struct FamilyFacts {
    /// After the model type in the first line (", M2M100ForConditionalGeneration").
    architecture: String,
    /// After the layer sizes (", pre-norm").
    layer_order: &'static str,
    /// What the vocabulary line says of the tables ("target 96, shared embeddings").
    tables: String,
    /// The decoder start id the model generates with.
    decoder_start_token_id: Option<u32>,
    /// The target-language id forced after the decoder start (`None`: the family has none).
    forced_bos_token_id: Option<Option<u32>>,
    /// The generation line's word for a directory without generation_config.json.
    no_generation_config: &'static str,
    /// The tokenizer files found.
    tokenizer_files: Vec<&'static str>,
    /// The languages of the tokenizer, or why they are unknown (`None`: not a multilingual
    /// family).
    languages: Option<Result<Vec<String>, String>>,
    /// The family's own JSON keys.
    json: Map<String, Value>,
}

/// `attn inspect DIR`: the family, sizes, weights and special ids of a model directory.
pub fn inspect_dir(dir: &Path, json: bool) -> anyhow::Result<()> {
    let family = Family::of_dir(dir)?;
    let config_path = dir.join("config.json");
    let present = |files: &[&'static str]| -> Vec<&'static str> {
        files
            .iter()
            .copied()
            .filter(|f| dir.join(f).is_file())
            .collect()
    };
    let Some(def) = family.definition() else {
        let cfg = MarianConfig::load(&config_path)?;
        let weights = Checkpoint::open_dir(dir)?;
        let facts = FamilyFacts {
            architecture: String::new(),
            layer_order: "",
            tables: format!(
                "target {}, {}",
                cfg.target_vocab_size(),
                if cfg.share_encoder_decoder_embeddings {
                    "shared embeddings"
                } else {
                    "separate decoder embeddings"
                }
            ),
            decoder_start_token_id: cfg.decoder_start_token_id,
            forced_bos_token_id: None,
            no_generation_config: "no (config.json defaults)",
            tokenizer_files: present(&["source.spm", "target.spm", "vocab.json"]),
            languages: None,
            json: Map::from_iter([
                ("target_vocab_size".into(), json!(cfg.target_vocab_size())),
                (
                    "share_encoder_decoder_embeddings".into(),
                    json!(cfg.share_encoder_decoder_embeddings),
                ),
            ]),
        };
        return describe_dir(dir, family, &cfg, &weights, facts, json);
    };
    let cfg = FamilyConfig::load(&config_path, def)?;
    let weights = Checkpoint::open_dir(dir)?;
    let generation = GenerationConfig::from_model_dir(dir)?;
    let tokenizer_files = present(&[
        "sentencepiece.bpe.model",
        "vocab.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.json",
    ]);
    // The languages the directory's tokenizer knows (for --source-lang / --target-lang); a
    // tokenizer that does not load is reported, not fatal: the model can still be inspected.
    let languages = if tokenizer_files.is_empty() {
        Err("no tokenizer files".to_string())
    } else {
        candle_attention::tokenizers::load_multilingual_tokenizer(dir)
            .map(|t| t.language_codes())
            .map_err(|e| e.to_string())
    };
    let facts = FamilyFacts {
        architecture: format!(", {}", def.architecture),
        layer_order: ", pre-norm",
        tables: if cfg.tie_word_embeddings {
            "shared embeddings, tied output"
        } else {
            "separate encoder, decoder and output tables"
        }
        .to_string(),
        decoder_start_token_id: generation
            .decoder_start_token_id
            .or(cfg.decoder_start_token_id),
        forced_bos_token_id: Some(generation.forced_bos_token_id),
        no_generation_config: "no (config.json)",
        tokenizer_files,
        json: Map::from_iter([
            (
                "forced_bos_token_id".into(),
                json!(generation.forced_bos_token_id),
            ),
            ("languages".into(), json!(languages.as_ref().ok())),
            ("tokenizer_error".into(), json!(languages.as_ref().err())),
        ]),
        languages: Some(languages),
    };
    describe_dir(dir, family, &cfg, &weights, facts, json)
}

/// Prints the description of a model directory of any family: its weights, then the config
/// keys the families share, then the family's own facts; as text or as one JSON object.
fn describe_dir<X: ConfigExtras>(
    dir: &Path,
    family: Family,
    cfg: &BartConfig<X>,
    weights: &Checkpoint,
    facts: FamilyFacts,
    json: bool,
) -> anyhow::Result<()> {
    let parameters = weights.parameter_count();
    let stored = weights
        .stored_dtype()
        .map_or("unknown".to_string(), |d| format!("{d:?}").to_lowercase());
    let generation = dir.join("generation_config.json").is_file();
    let eos = cfg.eos_token_id.as_ref().map(|e| e.to_vec());
    if json {
        let mut out = json!({
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
            "decoder_start_token_id": facts.decoder_start_token_id,
            "generation_config": generation,
            "tokenizer_files": facts.tokenizer_files,
        });
        if let Value::Object(map) = &mut out {
            map.extend(facts.json);
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: Hugging Face {} (model_type {}{})",
        dir.display(),
        family.name(),
        family.model_type(),
        facts.architecture
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
        "d_model {}, encoder {} layers × {} heads (ffn {}), decoder {} layers × {} heads (ffn {}){}",
        cfg.d_model,
        cfg.encoder_layers,
        cfg.encoder_attention_heads,
        cfg.encoder_ffn_dim,
        cfg.decoder_layers,
        cfg.decoder_attention_heads,
        cfg.decoder_ffn_dim,
        facts.layer_order
    );
    println!(
        "vocabulary {} ({}), activation {}, scale_embedding {}, max positions {}",
        cfg.vocab_size,
        facts.tables,
        cfg.activation_function,
        cfg.scale_embedding,
        cfg.max_position_embeddings
    );
    let id = |v: Option<u32>| v.map_or("none".to_string(), |v| v.to_string());
    println!(
        "special ids: pad {}, eos {}, decoder start {}{}",
        id(cfg.pad_token_id),
        eos.map_or("none".to_string(), |e| format!("{e:?}")),
        id(facts.decoder_start_token_id),
        facts.forced_bos_token_id.map_or(String::new(), |f| format!(
            ", forced bos (target language) {}",
            id(f)
        ))
    );
    println!(
        "generation_config.json: {}; tokenizer files: {}",
        if generation {
            "yes"
        } else {
            facts.no_generation_config
        },
        if facts.tokenizer_files.is_empty() {
            "none".to_string()
        } else {
            facts.tokenizer_files.join(", ")
        }
    );
    match &facts.languages {
        Some(Ok(codes)) => println!("languages ({}): {}", codes.len(), codes.join(" ")),
        Some(Err(e)) => println!("languages: unknown ({e})"),
        None => {}
    }
    Ok(())
}

/// A torch checkpoint by its extension, or by the zip signature of a file not named
/// `.safetensors`.
fn is_torch_checkpoint(path: &Path) -> bool {
    use std::io::Read;
    match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => false,
        Some("bin" | "pt" | "pth") => true,
        _ => {
            let mut magic = [0u8; 4];
            std::fs::File::open(path)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && magic == *b"PK\x03\x04"
        }
    }
}

/// `attn inspect FILE.bin`: the tensors of a torch checkpoint, validated by the reader when it
/// opens (an empty or lying checkpoint is an error here, not a table).
fn inspect_pth(path: &Path, json: bool) -> anyhow::Result<()> {
    let ckpt = PthCheckpoint::open(path)?;
    let infos: Vec<(&str, &candle_attention::weights::PthTensorInfo)> = ckpt
        .names()
        .into_iter()
        .filter_map(|n| ckpt.info(n).map(|i| (n, i)))
        .collect();
    let parameters: usize = infos.iter().map(|(_, i)| i.elem_count()).sum();
    if json {
        let json = serde_json::json!({
            "file": ckpt.origin(),
            "format": "torch zip checkpoint",
            "tensors": infos.iter().map(|(n, i)| serde_json::json!({
                "name": n, "dtype": i.torch_dtype(), "shape": i.shape(),
                "parameters": i.elem_count(),
            })).collect::<Vec<_>>(),
            "parameters": parameters,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "{}: torch checkpoint, {} tensors, {} parameters",
        ckpt.origin(),
        infos.len(),
        parameters
    );
    let width = infos.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  {:8}  shape", "name", "dtype");
    for (n, i) in &infos {
        println!("{:width$}  {:8}  {:?}", n, i.torch_dtype(), i.shape());
    }
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// One line for the whole file: a single block's layout, several blocks, or none.
fn overall_layout(blocks: &[candle::Result<MhaWeightsInfo>]) -> String {
    let ok: Vec<&MhaWeightsInfo> = blocks.iter().filter_map(|b| b.as_ref().ok()).collect();
    match ok.as_slice() {
        [] if blocks.is_empty() => "no attention weights recognised".to_string(),
        [] => "attention weights with inconsistent shapes".to_string(),
        [one] => one.layout.describe().to_string(),
        many => {
            let mut kinds: Vec<&str> = many.iter().map(|b| b.layout.describe()).collect();
            kinds.sort();
            kinds.dedup();
            format!("{} attention blocks: {}", many.len(), kinds.join("; "))
        }
    }
}

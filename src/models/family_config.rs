//! The `config.json` of the fairseq-descended BART-family models (M2M100 / NLLB-200 dense,
//! mBART), read as transformers 5.24 reads it, with every key accounted for: a key is either
//! honoured (it sets the model: sizes, activation, embedding scale, special ids, tying), or one
//! transformers itself does not act on at inference (dropout and other training settings,
//! metadata, legacy fairseq-conversion keys, generation settings, which
//! [`crate::generation::GenerationConfig`] reads), or it is refused with an error naming it.
//! Never silently ignored.
//!
//! A family is a [`FamilyDef`]: its `model_type`, its config class's defaults and what its
//! architecture has (positions, embedding layer norm, `final_logits_bias`); the families
//! themselves ([`crate::models::m2m100`], [`crate::models::mbart`]) are such definitions.

use super::config::{BartConfig, ConfigExtras, SHARED_KEYS};
use super::encoder_decoder::{EncoderDecoderSpec, Positions};
use crate::generation::GenerationConfig;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::Path;

pub use super::config::TokenIds;

/// How a family encodes positions (the spec's [`Positions`] before the config's ids are known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionKind {
    /// [`Positions::M2M100Sinusoidal`], with the config's `pad_token_id` as `padding_idx`.
    M2M100Sinusoidal,
    /// [`Positions::Learned`] with this offset.
    Learned(usize),
}

/// A BART-family architecture as a configuration of the shared encoder-decoder: everything
/// about a family that is not in its `config.json`.
#[derive(Debug)]
pub struct FamilyDef {
    /// `model_type` in `config.json` (e.g. `"m2m_100"`).
    pub model_type: &'static str,
    /// The family's name for messages (e.g. `"M2M100"`).
    pub name: &'static str,
    /// The transformers class a directory of this family is loaded as (its
    /// `...ForConditionalGeneration`).
    pub architecture: &'static str,
    /// The transformers config class's defaults, as a JSON object (every honoured key).
    pub defaults: &'static str,
    /// How positions are encoded.
    pub positions: PositionKind,
    /// Each stack normalises its embeddings (`layernorm_embedding`).
    pub embedding_norm: bool,
    /// The head adds `final_logits_bias`.
    pub final_logits_bias: bool,
    /// Keys of this family's configs that transformers stores but does not act on in this
    /// model (legacy fairseq-conversion keys), beyond [`COMMON_IGNORED`].
    pub ignored_keys: &'static [&'static str],
}

/// The keys that set the model, with transformers' meaning, beyond [`SHARED_KEYS`] (the ones
/// of [`FamilyExtras`]).
const FAMILY_KEYS: &[&str] = &["model_type", "bos_token_id"];

/// transformers' `attribute_map` of these configs: another name for an honoured key.
const ALIASES: &[(&str, &str)] = &[
    ("hidden_size", "d_model"),
    ("num_attention_heads", "encoder_attention_heads"),
    ("num_hidden_layers", "encoder_layers"),
];

/// Keys transformers keeps but does not act on at inference in these models: training
/// settings (dropout, layer drop, initialisation), metadata, output switches. `dtype` /
/// `torch_dtype` say how the weights were stored; the weights' own dtypes are read from the
/// file and the model computes in the dtype it is asked for.
pub const COMMON_IGNORED: &[&str] = &[
    "_name_or_path",
    "architectures",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "tokenizer_class",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "init_std",
    "classifier_dropout",
    "use_cache",
    "is_encoder_decoder",
    "gradient_checkpointing",
    "id2label",
    "label2id",
    "_num_labels",
    "num_labels",
    "problem_type",
    "finetuning_task",
    "task_specific_params",
    "prefix",
    "output_hidden_states",
    "output_attentions",
    "return_dict",
    "use_return_dict",
    "torchscript",
    "chunk_size_feed_forward",
    "tie_encoder_decoder",
    "is_decoder",
    "add_cross_attention",
    "pruned_heads",
    "cross_attention_hidden_size",
    "sep_token_id",
    "unk_token_id",
    "mask_token_id",
    "output_past",
    "_attn_implementation",
    "_attn_implementation_autoset",
];

/// Generation settings a `config.json` may carry (transformers reads them only when the
/// directory has no `generation_config.json`); [`crate::generation::GenerationConfig`] reads
/// them, honouring or refusing each when a search starts.
pub const GENERATION_KEYS: &[&str] = &[
    "max_length",
    "min_length",
    "max_new_tokens",
    "min_new_tokens",
    "num_beams",
    "num_beam_groups",
    "early_stopping",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "forced_bos_token_id",
    "num_return_sequences",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "encoder_repetition_penalty",
    "diversity_penalty",
    "remove_invalid_values",
    "renormalize_logits",
    "suppress_tokens",
    "begin_suppress_tokens",
    "exponential_decay_length_penalty",
    "output_scores",
    "return_dict_in_generate",
];

/// The model half of a `config.json` of an M2M100 / NLLB-200 or mBART directory: field names
/// and defaults of transformers' `M2M100Config` / `MBartConfig` (5.24), after every key was
/// checked ([`FamilyConfig::from_json`]). The keys every family shares are [`BartConfig`]'s;
/// these families' own ([`FamilyExtras`]) are read as fields of the config too.
pub type FamilyConfig = BartConfig<FamilyExtras>;

/// The keys of an M2M100 / NLLB-200 or mBART `config.json` beyond [`BartConfig`]'s.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct FamilyExtras {
    /// `model_type` (`"m2m_100"`, `"mbart"`).
    pub model_type: String,
    /// Beginning-of-sequence id.
    pub bos_token_id: Option<u32>,
}

impl ConfigExtras for FamilyExtras {
    const PRE_NORM: bool = true;

    /// Never read: [`FamilyConfig::from_json`] merges the family's own defaults
    /// ([`FamilyDef::defaults`], a family is known only at run time) into the file before
    /// parsing, so no key is missing. A config of zero sizes, which
    /// [`FamilyConfig::validate`] refuses.
    fn defaults() -> FamilyConfig {
        BartConfig {
            vocab_size: 0,
            max_position_embeddings: 0,
            encoder_layers: 0,
            encoder_ffn_dim: 0,
            encoder_attention_heads: 0,
            decoder_layers: 0,
            decoder_ffn_dim: 0,
            decoder_attention_heads: 0,
            activation_function: String::new(),
            d_model: 0,
            scale_embedding: false,
            pad_token_id: None,
            eos_token_id: None,
            decoder_start_token_id: None,
            forced_eos_token_id: None,
            tie_word_embeddings: false,
            extras: FamilyExtras {
                model_type: String::new(),
                bos_token_id: None,
            },
        }
    }
}

fn json_err(path: &str, e: impl std::fmt::Display) -> candle::Error {
    candle::Error::Msg(format!("{path}: {e}"))
}

/// Refuses a value of a key transformers ignores at inference when it asks for something this
/// model is not (a decoder-only model, cross-attention added, heads pruned, ...).
fn check_ignored_value(family: &FamilyDef, key: &str, value: &Value) -> candle::Result<()> {
    let refuse = |why: &str| -> candle::Result<()> {
        candle::bail!("config.json: {key} = {value} is not supported: {why}")
    };
    match key {
        "is_decoder" | "add_cross_attention" | "tie_encoder_decoder" | "torchscript"
            if value.as_bool() == Some(true) =>
        {
            refuse(&format!(
                "only {} (an encoder-decoder with its own cross-attention) is",
                family.architecture
            ))
        }
        "is_encoder_decoder" if value.as_bool() == Some(false) => {
            refuse(&format!("{} is an encoder-decoder", family.architecture))
        }
        "pruned_heads" if value.as_object().is_some_and(|m| !m.is_empty()) => {
            refuse("pruned attention heads")
        }
        "architectures" => {
            let names: Vec<&str> = value
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let base = family
                .architecture
                .trim_end_matches("ForConditionalGeneration");
            let model = format!("{base}Model");
            match names
                .iter()
                .find(|n| **n != family.architecture && **n != model)
            {
                Some(other) => refuse(&format!(
                    "the weights are a {other}; this loads {} (or {model})",
                    family.architecture
                )),
                None => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

impl FamilyConfig {
    /// Reads and checks `config.json` of a `family` directory.
    pub fn load(path: impl AsRef<Path>, family: &FamilyDef) -> candle::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            candle::Error::Msg(format!(
                "cannot read the {} config {}: {e}",
                family.name,
                path.display()
            ))
        })?;
        Self::from_json(&text, family)
            .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Parses and checks the text of a `config.json`: every key honoured, known to be inert at
    /// inference, or refused with an error naming it; then the sizes and ids
    /// ([`FamilyConfig::validate`]).
    pub fn from_json(text: &str, family: &FamilyDef) -> candle::Result<Self> {
        let file: Map<String, Value> = match serde_json::from_str(text) {
            Ok(Value::Object(m)) => m,
            Ok(other) => candle::bail!(
                "not a valid {} config.json: expected a JSON object, got {other}",
                family.name
            ),
            Err(e) => candle::bail!("not a valid {} config.json: {e}", family.name),
        };
        if let Some(t) = file.get("model_type") {
            if t.as_str() != Some(family.model_type) {
                candle::bail!(
                    "config.json says model_type {t}, not \"{}\": this is not a {} model",
                    family.model_type,
                    family.name
                )
            }
        }
        let mut merged: Map<String, Value> = match serde_json::from_str(family.defaults) {
            Ok(Value::Object(m)) => m,
            _ => candle::bail!(
                "internal: the {} defaults are not a JSON object",
                family.name
            ),
        };
        for (key, value) in &file {
            if let Some((_, target)) = ALIASES.iter().find(|(alias, _)| alias == key) {
                if let Some(v) = file.get(*target) {
                    if v != value {
                        candle::bail!(
                            "config.json: {key} = {value} contradicts {target} = {v} (transformers \
                             reads {key} as {target})"
                        )
                    }
                }
                merged.insert(target.to_string(), value.clone());
            } else if SHARED_KEYS.contains(&key.as_str()) || FAMILY_KEYS.contains(&key.as_str()) {
                merged.insert(key.clone(), value.clone());
            } else if COMMON_IGNORED.contains(&key.as_str())
                || family.ignored_keys.contains(&key.as_str())
            {
                check_ignored_value(family, key, value)?;
            } else if GENERATION_KEYS.contains(&key.as_str()) {
                // Read by GenerationConfig (when there is no generation_config.json).
            } else {
                candle::bail!(
                    "config.json: unknown key \"{key}\" (= {value}): not a setting of \
                     transformers' {} config this crate knows; refusing rather than ignoring it",
                    family.name
                )
            }
        }
        let cfg: Self = serde_json::from_value(Value::Object(merged))
            .map_err(|e| json_err("config.json", e))?;
        cfg.validate(family)?;
        Ok(cfg)
    }

    /// The generation settings of a directory of this family, as transformers'
    /// `from_pretrained` makes them: `generation_config.json` alone when the directory has one;
    /// otherwise the generation keys of `config.json`, with the special ids this config holds
    /// (`decoder_start_token_id`, `bos_token_id`, `eos_token_id`, `pad_token_id`,
    /// `forced_eos_token_id`, the config class's defaults included: transformers builds the
    /// generation config from the config object, so M2M100's decoder start `</s>` (2) applies
    /// even when `config.json` does not write it).
    pub fn generation_config(&self, dir: impl AsRef<Path>) -> candle::Result<GenerationConfig> {
        let dir = dir.as_ref();
        let mut generation = GenerationConfig::from_model_dir(dir)?;
        if !dir.join("generation_config.json").is_file() {
            self.fill_generation_ids(&mut generation);
        }
        Ok(generation)
    }

    /// Sets the special ids `g` lacks (`decoder_start_token_id`, `bos_token_id`,
    /// `pad_token_id`, `eos_token_id`, `forced_eos_token_id`) from this config: what
    /// transformers does with a directory without `generation_config.json`.
    pub fn fill_generation_ids(&self, g: &mut GenerationConfig) {
        g.decoder_start_token_id = g.decoder_start_token_id.or(self.decoder_start_token_id);
        g.bos_token_id = g.bos_token_id.or(self.bos_token_id);
        g.pad_token_id = g.pad_token_id.or(self.pad_token_id);
        if g.eos_token_id.is_none() {
            g.eos_token_id = self.eos_token_id.as_ref().map(TokenIds::to_vec);
        }
        if g.forced_eos_token_id.is_none() {
            g.forced_eos_token_id = self.forced_eos_token_id.as_ref().map(TokenIds::to_vec);
        }
    }

    /// Checks what transformers would refuse or what this model cannot run: sizes at least 1,
    /// `d_model` divisible by the heads (and, for M2M100's positions, at least 4), a known
    /// activation, special ids inside the vocabulary.
    pub fn validate(&self, family: &FamilyDef) -> candle::Result<()> {
        self.check_sizes(&[])?;
        if family.positions == PositionKind::M2M100Sinusoidal && self.d_model < 4 {
            candle::bail!(
                "config.json: d_model {} is too small for {}'s sinusoidal positions (at least 4: \
                 transformers divides by d_model / 2 - 1)",
                self.d_model,
                family.name
            )
        }
        self.activation()?;
        self.pad_id()?;
        let eos = self.eos_token_id.as_ref().map(TokenIds::to_vec);
        let forced = self.forced_eos_token_id.as_ref().map(TokenIds::to_vec);
        let ids = [
            ("pad_token_id", self.pad_token_id.map(|i| vec![i])),
            ("bos_token_id", self.bos_token_id.map(|i| vec![i])),
            (
                "decoder_start_token_id",
                self.decoder_start_token_id.map(|i| vec![i]),
            ),
            ("eos_token_id", eos),
            ("forced_eos_token_id", forced),
        ];
        Self::check_ids(ids, "vocabulary", self.vocab_size)?;
        self.encoder_config()?.validate()?;
        self.decoder_config()?.validate()?;
        Ok(())
    }

    /// The shared encoder-decoder this config describes for `family`: pre-norm stacks with
    /// final layer norms, the family's positions and embedding norm, embeddings scaled by
    /// `sqrt(d_model)` when `scale_embedding`, one embedding table and a tied head when
    /// `tie_word_embeddings` (else three separate tensors, as transformers 5.24 loads them).
    pub fn spec(&self, family: &FamilyDef) -> candle::Result<EncoderDecoderSpec> {
        self.validate(family)?;
        Ok(EncoderDecoderSpec {
            d_model: self.d_model,
            vocab_size: self.vocab_size,
            target_vocab_size: self.vocab_size,
            max_position_embeddings: self.max_position_embeddings,
            encoder: self.encoder_config()?,
            decoder: self.decoder_config()?,
            embed_scale: self.embed_scale(),
            positions: match family.positions {
                PositionKind::M2M100Sinusoidal => Positions::M2M100Sinusoidal {
                    padding_idx: self.pad_id()?,
                },
                PositionKind::Learned(offset) => Positions::Learned { offset },
            },
            shared_embeddings: self.tie_word_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            embedding_norm: family.embedding_norm,
            final_logits_bias: family.final_logits_bias,
            final_norms: true,
            family: family.name,
        })
    }
}

//! `config.json` of a Hugging Face MarianMT directory, read as transformers' `MarianConfig`
//! reads it (same field names, same defaults).

use crate::models::encoder_decoder::{bart_stack_config, EncoderDecoderSpec, Positions};
use crate::transformer::{Activation, TransformerConfig};
use serde::Deserialize;
use std::path::Path;

/// One token id or several (`eos_token_id` may be a list in Hugging Face configs).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }

    /// The first id (the one transformers uses where a single id is needed).
    pub fn first(&self) -> Option<u32> {
        self.to_vec().first().copied()
    }
}

/// The model half of a MarianMT `config.json`: sizes, activation, special token ids. Field
/// names and defaults are those of transformers' `MarianConfig` (5.x); unknown fields are
/// ignored, as transformers keeps them as plain attributes.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct MarianConfig {
    /// `"marian"` for MarianMT checkpoints (checked when present).
    pub model_type: Option<String>,
    /// Source (and, when shared, target) vocabulary size.
    pub vocab_size: usize,
    /// Target vocabulary size when the decoder has its own embeddings; `None` = `vocab_size`.
    pub decoder_vocab_size: Option<usize>,
    /// Longest sequence the positions cover (source or target).
    pub max_position_embeddings: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Encoder feed-forward size.
    pub encoder_ffn_dim: usize,
    /// Encoder heads.
    pub encoder_attention_heads: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Decoder feed-forward size.
    pub decoder_ffn_dim: usize,
    /// Decoder heads.
    pub decoder_attention_heads: usize,
    /// Feed-forward activation (`swish` for opus-mt, `gelu`, `relu`, `gelu_new`...).
    pub activation_function: String,
    /// Model size.
    pub d_model: usize,
    /// Multiply token embeddings by `sqrt(d_model)`.
    pub scale_embedding: bool,
    /// Padding id (also Marian's decoder start token).
    pub pad_token_id: Option<u32>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<TokenIds>,
    /// The first token fed to the decoder.
    pub decoder_start_token_id: Option<u32>,
    /// Forced at the last allowed generation step.
    pub forced_eos_token_id: Option<TokenIds>,
    /// Encoder and decoder share one embedding table (`model.shared`).
    pub share_encoder_decoder_embeddings: bool,
    /// The output projection is the (decoder) embedding table.
    pub tie_word_embeddings: bool,
    /// Recorded by old Marian exports. transformers' `MarianMTModel` is post-norm whatever this
    /// says, and so are we (see [`MarianConfig::validate`]).
    pub normalize_before: Option<bool>,
}

impl Default for MarianConfig {
    /// transformers' `MarianConfig()` defaults.
    fn default() -> Self {
        Self {
            model_type: None,
            vocab_size: 58101,
            decoder_vocab_size: None,
            max_position_embeddings: 1024,
            encoder_layers: 12,
            encoder_ffn_dim: 4096,
            encoder_attention_heads: 16,
            decoder_layers: 12,
            decoder_ffn_dim: 4096,
            decoder_attention_heads: 16,
            activation_function: "gelu".into(),
            d_model: 1024,
            scale_embedding: false,
            pad_token_id: Some(58100),
            eos_token_id: Some(TokenIds::One(0)),
            decoder_start_token_id: Some(58100),
            forced_eos_token_id: Some(TokenIds::One(0)),
            share_encoder_decoder_embeddings: true,
            tie_word_embeddings: true,
            normalize_before: None,
        }
    }
}

impl MarianConfig {
    /// Reads and checks `config.json`.
    pub fn load(path: impl AsRef<Path>) -> candle::Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            candle::Error::Msg(format!(
                "cannot read the Marian config {}: {e}",
                path.display()
            ))
        })?;
        Self::from_json(&text).map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display())))
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str) -> candle::Result<Self> {
        let cfg: Self = serde_json::from_str(text)
            .map_err(|e| candle::Error::Msg(format!("not a valid Marian config.json: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The target vocabulary: `decoder_vocab_size` unless the embeddings are shared.
    pub fn target_vocab_size(&self) -> usize {
        if self.share_encoder_decoder_embeddings {
            self.vocab_size
        } else {
            self.decoder_vocab_size.unwrap_or(self.vocab_size)
        }
    }

    /// The padding id (`pad_token_id`); an error when the config has none.
    pub fn pad_id(&self) -> candle::Result<u32> {
        self.pad_token_id
            .ok_or_else(|| candle::Error::Msg("config.json has no pad_token_id".into()))
    }

    /// The feed-forward activation.
    pub fn activation(&self) -> candle::Result<Activation> {
        self.activation_function.parse().map_err(|e: String| {
            candle::Error::Msg(format!("config.json activation_function: {e}"))
        })
    }

    /// Checks what transformers would refuse or what we cannot run.
    pub fn validate(&self) -> candle::Result<()> {
        if let Some(t) = &self.model_type {
            if t != "marian" {
                candle::bail!(
                    "config.json says model_type \"{t}\", not \"marian\": this is not a MarianMT model"
                )
            }
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("max_position_embeddings", self.max_position_embeddings),
            ("target vocabulary size", self.target_vocab_size()),
        ] {
            if v == 0 {
                candle::bail!("config.json: {name} must be at least 1")
            }
        }
        if !self.d_model.is_multiple_of(2) {
            candle::bail!(
                "config.json: d_model {} is odd; Marian's sinusoidal positions need an even size",
                self.d_model
            )
        }
        self.activation()?;
        self.pad_id()?;
        for (name, id) in [
            ("pad_token_id", self.pad_token_id),
            ("decoder_start_token_id", self.decoder_start_token_id),
        ] {
            if let Some(id) = id {
                if id as usize >= self.target_vocab_size() {
                    candle::bail!(
                        "config.json: {name} {id} is outside the target vocabulary of {} tokens",
                        self.target_vocab_size()
                    )
                }
            }
        }
        self.encoder_config()?.validate()?;
        self.decoder_config()?.validate()?;
        Ok(())
    }

    fn stack_config(
        &self,
        heads: usize,
        ffn: usize,
        layers: usize,
    ) -> candle::Result<TransformerConfig> {
        Ok(bart_stack_config(
            self.d_model,
            heads,
            ffn,
            layers,
            self.activation()?,
            false,
        ))
    }

    /// The encoder stack's layer configuration (post-norm, Hugging Face names).
    pub fn encoder_config(&self) -> candle::Result<TransformerConfig> {
        self.stack_config(
            self.encoder_attention_heads,
            self.encoder_ffn_dim,
            self.encoder_layers,
        )
    }

    /// The decoder stack's layer configuration (post-norm, Hugging Face names).
    pub fn decoder_config(&self) -> candle::Result<TransformerConfig> {
        self.stack_config(
            self.decoder_attention_heads,
            self.decoder_ffn_dim,
            self.decoder_layers,
        )
    }

    /// The shared encoder-decoder this config describes: post-norm stacks without final
    /// norms, Marian's sinusoidal positions, embeddings scaled by `sqrt(d_model)` when
    /// `scale_embedding`. Checks the config first ([`MarianConfig::validate`]).
    pub fn spec(&self) -> candle::Result<EncoderDecoderSpec> {
        self.validate()?;
        Ok(EncoderDecoderSpec {
            d_model: self.d_model,
            vocab_size: self.vocab_size,
            target_vocab_size: self.target_vocab_size(),
            max_position_embeddings: self.max_position_embeddings,
            encoder: self.encoder_config()?,
            decoder: self.decoder_config()?,
            embed_scale: if self.scale_embedding {
                (self.d_model as f64).sqrt()
            } else {
                1.0
            },
            positions: Positions::MarianSinusoidal,
            shared_embeddings: self.share_encoder_decoder_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            embedding_norm: false,
            final_logits_bias: true,
            final_norms: false,
            family: "MarianMT",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_transformers_and_errors_name_the_field() {
        let cfg = MarianConfig::from_json(r#"{"model_type": "marian", "d_model": 64, "encoder_attention_heads": 4, "decoder_attention_heads": 4, "eos_token_id": [0, 3]}"#).unwrap();
        assert_eq!(cfg.vocab_size, 58101);
        assert_eq!(cfg.target_vocab_size(), 58101);
        assert_eq!(cfg.eos_token_id.unwrap().to_vec(), vec![0, 3]);
        let err = MarianConfig::from_json(r#"{"model_type": "bart"}"#).unwrap_err();
        assert!(err.to_string().contains("not a MarianMT model"), "{err}");
        let err = MarianConfig::from_json(r#"{"activation_function": "tanhh"}"#).unwrap_err();
        assert!(err.to_string().contains("tanhh"), "{err}");
        let err = MarianConfig::from_json(r#"{"d_model": 64, "encoder_attention_heads": 5}"#)
            .unwrap_err();
        assert!(err.to_string().contains("not divisible"), "{err}");
    }
}

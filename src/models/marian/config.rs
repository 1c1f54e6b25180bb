//! `config.json` of a Hugging Face MarianMT directory, read as transformers' `MarianConfig`
//! reads it (same field names, same defaults).

use crate::models::config::{BartConfig, ConfigExtras};
use crate::models::encoder_decoder::{EncoderDecoderSpec, Positions};
use serde::Deserialize;
use std::path::Path;

pub use crate::models::config::TokenIds;

/// The model half of a MarianMT `config.json`: sizes, activation, special token ids. Field
/// names and defaults are those of transformers' `MarianConfig` (5.x); unknown fields are
/// ignored, as transformers keeps them as plain attributes. The keys every family shares are
/// [`BartConfig`]'s; Marian's own ([`MarianExtras`]) are read as fields of the config too.
pub type MarianConfig = BartConfig<MarianExtras>;

/// The keys of a MarianMT `config.json` beyond [`BartConfig`]'s.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct MarianExtras {
    /// `"marian"` for MarianMT checkpoints (checked when present).
    pub model_type: Option<String>,
    /// Target vocabulary size when the decoder has its own embeddings; `None` = `vocab_size`.
    pub decoder_vocab_size: Option<usize>,
    /// Encoder and decoder share one embedding table (`model.shared`).
    pub share_encoder_decoder_embeddings: bool,
    /// Recorded by old Marian exports. transformers' `MarianMTModel` is post-norm whatever this
    /// says, and so are we (see [`MarianConfig::validate`]).
    pub normalize_before: Option<bool>,
}

impl Default for MarianExtras {
    /// transformers' `MarianConfig()` defaults.
    fn default() -> Self {
        Self {
            model_type: None,
            decoder_vocab_size: None,
            share_encoder_decoder_embeddings: true,
            normalize_before: None,
        }
    }
}

impl ConfigExtras for MarianExtras {
    const PRE_NORM: bool = false;

    /// transformers' `MarianConfig()` defaults.
    fn defaults() -> MarianConfig {
        BartConfig {
            vocab_size: 58101,
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
            tie_word_embeddings: true,
            extras: MarianExtras::default(),
        }
    }
}

impl Default for MarianConfig {
    /// transformers' `MarianConfig()` defaults.
    fn default() -> Self {
        MarianExtras::defaults()
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

    /// Checks what transformers would refuse or what we cannot run.
    pub fn validate(&self) -> candle::Result<()> {
        if let Some(t) = &self.model_type {
            if t != "marian" {
                candle::bail!(
                    "config.json says model_type \"{t}\", not \"marian\": this is not a MarianMT model"
                )
            }
        }
        self.check_sizes(&[("target vocabulary size", self.target_vocab_size())])?;
        if !self.d_model.is_multiple_of(2) {
            candle::bail!(
                "config.json: d_model {} is odd; Marian's sinusoidal positions need an even size",
                self.d_model
            )
        }
        self.activation()?;
        self.pad_id()?;
        Self::check_ids(
            [
                ("pad_token_id", self.pad_token_id.map(|i| vec![i])),
                (
                    "decoder_start_token_id",
                    self.decoder_start_token_id.map(|i| vec![i]),
                ),
            ],
            "target vocabulary",
            self.target_vocab_size(),
        )?;
        self.encoder_config()?.validate()?;
        self.decoder_config()?.validate()?;
        Ok(())
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
            embed_scale: self.embed_scale(),
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

//! The `config.json` keys every family here shares: transformers' `MarianConfig`,
//! `M2M100Config` and `MBartConfig` are copies of its `BartConfig` (sizes, activation, embedding
//! scale, special ids, tying), so they are one type here, [`BartConfig`], over the few keys a
//! family adds ([`ConfigExtras`]): [`crate::marian::MarianConfig`] is
//! `BartConfig<MarianExtras>`, [`crate::models::family_config::FamilyConfig`] (M2M100 /
//! NLLB-200, mBART) is `BartConfig<FamilyExtras>`. The family's keys are reached through the
//! config as its own fields (`Deref`): `cfg.d_model` and `cfg.bos_token_id` alike.
//!
//! What each family does with a file (Marian's leniency, the families' key-by-key check) stays
//! with the family; the checks both make (sizes, activation, padding id, ids inside the
//! vocabulary) and the stack configurations are here.

use crate::models::encoder_decoder::bart_stack_config;
use crate::transformer::{Activation, TransformerConfig};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::ops::{Deref, DerefMut};

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

/// The keys of [`BartConfig`] itself, as `config.json` names them (what a family's own keys
/// are added to).
pub const SHARED_KEYS: &[&str] = &[
    "vocab_size",
    "max_position_embeddings",
    "encoder_layers",
    "encoder_ffn_dim",
    "encoder_attention_heads",
    "decoder_layers",
    "decoder_ffn_dim",
    "decoder_attention_heads",
    "activation_function",
    "d_model",
    "scale_embedding",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "forced_eos_token_id",
    "tie_word_embeddings",
];

/// What a family adds to [`BartConfig`]: its own keys (the type, flattened into the same JSON
/// object), its layer order and its defaults.
pub trait ConfigExtras: DeserializeOwned + Sized {
    /// Each stack normalises before its sublayers (M2M100, mBART), not after (MarianMT).
    const PRE_NORM: bool;

    /// The whole config a `config.json` without any key describes: the values a missing key
    /// takes when the file is parsed.
    fn defaults() -> BartConfig<Self>;
}

/// The model half of a BART-family `config.json`: the keys transformers' `BartConfig` and its
/// copies share (field names as in the file), and the family's own keys in `extras` (read as
/// fields of the config too, through `Deref`). Unknown keys are the family's business
/// ([`crate::models::family_config::FamilyConfig::from_json`] refuses them, Marian ignores
/// them as transformers does); a missing key takes the family's default
/// ([`ConfigExtras::defaults`]).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(
    default = "ConfigExtras::defaults",
    bound(deserialize = "X: ConfigExtras"),
    expecting = "a config.json object"
)]
pub struct BartConfig<X> {
    /// Vocabulary size (the source one, and the target one unless the family has a separate
    /// decoder vocabulary).
    pub vocab_size: usize,
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
    /// Feed-forward activation (`swish` for opus-mt, `relu` for M2M100, exact `gelu` for
    /// mBART, `gelu_new`...).
    pub activation_function: String,
    /// Model size.
    pub d_model: usize,
    /// Multiply token embeddings by `sqrt(d_model)`.
    pub scale_embedding: bool,
    /// Padding id (Marian's decoder start token too; M2M100's positions count from it).
    pub pad_token_id: Option<u32>,
    /// End-of-sequence id(s).
    pub eos_token_id: Option<TokenIds>,
    /// The first token fed to the decoder.
    pub decoder_start_token_id: Option<u32>,
    /// Forced at the last allowed generation step.
    pub forced_eos_token_id: Option<TokenIds>,
    /// The output projection is the (decoder's) embedding table. For M2M100 / mBART also the
    /// encoder's and decoder's tables are one; with `false`, transformers 5.24 ties nothing
    /// there: the encoder, the decoder and the head read their own tensors.
    pub tie_word_embeddings: bool,
    /// The family's own keys.
    #[serde(flatten)]
    pub extras: X,
}

impl<X> Deref for BartConfig<X> {
    type Target = X;

    fn deref(&self) -> &X {
        &self.extras
    }
}

impl<X> DerefMut for BartConfig<X> {
    fn deref_mut(&mut self) -> &mut X {
        &mut self.extras
    }
}

impl<X: ConfigExtras> BartConfig<X> {
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

    /// `sqrt(d_model)` when `scale_embedding`, else 1.
    pub fn embed_scale(&self) -> f64 {
        if self.scale_embedding {
            (self.d_model as f64).sqrt()
        } else {
            1.0
        }
    }

    /// Every size at least 1: the shared ones, then `more` (a family's own, by name).
    pub(crate) fn check_sizes(&self, more: &[(&str, usize)]) -> candle::Result<()> {
        let shared = [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("encoder_layers", self.encoder_layers),
            ("decoder_layers", self.decoder_layers),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for &(name, v) in shared.iter().chain(more) {
            if v == 0 {
                candle::bail!("config.json: {name} must be at least 1")
            }
        }
        Ok(())
    }

    /// Each named id list inside a vocabulary of `size` tokens (`what`: "vocabulary",
    /// "target vocabulary"), else an error naming the key and the id.
    pub(crate) fn check_ids(
        ids: impl IntoIterator<Item = (&'static str, Option<Vec<u32>>)>,
        what: &str,
        size: usize,
    ) -> candle::Result<()> {
        for (name, ids) in ids {
            if let Some(&bad) = ids
                .unwrap_or_default()
                .iter()
                .find(|&&id| id as usize >= size)
            {
                candle::bail!("config.json: {name} {bad} is outside the {what} of {size} tokens")
            }
        }
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
            X::PRE_NORM,
        ))
    }

    /// The encoder stack's layers (Hugging Face names; pre-norm for M2M100 / mBART, post-norm
    /// for MarianMT).
    pub fn encoder_config(&self) -> candle::Result<TransformerConfig> {
        self.stack_config(
            self.encoder_attention_heads,
            self.encoder_ffn_dim,
            self.encoder_layers,
        )
    }

    /// The decoder stack's layers (Hugging Face names; pre-norm for M2M100 / mBART, post-norm
    /// for MarianMT).
    pub fn decoder_config(&self) -> candle::Result<TransformerConfig> {
        self.stack_config(
            self.decoder_attention_heads,
            self.decoder_ffn_dim,
            self.decoder_layers,
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::marian::MarianConfig;
    use crate::models::family_config::FamilyConfig;
    use crate::models::m2m100::M2M100;

    #[test]
    fn every_shared_key_is_a_field_of_both_families() {
        let base = serde_json::json!({"model_type": "m2m_100", "d_model": 32,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "vocab_size": 64});
        assert_eq!(super::SHARED_KEYS.len(), 16);
        for key in super::SHARED_KEYS {
            // An object is the wrong type for every field: refused only if the key is read.
            let mut v = base.clone();
            v[key] = serde_json::json!({"not": "a value"});
            let text = v.to_string();
            let err = FamilyConfig::from_json(&text, &M2M100).unwrap_err();
            let refused = |e: &str| e.contains("invalid type: map") || e.contains("TokenIds");
            assert!(refused(&err.to_string()), "{key}: {err}");
            let mut v = v.clone();
            v["model_type"] = "marian".into();
            let err = MarianConfig::from_json(&v.to_string()).unwrap_err();
            assert!(refused(&err.to_string()), "{key}: {err}");
        }
        // A family's own keys are fields of the config too.
        let cfg = FamilyConfig::from_json(&base.to_string(), &M2M100).unwrap();
        assert_eq!(
            (cfg.bos_token_id, cfg.model_type.as_str()),
            (Some(0), "m2m_100")
        );
        let cfg = MarianConfig::from_json(
            r#"{"d_model": 64, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "share_encoder_decoder_embeddings": false,
            "decoder_vocab_size": 70, "vocab_size": 80, "pad_token_id": 69,
            "decoder_start_token_id": 69}"#,
        )
        .unwrap();
        assert_eq!(cfg.target_vocab_size(), 70);
        assert!(!cfg.share_encoder_decoder_embeddings);
    }
}

//! Hugging Face mBART (`facebook/mbart-large-50-many-to-many-mmt`, `mbart-large-cc25`, ...;
//! `model_type` `mbart`, `MBartForConditionalGeneration`) as a configuration of the shared
//! encoder-decoder: pre-norm layers, a layer norm over the embeddings of each stack
//! (`layernorm_embedding`), learned positions with offset 2 (one table per stack,
//! `{stack}.embed_positions.weight`, `(max_position_embeddings + 2, d_model)`), final layer
//! norms, exact GELU, `final_logits_bias`, the head tied to `model.shared.weight` unless
//! `tie_word_embeddings` is `false`.
//!
//! Load a directory with [`crate::models::seq2seq::Seq2SeqModel::from_dir`]; the tokenizers
//! are in [`crate::tokenizers`].

use crate::models::family_config::{FamilyDef, PositionKind};

/// The mBART family: `config.json` with `model_type` `mbart`, defaults of transformers'
/// `MBartConfig` (5.24).
pub const MBART: FamilyDef = FamilyDef {
    model_type: "mbart",
    name: "mBART",
    architecture: "MBartForConditionalGeneration",
    defaults: r#"{
        "model_type": "mbart", "vocab_size": 50265, "max_position_embeddings": 1024,
        "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
        "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
        "activation_function": "gelu", "d_model": 1024, "scale_embedding": false,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": null,
        "forced_eos_token_id": 2, "tie_word_embeddings": true
    }"#,
    positions: PositionKind::Learned(2),
    embedding_norm: true,
    final_logits_bias: true,
    // Keys of configs converted from fairseq (mbart-large-cc25, mbart-large-50-*) that
    // transformers' MBartConfig stores as plain attributes and MBartForConditionalGeneration
    // never reads: the architecture is the one above whatever they say.
    ignored_keys: &[
        "add_bias_logits",
        "add_final_layer_norm",
        "normalize_before",
        "normalize_embedding",
        "static_position_embeddings",
        "extra_pos_embeddings",
        "force_bos_token_to_be_generated",
        "classif_dropout",
    ],
};

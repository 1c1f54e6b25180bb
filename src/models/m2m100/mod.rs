//! Hugging Face M2M100 (`facebook/m2m100_418M`, `_1.2B`) and the dense NLLB-200 checkpoints
//! (`facebook/nllb-200-distilled-600M`, ...), which transformers loads with the same class
//! (`model_type` `m2m_100`, `M2M100ForConditionalGeneration`), as a configuration of the
//! shared encoder-decoder: pre-norm layers, final layer norms on both stacks, ReLU, embeddings
//! times `sqrt(d_model)` (`scale_embedding`), fairseq sinusoidal positions computed from the
//! token ids ([`Positions::M2M100Sinusoidal`](crate::models::encoder_decoder::Positions):
//! offset 2 through `padding_idx` 1, pads at the zero row), no `final_logits_bias`, the head
//! tied to `model.shared.weight` unless `tie_word_embeddings` is `false`.
//!
//! Load a directory with [`crate::models::seq2seq::Seq2SeqModel::from_dir`]; the tokenizers
//! are in [`crate::tokenizers`].

use crate::models::family_config::{FamilyDef, PositionKind};

/// The M2M100 family: `config.json` with `model_type` `m2m_100`, defaults of transformers'
/// `M2M100Config` (5.24).
pub const M2M100: FamilyDef = FamilyDef {
    model_type: "m2m_100",
    name: "M2M100",
    architecture: "M2M100ForConditionalGeneration",
    defaults: r#"{
        "model_type": "m2m_100", "vocab_size": 128112, "max_position_embeddings": 1024,
        "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
        "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
        "activation_function": "relu", "d_model": 1024, "scale_embedding": true,
        "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2,
        "forced_eos_token_id": null, "tie_word_embeddings": true
    }"#,
    positions: PositionKind::M2M100Sinusoidal,
    embedding_norm: false,
    final_logits_bias: false,
    ignored_keys: &[],
};

//! Pretrained translation models as the Hugging Face hub has them, one directory each:
//!
//! * [`encoder_decoder`]: the BART-family encoder-decoder every family here is a configuration
//!   of (embeddings, positions, the layers, the output projection, step-by-step decoding);
//! * [`checkpoint`]: a directory's weights, `model.safetensors` or `pytorch_model.bin`;
//! * [`config`]: the `config.json` keys every family shares, one type
//!   ([`BartConfig`](config::BartConfig)) over each family's own keys;
//! * the families: [`marian`] (MarianMT, opus-mt; lenient as transformers with its config),
//!   and, on one checked config reader ([`family_config`]), [`m2m100`] (M2M100 and NLLB-200
//!   dense) and [`mbart`] (mBART-50);
//! * [`seq2seq`]: a directory's family by its `model_type`, and the M2M100 / mBART model.
//!
//! Text to text, for every family, is [`crate::Translator`].
//!
//! A family adds its `config.json` (turned into an
//! [`EncoderDecoderSpec`](encoder_decoder::EncoderDecoderSpec)), its tensor names
//! ([`WeightNames`](encoder_decoder::WeightNames)) and its tokenizer
//! ([`crate::tokenizers`]); generation is [`crate::generation`] for all of them.

pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod encoder_decoder;
pub mod family_config;
pub mod m2m100;
pub mod marian;
pub mod mbart;
pub mod seq2seq;
pub(crate) mod translation;

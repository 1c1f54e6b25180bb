//! Pretrained translation models as the Hugging Face hub has them, one directory each:
//!
//! * [`encoder_decoder`]: the BART-family encoder-decoder every family here is a configuration
//!   of (embeddings, positions, the layers, the output projection, step-by-step decoding);
//! * [`checkpoint`]: a directory's weights, `model.safetensors` or `pytorch_model.bin`;
//! * the families: [`marian`] (MarianMT, opus-mt).
//!
//! A family adds its `config.json` (turned into an
//! [`EncoderDecoderSpec`](encoder_decoder::EncoderDecoderSpec)), its tensor names
//! ([`WeightNames`](encoder_decoder::WeightNames)) and its tokenizer
//! ([`crate::tokenizers`]); generation is [`crate::generation`] for all of them.

pub mod checkpoint;
pub mod encoder_decoder;
pub mod marian;

//! Hugging Face MarianMT (`opus-mt-*`) translation models: generation matching `transformers`.

pub mod generation;

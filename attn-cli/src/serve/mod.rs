//! `attn serve`: a translation server that speaks LibreTranslate's HTTP API over the library's
//! [`candle_attention::Translator`], with continuous batching across requests.
//!
//! * [`backend`]: the contract between the HTTP layer and the engine;
//! * [`engine`]: the loaded models and the decoding thread (continuous batching);
//! * [`budget`]: the running batches' token budget, sized from the memory at rest;
//! * [`languages`]: LibreTranslate's language codes for the models' ones;
//! * [`http`]: the axum application, its routes, limits, metrics and the server loop;
//! * [`text`]: sentences, HTML fragments and language identification (pure functions).

pub mod backend;
pub mod budget;
pub mod engine;
pub mod http;
pub mod languages;
pub mod text;

//! `attn serve`: LibreTranslate's HTTP API over a batching translation engine.
//!
//! * [`backend`]: the contract between the HTTP layer and the engine.
//! * [`http`]: the axum application, its routes, limits, metrics and the server loop.
//! * [`text`]: sentence segmentation, HTML text runs and language identification.

pub mod backend;
pub mod http;
pub mod text;

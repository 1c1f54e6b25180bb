//! `attn serve`: a LibreTranslate-compatible translation server.

pub mod backend;
pub mod text;

//! The parts of the `attn` command that are worth a library of their own, kept out of
//! `candle-attention` because of what they pull in.
//!
//! * [`heatmap`]: cross-attention heatmaps of a translation as SVG or PNG (resvg, with the
//!   DejaVu Sans font embedded).
//! * [`number_translator`]: the English → German number translator (data, tokenizers,
//!   model, training, translating), the command's own application of the library.
//! * [`serve`]: `attn serve`, LibreTranslate's HTTP API over a batching engine.
//! * [`shipped`]: its trained model of `weights/`, embedded in the binary so an installed
//!   `attn` needs no source tree.
//! * [`torch_io`]: the edge of `attn run`: torch's layouts and masks of saved tensors in,
//!   outputs out.

#![warn(missing_docs)]

pub mod heatmap;
pub mod number_translator;
pub mod serve;
pub mod shipped;
pub mod torch_io;

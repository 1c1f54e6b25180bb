//! The parts of the `attn` command that are worth a library of their own, kept out of
//! `candle-attention` because of what they pull in.
//!
//! * [`heatmap`]: cross-attention heatmaps of a translation as SVG or PNG (resvg, with the
//!   DejaVu Sans font embedded).
//! * [`shipped`]: the trained translation model of `weights/`, embedded in the binary so an
//!   installed `attn` needs no source tree.

#![warn(missing_docs)]

pub mod heatmap;
pub mod shipped;

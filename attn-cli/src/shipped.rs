//! The translation model shipped in the repository's `weights/` (config, vocabularies and
//! weights, about 3.7 MB), embedded in the binary at build time, so an installed `attn`
//! (`cargo install --path attn-cli`) translates without the source tree. `include_bytes!`
//! tracks the files: editing `weights/` rebuilds the binary with the new model.

use crate::number_translator::translator::Translator;
use candle::Device;
use candle_attention::TensorFile;

/// `weights/config.json`.
pub const CONFIG: &str = include_str!("../../weights/config.json");
/// `weights/vocab.en.json`.
pub const SRC_VOCAB: &str = include_str!("../../weights/vocab.en.json");
/// `weights/vocab.de.json`.
pub const TGT_VOCAB: &str = include_str!("../../weights/vocab.de.json");
/// `weights/model.safetensors`.
pub static WEIGHTS: &[u8] = include_bytes!("../../weights/model.safetensors");

/// How the embedded model is named in errors.
pub const ORIGIN: &str = "the model built into attn (a copy of weights/)";

/// The shipped translator on `device`, read from the embedded copy (no file is opened, no
/// bytes are copied before loading).
pub fn translator(device: &Device) -> candle::Result<Translator> {
    let weights = TensorFile::from_static(WEIGHTS, ORIGIN)?;
    Translator::from_parts(CONFIG, SRC_VOCAB, TGT_VOCAB, &weights, ORIGIN, device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded copy is the files of `weights/` and translates.
    #[test]
    fn embedded_model_matches_the_weights_directory_and_translates() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../weights");
        assert_eq!(
            WEIGHTS,
            std::fs::read(format!("{dir}/model.safetensors")).unwrap()
        );
        assert_eq!(
            CONFIG,
            std::fs::read_to_string(format!("{dir}/config.json")).unwrap()
        );
        let t = translator(&Device::Cpu).unwrap();
        let out = t.translate(&["three hundred and forty-two"], 1).unwrap();
        assert_eq!(out[0].as_ref().unwrap(), "dreihundertzweiundvierzig");
    }
}

//! `MarianMTModel`: the shared encoder-decoder ([`EncoderDecoderModel`]) with a
//! [`MarianConfig`] and the BART family's tensor names.

use super::config::MarianConfig;
use crate::explain::ExplainModel;
use crate::generation::StepDecoder;
use crate::models::checkpoint::{list_dir, Checkpoint};
use crate::models::encoder_decoder::{DecodeState, EncoderDecoderModel, WeightNames};
use crate::transformer::{ModelTrace, TransformerDecoder, TransformerEncoder};
use crate::weights::Precision;
use candle::{DType, Device, Tensor};
use std::path::Path;

/// A Hugging Face `MarianMTModel` (opus-mt) for inference: the shared
/// [`EncoderDecoderModel`] (every method of which it has, through `Deref`: `encode`, `decode`,
/// `forward`, `start`, `step_logits`, `trace`, ...) built from a [`MarianConfig`].
///
/// ```no_run
/// use candle::{Device, Tensor};
/// use candle_attention::marian::MarianMTModel;
/// # fn main() -> candle::Result<()> {
/// let model = MarianMTModel::from_dir("opus-mt-en-de", &Device::Cpu)?;
/// let input_ids = Tensor::new(&[[42u32, 7, 0]], &Device::Cpu)?; // ends with </s> (id 0)
/// let attention_mask = Tensor::new(&[[1u32, 1, 1]], &Device::Cpu)?;
/// let memory = model.encode(&input_ids, &attention_mask)?; // (1, 3, d_model)
/// # let _ = memory;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MarianMTModel {
    cfg: MarianConfig,
    model: EncoderDecoderModel,
}

impl MarianMTModel {
    /// Loads a MarianMT directory as the Hugging Face hub has it: `config.json` and the weights
    /// in `model.safetensors` or `pytorch_model.bin` (f32, f16 or bf16; computed in f32).
    pub fn from_dir(dir: impl AsRef<Path>, device: &Device) -> candle::Result<Self> {
        Self::from_dir_with(dir, Precision::default(), device)
    }

    /// [`MarianMTModel::from_dir`] in a [`Precision`]: `f32` (the default), `bf16` or `f16`
    /// compute, or int8 weights ([`crate::weights::Quantization::Int8`], quantized at load).
    pub fn from_dir_with(
        dir: impl AsRef<Path>,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            candle::bail!(
                "{} is not a directory (a MarianMT model directory is expected)",
                dir.display()
            )
        }
        let config = dir.join("config.json");
        if !config.is_file() {
            candle::bail!(
                "{} is not a MarianMT model directory: config.json is missing; it holds {}",
                dir.display(),
                list_dir(dir)
            )
        }
        let cfg = MarianConfig::load(&config)?;
        let weights = Checkpoint::open_dir(dir)?;
        Self::load_with(cfg, &weights, precision, device)
    }

    /// Builds the model from a config and a state dict, computing in `dtype` on `device` (see
    /// [`EncoderDecoderModel::load`]: vocabulary sizes checked, `f32` safetensors weights used
    /// in place).
    pub fn load(
        cfg: MarianConfig,
        weights: &Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::load_with(cfg, weights, dtype.into(), device)
    }

    /// [`MarianMTModel::load`] in a [`Precision`] (see [`EncoderDecoderModel::load_with`]).
    pub fn load_with(
        cfg: MarianConfig,
        weights: &Checkpoint,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let model = EncoderDecoderModel::load_with(
            cfg.spec()?,
            &WeightNames::BART,
            weights,
            precision,
            device,
        )?;
        Ok(Self { cfg, model })
    }

    /// The configuration.
    pub fn config(&self) -> &MarianConfig {
        &self.cfg
    }
}

impl std::ops::Deref for MarianMTModel {
    type Target = EncoderDecoderModel;

    fn deref(&self) -> &EncoderDecoderModel {
        &self.model
    }
}

/// Decoding is the shared model's.
impl StepDecoder for MarianMTModel {
    type State = DecodeState;

    fn step(&self, state: &mut DecodeState, tokens: &[u32]) -> candle::Result<Tensor> {
        self.model.step(state, tokens)
    }

    fn reorder(&self, state: &mut DecodeState, rows: &[u32]) -> candle::Result<()> {
        self.model.reorder(state, rows)
    }

    fn reserve(&self, state: &mut DecodeState, positions: usize) -> candle::Result<()> {
        self.model.reserve(state, positions)
    }
}

/// Explaining is the shared model's.
impl ExplainModel for MarianMTModel {
    fn encoder(&self) -> &TransformerEncoder {
        self.model.encoder()
    }

    fn decoder(&self) -> &TransformerDecoder {
        self.model.decoder()
    }

    fn trace_ids(&self, source_ids: &[u32], decoder_ids: &[u32]) -> candle::Result<ModelTrace> {
        self.model.trace_ids(source_ids, decoder_ids)
    }
}

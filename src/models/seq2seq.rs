//! Any supported BART-family directory by its `config.json`'s `model_type`: [`Family`] names
//! it (an unsupported one is an error naming it and the supported ones), [`Seq2SeqModel`]
//! loads an M2M100 / NLLB-200 or mBART directory as the shared encoder-decoder with that
//! family's configuration. MarianMT directories have their own type
//! ([`crate::marian::MarianMTModel`]).

use super::checkpoint::{list_dir, Checkpoint};
use super::encoder_decoder::{DecodeState, EncoderDecoderModel, WeightNames};
use super::family_config::{FamilyConfig, FamilyDef};
use super::m2m100::M2M100;
use super::mbart::MBART;
use crate::explain::ExplainModel;
use crate::generation::StepDecoder;
use crate::transformer::{ModelTrace, TransformerDecoder, TransformerEncoder};
use crate::weights::Precision;
use candle::{DType, Device, Tensor};
use std::path::Path;

/// The model families this crate loads, by `config.json`'s `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `marian`: MarianMT (opus-mt), [`crate::marian`].
    Marian,
    /// `m2m_100`: M2M100 and NLLB-200 (dense), [`crate::models::m2m100`].
    M2M100,
    /// `mbart`: mBART (mBART-50), [`crate::models::mbart`].
    MBart,
}

impl Family {
    /// Every supported family, with its `model_type`.
    pub const ALL: [(&'static str, Family); 3] = [
        ("marian", Family::Marian),
        ("m2m_100", Family::M2M100),
        ("mbart", Family::MBart),
    ];

    /// The family of a `model_type`; an error naming it and the supported ones otherwise.
    pub fn from_model_type(model_type: &str) -> candle::Result<Self> {
        Self::ALL
            .iter()
            .find(|(t, _)| *t == model_type)
            .map(|(_, f)| *f)
            .ok_or_else(|| {
                candle::Error::Msg(format!(
                    "model_type \"{model_type}\" is not supported: supported are {} (MarianMT, \
                     M2M100 / NLLB-200, mBART)",
                    Self::ALL
                        .iter()
                        .map(|(t, _)| format!("\"{t}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// The family of a model directory, from its `config.json`'s `model_type` (errors name the
    /// file: missing, not JSON, an unsupported `model_type`). A config without `model_type` is
    /// MarianMT's (whose config reader accepts one; early opus-mt conversions have none).
    pub fn of_dir(dir: impl AsRef<Path>) -> candle::Result<Self> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            candle::bail!("{} is not a model directory", dir.display())
        }
        let path = dir.join("config.json");
        if !path.is_file() {
            candle::bail!(
                "{} is not a Hugging Face model directory: config.json is missing; it holds {}",
                dir.display(),
                list_dir(dir)
            )
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| candle::Error::Msg(format!("cannot read {}: {e}", path.display())))?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            candle::Error::Msg(format!("{} is not valid JSON: {e}", path.display()))
        })?;
        match value.get("model_type").and_then(|t| t.as_str()) {
            Some(t) => Self::from_model_type(t)
                .map_err(|e| candle::Error::Msg(format!("{}: {e}", path.display()))),
            // MarianConfig reads a config without model_type (early opus-mt conversions), as
            // this crate always has: such a directory stays a MarianMT one.
            None => Ok(Family::Marian),
        }
    }

    /// The `model_type` string.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Marian => "marian",
            Family::M2M100 => "m2m_100",
            Family::MBart => "mbart",
        }
    }

    /// The family's name for people ("MarianMT", "M2M100", "mBART").
    pub fn name(self) -> &'static str {
        match self {
            Family::Marian => "MarianMT",
            Family::M2M100 => M2M100.name,
            Family::MBart => MBART.name,
        }
    }

    /// The configuration definition of a family on [`FamilyConfig`] (`None` for MarianMT,
    /// whose config is [`crate::marian::MarianConfig`]).
    pub fn definition(self) -> Option<&'static FamilyDef> {
        match self {
            Family::Marian => None,
            Family::M2M100 => Some(&M2M100),
            Family::MBart => Some(&MBART),
        }
    }
}

/// An M2M100 / NLLB-200 (dense) or mBART model for inference: the shared
/// [`EncoderDecoderModel`] (every method of which it has, through `Deref`: `encode`, `decode`,
/// `forward`, `start`, `step_logits`, ...) built from the family's [`FamilyConfig`].
///
/// ```no_run
/// use candle::{Device, Tensor};
/// use candle_attention::models::seq2seq::Seq2SeqModel;
/// # fn main() -> candle::Result<()> {
/// let model = Seq2SeqModel::from_dir("nllb-200-distilled-600M", &Device::Cpu)?;
/// // [eng_Latn] pieces </s>, as NllbTokenizer writes them
/// let input_ids = Tensor::new(&[[256047u32, 9873, 248, 2]], &Device::Cpu)?;
/// let attention_mask = input_ids.ones_like()?;
/// let memory = model.encode(&input_ids, &attention_mask)?; // (1, 4, d_model)
/// # let _ = memory;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Seq2SeqModel {
    family: Family,
    cfg: FamilyConfig,
    model: EncoderDecoderModel,
}

impl Seq2SeqModel {
    /// Loads an M2M100 / NLLB-200 or mBART directory as the hub has it: `config.json` (its
    /// `model_type` picks the family) and the weights in `model.safetensors` or
    /// `pytorch_model.bin` (f32, f16 or bf16; computed in f32). A MarianMT directory, or one of
    /// an unsupported `model_type`, is an error naming it.
    pub fn from_dir(dir: impl AsRef<Path>, device: &Device) -> candle::Result<Self> {
        Self::from_dir_with_dtype(dir, DType::F32, device)
    }

    /// [`Seq2SeqModel::from_dir`], computing in `dtype`.
    pub fn from_dir_with_dtype(
        dir: impl AsRef<Path>,
        dtype: DType,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::from_dir_with(dir, dtype.into(), device)
    }

    /// [`Seq2SeqModel::from_dir`] in a [`Precision`]: a compute dtype, or int8 weights
    /// quantized at load.
    pub fn from_dir_with(
        dir: impl AsRef<Path>,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let dir = dir.as_ref();
        let family = Family::of_dir(dir)?;
        let Some(def) = family.definition() else {
            candle::bail!(
                "{} is a {} directory: load it with MarianMTModel",
                dir.display(),
                family.name()
            )
        };
        let cfg = FamilyConfig::load(dir.join("config.json"), def)?;
        let weights = Checkpoint::open_dir(dir)?;
        Self::load_with(family, cfg, &weights, precision, device)
    }

    /// Builds the model of `family` from a config and a state dict, computing in `dtype` on
    /// `device` (see [`EncoderDecoderModel::load`]).
    pub fn load(
        family: Family,
        cfg: FamilyConfig,
        weights: &Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::load_with(family, cfg, weights, dtype.into(), device)
    }

    /// [`Seq2SeqModel::load`] in a [`Precision`] (see [`EncoderDecoderModel::load_with`]).
    pub fn load_with(
        family: Family,
        cfg: FamilyConfig,
        weights: &Checkpoint,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        let Some(def) = family.definition() else {
            candle::bail!("{} has its own model type (MarianMTModel)", family.name())
        };
        let model = EncoderDecoderModel::load_with(
            cfg.spec(def)?,
            &WeightNames::BART,
            weights,
            precision,
            device,
        )?;
        Ok(Self { family, cfg, model })
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The configuration.
    pub fn config(&self) -> &FamilyConfig {
        &self.cfg
    }
}

impl std::ops::Deref for Seq2SeqModel {
    type Target = EncoderDecoderModel;

    fn deref(&self) -> &EncoderDecoderModel {
        &self.model
    }
}

/// Decoding is the shared model's.
impl StepDecoder for Seq2SeqModel {
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
impl ExplainModel for Seq2SeqModel {
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

//! How the commands that load a Hugging Face directory name and load it: `--dtype` /
//! `--quantize` ([`PrecisionArgs`]) and a model of any supported family ([`AnyModel`]: MarianMT,
//! M2M100 / NLLB-200, mBART, by `config.json`'s `model_type`).

use anyhow::Context;
use candle::Device;
use candle_attention::marian::MarianMTModel;
use candle_attention::models::encoder_decoder::EncoderDecoderModel;
use candle_attention::models::seq2seq::{Family, Seq2SeqModel};
use candle_attention::weights::{Precision, Quantization};
use std::path::Path;

/// How a pretrained model is held and computed: `--dtype` and `--quantize` (the names scripts
/// use; the README's "Precision" section gives the costs).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct PrecisionArgs {
    /// Compute dtype of the model. f32: exact (the parity suites' dtype). bf16: half the weight
    /// bytes and a faster memory-bound decoding step, outputs differing from f32 in ~1 % of
    /// tokens; AVX-512 BF16 multiplies it natively, other CPUs convert it (bf16's memory,
    /// f32's speed). f16: half the bytes, f32's speed on the CPU.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: crate::DTypeArg,
    /// Quantize the weight matrices at load time. int8: one scale per output row, inputs
    /// quantized per row at run time (as CTranslate2's int8); a quarter of the f32 weight
    /// bytes and the fastest decoding step, outputs differing from f32 slightly more than
    /// bf16's. Computes in f32 on the CPU (not with --dtype bf16/f16). Default: none (a
    /// directory written by `attn convert --quantize int8` is int8 without it).
    #[arg(long, value_enum)]
    pub quantize: Option<QuantizeArg>,
}

/// `--quantize` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum QuantizeArg {
    /// int8 weight matrices, one f32 scale per output row.
    Int8,
}

impl PrecisionArgs {
    /// The library's [`Precision`].
    pub fn precision(&self) -> Precision {
        Precision {
            dtype: self.dtype.dtype(),
            quantize: self.quantize.map(|q| match q {
                QuantizeArg::Int8 => Quantization::Int8,
            }),
        }
    }
}

/// Loads a MarianMT directory, with the directory in the error.
pub fn load_marian(
    dir: &Path,
    device: &Device,
    precision: Precision,
) -> anyhow::Result<MarianMTModel> {
    MarianMTModel::from_dir_with(dir, precision, device)
        .with_context(|| format!("loading the MarianMT model in {}", dir.display()))
}

/// A loaded model of any supported family.
pub enum AnyModel {
    /// A MarianMT directory.
    Marian(MarianMTModel),
    /// An M2M100 / NLLB-200 or mBART directory.
    Family(Seq2SeqModel),
}

impl AnyModel {
    /// Loads `dir`, detecting the family from `config.json` (an unsupported `model_type` is an
    /// error naming it and the supported ones).
    pub fn load(dir: &Path, device: &Device, precision: Precision) -> anyhow::Result<Self> {
        let family = Family::of_dir(dir)?;
        let model = match family {
            Family::Marian => {
                MarianMTModel::from_dir_with(dir, precision, device).map(Self::Marian)
            }
            _ => Seq2SeqModel::from_dir_with(dir, precision, device).map(Self::Family),
        };
        model.with_context(|| format!("loading the {} model in {}", family.name(), dir.display()))
    }

    /// The family's name.
    pub fn family_name(&self) -> &'static str {
        match self {
            Self::Marian(_) => Family::Marian.name(),
            Self::Family(m) => m.family().name(),
        }
    }

    /// The shared encoder-decoder.
    pub fn model(&self) -> &EncoderDecoderModel {
        match self {
            Self::Marian(m) => m,
            Self::Family(m) => m,
        }
    }
}

//! Where a Hugging Face model directory keeps its weights: `model.safetensors` (read through
//! [`TensorFile`]) or `pytorch_model.bin` (a torch zip pickle, read through this crate's own
//! validating reader, [`PthCheckpoint`]), behind one [`VarBuilder`] whose errors name the
//! missing tensor and the ones that exist. Integer weights are refused where the model needs
//! floating-point ones.

use crate::weights::int8::INT8_SCALE_SUFFIX;
use crate::weights::{PthCheckpoint, Quantization, TensorFile};
use candle::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::path::Path;

/// The weight files a model directory may hold, in the order they are tried.
pub const WEIGHT_FILES: [&str; 2] = ["model.safetensors", "pytorch_model.bin"];

/// The state dict of a model checkpoint, from either file format.
#[derive(Clone)]
pub enum Checkpoint {
    /// `model.safetensors` (memory-mapped; its `f32` weights can stay in place, see
    /// [`crate::weights::WeightSource::in_place`]).
    Safetensors(TensorFile),
    /// `pytorch_model.bin` (a torch zip pickle, validated when opened); tensors are read one
    /// at a time.
    Pth(PthCheckpoint),
}

impl Checkpoint {
    /// Opens `model.safetensors` or, failing that, `pytorch_model.bin` in `dir`. The error
    /// for a directory with neither lists the files it has.
    pub fn open_dir(dir: &Path) -> candle::Result<Self> {
        for name in WEIGHT_FILES {
            let path = dir.join(name);
            if path.is_file() {
                return Self::open(&path);
            }
        }
        if dir.join("model.safetensors.index.json").is_file()
            || dir.join("pytorch_model.bin.index.json").is_file()
        {
            candle::bail!(
                "{}: sharded checkpoints (*.index.json) are not supported; save the model as one \
                 file with save_pretrained(max_shard_size=\"100GB\")",
                dir.display()
            )
        }
        candle::bail!(
            "{} has no weights: expected {} or {}; it holds {}",
            dir.display(),
            WEIGHT_FILES[0],
            WEIGHT_FILES[1],
            list_dir(dir)
        )
    }

    /// Opens one weight file, by its extension (`.safetensors`, else a torch zip pickle). A
    /// file without any tensor is refused (as is a torch checkpoint that fails
    /// [`PthCheckpoint`]'s validation).
    pub fn open(path: &Path) -> candle::Result<Self> {
        if path.extension().is_some_and(|e| e == "safetensors") {
            let file = TensorFile::open(path)?;
            if file.names().is_empty() {
                candle::bail!("{}: holds no tensor", file.origin())
            }
            return Ok(Self::Safetensors(file));
        }
        Ok(Self::Pth(PthCheckpoint::open(path)?))
    }

    /// The safetensors file, whose `f32` weights can be used in place (`None` for a torch
    /// pickle, whose tensors sit in a zip archive).
    pub fn mapped(&self) -> Option<&TensorFile> {
        match self {
            Self::Safetensors(f) => Some(f),
            Self::Pth(..) => None,
        }
    }

    /// The file the weights come from, for messages.
    pub fn origin(&self) -> String {
        match self {
            Self::Safetensors(f) => f.origin().to_string(),
            Self::Pth(p) => p.origin().to_string(),
        }
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self {
            Self::Safetensors(f) => f.names().into_iter().map(String::from).collect(),
            Self::Pth(p) => p.names().into_iter().map(String::from).collect(),
        };
        names.sort();
        names
    }

    /// True when `name` is stored.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Self::Safetensors(f) => f.contains(name),
            Self::Pth(p) => p.contains(name),
        }
    }

    /// The stored shape of `name`, if stored.
    pub fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        match self {
            Self::Safetensors(f) => f.shape_of(name).ok(),
            Self::Pth(p) => p.info(name).map(|i| i.shape().to_vec()),
        }
    }

    /// How the weight matrices are stored when `attn convert` quantized them: `Some(Int8)`
    /// for a safetensors file holding int8 matrices (`NAME` as `I8` with `NAME.int8_scale`).
    pub fn quantization(&self) -> Option<Quantization> {
        let file = self.mapped()?;
        file.names()
            .iter()
            .any(|n| n.ends_with(INT8_SCALE_SUFFIX))
            .then_some(Quantization::Int8)
    }

    /// Number of stored parameters (elements of every tensor).
    pub fn parameter_count(&self) -> usize {
        self.names()
            .iter()
            .filter_map(|n| self.shape_of(n))
            .map(|s| s.iter().product::<usize>())
            .sum()
    }

    /// The stored dtype of the first floating-point tensor (`F32`, `F16`, `BF16`).
    pub fn stored_dtype(&self) -> Option<DType> {
        match self {
            Self::Safetensors(f) => f.summaries().iter().find_map(|s| match s.dtype.as_str() {
                "F32" => Some(DType::F32),
                "F16" => Some(DType::F16),
                "BF16" => Some(DType::BF16),
                "F64" => Some(DType::F64),
                _ => None,
            }),
            Self::Pth(p) => p
                .names()
                .into_iter()
                .filter_map(|n| p.info(n))
                .map(|i| i.dtype())
                .find(|d| d.is_float()),
        }
    }

    /// A [`VarBuilder`] over the state dict, converting to `dtype` on `device`.
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        match self {
            Self::Safetensors(f) => f.var_builder(dtype, device),
            Self::Pth(..) => {
                VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
            }
        }
    }

    /// The error for a tensor that is not there: its name and the stored names that share its
    /// parent prefix (or, if none, the first stored names).
    pub fn not_found(&self, name: &str) -> candle::Error {
        let names = self.names();
        let parent = name.rsplit_once('.').map_or("", |(p, _)| p);
        let mut near: Vec<&String> = names.iter().filter(|n| n.starts_with(parent)).collect();
        if near.is_empty() || parent.is_empty() {
            near = names.iter().take(12).collect();
        }
        let more = if near.len() > 12 { ", ..." } else { "" };
        let near: Vec<&str> = near.iter().take(12).map(|s| s.as_str()).collect();
        candle::Error::Msg(format!(
            "tensor '{name}' not found in {} ({} tensors); nearby: {}{more}",
            self.origin(),
            names.len(),
            near.join(", ")
        ))
    }
}

/// Only the torch pickle goes through this backend; safetensors uses [`TensorFile`]'s own.
impl SimpleBackend for Checkpoint {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle::Result<Tensor> {
        let t = self.get_unchecked(name, dtype, dev)?;
        if t.shape() != &s {
            candle::bail!(
                "tensor '{name}' in {} has shape {:?}, the model expects {:?}",
                self.origin(),
                t.dims(),
                s.dims()
            )
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle::Result<Tensor> {
        let t = match self {
            Self::Safetensors(f) => f.load(name, dev)?,
            Self::Pth(p) if !p.contains(name) => return Err(self.not_found(name)),
            Self::Pth(p) => p.load(name, dev)?,
        };
        crate::weights::refuse_int_as_float(name, &self.origin(), t.dtype(), dtype)?;
        t.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.contains(name)
    }
}

/// The entries of `dir`, for error messages.
pub(crate) fn list_dir(dir: &Path) -> String {
    match std::fs::read_dir(dir) {
        Err(e) => format!("nothing readable ({e})"),
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            if names.is_empty() {
                "no files".into()
            } else {
                names.join(", ")
            }
        }
    }
}

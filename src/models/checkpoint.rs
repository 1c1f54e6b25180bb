//! Where a Hugging Face model directory keeps its weights: `model.safetensors` (read through
//! [`TensorFile`]) or `pytorch_model.bin` (a torch pickle, read through candle's `PthTensors`),
//! behind one [`VarBuilder`] whose errors name the missing tensor and the ones that exist.

use crate::weights::TensorFile;
use candle::pickle::PthTensors;
use candle::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::path::{Path, PathBuf};

/// The weight files a model directory may hold, in the order they are tried.
pub const WEIGHT_FILES: [&str; 2] = ["model.safetensors", "pytorch_model.bin"];

/// The state dict of a model checkpoint, from either file format.
#[derive(Clone)]
pub enum Checkpoint {
    /// `model.safetensors` (memory-mapped; its `f32` weights can stay in place, see
    /// [`crate::weights::WeightSource::in_place`]).
    Safetensors(TensorFile),
    /// `pytorch_model.bin` (a torch zip pickle); tensors are read one at a time.
    Pth(std::sync::Arc<PthTensors>, PathBuf),
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

    /// Opens one weight file, by its extension (`.safetensors`, else a torch pickle).
    pub fn open(path: &Path) -> candle::Result<Self> {
        if path.extension().is_some_and(|e| e == "safetensors") {
            return Ok(Self::Safetensors(TensorFile::open(path)?));
        }
        let pth = PthTensors::new(path, None).map_err(|e| {
            candle::Error::Msg(format!(
                "{} is not a readable torch checkpoint (pytorch_model.bin): {e}",
                path.display()
            ))
        })?;
        Ok(Self::Pth(std::sync::Arc::new(pth), path.to_path_buf()))
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
            Self::Pth(_, path) => path.display().to_string(),
        }
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self {
            Self::Safetensors(f) => f.names().into_iter().map(String::from).collect(),
            Self::Pth(p, _) => p.tensor_infos().keys().cloned().collect(),
        };
        names.sort();
        names
    }

    /// True when `name` is stored.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            Self::Safetensors(f) => f.contains(name),
            Self::Pth(p, _) => p.tensor_infos().contains_key(name),
        }
    }

    /// The stored shape of `name`, if stored.
    pub fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        match self {
            Self::Safetensors(f) => f.shape_of(name).ok(),
            Self::Pth(p, _) => p
                .tensor_infos()
                .get(name)
                .map(|i| i.layout.shape().dims().to_vec()),
        }
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
            Self::Pth(p, _) => p
                .tensor_infos()
                .values()
                .map(|i| i.dtype)
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
            Self::Pth(p, _) => p.get(name)?.ok_or_else(|| self.not_found(name))?,
        };
        t.to_device(dev)?.to_dtype(dtype)
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

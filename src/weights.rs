//! Reading safetensors files and recognising attention weight layouts.
//!
//! [`TensorFile`] memory-maps a `.safetensors` file (falling back to reading it where mapping
//! is not possible), validates it with the `safetensors` crate (header length, offsets,
//! sizes), loads any tensor on any device, including torch's `BOOL` tensors that candle's own
//! loader refuses, and serves as a [`VarBuilder`] backend whose errors list the tensors that do
//! exist. Only the tensors asked for are copied out of the mapping, so loading a checkpoint
//! takes its tensors' memory once, not the file's twice.
//!
//! [`PthCheckpoint`] reads torch zip checkpoints (`pytorch_model.bin`, `torch.save(state_dict)`)
//! with this crate's own unpickler, which refuses any global outside a torch state dict's and
//! validates every tensor against its storage when the file opens (`weights/pth.rs`).
//!
//! Everywhere this crate takes a [`VarBuilder`], candle's own
//! `VarBuilder::from_mmaped_safetensors` works as well (it cannot read `BOOL` tensors, which
//! only masks and inputs use).
//!
//! [`MhaLayout`] and [`MhaWeightsInfo`] recognise the three ways attention projections are
//! named:
//!
//! | layout | names (under a prefix) |
//! |---|---|
//! | torch fused | `in_proj_weight` `(3E, E)`, `in_proj_bias` `(3E)`, `out_proj.weight`, `out_proj.bias` |
//! | torch separate (kdim/vdim ≠ E) | `q_proj_weight` `(E, E)`, `k_proj_weight` `(E, kdim)`, `v_proj_weight` `(E, vdim)`, `in_proj_bias`, `out_proj.*` |
//! | Hugging Face | `q_proj.weight`, `q_proj.bias`, `k_proj.*`, `v_proj.*`, `out_proj.*` |
//!
//! Torch's optional `bias_k`, `bias_v` `(1, 1, E)` go with any of them.

mod mapped;
mod source;

pub use mapped::MappedMatrix;
pub use source::{WeightMatrix, WeightSource};

use candle::{DType, Device, Shape, Tensor};
use candle_nn::VarBuilder;
use safetensors::tensor::{Dtype as StDtype, Metadata, TensorInfo};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

mod pth;
pub use pth::{PthCheckpoint, PthTensorInfo};

/// The name and shape of one tensor stored in a [`TensorFile`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSummary {
    /// Full tensor name.
    pub name: String,
    /// Stored dtype, as safetensors spells it (`F32`, `BOOL`, ...).
    pub dtype: String,
    /// Stored shape.
    pub shape: Vec<usize>,
}

impl TensorSummary {
    /// Number of elements (product of the shape).
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The bytes of a safetensors file, wherever they live.
enum Bytes {
    /// A read-only memory map of the file ([`TensorFile::open`]).
    Mapped(memmap2::Mmap),
    /// Read into memory (mapping failed, or [`TensorFile::from_bytes`]).
    Owned(Vec<u8>),
    /// Embedded in the program ([`TensorFile::from_static`]).
    Static(&'static [u8]),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
            Bytes::Static(s) => s,
        }
    }
}

struct Inner {
    /// Where the bytes came from, for error messages.
    origin: String,
    bytes: Bytes,
    /// Offset of the data section (8 + header length).
    data_start: usize,
    /// Sorted by name.
    infos: BTreeMap<String, TensorInfo>,
}

/// A validated safetensors file: memory-mapped, read, or embedded. Cheap to clone (clones
/// share the bytes).
#[derive(Clone)]
pub struct TensorFile {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TensorFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorFile")
            .field("origin", &self.inner.origin)
            .field("tensors", &self.inner.infos.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl TensorFile {
    /// Memory-maps and validates the file at `path`; where the file cannot be mapped (an
    /// empty file, a file system without mmap) it is read instead. Fails with the path and the
    /// reason for a missing, truncated or corrupt file.
    ///
    /// The file must not be modified while the `TensorFile` (or a clone) is alive: see the
    /// safety note in the source. Tensors loaded from it are copies and stay valid.
    pub fn open(path: impl AsRef<Path>) -> candle::Result<Self> {
        let path = path.as_ref();
        let cannot_read =
            |e: std::io::Error| candle::Error::Msg(format!("cannot read {}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(cannot_read)?;
        // SAFETY: `Mmap::map` is unsafe because the mapping aliases the file: if another
        // process truncates or rewrites it while we hold the map, reads see the new bytes or
        // fault (SIGBUS), which no Rust code can guard against. This is the contract every
        // mmap-based loader has (candle's `MmapedSafetensors`, safetensors' own docs): weight
        // files are not written while a model loads from them. Within this process the map is
        // read-only and only ever read through `&[u8]`, and it lives in `Inner` as long as any
        // borrowed slice of it (slices never outlive `&self`).
        let bytes = match unsafe { memmap2::MmapOptions::new().map(&file) } {
            Ok(map) => Bytes::Mapped(map),
            // Zero-length files cannot be mapped on Linux; other file systems may refuse too.
            // Reading gives the same validation and error messages.
            Err(_) => Bytes::Owned(std::fs::read(path).map_err(cannot_read)?),
        };
        Self::validate(bytes, path.display().to_string())
    }

    /// Validates `bytes` as a safetensors file; `origin` names it in error messages.
    pub fn from_bytes(bytes: Vec<u8>, origin: impl Into<String>) -> candle::Result<Self> {
        Self::validate(Bytes::Owned(bytes), origin.into())
    }

    /// Validates `bytes` that live for the whole program (`include_bytes!`) as a safetensors
    /// file, without copying them; `origin` names it in error messages.
    pub fn from_static(bytes: &'static [u8], origin: impl Into<String>) -> candle::Result<Self> {
        Self::validate(Bytes::Static(bytes), origin.into())
    }

    /// Whether the file is memory-mapped (`false` when it was read or is embedded).
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner.bytes, Bytes::Mapped(_))
    }

    fn validate(bytes: Bytes, origin: String) -> candle::Result<Self> {
        let (header_len, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| {
            candle::Error::Msg(format!(
                "{origin} is not a valid safetensors file ({} bytes): {e}",
                bytes.len()
            ))
        })?;
        let infos = tensor_infos(&metadata);
        Ok(Self {
            inner: Arc::new(Inner {
                origin,
                data_start: 8 + header_len,
                bytes,
                infos,
            }),
        })
    }

    /// Where the file came from (its path for [`TensorFile::open`]).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.inner.infos.keys().map(|s| s.as_str()).collect()
    }

    /// True if the file holds a tensor called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.inner.infos.contains_key(name)
    }

    /// Name, dtype and shape of `name`, without loading its data.
    pub fn summary(&self, name: &str) -> Option<TensorSummary> {
        self.inner.infos.get(name).map(|info| TensorSummary {
            name: name.to_string(),
            dtype: info.dtype.to_string(),
            shape: info.shape.clone(),
        })
    }

    /// Every tensor's summary, sorted by name.
    pub fn summaries(&self) -> Vec<TensorSummary> {
        self.names()
            .iter()
            .filter_map(|n| self.summary(n))
            .collect()
    }

    /// Stored shape of `name`, or an error that lists the tensors under the same prefix.
    pub fn shape_of(&self, name: &str) -> candle::Result<Vec<usize>> {
        match self.inner.infos.get(name) {
            Some(info) => Ok(info.shape.clone()),
            None => Err(self.not_found(name)),
        }
    }

    /// The names that start with `prefix.` (all names for an empty prefix), sorted. A trailing
    /// dot on `prefix` is accepted ([`normalize_prefix`]).
    pub fn names_under(&self, prefix: &str) -> Vec<&str> {
        let prefix = normalize_prefix(prefix);
        self.names()
            .into_iter()
            .filter(|n| {
                prefix.is_empty() || n.strip_prefix(prefix).is_some_and(|r| r.starts_with('.'))
            })
            .collect()
    }

    /// The error for a missing tensor: names it, and lists what exists under the block it
    /// belongs to (for `a.b.k_proj.weight`, under `a.b`), or what the file holds when that
    /// block is empty.
    pub fn not_found(&self, name: &str) -> candle::Error {
        let parent = |p: &str| {
            p.rsplit_once('.')
                .map(|(p, _)| p.to_string())
                .unwrap_or_default()
        };
        // A torch parameter `module.weight` belongs to `module`'s parent block.
        let mut prefix = parent(name);
        if name.ends_with(".weight") || name.ends_with(".bias") {
            prefix = parent(&prefix);
        }
        while !prefix.is_empty() && self.names_under(&prefix).is_empty() {
            prefix = parent(&prefix);
        }
        let prefix = prefix.as_str();
        let under = self.names_under(prefix);
        let listing = |names: &[&str]| {
            const MAX: usize = 40;
            let mut s = names
                .iter()
                .take(MAX)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            if names.len() > MAX {
                s.push_str(&format!(", ... ({} more)", names.len() - MAX));
            }
            s
        };
        let detail = if !under.is_empty() && !prefix.is_empty() {
            format!("tensors under '{prefix}': {}", listing(&under))
        } else if self.inner.infos.is_empty() {
            "the file holds no tensor".to_string()
        } else {
            format!("the file holds: {}", listing(&self.names()))
        };
        candle::Error::Msg(format!(
            "tensor '{name}' not found in {}; {detail}",
            self.inner.origin
        ))
    }

    /// The bytes of the whole file (mapped, read or embedded), for reading tensors in place.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.inner.bytes
    }

    /// Where the `F32` tensor `name` of `count` elements lies in [`TensorFile::bytes`]: its
    /// byte offset and stored shape; `None` when absent, of another dtype or size.
    pub(crate) fn f32_location(&self, name: &str, count: usize) -> Option<(usize, &[usize])> {
        let info = self.inner.infos.get(name)?;
        (info.dtype == StDtype::F32 && info.shape.iter().product::<usize>() == count).then(|| {
            (
                self.inner.data_start + info.data_offsets.0,
                info.shape.as_slice(),
            )
        })
    }

    /// Loads `name` onto `device` in its stored dtype. `BOOL` tensors become `U8` (0 or 1).
    pub fn load(&self, name: &str, device: &Device) -> candle::Result<Tensor> {
        let info = self
            .inner
            .infos
            .get(name)
            .ok_or_else(|| self.not_found(name))?;
        let (start, end) = info.data_offsets;
        let data = &self.inner.bytes[self.inner.data_start + start..self.inner.data_start + end];
        match info.dtype {
            StDtype::BOOL => {
                let values: Vec<u8> = data.iter().map(|&b| u8::from(b != 0)).collect();
                Tensor::from_vec(values, info.shape.as_slice(), device)
            }
            StDtype::U8
            | StDtype::U16
            | StDtype::U32
            | StDtype::I16
            | StDtype::I32
            | StDtype::I64
            | StDtype::F16
            | StDtype::BF16
            | StDtype::F32
            | StDtype::F64 => {
                use candle::safetensors::Load;
                let view =
                    safetensors::tensor::TensorView::new(info.dtype, info.shape.clone(), data)
                        .map_err(|e| candle::Error::Msg(format!("tensor '{name}': {e}")))?;
                view.load(device)
            }
            other => candle::bail!(
                "tensor '{name}' in {} has dtype {other}, which cannot be loaded \
                 (supported: BOOL, U8, U16, U32, I16, I32, I64, F16, BF16, F32, F64)",
                self.inner.origin
            ),
        }
    }

    /// Loads `name` and converts it to `dtype` on `device`.
    pub fn load_as(&self, name: &str, dtype: DType, device: &Device) -> candle::Result<Tensor> {
        self.load(name, device)?.to_dtype(dtype)
    }

    /// A [`VarBuilder`] reading from this file, converting tensors to `dtype` on `device`.
    /// Missing tensors and shape mismatches give errors that name the tensor, both shapes,
    /// and the tensors that exist under the same prefix.
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
    }
}

fn tensor_infos(metadata: &Metadata) -> BTreeMap<String, TensorInfo> {
    metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| (name, info.clone()))
        .collect()
}

/// The error for a weight stored as an integer (or bool) tensor where a model asks for a
/// floating-point one: casting it would turn token ids or masks into plausible-looking
/// weights.
pub(crate) fn refuse_int_as_float(
    name: &str,
    origin: &str,
    stored: DType,
    wanted: DType,
) -> candle::Result<()> {
    if stored.is_int() && wanted.is_float() {
        candle::bail!(
            "tensor '{name}' in {origin} is stored as {stored:?} (integers), but the model needs \
             floating-point weights ({wanted:?}): refused rather than cast"
        )
    }
    Ok(())
}

/// The [`VarBuilder`] backend: tensors converted to the dtype asked for, except integer ones
/// asked for as floats (an error naming the tensor, not a cast).
impl candle_nn::var_builder::SimpleBackend for TensorFile {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle::Result<Tensor> {
        let stored = self.shape_of(name)?;
        if stored.as_slice() != s.dims() {
            candle::bail!(
                "tensor '{name}' in {} has shape {stored:?}, expected {:?}",
                self.inner.origin,
                s.dims()
            )
        }
        self.get_unchecked(name, dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle::Result<Tensor> {
        let t = self.load(name, dev)?;
        refuse_int_as_float(name, &self.inner.origin, t.dtype(), dtype)?;
        t.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.contains(name)
    }
}

/// Writes tensors to a safetensors file (contiguous copies, names as given): what
/// [`TensorFile::open`] reads back. Errors name the file.
pub fn save_tensors(tensors: &[(&str, &Tensor)], path: impl AsRef<Path>) -> candle::Result<()> {
    let map: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(n, t)| Ok((n.to_string(), t.contiguous()?)))
        .collect::<candle::Result<_>>()?;
    let path = path.as_ref();
    candle::safetensors::save(&map, path)
        .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", path.display())))
}

/// How a multi-head attention block's projections are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MhaLayout {
    /// `torch.nn.MultiheadAttention` with one fused `in_proj_weight` `(3E, E)`, rows in q, k, v
    /// order, and `in_proj_bias` `(3E)`.
    TorchFused,
    /// `torch.nn.MultiheadAttention` with `kdim`/`vdim` ≠ `embed_dim`: `q_proj_weight`,
    /// `k_proj_weight`, `v_proj_weight` and still one fused `in_proj_bias` `(3E)`.
    TorchSeparate,
    /// Hugging Face style linear layers: `q_proj.weight`/`.bias`, `k_proj.*`, `v_proj.*`.
    HuggingFace,
}

impl MhaLayout {
    /// The tensor whose presence identifies each layout, in detection order.
    pub const MARKERS: [(MhaLayout, &'static str); 3] = [
        (MhaLayout::TorchFused, "in_proj_weight"),
        (MhaLayout::TorchSeparate, "q_proj_weight"),
        (MhaLayout::HuggingFace, "q_proj.weight"),
    ];

    /// Finds the layout from the names present (`contains` answers for names relative to the
    /// block's prefix). `None` if no marker tensor is there.
    pub fn detect(contains: impl Fn(&str) -> bool) -> Option<MhaLayout> {
        Self::MARKERS
            .iter()
            .find(|(_, marker)| contains(marker))
            .map(|(layout, _)| *layout)
    }

    /// Human-readable description.
    pub fn describe(&self) -> &'static str {
        match self {
            MhaLayout::TorchFused => "torch nn.MultiheadAttention (fused in_proj_weight)",
            MhaLayout::TorchSeparate => {
                "torch nn.MultiheadAttention (separate q/k/v_proj_weight, kdim/vdim != embed_dim)"
            }
            MhaLayout::HuggingFace => "Hugging Face (q_proj/k_proj/v_proj/out_proj)",
        }
    }

    /// The error when no layout is found under `prefix`: says what was looked for.
    pub fn not_found_message(prefix: &str) -> String {
        let looked_for = Self::MARKERS
            .iter()
            .map(|(layout, marker)| {
                format!("{} ({})", join_name(prefix, marker), layout.short_name())
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!("no multi-head attention weights under '{prefix}': looked for {looked_for}")
    }

    fn short_name(&self) -> &'static str {
        match self {
            MhaLayout::TorchFused => "torch fused",
            MhaLayout::TorchSeparate => "torch separate",
            MhaLayout::HuggingFace => "Hugging Face",
        }
    }
}

/// `prefix` without its trailing dots: torch's `state_dict(prefix=...)` and `load_state_dict`
/// write module prefixes as `"encoder.layers.0.self_attn."`, candle's `VarBuilder::pp` and this
/// crate as `"encoder.layers.0.self_attn"`; both mean the same block.
pub fn normalize_prefix(prefix: &str) -> &str {
    prefix.trim_end_matches('.')
}

/// `prefix.name`, or `name` for an empty prefix. A trailing dot on `prefix` is accepted
/// ([`normalize_prefix`]).
pub fn join_name(prefix: &str, name: &str) -> String {
    let prefix = normalize_prefix(prefix);
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// What the weights of one attention block say about its configuration, read from shapes
/// alone (no data is loaded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MhaWeightsInfo {
    /// The prefix the block's tensors live under (`""` for none), without a trailing dot.
    pub prefix: String,
    /// The name layout.
    pub layout: MhaLayout,
    /// `E`, from `out_proj.weight` `(E, E)`.
    pub embed_dim: usize,
    /// Input size of the key projection.
    pub kdim: usize,
    /// Input size of the value projection.
    pub vdim: usize,
    /// Whether the projections have biases.
    pub bias: bool,
    /// Whether `bias_k`/`bias_v` are present.
    pub add_bias_kv: bool,
    /// Number of parameters in the block.
    pub parameters: usize,
}

impl MhaWeightsInfo {
    /// Reads the block under `prefix` of `file`: its layout and sizes, checking that the
    /// shapes agree with each other (errors name the tensors and their shapes). `prefix` may
    /// end with a dot, as torch writes it; [`MhaWeightsInfo::prefix`] is stored without.
    pub fn from_file(file: &TensorFile, prefix: &str) -> candle::Result<Self> {
        let prefix = normalize_prefix(prefix);
        let name = |n: &str| join_name(prefix, n);
        let layout = MhaLayout::detect(|n| file.contains(&name(n))).ok_or_else(|| {
            candle::Error::Msg(format!(
                "{}; {}",
                MhaLayout::not_found_message(prefix),
                file.not_found(&name("in_proj_weight"))
            ))
        })?;
        let shape = |n: &str| file.shape_of(&name(n));
        let out_w = shape("out_proj.weight")?;
        let embed_dim = match out_w.as_slice() {
            [e, e2] if e == e2 => *e,
            _ => candle::bail!(
                "'{}' must be square (E, E), got {out_w:?}",
                name("out_proj.weight")
            ),
        };
        let matrix = |n: &str, rows: usize| -> candle::Result<usize> {
            let s = shape(n)?;
            match s.as_slice() {
                [r, c] if *r == rows => Ok(*c),
                _ => candle::bail!(
                    "'{}' has shape {s:?}, expected ({rows}, in_features) to match out_proj.weight {out_w:?}",
                    name(n)
                ),
            }
        };
        let (kdim, vdim) = match layout {
            MhaLayout::TorchFused => {
                let c = matrix("in_proj_weight", 3 * embed_dim)?;
                if c != embed_dim {
                    candle::bail!(
                        "'{}' has shape [{}, {c}], expected ({}, {embed_dim}) for embed_dim {embed_dim}",
                        name("in_proj_weight"),
                        3 * embed_dim,
                        3 * embed_dim
                    )
                }
                (embed_dim, embed_dim)
            }
            MhaLayout::TorchSeparate => {
                let q = matrix("q_proj_weight", embed_dim)?;
                if q != embed_dim {
                    candle::bail!(
                        "'{}' must be ({embed_dim}, {embed_dim}), got [{embed_dim}, {q}]",
                        name("q_proj_weight")
                    )
                }
                (
                    matrix("k_proj_weight", embed_dim)?,
                    matrix("v_proj_weight", embed_dim)?,
                )
            }
            MhaLayout::HuggingFace => {
                let q = matrix("q_proj.weight", embed_dim)?;
                if q != embed_dim {
                    candle::bail!(
                        "'{}' must be ({embed_dim}, {embed_dim}), got [{embed_dim}, {q}]",
                        name("q_proj.weight")
                    )
                }
                (
                    matrix("k_proj.weight", embed_dim)?,
                    matrix("v_proj.weight", embed_dim)?,
                )
            }
        };
        let bias = match layout {
            MhaLayout::TorchFused | MhaLayout::TorchSeparate => {
                file.contains(&name("in_proj_bias"))
            }
            MhaLayout::HuggingFace => file.contains(&name("q_proj.bias")),
        };
        let add_bias_kv = file.contains(&name("bias_k"));
        let parameters = file
            .names_under(prefix)
            .iter()
            .filter_map(|n| file.summary(n))
            .filter(|s| {
                let rel = &s.name[if prefix.is_empty() {
                    0
                } else {
                    prefix.len() + 1
                }..];
                MHA_TENSOR_NAMES.contains(&rel)
            })
            .map(|s| s.elem_count())
            .sum();
        Ok(Self {
            prefix: prefix.to_string(),
            layout,
            embed_dim,
            kdim,
            vdim,
            bias,
            add_bias_kv,
            parameters,
        })
    }

    /// Every attention block in `file`: each prefix under which a layout marker tensor
    /// appears, sorted by prefix.
    pub fn find_all(file: &TensorFile) -> Vec<candle::Result<Self>> {
        let mut prefixes: Vec<String> = file
            .names()
            .iter()
            .filter_map(|n| {
                MhaLayout::MARKERS.iter().find_map(|(_, marker)| {
                    if *n == *marker {
                        Some(String::new())
                    } else {
                        n.strip_suffix(marker)?
                            .strip_suffix('.')
                            .map(str::to_string)
                    }
                })
            })
            .collect();
        prefixes.sort();
        prefixes.dedup();
        prefixes.iter().map(|p| Self::from_file(file, p)).collect()
    }
}

/// Every tensor name (relative to the block) that belongs to an attention block.
pub const MHA_TENSOR_NAMES: [&str; 15] = [
    "in_proj_weight",
    "in_proj_bias",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "q_proj.weight",
    "q_proj.bias",
    "k_proj.weight",
    "k_proj.bias",
    "v_proj.weight",
    "v_proj.bias",
    "out_proj.weight",
    "out_proj.bias",
    "bias_k",
    "bias_v",
];

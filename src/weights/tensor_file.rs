//! [`TensorFile`]: a memory-mapped, validated safetensors file (torch's `BOOL` tensors
//! included) and the [`VarBuilder`] backend over it; [`save_tensors`], its writer. A leaf: the
//! weight sources and the in-place matrices build on it.

use candle::{DType, Device, Shape, Tensor};
use candle_nn::VarBuilder;
use safetensors::tensor::{Dtype as StDtype, Metadata, TensorInfo};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

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

    /// Drops this process's resident pages of the bytes `range` of a memory-mapped file (the
    /// whole 4 KiB pages inside it): for a weight the loader has copied (rounded to bf16,
    /// quantized) and does not read again, so that the load's peak resident set does not hold
    /// both. The pages stay in the page cache, and reading them again faults them back in
    /// from the file, unchanged. Nothing for a file read into memory or embedded, or where
    /// the system refuses (the advice is a hint).
    pub(crate) fn release(&self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        if let Bytes::Mapped(map) = &self.inner.bytes {
            let start = range.start.next_multiple_of(PAGE);
            let end = range.end.min(map.len()) / PAGE * PAGE;
            if start < end {
                // SAFETY: `MADV_DONTNEED` on this private, read-only file mapping only drops
                // this process's copies of the pages: no page was ever written (the map is
                // read-only), so the next access reads the same bytes from the file, and every
                // slice borrowed from the map still points at those bytes. A refusal (another
                // page size) leaves the pages resident, nothing else.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
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

    /// The stored bytes of `name` (safetensors' little-endian layout) with the dtype and shape
    /// the header gives, or `None` when absent.
    pub(crate) fn raw(&self, name: &str) -> Option<(&[u8], StDtype, &[usize])> {
        let info = self.inner.infos.get(name)?;
        let (start, end) = info.data_offsets;
        let data = &self.inner.bytes[self.inner.data_start + start..self.inner.data_start + end];
        Some((data, info.dtype, info.shape.as_slice()))
    }

    /// Byte offset of `name`'s data in [`TensorFile::bytes`], or `None` when absent.
    pub(crate) fn offset_of(&self, name: &str) -> Option<usize> {
        let info = self.inner.infos.get(name)?;
        Some(self.inner.data_start + info.data_offsets.0)
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

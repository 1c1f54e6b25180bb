//! `attn convert`: a Hugging Face model directory rewritten in a lower precision, so that it
//! loads in place from a memory map (start-up reads nothing it does not use, and the resident
//! set is the smaller file).
//!
//! * **int8** ([`ConvertTo::Int8`]): every weight matrix the model multiplies by (attention
//!   and feed-forward projections, embedding tables, the output projection) quantized as
//!   loading with `--quantize int8` would ([`crate::weights::Int8Matrix`]: one scale per row)
//!   and stored in the int8 file format documented there (`NAME` as `I8` in the kernels'
//!   panel order, `NAME.int8_scale` `F32`); the metadata says `"attn_quantization": "int8"`.
//!   Everything else (norms, biases, position tables) is kept as stored. Embedding tables the
//!   model does not read (the copies a tied checkpoint may store under the encoder's, the
//!   decoder's and the output projection's names) are dropped. A matrix whose column count is
//!   not a multiple of 4 stays as stored and is quantized when loaded. Such a directory loads
//!   int8 whatever `--quantize` says, and only for this crate.
//! * **bf16** ([`ConvertTo::Bf16`]): every floating-point tensor rounded to bf16 (to nearest
//!   even, as torch's `.to(torch.bfloat16)`): an ordinary checkpoint any loader reads, half
//!   the f32 size; run it with `--dtype bf16`.
//!
//! The other files of the directory (config, generation config, tokenizer) are copied. The
//! weights are written to a temporary file and renamed, so a failed conversion leaves no
//! half-written `model.safetensors`.

use super::checkpoint::{Checkpoint, WEIGHT_FILES};
use super::encoder_decoder::{model_prefix, EncoderDecoderModel, EncoderDecoderSpec, WeightNames};
use super::family_config::FamilyConfig;
use super::marian::MarianConfig;
use super::seq2seq::Family;
use crate::weights::int8::{INT8_SCALE_SUFFIX, QUANTIZATION_METADATA_KEY};
use crate::weights::{Int8Matrix, Precision, Quantization};
use candle::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as StDtype, TensorView};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// What [`convert_dir`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvertTo {
    /// int8 weight matrices with a scale per row, read in place.
    Int8,
    /// Every floating-point tensor in bf16.
    Bf16,
}

impl ConvertTo {
    /// `int8` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            ConvertTo::Int8 => "int8",
            ConvertTo::Bf16 => "bf16",
        }
    }
}

/// What [`convert_dir`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConvertReport {
    /// Tensors written.
    pub tensors: usize,
    /// Matrices stored quantized (int8).
    pub quantized: usize,
    /// Tensors of the source left out (embedding copies the model does not read).
    pub dropped: Vec<String>,
    /// Size of the source weight file, bytes.
    pub bytes_in: u64,
    /// Size of the written `model.safetensors`, bytes.
    pub bytes_out: u64,
    /// Other files copied.
    pub copied: Vec<String>,
    /// The source was already in the target form (written again as it was).
    pub already: bool,
}

/// The model's architecture as its directory describes it.
fn spec_of_dir(dir: &Path) -> candle::Result<EncoderDecoderSpec> {
    let family = Family::of_dir(dir)?;
    let config = dir.join("config.json");
    match family.definition() {
        None => MarianConfig::load(&config)?.spec(),
        Some(def) => FamilyConfig::load(&config, def)?.spec(def),
    }
}

/// A stored tensor's dtype, shape and little-endian bytes.
fn stored_bytes(
    weights: &Checkpoint,
    name: &str,
) -> candle::Result<(StDtype, Vec<usize>, Vec<u8>)> {
    match weights {
        Checkpoint::Safetensors(file) => file
            .raw(name)
            .map(|(data, dtype, shape)| (dtype, shape.to_vec(), data.to_vec()))
            .ok_or_else(|| weights.not_found(name)),
        Checkpoint::Pth(p) => {
            let t = p.load(name, &Device::Cpu)?;
            let (dtype, bytes) = tensor_bytes(&t)?;
            Ok((dtype, t.dims().to_vec(), bytes))
        }
    }
}

/// A CPU tensor's safetensors dtype and little-endian bytes.
fn tensor_bytes(t: &Tensor) -> candle::Result<(StDtype, Vec<u8>)> {
    let t = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F32 => (
            StDtype::F32,
            t.to_vec1::<f32>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::F64 => (
            StDtype::F64,
            t.to_vec1::<f64>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::F16 => (
            StDtype::F16,
            t.to_vec1::<half::f16>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::BF16 => (
            StDtype::BF16,
            t.to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::I64 => (
            StDtype::I64,
            t.to_vec1::<i64>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::U32 => (
            StDtype::U32,
            t.to_vec1::<u32>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::U8 => (StDtype::U8, t.to_vec1::<u8>()?),
        other => candle::bail!("cannot write a {other:?} tensor"),
    })
}

/// `bytes` of `dtype` rounded to bf16, or `None` for a tensor that is not floating-point.
fn to_bf16(dtype: StDtype, bytes: &[u8]) -> Option<Vec<u8>> {
    let values: Vec<f32> = match dtype {
        StDtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        StDtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        StDtype::F64 => bytes
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect(),
        StDtype::BF16 => return Some(bytes.to_vec()),
        _ => return None,
    };
    Some(
        values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
    )
}

/// Rewrites the model directory `src` into `dst` (created if missing) as `to` says (see the
/// module documentation). `dst` must not be `src` and must not hold a weight file already
/// unless `overwrite`.
pub fn convert_dir(
    src: &Path,
    dst: &Path,
    to: ConvertTo,
    overwrite: bool,
) -> candle::Result<ConvertReport> {
    let spec = spec_of_dir(src)?;
    let weights = Checkpoint::open_dir(src)?;
    std::fs::create_dir_all(dst)
        .map_err(|e| candle::Error::Msg(format!("cannot create {}: {e}", dst.display())))?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(src, dst) {
        candle::bail!(
            "--output {} is the model directory itself: write to another one",
            dst.display()
        )
    }
    if !overwrite {
        if let Some(f) = WEIGHT_FILES.iter().find(|f| dst.join(f).exists()) {
            candle::bail!(
                "{} already holds {f}: remove it, choose another --output, or pass --force",
                dst.display()
            )
        }
    }
    let mut report = ConvertReport {
        bytes_in: WEIGHT_FILES
            .iter()
            .find_map(|f| std::fs::metadata(src.join(f)).ok())
            .map_or(0, |m| m.len()),
        ..ConvertReport::default()
    };
    let mut metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    // name → (dtype, shape, bytes), in the source's name order.
    let mut out: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = Vec::new();
    match to {
        ConvertTo::Int8 => {
            report.already = weights.quantization() == Some(Quantization::Int8);
            metadata.insert(QUANTIZATION_METADATA_KEY.to_string(), "int8".to_string());
            let log = Arc::new(Mutex::new(Vec::new()));
            let precision = Precision {
                dtype: DType::F32,
                quantize: Some(Quantization::Int8),
            };
            let names = WeightNames::BART;
            EncoderDecoderModel::load_logged(
                spec,
                &names,
                &weights,
                precision,
                &Device::Cpu,
                Some(log.clone()),
            )?;
            let quantized: HashMap<String, Int8Matrix> = log
                .lock()
                .map_err(|_| candle::Error::Msg("internal: the matrix log is poisoned".into()))?
                .drain(..)
                .collect();
            let prefix = model_prefix(|n| weights.contains(n));
            let mut unread_tables: BTreeSet<String> = names
                .shared_embedding
                .iter()
                .chain([&names.encoder_embedding, &names.decoder_embedding])
                .map(|n| format!("{prefix}{n}"))
                .collect();
            unread_tables.insert(names.lm_head.to_string());
            for name in weights.names() {
                if let Some(m) = quantized.get(&name) {
                    if let Some(bytes) = m.file_bytes() {
                        out.push((name.clone(), StDtype::I8, vec![m.rows(), m.cols()], bytes));
                        out.push((
                            format!("{name}{INT8_SCALE_SUFFIX}"),
                            StDtype::F32,
                            vec![m.rows()],
                            m.scale_bytes(),
                        ));
                        report.quantized += 1;
                        continue;
                    }
                } else if unread_tables.contains(&name) && !report.already {
                    report.dropped.push(name);
                    continue;
                }
                let (dtype, shape, bytes) = stored_bytes(&weights, &name)?;
                out.push((name, dtype, shape, bytes));
            }
            if report.already {
                report.quantized = out
                    .iter()
                    .filter(|t| t.0.ends_with(INT8_SCALE_SUFFIX))
                    .count();
            }
        }
        ConvertTo::Bf16 => {
            if weights.quantization().is_some() {
                candle::bail!(
                    "{} holds int8 weights: convert the original f32/f16/bf16 directory to bf16 instead",
                    weights.origin()
                )
            }
            let mut already = true;
            for name in weights.names() {
                let (dtype, shape, bytes) = stored_bytes(&weights, &name)?;
                match to_bf16(dtype, &bytes) {
                    Some(b) => {
                        already &= dtype == StDtype::BF16;
                        out.push((name, StDtype::BF16, shape, b))
                    }
                    None => out.push((name, dtype, shape, bytes)),
                }
            }
            report.already = already;
        }
    }
    let views = out
        .iter()
        .map(|(n, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
                .map_err(|e| candle::Error::Msg(format!("tensor '{n}': {e}")))
        })
        .collect::<candle::Result<Vec<_>>>()?;
    report.tensors = views.len();
    let tmp = dst.join("model.safetensors.partial");
    let target = dst.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(metadata), &tmp)
        .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", tmp.display())))?;
    sort_metadata(&tmp)?;
    // The source's permissions (the writer creates the file private to its owner).
    if let Some(perm) = WEIGHT_FILES
        .iter()
        .find_map(|f| std::fs::metadata(src.join(f)).ok())
        .map(|m| m.permissions())
    {
        std::fs::set_permissions(&tmp, perm)
            .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", tmp.display())))?;
    }
    std::fs::rename(&tmp, &target)
        .map_err(|e| candle::Error::Msg(format!("cannot write {}: {e}", target.display())))?;
    // A stale pickle beside the new file would not be read (safetensors comes first), but it
    // would mislead whoever looks at the directory.
    let stale = dst.join("pytorch_model.bin");
    if stale.exists() {
        std::fs::remove_file(&stale)
            .map_err(|e| candle::Error::Msg(format!("cannot remove {}: {e}", stale.display())))?;
    }
    report.bytes_out = std::fs::metadata(&target).map_or(0, |m| m.len());
    let entries = std::fs::read_dir(src)
        .map_err(|e| candle::Error::Msg(format!("cannot read {}: {e}", src.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let weight_file = WEIGHT_FILES.contains(&name.as_str())
            || [
                ".safetensors",
                ".bin",
                ".h5",
                ".msgpack",
                ".ot",
                ".pt",
                ".pth",
            ]
            .iter()
            .any(|ext| name.ends_with(ext));
        if weight_file || !entry.path().is_file() {
            continue;
        }
        std::fs::copy(entry.path(), dst.join(&name)).map_err(|e| {
            candle::Error::Msg(format!("cannot copy {name} into {}: {e}", dst.display()))
        })?;
        report.copied.push(name);
    }
    report.copied.sort();
    Ok(report)
}

/// Rewrites, in place, the `__metadata__` of the safetensors file at `path` with its keys in
/// sorted order, so that converting the same directory twice writes the same bytes
/// (`safetensors` writes the metadata from a `HashMap`, in an order that changes from run to
/// run). The header keeps its length: the same entries, reordered.
fn sort_metadata(path: &Path) -> candle::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let fail = |e: &dyn std::fmt::Display| {
        candle::Error::Msg(format!("cannot write {}: {e}", path.display()))
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| fail(&e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| fail(&e))?;
    let len = usize::try_from(u64::from_le_bytes(len)).map_err(|e| fail(&e))?;
    let mut header = vec![0u8; len];
    file.read_exact(&mut header).map_err(|e| fail(&e))?;
    let text = std::str::from_utf8(&header).map_err(|e| fail(&e))?;
    let meta_start = match text.find("\"__metadata__\":") {
        Some(at) => at + "\"__metadata__\":".len(),
        None => return Ok(()),
    };
    let meta_end = meta_start
        + text[meta_start..]
            .find('}')
            .ok_or_else(|| fail(&"a metadata object without its end"))?
        + 1;
    let sorted: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&text[meta_start..meta_end]).map_err(|e| fail(&e))?;
    let rewritten = serde_json::to_string(&sorted).map_err(|e| fail(&e))?;
    if rewritten.len() != meta_end - meta_start {
        return Err(fail(&"the metadata changed length when sorted"));
    }
    file.seek(SeekFrom::Start(8 + meta_start as u64))
        .and_then(|_| file.write_all(rewritten.as_bytes()))
        .map_err(|e| fail(&e))
}

//! Weight matrices quantized to 8-bit integers ([`Int8Matrix`]), as CTranslate2 quantizes
//! them: one symmetric scale per row (per output of a projection, per token of an embedding
//! table), values rounded to the nearest of `-127 ..= 127`.
//!
//! For a row `w` of `W` `(rows, cols)`: `scale = max|w| / 127` and `q = round(w · 127 /
//! max|w|)` (ties to even), so `w ≈ scale · q` with an error of at most `scale / 2` per value
//! (0.4 % of the row's largest magnitude). A row of zeros has scale 0. `-128` is never used,
//! which keeps every kernel's products symmetric (see `crate::projection::int8`).
//!
//! **Layout** (what the product kernels read, chosen so that no kernel sums across a vector):
//! the rows are grouped into panels of [`INT8_PANEL`] = 64 (the last one padded with zero
//! rows), the columns into groups of 4 (the last one padded with zeros); panel `p` holds, for
//! each column group `g`, the 4 values of group `g` of each of its 64 rows: byte
//! `((p · groups + g) · 64 + r) · 4 + j` is `q[64 p + r][4 g + j]`. One 64-byte vector holds
//! 4 inputs of 16 outputs: the operand of one `vpdpbusd`.
//!
//! **In a file** (what `attn convert --quantize int8` writes, read in place from the memory
//! map): a matrix `NAME` `(rows, cols)` with `cols` a multiple of 4 is stored as the tensor
//! `NAME`, dtype `I8`, shape `(rows, cols)`, whose bytes are the panels above *without the
//! padding rows*: the full panels as in memory, then the last partial panel (`h = rows mod
//! 64` rows) as `((g · h) + r) · 4 + j`; and `NAME.int8_scale`, dtype `F32`, shape `(rows)`.
//! The safetensors metadata says `"attn_quantization": "int8"`. The bytes are not row-major:
//! only this crate reads them. The full panels stay in the file; the partial one is copied
//! (padded) at load, and the row sums are computed from the bytes then (a wrong sum in a file
//! would silently shift every output, so it is not trusted from one).

pub(crate) use super::int8_rule::{quantize_row, quantize_value, row_scale};
pub use super::int8_rule::{INT8_GROUP, INT8_PANEL};
#[cfg(target_arch = "x86_64")]
use super::int8_x86;
use super::tensor_file::TensorFile;
use crate::simd::Isa;
use candle::Result;
use rayon::prelude::*;
use safetensors::tensor::Dtype as StDtype;
use std::sync::Arc;

/// The suffix of the scale tensor of a quantized matrix in a file: `NAME.int8_scale`.
pub const INT8_SCALE_SUFFIX: &str = ".int8_scale";
/// The safetensors metadata key (and value `int8`) of a file `attn convert` quantized.
pub const QUANTIZATION_METADATA_KEY: &str = "attn_quantization";

/// A `(rows, cols)` weight matrix quantized to `i8` with one `f32` scale per row (see the
/// module documentation for the rule and the layout). Cheap to clone (clones share the
/// values).
#[derive(Clone)]
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    /// The panels.
    values: Values,
    /// `(rows)`: `W[n] ≈ scales[n] · q[n]`.
    scales: Arc<Vec<f32>>,
    /// `(rows)`: `Σ_k q[n][k]`, the correction of a product whose other operand was offset by
    /// 128 to make it unsigned (`vpdpbusd` multiplies unsigned by signed bytes).
    sums: Arc<Vec<i32>>,
}

/// Where an [`Int8Matrix`]'s panels live.
#[derive(Clone)]
enum Values {
    /// Every panel (the last one padded) in memory: `rows.div_ceil(64) · groups · 256` bytes.
    Owned(Arc<Vec<i8>>),
    /// The `full` full panels in place in a file (from byte `offset` of its bytes), the last
    /// partial one, if any, copied and padded.
    Mapped {
        file: TensorFile,
        offset: usize,
        full: usize,
        tail: Option<Arc<Vec<i8>>>,
    },
}

impl std::fmt::Debug for Int8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Int8Matrix({} x {})", self.rows, self.cols)
    }
}

/// Quantizes the rows of one panel: `w` holds its `scales.len()` (≤ 64) rows of `cols` values,
/// `panel` its `groups · 256` bytes (zeros on entry: the padding stays zero), `scales` and
/// `sums` its rows' entries; `row` is scratch of `groups · 4` values. `Err(r)` names the first
/// row holding a NaN or an infinity. The portable level's kernel and the definition the x86
/// ones (`super::int8_x86`) match byte for byte: a row is quantized into `row`, then its
/// groups of 4 are copied to their places 256 bytes apart (the layout's scatter, per group
/// rather than per value).
fn quantize_panel(
    w: &[f32],
    cols: usize,
    panel: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
    row: &mut [i8],
) -> std::result::Result<(), usize> {
    for (r, (scale, sum)) in scales.iter_mut().zip(sums.iter_mut()).enumerate() {
        let values = &w[r * cols..(r + 1) * cols];
        let (s, inv) = row_scale(values).ok_or(r)?;
        *scale = s;
        let mut total = 0i32;
        for (q, &v) in row.iter_mut().zip(values) {
            *q = quantize_value(v, inv);
            total += *q as i32;
        }
        *sum = total;
        for (g, group) in row.chunks_exact(INT8_GROUP).enumerate() {
            let at = (g * INT8_PANEL + r) * INT8_GROUP;
            panel[at..at + INT8_GROUP].copy_from_slice(group);
        }
    }
    Ok(())
}

/// [`quantize_panel`] at `isa` (the x86 levels with their own kernels, `super::int8_x86`).
/// Every level gives the same bytes: each value is rounded on its own, exactly
/// ([`quantize_value`]), and the sums are of integers. `next` holds the rows after the panel's,
/// which the x86 kernels prefetch.
// The slices one by one: bundled in a struct of `&mut` fields they lose the compiler's
// no-alias facts (the inlined portable kernel ran 20% slower so, AMD EPYC Zen 4, 2026-12-05).
#[allow(clippy::too_many_arguments)]
fn quantize_panel_at(
    isa: Isa,
    w: &[f32],
    next: &[f32],
    cols: usize,
    panel: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
    row: &mut [i8],
) -> std::result::Result<(), usize> {
    match isa {
        // SAFETY: `Isa::Avx512` and `Isa::Avx2` exist only where the CPU has them.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            int8_x86::quantize_panel_avx512(w, next, cols, panel, scales, sums)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { int8_x86::quantize_panel_avx2(w, next, cols, panel, scales, sums) },
        Isa::Portable => quantize_panel(w, cols, panel, scales, sums, row),
    }
}

impl Int8Matrix {
    /// Quantizes `w` `(rows, cols)` row-major. An error names the first row holding a NaN or
    /// an infinity (a checkpoint with one is broken; quantizing would hide it).
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Result<Self> {
        Self::quantize_at(Isa::get(), w, rows, cols)
    }

    /// [`Int8Matrix::quantize`] with the kernels of `isa`.
    pub(crate) fn quantize_at(isa: Isa, w: &[f32], rows: usize, cols: usize) -> Result<Self> {
        let Some(len) = rows.checked_mul(cols) else {
            candle::bail!("cannot quantize a {rows} x {cols} matrix: too many values")
        };
        if w.len() != len {
            candle::bail!(
                "cannot quantize a {rows} x {cols} matrix from {} values",
                w.len()
            )
        }
        let groups = cols.div_ceil(INT8_GROUP);
        let panel_bytes = groups * INT8_PANEL * INT8_GROUP;
        let panels = rows.div_ceil(INT8_PANEL);
        let mut values = vec![0i8; panels * panel_bytes];
        let mut scales = vec![0f32; rows];
        let mut sums = vec![0i32; rows];
        // One task per panel: its 64 rows' scales, sums and bytes are its own. A task's row
        // scratch is zero past `cols` (the padding of the last group).
        let bad_row = values
            .par_chunks_mut(panel_bytes.max(1))
            .zip(scales.par_chunks_mut(INT8_PANEL))
            .zip(sums.par_chunks_mut(INT8_PANEL))
            .enumerate()
            .map_init(
                || vec![0i8; groups * INT8_GROUP],
                |row, (p, ((panel, scales), sums))| {
                    let first = p * INT8_PANEL;
                    let (w, next) = w[first * cols..].split_at(scales.len() * cols);
                    let next = &next[..next.len().min(INT8_PANEL * cols)];
                    quantize_panel_at(isa, w, next, cols, panel, scales, sums, row)
                        .err()
                        .map(|r| first + r)
                },
            )
            .flatten()
            .min();
        if let Some(n) = bad_row {
            candle::bail!("row {n} holds a NaN or an infinity: it cannot be quantized")
        }
        Ok(Self {
            rows,
            cols,
            values: Values::Owned(Arc::new(values)),
            scales: Arc::new(scales),
            sums: Arc::new(sums),
        })
    }

    /// The matrix `name` `(rows, cols)` stored quantized in `file` (the module documentation
    /// gives the format), read in place: `None` when `name` is not an `I8` tensor there; an
    /// error naming the tensor when it is one but does not hold this matrix (shape, scale
    /// tensor, sizes, a scale that is negative or not finite).
    pub fn in_file(
        file: &TensorFile,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Option<Result<Self>> {
        let (data, dtype, shape) = file.raw(name)?;
        if dtype != StDtype::I8 {
            return None;
        }
        Some(Self::read(file, name, data, shape, rows, cols))
    }

    fn read(
        file: &TensorFile,
        name: &str,
        data: &[u8],
        shape: &[usize],
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let origin = file.origin();
        if shape != [rows, cols] {
            candle::bail!(
                "int8 tensor '{name}' in {origin} has shape {shape:?}, the model expects ({rows}, {cols})"
            )
        }
        if !cols.is_multiple_of(INT8_GROUP) || data.len() != rows * cols {
            candle::bail!(
                "int8 tensor '{name}' in {origin}: {} bytes for ({rows}, {cols}); the int8 layout needs \
                 a column count that is a multiple of 4",
                data.len()
            )
        }
        let scale_name = format!("{name}{INT8_SCALE_SUFFIX}");
        let scales: Vec<f32> = match file.raw(&scale_name) {
            Some((bytes, StDtype::F32, s)) if s == [rows] => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Some((_, dtype, s)) => candle::bail!(
                "'{scale_name}' in {origin} must be F32 of shape ({rows}), got {dtype:?} {s:?}"
            ),
            None => candle::bail!(
                "int8 tensor '{name}' in {origin} has no scales: '{scale_name}' is missing"
            ),
        };
        if let Some(n) = scales.iter().position(|s| !(s.is_finite() && *s >= 0.0)) {
            candle::bail!(
                "'{scale_name}' in {origin}: row {n} has scale {}, not a finite non-negative number",
                scales[n]
            )
        }
        // SAFETY: `i8` and `u8` have the same size and alignment and every bit pattern is
        // valid for both; the slice borrows `data`, which lives as long as `file`.
        let values: &[i8] = unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), data.len()) };
        let groups = cols / INT8_GROUP;
        let panel_bytes = groups * INT8_PANEL * INT8_GROUP;
        let full = rows / INT8_PANEL;
        let h = rows % INT8_PANEL;
        let tail = (h > 0).then(|| {
            let src = &values[full * panel_bytes..];
            let mut padded = vec![0i8; panel_bytes];
            for g in 0..groups {
                let from = &src[g * h * INT8_GROUP..][..h * INT8_GROUP];
                padded[g * INT8_PANEL * INT8_GROUP..][..h * INT8_GROUP].copy_from_slice(from);
            }
            Arc::new(padded)
        });
        let offset = file.offset_of(name).expect("the tensor was just found");
        let matrix = Self {
            rows,
            cols,
            values: Values::Mapped {
                file: file.clone(),
                offset,
                full,
                tail,
            },
            scales: Arc::new(scales),
            sums: Arc::new(Vec::new()),
        };
        let mut sums = vec![0i32; rows];
        sums.par_chunks_mut(INT8_PANEL)
            .enumerate()
            .for_each(|(p, sums)| {
                let panel = matrix.panel(p);
                for group in panel.chunks_exact(INT8_PANEL * INT8_GROUP) {
                    for (sum, q) in sums.iter_mut().zip(group.chunks_exact(INT8_GROUP)) {
                        *sum += q.iter().map(|&q| q as i32).sum::<i32>();
                    }
                }
            });
        Ok(Self {
            sums: Arc::new(sums),
            ..matrix
        })
    }

    /// The bytes of this matrix in a file (the module documentation's format), or `None` when
    /// its column count is not a multiple of 4 (such a matrix is stored unquantized).
    pub fn file_bytes(&self) -> Option<Vec<u8>> {
        if !self.cols.is_multiple_of(INT8_GROUP) {
            return None;
        }
        let groups = self.groups();
        let full = self.rows / INT8_PANEL;
        let h = self.rows % INT8_PANEL;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for p in 0..full {
            out.extend(self.panel(p).iter().map(|&q| q as u8));
        }
        if h > 0 {
            let panel = self.panel(full);
            for g in 0..groups {
                let rows = &panel[g * INT8_PANEL * INT8_GROUP..][..h * INT8_GROUP];
                out.extend(rows.iter().map(|&q| q as u8));
            }
        }
        Some(out)
    }

    /// The scales as little-endian `f32` bytes (`NAME.int8_scale`).
    pub fn scale_bytes(&self) -> Vec<u8> {
        self.scales.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    /// Number of rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The scale of each row, `(rows)`.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Whether the panels are read in place from a file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.values, Values::Mapped { .. })
    }

    /// Column groups of 4 per panel row (`cols.div_ceil(4)`).
    pub(crate) fn groups(&self) -> usize {
        self.cols.div_ceil(INT8_GROUP)
    }

    /// Panel `p` (of `rows.div_ceil(64)`): `groups · 256` bytes, padded (see the module
    /// documentation).
    pub(crate) fn panel(&self, p: usize) -> &[i8] {
        let panel_bytes = self.groups() * INT8_PANEL * INT8_GROUP;
        match &self.values {
            Values::Owned(v) => &v[p * panel_bytes..][..panel_bytes],
            Values::Mapped {
                file,
                offset,
                full,
                tail,
            } => {
                if p < *full {
                    let bytes = &file.bytes()[offset + p * panel_bytes..][..panel_bytes];
                    // SAFETY: as in `read`: same size and alignment, every bit pattern valid,
                    // borrowed from the file `self` holds.
                    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), panel_bytes) }
                } else {
                    let tail = tail
                        .as_ref()
                        .expect("a partial panel exists past the full ones");
                    &tail[..]
                }
            }
        }
    }

    /// `Σ_k q[n][k]` of each row, `(rows)`.
    pub(crate) fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// The quantized values of row `n`, `(cols)`.
    pub fn row_values(&self, n: usize) -> Vec<i8> {
        let (p, r) = (n / INT8_PANEL, n % INT8_PANEL);
        let panel = self.panel(p);
        (0..self.cols)
            .map(|kk| {
                let (g, j) = (kk / INT8_GROUP, kk % INT8_GROUP);
                panel[(g * INT8_PANEL + r) * INT8_GROUP + j]
            })
            .collect()
    }

    /// The rows `ids` dequantized (`scale · q`; an embedding lookup), `(ids.len(), cols)`
    /// row-major; an error names an id past the last row.
    pub fn gather_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let n = id as usize;
            if n >= self.rows {
                candle::bail!(
                    "token id {n} is out of range for a vocabulary of {} tokens",
                    self.rows
                )
            }
            let s = self.scales[n];
            out.extend(self.row_values(n).into_iter().map(|q| q as f32 * s));
        }
        Ok(out)
    }

    /// The whole matrix dequantized, `(rows, cols)` row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let ids: Vec<u32> = (0..self.rows as u32).collect();
        self.gather_rows(&ids).expect("every row id is in range")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_written_to_a_file_reads_back_in_place() {
        for (rows, cols) in [(70, 8), (64, 4), (5, 12), (130, 16)] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 3.0)
                .collect();
            let q = Int8Matrix::quantize(&w, rows, cols).unwrap();
            let data = q.file_bytes().unwrap();
            let scales = q.scale_bytes();
            let views = [
                (
                    "m.weight".to_string(),
                    safetensors::tensor::TensorView::new(StDtype::I8, vec![rows, cols], &data)
                        .unwrap(),
                ),
                (
                    format!("m.weight{INT8_SCALE_SUFFIX}"),
                    safetensors::tensor::TensorView::new(StDtype::F32, vec![rows], &scales)
                        .unwrap(),
                ),
            ];
            let bytes = safetensors::serialize(views, None).unwrap();
            let file = TensorFile::from_bytes(bytes, "test").unwrap();
            let back = Int8Matrix::in_file(&file, "m.weight", rows, cols)
                .unwrap()
                .unwrap();
            assert!(back.is_mapped());
            assert_eq!(back.scales(), q.scales());
            assert_eq!(back.sums(), q.sums());
            for p in 0..rows.div_ceil(INT8_PANEL) {
                assert_eq!(back.panel(p), q.panel(p), "{rows}x{cols} panel {p}");
            }
            // Wrong expectations are errors naming the tensor; a float tensor is not int8.
            let err = Int8Matrix::in_file(&file, "m.weight", rows + 1, cols)
                .unwrap()
                .unwrap_err();
            assert!(err.to_string().contains("'m.weight'"), "{err}");
            assert!(Int8Matrix::in_file(&file, "m.weight.int8_scale", rows, 1).is_none());
        }
        let odd = Int8Matrix::quantize(&[1.0; 6], 2, 3).unwrap();
        assert!(odd.file_bytes().is_none());
    }

    /// What the layout says, one value at a time: the reference the kernels are checked
    /// against (bytes, scales, sums).
    fn quantized_by_the_definition(
        w: &[f32],
        rows: usize,
        cols: usize,
    ) -> (Vec<i8>, Vec<f32>, Vec<i32>) {
        let groups = cols.div_ceil(INT8_GROUP);
        let mut bytes = vec![0i8; rows.div_ceil(INT8_PANEL) * groups * INT8_PANEL * INT8_GROUP];
        let (mut scales, mut sums) = (vec![0f32; rows], vec![0i32; rows]);
        for n in 0..rows {
            let row = &w[n * cols..(n + 1) * cols];
            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
            scales[n] = amax / 127.0;
            let inv = if amax == 0.0 { 0.0 } else { 127.0 / amax };
            let (p, r) = (n / INT8_PANEL, n % INT8_PANEL);
            for (kk, &v) in row.iter().enumerate() {
                let q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                sums[n] += q as i32;
                let (g, j) = (kk / INT8_GROUP, kk % INT8_GROUP);
                bytes[((p * groups + g) * INT8_PANEL + r) * INT8_GROUP + j] = q;
            }
        }
        (bytes, scales, sums)
    }

    #[test]
    fn every_level_quantizes_as_the_definition_says() {
        for (rows, cols) in [
            (1, 4),
            (70, 6),
            (130, 37),
            (64, 512),
            (3, 1001),
            (200, 16),
            (129, 80),
            (65, 2053),
        ] {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 17.0)
                .collect();
            let (bytes, scales, sums) = quantized_by_the_definition(&w, rows, cols);
            for isa in crate::simd::isas() {
                let q = Int8Matrix::quantize_at(isa, &w, rows, cols).unwrap();
                let panel_bytes = q.groups() * INT8_PANEL * INT8_GROUP;
                for p in 0..rows.div_ceil(INT8_PANEL) {
                    assert_eq!(
                        q.panel(p),
                        &bytes[p * panel_bytes..][..panel_bytes],
                        "{isa:?} {rows}x{cols} panel {p}"
                    );
                }
                assert_eq!(q.scales(), &scales[..], "{isa:?} {rows}x{cols}");
                assert_eq!(q.sums(), &sums[..], "{isa:?} {rows}x{cols}");
            }
        }
    }

    #[test]
    fn rounds_ties_to_even_as_the_library_does() {
        for v in [
            0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 3.49, -3.51, 0.0, -0.0,
        ] {
            assert_eq!(quantize_value(v, 1.0), v.round_ties_even() as i8, "{v}");
        }
        for (v, q) in [
            (127.4f32, 127i8),
            (127.6, 127),
            (300.0, 127),
            (-127.5, -127),
            (-1e9, -127),
        ] {
            assert_eq!(quantize_value(v, 1.0), q, "{v}");
        }
        // Every step of a fine sweep agrees with the library's rounding.
        for i in -130_000..=130_000 {
            let v = i as f32 / 1000.0;
            let want = v.round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(quantize_value(v, 1.0), want, "{v}");
        }
    }

    #[test]
    fn quantizes_each_row_with_its_scale() {
        // 70 rows (two panels, the second padded), 6 columns (two groups, the second padded).
        let (rows, cols) = (70, 6);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let q = Int8Matrix::quantize(&w, rows, cols).unwrap();
        let back = q.dequantize();
        for n in 0..rows {
            let row = &w[n * cols..(n + 1) * cols];
            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
            assert!((q.scales()[n] - amax / 127.0).abs() <= f32::EPSILON * amax);
            let values = q.row_values(n);
            assert!(values.iter().any(|&v| v.abs() == 127));
            assert_eq!(q.sums()[n], values.iter().map(|&v| v as i32).sum::<i32>());
            for (a, b) in row.iter().zip(&back[n * cols..(n + 1) * cols]) {
                assert!((a - b).abs() <= q.scales()[n] / 2.0 + 1e-6, "{a} vs {b}");
            }
        }
        // Padding rows and columns hold zeros.
        let groups = q.groups();
        let second = q.panel(1);
        for g in 0..groups {
            for r in 6..64 {
                assert_eq!(&second[(g * 64 + r) * 4..][..4], &[0, 0, 0, 0]);
            }
        }
        assert_eq!(&q.panel(0)[64 * 4 + 2..][..2], &[0, 0]);
    }

    #[test]
    fn a_zero_row_has_scale_zero_and_a_nan_is_refused() {
        let q = Int8Matrix::quantize(&[0.0; 8], 2, 4).unwrap();
        assert_eq!(q.scales(), &[0.0, 0.0]);
        assert_eq!(q.dequantize(), vec![0.0; 8]);
        let mut w = vec![1.0f32; 12];
        w[9] = f32::NAN;
        let err = Int8Matrix::quantize(&w, 3, 4).unwrap_err().to_string();
        assert!(err.contains("row 2"), "{err}");
        w[9] = f32::INFINITY;
        assert!(Int8Matrix::quantize(&w, 3, 4).is_err());
        assert!(Int8Matrix::quantize(&w, 4, 4).is_err());
        assert!(Int8Matrix::gather_rows(&q, &[2]).is_err());
        // Every level refuses a NaN or an infinity of either sign wherever it lies in a row
        // (in the vectors or the tail), naming the first row that holds one.
        let (rows, cols) = (70, 37);
        for isa in crate::simd::isas() {
            for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, 15, 16, 33, 36] {
                    let mut w = vec![0.5f32; rows * cols];
                    w[66 * cols + at] = bad;
                    w[68 * cols] = bad;
                    let err = Int8Matrix::quantize_at(isa, &w, rows, cols).unwrap_err();
                    assert!(err.to_string().contains("row 66"), "{isa:?} {at}: {err}");
                }
            }
        }
    }
}

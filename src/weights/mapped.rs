//! Linear weights read in place from a safetensors file.
//!
//! Loading a checkpoint the usual way copies every weight into fresh memory, and on this kind
//! of machine first-touching fresh memory costs about 1 ms per MB: 0.3–0.5 s for an opus-mt
//! model (296 MB), longer than translating a sentence. Pages of a memory-mapped file that is
//! already in the page cache map in about 0.1 ms per MB. So for inference, `f32` weights in a
//! [`TensorFile`] (which maps its file) can stay where they are:
//!
//! * [`MappedMatrix::in_file`] views an `f32` tensor of the file in place (checked: dtype,
//!   size, 4-byte alignment);
//! * a [`super::WeightSource::in_place`] hands such matrices to the layer constructors of this
//!   crate ([`crate::MultiHeadAttention`], the Transformer's feed-forward layers, the model
//!   families) instead of copying the weights out of the `VarBuilder`;
//! * a [`crate::projection::Projection`] over one computes `y = x Wᵀ + b` with its own kernel, which reads
//!   `W` row by row where it lies (no packing), on rayon's pool.
//!
//! The resident memory of the process then holds each weight once, as page cache shared with
//! the file, and nothing is copied at load time.

use super::tensor_file::TensorFile;

/// A row-major `(rows, cols)` `f32` matrix inside a [`TensorFile`]'s bytes. Cheap to clone
/// (clones share the file).
#[derive(Clone)]
pub struct MappedMatrix {
    file: TensorFile,
    /// Byte offset of element `(0, 0)` in the file; aligned for `f32`.
    offset: usize,
    rows: usize,
    cols: usize,
}

impl std::fmt::Debug for MappedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedMatrix({} x {} at byte {} of {})",
            self.rows,
            self.cols,
            self.offset,
            self.file.origin()
        )
    }
}

impl MappedMatrix {
    /// The `F32` tensor `name` of `file` as a `(rows, cols)` matrix in place, or `None` when
    /// it is absent, of another dtype or shape, or not aligned for `f32` (callers then load it
    /// the ordinary way).
    pub fn in_file(file: &TensorFile, name: &str, rows: usize, cols: usize) -> Option<Self> {
        let (offset, shape) = file.f32_location(name, rows.checked_mul(cols)?)?;
        let fits = shape.last().is_some_and(|&c| c == cols || rows == 1);
        let aligned =
            (file.bytes().as_ptr() as usize + offset).is_multiple_of(std::mem::align_of::<f32>());
        (fits && aligned).then(|| Self {
            file: file.clone(),
            offset,
            rows,
            cols,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The `rows · cols` values, row-major.
    pub fn data(&self) -> &[f32] {
        let bytes = &self.file.bytes()[self.offset..self.offset + self.rows * self.cols * 4];
        // SAFETY: `in_file` checked that the tensor is F32 with this many elements inside the
        // file (the safetensors header was validated by `TensorFile`) and that its start is
        // aligned for f32; every bit pattern is a valid f32; the bytes live as long as
        // `self.file`, which the returned borrow cannot outlive.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), self.rows * self.cols) }
    }

    /// Drops this process's resident pages of the matrix (see [`TensorFile::release`]), once
    /// the loader has made the copy it computes with: reading it again faults them back in.
    pub(crate) fn release_pages(&self) {
        self.file
            .release(self.offset..self.offset + self.rows * self.cols * 4);
    }

    /// Rows `start .. start + len`, sharing the file.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Option<Self> {
        (start.checked_add(len)? <= self.rows).then(|| Self {
            file: self.file.clone(),
            offset: self.offset + start * self.cols * 4,
            rows: len,
            cols: self.cols,
        })
    }

    /// The rows `ids` (an embedding lookup), `(ids.len(), cols)` row-major; an error names an
    /// id past the last row.
    pub fn gather_rows(&self, ids: &[u32]) -> candle::Result<Vec<f32>> {
        let data = self.data();
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let id = id as usize;
            if id >= self.rows {
                candle::bail!(
                    "token id {id} is out of range for a vocabulary of {} tokens",
                    self.rows
                )
            }
            out.extend_from_slice(&data[id * self.cols..(id + 1) * self.cols]);
        }
        Ok(out)
    }
}

/// A row-major `(rows, cols)` `bf16` matrix inside a [`TensorFile`]'s bytes (a bf16
/// checkpoint, e.g. one `attn convert --quantize bf16` wrote), read in place as
/// [`MappedMatrix`] reads `f32` ones. Cheap to clone.
#[derive(Clone)]
pub struct MappedBf16Matrix {
    file: TensorFile,
    /// Byte offset of element `(0, 0)` in the file; aligned for `u16`.
    offset: usize,
    rows: usize,
    cols: usize,
}

impl std::fmt::Debug for MappedBf16Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedBf16Matrix({} x {} at byte {} of {})",
            self.rows,
            self.cols,
            self.offset,
            self.file.origin()
        )
    }
}

impl MappedBf16Matrix {
    /// The `BF16` tensor `name` of `file` as a `(rows, cols)` matrix in place, or `None` when
    /// it is absent, of another dtype or shape, or not aligned for 16-bit values.
    pub fn in_file(file: &TensorFile, name: &str, rows: usize, cols: usize) -> Option<Self> {
        let (data, dtype, shape) = file.raw(name)?;
        let fits = shape.iter().product::<usize>() == rows.checked_mul(cols)?
            && shape.last().is_some_and(|&c| c == cols || rows == 1);
        let aligned = (data.as_ptr() as usize).is_multiple_of(2);
        (dtype == safetensors::Dtype::BF16 && fits && aligned).then(|| Self {
            file: file.clone(),
            offset: file.offset_of(name).expect("the tensor was just found"),
            rows,
            cols,
        })
    }

    /// `data` `(rows, cols)` `f32` row-major, rounded to bf16 (nearest even, as candle's and
    /// torch's `to(bfloat16)`) into an owned copy held as a one-tensor in-memory file, read as
    /// a bf16 checkpoint's matrix is: an `f32` checkpoint computed in bf16 (`--dtype bf16`)
    /// then decodes with the bf16 row kernel, reading half the bytes of the `f32` weight, as a
    /// directory `attn convert --quantize bf16` wrote does. `name` names it in error messages.
    pub fn rounded_from_f32(
        data: &[f32],
        rows: usize,
        cols: usize,
        name: &str,
    ) -> candle::Result<Self> {
        let count = rows
            .checked_mul(cols)
            .filter(|&n| n == data.len())
            .ok_or_else(|| {
                candle::Error::Msg(format!(
                    "'{name}': {} values are not a {rows} x {cols} matrix",
                    data.len()
                ))
            })?;
        // One buffer, the safetensors file of this one tensor: its header, then the
        // little-endian bf16 bits, rounded in place on rayon's pool (the buffer is
        // allocated zeroed, so its pages are first touched by the rounding, in parallel).
        let header = serde_json::json!({
            name: {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [0, 2 * count]}
        })
        .to_string();
        // The data starts 8-byte aligned (safetensors pads its header with spaces).
        let header_len = header.len().next_multiple_of(8);
        let mut blob = vec![0u8; 8 + header_len + 2 * count];
        let (head, bytes) = blob.split_at_mut(8 + header_len);
        head[..8].copy_from_slice(&(header_len as u64).to_le_bytes());
        head[8..].fill(b' ');
        head[8..8 + header.len()].copy_from_slice(header.as_bytes());
        let isa = crate::simd::Isa::get();
        // SAFETY: any two bytes are a valid `u16`; `align_to_mut` hands out only aligned
        // `u16`s, and the ends it cannot align are rounded one by one below.
        let (before, bits, _) = unsafe { bytes.align_to_mut::<u16>() };
        if cfg!(target_endian = "little") && before.is_empty() {
            crate::simd::elementwise::round_to_bf16(isa, data, bits);
        } else {
            for (d, &x) in bytes.chunks_exact_mut(2).zip(data) {
                d.copy_from_slice(&crate::simd::round_bf16(x).to_le_bytes());
            }
        }
        let file = TensorFile::from_bytes(blob, format!("'{name}' rounded to bf16"))?;
        Self::in_file(&file, name, rows, cols).ok_or_else(|| {
            candle::Error::Msg(format!(
                "internal: '{name}' rounded to bf16 is not a matrix"
            ))
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The `rows · cols` values as bf16 bit patterns, row-major.
    pub fn bits(&self) -> &[u16] {
        let bytes = &self.file.bytes()[self.offset..self.offset + self.rows * self.cols * 2];
        // SAFETY: `in_file` checked that the tensor is BF16 with this many elements inside the
        // file and that its start is aligned for u16; every bit pattern is a valid u16; the
        // bytes live as long as `self.file`, which the borrow cannot outlive.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<u16>(), self.rows * self.cols) }
    }

    /// Rows `start .. start + len`, sharing the file.
    pub fn narrow_rows(&self, start: usize, len: usize) -> Option<Self> {
        (start.checked_add(len)? <= self.rows).then(|| Self {
            file: self.file.clone(),
            offset: self.offset + start * self.cols * 2,
            rows: len,
            cols: self.cols,
        })
    }

    /// The rows `ids` (an embedding lookup) as a `(ids.len(), cols)` bf16 tensor; an error
    /// names an id past the last row.
    pub fn gather_rows(&self, ids: &[u32]) -> candle::Result<candle::Tensor> {
        let data = self.bits();
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let id = id as usize;
            if id >= self.rows {
                candle::bail!(
                    "token id {id} is out of range for a vocabulary of {} tokens",
                    self.rows
                )
            }
            out.extend(
                data[id * self.cols..(id + 1) * self.cols]
                    .iter()
                    .map(|&b| half::bf16::from_bits(b)),
            );
        }
        candle::Tensor::from_vec(out, (ids.len(), self.cols), &candle::Device::Cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_pages_read_back_unchanged() {
        // A matrix spanning many pages, mapped; its pages released while a slice of it is
        // borrowed; every value reads back the same (the pages fault in again from the file).
        let (rows, cols) = (300, 257);
        let values: Vec<f32> = (0..rows * cols).map(|i| (i as f32).sin()).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let t =
            candle::Tensor::from_vec(values.clone(), (rows, cols), &candle::Device::Cpu).unwrap();
        super::super::tensor_file::save_tensors(&[("w", &t)], &path).unwrap();
        let file = TensorFile::open(&path).unwrap();
        assert!(file.is_mapped());
        let m = MappedMatrix::in_file(&file, "w", rows, cols).unwrap();
        let data = m.data();
        assert_eq!(data, &values[..]);
        m.release_pages();
        assert_eq!(data, &values[..]);
        let rounded = MappedBf16Matrix::rounded_from_f32(data, rows, cols, "w").unwrap();
        let want: Vec<u16> = values
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect();
        assert_eq!(rounded.bits(), &want[..]);
        // An owned copy has nothing to release: a no-op.
        rounded.file.release(0..rounded.file.bytes().len());
        assert_eq!(rounded.bits(), &want[..]);
        // A ragged request is an error that names it, not a panic.
        let err = MappedBf16Matrix::rounded_from_f32(data, rows, cols + 1, "w")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("'w'") && err.contains("300 x 258"), "{err}");
    }
}

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
//! * inside [`with_mapped_weights`], the layer constructors of this crate
//!   ([`crate::MultiHeadAttention::load`] and the Transformer's feed-forward layers) take their
//!   projection weights from the file instead of copying them out of the `VarBuilder`;
//! * such a [`super::Projection`] computes `y = x Wᵀ + b` with its own kernel, which reads `W`
//!   row by row where it lies (no packing), on rayon's pool.
//!
//! The resident memory of the process then holds each weight once, as page cache shared with
//! the file, and nothing is copied at load time.

use super::gemm::OutPtr;
use crate::weights::TensorFile;
use rayon::prelude::*;
use std::cell::RefCell;

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

thread_local! {
    static SOURCE: RefCell<Option<TensorFile>> = const { RefCell::new(None) };
}

/// Runs `build` with `source` as the place layer constructors take their `f32` projection
/// weights from, in place (see the module docs); restores the previous state afterwards, also
/// on error or panic. Weights that cannot be used in place (another dtype, misaligned, absent)
/// are loaded through the `VarBuilder` as usual.
pub fn with_mapped_weights<R>(source: &TensorFile, build: impl FnOnce() -> R) -> R {
    struct Restore(Option<TensorFile>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            SOURCE.with(|s| *s.borrow_mut() = previous);
        }
    }
    let previous = SOURCE.with(|s| s.borrow_mut().replace(source.clone()));
    let _restore = Restore(previous);
    build()
}

/// The weight `name` `(rows, cols)` from the active [`with_mapped_weights`] source, if any.
pub(crate) fn mapped_matrix(name: &str, rows: usize, cols: usize) -> Option<MappedMatrix> {
    SOURCE.with(|s| MappedMatrix::in_file(s.borrow().as_ref()?, name, rows, cols))
}

/// Output rows of `W` per parallel task.
const ROWS_PER_TASK: usize = 128;

/// From this many rows of `x` on, [`linear_nt`] transposes strips of `W` on the fly and runs
/// the packed GEMM micro-kernel ([`super::gemm::gemm_rows`]); below, the row-by-row dot
/// products are faster: each weight is used too few times to pay for its transposition.
/// Measured on an opus-mt output projection (58101 × 512, 2 threads, AMD EPYC Zen 4, median
/// of 15): 8 rows 3.8 ms (dot products) vs 7.0 ms (packed), 32 rows 11.4 vs 12.3, 64 rows
/// 21.9 vs 22.4, 96 rows 31.5 vs 30.9.
const PACKED_MIN_ROWS: usize = 96;

/// `y = x Wᵀ + b`: `x` `(m, k)` row-major, `w` `(n, k)` row-major, `bias` `(n)` → `(m, n)`.
pub(crate) fn linear_nt(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    assert!(x.len() >= m * k && w.len() >= n * k && bias.is_none_or(|b| b.len() >= n));
    if m >= PACKED_MIN_ROWS && k > 0 {
        return super::gemm::gemm_rows(crate::simd::Isa::detect(false), x, m, k, w, n, bias);
    }
    linear_nt_rows(x, m, w, n, k, bias)
}

/// [`linear_nt`] by dot products of the rows of `x` with the rows of `W` where they lie: tasks
/// of [`ROWS_PER_TASK`] rows of `W` in parallel, each writing its columns of `y` (all rows).
fn linear_nt_rows(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    // Every element is written by exactly one task (below), so the buffer starts
    // uninitialised rather than zeroed: at beam-search sizes (32 × 58101) zeroing it cost 3%
    // of the decoding time.
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|t| {
            let r0 = t * ROWS_PER_TASK;
            let rows = ROWS_PER_TASK.min(n - r0);
            let bias = bias.map(|b| &b[r0..r0 + rows]);
            // SAFETY: task t alone writes columns r0 .. r0 + rows (the tasks partition the
            // columns), of the m rows of `y` at stride n; `out` points to its m · n floats,
            // which outlive the loop.
            unsafe {
                block(
                    x,
                    m,
                    &w[r0 * k..(r0 + rows) * k],
                    rows,
                    k,
                    bias,
                    out.get().add(r0),
                    n,
                )
            };
        });
    // SAFETY: the capacity is m · n, and the tasks, which partition the columns, each wrote
    // every element of their columns in every row (`block` writes all m × rows outputs).
    unsafe { y.set_len(m * n) };
    y
}

/// `y[i * ys + r] = Σ_kk x[i, kk] · w[r, kk] + bias[r]` for `i < m`, `r < rows`, with AVX-512
/// where the CPU has it.
///
/// # Safety
/// `y` is valid for writes at `i * ys + r` for every `i < m`, `r < rows`, and nothing else
/// accesses those floats meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    assert!(x.len() >= m * k && w.len() >= rows * k && bias.is_none_or(|b| b.len() >= rows));
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f was detected just above; the lengths are asserted above and
            // `y` is the caller's contract, which is the function's.
            return unsafe { block_avx512(x, m, w, rows, k, bias, y, ys) };
        }
    }
    // SAFETY: the caller's contract.
    unsafe { block_portable(x, m, w, rows, k, bias, y, ys) }
}

/// The portable loop: one dot product at a time.
///
/// # Safety
/// As [`block`], with the lengths it asserts.
#[allow(clippy::too_many_arguments)]
unsafe fn block_portable(
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    for r in 0..rows {
        let wr = &w[r * k..(r + 1) * k];
        let b = bias.map_or(0.0, |b| b[r]);
        for i in 0..m {
            let xr = &x[i * k..(i + 1) * k];
            let dot: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            // SAFETY: i < m, r < rows: the caller's contract.
            unsafe { *y.add(i * ys + r) = dot + b };
        }
    }
}

/// How many groups of rows of `w` ahead [`block_avx512`] prefetches (measured: 2 to 16 give
/// the same speed; 1, or prefetching into L1, much less).
#[cfg(target_arch = "x86_64")]
const PREFETCH_GROUPS: usize = 4;

/// Register tiles of 4 rows of `w` × 4 rows of `x`: 16 accumulators of 16 lanes, each step
/// loading 4 + 4 vectors for 16 FMAs; masked loads for the last `k % 16` columns. A whole tile
/// ends with the 16 horizontal sums in one vector ([`sums_16`]), lanes ordered so that each
/// quarter is 4 consecutive outputs of one row of `y`: 4 vector stores, bias added.
///
/// # Safety
/// The CPU has avx512f; `x` holds `m · k`, `w` `rows · k` and `bias` (if any) `rows` floats;
/// `y` as in [`block`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx512(
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    use crate::simd::avx512::sums_16;
    use std::arch::x86_64::*;
    let tail = k % 16;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as __mmask16;
    let bias_at = |r: usize| bias.map_or(0.0, |b| b[r]);
    // With 4 or more tiles of 4 rows of `x` per group of rows of `w`, the prefetches of the
    // group's row b are issued by tile b (one line per step), not all by the first tile: a
    // burst of 4 × k / 16 prefetches queued behind each other (32 rows of `x`, 58101 × 512:
    // 171 → 185 GFLOP/s on 2 threads).
    let spread = m >= 16;
    // One tile: MR rows of x from i, NR rows of w from r; `$finish` stores it.
    macro_rules! tile {
        ($mr:expr, $nr:expr, $i:expr, $r:expr, $finish:ident) => {{
            // Tiles prefetch, into L2, the rows of `w` PREFETCH_GROUPS groups ahead (which
            // tiles: `spread`): without it the weights arrived from memory at 22 GB/s with one
            // row of `x` and 14 GB/s with 8 (the loads of `w` stalled the kernel), with it at
            // 35 and 29 GB/s, the machine's streaming bandwidth (an opus-mt output
            // projection, 58101 × 512, 2 threads).
            let prefetch: [bool; $nr] =
                std::array::from_fn(|b| if spread { $i == 4 * b } else { $i == 0 });
            let mut acc = [[_mm512_setzero_ps(); $nr]; $mr];
            let xp: [*const f32; $mr] = std::array::from_fn(|a| x.as_ptr().add(($i + a) * k));
            let wp: [*const f32; $nr] = std::array::from_fn(|b| w.as_ptr().add(($r + b) * k));
            let mut c = 0;
            while c + 16 <= k {
                for b in 0..$nr {
                    if prefetch[b] {
                        // A hint, never a fault: past the end of `w` it does nothing.
                        _mm_prefetch::<_MM_HINT_T1>(
                            wp[b].wrapping_add(c + PREFETCH_GROUPS * $nr * k).cast(),
                        );
                    }
                }
                let wv: [__m512; $nr] = std::array::from_fn(|b| _mm512_loadu_ps(wp[b].add(c)));
                for a in 0..$mr {
                    let xv = _mm512_loadu_ps(xp[a].add(c));
                    for b in 0..$nr {
                        acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
                    }
                }
                c += 16;
            }
            if tail > 0 {
                let wv: [__m512; $nr] =
                    std::array::from_fn(|b| _mm512_maskz_loadu_ps(tail_mask, wp[b].add(c)));
                for a in 0..$mr {
                    let xv = _mm512_maskz_loadu_ps(tail_mask, xp[a].add(c));
                    for b in 0..$nr {
                        acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
                    }
                }
            }
            $finish!(acc, $mr, $nr, $i, $r);
        }};
    }
    // Any tile: one horizontal sum per output.
    macro_rules! finish_each {
        ($acc:ident, $mr:expr, $nr:expr, $i:expr, $r:expr) => {
            for a in 0..$mr {
                for b in 0..$nr {
                    *y.add(($i + a) * ys + $r + b) =
                        _mm512_reduce_add_ps($acc[a][b]) + bias_at($r + b);
                }
            }
        };
    }
    // A 4 × 4 tile: lane 4a + b of the sums is output (i + a, r + b).
    macro_rules! finish_4x4 {
        ($acc:ident, $mr:expr, $nr:expr, $i:expr, $r:expr) => {{
            let s = sums_16(std::array::from_fn(|j| $acc[j / 4][j % 4]));
            let b4 = match bias {
                Some(b) => _mm_loadu_ps(b.as_ptr().add($r)),
                None => _mm_setzero_ps(),
            };
            let row = |a: usize| y.add(($i + a) * ys + $r);
            _mm_storeu_ps(row(0), _mm_add_ps(_mm512_extractf32x4_ps::<0>(s), b4));
            _mm_storeu_ps(row(1), _mm_add_ps(_mm512_extractf32x4_ps::<1>(s), b4));
            _mm_storeu_ps(row(2), _mm_add_ps(_mm512_extractf32x4_ps::<2>(s), b4));
            _mm_storeu_ps(row(3), _mm_add_ps(_mm512_extractf32x4_ps::<3>(s), b4));
        }};
    }
    let mut r = 0;
    while r + 4 <= rows {
        let mut i = 0;
        while i + 4 <= m {
            tile!(4, 4, i, r, finish_4x4);
            i += 4;
        }
        while i < m {
            tile!(1, 4, i, r, finish_each);
            i += 1;
        }
        r += 4;
    }
    while r < rows {
        let mut i = 0;
        while i + 4 <= m {
            tile!(4, 1, i, r, finish_each);
            i += 4;
        }
        while i < m {
            tile!(1, 1, i, r, finish_each);
            i += 1;
        }
        r += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_and_dispatched_blocks_agree() {
        // Whole 4 × 4 tiles and every kind of edge tile, with and without a bias.
        let (m, rows, k) = (6, 9, 37);
        let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..rows * k).map(|i| (i % 5) as f32 - 2.0).collect();
        let bias: Vec<f32> = (0..rows).map(|r| r as f32 - 4.0).collect();
        for bias in [None, Some(bias.as_slice())] {
            // y at a row stride wider than `rows`, as a task writes its columns of `y`.
            let ys = rows + 3;
            let (mut a, mut b) = (vec![7f32; m * ys], vec![7f32; m * ys]);
            // SAFETY: both buffers hold m rows of ys >= rows floats.
            unsafe {
                block(&x, m, &w, rows, k, bias, a.as_mut_ptr(), ys);
                block_portable(&x, m, &w, rows, k, bias, b.as_mut_ptr(), ys);
            }
            assert_eq!(a, b, "small integers: both sums are exact");
            assert!(
                a.chunks(ys).all(|row| row[rows..] == [7.0; 3]),
                "only `rows` columns written"
            );
        }
    }

    #[test]
    fn linear_nt_matches_a_plain_loop() {
        // Row counts on both sides of PACKED_MIN_ROWS; widths and depths with partial
        // 64-column strips, partial 16-float vectors and more than one 128-input chunk.
        for (m, n, k) in [
            (1, 1, 1),
            (3, 7, 5),
            (4, 130, 33),
            (9, 257, 64),
            (5, 4, 16),
            (32, 1, 1),
            (33, 65, 17),
            (40, 130, 300),
            (70, 64, 129),
            (96, 65, 17),
            (101, 130, 300),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
            let y = linear_nt(&x, m, &w, n, k, Some(&b));
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum::<f32>() + b[j];
                    let got = y[i * n + j];
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

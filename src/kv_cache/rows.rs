//! Row selection in the caches' `(B, H, capacity, head_dim)` buffers: new row `i` is old row
//! `ids[i]` (beam search reorders every step; a bulk run drops finished sentences).
//!
//! * [`select_buffer_rows`]: into a new buffer (CPU: [`gather_rows_cpu`], rows in parallel,
//!   only the valid positions copied; elsewhere candle's `index_select`).
//! * [`move_rows_in_place`]: inside the buffer itself, copying only the rows that change. Beam
//!   search places each surviving beam at its source's row where it can, so most rows stay
//!   put; a reorder that moves `r` of `B` rows then costs `r` row copies instead of `B` row
//!   copies, a fresh allocation and its page faults. Only for buffers nobody else can see.

use candle::{CpuStorage, Layout, Storage, Tensor};
use rayon::prelude::*;

/// Rows `rows` of a `(B, H, capacity, head_dim)` buffer whose first `len` positions are valid:
/// on the CPU with the row ids `ids` read to the host, [`gather_rows_cpu`]; otherwise candle's
/// `index_select`.
pub(super) fn select_buffer_rows(
    buf: &Tensor,
    rows: &Tensor,
    ids: Option<&[u32]>,
    len: usize,
) -> candle::Result<Tensor> {
    let buf = buf.contiguous()?;
    let gathered = match ids {
        Some(ids) => gather_rows_cpu(&buf, ids, len)?,
        None => None,
    };
    match gathered {
        Some(gathered) => Ok(gathered),
        None => buf.index_select(rows, 0),
    }
}

/// The ids of a `U32` row index `(B')` on the CPU, or `None` for another index (dtype, rank,
/// device), which the caller leaves to `index_select`.
pub(super) fn host_row_ids(rows: &Tensor) -> candle::Result<Option<Vec<u32>>> {
    if !rows.device().is_cpu() || rows.dtype() != candle::DType::U32 || rows.rank() != 1 {
        return Ok(None);
    }
    rows.to_vec1::<u32>().map(Some)
}

/// Rows `ids` of a contiguous CPU buffer `(B, H, capacity, head_dim)`, copying only the first
/// `len` positions of each (row, head) into zeroed memory, in one pass; `None` for anything
/// else (another device, a tensor tracking its gradient, a dtype without a case here), which
/// the caller gathers with `index_select`. Beam search reorders every step: candle's
/// `index_select` zeroes the whole output and then copies every position, spare ones included
/// (5% of a MarianMT beam-search step at 32 rows).
pub(super) fn gather_rows_cpu(
    buf: &Tensor,
    ids: &[u32],
    len: usize,
) -> candle::Result<Option<Tensor>> {
    if !buf.device().is_cpu() || buf.track_op() || !buf.is_contiguous() {
        return Ok(None);
    }
    let (b, h, cap, d) = buf.dims4()?;
    if let Some(&bad) = ids.iter().find(|&&r| r as usize >= b) {
        candle::bail!("kv cache: row {bad} does not exist, the cache has {b} rows")
    }
    let valid = len.min(cap) * d;
    let (storage, layout) = buf.storage_and_layout();
    let range = layout.start_offset()..layout.start_offset() + buf.elem_count();
    let gathered = match &*storage {
        Storage::Cpu(CpuStorage::F32(s)) => gather(&s[range], ids, (h, cap, d), valid)?,
        Storage::Cpu(CpuStorage::F16(s)) => gather(&s[range], ids, (h, cap, d), valid)?,
        Storage::Cpu(CpuStorage::BF16(s)) => gather(&s[range], ids, (h, cap, d), valid)?,
        Storage::Cpu(CpuStorage::F64(s)) => gather(&s[range], ids, (h, cap, d), valid)?,
        _ => return Ok(None),
    };
    Ok(Some(gathered))
}

/// [`gather_rows_cpu`] on the elements `src` of a `(B, H, cap, d)` buffer: `(ids.len(), H, cap,
/// d)`, the first `valid` elements of each (row, head) block copied into zeroed memory
/// ([`zeroed_vec`]: the spare positions are never written, so a buffer with room reserved for
/// a long decode costs resident memory only for the positions decoded so far). Rows are
/// written in parallel.
fn gather<T: candle::WithDType>(
    src: &[T],
    ids: &[u32],
    (h, cap, d): (usize, usize, usize),
    valid: usize,
) -> candle::Result<Tensor> {
    let block = cap * d;
    let row = h * block;
    let mut out: Vec<T> = zeroed_vec(ids.len() * row)?;
    out.par_chunks_mut(row.max(1))
        .zip(ids.par_iter())
        .for_each(|(dst, &r)| {
            for (head, dst) in dst.chunks_mut(block).enumerate() {
                let start = (r as usize * h + head) * block;
                dst[..valid].copy_from_slice(&src[start..start + valid]);
            }
        });
    Tensor::from_vec(out, (ids.len(), h, cap, d), &candle::Device::Cpu)
}

/// A zeroed `(B, H, capacity, head_dim)` cache buffer of `dtype` on `device`. On the CPU, for
/// the float dtypes, from the allocator's zeroed memory ([`zeroed_vec`]), which for a large
/// buffer is fresh pages that become resident only where written (candle's `zeros` writes
/// every element of an `f16`/`bf16` buffer); anything else through `Tensor::zeros`.
pub(super) fn zeroed_buffer(
    shape: (usize, usize, usize, usize),
    dtype: candle::DType,
    device: &candle::Device,
) -> candle::Result<Tensor> {
    use candle::DType::{BF16, F16, F32, F64};
    if !device.is_cpu() {
        return Tensor::zeros(shape, dtype, device);
    }
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    let cpu = &candle::Device::Cpu;
    match dtype {
        F32 => Tensor::from_vec(zeroed_vec::<f32>(n)?, shape, cpu),
        F64 => Tensor::from_vec(zeroed_vec::<f64>(n)?, shape, cpu),
        F16 => Tensor::from_vec(zeroed_vec::<half::f16>(n)?, shape, cpu),
        BF16 => Tensor::from_vec(zeroed_vec::<half::bf16>(n)?, shape, cpu),
        _ => Tensor::zeros(shape, dtype, device),
    }
}

/// `n` zeros of a float type from `alloc_zeroed` (for large sizes: fresh pages the kernel
/// zeroes when first touched, nothing written here); an error, not an abort, when the
/// allocator refuses.
fn zeroed_vec<T: candle::WithDType>(n: usize) -> candle::Result<Vec<T>> {
    // Only the float dtypes reach this (see the callers): all-zero bits are their zero.
    debug_assert!(T::DTYPE.is_float());
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n)
        .map_err(|_| candle::Error::Msg(format!("kv cache: {n} elements overflow a buffer")))?;
    // SAFETY: `layout` has a non-zero size (`n > 0`, and no float type is zero-sized).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        candle::bail!(
            "kv cache: cannot allocate a buffer of {} bytes",
            layout.size()
        )
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of `n` `T`s (the
    // layout `Vec<T>` frees with), and its `n` elements are initialised: all-zero bits are a
    // valid `T` (a float's 0.0).
    Ok(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// How the rows of a buffer can move in place so that new row `i` is old row `ids[i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MovePlan {
    /// Every row stays where it is (the buffer only shrinks, if at all).
    Nothing,
    /// No row that is written is read by another move: the moves run in parallel.
    Parallel,
    /// Moves in ascending row order never read a row an earlier move overwrote (e.g. rows
    /// shifting down after a drop).
    Ascending,
    /// Neither: the rows go to a new buffer.
    Impossible,
}

/// The [`MovePlan`] for `ids` on a buffer of `rows` rows (every id below `rows`).
pub(super) fn move_plan(ids: &[u32], rows: usize) -> MovePlan {
    if ids.len() > rows {
        return MovePlan::Impossible;
    }
    let mut written = vec![false; rows];
    for (i, &r) in ids.iter().enumerate() {
        written[i] = r as usize != i;
    }
    if !written.iter().any(|&w| w) {
        return MovePlan::Nothing;
    }
    if ids.iter().all(|&r| !written[r as usize]) {
        return MovePlan::Parallel;
    }
    let mut overwritten = vec![false; rows];
    for (i, &r) in ids.iter().enumerate() {
        if r as usize != i {
            if overwritten[r as usize] {
                return MovePlan::Impossible;
            }
            overwritten[i] = true;
        }
    }
    MovePlan::Ascending
}

/// Moves rows inside a contiguous CPU `(B, H, cap, d)` buffer so that its first `ids.len()`
/// rows are old rows `ids` (the first `valid` positions of each (row, head) block), and returns
/// those rows: `(ids.len(), H, cap, d)`, a view of the same storage. `None` when the buffer is
/// not a contiguous CPU buffer of a dtype handled here, tracks a gradient, the plan is
/// [`MovePlan::Impossible`], or the rows kept are at most half of those its storage was
/// allocated for: the caller then gathers into a new buffer.
///
/// The last rule is memory: a view keeps its whole storage alive, so a batch whose texts end
/// one by one would hold the buffers of its first step until its last text ends (and a
/// continuous batch admits new texts beside it meanwhile). Gathering once the rows halve
/// copies each row at most about once more over a decode and keeps the buffers within twice
/// the rows decoding.
///
/// The caller guarantees that nothing else reads this buffer (no clone, no view handed out):
/// its rows change under any other handle.
pub(super) fn move_rows_in_place(
    buf: &Tensor,
    ids: &[u32],
    len: usize,
) -> candle::Result<Option<Tensor>> {
    use candle::DType::{BF16, F16, F32, F64};
    let handled = matches!(buf.dtype(), F32 | F16 | BF16 | F64);
    if !buf.device().is_cpu() || buf.track_op() || !buf.is_contiguous() || !handled {
        return Ok(None);
    }
    let (b, h, cap, d) = buf.dims4()?;
    if let Some(&bad) = ids.iter().find(|&&r| r as usize >= b) {
        candle::bail!("kv cache: row {bad} does not exist, the cache has {b} rows")
    }
    let plan = move_plan(ids, b);
    if plan == MovePlan::Impossible || 2 * ids.len() <= storage_rows(buf).unwrap_or(b) {
        return Ok(None);
    }
    if plan != MovePlan::Nothing {
        let moves = MoveRows {
            ids,
            plan,
            shape: (h, cap, d),
            valid: len.min(cap) * d,
        };
        buf.inplace_op1(&moves)?;
    }
    Ok(Some(buf.narrow(0, 0, ids.len())?))
}

/// How many `(H, cap, d)` rows the CPU storage behind `buf` (a contiguous view starting at a
/// row boundary) holds, counted from its start; `None` when that cannot be read.
fn storage_rows(buf: &Tensor) -> Option<usize> {
    let row = buf.dims()[1..].iter().product::<usize>();
    let (storage, _) = buf.storage_and_layout();
    let elems = match &*storage {
        Storage::Cpu(CpuStorage::F32(s)) => s.len(),
        Storage::Cpu(CpuStorage::F16(s)) => s.len(),
        Storage::Cpu(CpuStorage::BF16(s)) => s.len(),
        Storage::Cpu(CpuStorage::F64(s)) => s.len(),
        _ => return None,
    };
    (row > 0).then(|| elems / row)
}

/// The in-place pass of [`move_rows_in_place`], as a candle in-place op (the sanctioned way to
/// write into a tensor's storage).
struct MoveRows<'a> {
    ids: &'a [u32],
    plan: MovePlan,
    shape: (usize, usize, usize),
    valid: usize,
}

impl candle::InplaceOp1 for MoveRows<'_> {
    fn name(&self) -> &'static str {
        "kv-cache-move-rows"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle::bail!("kv cache: moving rows of a strided buffer {layout:?}")
        };
        match storage {
            CpuStorage::F32(s) => self.run(&mut s[start..end]),
            CpuStorage::F16(s) => self.run(&mut s[start..end]),
            CpuStorage::BF16(s) => self.run(&mut s[start..end]),
            CpuStorage::F64(s) => self.run(&mut s[start..end]),
            _ => candle::bail!("kv cache: moving rows of a buffer whose dtype has no case here"),
        }
        Ok(())
    }
}

impl MoveRows<'_> {
    fn run<T: Copy + Send + Sync>(&self, buf: &mut [T]) {
        let (h, cap, d) = self.shape;
        let block = cap * d;
        let row = h * block;
        let valid = self.valid;
        let moves = self
            .ids
            .iter()
            .enumerate()
            .filter(|&(i, &r)| r as usize != i)
            .map(|(i, &r)| (i, r as usize));
        match self.plan {
            MovePlan::Parallel => {
                let moves: Vec<(usize, usize)> = moves.collect();
                let base = RowsPtr(buf.as_mut_ptr());
                moves.par_iter().for_each(|&(to, from)| {
                    for head in 0..h {
                        // SAFETY: `to` and `from` are rows of the buffer (checked by the caller),
                        // so both ranges lie inside it; under `Parallel` no written row is
                        // read by any move and every written row is written by one move only,
                        // so the ranges of different tasks never overlap a write.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                base.get().add(from * row + head * block),
                                base.get().add(to * row + head * block),
                                valid,
                            )
                        }
                    }
                });
            }
            MovePlan::Ascending => {
                for (to, from) in moves {
                    for head in 0..h {
                        let src = from * row + head * block;
                        buf.copy_within(src..src + valid, to * row + head * block);
                    }
                }
            }
            MovePlan::Nothing | MovePlan::Impossible => {}
        }
    }
}

/// A buffer's base pointer shared by the parallel row moves.
struct RowsPtr<T>(*mut T);

impl<T> RowsPtr<T> {
    /// The pointer (a method, so that a closure captures the whole `Sync` wrapper).
    fn get(&self) -> *mut T {
        self.0
    }
}
// SAFETY: the tasks write disjoint rows and read rows nobody writes (`MovePlan::Parallel`),
// and the buffer outlives the parallel loop.
unsafe impl<T> Send for RowsPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for RowsPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{DType, Device};

    /// The CPU row gather equals `index_select` on the valid positions (f32 and bf16, rows
    /// repeated and dropped), zero-fills the spare capacity, leaves other index dtypes to
    /// `index_select`, and names a row that does not exist.
    #[test]
    fn cpu_row_gather_equals_index_select_on_the_valid_prefix() -> candle::Result<()> {
        let dev = Device::Cpu;
        let buf = Tensor::arange(0f32, 3.0 * 2.0 * 5.0 * 4.0, &dev)?.reshape((3, 2, 5, 4))?;
        let rows = Tensor::new(&[2u32, 0, 2, 2], &dev)?;
        let ids = host_row_ids(&rows)?.expect("a U32 index on the CPU");
        for dtype in [DType::F32, DType::BF16] {
            let buf = buf.to_dtype(dtype)?;
            let got = gather_rows_cpu(&buf, &ids, 3)?.expect("a CPU buffer takes the CPU path");
            assert_eq!(got.dims(), &[4, 2, 5, 4]);
            let want = buf.index_select(&rows, 0)?.narrow(2, 0, 3)?;
            let as_f32 = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
            assert_eq!(as_f32(&got.narrow(2, 0, 3)?)?, as_f32(&want)?);
            assert!(as_f32(&got.narrow(2, 3, 2)?)?.iter().all(|&x| x == 0.0));
        }
        let wide = Tensor::new(&[1i64, 0], &dev)?;
        assert!(host_row_ids(&wide)?.is_none());
        let err = gather_rows_cpu(&buf, &[3], 3).unwrap_err();
        assert!(err.to_string().contains("row 3 does not exist"), "{err}");
        Ok(())
    }

    #[test]
    fn move_plans() {
        use MovePlan::*;
        assert_eq!(move_plan(&[0, 1, 2], 3), Nothing);
        assert_eq!(move_plan(&[0, 1], 3), Nothing);
        // Beam search: rows 0 and 2 stay, 1 and 3 copy rows that stay.
        assert_eq!(move_plan(&[0, 0, 2, 2], 4), Parallel);
        // A swap reads a row it writes.
        assert_eq!(move_plan(&[1, 0], 2), Impossible);
        // Rows shifting down after a drop: each read happens before its row is written.
        assert_eq!(move_plan(&[2, 3, 4, 5], 6), Ascending);
        assert_eq!(move_plan(&[1, 2, 0], 3), Impossible);
        assert_eq!(move_plan(&[0, 0, 0], 2), Impossible);
    }

    /// In-place moves equal `index_select` on the valid positions, for every plan, and leave
    /// a narrowed view of the same buffer; the impossible plans decline, and so do the moves
    /// that keep at most half of the storage's rows (the caller compacts them).
    #[test]
    fn in_place_moves_equal_index_select() -> candle::Result<()> {
        let dev = Device::Cpu;
        let cases: [&[u32]; 6] = [
            &[0, 1, 2, 3, 4],
            &[0, 0, 2, 2, 4],
            &[3, 1, 2, 3, 0],
            &[2, 3, 4],
            &[1, 3],
            &[4, 3, 2, 1, 0],
        ];
        for ids in cases {
            for dtype in [DType::F32, DType::BF16] {
                let make = || -> candle::Result<Tensor> {
                    Tensor::arange(0f32, 5.0 * 2.0 * 4.0 * 3.0, &dev)?
                        .reshape((5, 2, 4, 3))?
                        .to_dtype(dtype)
                };
                let want = make()?
                    .index_select(&Tensor::new(ids, &dev)?, 0)?
                    .narrow(2, 0, 3)?;
                let buf = make()?;
                let as_f32 = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
                match move_rows_in_place(&buf, ids, 3)? {
                    Some(moved) => {
                        assert_ne!(move_plan(ids, 5), MovePlan::Impossible);
                        assert_eq!(moved.dims(), &[ids.len(), 2, 4, 3]);
                        assert_eq!(as_f32(&moved.narrow(2, 0, 3)?)?, as_f32(&want)?, "{ids:?}");
                    }
                    None => assert!(
                        move_plan(ids, 5) == MovePlan::Impossible || 2 * ids.len() <= 5,
                        "{ids:?}"
                    ),
                }
            }
        }
        // A view of 3 rows still sits on the storage of 5: keeping 2 of them in place would
        // leave 3 spare rows (it declines), keeping 3 moves.
        let buf = Tensor::arange(0f32, 5.0 * 2.0, &dev)?.reshape((5, 1, 2, 1))?;
        let view = move_rows_in_place(&buf, &[0, 2, 4], 2)?.expect("3 of 5 rows move in place");
        assert_eq!(storage_rows(&view), Some(5));
        assert!(move_rows_in_place(&view, &[1, 2], 2)?.is_none());
        assert!(move_rows_in_place(&view, &[0, 2, 2], 2)?.is_some());
        let buf = Tensor::zeros((2, 1, 1, 1), DType::F32, &dev)?;
        let err = move_rows_in_place(&buf, &[2], 1).unwrap_err();
        assert!(err.to_string().contains("row 2 does not exist"), "{err}");
        Ok(())
    }
}

//! A self-attention cache whose rows share the positions they have in common: the store a
//! [`super::KvCache`] switches to when a reorder forks its rows (beam search).
//!
//! Beam search keeps several hypotheses of each sentence and, every step, continues the best
//! ones: a surviving hypothesis often has several continuations, so its history is copied into
//! several rows. A contiguous `(B, H, capacity, head_dim)` cache copies it for real (every
//! reorder moves or gathers whole rows), and holds each sentence's common prefix once per
//! beam. Here each position of each row is a *slot*: the keys `(H · head_dim)` and values of
//! one token, written once, reference-counted, and named by the rows whose history holds it.
//! A reorder copies slot numbers, an append writes one slot per row, and a position that
//! several beams share is held (and read from memory) once. On an opus-mt-size serving load
//! at beam 4, 47.8% of the rows' positions were distinct.
//!
//! Slots live in chunks of [`SLOTS_PER_CHUNK`] that are allocated as the cache grows and
//! never move (a chunk is freed with the cache); freed slots are reused first.

use crate::sdpa::cpu::paged::GatherHeads;
use crate::simd::{cpu_f32, prefetch_lines, NearCache};
use candle::{DType, Device, Tensor};

/// Slots a chunk holds: 64 positions of an `E = 512` model are 128 KiB of keys and as much of
/// values.
const SLOTS_PER_CHUNK: usize = 64;

/// Keys and values of `B` rows of `S` positions each, in shared slots (see the module
/// documentation). Clones are deep copies.
#[derive(Clone, Debug)]
pub(crate) struct PagedKv {
    heads: usize,
    /// Key and value features per head.
    d: usize,
    dv: usize,
    /// Chunks of [`SLOTS_PER_CHUNK`] slots, `heads · d` (keys) and `heads · dv` (values)
    /// floats each, laid out `(head, feature)`.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// References to each slot from the rows' histories; 0 = free.
    refs: Vec<u32>,
    free: Vec<u32>,
    /// Per row: the slot of each of its positions, oldest first.
    rows: Vec<Vec<u32>>,
    len: usize,
}

impl PagedKv {
    /// The first `len` positions of contiguous CPU `f32` buffers `k` `(B, H, capacity, d)` and
    /// `v` `(B, H, capacity, dv)`, one slot per row and position.
    pub(crate) fn from_buffers(k: &Tensor, v: &Tensor, len: usize) -> candle::Result<Self> {
        let (b, heads, _, d) = k.dims4()?;
        let dv = v.dim(3)?;
        let mut paged = Self::empty(heads, d, dv);
        paged.rows = vec![Vec::new(); b];
        paged.write_positions(k, v, len)?;
        Ok(paged)
    }

    fn empty(heads: usize, d: usize, dv: usize) -> Self {
        Self {
            heads,
            d,
            dv,
            keys: Vec::new(),
            values: Vec::new(),
            refs: Vec::new(),
            free: Vec::new(),
            rows: Vec::new(),
            len: 0,
        }
    }

    /// Positions per row `S`.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `(B, H, d, dv)`.
    pub(crate) fn dims(&self) -> (usize, usize, usize, usize) {
        (self.rows.len(), self.heads, self.d, self.dv)
    }

    /// A free slot, referenced once.
    fn take_slot(&mut self) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = self.refs.len();
                if slot.is_multiple_of(SLOTS_PER_CHUNK) {
                    self.keys
                        .push(vec![0.0; SLOTS_PER_CHUNK * self.heads * self.d]);
                    self.values
                        .push(vec![0.0; SLOTS_PER_CHUNK * self.heads * self.dv]);
                }
                self.refs.push(0);
                slot as u32
            }
        };
        self.refs[slot as usize] = 1;
        slot
    }

    /// The keys and values of `slot`, `(heads, d)` and `(heads, dv)`.
    fn slot(&self, slot: u32) -> (&[f32], &[f32]) {
        let (chunk, i) = (
            slot as usize / SLOTS_PER_CHUNK,
            slot as usize % SLOTS_PER_CHUNK,
        );
        let (kw, vw) = (self.heads * self.d, self.heads * self.dv);
        (
            &self.keys[chunk][i * kw..(i + 1) * kw],
            &self.values[chunk][i * vw..(i + 1) * vw],
        )
    }

    /// Head `head`'s keys (`d` floats) and values (`dv`) in `slot`.
    fn head_of(&self, slot: u32, head: usize) -> (&[f32], &[f32]) {
        let (ks, vs) = self.slot(slot);
        let (d, dv) = (self.d, self.dv);
        (
            &ks[head * d..(head + 1) * d],
            &vs[head * dv..(head + 1) * dv],
        )
    }

    fn slot_mut(&mut self, slot: u32) -> (&mut [f32], &mut [f32]) {
        let (chunk, i) = (
            slot as usize / SLOTS_PER_CHUNK,
            slot as usize % SLOTS_PER_CHUNK,
        );
        let (kw, vw) = (self.heads * self.d, self.heads * self.dv);
        (
            &mut self.keys[chunk][i * kw..(i + 1) * kw],
            &mut self.values[chunk][i * vw..(i + 1) * vw],
        )
    }

    /// Appends `k` `(B, H, T, d)` and `v` `(B, H, T, dv)` (CPU `f32`, any strides): `T` new
    /// slots per row. The shapes must match the cache's (checked by the caller).
    pub(crate) fn append(&mut self, k: &Tensor, v: &Tensor) -> candle::Result<()> {
        let t = k.dim(2)?;
        self.write_positions(k, v, t)
    }

    /// Writes positions `0..t` of every row of `k` `(B, H, ≥ t, d)` and `v` (CPU `f32`, any
    /// strides) into new slots at the end of the rows' histories.
    fn write_positions(&mut self, k: &Tensor, v: &Tensor, t: usize) -> candle::Result<()> {
        let (kg, kl) = k.storage_and_layout();
        let (vg, vl) = v.storage_and_layout();
        let keys = Features::new(cpu_f32(&kg)?, kl);
        let values = Features::new(cpu_f32(&vg)?, vl);
        let (heads, d, dv) = (self.heads, self.d, self.dv);
        for row in 0..self.rows.len() {
            for pos in 0..t {
                let slot = self.take_slot();
                let (ks, vs) = self.slot_mut(slot);
                for head in 0..heads {
                    keys.copy((row, head, pos), &mut ks[head * d..(head + 1) * d]);
                    values.copy((row, head, pos), &mut vs[head * dv..(head + 1) * dv]);
                }
                self.rows[row].push(slot);
            }
        }
        self.len += t;
        Ok(())
    }

    /// Keeps rows `ids` (each below `B`, may repeat), in that order: rows that repeat share
    /// every slot of their history; slots no row holds any more are freed.
    pub(crate) fn select(&mut self, ids: &[u32]) -> candle::Result<()> {
        let b = self.rows.len();
        if let Some(&bad) = ids.iter().find(|&&r| r as usize >= b) {
            candle::bail!("kv cache: row {bad} does not exist, the cache has {b} rows")
        }
        let rows: Vec<Vec<u32>> = ids.iter().map(|&r| self.rows[r as usize].clone()).collect();
        for &slot in rows.iter().flatten() {
            self.refs[slot as usize] += 1;
        }
        for slot in std::mem::replace(&mut self.rows, rows)
            .into_iter()
            .flatten()
        {
            let refs = &mut self.refs[slot as usize];
            *refs -= 1;
            if *refs == 0 {
                self.free.push(slot);
            }
        }
        Ok(())
    }

    /// The cached keys and values as contiguous tensors `(B, H, S, d)` and `(B, H, S, dv)`.
    pub(crate) fn gather(&self) -> candle::Result<(Tensor, Tensor)> {
        let (b, h, s) = (self.rows.len(), self.heads, self.len);
        let (d, dv) = (self.d, self.dv);
        let mut keys = vec![0f32; b * h * s * d];
        let mut values = vec![0f32; b * h * s * dv];
        for row in 0..b {
            for head in 0..h {
                let i = row * h + head;
                self.gather_head(
                    row,
                    head,
                    &mut keys[i * s * d..(i + 1) * s * d],
                    &mut values[i * s * dv..(i + 1) * s * dv],
                );
            }
        }
        Ok((
            Tensor::from_vec(keys, (b, h, s, d), &Device::Cpu)?,
            Tensor::from_vec(values, (b, h, s, dv), &Device::Cpu)?,
        ))
    }

    /// Slots in use and allocated (for tests and measurements).
    #[cfg(test)]
    pub(crate) fn slots_in_use(&self) -> (usize, usize) {
        (self.refs.len() - self.free.len(), self.refs.len())
    }
}

impl GatherHeads for PagedKv {
    fn gather_head(&self, row: usize, head: usize, keys: &mut [f32], values: &mut [f32]) {
        let (d, dv) = (self.d, self.dv);
        let positions = &self.rows[row];
        // The slots of a row lie scattered over the chunks, mostly outside this core's cache
        // (a step streams every weight matrix through it): each copy waited for its four
        // lines of keys and four of values. Asking for the slots a few positions ahead
        // overlaps those misses with the copies: the copies' share of a 32-client serving
        // load (`examples/continuous_load`, `perf`) fell from 6.6-7.4% to 4.7%. Further ahead
        // (16) was no better.
        let head_of = |slot: u32| self.head_of(slot, head);
        let prefetch = |slot: u32| {
            let (k, v) = head_of(slot);
            prefetch_head(k, v);
        };
        positions
            .iter()
            .take(PREFETCH_AHEAD)
            .for_each(|&s| prefetch(s));
        for (j, ((&slot, k), v)) in positions
            .iter()
            .zip(keys.chunks_exact_mut(d))
            .zip(values.chunks_exact_mut(dv))
            .enumerate()
        {
            if let Some(&ahead) = positions.get(j + PREFETCH_AHEAD) {
                prefetch(ahead);
            }
            let (ks, vs) = head_of(slot);
            k.copy_from_slice(ks);
            v.copy_from_slice(vs);
        }
    }

    fn head_rows(
        &self,
        row: usize,
        head: usize,
        keys: &mut [*const f32],
        values: &mut [*const f32],
    ) {
        for ((&slot, k), v) in self.rows[row].iter().zip(keys).zip(values) {
            let (ks, vs) = self.head_of(slot, head);
            // Every position is asked for at once, before the kernels read them where they
            // lie: their misses (the weights streamed since evicted them) overlap.
            prefetch_head(ks, vs);
            *k = ks.as_ptr();
            *v = vs.as_ptr();
        }
    }
}

/// Asks for one head's keys and values of a slot in L1 (a hint).
fn prefetch_head(keys: &[f32], values: &[f32]) {
    prefetch_lines(keys.as_ptr().cast(), size_of_val(keys), NearCache::L1);
    prefetch_lines(values.as_ptr().cast(), size_of_val(values), NearCache::L1);
}

/// Positions ahead of the copy whose slots [`PagedKv::gather_head`] asks the cache for.
const PREFETCH_AHEAD: usize = 4;

/// True when a store of shared slots can hold `buffer`'s keys or values: a CPU `f32` tensor
/// that tracks no gradient (the kernel reading slots is `f32`-only).
pub(crate) fn can_page(buffer: &Tensor) -> bool {
    matches!(buffer.device(), Device::Cpu) && buffer.dtype() == DType::F32 && !buffer.track_op()
}

/// The elements of a CPU `f32` tensor `(B, H, T, F)` with its strides.
struct Features<'a> {
    data: &'a [f32],
    start: usize,
    stride: [usize; 4],
}

impl<'a> Features<'a> {
    fn new(data: &'a [f32], layout: &candle::Layout) -> Self {
        let st = layout.stride();
        Self {
            data,
            start: layout.start_offset(),
            stride: [st[0], st[1], st[2], st[3]],
        }
    }

    /// Copies the features of `(row, head, pos)` into `out` (`F` floats).
    fn copy(&self, (row, head, pos): (usize, usize, usize), out: &mut [f32]) {
        let [sb, sh, sp, sf] = self.stride;
        let start = self.start + row * sb + head * sh + pos * sp;
        if sf == 1 || out.len() <= 1 {
            out.copy_from_slice(&self.data[start..start + out.len()]);
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = self.data[start + i * sf];
            }
        }
    }
}

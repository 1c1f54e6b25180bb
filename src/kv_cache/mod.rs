//! Caches for incremental decoding, and the calls that use them.
//!
//! * [`KvCache`]: the keys and values of the tokens one self-attention block has seen. Each
//!   decoding step projects only the new tokens' keys and values and appends them; attention then
//!   reads the whole prefix. Appends write into a buffer that grows by a quarter when full, so
//!   a step costs time proportional to the prefix it attends to, not to the square of it. The
//!   cache of a decoder whose rows fork (beam search continuing one hypothesis in several rows)
//!   moves into slots the rows share (`kv_cache/paged.rs`): a position common to several beams
//!   is held and read once, and a reorder copies slot numbers, not keys.
//! * [`CrossAttentionCache`]: the encoder memory projected to keys and values once per sequence,
//!   tagged with the memory it came from.
//! * [`MultiHeadAttention::attend_cached`] and [`MultiHeadAttention::attend_cross`]: one call
//!   that projects, appends and attends with the causal offset taken from the cache, so that
//!   nobody has to compute `Mask::causal_with_offset(len_before_append)` by hand.
//!
//! Clones are independent: a clone of a [`KvCache`] shares its buffer until one of the two
//! appends, which then copies (copy on write). Forking a decode (sampling several
//! continuations, speculative decoding) is `cache.clone()`.

use crate::mask::Mask;
use crate::mha::{AttentionArgs, MultiHeadAttention};
use crate::sdpa::AttentionOutput;
use candle::{Tensor, TensorId};
use paged::{can_page, PagedKv};
use rows::{host_row_ids, move_rows_in_place, select_buffer_rows, zeroed_buffer};
use std::sync::Arc;

mod paged;
mod rows;

/// The fewest positions a full [`KvCache`] grows by.
const GROWTH_MIN: usize = 16;

/// Keys and values `(B, H, S, head_dim)` of the tokens seen so far by one attention block.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// `(B, H, capacity, head_dim)` buffers; positions `0..len` are valid. Shared by clones until
    /// one of them writes (see [`KvCache::append`]).
    buffers: Option<Arc<(Tensor, Tensor)>>,
    /// Instead of `buffers`, once a reorder inside a decoder cache has forked rows (beam
    /// search): positions in slots that the rows share (see [`paged`]). Shared by clones
    /// until one of them writes.
    slots: Option<Arc<PagedKv>>,
    len: usize,
    /// Positions the buffers are given when next allocated (see [`KvCache::reserve`]).
    reserved: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of cached positions `S`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything (a reservation too).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// Asks that the buffers, when next allocated (the first append, or a growth), hold at
    /// least `positions` positions, so that a decode of known length allocates them once
    /// instead of growing them (each growth copies the prefix into a new buffer). The room is
    /// memory: even on the CPU, an allocator that recycles memory zeroes all of it. It
    /// changes nothing in what is cached or returned.
    pub fn reserve(&mut self, positions: usize) {
        self.reserved = positions;
    }

    /// The cached keys and values `(B, H, S, head_dim)`, or `None` when empty: views of the
    /// buffers (no copy), or, for a cache whose rows share slots (a beam search's inside a
    /// decoder cache), contiguous copies gathered from them.
    pub fn keys_values(&self) -> candle::Result<Option<(Tensor, Tensor)>> {
        if let Some(slots) = &self.slots {
            return slots.gather().map(Some);
        }
        match &self.buffers {
            None => Ok(None),
            Some(kv) => Ok(Some((
                kv.0.narrow(2, 0, self.len)?,
                kv.1.narrow(2, 0, self.len)?,
            ))),
        }
    }

    /// Appends `k`, `v` `(B, H, T, head_dim)` and returns all cached keys and values
    /// `(B, H, S + T, head_dim)`. Batch, heads, head size, dtype and device must match what is
    /// cached. Under autograd (a tracked `k` or `v`) it concatenates instead of writing in place,
    /// so gradients are kept. A buffer shared with a clone is copied before it is written, so
    /// the clone never sees this append. A cache in slots returns copies gathered from them.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> candle::Result<(Tensor, Tensor)> {
        let (b, h, t, d) = k.dims4()?;
        if v.dims4()?.0 != b || v.dim(1)? != h || v.dim(2)? != t {
            candle::bail!(
                "kv cache: keys {:?} and values {:?} disagree",
                k.dims(),
                v.dims()
            )
        }
        if let Some(slots) = self.append_to_slots(k, v)? {
            return slots.gather();
        }
        let shared = match &self.buffers {
            Some(shared) => shared,
            // A decode that reserved room starts with empty buffers of that size, which the
            // in-place write below fills like any other append.
            None if self.reserved > t && !k.track_op() && !v.track_op() => {
                let room = |x: &Tensor| {
                    zeroed_buffer((b, h, self.reserved, x.dim(3)?), x.dtype(), x.device())
                };
                &*self.buffers.insert(Arc::new((room(k)?, room(v)?)))
            }
            None => {
                let (k, v) = (k.contiguous()?, v.contiguous()?);
                self.buffers = Some(Arc::new((k.clone(), v.clone())));
                self.len = t;
                return Ok((k, v));
            }
        };
        let (kb, vb) = (&shared.0, &shared.1);
        let (cb, ch, cap, cd) = kb.dims4()?;
        if (cb, ch, cd) != (b, h, d)
            || vb.dim(3)? != v.dim(3)?
            || kb.dtype() != k.dtype()
            || !kb.device().same_device(k.device())
        {
            candle::bail!(
                "kv cache holds keys {:?} ({:?}) and cannot take {:?} ({:?})",
                kb.narrow(2, 0, self.len)?.dims(),
                kb.dtype(),
                k.dims(),
                k.dtype()
            )
        }
        let new_len = self.len + t;
        if k.track_op() || v.track_op() || kb.track_op() {
            let k_all = Tensor::cat(&[&kb.narrow(2, 0, self.len)?, k], 2)?;
            let v_all = Tensor::cat(&[&vb.narrow(2, 0, self.len)?, v], 2)?;
            self.buffers = Some(Arc::new((k_all.clone(), v_all.clone())));
            self.len = new_len;
            return Ok((k_all, v_all));
        }
        // Written in place only when this cache is the buffer's sole owner and it has room;
        // otherwise the valid prefix moves into new buffers (a quarter larger when full, at
        // least GROWTH_MIN positions more), which also separates this cache from its clones.
        // A quarter, not a doubling: the spare room of every row is resident memory (the
        // allocator zeroes recycled memory in full), and the copies cost little next to the
        // attention reads (growing to 256 positions copies ~1,300 positions per row, the
        // attention over those steps reads ~33,000).
        let sole_owner = Arc::strong_count(shared) == 1;
        let (kb, vb) = if new_len > cap || !sole_owner {
            let new_cap = if new_len > cap {
                new_len
                    .max(cap + (cap / 4).max(GROWTH_MIN))
                    .max(self.reserved)
            } else {
                cap
            };
            // A fresh contiguous buffer with the valid prefix copied in (concatenating a prefix
            // shorter than the capacity would give a strided view, which `slice_set` and the
            // row gathers refuse).
            let grow = |buf: &Tensor, x: &Tensor| -> candle::Result<Tensor> {
                let fresh = zeroed_buffer((b, h, new_cap, x.dim(3)?), x.dtype(), x.device())?;
                if self.len > 0 {
                    fresh.slice_set(&buf.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                Ok(fresh)
            };
            (grow(kb, k)?, grow(vb, v)?)
        } else {
            (kb.clone(), vb.clone())
        };
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len = new_len;
        let views = (kb.narrow(2, 0, new_len)?, vb.narrow(2, 0, new_len)?);
        self.buffers = Some(Arc::new((kb, vb)));
        Ok(views)
    }

    /// [`KvCache::append`] for a cache held in slots: appends `k`, `v` `(B, H, T, head_dim)`
    /// and returns the slots, for attention to read in place. `None` (nothing appended) when
    /// the cache is not held in slots; a cache in slots given what slots cannot hold (another
    /// dtype or device, a tracked tensor) goes back to buffers first and also answers `None`.
    pub(crate) fn append_to_slots(
        &mut self,
        k: &Tensor,
        v: &Tensor,
    ) -> candle::Result<Option<Arc<PagedKv>>> {
        let Some(slots) = &mut self.slots else {
            return Ok(None);
        };
        let (b, h, t, d) = k.dims4()?;
        let (rows, heads, sd, sdv) = slots.dims();
        let fits = (b, h, d) == (rows, heads, sd)
            && v.dims4()? == (b, h, t, sdv)
            && can_page(k)
            && can_page(v);
        if !fits {
            // The buffer path checks the shapes and names what does not match.
            let (kb, vb) = slots.gather()?;
            self.buffers = Some(Arc::new((kb, vb)));
            self.slots = None;
            return Ok(None);
        }
        Arc::make_mut(slots).append(k, v)?;
        self.len += t;
        Ok(Some(slots.clone()))
    }

    /// Keeps batch rows `rows` (e.g. the surviving beams), in that order: `(B', H, S, head_dim)`.
    /// Views handed out before ([`KvCache::keys_values`], [`KvCache::append`]) keep their
    /// values.
    pub fn select_rows(&mut self, rows: &Tensor) -> candle::Result<()> {
        self.select(rows, false)
    }

    /// [`KvCache::select_rows`], moving the rows inside the buffers when this cache is their
    /// only owner and the moves allow it (see [`rows::move_rows_in_place`]): only the rows
    /// that change are copied. Rows that fork (an id repeated) move a CPU `f32` cache into
    /// slots the rows share ([`paged`]) instead. For a cache that hands out no views that
    /// outlive a step (the caches inside a [`crate::transformer::DecoderCache`]): a view taken
    /// before would see the moved rows.
    pub(crate) fn select_rows_in_place(&mut self, rows: &Tensor) -> candle::Result<()> {
        self.select(rows, true)
    }

    fn select(&mut self, rows: &Tensor, in_place: bool) -> candle::Result<()> {
        if let Some(slots) = &mut self.slots {
            let ids = match host_row_ids(rows)? {
                Some(ids) => ids,
                None => rows.to_dtype(candle::DType::U32)?.to_vec1::<u32>()?,
            };
            return Arc::make_mut(slots).select(&ids);
        }
        if let Some(kv) = &self.buffers {
            // The whole buffers, spare capacity included, in one gather each: beam search
            // reorders every step, and the next append must then still fit in place (selecting
            // only the valid prefix made every append regrow the buffers, three copies of the
            // cache per step instead of one). The spare positions are never read.
            // (`contiguous` is free for the buffers `append` makes; it guards the autograd
            // path, whose concatenation may return a strided view.)
            // The row ids are read to the host once for both buffers (CPU only).
            let ids = if kv.0.device().is_cpu() {
                host_row_ids(rows)?
            } else {
                None
            };
            let len = self.len;
            // A reorder that forks rows (beam search continuing a hypothesis in several rows)
            // moves the cache of a decoder into shared slots, where forked rows share their
            // history instead of copying it (see `paged`); a reorder that only drops or
            // permutes rows (a bulk run's finished sentences) keeps the buffers.
            if let (true, Some(ids)) = (in_place && can_page(&kv.0) && can_page(&kv.1), &ids) {
                if forks(ids, kv.0.dim(0)?) {
                    let mut slots = PagedKv::from_buffers(&kv.0, &kv.1, len)?;
                    slots.select(ids)?;
                    self.slots = Some(Arc::new(slots));
                    self.buffers = None;
                    return Ok(());
                }
            }
            if let (true, Some(ids)) = (in_place && Arc::strong_count(kv) == 1, ids.as_deref()) {
                let moved = (
                    move_rows_in_place(&kv.0, ids, len)?,
                    move_rows_in_place(&kv.1, ids, len)?,
                );
                match moved {
                    (Some(k), Some(v)) => {
                        self.buffers = Some(Arc::new((k, v)));
                        return Ok(());
                    }
                    (None, None) => {}
                    _ => candle::bail!(
                        "kv cache: keys {:?} and values {:?} buffers disagree",
                        kv.0.dims(),
                        kv.1.dims()
                    ),
                }
            }
            let (k, v) = (
                select_buffer_rows(&kv.0, rows, ids.as_deref(), len)?,
                select_buffer_rows(&kv.1, rows, ids.as_deref(), len)?,
            );
            self.buffers = Some(Arc::new((k, v)));
        }
        Ok(())
    }
}

/// True when new rows `ids` (old rows of `rows`) repeat an old row (a fork), not only drop or
/// permute them. Ids past `rows` are left to the row selection, which names them.
fn forks(ids: &[u32], rows: usize) -> bool {
    let mut seen = vec![false; rows];
    ids.iter().any(|&r| {
        seen.get_mut(r as usize)
            .is_some_and(|seen| std::mem::replace(seen, true))
    })
}

/// The encoder memory `(B, S, E)` of one encoder-decoder attention block, projected to keys and
/// values `(B, H, S, head_dim)` once per sequence, and the memory it was projected from.
///
/// Filled by the first [`MultiHeadAttention::attend_cross`] call; later calls must pass the same
/// memory tensor (or a clone of it): a different one is an error, never a silent reuse of the
/// old projection. After [`CrossAttentionCache::select_rows`] the cache holds the rows of the
/// reordered memory given to it.
#[derive(Clone, Debug, Default)]
pub struct CrossAttentionCache {
    /// Shared by clones (which then copy when they reorder).
    kv: Option<Arc<(Tensor, Tensor)>>,
    /// The id and shape of the memory the keys and values were projected from.
    memory: Option<(TensorId, Vec<usize>)>,
}

impl CrossAttentionCache {
    /// An empty cache: the next [`MultiHeadAttention::attend_cross`] projects its memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// True before the memory has been projected.
    pub fn is_empty(&self) -> bool {
        self.kv.is_none()
    }

    /// Forgets the projected memory.
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    /// The projected keys and values `(B, H, S, head_dim)`, or `None` when empty.
    pub fn keys_values(&self) -> Option<(&Tensor, &Tensor)> {
        self.kv.as_deref().map(|(k, v)| (k, v))
    }

    /// True when the cache holds the projection of `memory` (the same tensor or a clone).
    pub fn holds(&self, memory: &Tensor) -> bool {
        self.memory
            .as_ref()
            .is_some_and(|(id, _)| *id == memory.id())
    }

    /// Keeps batch rows `rows` (`U32`, e.g. the surviving beams), in that order, and records
    /// `memory` `(rows.len(), S, E)`, the memory reordered the same way, as the one it now holds.
    /// Views handed out before ([`CrossAttentionCache::keys_values`]) keep their values.
    pub fn select_rows(&mut self, rows: &Tensor, memory: &Tensor) -> candle::Result<()> {
        self.select(rows, memory, false)
    }

    /// [`CrossAttentionCache::select_rows`], moving the rows inside the buffers when this
    /// cache is their only owner and the moves allow it (rows shifting down after finished
    /// sentences are dropped). For a cache that hands out no views (the caches inside a
    /// [`crate::transformer::DecoderCache`]): a view taken before would see the moved rows.
    pub(crate) fn select_rows_in_place(
        &mut self,
        rows: &Tensor,
        memory: &Tensor,
    ) -> candle::Result<()> {
        self.select(rows, memory, true)
    }

    fn select(&mut self, rows: &Tensor, memory: &Tensor, in_place: bool) -> candle::Result<()> {
        let Some(kv) = &self.kv else {
            return Ok(());
        };
        let n = rows.dim(0)?;
        let expected_rest = self.memory.as_ref().map(|(_, d)| &d[1..]);
        if memory.rank() != 3 || memory.dim(0)? != n || expected_rest != Some(&memory.dims()[1..]) {
            candle::bail!(
                "cross-attention cache: reordering to {n} rows of a memory {:?}, but the new \
                 memory is {:?} (it must be the old memory reordered the same way)",
                self.memory
                    .as_ref()
                    .map(|(_, d)| d.clone())
                    .unwrap_or_default(),
                memory.dims()
            )
        }
        // Every position is valid here, so the CPU gather copies each kept row once
        // (`index_select` zeroes the output first: a bulk run drops finished sentences often).
        let ids = host_row_ids(rows)?;
        let (k, v) = (&kv.0, &kv.1);
        let len = k.dim(2)?;
        let mut moved = None;
        if let (true, Some(ids)) = (in_place && Arc::strong_count(kv) == 1, ids.as_deref()) {
            if let (Some(k), Some(v)) = (
                move_rows_in_place(k, ids, len)?,
                move_rows_in_place(v, ids, len)?,
            ) {
                moved = Some((k, v));
            }
        }
        let kv = match moved {
            Some(kv) => kv,
            None => (
                select_buffer_rows(k, rows, ids.as_deref(), len)?,
                select_buffer_rows(v, rows, ids.as_deref(), len)?,
            ),
        };
        self.kv = Some(Arc::new(kv));
        self.memory = Some((memory.id(), memory.dims().to_vec()));
        Ok(())
    }
}

/// Options of [`MultiHeadAttention::attend_cached`]. `Default`: causal, no padding, no weights,
/// eval mode.
#[derive(Clone, Debug)]
pub struct CachedAttentionArgs<'a> {
    /// Query `i` of the new tokens sees the cached keys and the new keys up to itself (a decoder's
    /// self-attention). The offset is taken from the cache. `false`: every key is visible.
    pub causal: bool,
    /// Key padding `(B, S_past + T)` covering the cached and the new positions: `U8` non-zero =
    /// padding (torch's polarity; see [`Mask::key_padding_from_attention_mask`] for Hugging Face's).
    pub key_padding: Option<&'a Tensor>,
    /// Any further mask, resolved against `(B, H, T, S_past + T)`.
    pub mask: Mask,
    /// Return the attention weights over all `S_past + T` keys.
    pub need_weights: bool,
    /// Average the weights over heads.
    pub average_weights: bool,
    /// Training mode: attention dropout.
    pub train: bool,
}

impl Default for CachedAttentionArgs<'_> {
    fn default() -> Self {
        Self {
            causal: true,
            key_padding: None,
            mask: Mask::none(),
            need_weights: false,
            average_weights: true,
            train: false,
        }
    }
}

impl MultiHeadAttention {
    /// Self-attention of new tokens through a [`KvCache`]: projects `x` `(B, T, E)`, appends
    /// its keys and values to `cache` and attends over everything cached, with the causal offset
    /// taken from the cache (the number of positions cached before this call).
    ///
    /// Returns `output` `(B, T, E)`, equal to the last `T` rows of a full causal pass over the
    /// whole sequence, and the weights `(B, T, S_past + T)` (averaged) or `(B, H, T, S_past + T)`
    /// when requested.
    ///
    /// ```
    /// use candle::{DType, Device, Tensor};
    /// use candle_attention::{kv_cache::CachedAttentionArgs, KvCache, MultiHeadAttention,
    ///     MultiHeadAttentionConfig};
    /// use candle_nn::{VarBuilder, VarMap};
    /// # fn main() -> candle::Result<()> {
    /// let dev = Device::Cpu;
    /// let varmap = VarMap::new();
    /// let mha = MultiHeadAttention::new(
    ///     MultiHeadAttentionConfig::new(16, 4),
    ///     VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    /// )?;
    /// let x = Tensor::randn(0f32, 1., (1, 5, 16), &dev)?;
    /// let mut cache = KvCache::new();
    /// for t in 0..5 {
    ///     let step = mha.attend_cached(&x.narrow(1, t, 1)?, &mut cache, &Default::default())?;
    ///     assert_eq!(step.output.dims(), &[1, 1, 16]);
    /// }
    /// assert_eq!(cache.len(), 5);
    /// # let _: CachedAttentionArgs = Default::default();
    /// # Ok(()) }
    /// ```
    pub fn attend_cached(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        args: &CachedAttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        self.check_cached_input("x", x)?;
        if args.mask.has_causal() {
            // A causal mask written for the new tokens alone (offset 0) would hide cached keys
            // from them: refuse it rather than attend wrongly.
            candle::bail!(
                "attend_cached applies the causal mask itself, offset by the {} cached positions; \
                 leave causal terms out of `mask` (set `causal: false` for none)",
                cache.len()
            )
        }
        let past = cache.len();
        let q = self.project_query(x)?;
        let (k, v) = self.project_key_value(x, x)?;
        let mut mask = args.mask.clone();
        if args.causal {
            mask = mask.and(Mask::causal_with_offset(past));
        }
        let attn_args = AttentionArgs {
            mask,
            key_padding: args.key_padding,
            need_weights: args.need_weights,
            average_weights: args.average_weights,
            train: args.train,
        };
        if let Some(slots) = cache.append_to_slots(&k, &v)? {
            let heads = self.attend_slots(&q, &slots, &attn_args)?;
            return Ok(AttentionOutput {
                output: self.project_output(&heads.output)?,
                weights: heads.weights,
            });
        }
        let (k, v) = cache.append(&k, &v)?;
        self.attend_projected(&q, &k, &v, &attn_args)
    }

    /// The attention heads of `q` `(B, H, T, head_dim)` over a cache held in slots: read in
    /// place by the kernel where it takes the call, else gathered into tensors first.
    fn attend_slots(
        &self,
        q: &Tensor,
        slots: &Arc<PagedKv>,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        let (_, heads, d, dv) = slots.dims();
        let kv_dims = (heads, slots.len(), d, dv);
        if let Some(out) = self.attend_heads_over_slots(q, slots.clone(), kv_dims, args)? {
            return Ok(out);
        }
        let (k, v) = slots.gather()?;
        self.attend_heads(q, &k, &v, args)
    }

    /// Encoder-decoder attention of `x` `(B, T, E)` over `memory` `(B, S, kdim)` through a
    /// [`CrossAttentionCache`]: the memory's keys and values are projected on the first call
    /// and reused after; a call with a different memory tensor is an error. `args` as for
    /// [`MultiHeadAttention::attend`] (key padding `(B, S)` for the memory).
    pub fn attend_cross(
        &self,
        x: &Tensor,
        memory: &Tensor,
        cache: &mut CrossAttentionCache,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        self.check_cached_input("x", x)?;
        if memory.rank() != 3 || memory.dim(0)? != x.dim(0)? {
            candle::bail!(
                "memory must be (batch, seq, features) with the batch of x {:?}, got {:?}",
                x.dims(),
                memory.dims()
            )
        }
        let (k, v) = self.cross_keys_values(memory, cache)?;
        let q = self.project_query(x)?;
        self.attend_projected(&q, &k, &v, args)
    }

    /// The keys and values `(B, H, S, head_dim)` of `memory` `(B, S, kdim)` held by `cache`,
    /// projected now when it is empty; an error when it holds another memory's.
    pub(crate) fn cross_keys_values(
        &self,
        memory: &Tensor,
        cache: &mut CrossAttentionCache,
    ) -> candle::Result<(Tensor, Tensor)> {
        Ok(match (&cache.kv, &cache.memory) {
            (Some(kv), Some(_)) if cache.holds(memory) => (kv.0.clone(), kv.1.clone()),
            (Some(_), Some((_, dims))) => candle::bail!(
                "cross-attention cache holds the projection of another memory tensor {dims:?}, \
                 got memory {:?}: pass the memory the cache was filled from, or reset() the \
                 cache to project a new one",
                memory.dims()
            ),
            _ => {
                // Kept as `(B, H, S, head_dim)` buffers of their own rather than the views
                // `project_key_value` returns (heads split out of its `(B, S, H, head_dim)`
                // products, or of one fused `(B, S, 2·H, head_dim)` product): every later
                // step reads a head's keys and values as one run of `S · head_dim` floats
                // instead of rows E or 2·E floats apart (a page apart at E = 512, fused), and
                // reorders move rows in place (`move_rows_in_place` takes contiguous buffers
                // only; the views were gathered into new buffers). One copy per sequence; the
                // projection's output is dropped with it. On a serving load
                // (`examples/continuous_load`, 32 clients, beam 4, AMD EPYC Zen 4, 2 threads)
                // the encoder-decoder attention calls took 10–12% less time, about 1% of the
                // whole, inside the host's run-to-run noise.
                let (k, v) = self.project_key_value(memory, memory)?;
                let kv = (k.contiguous()?, v.contiguous()?);
                cache.kv = Some(Arc::new(kv.clone()));
                cache.memory = Some((memory.id(), memory.dims().to_vec()));
                kv
            }
        })
    }

    /// The attention of one cached self-attention step on rows already projected: appends
    /// `k`, `v` `(B, H, T, head_dim)` to `cache` and attends `q` `(B, H, T, head_dim)` over
    /// the whole prefix, causal from the cached length on (eval mode, no weights). Returns the
    /// concatenated heads `(B, T, E)`, before the output projection: what
    /// [`MultiHeadAttention::attend_cached`] computes between its projections, for a step that
    /// projects the rows of several batches at once.
    pub(crate) fn attend_cached_heads(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut KvCache,
        key_padding: Option<&Tensor>,
    ) -> candle::Result<Tensor> {
        let past = cache.len();
        let args = AttentionArgs {
            mask: Mask::causal_with_offset(past),
            key_padding,
            ..Default::default()
        };
        if let Some(slots) = cache.append_to_slots(k, v)? {
            return Ok(self.attend_slots(q, &slots, &args)?.output);
        }
        let (k, v) = cache.append(k, v)?;
        Ok(self.attend_heads(q, &k, &v, &args)?.output)
    }

    /// `x` must be batched `(B, T, E)` in the weights' dtype for the cached calls.
    fn check_cached_input(&self, name: &str, x: &Tensor) -> candle::Result<()> {
        let e = self.config().embed_dim;
        if x.rank() != 3 || x.dim(2)? != e {
            candle::bail!(
                "{name} must be (batch, seq, {e}) for cached attention, got {:?}",
                x.dims()
            )
        }
        if x.dtype() != self.dtype() {
            candle::bail!(
                "{name} has dtype {:?} but the layer's weights are {:?}; convert one of them with to_dtype",
                x.dtype(),
                self.dtype()
            )
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::{DType, Device};

    /// The first lane of every cached position of (`row`, `head`) in keys `(B, H, S, d)`.
    fn first_lanes(ks: &Tensor, row: usize, head: usize) -> Vec<f32> {
        ks.get(row)
            .unwrap()
            .get(head)
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// A cache with spare capacity (3 of 4 positions used), forked and appended to (the fork
    /// copies a prefix shorter than its buffer), reordered and appended again: every step
    /// keeps exactly the values written, in the right rows.
    #[test]
    fn forks_and_reorders_with_spare_capacity_keep_the_values() {
        let dev = Device::Cpu;
        let step = |rows: &[f32]| {
            let data: Vec<f32> = rows.iter().flat_map(|&r| [r; 2 * 2]).collect();
            Tensor::from_vec(data, (rows.len(), 2, 1, 2), &dev).unwrap()
        };
        let mut cache = KvCache::new();
        for t in 0..3 {
            let k = step(&[10.0 + t as f32, 20.0 + t as f32]);
            cache.append(&k, &k).unwrap();
        }
        let mut fork = cache.clone();
        fork.append(&step(&[13.0, 23.0]), &step(&[13.0, 23.0]))
            .unwrap();
        fork.select_rows(&Tensor::new(&[1u32, 0, 1], &dev).unwrap())
            .unwrap();
        let (ks, _) = fork
            .append(&step(&[24.0, 14.0, 24.0]), &step(&[24.0, 14.0, 24.0]))
            .unwrap();
        let firsts: Vec<Vec<f32>> = (0..3).map(|row| first_lanes(&ks, row, 0)).collect();
        assert_eq!(firsts[0], vec![20.0, 21.0, 22.0, 23.0, 24.0]);
        assert_eq!(firsts[1], vec![10.0, 11.0, 12.0, 13.0, 14.0]);
        assert_eq!(firsts[2], firsts[0]);
        // The original saw none of it.
        assert_eq!(cache.len(), 3);
        let (orig, _) = cache.keys_values().unwrap().unwrap();
        assert_eq!(orig.dims(), &[2, 2, 3, 2]);
    }

    #[test]
    fn appends_grow_and_keep_everything() {
        let dev = Device::Cpu;
        let mut cache = KvCache::new();
        let mut all = Vec::new();
        for step in 0..9 {
            let k = Tensor::full(step as f32, (2, 3, 1, 4), &dev).unwrap();
            let (ks, vs) = cache.append(&k, &(&k * 2.0).unwrap()).unwrap();
            all.push(step as f32);
            assert_eq!(ks.dims(), &[2, 3, step + 1, 4]);
            assert_eq!(first_lanes(&ks, 1, 2), all);
            assert_eq!(vs.dims(), ks.dims());
        }
        let rows = Tensor::new(&[1u32, 1, 0], &dev).unwrap();
        cache.select_rows(&rows).unwrap();
        let (ks, _) = cache
            .append(
                &Tensor::zeros((3, 3, 2, 4), DType::F32, &dev).unwrap(),
                &Tensor::zeros((3, 3, 2, 4), DType::F32, &dev).unwrap(),
            )
            .unwrap();
        assert_eq!(ks.dims(), &[3, 3, 11, 4]);
        assert_eq!(cache.len(), 11);
        let err = cache.append(
            &Tensor::zeros((2, 3, 1, 4), DType::F32, &dev).unwrap(),
            &Tensor::zeros((2, 3, 1, 4), DType::F32, &dev).unwrap(),
        );
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("cannot take [2, 3, 1, 4]"));
    }

    #[test]
    fn a_reserved_cache_holds_and_reorders_what_a_growing_one_does() {
        let dev = Device::Cpu;
        let (mut plain, mut reserved) = (KvCache::new(), KvCache::new());
        reserved.reserve(16);
        for step in 0..11u32 {
            let k = Tensor::arange(0f32, 24.0, &dev)
                .unwrap()
                .affine(1.0, step as f64 * 100.0)
                .unwrap()
                .reshape((2, 3, 1, 4))
                .unwrap();
            let v = (&k * -1.0).unwrap();
            let (kp, vp) = plain.append(&k, &v).unwrap();
            let (kr, vr) = reserved.append(&k, &v).unwrap();
            assert_eq!(kp.dims(), kr.dims());
            let all = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(all(&kp), all(&kr), "keys at step {step}");
            assert_eq!(all(&vp), all(&vr), "values at step {step}");
            // Swapping rows cannot move in place: a gather into a new buffer, both ways.
            let rows = Tensor::new(&[1u32, 0], &dev).unwrap();
            plain.select_rows_in_place(&rows).unwrap();
            reserved.select_rows_in_place(&rows).unwrap();
        }
        let buffers = reserved.buffers.as_ref().unwrap();
        assert_eq!(
            buffers.0.dim(2).unwrap(),
            16,
            "one allocation of the reserved room"
        );
        let (kp, _) = plain.keys_values().unwrap().unwrap();
        let (kr, _) = reserved.keys_values().unwrap().unwrap();
        let all = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(all(&kp), all(&kr));
    }

    #[test]
    fn clones_are_independent() {
        let dev = Device::Cpu;
        let mut a = KvCache::new();
        let kv = |x: f32| Tensor::full(x, (1, 2, 1, 3), &dev).unwrap();
        a.append(&kv(1.0), &kv(1.0)).unwrap();
        a.append(&kv(2.0), &kv(2.0)).unwrap(); // capacity 2, full
        a.append(&kv(3.0), &kv(3.0)).unwrap(); // capacity 4, one slot free
        let mut b = a.clone();
        let (ka, _) = a.append(&kv(10.0), &kv(10.0)).unwrap();
        let (kb, _) = b.append(&kv(20.0), &kv(20.0)).unwrap();
        let last = |t: &Tensor| -> f32 {
            t.narrow(2, 3, 1)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[0]
        };
        assert_eq!(last(&ka), 10.0);
        assert_eq!(last(&kb), 20.0);
        let (ka, _) = a.keys_values().unwrap().unwrap();
        assert_eq!(last(&ka), 10.0, "b's append must not write into a's buffer");
    }

    /// Bits of a tensor, to compare results exactly.
    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// A decode whose reorders fork rows (beam search) moves into shared slots, and from then
    /// on every append returns, and every cached attention step computes, bit for bit what a
    /// cache of contiguous buffers does under the same appends and reorders: forks, drops,
    /// permutations, two tokens at once, and a clone that appends on its own.
    #[test]
    fn a_forked_cache_in_slots_attends_exactly_as_contiguous_buffers() {
        let dev = Device::Cpu;
        let (e, heads) = (32, 4);
        // Inference weights (variables would make every projection track its gradient, and a
        // cache under autograd never moves into slots).
        let cfg = crate::MultiHeadAttentionConfig::new(e, heads);
        let mha = crate::testing::inference_attention(cfg, DType::F32, &dev).unwrap();
        let (mut slots, mut buffers) = (KvCache::new(), KvCache::new());
        // Row ids after each step: the first forks one row into four, later ones drop,
        // permute and fork again.
        let reorders: [&[u32]; 6] = [
            &[0, 0, 0, 0],
            &[0, 1, 1, 3],
            &[2, 0, 3, 1],
            &[1, 1, 2],
            &[0, 2, 2, 1, 1],
            &[4, 3],
        ];
        let mut rows = 1;
        for (step, reorder) in reorders.iter().enumerate() {
            let t = if step == 2 { 2 } else { 1 };
            let x = Tensor::randn(0f32, 1.0, (rows, t, e), &dev).unwrap();
            let args = CachedAttentionArgs::default();
            let a = mha.attend_cached(&x, &mut slots, &args).unwrap();
            let b = mha.attend_cached(&x, &mut buffers, &args).unwrap();
            assert_eq!(bits(&a.output), bits(&b.output), "step {step}");
            // The parts path (heads already projected) too.
            let q = mha.project_query(&x).unwrap();
            let (k, v) = mha.project_key_value(&x, &x).unwrap();
            let (mut s2, mut b2) = (slots.clone(), buffers.clone());
            let a = mha.attend_cached_heads(&q, &k, &v, &mut s2, None).unwrap();
            let b = mha.attend_cached_heads(&q, &k, &v, &mut b2, None).unwrap();
            assert_eq!(bits(&a), bits(&b), "heads, step {step}");
            let (ka, va) = s2.keys_values().unwrap().unwrap();
            let (kb, vb) = b2.keys_values().unwrap().unwrap();
            assert_eq!(
                (bits(&ka), bits(&va)),
                (bits(&kb), bits(&vb)),
                "step {step}"
            );
            // The clones appended; the originals did not see it.
            assert_eq!(slots.len() + t, s2.len());
            let ids = Tensor::new(*reorder, &dev).unwrap();
            slots.select_rows_in_place(&ids).unwrap();
            buffers.select_rows(&ids).unwrap();
            assert!(slots.slots.is_some() && buffers.slots.is_none());
            rows = reorder.len();
        }
    }

    /// Rows forked from one share its slots: a beam of four holds each common position once,
    /// new positions take one slot per row, and the slots of dropped rows are reused.
    #[test]
    fn forked_rows_share_their_slots_and_dropped_ones_are_reused() {
        let dev = Device::Cpu;
        let kv = |rows: usize| Tensor::randn(0f32, 1.0, (rows, 2, 1, 4), &dev).unwrap();
        let mut cache = KvCache::new();
        for _ in 0..3 {
            cache.append(&kv(1), &kv(1)).unwrap();
        }
        let fork = Tensor::new(&[0u32, 0, 0, 0], &dev).unwrap();
        cache.select_rows_in_place(&fork).unwrap();
        let in_use = |c: &KvCache| c.slots.as_ref().unwrap().slots_in_use();
        assert_eq!(in_use(&cache), (3, 3), "four rows, three shared positions");
        cache.append(&kv(4), &kv(4)).unwrap();
        assert_eq!(in_use(&cache), (7, 7));
        // Keep two rows: the other two rows' last positions are freed, then reused.
        cache
            .select_rows_in_place(&Tensor::new(&[1u32, 1], &dev).unwrap())
            .unwrap();
        assert_eq!(in_use(&cache), (4, 7));
        cache.append(&kv(2), &kv(2)).unwrap();
        assert_eq!(in_use(&cache), (6, 7), "freed slots are taken first");
        // A tensor that slots cannot hold (bf16) moves the cache back to buffers, whose
        // checks name the mismatch.
        let half = kv(2).to_dtype(DType::BF16).unwrap();
        let err = cache.append(&half, &half).unwrap_err().to_string();
        assert!(err.contains("cannot take"), "{err}");
        assert!(cache.slots.is_none());
        assert_eq!(
            cache.keys_values().unwrap().unwrap().0.dims(),
            &[2, 2, 5, 4]
        );
    }
}

//! Memory-efficient attention for CPU tensors: tiled, with an online softmax
//! (FlashAttention-2 style), `O(block)` scratch per thread instead of the `(L, S)` matrix.
//!
//! The work is split into tasks of one `(batch, head)` and up to four blocks of [`BQ`] = 64
//! queries, run in parallel with rayon. A task transposes each query block once, `qt`
//! `(D, BQ)`, then walks the keys in blocks of `block_k` (128); every key/value block is
//! used by all the task's query blocks while it is in cache:
//!
//! 1. scores `Sᵀ = K_blk · Qᵀ` `(block_k, BQ)`, times `scale · log2(e)`: a register-blocked
//!    micro-kernel (6 keys × 64 queries, 24 accumulators on AVX-512) that reads the keys in
//!    place, so neither `K` nor `V` is ever copied or packed;
//! 2. masks applied inside the tile: key padding as a per-key bias row, general biases
//!    element by element, causal only on the diagonal blocks (blocks wholly above the diagonal
//!    are never visited, blocks wholly below need nothing); key blocks that are entirely
//!    padding are skipped, and so is everything after a batch row's last real key;
//! 3. the online-softmax update, vectorised across 16 queries (max, `exp2`, sum), in the log2
//!    domain;
//! 4. `O = alpha · O + P · V_blk` with a register-blocked micro-kernel (6 queries × 64 values).
//!
//! Scratch (`qt`, the score tile, row statistics) lives in a per-thread buffer reused across
//! tiles, tasks and calls; the output accumulator is the output block itself. The output is
//! laid out `(B, L, H, Dv)` and returned as its `(B, H, L, Dv)` transposed view: multi-head
//! attention reads it as the concatenated heads `(B, L, H · Dv)` without a copy. Extra memory is
//! therefore the output plus `threads × (4 · (D + 3) + block_k) · 64` floats, and for half
//! inputs the key/value tiles per thread (`max(block_k, 64) · (D + Dv)` floats converted, or
//! `block_k / 2 · Dv` packed bf16 pairs) and the `f32` output before its final rounding; bf16
//! on the `vdpbf16ps` path packs the values of each head once instead when more than one task
//! walks its keys (one more copy of `V`, as many bytes).
//!
//! Instruction sets are chosen at run time: AVX-512F micro-kernels (the private `avx512` module) when
//! `is_x86_feature_detected!` finds AVX-512F (with AVX2 and FMA), otherwise portable Rust
//! kernels, compiled a second time with AVX2+FMA enabled for CPUs that have them. No
//! `target-cpu` flag is needed.
//!
//! `f16`/`bf16` inputs are read in place and converted per tile, never as a whole tensor
//! (the private module `sdpa::half`): bf16 on a CPU with AVX-512 BF16 runs both products
//! with `vdpbf16ps` (bf16 pairs, `f32` accumulation, probabilities rounded to bf16 for
//! `P·V`); f16, and bf16 elsewhere, convert each key/value block and query block to `f32` as
//! a task loads it. The softmax statistics and the output accumulator are always `f32`; the
//! output is rounded to the input dtype at the end.
//!
//! Fully masked query rows give zeros, as in [`super::naive`]. Inputs may be strided views
//! (e.g. the `(B, L, H, D) → (B, H, L, D)` transpose of a projection) as long as the head
//! dimension is contiguous; otherwise they are made contiguous first.

use super::half::{self, Kind};
use crate::mask::MaskParts;
use crate::simd::{cpu_f32, with_scratch, Isa};
use candle::{DType, Device, Tensor};
use rayon::prelude::*;
use std::f32::consts::LOG2_E;

/// Queries per block (the width of the score tile; fixed by the micro-kernels).
pub const BQ: usize = 64;
pub(crate) use crate::simd::EXP2_POLY;

/// Default number of keys per block.
pub const DEFAULT_BLOCK_K: usize = 128;

/// Knobs of the tiled kernel; `Default` is what [`super::scaled_dot_product_attention`] uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledConfig {
    /// Keys per block (`>= 1`); the score tile holds `block_k × 64` floats.
    pub block_k: usize,
    /// Use the portable kernels even where AVX-512 or AVX2 is available (for testing).
    pub force_portable: bool,
    /// Query blocks of [`BQ`] per task (1 to 4); `None` chooses from the shape and the thread
    /// count.
    pub blocks_per_task: Option<usize>,
    /// bf16 inputs: use the AVX-512 BF16 dot-product kernels where the CPU has them (`true`,
    /// the default); `false` converts bf16 tiles to `f32` instead, as on CPUs without them.
    pub half_dot: bool,
}

impl Default for TiledConfig {
    fn default() -> Self {
        Self {
            block_k: DEFAULT_BLOCK_K,
            force_portable: false,
            blocks_per_task: None,
            half_dot: true,
        }
    }
}

/// Tiled attention of `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` (CPU
/// tensors of one dtype: `f32`, `f16` or `bf16`; `Hkv` divides `H`, query head `h` uses
/// key/value head `h / (H / Hkv)`) under `mask`, with scores scaled by `scale`.
/// Returns the output `(B, H, L, Dv)` in the input dtype. No weights, no autograd.
///
/// `mask` comes from [`crate::Mask::decompose`] for the same `(B, H, L, S)`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
) -> candle::Result<Tensor> {
    attention_with(q, k, v, mask, scale, &TiledConfig::default())
}

/// [`attention`] with explicit [`TiledConfig`]: `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`,
/// `v` `(B, Hkv, S, Dv)` → `(B, H, L, Dv)`.
pub fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
    cfg: &TiledConfig,
) -> candle::Result<Tensor> {
    let prep = Prepared::new(q, k, v, mask, scale)?;
    if cfg.block_k == 0 {
        candle::bail!("tiled attention: block_k must be at least 1")
    }
    let g = match cfg.blocks_per_task {
        None => blocks_per_task(&prep.dims),
        Some(g @ 1..=4) => g,
        Some(g) => candle::bail!("tiled attention: blocks_per_task must be 1 to 4, got {g}"),
    };
    let isa = Isa::detect(cfg.force_portable);
    let kind = Kind::choose(prep.in_dtype, isa, cfg.half_dot);
    prep.run(isa, kind, |inp, out| {
        run_tiled(isa, inp, out, cfg.block_k, g)
    })
}

/// Inputs validated, in their own dtype with a unit-stride last dimension (masks as `f32`).
pub(crate) struct Prepared {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_bias: Option<Vec<f32>>,
    bias: Option<Tensor>,
    causal: Option<usize>,
    qscale: f32,
    pub(crate) in_dtype: DType,
    dims: Dims,
}

/// `(B, H, L, S, D, Dv)` and the key/value heads `Hkv` (dividing `H`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub l: usize,
    pub s: usize,
    pub d: usize,
    pub dv: usize,
}

/// A strided 4-D view (of `f32`, or of f16/bf16 bits) whose last dimension is contiguous:
/// element `(b, h, r, c)` at `start + b * sb + h * sh + r * sr + c`.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a, T = f32> {
    data: &'a [T],
    start: usize,
    sb: usize,
    sh: usize,
    pub sr: usize,
    rows: usize,
    cols: usize,
}

impl<'a, T> Strided<'a, T> {
    fn new(data: &'a [T], t: &Tensor, start: usize) -> Self {
        let dims = t.dims();
        let st = t.stride();
        let s = |i: usize| if dims[i] == 1 { 0 } else { st[i] };
        Self {
            data,
            start,
            sb: s(0),
            sh: s(1),
            sr: s(2),
            rows: dims[2],
            cols: dims[3],
        }
    }

    /// The rows of `(b, h)`: row `r` starts at `r * self.sr`.
    pub fn head(&self, b: usize, h: usize) -> &'a [T] {
        if self.rows == 0 || self.cols == 0 {
            return &[];
        }
        let base = self.start + b * self.sb + h * self.sh;
        &self.data[base..base + (self.rows - 1) * self.sr + self.cols]
    }
}

/// The rows of one head: `f32`, or half-precision bits (f16 or bf16, per [`Kind`]).
#[derive(Clone, Copy)]
pub(crate) enum Data<'a> {
    F32(&'a [f32]),
    Half(&'a [u16]),
}

impl<'a> Data<'a> {
    /// The elements from `start` on.
    fn from(self, start: usize) -> Data<'a> {
        match self {
            Data::F32(x) => Data::F32(&x[start..]),
            Data::Half(x) => Data::Half(&x[start..]),
        }
    }
}

/// `Q`, `K` or `V` of one call, in the input dtype.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    F32(Strided<'a, f32>),
    Half(Strided<'a, u16>),
}

impl<'a> Rows<'a> {
    /// The rows of `(b, h)`: row `r` starts at `r * self.sr()`.
    pub fn head(&self, b: usize, h: usize) -> Data<'a> {
        match self {
            Rows::F32(x) => Data::F32(x.head(b, h)),
            Rows::Half(x) => Data::Half(x.head(b, h)),
        }
    }

    /// The row stride.
    pub fn sr(&self) -> usize {
        match self {
            Rows::F32(x) => x.sr,
            Rows::Half(x) => x.sr,
        }
    }

    fn new(storage: &'a candle::Storage, t: &Tensor, start: usize) -> candle::Result<Self> {
        Ok(if t.dtype() == DType::F32 {
            Rows::F32(Strided::new(cpu_f32(storage)?, t, start))
        } else {
            Rows::Half(Strided::new(crate::simd::cpu_half_bits(storage)?, t, start))
        })
    }
}

/// Borrowed inputs of one call, shared by all tasks.
pub(crate) struct Inputs<'a> {
    pub q: Rows<'a>,
    pub k: Rows<'a>,
    pub v: Rows<'a>,
    /// How the elements of `q`, `k`, `v` reach the micro-kernels.
    pub kind: Kind,
    /// `(B, S)` key bias in the log2 domain.
    pub key_bias: Option<&'a [f32]>,
    /// Per batch row: one past the last key that is not padding.
    pub key_end: Vec<usize>,
    pub bias: Option<Strided<'a>>,
    pub causal: Option<usize>,
    pub qscale: f32,
    pub dims: Dims,
}

impl<'a> Inputs<'a> {
    /// The last key (exclusive) any of queries `i0 .. i0 + nq` of batch row `b` can see.
    pub fn key_limit(&self, b: usize, i0: usize, nq: usize) -> usize {
        let mut end = self.key_end[b];
        if let Some(off) = self.causal {
            end = end.min(i0.saturating_add(nq).saturating_add(off));
        }
        end
    }
}

fn f32_rows(t: &Tensor) -> candle::Result<Tensor> {
    let t = if t.dtype() == DType::F32 {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?
    };
    unit_rows(t)
}

/// `t` itself when its last dimension is contiguous, else a contiguous copy (same dtype).
fn unit_rows(t: Tensor) -> candle::Result<Tensor> {
    if t.stride()[3] == 1 || t.dim(3)? <= 1 {
        Ok(t)
    } else {
        t.contiguous()
    }
}

impl Prepared {
    pub(crate) fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &MaskParts,
        scale: f64,
    ) -> candle::Result<Self> {
        super::check_qkv(q, k, v)?;
        for t in [q, k, v] {
            if !matches!(t.device(), Device::Cpu) {
                candle::bail!(
                    "tiled attention runs on CPU tensors only, got {:?}",
                    t.device().location()
                )
            }
        }
        let in_dtype = q.dtype();
        if !matches!(in_dtype, DType::F32 | DType::F16 | DType::BF16) {
            candle::bail!("tiled attention supports f32, f16 and bf16, got {in_dtype:?}")
        }
        if !scale.is_finite() {
            candle::bail!("attention scale must be finite, got {scale}")
        }
        let (b, h, l, d) = q.dims4()?;
        let (hkv, s, dv) = (k.dim(1)?, k.dim(2)?, v.dim(3)?);
        let dims = Dims {
            b,
            h,
            hkv,
            l,
            s,
            d,
            dv,
        };
        let key_bias = match &mask.key_bias {
            None => None,
            Some(kb) => {
                if kb.dims() != [b, s] {
                    candle::bail!(
                        "key bias must be (batch, S) = ({b}, {s}), got {:?}",
                        kb.dims()
                    )
                }
                let kb = kb
                    .to_device(&Device::Cpu)?
                    .to_dtype(DType::F32)?
                    .flatten_all()?;
                Some(
                    kb.to_vec1::<f32>()?
                        .into_iter()
                        .map(|x| x * LOG2_E)
                        .collect::<Vec<f32>>(),
                )
            }
        };
        let bias = match &mask.bias {
            None => None,
            Some(bias) => {
                let dims = bias.dims();
                let fits = |x: usize, full: usize| x == 1 || x == full;
                if bias.rank() != 4
                    || !fits(dims[0], b)
                    || !fits(dims[1], h)
                    || !fits(dims[2], l)
                    || dims[3] != s
                {
                    candle::bail!(
                        "attention bias must be (B | 1, H | 1, L | 1, S) = ({b} | 1, {h} | 1, {l} | 1, {s}), got {dims:?}"
                    )
                }
                Some(f32_rows(&bias.to_device(&Device::Cpu)?)?)
            }
        };
        Ok(Self {
            q: unit_rows(q.clone())?,
            k: unit_rows(k.clone())?,
            v: unit_rows(v.clone())?,
            key_bias,
            bias,
            causal: mask.causal_offset,
            qscale: (scale as f32) * LOG2_E,
            in_dtype,
            dims,
        })
    }

    /// Borrows the storages and runs `kernel(inputs, output)` on a zeroed buffer laid out
    /// `(B, L, H, Dv)`, returned as the `(B, H, L, Dv)` tensor of the input dtype it is a
    /// transposed view of. That order is what multi-head attention needs next (its heads
    /// concatenated per position, `(B, L, H · Dv)`), so it gets them without a copy.
    ///
    /// The kernel gets the buffer uninitialised and must write every row (zeroing it first
    /// would be a wasted pass over the output).
    pub(crate) fn run(
        &self,
        isa: Isa,
        kind: Kind,
        kernel: impl FnOnce(&Inputs, OutRows),
    ) -> candle::Result<Tensor> {
        let Dims { b, h, l, s, dv, .. } = self.dims;
        if l == 0 || s == 0 || b == 0 || h == 0 || dv == 0 {
            return Tensor::zeros((b, h, l, dv), self.in_dtype, &Device::Cpu);
        }
        let (qs, ql) = self.q.storage_and_layout();
        let (ks, kl) = self.k.storage_and_layout();
        let (vs, vl) = self.v.storage_and_layout();
        let bias_guard = self.bias.as_ref().map(|t| t.storage_and_layout());
        let bias = match (&bias_guard, &self.bias) {
            (Some((st, lay)), Some(t)) => Some(Strided::new(cpu_f32(st)?, t, lay.start_offset())),
            _ => None,
        };
        let key_end = match &self.key_bias {
            None => vec![s; b],
            Some(kb) => kb
                .chunks(s)
                .map(|row| {
                    row.iter()
                        .rposition(|&x| x != f32::NEG_INFINITY)
                        .map_or(0, |p| p + 1)
                })
                .collect(),
        };
        let inputs = Inputs {
            q: Rows::new(&qs, &self.q, ql.start_offset())?,
            k: Rows::new(&ks, &self.k, kl.start_offset())?,
            v: Rows::new(&vs, &self.v, vl.start_offset())?,
            kind,
            key_bias: self.key_bias.as_deref(),
            key_end,
            bias,
            causal: self.causal,
            qscale: self.qscale,
            dims: self.dims,
        };
        let len = b * l * h * dv;
        let mut out = Vec::<f32>::with_capacity(len);
        kernel(
            &inputs,
            OutRows {
                ptr: out.as_mut_ptr(),
                dims: self.dims,
            },
        );
        // SAFETY: the capacity is `len`, and every kernel given to `run` writes all B·L·H
        // rows of Dv floats (`run_tiled`: every (batch, head, query group) task zeroes then
        // accumulates its rows; the decode merge writes every (batch, head, query) row).
        unsafe { out.set_len(len) };
        let out = if self.in_dtype == DType::F32 {
            Tensor::from_vec(out, (b, l, h, dv), &Device::Cpu)?
        } else {
            let f16 = self.in_dtype == DType::F16;
            half::half_tensor(half::round_to_half(isa, &out, f16), f16, (b, l, h, dv))?
        };
        out.transpose(1, 2)
    }
}

/// Query blocks per task (1, 2 or 4): a task walks the keys once for all its blocks, so each
/// key/value block is fetched from memory once and reused from cache by every query block.
/// Fewer blocks per task when that would leave fewer than 4 tasks per thread.
fn blocks_per_task(dims: &Dims) -> usize {
    let blocks = dims.l.div_ceil(BQ);
    let threads = rayon::current_num_threads().max(1);
    let mut g = 4;
    while g > 1 && dims.b * dims.h * blocks.div_ceil(g) < 4 * threads {
        g /= 2;
    }
    g
}

/// The `(B, L, H, Dv)` output of a kernel, shared by its tasks, each of which writes its own
/// rows. The memory starts uninitialised: a kernel must write every row.
#[derive(Clone, Copy)]
pub(crate) struct OutRows {
    ptr: *mut f32,
    dims: Dims,
}
// SAFETY: tasks write through the pointer only into rows no other task writes (see the uses),
// and the buffer outlives the parallel loops.
unsafe impl Send for OutRows {}
// SAFETY: as above.
unsafe impl Sync for OutRows {}

impl OutRows {
    /// Rows `(b, i0 + i, h)`, `i < rows`, as an [`OutBlock`] (stride `H · Dv`).
    ///
    /// # Safety
    /// `b < B`, `h < H`, `i0 + rows <= L`. (Creating the block is harmless; writing through
    /// it needs the block's own contract.)
    pub unsafe fn block(self, b: usize, i0: usize, h: usize, rows: usize) -> OutBlock {
        let Dims {
            l, h: heads, dv, ..
        } = self.dims;
        debug_assert!(i0 + rows <= l && h < heads);
        OutBlock {
            // SAFETY: the offset of row (b, i0, h) is inside the B·L·H·Dv floats.
            ptr: self.ptr.add(((b * l + i0) * heads + h) * dv),
            stride: heads * dv,
            rows,
        }
    }
}

fn run_tiled(isa: Isa, inp: &Inputs, out: OutRows, bk: usize, g: usize) {
    let Dims { b, h, l, d, dv, .. } = inp.dims;
    let groups = l.div_ceil(g * BQ);
    let scratch_len = group_scratch_len(d, dv, bk, g, inp.kind);
    let copies = HeadCopies::new(inp, bk, groups);
    (0..b * h * groups).into_par_iter().for_each(|t| {
        let (bh, gi) = (t / groups, t % groups);
        let (bb, hh) = (bh / h, bh % h);
        let i0 = gi * g * BQ;
        let nq = (g * BQ).min(l - i0);
        let copy = copies.head(bb, hh / (h / inp.dims.hkv));
        with_scratch(scratch_len, |scratch| {
            // SAFETY: rows (bb, i0 .. i0 + nq, hh) of the output exist (bb < B, hh < H,
            // i0 + nq <= L) and are this task's alone: tasks partition (batch, head, query
            // group). They are `Dv` floats each at stride H·Dv >= Dv, nq <= g·BQ.
            unsafe {
                let o = out.block(bb, i0, hh, nq);
                let keys = 0..inp.dims.s;
                query_group(isa, inp, bb, hh, i0, o, bk, g, keys, copy, None, scratch)
            }
        });
    });
}

/// Copies of the keys and values that every task of a head reads instead of the inputs, made
/// once per call when several tasks walk each head's keys (`groups` query groups per head,
/// `H / Hkv` query heads per key/value head). Each replaces memory traffic that every task
/// would otherwise repeat:
///
/// * keys whose rows are not contiguous (the `(B, L, 3, H, D)` output of a fused projection,
///   rows `3 · H · D` apart) are copied into contiguous rows: read in place, every key block
///   touched a page per row or two, 9% more time in the score kernel of a 4096-token bf16
///   multi-head attention;
/// * bf16 values on the `vdpbf16ps` path are packed in key pairs
///   ([`half::dot::pack_values`]) once instead of per key block and task (3% of the same
///   call); key blocks must then be even, so that they start on key pairs.
///
/// Each costs one more copy of `K` or `V` (as many bytes), linear in the sequence.
struct HeadCopies {
    keys: Option<KeyCopy>,
    values: Option<Vec<f32>>,
    /// Elements per head of `keys` (`S · D`) and words per head of `values` (`ceil(S / 2) ·
    /// 16 · ceil(Dv / 16)`).
    key_len: usize,
    value_len: usize,
    hkv: usize,
}

/// Contiguous key rows `(B, Hkv, S, D)` in the input dtype.
enum KeyCopy {
    F32(Vec<f32>),
    Half(Vec<u16>),
}

/// What a task reads instead of its key/value head's inputs ([`HeadCopies::head`]): keys in
/// contiguous rows of `D`, values packed in key pairs from key 0.
#[derive(Clone, Copy, Default)]
pub(crate) struct HeadCopy<'a> {
    keys: Option<Data<'a>>,
    values: Option<&'a [f32]>,
}

impl HeadCopies {
    fn new(inp: &Inputs, bk: usize, groups: usize) -> Self {
        let Dims {
            b,
            h,
            hkv,
            s,
            d,
            dv,
            ..
        } = inp.dims;
        let shared = groups * (h / hkv) > 1;
        let key_len = s * d;
        let value_len = s.div_ceil(2) * dv.div_ceil(16) * 16;
        let strided_keys = inp.k.sr() != d;
        let keys = (shared && strided_keys && key_len > 0).then(|| match inp.k {
            Rows::F32(k) => KeyCopy::F32(contiguous_rows(&k, b * hkv, hkv, s, d)),
            Rows::Half(k) => KeyCopy::Half(contiguous_rows(&k, b * hkv, hkv, s, d)),
        });
        // Packed values need key blocks that start on key pairs (`bk` even).
        let pack = shared && inp.kind == Kind::Bf16Dot && bk.is_multiple_of(2);
        let values = if pack {
            packed_values(inp, value_len)
        } else {
            None
        };
        Self {
            keys,
            values,
            key_len,
            value_len,
            hkv,
        }
    }

    /// The copies for key/value head `(b, kv_head)`.
    fn head(&self, b: usize, kv_head: usize) -> HeadCopy<'_> {
        let i = b * self.hkv + kv_head;
        let (k0, v0) = (i * self.key_len, i * self.value_len);
        HeadCopy {
            keys: self.keys.as_ref().map(|k| match k {
                KeyCopy::F32(k) => Data::F32(&k[k0..k0 + self.key_len]),
                KeyCopy::Half(k) => Data::Half(&k[k0..k0 + self.key_len]),
            }),
            values: self.values.as_ref().map(|v| &v[v0..v0 + self.value_len]),
        }
    }
}

/// The bf16 values of every key/value head packed in key pairs from key 0
/// ([`half::dot::pack_values`], `value_len` words per head), for [`Kind::Bf16Dot`] inputs.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn packed_values(inp: &Inputs, value_len: usize) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    if let Rows::Half(v) = inp.v {
        let Dims { b, hkv, s, dv, .. } = inp.dims;
        let mut data = vec![0.0f32; b * hkv * value_len];
        data.par_chunks_mut(value_len)
            .enumerate()
            .for_each(|(i, dst)| {
                half::dot::pack_values(inp.kind, v.head(i / hkv, i % hkv), v.sr, s, dv, dst)
            });
        return Some(data);
    }
    None
}

/// The `rows × cols` rows of each of `heads` heads of `x` (head `i` = `(i / hkv, i % hkv)`),
/// copied contiguously: `(heads, rows, cols)`.
fn contiguous_rows<T: Copy + Default + Send + Sync>(
    x: &Strided<T>,
    heads: usize,
    hkv: usize,
    rows: usize,
    cols: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); heads * rows * cols];
    out.par_chunks_mut(rows * cols)
        .enumerate()
        .for_each(|(i, dst)| {
            let src = x.head(i / hkv, i % hkv);
            for (r, row) in dst.chunks_exact_mut(cols).enumerate() {
                row.copy_from_slice(&src[r * x.sr..r * x.sr + cols]);
            }
        });
    out
}

/// Per-query-block state inside a task: the transposed query block and the row statistics.
struct SubBlock<'s> {
    i0: usize,
    nq: usize,
    nv: usize,
    kend: usize,
    /// Whether `P·V` has written the rows yet (until then they hold whatever was there).
    started: bool,
    qt: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
    alpha: &'s mut [f32],
}

/// Scratch floats [`query_group`] needs (`kind`: the key/value tiles of half inputs).
pub(crate) fn group_scratch_len(d: usize, dv: usize, bk: usize, g: usize, kind: Kind) -> usize {
    g * (d * BQ + 3 * BQ) + bk * BQ + kind.tile_len(d, dv, bk)
}

/// Output rows of one task: row `i < rows` is the `Dv` floats at `ptr + i * stride`.
#[derive(Clone, Copy)]
pub(crate) struct OutBlock {
    pub ptr: *mut f32,
    pub stride: usize,
    pub rows: usize,
}

impl OutBlock {
    /// Row `i` as a slice.
    ///
    /// # Safety
    /// The block's contract (see [`query_group`]), `i < rows`, and no other live reference
    /// to the row.
    unsafe fn row<'o>(self, i: usize, dv: usize) -> &'o mut [f32] {
        debug_assert!(i < self.rows);
        // SAFETY: the caller's contract.
        std::slice::from_raw_parts_mut(self.ptr.add(i * self.stride), dv)
    }
}

/// One task: queries `i0 .. i0 + o.rows` of head `(b, h)` (at most `g` blocks of [`BQ`])
/// against the keys in `keys`, written into the rows of `o`.
///
/// With `stats: None` the rows are normalised (the attention output). With `Some(stats)`
/// (`2 * nq` floats) they are not: `o` gets `Σ_j 2^(s_ij - m_i) v_j`, `stats[i]` the row
/// maximum `m_i` (log2 domain, `-inf` if every key is masked) and `stats[nq + i]` the sum
/// `Σ_j 2^(s_ij - m_i)`, for merging partial results over key ranges.
///
/// # Safety
/// `o.rows <= g * BQ`, `o.stride >= Dv` (when `o.rows > 1`), every row of `o` is valid for
/// reads and writes of `Dv` floats, and nothing else accesses them while this runs. (The
/// rows of one head interleave with other heads' in the `(B, L, H, Dv)` output, so they
/// cannot be one `&mut` slice.)
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn query_group(
    isa: Isa,
    inp: &Inputs,
    b: usize,
    h: usize,
    i0: usize,
    o: OutBlock,
    bk: usize,
    g: usize,
    keys: std::ops::Range<usize>,
    copy: HeadCopy,
    stats: Option<&mut [f32]>,
    scratch: &mut [f32],
) {
    let Dims { d, dv, .. } = inp.dims;
    assert!(copy.values.is_none() || (keys.start.is_multiple_of(2) && bk.is_multiple_of(2)));
    let nq_total = o.rows;
    assert!(nq_total <= g * BQ && (nq_total <= 1 || o.stride >= dv));
    let kind = inp.kind;
    let (st, rest) = scratch.split_at_mut(bk * BQ);
    let (tile, mut rest) = rest.split_at_mut(kind.tile_len(d, dv, bk));
    let q = inp.q.head(b, h);
    let qsr = inp.q.sr();
    // Up to 4 sub-blocks, carved out of the scratch without allocating.
    let mut subs: [Option<SubBlock>; 4] = [None, None, None, None];
    for (s, slot) in subs.iter_mut().enumerate().take(g) {
        let si0 = i0 + s * BQ;
        if s * BQ >= nq_total {
            break;
        }
        let nq = BQ.min(nq_total - s * BQ);
        let nv = nq.div_ceil(16);
        let (qt, r) = std::mem::take(&mut rest).split_at_mut(d * BQ);
        let (m, r) = r.split_at_mut(BQ);
        let (l, r) = r.split_at_mut(BQ);
        let (alpha, r) = r.split_at_mut(BQ);
        rest = r;
        load_queries(isa, kind, q.from(si0 * qsr), qsr, nq, d, qt, tile);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        let kend = inp.key_limit(b, si0, nq).min(keys.end);
        *slot = Some(SubBlock {
            i0: si0,
            nq,
            nv,
            kend,
            started: false,
            qt,
            m,
            l,
            alpha,
        });
    }
    // Grouped-query attention: the H / Hkv consecutive query heads of a group share one
    // key/value head, read in place (never repeated per query head).
    let kv_head = h / (inp.dims.h / inp.dims.hkv);
    let (k, ksr) = match copy.keys {
        Some(k) => (k, d),
        None => (inp.k.head(b, kv_head), inp.k.sr()),
    };
    let v = inp.v.head(b, kv_head);
    let vsr = inp.v.sr();
    let kb_row = inp
        .key_bias
        .map(|kb| &kb[b * inp.dims.s..(b + 1) * inp.dims.s]);
    let bias = inp.bias.map(|bs| (bs.head(b, h), bs.sr));
    let kend = subs.iter().flatten().map(|s| s.kend).max().unwrap_or(0);
    let mut j0 = keys.start;
    while j0 < kend {
        let nk_block = bk.min(kend - j0);
        if let Some(kb) = kb_row {
            if kb[j0..j0 + nk_block]
                .iter()
                .all(|&x| x == f32::NEG_INFINITY)
            {
                j0 += nk_block;
                continue;
            }
        }
        let kv = match copy.values {
            // Key pairs from key 0 and an even `j0`: pair `j0 / 2` starts this block.
            #[cfg(target_arch = "x86_64")]
            Some(vp) => match k {
                Data::Half(k) => BlockKv::Dot {
                    k: &k[j0 * ksr..],
                    ks: ksr,
                    vp: &vp[j0 / 2 * dv.div_ceil(16) * 16..],
                },
                Data::F32(_) => unreachable!("packed values come with bf16 keys"),
            },
            _ => block_kv(isa, kind, k, ksr, v, vsr, j0, nk_block, (d, dv), tile),
        };
        for (si, sub) in subs.iter_mut().enumerate() {
            let Some(sub) = sub else { break };
            if j0 >= sub.kend {
                continue;
            }
            let nk = nk_block.min(sub.kend - j0);
            let (i0, nq, nv) = (sub.i0, sub.nq, sub.nv);
            let st = &mut st[..nk * BQ];
            match kv {
                BlockKv::F32 { k, ks, .. } => scores(isa, sub.qt, d, k, ks, nk, st, nv, inp.qscale),
                #[cfg(target_arch = "x86_64")]
                BlockKv::Dot { k, ks, .. } => {
                    half::dot::scores(kind, sub.qt, d, k, ks, nk, st, nv, inp.qscale)
                }
            }
            if let Some(kb) = kb_row {
                add_key_bias(isa, st, nk, &kb[j0..j0 + nk], nv);
            }
            if let Some((bias, bsr)) = bias {
                for i in 0..nq {
                    let brow = &bias[(i0 + i) * bsr + j0..(i0 + i) * bsr + j0 + nk];
                    for (j, &x) in brow.iter().enumerate() {
                        let s = &mut st[j * BQ + i];
                        // -inf (blocked) wins over a +inf / NaN key bias, as in
                        // `Mask::to_bias`, instead of making NaN.
                        *s = if x == f32::NEG_INFINITY || *s == f32::NEG_INFINITY {
                            f32::NEG_INFINITY
                        } else {
                            *s + x * LOG2_E
                        };
                    }
                }
            }
            if let Some(off) = inp.causal {
                // Key j is visible to query i iff j <= i + off; only diagonal blocks need a mask.
                if j0 + nk > i0 + off + 1 {
                    for j in 0..nk {
                        let blocked_queries =
                            (j0 + j).saturating_sub(off).saturating_sub(i0).min(nq);
                        st[j * BQ..j * BQ + blocked_queries].fill(f32::NEG_INFINITY);
                    }
                }
            }
            // SAFETY: rows si * BQ .. si * BQ + nq < o.rows of `o`, ours (the contract).
            let o_sub = o.ptr.add(si * BQ * o.stride);
            let first = !sub.started;
            match kv {
                BlockKv::F32 { v, vs, .. } => {
                    softmax_update(isa, st, nk, sub.m, sub.l, sub.alpha, nv);
                    pv(
                        isa, st, nk, v, vs, dv, o_sub, o.stride, nq, sub.alpha, first,
                    )
                }
                // SAFETY: as above (the rows of `o_sub`).
                #[cfg(target_arch = "x86_64")]
                BlockKv::Dot { vp, .. } => {
                    half::dot::softmax_update(kind, st, nk, sub.m, sub.l, sub.alpha, nv);
                    half::dot::pv(kind, st, nk, vp, dv, o_sub, o.stride, nq, sub.alpha, first)
                }
            }
            sub.started = true;
        }
        j0 += nk_block;
    }
    // Rows that saw no key at all (every key block skipped or past `kend`): zero attention.
    for (si, sub) in subs.iter().enumerate() {
        let Some(sub) = sub else { break };
        if !sub.started {
            for i in 0..sub.nq {
                // SAFETY: row si * BQ + i < o.rows, ours (the contract).
                o.row(si * BQ + i, dv).fill(0.0);
            }
        }
    }
    if let Some(stats) = stats {
        for (si, sub) in subs.iter().enumerate() {
            let Some(sub) = sub else { break };
            stats[si * BQ..si * BQ + sub.nq].copy_from_slice(&sub.m[..sub.nq]);
            stats[nq_total + si * BQ..nq_total + si * BQ + sub.nq]
                .copy_from_slice(&sub.l[..sub.nq]);
        }
        return;
    }
    for (si, sub) in subs.iter().enumerate() {
        let Some(sub) = sub else { break };
        for (i, &ls) in sub.l[..sub.nq].iter().enumerate() {
            // SAFETY: row si * BQ + i < o.rows, ours (the contract).
            let row = o.row(si * BQ + i, dv);
            // 0: every key masked, zeros. NaN (a NaN or +inf score): NaN, as torch.
            let inv = if ls == 0.0 { 0.0 } else { 1.0 / ls };
            row.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel dispatch: safe wrappers that check the lengths each kernel relies on.

/// One key block (`nk` keys from `j0`) as the micro-kernels read it.
#[derive(Clone, Copy)]
enum BlockKv<'t> {
    /// `f32` key and value rows (in place, or converted into the task's tile), at strides
    /// `ks`, `vs`, starting at key `j0`.
    F32 {
        k: &'t [f32],
        ks: usize,
        v: &'t [f32],
        vs: usize,
    },
    /// bf16 key rows in place (stride `ks`, from key `j0`) and the values packed in key pairs
    /// ([`half::dot::pack_values`]).
    #[cfg(target_arch = "x86_64")]
    Dot {
        k: &'t [u16],
        ks: usize,
        vp: &'t [f32],
    },
}

/// The block of keys `j0 .. j0 + nk` of one key/value head (`k`, `v`: the head's rows at
/// strides `ksr`, `vsr`) for the micro-kernels: `f32` rows are used in place, half rows are
/// converted (or, for [`Kind::Bf16Dot`], the values packed) into `tile`.
#[allow(clippy::too_many_arguments)]
fn block_kv<'t>(
    isa: Isa,
    kind: Kind,
    k: Data<'t>,
    ksr: usize,
    v: Data<'t>,
    vsr: usize,
    j0: usize,
    nk: usize,
    (d, dv): (usize, usize),
    tile: &'t mut [f32],
) -> BlockKv<'t> {
    match (k, v) {
        (Data::F32(k), Data::F32(v)) => BlockKv::F32 {
            k: &k[j0 * ksr..],
            ks: ksr,
            v: &v[j0 * vsr..],
            vs: vsr,
        },
        (Data::Half(k), Data::Half(v)) => {
            #[cfg(target_arch = "x86_64")]
            if kind == Kind::Bf16Dot {
                half::dot::pack_values(kind, &v[j0 * vsr..], vsr, nk, dv, tile);
                return BlockKv::Dot {
                    k: &k[j0 * ksr..],
                    ks: ksr,
                    vp: tile,
                };
            }
            let f16 = kind == Kind::F16;
            let (kt, vt) = tile.split_at_mut(nk * d);
            half::convert_rows(isa, &k[j0 * ksr..], ksr, nk, d, f16, kt);
            half::convert_rows(isa, &v[j0 * vsr..], vsr, nk, dv, f16, vt);
            BlockKv::F32 {
                k: kt,
                ks: d,
                v: vt,
                vs: dv,
            }
        }
        // `Prepared::new` gives q, k and v one dtype, and `Rows::new` maps it to one variant.
        _ => unreachable!("keys and values of one call share their dtype"),
    }
}

/// The query block `q[i * qs ..][..d]`, `i < nq`, as the score kernel of `kind` reads it:
/// transposed to `f32` `qt[dd * BQ + i]` (see [`transpose_queries`]; half rows are first
/// converted into `tile`, at least `nq * d` floats), or packed in bf16 pairs for
/// [`Kind::Bf16Dot`].
#[allow(clippy::too_many_arguments)]
fn load_queries(
    isa: Isa,
    kind: Kind,
    q: Data,
    qs: usize,
    nq: usize,
    d: usize,
    qt: &mut [f32],
    tile: &mut [f32],
) {
    match q {
        Data::F32(q) => transpose_queries(isa, q, qs, nq, d, qt),
        #[cfg(target_arch = "x86_64")]
        Data::Half(q) if kind == Kind::Bf16Dot => half::dot::pack_queries(kind, q, qs, nq, d, qt),
        Data::Half(q) => {
            let rows = &mut tile[..nq * d];
            half::convert_rows(isa, q, qs, nq, d, kind == Kind::F16, rows);
            transpose_queries(isa, rows, d, nq, d, qt);
        }
    }
}

/// `qt[dd * BQ + i] = q[i * qs + dd]` for `i < nq`, `dd < d`, zero for
/// `nq <= i < 16 * ceil(nq / 16)`: the query block as the score kernel reads it.
fn transpose_queries(isa: Isa, q: &[f32], qs: usize, nq: usize, d: usize, qt: &mut [f32]) {
    assert!(nq <= BQ && qt.len() >= d * BQ);
    assert!(nq == 0 || q.len() >= (nq - 1) * qs + d);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); the lengths asserted above are the
        // preconditions of `avx512::transpose_queries`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            super::avx512::transpose_queries(q.as_ptr(), qs, nq, d, qt.as_mut_ptr())
        },
        _ => {
            for i in 0..nq {
                let qrow = &q[i * qs..i * qs + d];
                for (col, &x) in qt.chunks_exact_mut(BQ).zip(qrow) {
                    col[i] = x;
                }
            }
            let padded = nq.div_ceil(16) * 16;
            if nq < padded {
                for col in qt.chunks_exact_mut(BQ).take(d) {
                    col[nq..padded].fill(0.0);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn scores(
    isa: Isa,
    qt: &[f32],
    d: usize,
    k: &[f32],
    ks: usize,
    nk: usize,
    st: &mut [f32],
    nv: usize,
    c: f32,
) {
    assert!((1..=4).contains(&nv) && qt.len() >= d * BQ && st.len() >= nk * BQ);
    assert!(nk == 0 || k.len() >= (nk - 1) * ks + d);
    match isa {
        // SAFETY: `Isa::Avx512` exists only after `is_x86_feature_detected!("avx512f")`; the
        // asserts above are exactly the length preconditions of `avx512::scores`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            super::avx512::scores(qt.as_ptr(), d, k.as_ptr(), ks, nk, st.as_mut_ptr(), nv, c)
        },
        // SAFETY: `Isa::Avx2` exists only after detecting avx2 and fma.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::scores(qt, d, k, ks, nk, st, nv, c) },
        Isa::Portable => portable::scores::<false>(qt, d, k, ks, nk, st, nv, c),
    }
}

fn add_key_bias(isa: Isa, st: &mut [f32], nk: usize, kb: &[f32], nv: usize) {
    assert!(nv <= 4 && kb.len() >= nk && st.len() >= nk * BQ);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { super::avx512::add_key_bias(st.as_mut_ptr(), nk, kb.as_ptr(), nv) },
        _ => {
            for (j, &b) in kb[..nk].iter().enumerate() {
                st[j * BQ..j * BQ + 16 * nv]
                    .iter_mut()
                    .for_each(|x| *x += b);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn softmax_update(
    isa: Isa,
    st: &mut [f32],
    nk: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
    nv: usize,
) {
    assert!(
        nv <= 4
            && st.len() >= nk * BQ
            && m.len() >= 16 * nv
            && l.len() >= 16 * nv
            && alpha.len() >= 16 * nv
    );
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            super::avx512::softmax_update(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
                nv,
            )
        },
        // SAFETY: avx2 and fma detected (see `Isa`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::softmax_update(st, nk, m, l, alpha, nv) },
        Isa::Portable => portable::softmax_update::<false>(st, nk, m, l, alpha, nv),
    }
}

/// `o[i * os ..][:dv] = alpha[i] · o[i * os ..][:dv] + Σ_j st[j * BQ + i] · v[j * vs ..][:dv]`
/// for rows `i < nq`, keys `j < nk`: the `P · V` step, into output rows `os` floats apart.
///
/// With `first` the old rows are not read (they may be uninitialised): `o = Σ_j ...`.
///
/// # Safety
/// Rows `i < nq` of `o` (`dv` floats at `o + i * os`, `dv <= os` when `nq > 1`) are valid for
/// reads and writes, and nothing else accesses them meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn pv(
    isa: Isa,
    st: &[f32],
    nk: usize,
    v: &[f32],
    vs: usize,
    dv: usize,
    o: *mut f32,
    os: usize,
    nq: usize,
    alpha: &[f32],
    first: bool,
) {
    assert!(nq <= BQ && st.len() >= nk * BQ && alpha.len() >= nq && (nq <= 1 || dv <= os));
    assert!(nk == 0 || v.len() >= (nk - 1) * vs + dv);
    match isa {
        // SAFETY: avx512f detected (see `Isa`); lengths asserted above and the rows of `o`
        // (the caller's contract) are the preconditions of `avx512::pv`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => super::avx512::pv(
            st.as_ptr(),
            nk,
            v.as_ptr(),
            vs,
            dv,
            o,
            os,
            nq,
            alpha.as_ptr(),
            first,
        ),
        // SAFETY: avx2 and fma detected (see `Isa`); the rows are the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::pv(st, nk, v, vs, dv, o, os, nq, alpha, first),
        // SAFETY: the rows are the caller's contract.
        Isa::Portable => portable::pv::<false>(st, nk, v, vs, dv, o, os, nq, alpha, first),
    }
}

/// The portable kernels compiled with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #![allow(clippy::too_many_arguments)]
    use super::portable;

    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scores(
        qt: &[f32],
        d: usize,
        k: &[f32],
        ks: usize,
        nk: usize,
        st: &mut [f32],
        nv: usize,
        c: f32,
    ) {
        portable::scores::<true>(qt, d, k, ks, nk, st, nv, c)
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax_update(
        st: &mut [f32],
        nk: usize,
        m: &mut [f32],
        l: &mut [f32],
        alpha: &mut [f32],
        nv: usize,
    ) {
        portable::softmax_update::<true>(st, nk, m, l, alpha, nv)
    }

    /// # Safety
    /// The CPU supports AVX2 and FMA; the contract of [`portable::pv`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn pv(
        st: &[f32],
        nk: usize,
        v: &[f32],
        vs: usize,
        dv: usize,
        o: *mut f32,
        os: usize,
        nq: usize,
        alpha: &[f32],
        first: bool,
    ) {
        portable::pv::<true>(st, nk, v, vs, dv, o, os, nq, alpha, first)
    }
}

/// Plain-Rust kernels written to auto-vectorise; `FMA` selects fused multiply-adds (only
/// when compiled with the `fma` target feature, where they are single instructions).
pub(crate) mod portable {
    #![allow(clippy::too_many_arguments)]
    use super::BQ;
    use crate::simd::fma;

    /// `2^x`, branch-free (vectorisable); `0` for `x < -126.5` (including `-inf`).
    #[inline(always)]
    pub fn exp2<const FMA: bool>(x: f32) -> f32 {
        let x = x.clamp(-127.0, 127.0);
        let n = (x + 12_582_912.0) - 12_582_912.0; // round to nearest
        let f = x - n;
        let c = super::EXP2_POLY;
        let mut p = c[0];
        for &ci in &c[1..] {
            p = fma::<FMA>(p, f, ci);
        }
        // n = -127 gives the bit pattern of +0.0.
        p * f32::from_bits(((n as i32 + 127) as u32) << 23)
    }

    #[inline(always)]
    pub fn scores<const FMA: bool>(
        qt: &[f32],
        d: usize,
        k: &[f32],
        ks: usize,
        nk: usize,
        st: &mut [f32],
        nv: usize,
        c: f32,
    ) {
        let w = 16 * nv;
        for j in 0..nk {
            let row = &mut st[j * BQ..j * BQ + w];
            row.fill(0.0);
            for (dd, &kv) in k[j * ks..j * ks + d].iter().enumerate() {
                for (s, &q) in row.iter_mut().zip(&qt[dd * BQ..dd * BQ + w]) {
                    *s = fma::<FMA>(kv, q, *s);
                }
            }
            row.iter_mut().for_each(|s| *s *= c);
        }
    }

    #[inline(always)]
    pub fn softmax_update<const FMA: bool>(
        st: &mut [f32],
        nk: usize,
        m: &mut [f32],
        l: &mut [f32],
        alpha: &mut [f32],
        nv: usize,
    ) {
        let w = 16 * nv;
        let mut mx = [f32::NEG_INFINITY; BQ];
        for j in 0..nk {
            for (a, &s) in mx[..w].iter_mut().zip(&st[j * BQ..j * BQ + w]) {
                *a = a.max(s);
            }
        }
        let mut m_use = [0f32; BQ];
        for i in 0..w {
            let m_new = m[i].max(mx[i]);
            m_use[i] = if m_new == f32::NEG_INFINITY {
                0.0
            } else {
                m_new
            };
            alpha[i] = exp2::<FMA>(m[i] - m_use[i]);
            m[i] = m_new;
        }
        let mut sum = [0f32; BQ];
        for j in 0..nk {
            let row = &mut st[j * BQ..j * BQ + w];
            for ((s, &mu), acc) in row.iter_mut().zip(&m_use[..w]).zip(&mut sum[..w]) {
                *s = exp2::<FMA>(*s - mu);
                *acc += *s;
            }
        }
        for i in 0..w {
            l[i] = fma::<FMA>(l[i], alpha[i], sum[i]);
        }
    }

    /// # Safety
    /// Rows `i < nq` of `o` (`dv` floats at `o + i * os`) are valid for reads and writes and
    /// accessed by nothing else meanwhile.
    #[inline(always)]
    pub unsafe fn pv<const FMA: bool>(
        st: &[f32],
        nk: usize,
        v: &[f32],
        vs: usize,
        dv: usize,
        o: *mut f32,
        os: usize,
        nq: usize,
        alpha: &[f32],
        first: bool,
    ) {
        for i in 0..nq {
            // SAFETY: row i < nq, the caller's contract.
            let orow = std::slice::from_raw_parts_mut(o.add(i * os), dv);
            if first {
                orow.fill(0.0);
            } else {
                let a = alpha[i];
                orow.iter_mut().for_each(|x| *x *= a);
            }
            for j in 0..nk {
                let p = st[j * BQ + i];
                for (x, &vv) in orow.iter_mut().zip(&v[j * vs..j * vs + dv]) {
                    *x = fma::<FMA>(p, vv, *x);
                }
            }
        }
    }
}

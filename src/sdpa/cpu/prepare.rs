//! The inputs of one CPU attention call: validated ([`Prepared::new`]), in their own dtype with
//! a unit-stride last dimension, and borrowed in place for the tasks ([`Inputs`]); the shared
//! output buffer the tasks write their rows into ([`OutRows`], [`OutBlock`]).

use super::half::{self, Kind};
use crate::mask::MaskParts;
use crate::simd::{cpu_f32, Isa};
use candle::{DType, Device, Tensor};
use std::f32::consts::LOG2_E;
use std::sync::Arc;

/// Keys and values `(B, Hkv, S, D)` and `(B, Hkv, S, Dv)` (`f32`) held somewhere other than
/// in two tensors, handed to the kernel one head at a time.
pub(crate) trait GatherHeads: Send + Sync {
    /// Copies the keys `(S, D)` and values `(S, Dv)` of key/value head `head` of batch row
    /// `row` into `keys` (`S · D` floats) and `values` (`S · Dv`), position after position.
    fn gather_head(&self, row: usize, head: usize, keys: &mut [f32], values: &mut [f32]);

    /// Where the keys (`D` floats each) and values (`Dv`) of key/value head `head` of batch
    /// row `row` lie, position after position: `keys[p]` and `values[p]` for the `S`
    /// positions, valid as long as `self` is borrowed (the rows [`GatherHeads::gather_head`]
    /// copies). May ask the CPU to bring them nearer (a hint).
    fn head_rows(
        &self,
        row: usize,
        head: usize,
        keys: &mut [*const f32],
        values: &mut [*const f32],
    );
}

/// Inputs validated, in their own dtype with a unit-stride last dimension (masks as `f32`).
pub(crate) struct Prepared {
    q: Tensor,
    /// Empty `(B, Hkv, 0, D)` tensors when the keys and values come from `paged`.
    k: Tensor,
    v: Tensor,
    /// Keys and values held in a paged cache (`f32`), read head by head by each task.
    paged: Option<Arc<dyn GatherHeads>>,
    key_bias: Option<Vec<f32>>,
    bias: Option<Tensor>,
    causal: Option<usize>,
    qscale: f32,
    pub(crate) in_dtype: DType,
    pub(super) dims: Dims,
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
    pub(super) fn from(self, start: usize) -> Data<'a> {
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
    /// Keys and values held in a paged cache (`k`, `v` are empty): each task reads its head's
    /// `S` positions in their slots through a table of addresses, or gathers them into its
    /// scratch and reads them there ([`Inputs::paged_scratch_len`], which holds either).
    pub paged: Option<&'a dyn GatherHeads>,
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

    /// The scratch floats a task needs for gathering its head's keys and values from a paged
    /// cache: `S · (D + Dv)` (room for the `2 · S` addresses of reading them in place too,
    /// whenever `D + Dv >= 6`), or none when the keys and values are tensors.
    pub fn paged_scratch_len(&self) -> usize {
        if self.paged.is_some() {
            self.dims.s * (self.dims.d + self.dims.dv)
        } else {
            0
        }
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
        crate::sdpa::shapes::check_qkv(q, k, v)?;
        for t in [q, k, v] {
            if !matches!(t.device(), Device::Cpu) {
                candle::bail!(
                    "tiled attention runs on CPU tensors only, got {:?}",
                    t.device().location()
                )
            }
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
        Self::with_dims(q, k.clone(), v.clone(), None, dims, mask, scale)
    }

    /// The inputs of a call whose keys and values `(B, Hkv, S, D)`, `(B, Hkv, S, Dv)` (the
    /// shapes in `kv_dims`: `(Hkv, S, Dv)`) sit in a paged cache, `kv`: `q` must be an `f32`
    /// CPU tensor `(B, H, L, D)` with `Hkv` dividing `H`.
    pub(crate) fn paged(
        q: &Tensor,
        kv: Arc<dyn GatherHeads>,
        (hkv, s, dv): (usize, usize, usize),
        mask: &MaskParts,
        scale: f64,
    ) -> candle::Result<Self> {
        let (b, h, l, d) = q.dims4()?;
        if !matches!(q.device(), Device::Cpu) || q.dtype() != DType::F32 {
            candle::bail!(
                "paged attention takes f32 CPU queries, got {:?} on {:?}",
                q.dtype(),
                q.device()
            )
        }
        if hkv == 0 || !h.is_multiple_of(hkv) {
            candle::bail!("paged attention: {hkv} key/value heads cannot serve {h} query heads")
        }
        let dims = Dims {
            b,
            h,
            hkv,
            l,
            s,
            d,
            dv,
        };
        let empty = |width| Tensor::zeros((b, hkv, 0, width), DType::F32, &Device::Cpu);
        Self::with_dims(q, empty(d)?, empty(dv)?, Some(kv), dims, mask, scale)
    }

    fn with_dims(
        q: &Tensor,
        k: Tensor,
        v: Tensor,
        paged: Option<Arc<dyn GatherHeads>>,
        dims: Dims,
        mask: &MaskParts,
        scale: f64,
    ) -> candle::Result<Self> {
        let in_dtype = q.dtype();
        if !matches!(in_dtype, DType::F32 | DType::F16 | DType::BF16) {
            candle::bail!("tiled attention supports f32, f16 and bf16, got {in_dtype:?}")
        }
        if !scale.is_finite() {
            candle::bail!("attention scale must be finite, got {scale}")
        }
        let Dims { b, h, l, s, .. } = dims;
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
            k: unit_rows(k)?,
            v: unit_rows(v)?,
            paged,
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
            paged: self.paged.as_deref(),
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

/// The `(B, L, H, Dv)` output of a kernel, shared by its tasks, each of which writes its own
/// rows. The memory starts uninitialised: a kernel must write every row.
#[derive(Clone, Copy)]
pub(crate) struct OutRows {
    ptr: *mut f32,
    pub(super) dims: Dims,
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
    pub(super) unsafe fn row<'o>(self, i: usize, dv: usize) -> &'o mut [f32] {
        debug_assert!(i < self.rows);
        // SAFETY: the caller's contract.
        std::slice::from_raw_parts_mut(self.ptr.add(i * self.stride), dv)
    }
}

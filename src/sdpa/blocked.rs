//! Memory-efficient attention for any candle device, built only from candle tensor ops:
//! query blocks × key blocks with a running max and sum (the online softmax of
//! FlashAttention-2), so that no `(L, S)` matrix ever exists.
//!
//! This is the path [`super::scaled_dot_product_attention`] takes off the CPU (CUDA, Metal) and
//! for CPU dtypes the tiled kernels do not handle (`f64`), whenever neither the weights nor
//! gradients are requested. It is not fused: every step below is one candle op (a kernel
//! launch on a GPU), so it trades launches for memory. Its memory does not depend on the
//! product `L · S`.
//!
//! For each block of `bq` queries (`q_blk` `(B, H, bq, D)`), the key blocks `[k0, k0 + bk)` it
//! can see are visited in order (blocks wholly above a causal diagonal are skipped, and only
//! the blocks that cross it build a mask), keeping per query row a running max `m`, a running
//! sum `l` and an unnormalised output `acc`:
//!
//! 1. `s = q_blk · K_blkᵀ · scale` `(B, H, bq, bk)`, the matmul in the input dtype, `s` in the
//!    statistics dtype (`f32`, or `f64` for `f64` inputs); grouped query heads
//!    (`H = G · Hkv`) are one `(G · bq, D)` matrix per key/value head, so K and V are never
//!    repeated;
//! 2. `s += bias` (the parts of [`MaskParts`]: key padding `(B, 1, 1, bk)`, the general bias
//!    `(B|1, H|1, bq|1, bk)`, `-inf` above the causal diagonal);
//! 3. `m' = max(m, rowmax(s))`, `p = exp(s - m')`, `α = exp(m - m')`,
//!    `l = α · l + rowsum(p)`, `acc = α · acc + p · V_blk` (`p` cast to the input dtype for the
//!    matmul, `acc` kept in the statistics dtype);
//! 4. after the last key block, `out_blk = acc / l`, cast to the input dtype.
//!
//! **Memory.** Inputs are read in place (K and V as strided views: a KV cache's buffer view
//! `(B, H, len, D)` of a `(B, H, capacity, D)` buffer is never copied); `q` is copied one block
//! at a time. Besides the output `(B, H, L, Dv)` (built from its blocks, so twice that at the
//! end), one step holds a few `(B, H, bq, bk)` tiles (scores, probabilities, at most two
//! masks: about `5 · 4 · B·H·bq·bk` bytes) and `(B, H, bq, Dv)` accumulators. With the default
//! [`BlockedConfig`] the tile is at most [`TILE_ELEMENTS`] entries whatever `L` and `S`, so the
//! extra memory is `O(B·H·(L·Dv + bq·bk))`: linear in the sequence length.
//!
//! **Half precision.** `f16`/`bf16` inputs stay in their dtype (nothing is upcast whole): the
//! two matmuls run in it (tensor cores on a GPU), the scores of one tile are converted to
//! `f32`, and the max, sum and output accumulator are `f32`. The error is that of rounding the
//! scores and probabilities to the input dtype (see the README's tolerances).
//!
//! **Fully masked rows** (every key blocked) give zeros, as in [`super::naive`]: `m` is clamped
//! to the lowest finite value so that `exp(-inf - m) = 0` instead of NaN, and `acc / l` divides
//! by `max(l, tiny)`.
//!
//! **No host synchronisation.** Every decision (which blocks to visit, which need a causal
//! mask) is taken from shapes and the causal offset on the host; constants are filled on the
//! device. Nothing is read back, so on a GPU the whole call is queued without a round trip.

use crate::mask::MaskParts;
use candle::{DType, Device, Tensor, D};

/// Upper bound of the default tile `B · H · bq · bk` (entries): 4 Mi entries, 16 MiB in `f32`.
pub const TILE_ELEMENTS: usize = 1 << 22;
/// Default (and largest default) number of keys per block.
pub const DEFAULT_BLOCK_K: usize = 512;
/// Default largest number of queries per block.
pub const DEFAULT_BLOCK_Q: usize = 512;
/// Smallest number of queries per block the default choice goes down to (when `B · H` is
/// large the tile budget would otherwise give tiny blocks and many launches).
const MIN_BLOCK_Q: usize = 16;

/// Block sizes of the blocked kernel. `None` picks them from the shape (see
/// [`BlockedConfig::resolve`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockedConfig {
    /// Queries per block (`>= 1`).
    pub block_q: Option<usize>,
    /// Keys per block (`>= 1`).
    pub block_k: Option<usize>,
}

impl BlockedConfig {
    /// Fixed block sizes.
    pub fn new(block_q: usize, block_k: usize) -> Self {
        Self {
            block_q: Some(block_q),
            block_k: Some(block_k),
        }
    }

    /// The `(bq, bk)` used for `B · H = bh` heads, `L` queries and `S` keys: given sizes as
    /// they are (capped by `L` and `S`), otherwise `bk = min(S, 512)` and the largest
    /// `bq <= 512` (a power of two, at least 16) with `bh · bq · bk <= TILE_ELEMENTS`.
    pub fn resolve(&self, bh: usize, l: usize, s: usize) -> candle::Result<(usize, usize)> {
        if self.block_q == Some(0) || self.block_k == Some(0) {
            candle::bail!(
                "blocked attention: block sizes must be at least 1, got block_q {:?}, block_k {:?}",
                self.block_q,
                self.block_k
            )
        }
        let bk = self.block_k.unwrap_or(DEFAULT_BLOCK_K).min(s.max(1));
        let bq = match self.block_q {
            Some(bq) => bq,
            None => {
                let fit = TILE_ELEMENTS / (bh.max(1) * bk);
                let mut bq = DEFAULT_BLOCK_Q;
                while bq > MIN_BLOCK_Q && bq > fit {
                    bq /= 2;
                }
                bq
            }
        };
        Ok((bq.min(l.max(1)), bk))
    }
}

/// Blocked attention of `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` (one
/// float dtype on one device, any device; `Hkv` divides `H`: query head `h` uses key/value
/// head `h / (H / Hkv)`) under `mask` (from `Mask::decompose` for `(B, H, L, S)`),
/// scores scaled by `scale`. Returns the output `(B, H, L, Dv)` in the input dtype; fully
/// masked rows are zeros. No weights; gradients flow through the ops but this path is meant
/// for inference (the naive one is cheaper to differentiate).
///
/// Extra memory is linear in `L` and `S` (module docs); nothing is copied to the host.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
) -> candle::Result<Tensor> {
    attention_with(q, k, v, mask, scale, &BlockedConfig::default())
}

/// [`attention`] with explicit block sizes: `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`,
/// `v` `(B, Hkv, S, Dv)` → `(B, H, L, Dv)`.
pub fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
    cfg: &BlockedConfig,
) -> candle::Result<Tensor> {
    let shape = super::shapes::check_qkv(q, k, v)?;
    let (b, h, l, s) = (shape.batch, shape.heads, shape.q_len, shape.k_len);
    let (hkv, d, dv) = (k.dim(1)?, q.dim(3)?, v.dim(3)?);
    let group = h / hkv;
    let in_dtype = q.dtype();
    let dev = q.device().clone();
    let (bq, bk) = cfg.resolve(b * h, l, s)?;
    if l == 0 || s == 0 {
        // No query, or nothing to attend to: every row is fully masked, hence zeros.
        return Tensor::zeros((b, h, l, dv), in_dtype, &dev);
    }
    let stats = if in_dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let consts = Consts::new(stats, &dev)?;
    let k = matmul_operand(k)?;
    let v = matmul_operand(v)?;
    // `(B, Hkv, G, L, D)`: the query heads of one key/value head, adjacent (a view without
    // grouping; with it, a strided `q` is copied once by the reshape).
    let q = if group == 1 {
        q.unsqueeze(2)?
    } else {
        q.reshape((b, hkv, group, l, d))?
    };
    // Key padding `(B, S)` → `(B, 1, 1, S)`; the general bias as `(B|1, H|1, L|1, S)`.
    let key_bias = mask
        .key_bias
        .as_ref()
        .map(|t| t.to_dtype(stats)?.reshape((b, 1, 1, s)))
        .transpose()?;
    let bias = mask.bias.as_ref().map(|t| t.to_dtype(stats)).transpose()?;
    let mut causal = mask.causal_offset.map(|offset| Causal {
        offset,
        positions: None,
    });

    let mut blocks = Vec::with_capacity(l.div_ceil(bq));
    for q0 in (0..l).step_by(bq) {
        let nq = bq.min(l - q0);
        let q_blk = q
            .narrow(3, q0, nq)?
            .contiguous()?
            .reshape((b, hkv, group * nq, d))?;
        let bias_q = bias
            .as_ref()
            .map(|t| {
                if t.dim(2)? == 1 {
                    Ok(t.clone())
                } else {
                    t.narrow(2, q0, nq)
                }
            })
            .transpose()?;
        // Keys this block may see at all: up to the causal limit of its last query.
        let k_end = match &causal {
            Some(c) => s.min(q0 + nq + c.offset),
            None => s,
        };
        let mut state: Option<RowState> = None;
        for k0 in (0..k_end).step_by(bk) {
            // Keys past `k_end` are hidden from every query of the block: never read them.
            let nk = bk.min(k_end - k0);
            let k_blk = k.narrow(2, k0, nk)?;
            let v_blk = v.narrow(2, k0, nk)?;
            let mut scores =
                (q_blk.matmul(&k_blk.t()?)?.to_dtype(stats)? * scale)?.reshape((b, h, nq, nk))?;
            let tile_bias = match (&key_bias, &bias_q) {
                (Some(kb), Some(bb)) => Some(crate::mask::add_blocking_wins(
                    &kb.narrow(3, k0, nk)?,
                    &bb.narrow(3, k0, nk)?,
                )?),
                (Some(kb), None) => Some(kb.narrow(3, k0, nk)?),
                (None, Some(bb)) => Some(bb.narrow(3, k0, nk)?),
                (None, None) => None,
            };
            if let Some(tb) = tile_bias {
                scores = scores.broadcast_add(&tb)?;
            }
            if let Some(c) = causal.as_mut() {
                // The last key of the tile lies beyond what the first query may see.
                if k0 + nk > q0 + c.offset + 1 {
                    let blocked = c.blocked(q0, nq, k0, nk, l, s, &dev)?;
                    let neg_inf = consts.neg_inf.broadcast_as(scores.shape())?;
                    scores = blocked
                        .broadcast_as(scores.shape())?
                        .where_cond(&neg_inf, &scores)?;
                }
            }
            state = Some(update(
                state,
                &scores,
                &v_blk,
                &consts,
                in_dtype,
                stats,
                (b, h, hkv, group, nq, dv),
            )?);
        }
        let out = match state {
            Some(st) => st
                .acc
                .broadcast_div(&st.sum.broadcast_maximum(&consts.tiny)?)?,
            // Unreachable with S > 0 (key 0 is always visible), kept total for safety.
            None => Tensor::zeros((b, h, nq, dv), stats, &dev)?,
        };
        blocks.push(out.to_dtype(in_dtype)?);
    }
    if blocks.len() == 1 {
        return Ok(blocks.pop().expect("one block"));
    }
    Tensor::cat(&blocks, 2)
}

/// Running statistics of one query block: max `m` and sum `l` `(B, H, bq, 1)`, unnormalised
/// output `acc` `(B, H, bq, Dv)`, all in the statistics dtype.
struct RowState {
    max: Tensor,
    sum: Tensor,
    acc: Tensor,
}

/// Device-resident scalars (filled on the device: creating them copies nothing from the host).
struct Consts {
    neg_inf: Tensor,
    /// The lowest finite value: the clamp that keeps `exp(-inf - m)` at 0 for dead rows.
    lowest: Tensor,
    /// Smallest positive normal: `acc / max(l, tiny)` is 0 for a dead row (`acc = l = 0`).
    tiny: Tensor,
}

impl Consts {
    fn new(dtype: DType, dev: &Device) -> candle::Result<Self> {
        let full = |x: f64| -> candle::Result<Tensor> {
            match dtype {
                DType::F64 => Tensor::full(x, (), dev),
                _ => Tensor::full(x as f32, (), dev),
            }
        };
        let (lowest, tiny) = match dtype {
            DType::F64 => (f64::MIN, f64::MIN_POSITIVE),
            _ => (f32::MIN as f64, f32::MIN_POSITIVE as f64),
        };
        Ok(Self {
            neg_inf: full(f64::NEG_INFINITY)?,
            lowest: full(lowest)?,
            tiny: full(tiny)?,
        })
    }
}

/// The causal constraint (query `i` sees keys `0..=i + offset`) and, built on first use, the
/// query and key positions it compares (`(L, 1)` and `(1, S)` `U32`, linear in the lengths).
struct Causal {
    offset: usize,
    positions: Option<(Tensor, Tensor)>,
}

impl Causal {
    /// `(nq, nk)` `U8`: 1 where key `k0 + j` lies after query `q0 + i`'s limit.
    #[allow(clippy::too_many_arguments)]
    fn blocked(
        &mut self,
        q0: usize,
        nq: usize,
        k0: usize,
        nk: usize,
        l: usize,
        s: usize,
        dev: &Device,
    ) -> candle::Result<Tensor> {
        if self.positions.is_none() {
            let last = self.offset.saturating_add(l).max(s);
            if last > u32::MAX as usize {
                candle::bail!(
                    "causal mask too large: offset {} + {l} queries, {s} keys",
                    self.offset
                )
            }
            let rows = Tensor::arange(self.offset as u32, (self.offset + l) as u32, dev)?
                .reshape((l, 1))?;
            let cols = Tensor::arange(0u32, s as u32, dev)?.reshape((1, s))?;
            self.positions = Some((rows, cols));
        }
        let (rows, cols) = self.positions.as_ref().expect("just built");
        cols.narrow(1, k0, nk)?
            .broadcast_gt(&rows.narrow(0, q0, nq)?)
    }
}

/// One online-softmax step for a tile of `scores` `(B, H, bq, bk)` (statistics dtype, masked)
/// against `v_blk` `(B, Hkv, bk, Dv)` (input dtype).
fn update(
    state: Option<RowState>,
    scores: &Tensor,
    v_blk: &Tensor,
    consts: &Consts,
    in_dtype: DType,
    stats: DType,
    (b, h, hkv, group, nq, dv): (usize, usize, usize, usize, usize, usize),
) -> candle::Result<RowState> {
    let tile_max = scores.max_keepdim(D::Minus1)?;
    let new_max = match &state {
        Some(st) => st.max.maximum(&tile_max)?,
        None => tile_max,
    }
    .broadcast_maximum(&consts.lowest)?;
    let p = scores.broadcast_sub(&new_max)?.exp()?;
    let p_sum = p.sum_keepdim(D::Minus1)?;
    let nk = p.dim(3)?;
    let pv = p
        .to_dtype(in_dtype)?
        .reshape((b, hkv, group * nq, nk))?
        .matmul(v_blk)?
        .to_dtype(stats)?
        .reshape((b, h, nq, dv))?;
    Ok(match state {
        None => RowState {
            max: new_max,
            sum: p_sum,
            acc: pv,
        },
        Some(st) => {
            let alpha = (st.max - &new_max)?.exp()?;
            RowState {
                sum: st.sum.mul(&alpha)?.add(&p_sum)?,
                acc: st.acc.broadcast_mul(&alpha)?.add(&pv)?,
                max: new_max,
            }
        }
    })
}

/// `t` `(B, Hkv, S, X)` in a layout candle's matmul takes for every `S`-block of it: each
/// `(S, X)` matrix with unit stride along `X` and its batch dimensions collapsible into one
/// stride. A KV cache's view into its larger buffer already is (and is not copied); other
/// views (e.g. heads split out of a projection `(B, S, H, D)`) are made contiguous once.
fn matmul_operand(t: &Tensor) -> candle::Result<Tensor> {
    let (dims, st) = (t.dims(), t.stride());
    let batch_ok = dims[0] == 1 || dims[1] == 1 || st[0] == st[1] * dims[1];
    let rows_ok = st[3] == 1 || dims[3] == 1;
    if batch_ok && rows_ok {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_blocks_fit_the_tile_budget() {
        let cfg = BlockedConfig::default();
        assert_eq!(cfg.resolve(8, 16384, 16384).unwrap(), (512, 512));
        let (bq, bk) = cfg.resolve(256, 4096, 4096).unwrap();
        assert_eq!(bk, 512);
        assert!(256 * bq * bk <= TILE_ELEMENTS, "{bq}");
        assert_eq!(cfg.resolve(4096, 64, 64).unwrap(), (16, 64));
        assert_eq!(cfg.resolve(8, 1, 37).unwrap(), (1, 37));
        assert!(BlockedConfig::new(0, 4).resolve(1, 4, 4).is_err());
    }

    #[test]
    fn a_cache_view_is_read_in_place() {
        let dev = Device::Cpu;
        let buf = Tensor::zeros((2, 3, 16, 4), DType::F32, &dev).unwrap();
        let view = buf.narrow(2, 0, 5).unwrap();
        assert!(!view.is_contiguous());
        let op = matmul_operand(&view).unwrap();
        assert_eq!(op.stride(), view.stride());
        // Heads split out of (B, S, H, D): not collapsible, copied once.
        let split = Tensor::zeros((2, 5, 3, 4), DType::F32, &dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        assert!(matmul_operand(&split).unwrap().is_contiguous());
    }
}

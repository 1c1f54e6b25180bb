//! Attention for a few queries against a long key sequence: the shape of incremental decoding
//! (one new token, or a handful, attending to a cached prefix).
//!
//! With `L <= 4` queries there is no matrix product to speak of: the work is bound by reading
//! `K` and `V` once from memory, and a per-`(batch, head)` split leaves threads idle when
//! `B · H` is small. This path splits the keys too ("split-K", FlashDecoding style):
//!
//! 1. tasks are `(batch, head, key chunk)`; each runs the tiled kernel's micro-kernels
//!    ([`super::tiled`]) over its chunk and keeps the unnormalised result with its row
//!    maximum and sum `(m, l, acc)`, streaming its `K` and `V` rows exactly once;
//! 2. the partial results are merged with the log-sum-exp rescaling
//!    `out = Σ_c 2^(m_c - M) acc_c / Σ_c 2^(m_c - M) l_c`, `M = max_c m_c`.
//!
//! With one chunk per `(batch, head)` (the keys are few, or `B · H` already gives every
//! thread its tasks) there is nothing to merge: each task normalises its rows into the output
//! itself, which gives the same floats as merging one chunk (`w = 2^0 = 1`).
//!
//! Extra memory: `O(B · H · chunks · L · Dv)` for the partials when there are several chunks,
//! none with one. Fully masked rows give zeros.

use super::half::Kind;
use super::prepare::{Inputs, OutBlock, OutRows, Prepared};
use super::tile::{TiledConfig, BQ};
use super::tiled::{group_scratch_len, query_group};
use crate::mask::MaskParts;
use crate::simd::{with_scratch, Isa};
use candle::Tensor;
use rayon::prelude::*;

/// Queries per head up to which the CPU dispatch (`sdpa::cpu::attention`) uses this path.
pub const MAX_QUERIES: usize = 4;

/// Keys per task at least (smaller chunks cost more in merging than they gain).
const MIN_CHUNK: usize = 512;

/// Attention of `q` `(B, H, L, D)` (meant for small `L`, any `L` works) over `k`
/// `(B, Hkv, S, D)` and `v` `(B, Hkv, S, Dv)` (`Hkv` dividing `H`: grouped-query attention,
/// K/V read in place), CPU tensors of one dtype (`f32`, `f16`, `bf16`); returns
/// `(B, H, L, Dv)` in the input dtype. `mask` comes from `Mask::decompose`.
/// With the knobs of `cfg` (`block_k`, `isa` and `half_dot` are honoured):
/// `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` → `(B, H, L, Dv)`.
/// More than 256 queries take the plain tiled kernel.
pub fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
    cfg: &TiledConfig,
) -> candle::Result<Tensor> {
    if q.rank() == 4 && q.dim(2)? > 4 * BQ {
        return super::tiled::attention_with(q, k, v, mask, scale, cfg);
    }
    if cfg.block_k == Some(0) {
        candle::bail!("few-queries attention: block_k must be at least 1")
    }
    let prep = Prepared::new(q, k, v, mask, scale)?;
    let isa = Isa::at_most(cfg.isa);
    let kind = Kind::choose(prep.in_dtype, isa, cfg.half_dot);
    let bk = cfg.block_k_at(isa);
    prep.run(isa, kind, |inp, out| run(isa, inp, out, bk))
}

/// The keys of each task and the number of chunks the `S` keys of each of `heads` (batch,
/// head) pairs are split into: enough chunks for 4 tasks per thread, none smaller than
/// `MIN_CHUNK` keys.
pub(crate) fn key_chunks(heads: usize, s: usize) -> (usize, usize) {
    let threads = rayon::current_num_threads().max(1);
    let want = (4 * threads).div_ceil(heads.max(1)).max(1);
    let chunk = s.div_ceil(want).max(MIN_CHUNK).min(s.max(1));
    (chunk, s.div_ceil(chunk))
}

fn run(isa: Isa, inp: &Inputs, out: OutRows, bk: usize) {
    let d = inp.dims;
    let (l, s, dv) = (d.l, d.s, d.dv);
    let g = l.div_ceil(BQ);
    let (chunk, nchunks) = key_chunks(d.b * d.h, s);
    if nchunks == 1 {
        // One chunk a (batch, head) (at most MIN_CHUNK keys, or B · H alone gives every
        // thread four tasks: any batch of beams decoding on two threads): each task writes
        // its normalised rows straight into the output, as the tiled kernel does, with no
        // partials to allocate and no merging pass (a second fork-join a call: 2.5% of a
        // MarianMT beam-search step at 32 clients, `continuous_load`, AMD EPYC Zen 4 at the
        // AVX-512 level).
        super::tiled::run_tiled(isa, inp, out, bk, g, false);
        return;
    }
    let scratch_len = group_scratch_len(d.d, dv, bk, g, inp.kind) + inp.paged_scratch_len();
    let part_len = l * (dv + 2);
    let mut parts = vec![0f32; d.b * d.h * nchunks * part_len];
    parts
        .par_chunks_mut(part_len)
        .enumerate()
        .for_each(|(t, part)| {
            let (bh, c) = (t / nchunks, t % nchunks);
            let (b, h) = (bh / d.h, bh % d.h);
            let keys = c * chunk..((c + 1) * chunk).min(s);
            let (stats, acc) = part.split_at_mut(2 * l);
            let acc = OutBlock {
                ptr: acc.as_mut_ptr(),
                stride: dv,
                rows: l,
            };
            with_scratch(scratch_len, |scratch| {
                // SAFETY: `acc` is the L·Dv floats of this task's `part`, borrowed mutably
                // for the call; l <= g·BQ by the choice of g.
                unsafe {
                    query_group(
                        isa,
                        inp,
                        b,
                        h,
                        0,
                        acc,
                        bk,
                        g,
                        keys,
                        Default::default(),
                        Some(stats),
                        scratch,
                    )
                }
            });
        });
    // `out` is (B, L, H, Dv): one task per (batch, head) writes its L rows.
    (0..d.b * d.h).into_par_iter().for_each(|bh| {
        let parts = &parts[bh * nchunks * part_len..(bh + 1) * nchunks * part_len];
        let mut orow = vec![0f32; dv];
        for i in 0..l {
            merge_row(parts, nchunks, l, dv, i, &mut orow);
            // SAFETY: row (b, i, h) of the output exists (b < B, h < H, i < L) and is
            // written by this (b, h) task only; it is Dv floats, and `orow` is not in `out`.
            unsafe {
                let row = out.block(bh / d.h, i, bh % d.h, 1);
                std::ptr::copy_nonoverlapping(orow.as_ptr(), row.ptr, dv);
            }
        }
    });
}

/// Output row `i` of one `(batch, head)` from its chunks' partial results `parts`
/// (`nchunks` of `L · (Dv + 2)` floats: row maxima, row sums, unnormalised rows).
fn merge_row(parts: &[f32], nchunks: usize, l: usize, dv: usize, i: usize, orow: &mut [f32]) {
    let part_len = l * (dv + 2);
    // (m, l, acc) of query i in chunk c.
    let part = |c: usize| {
        let p = &parts[c * part_len..(c + 1) * part_len];
        (p[i], p[l + i], &p[2 * l + i * dv..2 * l + (i + 1) * dv])
    };
    let m = (0..nchunks)
        .map(|c| part(c).0)
        .fold(f32::NEG_INFINITY, f32::max);
    // A NaN or +inf score leaves a NaN sum in its chunk (the maximum may have dropped the
    // NaN): the row is NaN, as in torch and the naive path.
    if (0..nchunks).any(|c| part(c).1.is_nan()) {
        orow.fill(f32::NAN);
        return;
    }
    orow.fill(0.0);
    if m == f32::NEG_INFINITY {
        return; // every key masked: zeros
    }
    let mut total = 0.0;
    for c in 0..nchunks {
        let (mc, lc, acc) = part(c);
        if mc == f32::NEG_INFINITY {
            continue;
        }
        let w = (mc - m).exp2();
        total += lc * w;
        orow.iter_mut().zip(acc).for_each(|(o, &a)| *o += w * a);
    }
    // NaN (from a NaN or +inf score) stays NaN, as in torch.
    let inv = if total == 0.0 { 0.0 } else { 1.0 / total };
    orow.iter_mut().for_each(|o| *o *= inv);
}

//! The tiled kernel's schedule: tasks of one `(batch, head)` and up to four query blocks,
//! each walking the key blocks once ([`query_group`], also the building block of the
//! few-queries kernel), with the per-head key/value copies that several tasks share.

use super::half::{self, Kind};
use super::kernels::{
    add_key_bias, pv, scores, scores_few, softmax_update, transpose_queries, InPlace,
};
use super::prepare::{Data, Dims, Inputs, OutBlock, OutRows, Prepared, Rows, Strided};
use super::tile::{ByTable, RowAddr, TiledConfig, BQ, FEW_QUERIES};
use crate::mask::MaskParts;
use crate::simd::{with_scratch, Isa};
use candle::Tensor;
use rayon::prelude::*;
use std::f32::consts::LOG2_E;

/// The tiled kernel: `q` `(B, H, L, D)`, `k` `(B, Hkv, S, D)`, `v` `(B, Hkv, S, Dv)` (CPU
/// tensors of one dtype: `f32`, `f16` or `bf16`; `Hkv` divides `H`, query head `h` uses
/// key/value head `h / (H / Hkv)`) under `mask` (from `Mask::decompose` for the same
/// `(B, H, L, S)`), scores scaled by `scale`, with the knobs of `cfg` → `(B, H, L, Dv)` in the
/// input dtype. No weights, no autograd.
pub fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &MaskParts,
    scale: f64,
    cfg: &TiledConfig,
) -> candle::Result<Tensor> {
    let prep = Prepared::new(q, k, v, mask, scale)?;
    if cfg.block_k == Some(0) {
        candle::bail!("tiled attention: block_k must be at least 1")
    }
    let g = match cfg.blocks_per_task {
        None => blocks_per_task(&prep.dims),
        Some(g @ 1..=4) => g,
        Some(g) => candle::bail!("tiled attention: blocks_per_task must be 1 to 4, got {g}"),
    };
    let isa = Isa::at_most(cfg.isa);
    let kind = Kind::choose(prep.in_dtype, isa, cfg.half_dot);
    let bk = cfg.block_k_at(isa);
    prep.run(isa, kind, |inp, out| run_tiled(isa, inp, out, bk, g, true))
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

/// Attention of every `(batch, head, query group of g · BQ queries)` of `inp` as one task that
/// walks all the keys and writes its normalised rows into `out` (`(B, L, H, Dv)`). With
/// `copy_shared`, keys and values that several tasks walk are first copied or packed once
/// ([`HeadCopies`]); without, every task reads them in place (the few-queries path when each
/// `(batch, head)` is one task, which reads in place as its split path does).
pub(super) fn run_tiled(
    isa: Isa,
    inp: &Inputs,
    out: OutRows,
    bk: usize,
    g: usize,
    copy_shared: bool,
) {
    let Dims { b, h, l, d, dv, .. } = inp.dims;
    let groups = l.div_ceil(g * BQ);
    let scratch_len = group_scratch_len(d, dv, bk, g, inp.kind) + inp.paged_scratch_len();
    let copies = if copy_shared {
        HeadCopies::new(inp, bk, groups)
    } else {
        HeadCopies::in_place(inp)
    };
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

    /// No copies: every task reads the inputs' keys and values in place.
    fn in_place(inp: &Inputs) -> Self {
        Self {
            keys: None,
            values: None,
            key_len: 0,
            value_len: 0,
            hkv: inp.dims.hkv,
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
struct SubBlock<'s, 'q> {
    i0: usize,
    nq: usize,
    nv: usize,
    kend: usize,
    /// Whether `P·V` has written the rows yet (until then they hold whatever was there).
    started: bool,
    /// The block's `f32` query rows in place (stride `Q`'s row stride) when it has at most
    /// [`FEW_QUERIES`] of them: the row-wise score kernel reads these, and `qt` is not filled.
    rows: Option<&'q [f32]>,
    qt: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
    alpha: &'s mut [f32],
}

/// Scratch floats [`query_group`] needs (`kind`: the key/value tiles of half inputs).
pub(crate) fn group_scratch_len(d: usize, dv: usize, bk: usize, g: usize, kind: Kind) -> usize {
    g * (d * BQ + 3 * BQ) + bk * BQ + kind.tile_len(d, dv, bk)
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
    // A paged cache's keys and values are gathered into the end of the scratch (see below).
    let (scratch, gathered) = scratch.split_at_mut(scratch.len() - inp.paged_scratch_len());
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
        let rows = match q {
            Data::F32(q) if nq <= FEW_QUERIES => Some(&q[si0 * qsr..]),
            _ => None,
        };
        if rows.is_none() {
            load_queries(isa, kind, q.from(si0 * qsr), qsr, nq, d, qt, tile);
        }
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        let kend = inp.key_limit(b, si0, nq).min(keys.end);
        *slot = Some(SubBlock {
            i0: si0,
            nq,
            nv,
            kend,
            started: false,
            rows,
            qt,
            m,
            l,
            alpha,
        });
    }
    // Grouped-query attention: the H / Hkv consecutive query heads of a group share one
    // key/value head, read in place (never repeated per query head).
    let kv_head = h / (inp.dims.h / inp.dims.hkv);
    let (k, ksr, v, vsr, tables) = match inp.paged {
        Some(paged) => {
            let s = inp.dims.s;
            // Read in place where the level has kernels for it and every query block takes
            // the row-wise score kernel (decoding): the kernels take each position's keys and
            // values from its slot, through a table of their addresses in the scratch, with
            // the arithmetic of the strided kernels (the same floats).
            let in_place =
                InPlace::at(isa).filter(|_| subs.iter().flatten().all(|sub| sub.rows.is_some()));
            // SAFETY: every bit pattern is a valid raw pointer, and the middle part that
            // `align_to_mut` returns holds only whole, aligned ones.
            let (_, table, _) = unsafe { gathered.align_to_mut::<*const f32>() };
            match in_place {
                Some(kernels) if table.len() >= 2 * s => {
                    let (keys, rest) = table.split_at_mut(s);
                    let values = &mut rest[..s];
                    paged.head_rows(b, kv_head, keys, values);
                    let rows = |rows: &[*const f32]| ByTable {
                        rows: rows.as_ptr(),
                        col: 0,
                    };
                    let tables = (rows(keys), rows(values), kernels);
                    (Data::F32(&[]), d, Data::F32(&[]), dv, Some(tables))
                }
                // The head's keys and values copied in position order into contiguous rows:
                // the micro-kernels below read them as they read a contiguous cache's, so the
                // result is the same floats.
                _ => {
                    let (keys, values) = gathered.split_at_mut(s * d);
                    paged.gather_head(b, kv_head, keys, values);
                    (Data::F32(keys), d, Data::F32(values), dv, None)
                }
            }
        }
        None => {
            let (k, ksr) = match copy.keys {
                Some(k) => (k, d),
                None => (inp.k.head(b, kv_head), inp.k.sr()),
            };
            (k, ksr, inp.v.head(b, kv_head), inp.v.sr(), None)
        }
    };
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
        let kv = match (tables, copy.values) {
            // SAFETY: keys j0 .. j0 + nk_block < S of the head's tables of S rows.
            (Some((k, v, kernels)), _) => unsafe {
                BlockKv::Table {
                    k: k.skip(j0),
                    v: v.skip(j0),
                    kernels,
                }
            },
            // Key pairs from key 0 and an even `j0`: pair `j0 / 2` starts this block.
            #[cfg(target_arch = "x86_64")]
            (None, Some(vp)) => match k {
                Data::Half(k) => BlockKv::Dot {
                    k: &k[j0 * ksr..],
                    ks: ksr,
                    vp: &vp[j0 / 2 * dv.div_ceil(16) * 16..],
                },
                Data::F32(_) => unreachable!("packed values come with bf16 keys"),
            },
            (None, _) => block_kv(isa, kind, k, ksr, v, vsr, j0, nk_block, (d, dv), tile),
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
                BlockKv::F32 { k, ks, .. } => match sub.rows {
                    Some(q) => scores_few(isa, q, qsr, nq, d, k, ks, nk, st, inp.qscale),
                    None => scores(isa, sub.qt, d, k, ks, nk, st, nv, inp.qscale),
                },
                #[cfg(target_arch = "x86_64")]
                BlockKv::Dot { k, ks, .. } => {
                    half::dot::scores(kind, sub.qt, d, k, ks, nk, st, nv, inp.qscale)
                }
                BlockKv::Table { k, kernels, .. } => {
                    let q = sub
                        .rows
                        .expect("tables are made only when every query block is read in place");
                    // SAFETY: the table's rows j0 .. j0 + nk are slots of the paged cache,
                    // `d` floats each, borrowed for this call.
                    unsafe { kernels.scores_few(q, qsr, nq, d, k, nk, st, inp.qscale) }
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
                    softmax_update(isa, st, nk, sub.m, sub.l, sub.alpha, nv, nq);
                    pv(
                        isa, st, nk, v, vs, dv, o_sub, o.stride, nq, sub.alpha, first,
                    )
                }
                // SAFETY: as above (the rows of `o_sub`), and the table's value rows j0 .. j0
                // + nk, `dv` floats each in the paged cache's slots, borrowed for this call.
                BlockKv::Table { v, kernels, .. } => {
                    softmax_update(isa, st, nk, sub.m, sub.l, sub.alpha, nv, nq);
                    kernels.pv(st, nk, v, dv, o_sub, o.stride, nq, sub.alpha, first)
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
    /// `f32` key and value rows of a paged cache where they lie (from key `j0`), and the
    /// kernels that read them so.
    Table {
        k: ByTable,
        v: ByTable,
        kernels: InPlace,
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

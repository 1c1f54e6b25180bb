//! The CPU product `y = x · Wᵀ + b` of [`super::Projection`], over packed panels of `Wᵀ`.
//!
//! The rows of `x` are first packed, once for all tasks, in groups of 6: `(k, 6)` row-major
//! per group, what the micro-kernel broadcasts from. (Reading 6 rows `k` floats apart
//! instead put them into the same few L1 sets, which evicted the panel: the kernel ran at 100
//! or 145 GFLOP/s depending on where the allocator had put `x`.)
//!
//! The output is then cut into tasks of at most [`MB`] rows × one 64-column panel, run in
//! parallel. A task writes the bias into its rectangle, then adds the product chunk by chunk
//! of [`KC`] inputs, so that the chunk of the panel (`KC × 64` floats) stays in L1 while
//! every 6-row micro-tile of the block uses it.

use super::PANEL;
use crate::simd::{fma, with_scratch, Isa};
use rayon::prelude::*;

/// Rows per task (a multiple of the micro-tile's [`R`]).
const MB: usize = 72;
/// Rows per micro-tile, the packing group of `x`.
const R: usize = 6;
/// Inputs per chunk of the reduction.
const KC: usize = 128;
/// Below this many input floats the rows are packed on the calling thread (64K floats take
/// about 20 µs; a round trip through the pool costs as much).
const PARALLEL_MIN_PACK: usize = 1 << 18;
/// Below this many multiply-adds a product runs on the calling thread: waking the pool would
/// cost more than the product (one decoding step of a small model).
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// The operands of one product `y = x · Wᵀ[:, col0 .. col0 + n] + bias`.
#[derive(Clone, Copy)]
pub(super) struct Operands<'a> {
    /// `(m, k)` row-major.
    pub x: &'a [f32],
    pub m: usize,
    pub k: usize,
    /// The packed `Wᵀ`: panels of `(k, 64)`, see [`super::Weight::Packed`].
    pub panels: &'a [f32],
    /// The first column of `Wᵀ` this product uses.
    pub col0: usize,
    pub n: usize,
    /// `n` values added to every row.
    pub bias: Option<&'a [f32]>,
}

/// The output pointer shared by the tasks of [`gemm`], each of which writes its own rectangle.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks only write through the pointer into disjoint rectangles of the output (see
// `gemm`), and the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// `y` `(m, n)` row-major `= x · Wᵀ[:, col0 ..][:, ..n] + bias`, a new buffer.
pub(super) fn gemm(isa: Isa, op: Operands) -> Vec<f32> {
    let Operands { m, k, n, col0, .. } = op;
    assert!(k > 0 && op.x.len() >= m * k);
    assert!(op.panels.len() >= (col0 + n).div_ceil(PANEL) * k * PANEL);
    assert!(op.bias.is_none_or(|b| b.len() >= n));
    let threads = rayon::current_num_threads().max(1);
    let parallel = threads > 1 && m * n * k >= PARALLEL_MIN_MACS;
    // Row blocks of about equal size (a multiple of R, at most MB): 128 rows are 66 + 62,
    // not 72 + 56, which left one thread waiting for the other.
    let mb = m.div_ceil(m.div_ceil(MB)).div_ceil(R) * R;
    let row_blocks = m.div_ceil(mb);
    // In parallel, one task per (row block, panel): tasks share the packed rows, so finer
    // tasks cost nothing but scheduling (~1 µs against ~30 µs of work each) and balance the
    // threads. On one thread, one task per row block.
    let group_cols = if parallel {
        PANEL
    } else {
        n.div_ceil(PANEL) * PANEL
    };
    let groups = n.div_ceil(group_cols);
    // Every element is written (bias or zero) before it is accumulated into, so the buffer
    // starts uninitialised rather than zeroed: one pass over the output less.
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    // `x` packed once for all tasks (the tasks of one row block share it).
    with_scratch(m.div_ceil(R) * R * k, |xp| {
        // Packing is a copy: on the pool only when it is big enough to pay for waking it.
        if parallel && m * k >= PARALLEL_MIN_PACK {
            xp.par_chunks_mut(mb * k)
                .zip(op.x[..m * k].par_chunks(mb * k))
                .for_each(|(dst, src)| pack_rows(src, k, dst));
        } else {
            pack_rows(&op.x[..m * k], k, xp);
        }
        let xp = &*xp;
        let task = |t: usize| {
            let (rb, gi) = (t / groups, t % groups);
            let rows = rb * mb..m.min((rb + 1) * mb);
            let cols = gi * group_cols..n.min((gi + 1) * group_cols);
            // SAFETY: task `t` alone writes rows `rows` × columns `cols` of the output (the
            // tasks partition rows × columns), `out` points to the `m * n` floats of `y`,
            // which outlive the loop, and `block` checks its rectangle against `m` and `n`.
            unsafe { block(isa, &op, &xp[rb * mb * k..], rows, cols, out) };
        };
        if parallel {
            (0..row_blocks * groups).into_par_iter().for_each(task);
        } else {
            (0..row_blocks * groups).for_each(task);
        }
    });
    // SAFETY: the capacity is m · n, and the tasks, which partition the m × n output, each
    // wrote every element of their rectangle (`block` writes the bias or zero to all of it
    // first).
    unsafe { y.set_len(m * n) };
    y
}

/// One task of [`gemm`]: output rows `rows`, columns `cols`, with `xp` the packed rows
/// from `rows.start` on.
///
/// # Safety
/// `out` points to the `m * n` floats of the output, and nothing else reads or writes its
/// rows `rows` in columns `cols` while this runs.
unsafe fn block(
    isa: Isa,
    op: &Operands,
    xp: &[f32],
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
) {
    let Operands { m, k, n, col0, .. } = *op;
    assert!(rows.start < rows.end && rows.end <= m && cols.end <= n);
    let nr = rows.len();
    let mut c = cols.start;
    while c < cols.end {
        // One segment: the columns up to the end of the panel column `col0 + c` lies in.
        let (p, within) = ((col0 + c) / PANEL, (col0 + c) % PANEL);
        let w = (PANEL - within).min(cols.end - c);
        // SAFETY: rows `rows` (< m) and columns c .. c + w (<= cols.end <= n) belong to this
        // task (the caller's contract): row i of the block starts at (rows.start + i) * n + c,
        // and its w floats end before (rows.end - 1) * n + n <= m * n.
        let yb = out.0.add(rows.start * n + c);
        for i in 0..nr {
            let row = yb.add(i * n);
            match op.bias {
                Some(b) => std::ptr::copy_nonoverlapping(b[c..c + w].as_ptr(), row, w),
                None => std::ptr::write_bytes(row, 0, w),
            }
        }
        let panel = &op.panels[p * k * PANEL..(p + 1) * k * PANEL];
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            // SAFETY: as above, the rows of `yb` are this task's alone.
            accumulate(
                isa,
                &xp[k0 * R..],
                R * k,
                kc,
                &panel[k0 * PANEL + within..],
                yb,
                n,
                nr,
                w,
            );
            k0 += kc;
        }
        c += w;
    }
}

/// Packs `rows` (`nr` rows of `k` floats) in groups of [`R`]: row `i`, input `kk` goes to
/// `xp[(i / R) * R * k + kk * R + i % R]`. The missing rows of the last group are left as
/// they are (never read).
fn pack_rows(rows: &[f32], k: usize, xp: &mut [f32]) {
    for (group, dst) in rows.chunks(R * k).zip(xp.chunks_mut(R * k)) {
        if group.len() == R * k {
            // Whole group: six contiguous stores per input, reading six row streams.
            let r: [&[f32]; R] = std::array::from_fn(|i| &group[i * k..(i + 1) * k]);
            for (kk, d) in dst.chunks_exact_mut(R).enumerate() {
                for i in 0..R {
                    d[i] = r[i][kk];
                }
            }
        } else {
            for (i, row) in group.chunks_exact(k).enumerate() {
                for (kk, &v) in row.iter().enumerate() {
                    dst[kk * R + i] = v;
                }
            }
        }
    }
}

/// `y[i * ys + c] += Σ_kk x(i, kk) · wp[kk * 64 + c]` for rows `i < nr`, columns `c < w`,
/// inputs `kk < kc`, with `x(i, kk) = x[(i / 6) * gs + kk * 6 + i % 6]` (packed rows).
///
/// # Safety
/// `y` is valid for reads and writes of `w` floats at `y + i * ys` for every `i < nr`, and
/// nothing else accesses those floats meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate(
    isa: Isa,
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    assert!((1..=PANEL).contains(&w) && kc > 0 && gs >= R * kc);
    assert!(nr == 0 || x.len() >= (nr - 1) / R * gs + (kc - 1) * R + R);
    assert!(wp.len() >= (kc - 1) * PANEL + w);
    match isa {
        // SAFETY: `Isa::Avx512` exists only after avx512f was detected; the lengths of `x`
        // and `wp` are asserted above and `y`'s rows are the caller's contract: that is
        // `avx512::accumulate`'s contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => super::avx512::accumulate(x.as_ptr(), gs, kc, wp.as_ptr(), y, ys, nr, w),
        // SAFETY: avx2 and fma were detected; the rows are the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => accumulate_avx2(x, gs, kc, wp, y, ys, nr, w),
        // SAFETY: the caller's contract.
        Isa::Portable => accumulate_portable::<false>(x, gs, kc, wp, y, ys, nr, w),
    }
}

/// [`accumulate_portable`] compiled with AVX2 and FMA.
///
/// # Safety
/// The CPU has AVX2 and FMA, and the contract of [`accumulate`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_avx2(
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    // SAFETY: the caller's contract.
    accumulate_portable::<true>(x, gs, kc, wp, y, ys, nr, w)
}

/// Plain-Rust [`accumulate`], row by row (the loop over the `w` columns vectorises).
///
/// # Safety
/// The contract of [`accumulate`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_portable<const FMA: bool>(
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    for i in 0..nr {
        // SAFETY: row i < nr of the caller's rectangle, `w` floats, accessed by no one else.
        let row = std::slice::from_raw_parts_mut(y.add(i * ys), w);
        let group = &x[i / R * gs + i % R..];
        for kk in 0..kc {
            let a = group[kk * R];
            for (yv, &wv) in row.iter_mut().zip(&wp[kk * PANEL..kk * PANEL + w]) {
                *yv = fma::<FMA>(a, wv, *yv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Every instruction set against an f64 reference at the edges of the row blocks (64),
    /// the panels (64), the k chunks (128) and the micro-tiles (6 rows, 16 columns), with
    /// products starting inside a panel (a narrowed projection), with and without bias.
    #[test]
    fn gemm_matches_the_reference_at_every_block_edge() {
        let isas = [Isa::detect(false), Isa::Portable];
        let shapes = [
            (1, 1, 1, 0),
            (5, 3, 17, 0),
            (13, 300, 1, 63),
            (7, 64, 200, 100),
            (63, 129, 65, 0),
            (65, 128, 64, 64),
            (130, 257, 150, 37),
        ];
        // Miri interprets every multiply-add: the first four shapes still cross the panel,
        // micro-tile and k-chunk edges (not the 72-row block's).
        let shapes = if cfg!(miri) {
            &shapes[..4]
        } else {
            &shapes[..]
        };
        for &(m, k, n, col0) in shapes {
            // Wᵀ (k, total) with total = col0 + n + 5 columns, packed into panels.
            let total = col0 + n + 5;
            let wt = pseudo_random(k * total, 2 + n as u32);
            let np = total.div_ceil(PANEL);
            let mut panels = vec![0f32; np * k * PANEL];
            for kk in 0..k {
                for c in 0..total {
                    panels[(c / PANEL) * k * PANEL + kk * PANEL + c % PANEL] = wt[kk * total + c];
                }
            }
            let x = pseudo_random(m * k, 1 + m as u32);
            let b = pseudo_random(n, 3);
            for bias in [None, Some(&b[..])] {
                let op = Operands {
                    x: &x,
                    m,
                    k,
                    panels: &panels,
                    col0,
                    n,
                    bias,
                };
                for isa in isas {
                    let y = gemm(isa, op);
                    for i in 0..m {
                        for j in 0..n {
                            let mut s = bias.map_or(0.0, |b| b[j] as f64);
                            for kk in 0..k {
                                s += x[i * k + kk] as f64 * wt[kk * total + col0 + j] as f64;
                            }
                            let got = y[i * n + j];
                            assert!(
                                (got as f64 - s).abs() <= 1e-5 * (1.0 + s.abs()),
                                "{isa:?} m={m} k={k} n={n} col0={col0} bias={} at ({i}, {j}): {got} vs {s}",
                                bias.is_some()
                            );
                        }
                    }
                }
            }
        }
    }
}

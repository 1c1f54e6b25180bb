//! The CPU product `y = x · Wᵀ + b` of [`super::Projection`], over packed panels of `Wᵀ`.
//!
//! The rows of `x` are first packed, once for all tasks, in groups of 6: `(k, 6)` row-major
//! per group, what the micro-kernel broadcasts from. (Reading 6 rows `k` floats apart
//! instead put them into the same few L1 sets, which evicted the panel: the kernel ran at 100
//! or 145 GFLOP/s depending on where the allocator had put `x`.)
//!
//! The output is then cut into tasks of at most [`MB`] rows × one 64-column panel, run in
//! parallel. A task writes the bias into its rectangle, then adds the product chunk by chunk
//! of [`KC`] = 512 inputs (all of them in a 512-wide model): every 6-row micro-tile of the
//! block streams the chunk of the panel (128 KiB) from L2 once, and its 24 sums stay in
//! registers over the chunk. Chunks of 128 inputs, whose panel stays in L1, measured 3–4%
//! slower at 128 rows (the output tile is then loaded and stored four times).

use super::kernels::{accumulate, pack_strip};
use super::tile::{Ahead, OutPtr, PANEL, R};
use crate::simd::{with_scratch, Isa};
use rayon::prelude::*;

/// Up to this many rows of `x`, a packed product prefetches the next panel (see [`block`]).
const SMALL_M: usize = 24;
/// Rows per task (a multiple of the micro-tile's [`R`]).
const MB: usize = 72;
/// Inputs per chunk of the reduction (see the module's documentation).
const KC: usize = 512;
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
    let mut c = cols.start;
    while c < cols.end {
        // One segment: the columns up to the end of the panel column `col0 + c` lies in.
        let (p, within) = ((col0 + c) / PANEL, (col0 + c) % PANEL);
        let w = (PANEL - within).min(cols.end - c);
        let panel = &op.panels[p * k * PANEL + within..(p + 1) * k * PANEL];
        // A few rows stream the panels from memory faster than they multiply them: fetch the
        // next panel into L2 meanwhile (the AVX2 tile reads a quarter of each panel row per
        // pass, a pattern the hardware prefetchers follow badly).
        let next = (m <= SMALL_M && (p + 1) * PANEL < col0 + n)
            .then(|| op.panels[(p + 1) * k * PANEL..].as_ptr());
        // SAFETY: rows `rows` × columns c .. c + w are this task's (the caller's contract).
        segment(isa, k, n, xp, rows.clone(), c, w, panel, op.bias, out, next);
        c += w;
    }
}

/// Output rows `rows` × columns `c .. c + w` (`w <= 64`) `= bias + x · Wᵀ`, where
/// `panel[kk * 64 + j]` is `Wᵀ[kk, c + j]` and `xp` holds the packed rows from `rows.start`
/// on: the bias (or zero) is written first, then the product added chunk by chunk of [`KC`]
/// inputs.
///
/// # Safety
/// `out` points to the `m * n` floats of the output (`rows.end <= m`, `c + w <= n`), and
/// nothing else reads or writes those rows in those columns while this runs.
#[allow(clippy::too_many_arguments)]
unsafe fn segment(
    isa: Isa,
    k: usize,
    n: usize,
    xp: &[f32],
    rows: std::ops::Range<usize>,
    c: usize,
    w: usize,
    panel: &[f32],
    bias: Option<&[f32]>,
    out: OutPtr,
    next: Option<*const f32>,
) {
    assert!(rows.start < rows.end && c + w <= n && (1..=PANEL).contains(&w));
    let nr = rows.len();
    // SAFETY: row i of the rectangle starts at (rows.start + i) * n + c, and its w floats end
    // before (rows.end - 1) * n + n <= m * n (the caller's contract).
    let yb = out.0.add(rows.start * n + c);
    for i in 0..nr {
        let row = yb.add(i * n);
        match bias {
            Some(b) => std::ptr::copy_nonoverlapping(b[c..c + w].as_ptr(), row, w),
            None => std::ptr::write_bytes(row, 0, w),
        }
    }
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        // SAFETY: as above, the rows of `yb` are this task's alone.
        accumulate(
            isa,
            &xp[k0 * R..],
            R * k,
            kc,
            &panel[k0 * PANEL..],
            yb,
            n,
            nr,
            w,
            // The next strip (64 rows of `k`: 4 · k lines), k lines per micro-tile, the
            // lines of this chunk's inputs.
            next.map(|p| Ahead {
                base: p.wrapping_add(16 * k0),
                per_tile: 16 * k,
                tiles: PANEL / 16,
            }),
        );
        k0 += kc;
    }
}

/// `y` `(m, n)` row-major `= x · Wᵀ + bias` for a row-major `W` `(n, k)` read where it lies
/// (a memory-mapped file: [`super::mapped`]), with the packed micro-kernel: each task
/// transposes one 64-row strip of `W` into a panel (the layout of [`super::Weight::Packed`])
/// in a scratch buffer of its thread, then multiplies every row block of `x` with it. The
/// transposition costs about one shuffle per four weights per call, which the rows of `x`
/// pay back: below a few rows the row-by-row kernel of [`super::mapped`] is faster.
pub(super) fn gemm_rows(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    assert!(k > 0 && x.len() >= m * k && w.len() >= n * k);
    assert!(bias.is_none_or(|b| b.len() >= n));
    let parallel = rayon::current_num_threads() > 1 && m * n * k >= PARALLEL_MIN_MACS;
    let mb = m.div_ceil(m.div_ceil(MB)).div_ceil(R) * R;
    let strips = n.div_ceil(PANEL);
    // As in `gemm`: every element is written (bias or zero) before it is accumulated into.
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    with_scratch(m.div_ceil(R) * R * k, |xp| {
        pack_rows(&x[..m * k], k, xp);
        let xp = &*xp;
        let task = |s: usize| {
            let c = s * PANEL;
            let cols = PANEL.min(n - c);
            with_panel_scratch(k * PANEL, |panel| {
                pack_strip(isa, &w[c * k..(c + cols) * k], cols, k, panel);
                // While this strip is multiplied, the next one is prefetched into L2.
                let next = (c + PANEL < n).then(|| w[(c + PANEL) * k..].as_ptr());
                let mut r0 = 0;
                while r0 < m {
                    let rows = r0..m.min(r0 + mb);
                    // SAFETY: strip `s` alone writes columns c .. c + cols (the strips
                    // partition the columns), of every row; `out` points to the m · n
                    // floats of `y`, which outlive the loop.
                    unsafe {
                        segment(
                            isa,
                            k,
                            n,
                            &xp[r0 * k..],
                            rows,
                            c,
                            cols,
                            panel,
                            bias,
                            out,
                            next,
                        )
                    };
                    r0 += mb;
                }
            });
        };
        if parallel {
            (0..strips).into_par_iter().for_each(task);
        } else {
            (0..strips).for_each(task);
        }
    });
    // SAFETY: the capacity is m · n, and the strips, which partition the columns, each wrote
    // every element of their columns in every row (`segment` writes the bias or zero first).
    unsafe { y.set_len(m * n) };
    y
}

thread_local! {
    /// The panel a [`gemm_rows`] task transposes its strip into (`k · 64` floats: 128 KiB for
    /// `k = 512`), kept per thread across tasks and calls. Separate from
    /// [`with_scratch`]'s buffer, which the calling thread holds for the packed rows while it
    /// may run tasks itself.
    static PANEL_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's panel buffer of `len` floats (contents unspecified).
fn with_panel_scratch<T>(len: usize, f: impl FnOnce(&mut [f32]) -> T) -> T {
    PANEL_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0.0; len]),
    })
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
        let isas = crate::simd::isas();
        let shapes = [
            (1, 1, 1, 0),
            (5, 3, 17, 0),
            (13, KC + 3, 1, 63),
            (7, 64, 200, 100),
            (63, 129, 65, 0),
            (65, 128, 64, 64),
            (130, 257, 150, 37),
            (9, 2 * KC + 1, 70, 5),
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
                for &isa in &isas {
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

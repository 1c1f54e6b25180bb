//! The in-place row kernel: `y = x Wᵀ + b` with `W` `(n, k)` read row by row where it lies (a
//! memory-mapped file, a shared embedding table), no packing. Decoding reads every weight once
//! per step at a few rows of `x`: this is the memory-bound path, and it prefetches `W` ahead of
//! the products. From [`PACKED_MIN_ROWS`] rows of `x` on ([`PORTABLE_PACKED_MIN_ROWS`] at the
//! portable level), strips of `W` are transposed on the fly into the packed GEMM instead
//! ([`super::gemm::gemm_rows`]).

use super::kernels::rows_block;
use super::lazy::LazyPanels;
use super::tile::OutPtr;
use crate::simd::Isa;
use rayon::prelude::*;

/// Output rows of `W` per parallel task.
const ROWS_PER_TASK: usize = 128;

/// From this many rows of `x` on, [`linear_nt`] transposes strips of `W` on the fly and runs
/// the packed GEMM micro-kernel ([`super::gemm::gemm_rows`]); below, the row-by-row dot
/// products are faster: each weight is used too few times to pay for its transposition.
/// Measured on an opus-mt output projection (58101 × 512, 2 threads, AMD EPYC Zen 4, median
/// of 15): 8 rows 3.8 ms (dot products) vs 7.0 ms (packed), 32 rows 11.4 vs 12.3, 64 rows
/// 21.9 vs 22.4, 96 rows 31.5 vs 30.9. (Packed once instead of on the fly, the GEMM is no
/// faster than the dot products below this either: 32 rows 12.1 vs 12.2 ms, 64 rows 20.9 vs
/// 21.0 at the AVX-512 level; at the AVX2 level 14.3 vs 11.9 and 24.4 vs 23.3.)
pub(crate) const PACKED_MIN_ROWS: usize = 96;

/// [`PACKED_MIN_ROWS`] at the portable level (a CPU without AVX2: aarch64, or
/// `ATTN_CPU_ISA=portable`). There the row kernel's plain-Rust dot products (2 × 2 tiles,
/// each weight used twice per load) run at a third of the packed micro-kernel's speed (6 × 8
/// tiles, each weight used six times): on an opus-mt output projection (58101 × 512, 2
/// threads, AMD EPYC Zen 4 at the portable level) 12.3 / 15.6 / 15.8 GFLOP/s at 8 / 32 / 64
/// rows against 16.7 / 38.4 / 44.5 with `W` transposed on the fly, and on a decoder step's 36
/// matrices 9.9 / 13.9 against 16.5 / 35.4 at 8 / 32 rows; at 1 and 4 rows the dot
/// products stay ahead or even (5.1 against 3.4 GFLOP/s at one row). Only the transposition
/// on the fly moves down: the panels packed once (a copy of `W`) still wait for
/// [`PACKED_MIN_ROWS`], so the memory a model holds is the same at every level.
pub(super) const PORTABLE_PACKED_MIN_ROWS: usize = 8;

/// The fewest rows of `x` for which [`linear_nt`] runs the packed micro-kernel at `isa`.
fn packed_min_rows(isa: Isa) -> usize {
    match isa {
        Isa::Portable => PORTABLE_PACKED_MIN_ROWS,
        _ => PACKED_MIN_ROWS,
    }
}

/// `y = x Wᵀ + b`: `x` `(m, k)` row-major, `w` `(n, k)` row-major, `bias` `(n)` → `(m, n)`.
/// From [`PACKED_MIN_ROWS`] rows on, the panels of `lazy` (packed once `W` keeps being used
/// that way: [`super::lazy`]) when there are any, else strips of `W` transposed on the fly;
/// the same transposition from [`PORTABLE_PACKED_MIN_ROWS`] rows on at the portable level.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_nt(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    lazy: Option<&LazyPanels>,
) -> Vec<f32> {
    assert!(x.len() >= m * k && w.len() >= n * k && bias.is_none_or(|b| b.len() >= n));
    if m >= packed_min_rows(isa) && k > 0 {
        // Only products of PACKED_MIN_ROWS rows count towards packing (see
        // PORTABLE_PACKED_MIN_ROWS).
        let lazy = lazy.filter(|_| m >= PACKED_MIN_ROWS);
        if let Some(panels) = lazy.and_then(|l| l.panels(isa, w, n, k)) {
            let op = super::gemm::Operands {
                x,
                m,
                k,
                panels,
                col0: 0,
                n,
                bias,
            };
            return super::gemm::gemm(isa, op);
        }
        return super::gemm::gemm_rows(isa, x, m, k, w, n, bias);
    }
    linear_nt_rows(isa, x, m, w, n, k, bias)
}

/// [`linear_nt`] by dot products of the rows of `x` with the rows of `W` where they lie: tasks
/// of [`ROWS_PER_TASK`] rows of `W` in parallel, each writing its columns of `y` (all rows).
fn linear_nt_rows(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    // Every element is written by exactly one task (below), so the buffer starts
    // uninitialised rather than zeroed: at beam-search sizes (32 × 58101) zeroing it cost 3%
    // of the decoding time.
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    (0..n.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|t| {
            let r0 = t * ROWS_PER_TASK;
            let rows = ROWS_PER_TASK.min(n - r0);
            let bias = bias.map(|b| &b[r0..r0 + rows]);
            // SAFETY: task t alone writes columns r0 .. r0 + rows (the tasks partition the
            // columns), of the m rows of `y` at stride n; `out` points to its m · n floats,
            // which outlive the loop.
            unsafe {
                rows_block(
                    isa,
                    x,
                    m,
                    &w[r0 * k..(r0 + rows) * k],
                    rows,
                    k,
                    bias,
                    out.get().add(r0),
                    n,
                )
            };
        });
    // SAFETY: the capacity is m · n, and the tasks, which partition the columns, each wrote
    // every element of their columns in every row (`rows_block` writes all m × rows outputs).
    unsafe { y.set_len(m * n) };
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_and_dispatched_blocks_agree() {
        // Whole tiles and every kind of edge tile, with and without a bias.
        for (m, rows, k) in [
            (6, 9, 37),
            (1, 9, 37),
            (2, 7, 16),
            (3, 13, 8),
            (9, 14, 71),
            (13, 5, 3),
        ] {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let w: Vec<f32> = (0..rows * k).map(|i| (i % 5) as f32 - 2.0).collect();
            let bias: Vec<f32> = (0..rows).map(|r| r as f32 - 4.0).collect();
            for bias in [None, Some(bias.as_slice())] {
                // y at a row stride wider than `rows`, as a task writes its columns of `y`.
                let ys = rows + 3;
                let mut want = vec![7f32; m * ys];
                for i in 0..m {
                    for r in 0..rows {
                        let dot: f32 = (0..k).map(|c| x[i * k + c] * w[r * k + c]).sum();
                        want[i * ys + r] = dot + bias.map_or(0.0, |b| b[r]);
                    }
                }
                for isa in crate::simd::isas() {
                    let mut a = vec![7f32; m * ys];
                    // SAFETY: the buffer holds m rows of ys >= rows floats.
                    unsafe { rows_block(isa, &x, m, &w, rows, k, bias, a.as_mut_ptr(), ys) };
                    assert_eq!(a, want, "{isa:?}: small integers, so every sum is exact");
                }
            }
        }
    }

    #[test]
    fn a_rows_outputs_do_not_depend_on_the_rows_beside_it() {
        // What continuous batching rests on (`translator::continuous`): at the AVX2 and
        // AVX-512 levels a row of `x` gets the same floats alone as in any block, whichever
        // tile (4 rows, or the last 1 to 3) computed it. Values that round, so that a change
        // in the summation order would show.
        let (rows, k) = (9, 83);
        let w: Vec<f32> = (0..rows * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.11).collect();
        let product = |isa: Isa, x: &[f32], m: usize| {
            let mut y = vec![0f32; m * rows];
            // SAFETY: `y` holds m rows of `rows` floats; `x` holds m rows of k.
            unsafe { rows_block(isa, x, m, &w, rows, k, Some(&bias), y.as_mut_ptr(), rows) };
            y
        };
        for m in 1..=11 {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.23).cos()).collect();
            for isa in crate::simd::isas()
                .into_iter()
                .filter(|&isa| isa != Isa::Portable)
            {
                let block = product(isa, &x, m);
                for i in 0..m {
                    let alone = product(isa, &x[i * k..(i + 1) * k], 1);
                    assert_eq!(
                        block[i * rows..(i + 1) * rows],
                        alone,
                        "{isa:?}: row {i} of {m}"
                    );
                }
            }
        }
    }

    #[test]
    fn linear_nt_matches_a_plain_loop() {
        // Row counts on both sides of PACKED_MIN_ROWS and PORTABLE_PACKED_MIN_ROWS; widths
        // and depths with partial 64-column strips, partial 16-float vectors and more than
        // one 128-input chunk.
        for (m, n, k) in [
            (1, 1, 1),
            (3, 7, 5),
            (4, 130, 33),
            (7, 65, 17),
            (8, 130, 33),
            (9, 257, 64),
            (5, 4, 16),
            (32, 1, 1),
            (33, 65, 17),
            (40, 130, 300),
            (70, 64, 129),
            (96, 65, 17),
            (101, 130, 300),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
            for isa in crate::simd::isas() {
                let lazy = LazyPanels::default();
                let y = linear_nt(isa, &x, m, &w, n, k, Some(&b), Some(&lazy));
                // The second product packs `W` (from PACKED_MIN_ROWS rows on) and the third
                // reads the panels: the same sums, bit for bit, as on the fly.
                for _ in 0..2 {
                    let again = linear_nt(isa, &x, m, &w, n, k, Some(&b), Some(&lazy));
                    assert_eq!(again, y, "{isa:?} {m}x{n}x{k}: packed once vs on the fly");
                }
                assert_eq!(
                    lazy.is_packed(),
                    m >= PACKED_MIN_ROWS,
                    "{isa:?} {m}x{n}x{k}"
                );
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 =
                            (0..k).map(|c| x[i * k + c] * w[j * k + c]).sum::<f32>() + b[j];
                        let got = y[i * n + j];
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{isa:?} {m}x{n}x{k} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_portable_level_transposes_on_the_fly_from_its_own_row_count() {
        // Which kernel ran shows in the floats: the dot products sum in 8 lanes, the packed
        // micro-kernel input by input, so with inputs of many magnitudes the two differ in
        // the last bits. Below PORTABLE_PACKED_MIN_ROWS the result is the row kernel's, from
        // it on the on-the-fly GEMM's; the other levels keep the row kernel up to
        // PACKED_MIN_ROWS.
        let (n, k) = (70, 200);
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 1.37e-2)
            .collect();
        for m in [PORTABLE_PACKED_MIN_ROWS - 1, PORTABLE_PACKED_MIN_ROWS, 33] {
            let x: Vec<f32> = (0..m * k)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.731)
                .collect();
            let rows = linear_nt_rows(Isa::Portable, &x, m, &w, n, k, None);
            let packed = super::super::gemm::gemm_rows(Isa::Portable, &x, m, k, &w, n, None);
            assert_ne!(
                rows, packed,
                "{m} rows: the inputs must tell the kernels apart"
            );
            let got = linear_nt(Isa::Portable, &x, m, &w, n, k, None, None);
            let want = if m >= PORTABLE_PACKED_MIN_ROWS {
                &packed
            } else {
                &rows
            };
            assert_eq!(&got, want, "{m} rows at the portable level");
            for isa in crate::simd::isas()
                .into_iter()
                .filter(|&i| i != Isa::Portable)
            {
                let got = linear_nt(isa, &x, m, &w, n, k, None, None);
                let want = linear_nt_rows(isa, &x, m, &w, n, k, None);
                assert_eq!(got, want, "{m} rows at {isa:?}: the row kernel");
            }
        }
    }
}

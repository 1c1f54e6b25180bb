//! Plain-Rust micro-kernels of the projection (what aarch64 and x86-64 CPUs without AVX2 run),
//! written so the compiler vectorises them for the target's baseline (SSE2 on x86-64, NEON on
//! aarch64): register tiles of fixed-size lane arrays (`[f32; 8]`, two 128-bit vectors),
//! fixed trip counts, slices cut to their length before the inner loops (no bounds checks
//! there), several independent accumulators per reduction.
//!
//! How this was checked: `objdump -d` of the test binary (`cargo test --release --lib
//! --no-run`) shows the tile loops of [`accumulate`] and [`rows_block`] as packed `mulps` /
//! `addps` on `xmm` registers (the baseline x86-64 target has no FMA; with `FMA` the same
//! loops become `vfmadd231ps`), see the README's "Speed on CPU".
#![allow(clippy::too_many_arguments)]

use super::tile::{PANEL, R};
use crate::simd::fma;

/// Lanes per accumulator array.
const L: usize = 8;

/// Plain-Rust [`super::kernels::accumulate`]: tiles of 6 rows × 8 columns (12 vectors of
/// sums), the columns past the last multiple of 8 row by row.
///
/// # Safety
/// The contract of [`super::kernels::accumulate`].
#[inline(always)]
pub(super) unsafe fn accumulate<const FMA: bool>(
    x: &[f32],
    gs: usize,
    kc: usize,
    wp: &[f32],
    y: *mut f32,
    ys: usize,
    nr: usize,
    w: usize,
) {
    let whole = w / L * L;
    let mut c0 = 0;
    while c0 < whole {
        let mut i = 0;
        while i + R <= nr {
            // SAFETY: rows i .. i + R < nr, columns c0 .. c0 + 8 <= w: the caller's.
            tile::<FMA, R>(&x[i / R * gs..], kc, wp, c0, y.add(i * ys + c0), ys);
            i += R;
        }
        if i < nr {
            let xg = &x[i / R * gs..];
            let yi = y.add(i * ys + c0);
            // SAFETY: as above, for the last nr - i < R rows.
            match nr - i {
                1 => tile::<FMA, 1>(xg, kc, wp, c0, yi, ys),
                2 => tile::<FMA, 2>(xg, kc, wp, c0, yi, ys),
                3 => tile::<FMA, 3>(xg, kc, wp, c0, yi, ys),
                4 => tile::<FMA, 4>(xg, kc, wp, c0, yi, ys),
                _ => tile::<FMA, 5>(xg, kc, wp, c0, yi, ys),
            }
        }
        c0 += L;
    }
    if whole < w {
        for i in 0..nr {
            // SAFETY: row i < nr, columns whole .. w: the caller's, accessed by no one else.
            let row = std::slice::from_raw_parts_mut(y.add(i * ys + whole), w - whole);
            let group = &x[i / R * gs + i % R..];
            for kk in 0..kc {
                let a = group[kk * R];
                let wr = &wp[kk * PANEL + whole..kk * PANEL + w];
                for (yv, &wv) in row.iter_mut().zip(wr) {
                    *yv = fma::<FMA>(a, wv, *yv);
                }
            }
        }
    }
}

/// `RR` rows × 8 columns from column `c0` of the panel, sums in registers over the chunk.
///
/// # Safety
/// `y` readable and writable for 8 floats at `y + r * ys`, `r < RR`, accessed by no one else;
/// `x` one packed group with `kc` inputs, `wp` the panel chunk (`kc` rows of 64).
#[inline(always)]
unsafe fn tile<const FMA: bool, const RR: usize>(
    x: &[f32],
    kc: usize,
    wp: &[f32],
    c0: usize,
    y: *mut f32,
    ys: usize,
) {
    let mut acc = [[0f32; L]; RR];
    for (r, acc) in acc.iter_mut().enumerate() {
        // SAFETY: row r < RR, 8 floats: the contract.
        acc.copy_from_slice(std::slice::from_raw_parts(y.add(r * ys), L));
    }
    let x = &x[..kc * R];
    let wp = &wp[..(kc - 1) * PANEL + c0 + L];
    for kk in 0..kc {
        let wv: &[f32; L] = wp[kk * PANEL + c0..kk * PANEL + c0 + L]
            .try_into()
            .expect("8 lanes");
        let xs: &[f32; R] = x[kk * R..kk * R + R].try_into().expect("6 rows");
        for r in 0..RR {
            let a = xs[r];
            for j in 0..L {
                acc[r][j] = fma::<FMA>(a, wv[j], acc[r][j]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: as above.
        std::slice::from_raw_parts_mut(y.add(r * ys), L).copy_from_slice(acc);
    }
}

/// Plain-Rust [`super::kernels::pack_strip`]: `panel[kk * 64 + j] = rows[j * k + kk]`, by
/// blocks of 8 rows × 8 inputs, so that each block reads 8 runs of 8 floats and writes 8 runs
/// of 8 lanes. Element by element, every store went to another line of the panel (64 floats
/// apart). At the portable level, where the on-the-fly transposition starts at 8 rows of `x`
/// ([`super::rows::PORTABLE_PACKED_MIN_ROWS`]), the transposition went from 23% to 18% of a
/// serving load's samples (`continuous_load`, 32 clients; 0.706 against 0.726–0.744 CPU-s a
/// sentence): what is left is reading `W` from memory.
pub(super) fn pack_strip(rows: &[f32], cols: usize, k: usize, panel: &mut [f32]) {
    let whole_k = k / L * L;
    let mut j0 = 0;
    while j0 + L <= cols {
        let src: [&[f32]; L] = std::array::from_fn(|j| &rows[(j0 + j) * k..(j0 + j + 1) * k]);
        let mut kk = 0;
        while kk < whole_k {
            let block: [&[f32; L]; L] =
                std::array::from_fn(|j| src[j][kk..kk + L].try_into().expect("8 inputs"));
            for t in 0..L {
                let dst: &mut [f32; L] = (&mut panel[(kk + t) * PANEL + j0..][..L])
                    .try_into()
                    .expect("8 lanes");
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = block[j][t];
                }
            }
            kk += L;
        }
        for kk in whole_k..k {
            for (j, row) in src.iter().enumerate() {
                panel[kk * PANEL + j0 + j] = row[kk];
            }
        }
        j0 += L;
    }
    // The last cols % 8 rows, element by element.
    for j in j0..cols {
        for (kk, &v) in rows[j * k..(j + 1) * k].iter().enumerate() {
            panel[kk * PANEL + j] = v;
        }
    }
}

/// Plain-Rust [`super::kernels::rows_block`]: tiles of 2 rows of `x` × 2 rows of `W` (one row
/// of `x` × 4 of `W` for a single row), each dot product in 8 lanes, then summed.
///
/// # Safety
/// As [`super::kernels::rows_block`], with the lengths it asserts.
pub(super) unsafe fn rows_block<const FMA: bool>(
    x: &[f32],
    m: usize,
    w: &[f32],
    rows: usize,
    k: usize,
    bias: Option<&[f32]>,
    y: *mut f32,
    ys: usize,
) {
    let x = &x[..m * k];
    let w = &w[..rows * k];
    let b = |r: usize| bias.map_or(0.0, |b| b[r]);
    // SAFETY: (every `put`) i < m, r < rows: the caller's contract.
    let put = |i: usize, r: usize, v: f32| unsafe { *y.add(i * ys + r) = v + b(r) };
    let mut r = 0;
    if m == 1 {
        while r + 4 <= rows {
            let s = dots::<FMA, 1, 4>(x, 0, w, r, k);
            for (bb, &v) in s[0].iter().enumerate() {
                put(0, r + bb, v);
            }
            r += 4;
        }
    } else {
        while r + 2 <= rows {
            let mut i = 0;
            while i + 2 <= m {
                let s = dots::<FMA, 2, 2>(x, i, w, r, k);
                for (a, row) in s.iter().enumerate() {
                    for (bb, &v) in row.iter().enumerate() {
                        put(i + a, r + bb, v);
                    }
                }
                i += 2;
            }
            if i < m {
                let s = dots::<FMA, 1, 2>(x, i, w, r, k);
                put(i, r, s[0][0]);
                put(i, r + 1, s[0][1]);
            }
            r += 2;
        }
    }
    while r < rows {
        for i in 0..m {
            put(i, r, dots::<FMA, 1, 1>(x, i, w, r, k)[0][0]);
        }
        r += 1;
    }
}

/// The `MR × NR` dot products of rows `i ..` of `x` with rows `r ..` of `w` (`k` each), in
/// 8-lane partial sums over the whole multiples of 8, then the tail.
#[inline(always)]
fn dots<const FMA: bool, const MR: usize, const NR: usize>(
    x: &[f32],
    i: usize,
    w: &[f32],
    r: usize,
    k: usize,
) -> [[f32; NR]; MR] {
    let xr: [&[f32]; MR] = std::array::from_fn(|a| &x[(i + a) * k..(i + a + 1) * k]);
    let wr: [&[f32]; NR] = std::array::from_fn(|b| &w[(r + b) * k..(r + b + 1) * k]);
    let mut acc = [[[0f32; L]; NR]; MR];
    let whole = k / L * L;
    let mut c = 0;
    while c < whole {
        let wv: [&[f32; L]; NR] =
            std::array::from_fn(|b| wr[b][c..c + L].try_into().expect("8 lanes"));
        for a in 0..MR {
            let xv: &[f32; L] = xr[a][c..c + L].try_into().expect("8 lanes");
            for b in 0..NR {
                for j in 0..L {
                    acc[a][b][j] = fma::<FMA>(xv[j], wv[b][j], acc[a][b][j]);
                }
            }
        }
        c += L;
    }
    let mut out = [[0f32; NR]; MR];
    for a in 0..MR {
        for b in 0..NR {
            // Pairwise: (0+4)+(2+6), (1+5)+(3+7), as a vector unit adds halves.
            let v = &acc[a][b];
            let h: [f32; 4] = std::array::from_fn(|j| v[j] + v[j + 4]);
            let mut s = (h[0] + h[2]) + (h[1] + h[3]);
            for cc in whole..k {
                s = fma::<FMA>(xr[a][cc], wr[b][cc], s);
            }
            out[a][b] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::PANEL;

    #[test]
    fn strips_transpose_at_every_level() {
        // Whole 8 × 8 blocks, partial ones on either side, one row, one input, a full panel.
        for (cols, k) in [
            (1, 1),
            (3, 5),
            (8, 8),
            (9, 17),
            (13, 64),
            (16, 7),
            (64, 37),
            (64, 512),
        ] {
            let rows: Vec<f32> = (0..cols * k).map(|i| i as f32).collect();
            for isa in crate::simd::isas() {
                let mut panel = vec![-1f32; k * PANEL];
                super::super::kernels::pack_strip(isa, &rows, cols, k, &mut panel);
                for kk in 0..k {
                    for j in 0..cols {
                        assert_eq!(
                            panel[kk * PANEL + j],
                            rows[j * k + kk],
                            "{isa:?} {cols}x{k}: lane {j} of input {kk}"
                        );
                    }
                }
            }
        }
    }
}

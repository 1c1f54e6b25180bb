//! The int8 CPU product `y = x · Wᵀ + b` of [`super::Projection`] with `W` an
//! [`Int8Matrix`]: `f32` inputs and outputs, integer products, as CTranslate2's int8 path.
//!
//! 1. **Each input row is quantized** at run time with its own symmetric scale (`s_x = max|x|
//!    / 127`, values rounded to `-127 ..= 127`), the rule the weights were quantized with.
//! 2. **The products are exact integers**: `acc[i][n] = Σ_k qx[i][k] · qw[n][k]` in `i32`
//!    (at most 127² · k: no overflow below k = 133,000).
//! 3. **Dequantized once, bias fused**: `y[i][n] = f32(acc) · (s_x[i] · s_w[n]) + b[n]`, a
//!    product and a sum rounded one at a time (no fused multiply-add), so every kernel level
//!    gives the same bits.
//!
//! The micro-kernels ([`Int8Kernel`]) differ only in how they form the integer sums:
//!
//! * **AVX-512 VNNI** (`vpdpbusd`, 64 byte products a instruction) and **AVX-VNNI** (its
//!   256-bit VEX form, Intel client CPUs since Alder Lake): `vpdpbusd` multiplies *unsigned*
//!   by signed bytes, so the input bytes are offset by 128 (`qx + 128`, 1..=255) and the
//!   weights' row sums are subtracted afterwards: `Σ (qx + 128) qw - 128 Σ qw`. u8 × s8
//!   rather than s8 × s8 because the instruction has only that form; the correction is exact
//!   and costs one subtraction per output.
//! * **AVX2** (no VNNI): `vpmaddubsw` multiplies unsigned by signed bytes and adds pairs into
//!   *saturating* 16-bit sums: with offset inputs (up to 255 · 127 · 2 = 64,770) they would
//!   saturate. Instead each product is formed as `|qx| · (sign(qx) · qw)` (`vpabsb`,
//!   `vpsignb`): both factors are at most 127 in magnitude, a pair at most 2 · 127² = 32,258
//!   < 32,767, so nothing saturates; `vpmaddwd` by ones widens the pairs into `i32`. This is
//!   why `-128` is never used on either side.
//! * **Portable**: the same sums in plain Rust over fixed-width lanes.
//!
//! Weights are read in their panel layout ([`crate::weights::Int8Matrix`]): a 64-byte vector
//! is 4 inputs of 16 outputs, so the sums accumulate per output lane and no kernel adds
//! across a vector. A micro-tile is a few input rows × one panel of 64 outputs over the whole
//! reduction. Tasks (row blocks × panel groups) run on rayon's pool.

use super::tile::{OutPtr, MAX_TILE_ROWS};
use crate::simd::Isa;
use crate::weights::int8::{quantize_row, INT8_GROUP, INT8_PANEL};
use crate::weights::Int8Matrix;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::int8_x86 as x86;

/// Rows per task (a multiple of every kernel's tile height).
const MB: usize = 48;
/// Below this many byte products a product runs on the calling thread.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// The int8 micro-kernels, one per instruction set (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Int8Kernel {
    Portable,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-VNNI 256-bit `vpdpbusd`.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX-512 VNNI 512-bit `vpdpbusd`.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni,
}

impl Int8Kernel {
    /// The kernel for `isa`: AVX-512 VNNI at the AVX-512 level where the CPU has it (with
    /// AVX-512 BW); at the AVX2 level (or AVX-512 without VNNI), AVX-VNNI where the CPU has it
    /// and `ATTN_CPU_ISA` did not lower the level (lowering to `avx2` stands for the CPUs
    /// without any VNNI), else plain AVX2.
    pub(crate) fn for_isa(isa: Isa) -> Int8Kernel {
        match isa {
            Isa::Portable => Int8Kernel::Portable,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::Avx512 => {
                let f = x86::features();
                if isa == Isa::Avx512 && f.avx512vnni {
                    Int8Kernel::Avx512Vnni
                } else if f.avxvnni && isa.level() == crate::simd::cpu_level() {
                    Int8Kernel::AvxVnni
                } else if f.avx2 {
                    Int8Kernel::Avx2
                } else {
                    // Not reached: `Isa::Avx2` exists only where AVX2 was detected.
                    Int8Kernel::Portable
                }
            }
        }
    }

    /// Every kernel this CPU can run, whatever `ATTN_CPU_ISA` says (the tests compare them).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Int8Kernel> {
        #[allow(unused_mut)]
        let mut all = vec![Int8Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            let f = x86::features();
            if f.avx2 {
                all.push(Int8Kernel::Avx2);
            }
            if f.avxvnni {
                all.push(Int8Kernel::AvxVnni);
            }
            if f.avx512vnni {
                all.push(Int8Kernel::Avx512Vnni);
            }
        }
        all
    }

    /// Whether the input bytes are offset by 128 (`vpdpbusd` kernels).
    fn offsets_inputs(self) -> bool {
        match self {
            Int8Kernel::Portable => false,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => false,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::AvxVnni | Int8Kernel::Avx512Vnni => true,
        }
    }

    /// Rows per micro-tile.
    fn tile_rows(self) -> usize {
        match self {
            Int8Kernel::Portable => 4,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 | Int8Kernel::AvxVnni => 2,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx512Vnni => 6,
        }
    }

    /// `acc[i][c] = Σ_g Σ_j xq[i · xs + 4 g + j] · panel[(g · 64 + c) · 4 + j]` for rows
    /// `i < rows` (at most [`Int8Kernel::tile_rows`]), all 64 columns, groups `g < groups`
    /// (input bytes as this kernel reads them: offset by 128 or not; `xa`, laid out as `xq`,
    /// their magnitudes for the AVX2 kernel, which others ignore).
    #[allow(clippy::too_many_arguments)]
    fn tile(
        self,
        xq: &[u8],
        xa: &[u8],
        xs: usize,
        rows: usize,
        panel: &[i8],
        groups: usize,
        acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
    ) {
        assert!(rows >= 1 && rows <= self.tile_rows() && groups >= 1);
        assert!(xs >= groups * INT8_GROUP && xq.len() >= (rows - 1) * xs + groups * INT8_GROUP);
        assert!(xa.len() >= (rows - 1) * xs + groups * INT8_GROUP);
        assert!(panel.len() >= groups * INT8_PANEL * INT8_GROUP);
        match self {
            Int8Kernel::Portable => portable_tile(xq, xs, rows, panel, groups, acc),
            // SAFETY: `Avx2` is only chosen where `x86::features()` detected AVX2; the lengths
            // of `xq` and `panel` are asserted above: the kernel's contract.
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => unsafe {
                x86::tile_avx2(
                    xq.as_ptr(),
                    xa.as_ptr(),
                    xs,
                    rows,
                    panel.as_ptr(),
                    groups,
                    acc,
                )
            },
            // SAFETY: `AvxVnni` is only chosen where AVX-VNNI was detected; lengths as above.
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::AvxVnni => unsafe {
                x86::tile_avxvnni(
                    xq.as_ptr(),
                    xq.as_ptr(),
                    xs,
                    rows,
                    panel.as_ptr(),
                    groups,
                    acc,
                )
            },
            // SAFETY: `Avx512Vnni` is only chosen where AVX-512 F/BW/VNNI were detected;
            // lengths as above.
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx512Vnni => unsafe {
                x86::tile_avx512vnni(xq.as_ptr(), xs, rows, panel.as_ptr(), groups, acc)
            },
        }
    }
}

/// The portable micro-tile: the sums of [`Int8Kernel::tile`] over 64 `i32` lanes per row,
/// inputs not offset.
fn portable_tile(
    xq: &[u8],
    xs: usize,
    rows: usize,
    panel: &[i8],
    groups: usize,
    acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
) {
    for (i, a) in acc.iter_mut().enumerate().take(rows) {
        let mut lanes = [0i32; INT8_PANEL];
        let x = &xq[i * xs..][..groups * INT8_GROUP];
        for (g, xg) in x.chunks_exact(INT8_GROUP).enumerate() {
            let w = &panel[g * INT8_PANEL * INT8_GROUP..][..INT8_PANEL * INT8_GROUP];
            let xg = [
                xg[0] as i8 as i32,
                xg[1] as i8 as i32,
                xg[2] as i8 as i32,
                xg[3] as i8 as i32,
            ];
            for (l, wc) in lanes.iter_mut().zip(w.chunks_exact(INT8_GROUP)) {
                *l += xg[0] * wc[0] as i32
                    + xg[1] * wc[1] as i32
                    + xg[2] * wc[2] as i32
                    + xg[3] * wc[3] as i32;
            }
        }
        *a = lanes;
    }
}

/// The rows of `x` quantized: `bytes` `(m, groups · 4)` (zero padded; offset by 128 when
/// `offset`), `scales` `(m)` (NaN for a row holding a NaN or an infinity, whose bytes are
/// zeros: its outputs come out NaN, as the `f32` product's would).
pub(super) struct QuantizedRows {
    pub(super) bytes: Vec<u8>,
    /// `|q|` of each byte, laid out as `bytes` (AVX2 kernel only; empty otherwise).
    pub(super) abs: Vec<u8>,
    pub(super) scales: Vec<f32>,
    pub(super) stride: usize,
}

/// Quantizes the `m` rows of `x` `(m, k)` (see [`QuantizedRows`]) for `kernel`.
pub(super) fn quantize_rows(kernel: Int8Kernel, x: &[f32], m: usize, k: usize) -> QuantizedRows {
    let offset = kernel.offsets_inputs();
    let stride = k.div_ceil(INT8_GROUP) * INT8_GROUP;
    let pad = if offset { 128u8 } else { 0 };
    let mut bytes = vec![pad; m * stride];
    let mut scales = vec![0f32; m];
    let flip = if offset { 0x80u8 } else { 0 };
    let quantize = |(row, (dst, scale)): (&[f32], (&mut [u8], &mut f32))| {
        *scale = match kernel {
            Int8Kernel::Portable => quantize_row(row, dst, flip),
            // SAFETY: the kernel was chosen where AVX2 was detected (every x86 kernel needs it).
            #[cfg(target_arch = "x86_64")]
            _ => unsafe { x86::quantize_row_avx2(row, dst, flip) },
        }
    };
    if m * k >= 1 << 16 {
        x[..m * k]
            .par_chunks_exact(k)
            .zip(
                bytes
                    .par_chunks_exact_mut(stride)
                    .zip(scales.par_iter_mut()),
            )
            .for_each(quantize);
    } else {
        x[..m * k]
            .chunks_exact(k)
            .zip(bytes.chunks_exact_mut(stride).zip(scales.iter_mut()))
            .for_each(quantize);
    }
    // The AVX2 kernel multiplies |x| by sign(x) · w: |x| once here rather than once per row,
    // group and half in the tile (7.8% of a 32-row output projection, median of 5).
    let abs = if kernel == Int8Kernel::Avx2 {
        bytes.iter().map(|&b| (b as i8).unsigned_abs()).collect()
    } else {
        Vec::new()
    };
    QuantizedRows {
        bytes,
        abs,
        scales,
        stride,
    }
}

/// `y = x Wᵀ + b` for outputs `col0 .. col0 + n` of `w` (rows of `W`): `x` `(m, k)`
/// row-major with `k = w.cols()`, `bias` `(n)` → `(m, n)` row-major.
pub(super) fn linear(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &Int8Matrix,
    col0: usize,
    n: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    linear_with(Int8Kernel::for_isa(isa), x, m, w, col0, n, bias)
}

/// [`linear`] with a given kernel (the tests run each one).
pub(super) fn linear_with(
    kernel: Int8Kernel,
    x: &[f32],
    m: usize,
    w: &Int8Matrix,
    col0: usize,
    n: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let k = w.cols();
    assert!(k > 0 && x.len() >= m * k && col0 + n <= w.rows());
    assert!(bias.is_none_or(|b| b.len() >= n));
    if m == 0 || n == 0 {
        return Vec::new();
    }
    let offset = kernel.offsets_inputs();
    let xq = quantize_rows(kernel, x, m, k);
    let groups = w.groups();
    let first_panel = col0 / INT8_PANEL;
    let last_panel = (col0 + n).div_ceil(INT8_PANEL);
    let panels = last_panel - first_panel;
    let threads = rayon::current_num_threads().max(1);
    let parallel = threads > 1 && m * n * k >= PARALLEL_MIN_MACS;
    let row_blocks = m.div_ceil(MB);
    // Few rows (decoding): split the panels finely so both threads stream weights; many rows:
    // one panel per task, the task's rows sharing it from cache.
    let panels_per_task = if !parallel {
        panels
    } else {
        let want_tasks = (4 * threads).div_ceil(row_blocks).max(1);
        panels.div_ceil(want_tasks).max(1)
    };
    let panel_groups = panels.div_ceil(panels_per_task);
    // Every element is written once (the tasks' panels and rows partition the output), so
    // the buffer starts uninitialised rather than zeroed.
    let mut y = Vec::<f32>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    let (scales, sums) = (w.scales(), w.sums());
    let task = |t: usize| {
        let (rb, pg) = (t / panel_groups, t % panel_groups);
        let rows = rb * MB..m.min((rb + 1) * MB);
        let p_range = first_panel + pg * panels_per_task
            ..last_panel.min(first_panel + (pg + 1) * panels_per_task);
        let mut acc = [[0i32; INT8_PANEL]; MAX_TILE_ROWS];
        let th = kernel.tile_rows();
        for p in p_range {
            let panel = w.panel(p);
            // The outputs of this panel that are ours: W rows `lo .. hi`.
            let lo = (p * INT8_PANEL).max(col0);
            let hi = ((p + 1) * INT8_PANEL).min(col0 + n);
            let mut i0 = rows.start;
            while i0 < rows.end {
                let nr = th.min(rows.end - i0);
                let abs = if xq.abs.is_empty() {
                    &xq.bytes
                } else {
                    &xq.abs
                };
                kernel.tile(
                    &xq.bytes[i0 * xq.stride..],
                    &abs[i0 * xq.stride..],
                    xq.stride,
                    nr,
                    panel,
                    groups,
                    &mut acc,
                );
                for (i, a) in acc.iter().enumerate().take(nr) {
                    let segment = Segment {
                        acc: &a[lo - p * INT8_PANEL..hi - p * INT8_PANEL],
                        sx: xq.scales[i0 + i],
                        scales: &scales[lo..hi],
                        sums: offset.then(|| &sums[lo..hi]),
                        bias: bias.map(|b| &b[lo - col0..hi - col0]),
                    };
                    // SAFETY: row `i0 + i < m`, columns `lo - col0 .. hi - col0 <= n`: inside
                    // the `m · n` floats of `y`, which outlive the loop; this task alone
                    // writes rows `rows` × the columns of its panels.
                    unsafe { segment.write(out.get().add((i0 + i) * n + lo - col0)) };
                }
                i0 += nr;
            }
        }
    };
    let tasks = row_blocks * panel_groups;
    if parallel {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
    // SAFETY: the capacity is m · n and the tasks wrote every element (see above).
    unsafe { y.set_len(m * n) };
    y
}

/// One output row segment from its integer sums: `y = f32(acc - 128 · sum) · (sx · scale) +
/// bias` (the correction only for offset inputs), a product and a sum rounded one at a time.
struct Segment<'a> {
    acc: &'a [i32],
    sx: f32,
    scales: &'a [f32],
    sums: Option<&'a [i32]>,
    bias: Option<&'a [f32]>,
}

impl Segment<'_> {
    /// Writes the `acc.len()` outputs from `y` on (written, never read: `y` may be
    /// uninitialised), one loop per case so that each vectorises.
    ///
    /// # Safety
    /// `y` is valid for writes of `acc.len()` floats that nothing else accesses meanwhile.
    unsafe fn write(&self, y: *mut f32) {
        let (sx, len) = (self.sx, self.acc.len());
        let sums = self.sums.map(|s| &s[..len]);
        let bias = self.bias.map(|b| &b[..len]);
        let scales = &self.scales[..len];
        let value = |i: usize, a: i32| -> f32 {
            match sums {
                Some(s) => (a - 128 * s[i]) as f32 * (sx * scales[i]),
                None => a as f32 * (sx * scales[i]),
            }
        };
        match (sums.is_some(), bias) {
            (true, Some(b)) => {
                for (i, &a) in self.acc.iter().enumerate() {
                    y.add(i).write(value(i, a) + b[i]);
                }
            }
            (true, None) => {
                for (i, &a) in self.acc.iter().enumerate() {
                    y.add(i).write(value(i, a));
                }
            }
            (false, Some(b)) => {
                for (i, &a) in self.acc.iter().enumerate() {
                    y.add(i).write(value(i, a) + b[i]);
                }
            }
            (false, None) => {
                for (i, &a) in self.acc.iter().enumerate() {
                    y.add(i).write(value(i, a));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::int8::{quantize_value, row_scale};

    /// Deterministic values in `[-1, 1)` with a few large ones (as activations have).
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let v = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                if i % 97 == 5 {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// The f64 reference: the products of the dequantized inputs and weights (each quantized
    /// by the documented rule), plus the bias.
    fn reference(
        x: &[f32],
        m: usize,
        w: &Int8Matrix,
        col0: usize,
        n: usize,
        bias: Option<&[f32]>,
    ) -> Vec<f64> {
        let k = w.cols();
        let wd = w.dequantize();
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            let row = &x[i * k..(i + 1) * k];
            let (s, inv) = row_scale(row).unwrap();
            let xd: Vec<f64> = row
                .iter()
                .map(|&v| quantize_value(v, inv) as f64 * s as f64)
                .collect();
            for j in 0..n {
                let wr = &wd[(col0 + j) * k..(col0 + j + 1) * k];
                let dot: f64 = xd.iter().zip(wr).map(|(a, &b)| a * b as f64).sum();
                y[i * n + j] = dot + bias.map_or(0.0, |b| b[j] as f64);
            }
        }
        y
    }

    #[test]
    fn every_kernel_matches_the_reference_and_each_other_bit_for_bit() {
        // Odd shapes: k not a multiple of 4, n not of 64, rows past a tile and a task, a
        // narrowed range of outputs starting inside a panel.
        for &(m, k, rows, col0, n) in &[
            (1, 5, 3, 0, 3),
            (2, 64, 64, 0, 64),
            (7, 130, 150, 10, 133),
            (13, 517, 70, 0, 70),
            (50, 36, 200, 64, 100),
            (97, 512, 129, 1, 127),
        ] {
            let x = values(m * k, (m * 31 + k) as u64);
            let w = Int8Matrix::quantize(&values(rows * k, k as u64 + 7), rows, k).unwrap();
            let b = values(n, 99);
            let want = reference(&x, m, &w, col0, n, Some(&b));
            let mut first: Option<Vec<f32>> = None;
            for kernel in Int8Kernel::available() {
                let got = linear_with(kernel, &x, m, &w, col0, n, Some(&b));
                for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                    // f32 rounding of the sum and of the scale products only.
                    let tol = 1e-5 * (1.0 + r.abs()) + 1e-6 * k as f64;
                    assert!(
                        (*g as f64 - r).abs() <= tol,
                        "{kernel:?} {m}x{k}x{n} at {idx}: {g} vs {r}"
                    );
                }
                match &first {
                    None => first = Some(got),
                    Some(f) => assert_eq!(
                        f, &got,
                        "{kernel:?} differs from the portable kernel ({m}x{k}x{n})"
                    ),
                }
            }
        }
    }

    #[test]
    fn a_row_with_a_nan_gives_nan_outputs_and_the_others_are_untouched() {
        let (m, k, n) = (3, 8, 5);
        let mut x = values(m * k, 3);
        let w = Int8Matrix::quantize(&values(n * k, 4), n, k).unwrap();
        let clean = linear_with(Int8Kernel::Portable, &x, m, &w, 0, n, None);
        x[k + 2] = f32::NAN;
        for kernel in Int8Kernel::available() {
            let y = linear_with(kernel, &x, m, &w, 0, n, None);
            assert!(y[n..2 * n].iter().all(|v| v.is_nan()), "{kernel:?}");
            assert_eq!(&y[..n], &clean[..n]);
            assert_eq!(&y[2 * n..], &clean[2 * n..]);
        }
    }

    #[test]
    fn extreme_values_do_not_overflow_or_saturate() {
        // Every product at ±127 · ±127 with the signs that would saturate a 16-bit pair sum.
        let k = 1024;
        let x: Vec<f32> = (0..k)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let w: Vec<f32> = (0..2 * k)
            .map(|i| if (i % k) % 3 == 0 { -2.0 } else { 2.0 })
            .collect();
        let w = Int8Matrix::quantize(&w, 2, k).unwrap();
        for kernel in Int8Kernel::available() {
            let y = linear_with(kernel, &x, 1, &w, 0, 2, None);
            for v in y {
                assert!(
                    (v - 2.0 * k as f32).abs() <= 1e-6 * 2.0 * k as f32,
                    "{kernel:?}: {v}"
                );
            }
        }
    }
}

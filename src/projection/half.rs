//! The half-precision (`bf16`, `f16`) CPU product `y = x · Wᵀ + b` of [`super::Projection`]:
//! half-precision inputs and outputs, `f32` accumulation, one rounding of each output.
//!
//! * **bf16** on a CPU with AVX-512 BF16: the weight is packed once into bf16 pair panels
//!   ([`super::bf16`]), the input rows into pairs per call, and the `vdpbf16ps` micro-kernel
//!   multiplies them. Weight memory: the bf16 checkpoint's size (plus padding to 64 columns
//!   and to an even `k`). Without AVX-512 BF16, a bf16 weight takes the f16 route below
//!   (`f32` panels, the f32 micro-kernel: our f32 speed, exact products as well).
//! * **f16**: no CPU instruction multiplies f16 into f32 here, so the weight is converted
//!   once, when the layer is built, into the `f32` panels of the f32 GEMM (twice the f16
//!   checkpoint's memory for these layers: 4 MiB instead of 2 MiB for the four projections
//!   of `MultiHeadAttention(512, 8)`), and the input rows are converted into `f32` as they
//!   are packed, per call, into the f32 micro-kernel's groups. The products are exact in
//!   `f32` (f16 values are), so this is the f32 GEMM's accuracy on f16 operands.
//!
//! In both, a task (at most [`MB`] rows × one 64-column segment) accumulates into an `f32`
//! tile of its own, starting from the bias, chunk by chunk of the reduction (so that the
//! chunk of the panel stays in L1 across the tile's rows), and rounds the tile to the output
//! dtype (round to nearest even, as torch's half-precision `Linear` rounds its `f32`
//! accumulator) into the output once. Tasks run in parallel on rayon's pool when the product
//! is big enough to pay for waking it.

use super::bf16::{self, Kernel};
use super::tile::{PANEL, R};
use crate::simd::{with_scratch, Isa};
use candle::{DType, Device, Storage, Tensor};
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::vec::HalfBitsVecExt;
use rayon::prelude::*;
use std::sync::Arc;

/// Rows per task (a multiple of [`R`]), as the f32 GEMM.
const MB: usize = 72;
/// Inputs per chunk of the reduction on `f32` panels (f16, and bf16 without AVX-512 BF16):
/// 512, as the f32 GEMM (see `super::gemm`).
const KC_F32: usize = 512;
/// bf16 pairs per chunk past [`SINGLE_PASS_PAIRS`] (and for the portable kernel): 32 KiB of
/// panel.
const KC_PAIRS: usize = 128;
/// Up to this many input pairs (`k <= 2048`), a bf16 product runs the whole reduction in
/// registers and rounds straight into the output ([`bf16::product_rounded`]); its weight
/// panel (up to 256 KiB) then streams from L2, which measured no slower than chunks of
/// [`KC_PAIRS`] that stay in L1.
const SINGLE_PASS_PAIRS: usize = 1024;
/// Up to this many inputs, an f16 product on `f32` panels likewise rounds straight into the
/// output ([`super::gemm::product_f16`]; a panel of up to 256 KiB).
const SINGLE_PASS_F32: usize = 1024;
/// Below this many multiply-adds a product runs on the calling thread (as the f32 GEMM).
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// A half-precision weight `W` `(out, in)` packed for [`HalfPanels::linear`].
#[derive(Clone)]
pub(super) struct HalfPanels {
    dtype: DType,
    /// `in_features`.
    k: usize,
    /// Number of 64-column panels.
    panels: usize,
    data: PanelData,
}

/// The panels, shared by the narrowed projections of one fused weight.
#[derive(Clone)]
enum PanelData {
    /// bf16 pair panels, `(panels, ceil(k / 2), 64)` ([`bf16::pack_weight_pairs`]).
    Bf16(Arc<[u32]>),
    /// `f32` panels `(panels, k, 64)`, the f32 GEMM's layout (for f16 weights).
    F32(Arc<[f32]>),
}

impl std::fmt::Debug for HalfPanels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the panels' values (megabytes of numbers).
        f.debug_struct("HalfPanels")
            .field("dtype", &self.dtype)
            .field("in_features", &self.k)
            .field("panels", &self.panels)
            .finish()
    }
}

/// The bits of a contiguous CPU bf16/f16 tensor's elements.
fn half_bits<'a>(storage: &'a Storage, t: &Tensor) -> candle::Result<&'a [u16]> {
    let all = crate::simd::cpu_half_bits(storage)?;
    if !t.is_contiguous() {
        candle::bail!("internal: the half-precision projection reads contiguous tensors only")
    }
    let start = t.layout().start_offset();
    Ok(&all[start..start + t.elem_count()])
}

/// `f32` value of f16 bits.
#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

impl HalfPanels {
    /// Packs `weight` `(out, k)`, a CPU bf16 or f16 tensor (see the module documentation for
    /// what each keeps in memory): bf16 into pair panels where the CPU has AVX-512 BF16.
    pub(super) fn pack(weight: &Tensor) -> candle::Result<Self> {
        Self::pack_as(weight, Kernel::for_isa(Isa::get()) != Kernel::Portable)
    }

    /// [`HalfPanels::pack`], bf16 into pair panels if `pairs`, else into `f32` panels.
    fn pack_as(weight: &Tensor, pairs: bool) -> candle::Result<Self> {
        let (out, k) = weight.dims2()?;
        let dtype = weight.dtype();
        let weight = weight.contiguous()?;
        let (ws, _) = weight.storage_and_layout();
        let w = half_bits(&ws, &weight)?;
        let panels = out.div_ceil(PANEL);
        let data = match dtype {
            _ if k == 0 => PanelData::F32(Arc::from(Vec::new())),
            DType::BF16 if pairs => PanelData::Bf16(bf16::pack_weight_pairs(w, out, k).into()),
            DType::BF16 | DType::F16 => {
                let to_f32 = if dtype == DType::BF16 {
                    bf16::bf16_to_f32
                } else {
                    f16_to_f32
                };
                let mut packed = vec![0f32; panels * k * PANEL];
                for (n, row) in w.chunks_exact(k).enumerate() {
                    let base = (n / PANEL) * k * PANEL + n % PANEL;
                    for (kk, &v) in row.iter().enumerate() {
                        packed[base + kk * PANEL] = to_f32(v);
                    }
                }
                PanelData::F32(packed.into())
            }
            other => candle::bail!("internal: no half-precision panels for {other:?}"),
        };
        Ok(Self {
            dtype,
            k,
            panels,
            data,
        })
    }

    /// The weight's dtype (`bf16` or `f16`).
    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }

    /// `in_features`.
    pub(super) fn in_features(&self) -> usize {
        self.k
    }

    /// `Wᵀ[:, col0 .. col0 + out]` `(k, out)` in the weight's dtype, rebuilt from the panels
    /// (a copy).
    pub(super) fn transposed(&self, col0: usize, out: usize) -> candle::Result<Tensor> {
        let k = self.k;
        let mut wt = vec![0f32; k * out];
        for (kk, row) in wt.chunks_exact_mut(out.max(1)).enumerate().take(k) {
            for (j, v) in row.iter_mut().enumerate() {
                let c = col0 + j;
                let (p, lane) = (c / PANEL, c % PANEL);
                *v = match &self.data {
                    PanelData::Bf16(d) => {
                        let pair = d[p * k.div_ceil(2) * PANEL + kk / 2 * PANEL + lane];
                        bf16::bf16_to_f32((pair >> (16 * (kk % 2))) as u16)
                    }
                    PanelData::F32(d) => d[p * k * PANEL + kk * PANEL + lane],
                };
            }
        }
        // The values came from the dtype, so converting back is exact.
        Tensor::from_vec(wt, (k, out), &Device::Cpu)?.to_dtype(self.dtype)
    }

    /// `y` `(m, n)` `= x · Wᵀ[:, col0 .. col0 + n] + bias` in the weight's dtype, for `x` a
    /// contiguous CPU tensor of that dtype with `m` rows of `k` inputs and `bias` `(n)`
    /// contiguous.
    pub(super) fn linear(
        &self,
        isa: Isa,
        x: &Tensor,
        m: usize,
        col0: usize,
        n: usize,
        bias: Option<&Tensor>,
    ) -> candle::Result<Tensor> {
        let k = self.k;
        if x.dtype() != self.dtype || bias.is_some_and(|b| b.dtype() != self.dtype) {
            candle::bail!("internal: half-precision projection operands of mixed dtypes")
        }
        if k == 0 || col0 + n > self.panels * PANEL || x.elem_count() != m * k {
            candle::bail!("internal: half-precision projection operands out of shape")
        }
        let (xs, _) = x.storage_and_layout();
        let xv = half_bits(&xs, x)?;
        let bias_guard = bias.map(|b| b.storage_and_layout());
        let bias_bits = match (&bias_guard, bias) {
            (Some((bs, _)), Some(b)) => Some(half_bits(bs, b)?),
            _ => None,
        };
        let to_f32 = match self.dtype {
            DType::BF16 => bf16::bf16_to_f32,
            _ => f16_to_f32,
        };
        let bias: Option<Vec<f32>> = bias_bits.map(|b| b[..n].iter().map(|&v| to_f32(v)).collect());
        let op = Operands {
            x: xv,
            m,
            k,
            col0,
            n,
            bias: bias.as_deref(),
        };
        let y = match &self.data {
            PanelData::Bf16(panels) => gemm(&op, Panels::Bf16(panels, Kernel::for_isa(isa))),
            PanelData::F32(panels) => gemm(&op, Panels::F32(panels, isa, self.dtype)),
        };
        match self.dtype {
            DType::BF16 => {
                Tensor::from_vec(y.reinterpret_into::<half::bf16>(), (m, n), &Device::Cpu)
            }
            _ => Tensor::from_vec(y.reinterpret_into::<half::f16>(), (m, n), &Device::Cpu),
        }
    }
}

/// The operands of one product, as bits of the input dtype.
#[derive(Clone, Copy)]
pub(super) struct Operands<'a> {
    /// `(m, k)` row-major.
    pub x: &'a [u16],
    pub m: usize,
    pub k: usize,
    /// The first column of `Wᵀ` this product uses.
    pub col0: usize,
    pub n: usize,
    /// `n` values (in `f32`) added to every row.
    pub bias: Option<&'a [f32]>,
}

/// The packed weight and the kernel that multiplies it.
#[derive(Clone, Copy)]
pub(super) enum Panels<'a> {
    /// bf16 pair panels: inputs are bf16, multiplied by a [`Kernel`].
    Bf16(&'a [u32], Kernel),
    /// `f32` panels: inputs of the dtype given (f16, or bf16 without AVX-512 BF16),
    /// converted and multiplied by the f32 micro-kernel.
    F32(&'a [f32], Isa, DType),
}

/// The output pointer shared by the tasks of [`gemm`], each of which writes its own rectangle.
#[derive(Clone, Copy)]
struct OutPtr(*mut u16);
// SAFETY: tasks only write through the pointer into disjoint rectangles of the output (see
// `gemm`), and the buffer outlives the parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so that closures capture the `Send` wrapper, not the field).
    fn get(self) -> *mut u16 {
        self.0
    }
}

/// `y` `(m, n)` row-major (bits of the input dtype) `= x · Wᵀ[:, col0 ..][:, ..n] + bias`.
pub(super) fn gemm(op: &Operands, panels: Panels) -> Vec<u16> {
    let Operands { m, k, n, col0, .. } = *op;
    let k2 = k.div_ceil(2);
    assert!(k > 0 && op.x.len() >= m * k);
    assert!(op.bias.is_none_or(|b| b.len() >= n));
    let panel_len = match panels {
        Panels::Bf16(p, _) => {
            assert!(p.len() >= (col0 + n).div_ceil(PANEL) * k2 * PANEL);
            k2 * PANEL
        }
        Panels::F32(p, ..) => {
            assert!(p.len() >= (col0 + n).div_ceil(PANEL) * k * PANEL);
            k * PANEL
        }
    };
    let parallel = rayon::current_num_threads() > 1 && m * n * k >= PARALLEL_MIN_MACS;
    // Row blocks of about equal size (a multiple of R, at most MB), as the f32 GEMM.
    let mb = m.div_ceil(m.div_ceil(MB)).div_ceil(R) * R;
    let row_blocks = m.div_ceil(mb);
    // The segments: the columns cut at the panel edges of `col0 + c`.
    let mut segments = Vec::with_capacity(n.div_ceil(PANEL) + 1);
    let mut c = 0;
    while c < n {
        let w = (PANEL - (col0 + c) % PANEL).min(n - c);
        segments.push((c, w));
        c += w;
    }
    let mut y = Vec::<u16>::with_capacity(m * n);
    let out = OutPtr(y.as_mut_ptr());
    // The packed rows, in f32 slots: bf16 pairs as their bits (`R · k2` per group), f16
    // inputs as f32 values (`R · k` per group).
    let group = match panels {
        Panels::Bf16(..) => R * k2,
        Panels::F32(..) => R * k,
    };
    with_scratch(m.div_ceil(R) * group, |xp| {
        match panels {
            Panels::Bf16(..) => {
                // SAFETY: u32 and f32 have the same size and alignment, every bit pattern is
                // a valid u32, and the reborrow ends with this block (nothing else uses `xp`
                // meanwhile).
                let xp32: &mut [u32] = unsafe {
                    std::slice::from_raw_parts_mut(xp.as_mut_ptr().cast::<u32>(), xp.len())
                };
                bf16::pack_row_pairs(&op.x[..m * k], k, xp32);
            }
            Panels::F32(_, _, dtype) => pack_rows_f32(dtype, &op.x[..m * k], k, xp),
        }
        let xp = &*xp;
        let task = |t: usize| {
            let (rb, si) = (t / segments.len(), t % segments.len());
            let rows = rb * mb..m.min((rb + 1) * mb);
            let (c, w) = segments[si];
            let (p, within) = ((col0 + c) / PANEL, (col0 + c) % PANEL);
            let xg = &xp[rb * mb / R * group..];
            // Short reductions: the whole sum in registers, rounded once straight into `y`.
            let bias = op.bias.map(|b| &b[c..c + w]);
            let y0 = out.get().wrapping_add(rows.start * n + c);
            // SAFETY: task `t` alone writes rows `rows` × columns c .. c + w of the output (the
            // tasks partition rows × segments); row r < m starts at r · n + c and its w values
            // end within the m · n of `y`, which outlives the loop. The u32 view of the packed
            // rows is as at the packing above (shared reads only).
            let done = unsafe {
                match panels {
                    Panels::Bf16(pp, kernel) if k2 <= SINGLE_PASS_PAIRS => {
                        let xg32 = std::slice::from_raw_parts(xg.as_ptr().cast::<u32>(), xg.len());
                        let panel = &pp[p * panel_len + within..(p + 1) * panel_len];
                        bf16::product_rounded(
                            kernel,
                            xg32,
                            group,
                            k2,
                            panel,
                            bias,
                            y0,
                            n,
                            rows.len(),
                            w,
                        )
                    }
                    Panels::F32(pp, isa, DType::F16) if k <= SINGLE_PASS_F32 => {
                        let panel = &pp[p * panel_len + within..(p + 1) * panel_len];
                        super::kernels::product_f16(
                            isa,
                            xg,
                            group,
                            k,
                            panel,
                            bias,
                            y0,
                            n,
                            rows.len(),
                            w,
                        )
                    }
                    _ => None,
                }
            };
            if done.is_some() {
                return;
            }
            let mut acc = [0f32; MB * PANEL];
            for i in 0..rows.len() {
                let row = &mut acc[i * PANEL..i * PANEL + w];
                match op.bias {
                    Some(b) => row.copy_from_slice(&b[c..c + w]),
                    None => row.fill(0.0),
                }
            }
            match panels {
                Panels::Bf16(pp, kernel) => {
                    // SAFETY: as at the packing above; shared reads only.
                    let xg: &[u32] =
                        unsafe { std::slice::from_raw_parts(xg.as_ptr().cast::<u32>(), xg.len()) };
                    let panel = &pp[p * panel_len + within..(p + 1) * panel_len];
                    let mut p0 = 0;
                    while p0 < k2 {
                        let kc2 = KC_PAIRS.min(k2 - p0);
                        bf16::accumulate(
                            kernel,
                            &xg[p0 * R..],
                            group,
                            kc2,
                            &panel[p0 * PANEL..],
                            &mut acc,
                            rows.len(),
                            w,
                        );
                        p0 += kc2;
                    }
                }
                Panels::F32(pp, isa, _) => {
                    let panel = &pp[p * panel_len + within..(p + 1) * panel_len];
                    let mut k0 = 0;
                    while k0 < k {
                        let kc = KC_F32.min(k - k0);
                        // SAFETY: `acc` holds rows.len() <= MB rows of 64 floats, a local
                        // buffer nothing else accesses; `accumulate` checks `x` and the panel.
                        unsafe {
                            super::kernels::accumulate(
                                isa,
                                &xg[k0 * R..],
                                group,
                                kc,
                                &panel[k0 * PANEL..],
                                acc.as_mut_ptr(),
                                PANEL,
                                rows.len(),
                                w,
                                None,
                            )
                        };
                        k0 += kc;
                    }
                }
            }
            for (i, r) in rows.clone().enumerate() {
                // SAFETY: task `t` alone writes rows `rows` × columns c .. c + w of the output
                // (the tasks partition rows × segments), r < m and c + w <= n, so the w
                // values lie inside the m · n of `y`, which outlives the loop.
                let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(r * n + c), w) };
                round_row(panels, &acc[i * PANEL..i * PANEL + w], dst);
            }
        };
        let tasks = row_blocks * segments.len();
        if parallel {
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
    });
    // SAFETY: the capacity is m · n, and the tasks, which partition the m × n output, each
    // wrote every element of their rectangle.
    unsafe { y.set_len(m * n) };
    y
}

/// Packs f16 or bf16 rows (`k` inputs each) into `f32` groups of [`R`], the f32
/// micro-kernel's layout: row `i`, input `kk` goes to `xp[(i / R) * R * k + kk * R + i % R]`.
fn pack_rows_f32(dtype: DType, rows: &[u16], k: usize, xp: &mut [f32]) {
    // Each row converted in bulk first (F16C for f16 when the CPU has it), then scattered.
    let mut buf = vec![0f32; k];
    for (group, dst) in rows.chunks(R * k).zip(xp.chunks_mut(R * k)) {
        for (i, row) in group.chunks_exact(k).enumerate() {
            if dtype == DType::BF16 {
                for (b, &v) in buf.iter_mut().zip(row) {
                    *b = bf16::bf16_to_f32(v);
                }
            } else {
                let row: &[half::f16] = row.reinterpret_cast();
                row.convert_to_f32_slice(&mut buf);
            }
            for (kk, &v) in buf.iter().enumerate() {
                dst[kk * R + i] = v;
            }
        }
    }
}

/// Rounds `src` (`f32`) to the output dtype (nearest even; NaN stays NaN) into `dst`.
fn round_row(panels: Panels, src: &[f32], dst: &mut [u16]) {
    match panels {
        Panels::Bf16(_, kernel) => bf16::round_row(kernel, src, dst),
        Panels::F32(_, _, DType::BF16) => bf16::round_row(bf16::Kernel::Portable, src, dst),
        Panels::F32(..) => {
            let dst: &mut [half::f16] = dst.reinterpret_cast_mut();
            dst.convert_from_f32_slice(src);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Multiples of 1/8 in [-1, 1]: exact in bf16 and f16, their products and sums exact in
    /// `f32`, so every output is the exact sum rounded once, whatever the summation order.
    pub(in crate::projection) fn exact(len: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                ((s % 17) as f32 - 8.0) / 8.0
            })
            .collect()
    }

    /// The driver with every kernel (so that Miri checks its index arithmetic through the
    /// portable ones) against the exact result, at the edges of the row blocks (72), the
    /// panels (64), the chunks (128 pairs, 512 inputs), the micro-tiles (6) and the pairs
    /// (odd `k`), with products starting inside a panel; bf16 and f16 both in one pass and in
    /// chunks (past 2048 and 1024 inputs).
    #[test]
    fn gemm_gives_the_exact_sum_rounded_once() {
        let shapes = [
            (1, 1, 1, 0),
            (7, 3, 17, 60),
            (5, 9, 70, 1),
            (73, 257, 65, 64),
            (13, 300, 130, 37),
            (8, 2 * SINGLE_PASS_PAIRS + 3, 70, 5),
            (3, SINGLE_PASS_F32 + 1, 20, 0),
        ];
        let shapes = if cfg!(miri) {
            &shapes[..3]
        } else {
            &shapes[..]
        };
        for &(m, k, n, col0) in shapes {
            let total = col0 + n + 3;
            let w = exact(total * k, 2 + n as u32); // W (total, k)
            let x = exact(m * k, 1 + m as u32);
            let b = exact(n, 3);
            let bf =
                |v: &[f32]| -> Vec<u16> { v.iter().map(|&v| (v.to_bits() >> 16) as u16).collect() };
            let f16 = |v: &[f32]| -> Vec<u16> {
                v.iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect()
            };
            let pairs = bf16::pack_weight_pairs(&bf(&w), total, k);
            let mut f32_panels = vec![0f32; total.div_ceil(PANEL) * k * PANEL];
            for (c, row) in w.chunks_exact(k).enumerate() {
                for (kk, &v) in row.iter().enumerate() {
                    f32_panels[(c / PANEL) * k * PANEL + kk * PANEL + c % PANEL] = v;
                }
            }
            let (xb, xh) = (bf(&x), f16(&x));
            for bias in [None, Some(&b[..])] {
                let exact_y = |i: usize, j: usize| {
                    let s: f32 = (0..k)
                        .map(|kk| x[i * k + kk] * w[(col0 + j) * k + kk])
                        .sum();
                    s + bias.map_or(0.0, |b| b[j])
                };
                let op = |x| Operands {
                    x,
                    m,
                    k,
                    col0,
                    n,
                    bias,
                };
                // (input, weight, whether bf16): bf16 on pair panels and on f32 panels (the
                // path of CPUs without AVX-512 BF16), f16 on f32 panels; portable kernels
                // (what Miri runs) and this CPU's.
                let mut cases = vec![
                    (&xb, Panels::Bf16(&pairs, Kernel::Portable), true),
                    (
                        &xb,
                        Panels::F32(&f32_panels, Isa::Portable, DType::BF16),
                        true,
                    ),
                    (
                        &xh,
                        Panels::F32(&f32_panels, Isa::Portable, DType::F16),
                        false,
                    ),
                ];
                // Under Miri `isas()` is the portable set only (no SIMD features).
                for isa in crate::simd::isas().into_iter().skip(1) {
                    cases.extend([
                        (&xb, Panels::Bf16(&pairs, Kernel::for_isa(isa)), true),
                        (&xb, Panels::F32(&f32_panels, isa, DType::BF16), true),
                        (&xh, Panels::F32(&f32_panels, isa, DType::F16), false),
                    ]);
                }
                let runs: Vec<(Vec<u16>, bool)> = cases
                    .into_iter()
                    .map(|(x, panels, is_bf16)| (gemm(&op(x), panels), is_bf16))
                    .collect();
                for (r, (y, is_bf16)) in runs.iter().enumerate() {
                    for i in 0..m {
                        for j in 0..n {
                            let e = exact_y(i, j);
                            let want = if *is_bf16 {
                                half::bf16::from_f32(e).to_bits()
                            } else {
                                half::f16::from_f32(e).to_bits()
                            };
                            assert_eq!(
                                y[i * n + j], want,
                                "run {r} m={m} k={k} n={n} col0={col0} bias={} at ({i}, {j}): exact {e}",
                                bias.is_some()
                            );
                        }
                    }
                }
            }
        }
    }

    /// Both packings of a bf16 weight give back the weight exactly, and the same products as
    /// each other (the f32 panels are what a CPU without AVX-512 BF16 multiplies).
    #[test]
    fn bf16_weight_packed_either_way_gives_the_same_answers() {
        let (out, k, m) = (70, 9, 8);
        let w = Tensor::from_vec(exact(out * k, 11), (out, k), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let x = Tensor::from_vec(exact(m * k, 12), (m, k), &Device::Cpu)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let wt = w.t().unwrap().to_dtype(DType::F32).unwrap();
        let mut ys = Vec::new();
        for pairs in [false, true] {
            let p = HalfPanels::pack_as(&w, pairs).unwrap();
            let back = p.transposed(3, 60).unwrap().to_dtype(DType::F32).unwrap();
            let want = wt.narrow(1, 3, 60).unwrap();
            assert_eq!(
                back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
            let y = p.linear(Isa::get(), &x, m, 3, 60, None).unwrap();
            ys.push(
                y.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            );
        }
        assert_eq!(ys[0], ys[1]);
    }
}

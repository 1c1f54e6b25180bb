//! Half-precision (`f16`, `bf16`) inputs of the tiled and decode kernels ([`super::tiled`]):
//! how their tiles are formed, never through a whole-tensor `f32` copy.
//!
//! * [`Kind::Bf16Dot`] (bf16 on a CPU with AVX-512 BF16): `Q·Kᵀ` and `P·V` run on bf16 with
//!   `vdpbf16ps` and `f32` accumulation ([`super::avx512_half`]): queries packed once per task,
//!   keys read in place, values packed per key block, probabilities rounded to bf16 per tile.
//! * [`Kind::F16`] and [`Kind::Bf16`] (bf16 without AVX-512 BF16, or `TiledConfig::half_dot`
//!   off): each key block's `K` and `V` rows, and each query block, are converted to `f32`
//!   when the task loads them (F16C-style `vcvtph2ps` on AVX-512, scalar elsewhere); the `f32`
//!   micro-kernels do the rest.
//!
//! **Rounding** (bf16 with `vdpbf16ps`): the inputs are already bf16, so products are exact
//! in `f32` and summed in `f32` (`vdpbf16ps` treats bf16 denormals as zero); the scores, the
//! softmax statistics (running maximum and sum) and the output accumulator stay `f32`; the
//! probabilities `P = 2^(s - m)` are rounded to bf16 (to nearest even, relative error at most
//! 2^-9) before `P·V`, as FlashAttention does, while the normalising sum uses the unrounded
//! `f32` values; the output is rounded to bf16 once at the end. The f16 path rounds nothing
//! but the output. Measured costs are in the README ("Accuracy").

use super::tile::BQ;
use crate::simd::Isa;
use candle::DType;
use half::vec::HalfBitsVecExt;

/// A CPU tensor of f16 (`f16`) or bf16 elements from their 16-bit patterns.
pub(crate) fn half_tensor(
    bits: Vec<u16>,
    f16: bool,
    shape: impl Into<candle::Shape>,
) -> candle::Result<candle::Tensor> {
    let dev = candle::Device::Cpu;
    if f16 {
        candle::Tensor::from_vec(bits.reinterpret_into::<half::f16>(), shape, &dev)
    } else {
        candle::Tensor::from_vec(bits.reinterpret_into::<half::bf16>(), shape, &dev)
    }
}

/// How a call's `Q`, `K` and `V` elements reach the micro-kernels. `Bf16Dot` and the AVX-512
/// conversions are only chosen by [`Kind::choose`] after the CPU checks they need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `f32` inputs, read in place.
    F32,
    /// `f16`, converted to `f32` per tile.
    F16,
    /// `bf16`, converted to `f32` per tile.
    Bf16,
    /// `bf16` with `vdpbf16ps` (AVX-512 BF16 detected, with AVX-512 BW and VL).
    Bf16Dot,
}

/// AVX-512 BW and VL (the 16-bit masked loads of the conversion and packing kernels), on
/// top of what [`Isa::Avx512`] checked.
#[cfg(target_arch = "x86_64")]
fn has_bw_vl() -> bool {
    is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl")
}

impl Kind {
    /// The path for inputs of `dtype` under `isa`: `Bf16Dot` for bf16 when `half_dot` is on,
    /// `isa` is AVX-512 and the CPU has AVX-512 BF16 (and BW, VL).
    pub(crate) fn choose(dtype: DType, isa: Isa, half_dot: bool) -> Kind {
        match dtype {
            DType::F16 => Kind::F16,
            DType::BF16 => {
                #[cfg(target_arch = "x86_64")]
                if half_dot
                    && isa == Isa::Avx512
                    && has_bw_vl()
                    && is_x86_feature_detected!("avx512bf16")
                {
                    return Kind::Bf16Dot;
                }
                let _ = (isa, half_dot);
                Kind::Bf16
            }
            _ => Kind::F32,
        }
    }

    /// Extra scratch floats a task needs for its key/value tiles with `block_k` keys: `f32`
    /// copies of `K` and `V` rows (converted kinds), or `V` packed in key pairs (`Bf16Dot`).
    pub(crate) fn tile_len(self, d: usize, dv: usize, block_k: usize) -> usize {
        match self {
            Kind::F32 => 0,
            // Also the query block's rows (64 × d) before they are transposed.
            Kind::F16 | Kind::Bf16 => block_k.max(BQ) * (d + dv),
            Kind::Bf16Dot => block_k.div_ceil(2) * dv.div_ceil(16) * 16,
        }
    }
}

/// Which conversion kernels run under `isa`: AVX-512 (with BW/VL, checked here), AVX2 + F16C
/// (also on AVX-512 without BW/VL), or none (plain loops).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Convert {
    Avx512,
    Avx2,
    Scalar,
}

#[cfg(target_arch = "x86_64")]
fn simd_convert(isa: Isa) -> Convert {
    match isa {
        Isa::Avx512 if has_bw_vl() => Convert::Avx512,
        Isa::Avx512 | Isa::Avx2 => Convert::Avx2,
        Isa::Portable => Convert::Scalar,
    }
}

/// One half-precision element (bits) as `f32`.
#[inline(always)]
fn to_f32(x: u16, f16: bool) -> f32 {
    if f16 {
        half::f16::from_bits(x).to_f32()
    } else {
        f32::from_bits(u32::from(x) << 16)
    }
}

/// Rows `r < rows` (`cols` elements at `src[r * ss ..]`) of f16 (`f16`) or bf16 bits as `f32`
/// into `dst[r * cols ..]`: a key or value tile as the `f32` micro-kernels read it.
pub(crate) fn convert_rows(
    isa: Isa,
    src: &[u16],
    ss: usize,
    rows: usize,
    cols: usize,
    f16: bool,
    dst: &mut [f32],
) {
    assert!(dst.len() >= rows * cols);
    assert!(rows == 0 || src.len() >= (rows - 1) * ss + cols);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    match simd_convert(isa) {
        Convert::Avx512 => {
            // SAFETY: AVX-512F (`Isa::Avx512`) and BW/VL (`simd_convert`) detected; the
            // lengths asserted above are `convert_rows`'s preconditions.
            return unsafe {
                super::avx512_half::convert_rows(
                    src.as_ptr(),
                    ss,
                    rows,
                    cols,
                    f16,
                    dst.as_mut_ptr(),
                )
            };
        }
        Convert::Avx2 => {
            // SAFETY: AVX2 and F16C detected (`Isa::Avx2` or `Isa::Avx512`); as above.
            return unsafe {
                super::avx2::convert_rows(src.as_ptr(), ss, rows, cols, f16, dst.as_mut_ptr())
            };
        }
        Convert::Scalar => {}
    }
    for r in 0..rows {
        for (o, &x) in dst[r * cols..(r + 1) * cols]
            .iter_mut()
            .zip(&src[r * ss..r * ss + cols])
        {
            *o = to_f32(x, f16);
        }
    }
}

/// The kernels' `f32` output rounded to f16 (`f16`) or bf16, to nearest even, as
/// `half::{f16, bf16}::from_f32` round (candle's `to_dtype` rounds with these): vectorised on
/// AVX-512, where candle's conversion is a scalar loop that cost a tenth of an f16 call.
pub(crate) fn round_to_half(isa: Isa, src: &[f32], f16: bool) -> Vec<u16> {
    let mut out = vec![0u16; src.len()];
    #[cfg(target_arch = "x86_64")]
    match simd_convert(isa) {
        Convert::Avx512 => {
            // SAFETY: AVX-512F (`Isa::Avx512`) and BW/VL (`simd_convert`) detected; `src` and
            // `out` hold `src.len()` elements each.
            unsafe {
                super::avx512_half::round_to_half(src.as_ptr(), src.len(), f16, out.as_mut_ptr())
            };
            return out;
        }
        Convert::Avx2 => {
            // SAFETY: AVX2 and F16C detected (`Isa::Avx2` or `Isa::Avx512`); as above.
            unsafe { super::avx2::round_to_half(src.as_ptr(), src.len(), f16, out.as_mut_ptr()) };
            return out;
        }
        Convert::Scalar => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for (o, &x) in out.iter_mut().zip(src) {
        *o = if f16 {
            half::f16::from_f32(x).to_bits()
        } else {
            half::bf16::from_f32(x).to_bits()
        };
    }
    out
}

/// The bf16 kernels of [`Kind::Bf16Dot`]: safe wrappers that check the lengths each kernel
/// relies on. Only reachable with a `Kind::Bf16Dot`, which [`Kind::choose`] returns only
/// after detecting AVX-512F/BW/VL and AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
pub(crate) mod dot {
    #![allow(clippy::too_many_arguments)]
    use super::{Kind, BQ};
    use crate::sdpa::cpu::avx512_half as k;

    /// Packs the query block for [`scores`]: word `p * BQ + i` = bf16 pair `(q[i][2p],
    /// q[i][2p + 1])`, into `qt` (`ceil(d / 2) * BQ` words used).
    pub(crate) fn pack_queries(
        kind: Kind,
        q: &[u16],
        qs: usize,
        nq: usize,
        d: usize,
        qt: &mut [f32],
    ) {
        assert!(kind == Kind::Bf16Dot);
        assert!(nq <= BQ && qt.len() >= d.div_ceil(2) * BQ);
        assert!(nq == 0 || q.len() >= (nq - 1) * qs + d);
        // SAFETY: `Kind::Bf16Dot` exists only after AVX-512F/BW/BF16 were detected; the
        // lengths asserted above are the kernel's preconditions.
        unsafe { k::pack_queries(q.as_ptr(), qs, nq, d, qt.as_mut_ptr()) }
    }

    /// `st[j * BQ + i] = c · q_i · k_j` for `j < nk`, `16 * nv` queries, keys (bf16 rows at
    /// stride `ks`) read in place.
    pub(crate) fn scores(
        kind: Kind,
        qt: &[f32],
        d: usize,
        kr: &[u16],
        ks: usize,
        nk: usize,
        st: &mut [f32],
        nv: usize,
        c: f32,
    ) {
        assert!(kind == Kind::Bf16Dot);
        assert!((1..=4).contains(&nv) && qt.len() >= d.div_ceil(2) * BQ && st.len() >= nk * BQ);
        assert!(nk == 0 || kr.len() >= (nk - 1) * ks + d);
        // SAFETY: AVX-512F/BF16 detected (`Kind::Bf16Dot`); lengths asserted above.
        unsafe { k::scores_bf16(qt.as_ptr(), d, kr.as_ptr(), ks, nk, st.as_mut_ptr(), nv, c) }
    }

    /// Packs the values of `nk` keys (bf16 rows at stride `vs`) in key pairs into `vp`.
    pub(crate) fn pack_values(
        kind: Kind,
        v: &[u16],
        vs: usize,
        nk: usize,
        dv: usize,
        vp: &mut [f32],
    ) {
        assert!(kind == Kind::Bf16Dot);
        assert!(vp.len() >= nk.div_ceil(2) * dv.div_ceil(16) * 16);
        assert!(nk == 0 || v.len() >= (nk - 1) * vs + dv);
        // SAFETY: AVX-512F/BW/VL detected (`Kind::Bf16Dot`); lengths asserted above.
        unsafe { k::pack_values(v.as_ptr(), vs, nk, dv, vp.as_mut_ptr()) }
    }

    /// The online-softmax step of the `f32` kernels (`m`, `l`, `alpha` as there) for a tile
    /// that goes to [`pv`]: the probabilities are rounded to bf16 and packed in key pairs in
    /// `st` itself.
    pub(crate) fn softmax_update(
        kind: Kind,
        st: &mut [f32],
        nk: usize,
        m: &mut [f32],
        l: &mut [f32],
        alpha: &mut [f32],
        nv: usize,
    ) {
        assert!(kind == Kind::Bf16Dot);
        assert!(nv <= 4 && st.len() >= nk * BQ);
        assert!(m.len() >= 16 * nv && l.len() >= 16 * nv && alpha.len() >= 16 * nv);
        // SAFETY: AVX-512F/BW/BF16 detected (`Kind::Bf16Dot`); lengths asserted above.
        unsafe {
            k::softmax_pack(
                st.as_mut_ptr(),
                nk,
                m.as_mut_ptr(),
                l.as_mut_ptr(),
                alpha.as_mut_ptr(),
                nv,
            )
        }
    }

    /// `P·V` from the probability tile `st` (rounded to bf16 and packed in key pairs by
    /// [`softmax_update`]) and the values packed by [`pack_values`]: as the `f32` `pv`.
    ///
    /// # Safety
    /// Rows `i < nq` of `o` (`dv` floats at `o + i * os`, `dv <= os` when `nq > 1`) are
    /// valid for reads and writes, and nothing else accesses them meanwhile.
    pub(crate) unsafe fn pv(
        kind: Kind,
        st: &[f32],
        nk: usize,
        vp: &[f32],
        dv: usize,
        o: *mut f32,
        os: usize,
        nq: usize,
        alpha: &[f32],
        first: bool,
    ) {
        assert!(kind == Kind::Bf16Dot);
        assert!(nq <= BQ && st.len() >= nk.div_ceil(2) * BQ && alpha.len() >= nq);
        assert!(nq <= 1 || dv <= os);
        assert!(vp.len() >= nk.div_ceil(2) * dv.div_ceil(16) * 16);
        // SAFETY: AVX-512F/BF16 detected (`Kind::Bf16Dot`); the packed tile (ceil(nk / 2) * BQ
        // words), `vp` and `alpha` lengths asserted, the rows of `o` are the caller's contract.
        k::pv_bf16(
            st.as_ptr(),
            nk,
            vp.as_ptr(),
            dv,
            o,
            os,
            nq,
            alpha.as_ptr(),
            first,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_follows_the_dtype_the_cpu_and_the_config() {
        let isa = Isa::get();
        assert_eq!(Kind::choose(DType::F32, isa, true), Kind::F32);
        assert_eq!(Kind::choose(DType::F16, isa, true), Kind::F16);
        assert_eq!(Kind::choose(DType::BF16, isa, false), Kind::Bf16);
        assert_eq!(Kind::choose(DType::BF16, Isa::Portable, true), Kind::Bf16);
        #[cfg(target_arch = "x86_64")]
        {
            let dot = isa == Isa::Avx512
                && is_x86_feature_detected!("avx512bf16")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl");
            let want = if dot { Kind::Bf16Dot } else { Kind::Bf16 };
            assert_eq!(Kind::choose(DType::BF16, isa, true), want);
        }
    }

    #[test]
    fn output_rounding_matches_the_half_crate_bit_for_bit() {
        let mut xs: Vec<f32> = (0..300).map(|i| (i as f32 - 150.0) * 0.3717).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -3e-39,
            6e-8,
            65519.0,
            65520.0,
            f32::MAX,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
        ]);
        for f16 in [false, true] {
            for isa in crate::simd::isas() {
                let got = round_to_half(isa, &xs, f16);
                for (x, g) in xs.iter().zip(got) {
                    let want = if f16 {
                        half::f16::from_f32(*x).to_bits()
                    } else {
                        half::bf16::from_f32(*x).to_bits()
                    };
                    if x.is_nan() {
                        let exp = if f16 { 0x7c00 } else { 0x7f80 };
                        assert!(g & exp == exp && g & !(exp | 0x8000) != 0, "{isa:?} NaN");
                    } else {
                        assert_eq!(g, want, "{isa:?} f16 {f16} x {x}");
                    }
                }
            }
        }
    }

    #[test]
    fn conversions_match_the_half_crate() {
        let f: Vec<f32> = (0..40).map(|i| (i as f32 - 18.0) * 0.731).collect();
        for f16 in [false, true] {
            let bits: Vec<u16> = f
                .iter()
                .map(|&x| {
                    if f16 {
                        half::f16::from_f32(x).to_bits()
                    } else {
                        half::bf16::from_f32(x).to_bits()
                    }
                })
                .collect();
            for isa in crate::simd::isas() {
                // Rows of 11 at stride 12 (a ragged 16-lane tail), of 19 at stride 19.
                for (rows, cols, ss) in [(3, 11, 12), (1, 37, 37), (2, 19, 19)] {
                    let mut out = vec![f32::NAN; rows * cols];
                    convert_rows(isa, &bits, ss, rows, cols, f16, &mut out);
                    for r in 0..rows {
                        for c in 0..cols {
                            let want = to_f32(bits[r * ss + c], f16);
                            assert_eq!(out[r * cols + c], want, "{isa:?}");
                        }
                    }
                }
            }
        }
    }
}

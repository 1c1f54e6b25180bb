//! The x86-64 int8 micro-tiles of `super::int8::Int8Kernel`: AVX2 (`vpmaddubsw` + `vpmaddwd`),
//! AVX-VNNI and AVX-512 VNNI (`vpdpbusd`). Each computes, for `rows` input rows and the 64
//! outputs of one weight panel, the exact `i32` sums `Σ_g Σ_j xq[i][4g + j] · w[g][c][j]`
//! (see `super::int8` for the operands and why each kernel forms them as it does).
//!
//! Register use: AVX-512, 6 rows × 4 `zmm` accumulators + 4 weight vectors + a broadcast
//! (29 of 32); AVX2 and AVX-VNNI, a panel in two halves of 32 outputs, 2 rows × 4 `ymm`
//! accumulators + 4 weight vectors + the broadcast and temporaries (16 of 16).

use super::tile::MAX_TILE_ROWS;
use crate::weights::int8::{INT8_GROUP, INT8_PANEL};
use std::arch::x86_64::*;

/// The CPU features the int8 kernels use, detected once.
#[derive(Clone, Copy, Debug)]
pub(super) struct Features {
    /// AVX2 (with the FMA and F16C the crate's AVX2 level requires).
    pub(super) avx2: bool,
    /// AVX-VNNI (256-bit `vpdpbusd`, VEX-encoded) with AVX2.
    pub(super) avxvnni: bool,
    /// AVX-512 F, BW and VNNI.
    pub(super) avx512vnni: bool,
}

/// What this CPU has, checked once.
pub(super) fn features() -> Features {
    static FEATURES: std::sync::OnceLock<Features> = std::sync::OnceLock::new();
    *FEATURES.get_or_init(|| {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        Features {
            avx2,
            avxvnni: avx2 && is_x86_feature_detected!("avxvnni"),
            avx512vnni: avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni"),
        }
    })
}

/// [`crate::weights::int8::quantize_row`] compiled for AVX2.
///
/// # Safety
/// AVX2 and FMA are available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row_avx2(row: &[f32], dst: &mut [u8], flip: u8) -> f32 {
    crate::weights::int8::quantize_row(row, dst, flip)
}

/// Bytes of one column group of a panel: 4 inputs of 64 outputs.
const GROUP_BYTES: usize = INT8_PANEL * INT8_GROUP;

/// The 4 input bytes of group `g` of row `i`, as one `i32` to broadcast.
///
/// # Safety
/// `xq + i · xs + 4 g .. + 4` is readable.
#[inline(always)]
unsafe fn input_group(xq: *const u8, xs: usize, i: usize, g: usize) -> i32 {
    xq.add(i * xs + g * INT8_GROUP)
        .cast::<i32>()
        .read_unaligned()
}

/// The 256-bit micro-tiles: `R` rows, one half (`h`: outputs `32 h .. 32 h + 32`) of the
/// panel, 4 accumulators a row; `$step` adds the products of the broadcast input bytes `$xb`
/// (and their magnitudes `$xa`, from `xa` laid out as `xq`) and the weight vector `$w` to the
/// accumulator `$acc`. Then the tile entry point, `rows`
/// (1 or 2) rows, both halves.
macro_rules! half_tiles {
    ($half:ident, $tile:ident, $features:literal, $what:literal,
     |$acc:ident, $xb:ident, $xa:ident, $w:ident| $step:expr) => {
        #[doc = concat!($what, " micro-tile, `R` rows, one half of the panel.")]
        ///
        /// # Safety
        #[doc = concat!($what, " is available; `xq` and `xa` hold `R` rows of `xs` bytes with")]
        /// `4 · groups` read each; `panel` holds `groups · 256` bytes.
        #[target_feature(enable = $features)]
        unsafe fn $half<const R: usize>(
            xq: *const u8,
            xa: *const u8,
            xs: usize,
            panel: *const i8,
            groups: usize,
            h: usize,
            acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
        ) {
            let mut c = [[_mm256_setzero_si256(); 4]; R];
            for g in 0..groups {
                let wp = panel.add(g * GROUP_BYTES + h * GROUP_BYTES / 2);
                let w: [__m256i; 4] =
                    std::array::from_fn(|j| _mm256_loadu_si256(wp.add(32 * j).cast()));
                for (i, ci) in c.iter_mut().enumerate() {
                    let $xb = _mm256_set1_epi32(input_group(xq, xs, i, g));
                    let $xa = _mm256_set1_epi32(input_group(xa, xs, i, g));
                    for (cj, &$w) in ci.iter_mut().zip(&w) {
                        let $acc = *cj;
                        *cj = $step;
                    }
                }
            }
            for (ci, a) in c.iter().zip(acc.iter_mut()) {
                for (j, v) in ci.iter().enumerate() {
                    _mm256_storeu_si256(a[h * 32 + j * 8..].as_mut_ptr().cast(), *v);
                }
            }
        }

        #[doc = concat!("The ", $what, " tile of `rows` (1 or 2) rows.")]
        ///
        /// # Safety
        #[doc = concat!($what, " is available; `xq` and `xa` hold `rows` rows of `xs` bytes with")]
        /// `4 · groups` read each; `panel` holds `groups · 256` bytes.
        pub(super) unsafe fn $tile(
            xq: *const u8,
            xa: *const u8,
            xs: usize,
            rows: usize,
            panel: *const i8,
            groups: usize,
            acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
        ) {
            for h in 0..2 {
                match rows {
                    1 => $half::<1>(xq, xa, xs, panel, groups, h, acc),
                    _ => $half::<2>(xq, xa, xs, panel, groups, h, acc),
                }
            }
        }
    };
}

// |x| · (sign(x) · w) = x · w, each factor within ±127: the pair sums of `vpmaddubsw` stay
// below 2 · 127² and never saturate; `vpmaddwd` by ones widens them. (`(w ^ m) - m` in place
// of `vpsignb` measured 12% slower: more instructions.)
half_tiles!(avx2_half, tile_avx2, "avx2", "AVX2", |acc, xb, xa, w| {
    let pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xb));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
});

// Inputs offset by 128: `vpdpbusd` multiplies unsigned by signed bytes.
half_tiles!(
    avxvnni_half,
    tile_avxvnni,
    "avx2,avxvnni",
    "AVX-VNNI",
    |acc, xb, _xa, w| _mm256_dpbusd_avx_epi32(acc, xb, w)
);

/// AVX-512 VNNI micro-tile, `R` rows, the whole panel; inputs offset by 128.
///
/// # Safety
/// AVX-512 F, BW and VNNI are available; the lengths as [`avx2_half`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn avx512vnni_tile<const R: usize>(
    xq: *const u8,
    xs: usize,
    panel: *const i8,
    groups: usize,
    acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
) {
    let mut c = [[_mm512_setzero_si512(); 4]; R];
    for g in 0..groups {
        let wp = panel.add(g * GROUP_BYTES);
        let w = [
            _mm512_loadu_si512(wp.cast()),
            _mm512_loadu_si512(wp.add(64).cast()),
            _mm512_loadu_si512(wp.add(128).cast()),
            _mm512_loadu_si512(wp.add(192).cast()),
        ];
        for (i, ci) in c.iter_mut().enumerate() {
            let xb = _mm512_set1_epi32(input_group(xq, xs, i, g));
            for (cj, &wj) in ci.iter_mut().zip(&w) {
                *cj = _mm512_dpbusd_epi32(*cj, xb, wj);
            }
        }
    }
    for (ci, a) in c.iter().zip(acc.iter_mut()) {
        for (j, v) in ci.iter().enumerate() {
            _mm512_storeu_si512(a[j * 16..].as_mut_ptr().cast(), *v);
        }
    }
}

/// The AVX-512 VNNI tile of `rows` (1 to 6) rows.
///
/// # Safety
/// AVX-512 F, BW and VNNI are available; the lengths as [`tile_avx2`].
pub(super) unsafe fn tile_avx512vnni(
    xq: *const u8,
    xs: usize,
    rows: usize,
    panel: *const i8,
    groups: usize,
    acc: &mut [[i32; INT8_PANEL]; MAX_TILE_ROWS],
) {
    match rows {
        1 => avx512vnni_tile::<1>(xq, xs, panel, groups, acc),
        2 => avx512vnni_tile::<2>(xq, xs, panel, groups, acc),
        3 => avx512vnni_tile::<3>(xq, xs, panel, groups, acc),
        4 => avx512vnni_tile::<4>(xq, xs, panel, groups, acc),
        5 => avx512vnni_tile::<5>(xq, xs, panel, groups, acc),
        _ => avx512vnni_tile::<6>(xq, xs, panel, groups, acc),
    }
}

//! The int8 quantization rule, value by value and row by row, and the constants of the panel
//! layout (a leaf: [`super::int8`] builds matrices with it, its x86 kernels
//! (`super::int8_x86`) and the int8 products' activation quantizer (`crate::projection`)
//! follow it bit for bit). The module documentation of [`super::int8`] gives the rule and the
//! layout.

/// Rows of `W` (outputs) per panel of an [`super::Int8Matrix`].
pub const INT8_PANEL: usize = 64;
/// Columns of `W` (inputs) per group of an [`super::Int8Matrix`]'s layout.
pub const INT8_GROUP: usize = 4;

/// The largest magnitude of `v` (0 for an empty slice), in 16 lanes so that it vectorises; a
/// NaN anywhere makes it NaN. (Written for the compiler's vectoriser: taken over the bits of
/// `|x|` as integers in plain Rust, the loop ran at half the speed, 81 vs 45 ms per 100 M
/// weights, AMD EPYC Zen 4, AVX-512, 2026-12-05. The x86 weight kernels do take integer
/// maxima of the bits, with intrinsics: `super::int8_x86`.)
#[inline(always)]
pub(crate) fn max_abs(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut nan = false;
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            nan |= x.is_nan();
            *l = l.max(x.abs());
        }
    }
    for &x in chunks.remainder() {
        nan |= x.is_nan();
        lanes[0] = lanes[0].max(x.abs());
    }
    if nan {
        return f32::NAN;
    }
    lanes.iter().fold(0f32, |a, &b| a.max(b))
}

/// The symmetric quantization of one row: its scale and `127 / max|v|` (0 for a zero row), or
/// `None` when the row holds a NaN or an infinity.
#[inline(always)]
pub(crate) fn row_scale(v: &[f32]) -> Option<(f32, f32)> {
    scale_for_max(max_abs(v))
}

/// The scale and `127 / amax` of a row whose largest magnitude is `amax` (0 and 0 for a zero
/// row), or `None` when `amax` is a NaN or an infinity.
#[inline(always)]
pub(crate) fn scale_for_max(amax: f32) -> Option<(f32, f32)> {
    if !amax.is_finite() {
        return None;
    }
    if amax == 0.0 {
        return Some((0.0, 0.0));
    }
    Some((amax / 127.0, 127.0 / amax))
}

/// `1.5 · 2²³`: added to a value in `-127 ..= 127`, it leaves no fraction bits, so the CPU
/// rounds the sum to the nearest integer (ties to even) and its bits are `0x4b40_0000 + q`.
pub(crate) const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// `round(v · inv)` (ties to even) clamped to `-127 ..= 127`, for a finite `v · inv`.
///
/// Clamped first, then rounded by adding 1.5 · 2²³ (the sum has no fraction bits left, and the
/// CPU rounds it to nearest even, on any target and at any vector width): the sum's
/// low mantissa bits are then `2²² + q`, whose low byte is `q` in two's complement. Read
/// from the bits rather than converted (`as i8`, a saturating conversion the compiler
/// performs one value at a time), so that the loop vectorises.
#[inline(always)]
pub(crate) fn quantize_value(v: f32, inv: f32) -> i8 {
    ((v * inv).clamp(-127.0, 127.0) + ROUNDING_MAGIC).to_bits() as u8 as i8
}

/// Quantizes one row: `dst` gets its bytes (`q`, or `q + 128` as a byte when `flip` is
/// 0x80), the result is its scale (NaN for a row with a NaN or an infinity, whose bytes are
/// left as they are). Inlined into each kernel level's wrapper (`crate::projection`), so that it vectorises
/// for it.
#[inline(always)]
pub(crate) fn quantize_row(row: &[f32], dst: &mut [u8], flip: u8) -> f32 {
    match row_scale(row) {
        Some((s, inv)) => {
            for (d, &v) in dst.iter_mut().zip(row) {
                // `q + 128` as a byte is `q`'s bits with the top one flipped.
                *d = quantize_value(v, inv) as u8 ^ flip;
            }
            s
        }
        None => f32::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_abs_is_the_largest_magnitude_or_nan() {
        let mut v: Vec<f32> = (0..37).map(|i| (i as f32 - 20.0) / 3.0).collect();
        assert_eq!(max_abs(&v), 20.0 / 3.0);
        assert_eq!(max_abs(&[]), 0.0);
        assert_eq!(max_abs(&[-0.0]), 0.0);
        v[35] = f32::NEG_INFINITY;
        assert_eq!(max_abs(&v), f32::INFINITY);
        for at in [3, 36] {
            let mut w = v.clone();
            w[at] = -f32::NAN;
            assert!(max_abs(&w).is_nan(), "NaN at {at}");
            assert!(row_scale(&w).is_none());
        }
        assert!(row_scale(&v).is_none());
    }
}

//! Masked AVX-512 loads and stores: how the micro-kernels of the tiled attention
//! (`crate::sdpa::avx512`) and of the projection GEMM (`crate::projection::avx512`) touch the
//! last, partial vector of a row without reading or writing past it.
//!
//! Both are `unsafe` and `#[inline(always)]` into callers compiled with
//! `#[target_feature(enable = "avx512f")]`; those callers are only reached through
//! [`super::Isa::Avx512`], which exists only after `is_x86_feature_detected!("avx512f")`.

use core::arch::x86_64::*;

/// `p[..16]`, or only the lanes of `tail` (the others zero, not read) when `masked`.
///
/// # Safety
/// AVX-512F available; the lanes read are readable.
#[inline(always)]
pub(crate) unsafe fn load(masked: bool, tail: __mmask16, p: *const f32) -> __m512 {
    if masked {
        _mm512_maskz_loadu_ps(tail, p)
    } else {
        _mm512_loadu_ps(p)
    }
}

/// `p[..16] = a`, or only the lanes of `tail` (the others untouched) when `masked`.
///
/// # Safety
/// AVX-512F available; the lanes written are writable.
#[inline(always)]
pub(crate) unsafe fn store(masked: bool, tail: __mmask16, p: *mut f32, a: __m512) {
    if masked {
        _mm512_mask_storeu_ps(p, tail, a)
    } else {
        _mm512_storeu_ps(p, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked load reads only the lanes of the mask and zeroes the rest; a masked store
    /// writes only those lanes. The buffers are exactly as long as the lanes touched, so an
    /// out-of-bounds access would show under AddressSanitizer (scripts/sanitize.sh).
    #[test]
    fn masked_loads_and_stores_touch_only_the_tail() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for n in 1..16usize {
            let tail: __mmask16 = ((1u32 << n) - 1) as u16;
            let src: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            let mut dst = vec![-1.0f32; n];
            let mut lanes = [0f32; 16];
            // SAFETY: AVX-512F was detected above; the mask covers exactly the `n` lanes
            // `src` and `dst` hold, and `lanes` is 16 floats for the unmasked store.
            unsafe {
                let v = load(true, tail, src.as_ptr());
                _mm512_storeu_ps(lanes.as_mut_ptr(), v);
                store(true, tail, dst.as_mut_ptr(), _mm512_add_ps(v, v));
            }
            assert_eq!(&lanes[..n], src.as_slice());
            assert!(
                lanes[n..].iter().all(|&x| x == 0.0),
                "lanes past the tail are zero"
            );
            let doubled: Vec<f32> = src.iter().map(|x| 2.0 * x).collect();
            assert_eq!(dst, doubled);
        }
        let full: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let mut out = [0f32; 16];
        // SAFETY: AVX-512F was detected above; both buffers hold 16 floats.
        unsafe { store(false, 0, out.as_mut_ptr(), load(false, 0, full.as_ptr())) };
        assert_eq!(out.as_slice(), full.as_slice());
    }
}

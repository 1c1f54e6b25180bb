//! The scalar building blocks every kernel's vector code follows: the `2^x` polynomials and
//! the portable [`fma`] (a leaf).

/// Coefficients (highest degree first) of the polynomial approximating `2^f` on
/// `[-0.5, 0.5]`, relative error 2.2e-9 (least squares on Chebyshev nodes).
pub(crate) const EXP2_POLY: [f32; 7] = [
    1.537_071_6e-4,
    1.339_985_8e-3,
    9.618_374e-3,
    5.550_329e-2,
    0.240_226_49,
    std::f32::consts::LN_2,
    1.0,
];

/// `2^x` with [`EXP2_POLY`], branch-free, for the portable kernels (the compiler vectorises
/// loops of it); `0` for `x < -126.5` (including `-inf`), NaN for NaN. `FMA`: fused
/// multiply-adds (only in code compiled with the `fma` target feature).
#[inline(always)]
pub(crate) fn exp2<const FMA: bool>(x: f32) -> f32 {
    let x = x.clamp(-127.0, 127.0);
    let n = (x + 12_582_912.0) - 12_582_912.0; // round to nearest
    let f = x - n;
    let c = EXP2_POLY;
    let mut p = c[0];
    for &ci in &c[1..] {
        p = fma::<FMA>(p, f, ci);
    }
    // n = -127 gives the bit pattern of +0.0.
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Coefficients (highest degree first) of a degree-4 polynomial approximating `2^f` on
/// `[-0.5, 0.5]`, relative error 3.1e-6 and exactly 1 at 0 (least squares on Chebyshev nodes,
/// weighted by `2^-f`): for probabilities that are rounded to bf16 (relative error up to 2^-9 = 2e-3)
/// before they are used, where [`EXP2_POLY`]'s precision would be rounded away.
pub(crate) const EXP2_POLY_BF16: [f32; 5] = [
    9.600_395e-3,
    5.591_689_4e-2,
    0.240_237_19,
    0.693_121_97,
    1.0,
];

/// `a · b + c`, fused (one rounding) when `FMA`: only use `FMA = true` in code compiled with
/// the `fma` target feature, where it is a single instruction (a libm call otherwise).
#[inline(always)]
pub(crate) fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// bf16 bits of `v` rounded to nearest even (a quiet NaN for NaN; values below bf16's normal
/// range kept, as torch and `half::bf16::from_f32` round), branch free, so that a loop of
/// them vectorises.
#[inline(always)]
pub(crate) fn round_bf16(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if v.is_nan() {
        ((b >> 16) as u16) | 0x40
    } else {
        rounded
    }
}

//! bf16 (and f16) through the tiled and decode kernels against the naive kernel in `f32` on the
//! same half-precision values: random shapes with ragged tails (query and key counts that are
//! not multiples of the 64-query block or of `block_k`, odd key counts that leave a half key
//! pair, head sizes that are not multiples of 32 or even of 2), every mask kind (causal,
//! padding, boolean, additive, fully masked rows), with the AVX-512 BF16 dot-product kernels
//! (where the CPU has them), the per-tile conversions and the `f32` kernels at every
//! instruction set the process can run (`testing::available_isas`).
//!
//! The bound is derived, not tuned: the kernels' result is rounded once to the input dtype
//! (half an ulp: `u · |y|`, unit roundoff `u` = 2^-8 for bf16, 2^-11 for f16), and with
//! `vdpbf16ps` every softmax probability is rounded to bf16 before `P·V` (relative `2^-8`
//! each; the output is a convex combination of value rows, so at most `2^-8 · max |v|`).
//! The `f32` arithmetic adds a few `1e-6`.

use candle::{DType, Device, Tensor};
use candle_attention::testing::decompose;
use candle_attention::testing::sdpa::few_queries;
use candle_attention::testing::sdpa::tiled::{self, TiledConfig, BQ};
use candle_attention::testing::{available_isas, IsaLevel, MaskParts};
use candle_attention::{scaled_dot_product_attention, SdpaArgs};
use candle_attention::{AttentionShape, Mask};
use proptest::prelude::*;

#[path = "common/random_masks.rs"]
mod random_masks;
use random_masks::{build_mask, mask_kind, MaskKind, Rng};

#[derive(Debug, Clone)]
struct Case {
    b: usize,
    h: usize,
    l: usize,
    s: usize,
    d: usize,
    dv: usize,
    block_k: usize,
    kinds: Vec<MaskKind>,
    seed: u64,
    isa: IsaLevel,
    half_dot: bool,
    f16: bool,
}

/// Lengths around `block` (1, block ± 1, 2 block + 1) and anything below 200.
fn len_strategy(block: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        proptest::sample::select(vec![
            1,
            block.saturating_sub(1).max(1),
            block + 1,
            2 * block + 1
        ]),
        1usize..200,
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        proptest::sample::select(vec![1usize, 7, 16, 128]),
        any::<u64>(),
    )
        .prop_flat_map(|(block_k, seed)| {
            (
                1usize..3,
                1usize..3,
                len_strategy(BQ),
                len_strategy(block_k),
                proptest::sample::select(vec![1usize, 2, 7, 31, 33, 64, 80]),
                proptest::sample::select(vec![1usize, 5, 17, 64, 65, 96]),
                proptest::collection::vec(mask_kind(), 0..3),
                (
                    proptest::sample::select(available_isas()),
                    any::<bool>(),
                    proptest::bool::weighted(0.2),
                ),
            )
                .prop_map(move |(b, h, l, s, d, dv, kinds, (isa, half_dot, f16))| {
                    Case {
                        b,
                        h,
                        l,
                        s,
                        d,
                        dv,
                        block_k,
                        kinds,
                        seed,
                        isa,
                        half_dot: half_dot || isa != IsaLevel::Avx512,
                        f16,
                    }
                })
        })
}

/// Half-precision `q`, `k`, `v`, their `f32` copies (the same values) and a mask.
fn inputs(c: &Case, rng: &mut Rng) -> ([Tensor; 3], [Tensor; 3], Mask) {
    let dtype = if c.f16 { DType::F16 } else { DType::BF16 };
    let half = [
        rng.tensor(&[c.b, c.h, c.l, c.d], 1.0),
        rng.tensor(&[c.b, c.h, c.s, c.d], 1.0),
        rng.tensor(&[c.b, c.h, c.s, c.dv], 1.0),
    ]
    .map(|t| t.to_dtype(dtype).unwrap());
    let full = half.clone().map(|t| t.to_dtype(DType::F32).unwrap());
    let shape = AttentionShape {
        batch: c.b,
        heads: c.h,
        q_len: c.l,
        k_len: c.s,
    };
    (half, full, build_mask(&c.kinds, shape, rng))
}

/// The naive kernel in `f32` (it is what `need_weights` selects).
fn reference(qkv: &[Tensor; 3], mask: &Mask) -> Tensor {
    let args = SdpaArgs {
        mask: mask.clone(),
        scale: None,
        need_weights: true,
        dropout: 0.0,
    };
    scaled_dot_product_attention(&qkv[0], &qkv[1], &qkv[2], &args)
        .unwrap()
        .output
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Checks `got` (half) against `want` (`f32`) under the bound of the module documentation;
/// rows the reference gives as exactly zero (fully masked) must be exactly zero.
fn check(
    c: &Case,
    got: &Tensor,
    want: &Tensor,
    v: &Tensor,
    what: &str,
) -> Result<(), TestCaseError> {
    let dtype = if c.f16 { DType::F16 } else { DType::BF16 };
    prop_assert_eq!(got.dtype(), dtype);
    let u = if c.f16 { 2f32.powi(-11) } else { 2f32.powi(-8) };
    let vmax = flat(v).iter().fold(0f32, |m, x| m.max(x.abs()));
    let dv = c.dv;
    let (g, w) = (flat(got), flat(want));
    for (row, (gr, wr)) in g.chunks(dv).zip(w.chunks(dv)).enumerate() {
        if wr.iter().all(|&x| x == 0.0) {
            prop_assert!(
                gr.iter().all(|&x| x == 0.0),
                "{what}: row {row} should be zeros, got {gr:?} for {c:?}"
            );
            continue;
        }
        for (x, y) in gr.iter().zip(wr) {
            let tol = u * y.abs() + u * vmax + 1e-5;
            prop_assert!(
                (x - y).abs() <= tol,
                "{what}: row {row}: {x} vs {y} (tol {tol}) for {c:?}"
            );
        }
    }
    Ok(())
}

/// Case `c` through `kernel` (the tiled or decode kernel's `attention_with`) on its half
/// inputs, checked against the naive `f32` kernel on the same values.
fn check_kernel(
    c: &Case,
    name: &str,
    kernel: fn(&Tensor, &Tensor, &Tensor, &MaskParts, f64, &TiledConfig) -> candle::Result<Tensor>,
) -> Result<(), TestCaseError> {
    let mut rng = Rng(c.seed);
    let (half, full, mask) = inputs(c, &mut rng);
    let want = reference(&full, &mask);
    let cfg = TiledConfig {
        block_k: Some(c.block_k),
        isa: Some(c.isa),
        half_dot: c.half_dot,
        ..Default::default()
    };
    let shape = AttentionShape {
        batch: c.b,
        heads: c.h,
        q_len: c.l,
        k_len: c.s,
    };
    let parts = decompose(&mask, shape, &Device::Cpu).unwrap();
    let scale = 1.0 / (c.d as f64).sqrt();
    let got = kernel(&half[0], &half[1], &half[2], &parts, scale, &cfg).unwrap();
    check(c, &got, &want, &full[2], name)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The tiled kernel on half inputs within the derived bound of the `f32` naive kernel.
    #[test]
    fn tiled_half_matches_naive_f32(c in case_strategy()) {
        check_kernel(&c, "tiled", tiled::attention_with)?;
    }

    /// The decode kernel (few queries, keys split across tasks) likewise.
    #[test]
    fn decode_half_matches_naive_f32(c in case_strategy(), l in 1usize..=few_queries::MAX_QUERIES, s in 1usize..1500) {
        check_kernel(&Case { l, s, ..c }, "decode", few_queries::attention_with)?;
    }
}

/// Strided half inputs (views of `(B, L, H, D)`, what a projection gives) are read in place
/// and agree with their contiguous copies exactly (the same tiles, the same arithmetic).
#[test]
fn strided_half_inputs_match_contiguous() {
    let mut rng = Rng(17);
    let (b, h, l, s, d) = (2, 3, 70, 45, 24);
    for dtype in [DType::BF16, DType::F16] {
        let t = |rng: &mut Rng, n| {
            rng.tensor(&[b, n, h, d], 1.0)
                .to_dtype(dtype)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
        };
        let (q, k, v) = (t(&mut rng, l), t(&mut rng, s), t(&mut rng, s));
        assert!(!q.is_contiguous());
        let shape = AttentionShape {
            batch: b,
            heads: h,
            q_len: l,
            k_len: s,
        };
        let parts = decompose(&Mask::causal_with_offset(1), shape, &Device::Cpu).unwrap();
        let got = tiled::attention(&q, &k, &v, &parts, 0.2).unwrap();
        let c = |t: &Tensor| t.contiguous().unwrap();
        let want = tiled::attention(&c(&q), &c(&k), &c(&v), &parts, 0.2).unwrap();
        assert_eq!(flat(&got), flat(&want), "{dtype:?}");
    }
}

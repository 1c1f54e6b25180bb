//! The device-generic blocked kernel (`sdpa::blocked`, what CUDA and Metal use) against the
//! naive reference: random shapes and block sizes (block boundaries included), every kind of
//! mask and their combinations, causal offsets, fully masked rows, grouped-query attention,
//! strided inputs (a KV cache's view into its buffer), half precision and `f64`.
//!
//! The blocked kernel runs on the test device (`ATTN_TEST_DEVICE`, CPU by default; see
//! `tests/common`), the reference is the naive kernel on the CPU in `f32` (`f64` for `f64`).
//! Tolerances: `common::tolerance` (1e-5 for `f32` on the CPU).

mod common;

use candle::{DType, Device, Tensor};
use candle_attention::testing::decompose;
use candle_attention::testing::sdpa::blocked::{self, BlockedConfig};
use candle_attention::testing::sdpa::naive;
use candle_attention::{scaled_dot_product_attention, SdpaArgs};
use candle_attention::{AttentionShape, Mask};
use common::{max_abs_diff, test_device, tolerance};
use proptest::prelude::*;

// Shared with the other kernel's property test (proptest is a dev-dependency of this package
// only, so it is not part of `common`, which attn-cli's tests include too).
#[path = "common/random_masks.rs"]
mod random_masks;
use random_masks::{build_mask, mask_kind, MaskKind, Rng};

#[derive(Debug, Clone)]
struct Case {
    b: usize,
    hkv: usize,
    group: usize,
    l: usize,
    s: usize,
    d: usize,
    dv: usize,
    block_q: Option<usize>,
    block_k: Option<usize>,
    kinds: Vec<MaskKind>,
    scale: Option<f64>,
    seed: u64,
}

impl Case {
    fn shape(&self) -> AttentionShape {
        AttentionShape {
            batch: self.b,
            heads: self.hkv * self.group,
            q_len: self.l,
            k_len: self.s,
        }
    }
    fn scale(&self) -> f64 {
        self.scale.unwrap_or(1.0 / (self.d as f64).sqrt())
    }
    fn cfg(&self) -> BlockedConfig {
        BlockedConfig {
            block_q: self.block_q,
            block_k: self.block_k,
        }
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        (1usize..3, 1usize..3, 1usize..4),
        prop_oneof![1usize..8, 8usize..80],
        prop_oneof![1usize..8, 8usize..100],
        proptest::sample::select(vec![1usize, 4, 8, 16, 33]),
        proptest::sample::select(vec![1usize, 5, 16]),
        proptest::option::of(1usize..40),
        proptest::option::of(1usize..40),
        proptest::collection::vec(mask_kind(), 0..4),
        proptest::option::of(0.05f64..0.6),
        any::<u64>(),
    )
        .prop_map(
            |((b, hkv, group), l, s, d, dv, block_q, block_k, kinds, scale, seed)| Case {
                b,
                hkv,
                group,
                l,
                s,
                d,
                dv,
                block_q,
                block_k,
                kinds,
                scale,
                seed,
            },
        )
}

/// `q`, `k`, `v` on the CPU in `f32`, and the mask.
fn inputs(c: &Case) -> (Tensor, Tensor, Tensor, Mask) {
    let mut rng = Rng(c.seed);
    let q = rng.tensor(&[c.b, c.hkv * c.group, c.l, c.d], 1.0);
    let k = rng.tensor(&[c.b, c.hkv, c.s, c.d], 1.0);
    let v = rng.tensor(&[c.b, c.hkv, c.s, c.dv], 1.0);
    let mask = build_mask(&c.kinds, c.shape(), &mut rng);
    (q, k, v, mask)
}

/// The naive kernel on the CPU, in the dtype of `q`.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, c: &Case) -> Tensor {
    let bias = mask.to_bias(c.shape(), &Device::Cpu).unwrap();
    naive::attention(q, k, v, bias.as_ref(), c.scale(), 0.0, false)
        .unwrap()
        .0
}

/// The blocked kernel on `dev` for inputs given on the CPU, its output back on the CPU.
fn blocked_on(dev: &Device, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, c: &Case) -> Tensor {
    let (q, k, v) = (
        q.to_device(dev).unwrap(),
        k.to_device(dev).unwrap(),
        v.to_device(dev).unwrap(),
    );
    let parts = decompose(mask, c.shape(), dev).unwrap();
    blocked::attention_with(&q, &k, &v, &parts, c.scale(), &c.cfg())
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Blocked (any block sizes, on the test device) equals naive in `f32`.
    #[test]
    fn blocked_matches_naive_f32(c in case_strategy()) {
        let dev = test_device();
        let (q, k, v, mask) = inputs(&c);
        let want = reference(&q, &k, &v, &mask, &c);
        let got = blocked_on(&dev, &q, &k, &v, &mask, &c);
        let err = max_abs_diff(&got, &want);
        prop_assert!(err <= tolerance(DType::F32, &dev), "max abs error {err} for {c:?}");
    }

    /// Half precision: the blocked kernel on inputs rounded to f16/bf16 against the f32
    /// reference on the same rounded values.
    #[test]
    fn blocked_half_precision_is_close(c in case_strategy(), bf16 in any::<bool>()) {
        let dev = test_device();
        let dtype = if bf16 { DType::BF16 } else { DType::F16 };
        let (q, k, v, mask) = inputs(&c);
        let round = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let (qh, kh, vh) = (round(&q), round(&k), round(&v));
        let up = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let want = reference(&up(&qh), &up(&kh), &up(&vh), &mask, &c);
        let got = blocked_on(&dev, &qh, &kh, &vh, &mask, &c);
        prop_assert_eq!(got.dtype(), dtype);
        let err = max_abs_diff(&got, &want);
        prop_assert!(err <= tolerance(dtype, &dev), "{dtype:?} max abs error {err} for {c:?}");
    }
}

/// `f64` (what the CPU tiled kernels do not take) stays in `f64` and matches naive closely.
#[test]
fn f64_matches_naive() {
    let dev = test_device();
    if !dev.is_cpu() && !dev.is_cuda() {
        return; // Metal has no f64.
    }
    let c = Case {
        b: 2,
        hkv: 2,
        group: 2,
        l: 37,
        s: 53,
        d: 8,
        dv: 5,
        block_q: Some(16),
        block_k: Some(16),
        kinds: vec![MaskKind::Causal(3), MaskKind::KeyPadding],
        scale: None,
        seed: 7,
    };
    let (q, k, v, mask) = inputs(&c);
    let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let want = reference(&f(&q), &f(&k), &f(&v), &mask, &c);
    let got = blocked_on(&dev, &f(&q), &f(&k), &f(&v), &mask, &c);
    assert_eq!(got.dtype(), DType::F64);
    let err = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(err <= tolerance(DType::F64, &dev) as f64, "{err}");
}

/// Fully masked rows give zeros (never NaN), whatever block they fall in.
#[test]
fn fully_masked_rows_are_zero() {
    let dev = test_device();
    let c = Case {
        b: 2,
        hkv: 1,
        group: 3,
        l: 9,
        s: 11,
        d: 4,
        dv: 3,
        block_q: Some(4),
        block_k: Some(3),
        kinds: vec![],
        scale: None,
        seed: 3,
    };
    let (q, k, v, _) = inputs(&c);
    // Batch row 1 is all padding; query rows 2 and 7 block every key.
    let mut pad = vec![0u8; 2 * 11];
    pad[11..].fill(1);
    let mut rows = vec![0u8; 9 * 11];
    for r in [2usize, 7] {
        rows[r * 11..(r + 1) * 11].fill(1);
    }
    let mask = Mask::key_padding(Tensor::from_vec(pad, (2, 11), &Device::Cpu).unwrap())
        .unwrap()
        .and(Mask::boolean(Tensor::from_vec(rows, (9, 11), &Device::Cpu).unwrap()).unwrap());
    let got = blocked_on(&dev, &q, &k, &v, &mask, &c);
    let want = reference(&q, &k, &v, &mask, &c);
    assert!(max_abs_diff(&got, &want) <= tolerance(DType::F32, &dev));
    // (b, h, l, dv) = (2, 3, 9, 3): row (bi, hi, li) starts at ((bi * 3 + hi) * 9 + li) * 3.
    let flat: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
    let row = |bi: usize, hi: usize, li: usize| {
        let at = ((bi * 3 + hi) * 9 + li) * 3;
        &flat[at..at + 3]
    };
    for hi in 0..3 {
        for li in 0..9 {
            assert!(row(1, hi, li).iter().all(|&x| x == 0.0), "padded batch row");
        }
        assert!(row(0, hi, 2).iter().chain(row(0, hi, 7)).all(|&x| x == 0.0));
        assert!(row(0, hi, 0).iter().any(|&x| x != 0.0));
    }
}

/// A KV cache's view `(B, H, len, D)` into its `(B, H, capacity, D)` buffer, and heads split
/// out of a `(B, S, H, D)` projection, give the same answer as contiguous copies.
#[test]
fn strided_inputs_match_contiguous_ones() {
    let dev = test_device();
    let c = Case {
        b: 2,
        hkv: 2,
        group: 2,
        l: 1,
        s: 21,
        d: 8,
        dv: 8,
        block_q: None,
        block_k: Some(8),
        kinds: vec![MaskKind::Causal(20), MaskKind::KeyPadding],
        scale: None,
        seed: 11,
    };
    let (q, k, v, mask) = inputs(&c);
    let want = reference(&q, &k, &v, &mask, &c);
    let pad = |t: &Tensor| {
        let extra = Tensor::zeros((2, 2, 11, t.dim(3).unwrap()), DType::F32, &Device::Cpu).unwrap();
        Tensor::cat(&[t, &extra], 2)
            .unwrap()
            .to_device(&dev)
            .unwrap()
    };
    let (kbuf, vbuf) = (pad(&k), pad(&v));
    let (kview, vview) = (
        kbuf.narrow(2, 0, 21).unwrap(),
        vbuf.narrow(2, 0, 21).unwrap(),
    );
    assert!(!kview.is_contiguous());
    let parts = decompose(&mask, c.shape(), &dev).unwrap();
    let q_dev = q.to_device(&dev).unwrap();
    let got = blocked::attention_with(&q_dev, &kview, &vview, &parts, c.scale(), &c.cfg())
        .unwrap()
        .to_device(&Device::Cpu)
        .unwrap();
    assert!(max_abs_diff(&got, &want) <= tolerance(DType::F32, &dev));
    // Heads split out of (B, S, H, D).
    let split = |t: &Tensor| {
        t.transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap()
            .to_device(&dev)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
    };
    let got = blocked::attention_with(
        &split(&q),
        &split(&k),
        &split(&v),
        &parts,
        c.scale(),
        &c.cfg(),
    )
    .unwrap()
    .to_device(&Device::Cpu)
    .unwrap();
    assert!(max_abs_diff(&got, &want) <= tolerance(DType::F32, &dev));
}

/// `scaled_dot_product_attention` on the test device equals the CPU reference (on the CPU it
/// takes the tiled kernels, elsewhere the blocked one), and asking for weights still works.
#[test]
fn dispatch_on_the_test_device() {
    let dev = test_device();
    let c = Case {
        b: 2,
        hkv: 2,
        group: 2,
        l: 70,
        s: 90,
        d: 16,
        dv: 16,
        block_q: None,
        block_k: None,
        kinds: vec![
            MaskKind::Causal(20),
            MaskKind::KeyPadding,
            MaskKind::AdditiveBroadcast,
        ],
        scale: None,
        seed: 5,
    };
    let (q, k, v, mask) = inputs(&c);
    let want = reference(&q, &k, &v, &mask, &c);
    let (qd, kd, vd) = (
        q.to_device(&dev).unwrap(),
        k.to_device(&dev).unwrap(),
        v.to_device(&dev).unwrap(),
    );
    for need_weights in [false, true] {
        let args = SdpaArgs {
            mask: mask.clone(),
            need_weights,
            ..Default::default()
        };
        let out = scaled_dot_product_attention(&qd, &kd, &vd, &args).unwrap();
        assert_eq!(out.weights.is_some(), need_weights);
        let got = out.output.to_device(&Device::Cpu).unwrap();
        let err = max_abs_diff(&got, &want);
        assert!(err <= tolerance(DType::F32, &dev), "{need_weights}: {err}");
    }
}

/// Bad block sizes are an error that names them.
#[test]
fn zero_block_sizes_are_refused() {
    let q = Tensor::zeros((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
    let parts = decompose(
        &Mask::none(),
        AttentionShape {
            batch: 1,
            heads: 1,
            q_len: 4,
            k_len: 4,
        },
        &Device::Cpu,
    )
    .unwrap();
    let err = blocked::attention_with(&q, &q, &q, &parts, 1.0, &BlockedConfig::new(0, 2))
        .unwrap_err()
        .to_string();
    assert!(err.contains("block_q"), "{err}");
}

//! Mask construction from arbitrary shapes and dtypes, then attention under it, on both
//! kernels: the memory-efficient one (what inference uses) and the naive one (what computes
//! weights and gradients).
//!
//! Invariants: no panic; a mask either fits `(B, H, L, S)` or is refused; the two kernels
//! agree element for element (NaN only where both give NaN, as from a NaN or `+inf` in an
//! additive mask, which torch propagates too).

use candle::{DType, Device, Tensor};
use candle_attention::testing::decompose;
use candle_attention::{scaled_dot_product_attention, AttentionShape, Mask, SdpaArgs};

/// Reads bytes in order; zeros once exhausted.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

const DTYPES: [DType; 6] = [
    DType::U8,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::U32,
];

/// A tensor of arbitrary rank (0..=4), dims (0..=6), dtype and values.
fn tensor(b: &mut Bytes, dev: &Device) -> Tensor {
    let dtype = DTYPES[b.byte() as usize % DTYPES.len()];
    let rank = b.byte() as usize % 5;
    let dims: Vec<usize> = (0..rank).map(|_| b.byte() as usize % 7).collect();
    let n: usize = dims.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|_| match b.byte() {
            0 => f32::NEG_INFINITY,
            1 => f32::INFINITY,
            2 => f32::NAN,
            3 => -1e30,
            v if dtype == DType::U8 => (v & 1) as f32,
            v => (v as f32 - 128.0) / 16.0,
        })
        .collect();
    let t = Tensor::from_vec(values, dims, dev).unwrap();
    match dtype {
        // Casting non-finite floats to integers is saturating/zero in Rust; fine for a mask.
        DType::F32 => t,
        dt => t.to_dtype(dt).unwrap(),
    }
}

fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    weights: bool,
) -> candle::Result<Tensor> {
    let args = SdpaArgs {
        mask: mask.clone(),
        need_weights: weights,
        ..SdpaArgs::default()
    };
    Ok(scaled_dot_product_attention(q, k, v, &args)?.output)
}

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let dev = Device::Cpu;
    let mut b = Bytes(data);
    let shape = AttentionShape {
        batch: 1 + b.byte() as usize % 3,
        heads: 1 + b.byte() as usize % 3,
        q_len: b.byte() as usize % 70,
        k_len: b.byte() as usize % 140,
    };
    let d = 1 + b.byte() as usize % 8;
    let mut mask = Mask::none();
    for _ in 0..b.byte() % 4 {
        let term = match b.byte() % 6 {
            0 => Ok(Mask::causal_with_offset(b.byte() as usize % 80)),
            1 => Mask::boolean(tensor(&mut b, &dev)),
            2 => Mask::additive(tensor(&mut b, &dev)),
            3 => Mask::key_padding(tensor(&mut b, &dev)),
            _ => Mask::attn_mask(tensor(&mut b, &dev)),
        };
        let Ok(term) = term else { return };
        mask = mask.and(term);
    }
    let fits = mask.validate(shape).is_ok();
    let parts = decompose(&mask, shape, &dev);
    assert_eq!(fits, parts.is_ok(), "validate and decompose disagree");
    assert_eq!(
        fits,
        mask.to_bias(shape, &dev).is_ok(),
        "validate and to_bias disagree"
    );
    if !fits {
        return;
    }
    let (bb, h, l, s) = (shape.batch, shape.heads, shape.q_len, shape.k_len);
    let seed = b.byte() as f32;
    let fill = |n: usize, dims: (usize, usize, usize, usize)| {
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        Tensor::from_vec(v, dims, &dev).unwrap()
    };
    let q = fill(bb * h * l * d, (bb, h, l, d));
    let k = fill(bb * h * s * d, (bb, h, s, d));
    let v = fill(bb * h * s * d, (bb, h, s, d));
    let fast = attention(&q, &k, &v, &mask, false).expect("a mask that fits must run (fast)");
    let naive = attention(&q, &k, &v, &mask, true).expect("a mask that fits must run (naive)");
    let fast = fast.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let naive = naive.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for (i, (x, y)) in fast.iter().zip(&naive).enumerate() {
        // NaN in the mask (an additive NaN) may give NaN; then both kernels must.
        if x.is_nan() || y.is_nan() {
            assert!(
                x.is_nan() && y.is_nan(),
                "element {i}: fast {x} vs naive {y}"
            );
            continue;
        }
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "element {i}: fast {x} vs naive {y} for {shape:?}, {mask:?}"
        );
    }
}

//! Random attention inputs and masks for the property tests (tiled and blocked kernels against
//! the naive one): a seeded generator, so a failing case reproduces from its seed, and every
//! mask kind, combinable.

use candle::{Device, Tensor};
use candle_attention::{AttentionShape, Mask};
use proptest::prelude::*;

/// Deterministic pseudo-random numbers (splitmix64), so that a failing case is reproducible
/// from its seed alone.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Roughly standard normal (sum of four uniforms, rescaled).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 1.732
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn tensor(&mut self, dims: &[usize], std: f32) -> Tensor {
        let n: usize = dims.iter().product();
        let data: Vec<f32> = (0..n).map(|_| self.normal() * std).collect();
        Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
    }
    pub fn bools(&mut self, dims: &[usize], p_blocked: f32) -> Tensor {
        let n: usize = dims.iter().product();
        let data: Vec<u8> = (0..n)
            .map(|_| u8::from(self.uniform() < p_blocked))
            .collect();
        Tensor::from_vec(data, dims, &Device::Cpu).unwrap()
    }
}

/// Mask kinds exercised; several combine into one mask.
#[derive(Clone, Copy, Debug)]
pub enum MaskKind {
    Causal(usize),
    Bool2d,
    /// Boolean `(L, S)` where some rows are entirely blocked.
    BoolDeadRows,
    Bool3d,
    Additive4d,
    /// Additive with `-inf` entries, broadcast over batch and queries `(1, H, 1, S)`.
    AdditiveBroadcast,
    KeyPadding,
    /// Key padding that blocks a whole batch row.
    KeyPaddingAll,
    KeyPaddingFloat,
}

pub fn mask_kind() -> impl Strategy<Value = MaskKind> {
    prop_oneof![
        (0usize..5).prop_map(MaskKind::Causal),
        Just(MaskKind::Bool2d),
        Just(MaskKind::BoolDeadRows),
        Just(MaskKind::Bool3d),
        Just(MaskKind::Additive4d),
        Just(MaskKind::AdditiveBroadcast),
        Just(MaskKind::KeyPadding),
        Just(MaskKind::KeyPaddingAll),
        Just(MaskKind::KeyPaddingFloat),
    ]
}

pub fn build_mask(kinds: &[MaskKind], s: AttentionShape, rng: &mut Rng) -> Mask {
    let (b, h, l, k) = (s.batch, s.heads, s.q_len, s.k_len);
    let mut mask = Mask::none();
    for kind in kinds {
        let m = match *kind {
            MaskKind::Causal(off) => Mask::causal_with_offset(off),
            MaskKind::Bool2d => Mask::boolean(rng.bools(&[l, k], 0.3)).unwrap(),
            MaskKind::BoolDeadRows => {
                let t = rng.bools(&[l, k], 0.2);
                let dead = rng.bools(&[l, 1], 0.4).broadcast_as((l, k)).unwrap();
                Mask::boolean(t.maximum(&dead).unwrap()).unwrap()
            }
            MaskKind::Bool3d => Mask::boolean(rng.bools(&[b * h, l, k], 0.3)).unwrap(),
            MaskKind::Additive4d => Mask::additive(rng.tensor(&[b, h, l, k], 1.0)).unwrap(),
            MaskKind::AdditiveBroadcast => {
                let vals = rng.tensor(&[1, h, 1, k], 2.0);
                let blocked = rng.bools(&[1, h, 1, k], 0.3);
                let inf = Tensor::full(f32::NEG_INFINITY, (1, h, 1, k), &Device::Cpu).unwrap();
                Mask::additive(blocked.where_cond(&inf, &vals).unwrap()).unwrap()
            }
            MaskKind::KeyPadding => {
                // Trailing padding of random length per batch row, plus scattered holes.
                let mut data = vec![0u8; b * k];
                for (bi, row) in data.chunks_mut(k).enumerate() {
                    let valid = 1 + rng.below(k);
                    row[valid..].fill(1);
                    if bi % 2 == 1 {
                        for x in row.iter_mut() {
                            *x |= u8::from(rng.uniform() < 0.2);
                        }
                    }
                }
                Mask::key_padding(Tensor::from_vec(data, (b, k), &Device::Cpu).unwrap()).unwrap()
            }
            MaskKind::KeyPaddingAll => {
                let mut data = vec![0u8; b * k];
                let dead = rng.below(b);
                data[dead * k..(dead + 1) * k].fill(1);
                Mask::key_padding(Tensor::from_vec(data, (b, k), &Device::Cpu).unwrap()).unwrap()
            }
            MaskKind::KeyPaddingFloat => Mask::key_padding(rng.tensor(&[b, k], 1.0)).unwrap(),
        };
        mask = mask.and(m);
    }
    mask
}

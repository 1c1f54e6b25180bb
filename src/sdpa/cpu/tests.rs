//! Unit tests of the CPU kernels ([`super::tiled`], [`super::few_queries`]) against a scalar
//! reference written out in plain loops, on shapes small enough for Miri: these are the tests
//! `scripts/sanitize.sh` runs under Miri (portable kernels, since Miri reports no SIMD
//! features) and under AddressSanitizer (the AVX-512 kernels, on a CPU that has them).
//! Sizes straddle the block edges (`block_k` 16, 64-query blocks) so that every partial-tile
//! path and its pointer arithmetic is exercised.

use super::tile::{TiledConfig, BQ};
use super::{few_queries, tiled};
use crate::mask::{AttentionShape, Mask, MaskParts};
use candle::{DType, Device, Tensor};

/// `softmax(q kᵀ · scale + bias) v` for one `(b, h)`, row by row, in f64.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bias: &dyn Fn(usize, usize) -> f64,
    l: usize,
    s: usize,
    d: usize,
    scale: f64,
) -> Vec<f32> {
    let mut out = vec![0f32; l * d];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                let dot: f64 = (0..d)
                    .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                    .sum();
                dot * scale + bias(i, j)
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            continue; // fully masked row: zeros
        }
        let p: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        for c in 0..d {
            let acc: f64 = (0..s).map(|j| p[j] * v[j * d + c] as f64).sum();
            out[i * d + c] = (acc / sum) as f32;
        }
    }
    out
}

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.618).sin()).collect()
}

/// Runs both kernels (default instruction set and portable) with `block_k = 16` on
/// `(1, 1, l, d)` × `(1, 1, s, d)` under an optional causal offset and key padding after
/// `valid` keys, and compares them with [`reference`].
/// The tiled and the decode kernel at every instruction set this process can run (block_k
/// 16), against `want` (the reference, flattened) at 1e-5 relative; `case` names the inputs.
fn check_both_kernels(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    parts: &MaskParts,
    scale: f64,
    want: &[f32],
    case: &str,
) {
    for isa in crate::simd::available_levels() {
        let cfg = TiledConfig {
            block_k: Some(16),
            isa: Some(isa),
            blocks_per_task: None,
            half_dot: true,
        };
        for (name, got) in [
            ("tiled", tiled::attention_with(q, k, v, parts, scale, &cfg)),
            (
                "decode",
                few_queries::attention_with(q, k, v, parts, scale, &cfg),
            ),
        ] {
            let got = got
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for (idx, (g, w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{name} ({isa}) {case}: element {idx} is {g}, want {w}"
                );
            }
        }
    }
}

fn check(l: usize, s: usize, d: usize, causal: Option<usize>, valid: usize) {
    let dev = Device::Cpu;
    let (qv, kv, vv) = (values(l * d, 0.5), values(s * d, 1.5), values(s * d, 2.5));
    let q = Tensor::from_vec(qv.clone(), (1, 1, l, d), &dev).unwrap();
    let k = Tensor::from_vec(kv.clone(), (1, 1, s, d), &dev).unwrap();
    let v = Tensor::from_vec(vv.clone(), (1, 1, s, d), &dev).unwrap();
    let mut mask = causal.map_or(Mask::none(), Mask::causal_with_offset);
    if valid < s {
        let pad: Vec<u8> = (0..s).map(|j| u8::from(j >= valid)).collect();
        mask = mask.and(Mask::key_padding(Tensor::from_vec(pad, (1, s), &dev).unwrap()).unwrap());
    }
    let shape = AttentionShape {
        batch: 1,
        heads: 1,
        q_len: l,
        k_len: s,
    };
    let parts = mask.decompose(shape, &dev).unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let bias = |i: usize, j: usize| {
        let future = causal.is_some_and(|o| j > i + o);
        if future || j >= valid {
            f64::NEG_INFINITY
        } else {
            0.0
        }
    };
    let want = reference(&qv, &kv, &vv, &bias, l, s, d, scale);
    let case = format!("l {l} s {s} d {d} causal {causal:?} valid {valid}");
    check_both_kernels(&q, &k, &v, &parts, scale, &want, &case);
}

#[test]
fn kernels_match_the_reference_at_block_edges() {
    for (l, s) in [
        (1, 1),
        (3, 15),
        (5, 16),
        (2, 17),
        (BQ - 1, 33),
        (BQ + 1, 16),
    ] {
        check(l, s, 8, None, s);
    }
}

#[test]
fn kernels_match_the_reference_with_odd_head_sizes() {
    for d in [1, 3, 17] {
        check(4, 20, d, None, 20);
    }
}

#[test]
fn kernels_match_the_reference_under_causal_masks_and_padding() {
    check(20, 20, 8, Some(0), 20);
    check(6, 40, 8, Some(34), 40);
    check(BQ + 1, 30, 4, Some(0), 30);
    check(9, 40, 8, None, 17);
    check(9, 40, 8, Some(3), 5);
    // Every key padded: all rows fully masked, zeros.
    check(5, 16, 8, None, 0);
}

/// Grouped-query attention: 4 query heads over 2 key/value heads (and 3 over 1), strided
/// key/value heads read in place; each query head `h` must use key/value head `h / group`.
#[test]
fn kernels_pick_the_key_value_head_of_each_query_group() {
    let dev = Device::Cpu;
    for (h, hkv, l, s, d) in [(4, 2, 3, 20, 8), (3, 1, BQ + 1, 17, 4), (4, 2, 5, 16, 3)] {
        let (qv, kv, vv) = (
            values(h * l * d, 0.5),
            values(hkv * s * d, 1.5),
            values(hkv * s * d, 2.5),
        );
        let q = Tensor::from_vec(qv.clone(), (1, h, l, d), &dev).unwrap();
        let k = Tensor::from_vec(kv.clone(), (1, hkv, s, d), &dev).unwrap();
        let v = Tensor::from_vec(vv.clone(), (1, hkv, s, d), &dev).unwrap();
        let shape = AttentionShape {
            batch: 1,
            heads: h,
            q_len: l,
            k_len: s,
        };
        let parts = Mask::causal_with_offset(s.saturating_sub(l))
            .decompose(shape, &dev)
            .unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let bias = |i: usize, j: usize| {
            if j > i + s.saturating_sub(l) {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        };
        let group = h / hkv;
        let want: Vec<f32> = (0..h)
            .flat_map(|hh| {
                let g = hh / group;
                reference(
                    &qv[hh * l * d..(hh + 1) * l * d],
                    &kv[g * s * d..(g + 1) * s * d],
                    &vv[g * s * d..(g + 1) * s * d],
                    &bias,
                    l,
                    s,
                    d,
                    scale,
                )
            })
            .collect();
        let case = format!("h {h} hkv {hkv} l {l} s {s}");
        check_both_kernels(&q, &k, &v, &parts, scale, &want, &case);
    }
}

/// `x` rounded to bf16 (`f16: false`) or f16 and back, as candle rounds (to nearest even).
fn round_half(x: &[f32], f16: bool) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            if f16 {
                half::f16::from_f32(v).to_f32()
            } else {
                half::bf16::from_f32(v).to_f32()
            }
        })
        .collect()
}

/// Half-precision inputs through every tile path (bf16 with `vdpbf16ps` where the CPU has it,
/// bf16 and f16 converted per tile with AVX-512 or portable code), tiled and decode kernels,
/// against the f64 reference on the same (rounded) inputs. Shapes straddle the pair packing:
/// odd head sizes and key counts, key blocks of 16 cut by padding and causal limits.
///
/// The bound: the output is rounded once to the input dtype (half an ulp, `u · |y|` with unit
/// roundoff `u` = 2^-8 for bf16, 2^-11 for f16), and on the bf16 dot path every probability
/// is rounded to bf16 before `P·V` (relative `2^-8` each, at most `2^-8 · max |v|` in a
/// convex combination); `1e-5` covers the `f32` arithmetic.
#[test]
fn half_kernels_match_the_reference() {
    let dev = Device::Cpu;
    for f16 in [false, true] {
        let dtype = if f16 { DType::F16 } else { DType::BF16 };
        let u = if f16 { 2f32.powi(-11) } else { 2f32.powi(-8) };
        for (l, s, d, dv, causal, valid) in [
            (1, 1, 1, 1, None, 1),
            (3, 15, 3, 5, None, 15),
            (5, 16, 8, 17, Some(2), 16),
            (BQ + 1, 33, 33, 16, None, 30),
            (BQ - 1, 17, 2, 3, Some(0), 17),
            (2, 40, 17, 65, None, 11),
            (7, 20, 8, 8, None, 0),
        ] {
            let qv = round_half(&values(l * d, 0.5), f16);
            let kv = round_half(&values(s * d, 1.5), f16);
            let vv = round_half(&values(s * dv, 2.5), f16);
            let q = Tensor::from_vec(qv.clone(), (1, 1, l, d), &dev).unwrap();
            let k = Tensor::from_vec(kv.clone(), (1, 1, s, d), &dev).unwrap();
            let v = Tensor::from_vec(vv.clone(), (1, 1, s, dv), &dev).unwrap();
            let (q, k, v) = (
                q.to_dtype(dtype).unwrap(),
                k.to_dtype(dtype).unwrap(),
                v.to_dtype(dtype).unwrap(),
            );
            let mut mask = causal.map_or(Mask::none(), Mask::causal_with_offset);
            if valid < s {
                let pad: Vec<u8> = (0..s).map(|j| u8::from(j >= valid)).collect();
                let pad = Tensor::from_vec(pad, (1, s), &dev).unwrap();
                mask = mask.and(Mask::key_padding(pad).unwrap());
            }
            let shape = AttentionShape {
                batch: 1,
                heads: 1,
                q_len: l,
                k_len: s,
            };
            let parts = mask.decompose(shape, &dev).unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let bias = |i: usize, j: usize| {
                if causal.is_some_and(|o| j > i + o) || j >= valid {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            };
            let want = reference_dv(&qv, &kv, &vv, &bias, (l, s, d, dv), scale);
            let vmax = vv.iter().fold(0f32, |m, x| m.max(x.abs()));
            let levels = crate::simd::available_levels();
            let runs = levels
                .iter()
                .map(|&l| (l, true))
                .chain(levels.last().map(|&l| (l, false)));
            for (isa, half_dot) in runs {
                let cfg = TiledConfig {
                    block_k: Some(16),
                    isa: Some(isa),
                    blocks_per_task: None,
                    half_dot,
                };
                for (name, got) in [
                    (
                        "tiled",
                        tiled::attention_with(&q, &k, &v, &parts, scale, &cfg),
                    ),
                    (
                        "decode",
                        few_queries::attention_with(&q, &k, &v, &parts, scale, &cfg),
                    ),
                ] {
                    let got = got.unwrap();
                    assert_eq!(got.dtype(), dtype);
                    let got = got
                        .to_dtype(DType::F32)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                        let tol = u * w.abs() + u * vmax + 1e-5;
                        assert!(
                            (g - w).abs() <= tol,
                            "{name} {dtype:?} ({isa}, dot {half_dot}) l {l} \
                             s {s} d {d} dv {dv} causal {causal:?} valid {valid}: element \
                             {idx} is {g}, want {w}"
                        );
                    }
                }
            }
        }
    }
}

/// [`reference`] with a value width `dv` of its own: `(l, s, d, dv)`.
fn reference_dv(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bias: &dyn Fn(usize, usize) -> f64,
    (l, s, d, dv): (usize, usize, usize, usize),
    scale: f64,
) -> Vec<f32> {
    let mut out = vec![0f32; l * dv];
    for i in 0..l {
        let scores: Vec<f64> = (0..s)
            .map(|j| {
                let dot: f64 = (0..d)
                    .map(|c| q[i * d + c] as f64 * k[j * d + c] as f64)
                    .sum();
                dot * scale + bias(i, j)
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            continue;
        }
        let p: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = p.iter().sum();
        for c in 0..dv {
            let acc: f64 = (0..s).map(|j| p[j] * v[j * dv + c] as f64).sum();
            out[i * dv + c] = (acc / sum) as f32;
        }
    }
    out
}

/// The row-wise score kernel of short query blocks (decoding) at every instruction set equals
/// the scores written out in f64, with the lanes past the block's rows zero, across head sizes
/// off the vector widths, key counts off the 8- and 16-key groups (and off the quads of four
/// keys a short group computes at the AVX-512 level) and key strides wider than the rows (a
/// cache's spare capacity). Each key's score is the same floats as that key scored alone: it
/// does not depend on how many keys share its group.
#[test]
fn row_wise_scores_match_the_reference_at_every_level() {
    use super::kernels::scores_few;
    use super::tile::FEW_QUERIES;
    for isa in crate::simd::isas() {
        for d in [1, 7, 8, 15, 16, 17, 33, 64, 80] {
            for nk in [1, 3, 5, 8, 11, 14, 16, 17, 31, 40] {
                for nq in 1..=FEW_QUERIES {
                    let (qs, ks) = (d + 3, d + 5);
                    let q = values(nq * qs, 1.5);
                    let k = values(nk * ks, 0.25);
                    let c = 0.3f32;
                    let mut st = vec![f32::NAN; nk * BQ];
                    scores_few(isa, &q, qs, nq, d, &k, ks, nk, &mut st, c);
                    for j in 0..nk {
                        for i in 0..16 {
                            let got = st[j * BQ + i];
                            let want = if i < nq {
                                let dot: f64 = (0..d)
                                    .map(|t| q[i * qs + t] as f64 * k[j * ks + t] as f64)
                                    .sum();
                                (dot * c as f64) as f32
                            } else {
                                0.0
                            };
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa:?} d {d} nk {nk} nq {nq}: key {j}, query {i}: {got} != {want}"
                            );
                        }
                        let mut alone = vec![f32::NAN; BQ];
                        scores_few(isa, &q, qs, nq, d, &k[j * ks..], ks, 1, &mut alone, c);
                        assert_eq!(
                            alone[..16].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            st[j * BQ..j * BQ + 16]
                                .iter()
                                .map(|x| x.to_bits())
                                .collect::<Vec<_>>(),
                            "{isa:?} d {d} nk {nk} nq {nq}: key {j} alone"
                        );
                    }
                }
            }
        }
    }
}

/// A decoding step's block (one query row) takes kernels of its own at some levels (AVX2 and
/// AVX-512: the softmax on that row alone; AVX2: `P·V` with all 64 columns at once): at every
/// level, the one-row softmax and `P·V` give bit for bit what the same row gets inside a
/// two-row block, with masked (`-inf`) keys, a fully masked block, running statistics from
/// earlier blocks, key counts off the 8- and 16-key groups and value widths off the 64-column
/// rows.
#[test]
fn one_query_blocks_equal_their_row_in_a_larger_block_at_every_level() {
    use super::kernels::{pv, softmax_update};
    for isa in crate::simd::isas() {
        for nk in [1, 7, 8, 13, 16, 17, 31, 64] {
            for masked in [0usize, 3, usize::MAX] {
                for (m0, l0) in [(f32::NEG_INFINITY, 0.0f32), (1.25, 3.5)] {
                    // Row 0 as both blocks see it; row 1 of the two-row block differs.
                    let mut two = vec![0f32; nk * BQ];
                    for j in 0..nk {
                        let s = if masked == usize::MAX || j % 4 == masked {
                            f32::NEG_INFINITY
                        } else {
                            ((j as f32 + 0.3) * 0.77).sin() * 4.0
                        };
                        two[j * BQ] = s;
                        two[j * BQ + 1] = -(j as f32) * 0.5;
                    }
                    let mut one = vec![f32::NAN; nk * BQ];
                    for j in 0..nk {
                        one[j * BQ] = two[j * BQ];
                    }
                    let stats = |n: usize| (vec![m0; n], vec![l0; n], vec![0f32; n]);
                    let (mut m1, mut l1, mut a1) = stats(16);
                    let (mut m2, mut l2, mut a2) = stats(16);
                    softmax_update(isa, &mut one, nk, &mut m1, &mut l1, &mut a1, 1, 1);
                    softmax_update(isa, &mut two, nk, &mut m2, &mut l2, &mut a2, 1, 2);
                    let case = format!("{isa:?} nk {nk} masked {masked} m0 {m0}");
                    assert_eq!(m1[0].to_bits(), m2[0].to_bits(), "max, {case}");
                    assert_eq!(l1[0].to_bits(), l2[0].to_bits(), "sum, {case}");
                    assert_eq!(a1[0].to_bits(), a2[0].to_bits(), "alpha, {case}");
                    for j in 0..nk {
                        assert_eq!(one[j * BQ].to_bits(), two[j * BQ].to_bits(), "p{j}, {case}");
                    }
                    for dv in [5, 64, 70, 128] {
                        let vs = dv + 3;
                        let v = values(nk * vs, 0.9);
                        for first in [true, false] {
                            let old = values(2 * dv, 2.1);
                            let (mut o1, mut o2) = (old[..dv].to_vec(), old.clone());
                            // SAFETY: o1 holds one row of dv floats, o2 two at stride dv.
                            unsafe {
                                pv(
                                    isa,
                                    &one,
                                    nk,
                                    &v,
                                    vs,
                                    dv,
                                    o1.as_mut_ptr(),
                                    dv,
                                    1,
                                    &a1,
                                    first,
                                );
                                pv(
                                    isa,
                                    &two,
                                    nk,
                                    &v,
                                    vs,
                                    dv,
                                    o2.as_mut_ptr(),
                                    dv,
                                    2,
                                    &a2,
                                    first,
                                );
                            }
                            let bits =
                                |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&o1),
                                bits(&o2[..dv]),
                                "P·V dv {dv} first {first}, {case}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Keys and values of a few rows held position by position in shared slots, for the paged
/// kernel: row `r`'s position `p` is slot `rows[r][p]`, whose keys are `(Hkv, D)`.
struct SharedSlots {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    rows: Vec<Vec<usize>>,
    d: usize,
    dv: usize,
}

impl super::paged::GatherHeads for SharedSlots {
    fn gather_head(&self, row: usize, head: usize, keys: &mut [f32], values: &mut [f32]) {
        let (d, dv) = (self.d, self.dv);
        for (p, &slot) in self.rows[row].iter().enumerate() {
            keys[p * d..(p + 1) * d].copy_from_slice(&self.keys[slot][head * d..(head + 1) * d]);
            values[p * dv..(p + 1) * dv]
                .copy_from_slice(&self.values[slot][head * dv..(head + 1) * dv]);
        }
    }

    fn head_rows(
        &self,
        row: usize,
        head: usize,
        keys: &mut [*const f32],
        values: &mut [*const f32],
    ) {
        let (d, dv) = (self.d, self.dv);
        for (p, &slot) in self.rows[row].iter().enumerate() {
            keys[p] = self.keys[slot][head * d..].as_ptr();
            values[p] = self.values[slot][head * dv..].as_ptr();
        }
    }
}

/// Attention over keys and values in shared slots gives, bit for bit, what the few-queries
/// kernel gives on the same keys and values as tensors, at every instruction set: rows that
/// share a prefix of slots and then part, one and two queries (causal from the cache), key
/// blocks of 16 (several a row) and of the level's default, key padding, grouped-query heads.
/// Keys long enough to be split over tasks are declined (`None`).
#[test]
fn paged_attention_equals_the_few_queries_kernel_on_the_same_keys_at_every_level() {
    use std::sync::Arc;
    let dev = Device::Cpu;
    let (b, h, d) = (3, 4, 24);
    for hkv in [4, 2] {
        for s in [1, 5, 17, 40] {
            // Rows 0 and 1 share their first s / 2 positions; row 2 repeats row 0 entirely.
            let mut next = 0;
            let mut fresh = |n: usize| -> Vec<usize> {
                next += n;
                (next - n..next).collect()
            };
            let shared = fresh(s / 2);
            let row0: Vec<usize> = shared.iter().copied().chain(fresh(s - s / 2)).collect();
            let row1: Vec<usize> = shared.iter().copied().chain(fresh(s - s / 2)).collect();
            let rows = vec![row0.clone(), row1, row0];
            let slots = next;
            let slots = SharedSlots {
                keys: (0..slots)
                    .map(|i| values(hkv * d, i as f32 * 1.7))
                    .collect(),
                values: (0..slots)
                    .map(|i| values(hkv * d, i as f32 * 2.3 + 0.4))
                    .collect(),
                rows,
                d,
                dv: d,
            };
            // The same keys and values as (B, Hkv, S, D) tensors.
            let tensor = |of_keys: bool| {
                let mut all = vec![0f32; b * hkv * s * d];
                for row in 0..b {
                    for head in 0..hkv {
                        let at = (row * hkv + head) * s * d;
                        let (mut k, mut v) = (vec![0f32; s * d], vec![0f32; s * d]);
                        super::paged::GatherHeads::gather_head(&slots, row, head, &mut k, &mut v);
                        all[at..at + s * d].copy_from_slice(if of_keys { &k } else { &v });
                    }
                }
                Tensor::from_vec(all, (b, hkv, s, d), &dev).unwrap()
            };
            let (k, v) = (tensor(true), tensor(false));
            let slots: Arc<dyn super::paged::GatherHeads> = Arc::new(slots);
            for l in [1, 2] {
                if l > s {
                    continue;
                }
                let q = Tensor::from_vec(values(b * h * l * d, 0.3), (b, h, l, d), &dev).unwrap();
                for padded in [false, true] {
                    let mut mask = Mask::causal_with_offset(s - l);
                    if padded {
                        let pad: Vec<u8> = (0..b * s).map(|i| u8::from(i % s == 0)).collect();
                        let pad = Tensor::from_vec(pad, (b, s), &dev).unwrap();
                        mask = mask.and(Mask::key_padding(pad).unwrap());
                    }
                    let shape = AttentionShape {
                        batch: b,
                        heads: h,
                        q_len: l,
                        k_len: s,
                    };
                    let parts = mask.decompose(shape, &dev).unwrap();
                    let scale = 1.0 / (d as f64).sqrt();
                    for isa in crate::simd::available_levels() {
                        for block_k in [Some(16), None] {
                            let cfg = TiledConfig {
                                block_k,
                                isa: Some(isa),
                                blocks_per_task: None,
                                half_dot: true,
                            };
                            let bits = |t: Tensor| {
                                let t = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                                t.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
                            };
                            let want = few_queries::attention_with(&q, &k, &v, &parts, scale, &cfg)
                                .unwrap();
                            let got = super::paged::attention(
                                &q,
                                slots.clone(),
                                (hkv, s, d, d),
                                &parts,
                                scale,
                                &cfg,
                            )
                            .unwrap()
                            .expect("a decoding step's shape takes the paged kernel");
                            let case = format!(
                                "hkv {hkv} s {s} l {l} padded {padded} {isa} block_k {block_k:?}"
                            );
                            assert_eq!(bits(got), bits(want), "{case}");
                        }
                    }
                }
            }
        }
    }
    // Keys the few-queries kernel splits over tasks are left to the tensor path.
    let long = SharedSlots {
        keys: vec![vec![0.0; 8]],
        values: vec![vec![0.0; 8]],
        rows: vec![vec![0; 4096]],
        d: 8,
        dv: 8,
    };
    let q = Tensor::zeros((1, 1, 1, 8), DType::F32, &dev).unwrap();
    let none = super::paged::attention(
        &q,
        Arc::new(long),
        (1, 4096, 8, 8),
        &MaskParts::default(),
        1.0,
        &TiledConfig::default(),
    )
    .unwrap();
    assert!(none.is_none());
}

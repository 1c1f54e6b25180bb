//! Inputs for variable-length ("varlen") attention kernels, built on any device.
//!
//! FlashAttention-2 (`candle-flash-attn`, feature `flash-attn`, see `flash_cuda.rs`) takes
//! `(batch, seq, heads, head_dim)` tensors, while this crate's layout is
//! `(batch, heads, seq, head_dim)`; and it has no mask tensor: key padding is expressed by
//! *packing*, i.e. dropping the padded keys and passing the cumulative per-sequence lengths
//! (`cu_seqlens`). Everything here is plain candle tensor work (or host arithmetic), so it runs
//! and is tested on the CPU; only the kernel call itself needs CUDA.
//!
//! ## What packing can express
//! The varlen kernel sees, for batch row `b`, `L` queries and the `n_b` kept keys in their
//! original order. Without a causal constraint that is exactly key padding: softmax over a
//! set of keys does not depend on where the dropped ones were, so **any** padding pattern
//! (right, left or scattered) packs.
//!
//! Its causal mask is aligned to the **bottom-right** corner of each sequence (flash-attn ≥ 2.1,
//! `kernels/mask.h` and `flash_fwd_kernel.h` of candle-flash-attn: query `i` sees packed keys
//! `p ≤ i + n_b − L`). This crate's causal mask is in original key positions: query `i` sees
//! keys `j ≤ i + offset` ([`crate::Mask::causal_with_offset`]). After packing, query `i` of row
//! `b` therefore sees the first `c_b(i) = #{kept j ≤ i + offset}` packed keys, and the two
//! agree exactly when `c_b(i) = clamp(i + 1 + n_b − L, 0, n_b)` for every `i`.
//! [`VarlenPlan::new`] checks this per row and declines (returns `None`) when it fails.
//! It holds, for example, for
//! * no padding and `offset = S − L` (bottom-right causal, also the KV-cache case);
//! * **left** padding with `offset = S − L` (the usual layout of batched decoder prompts);
//!
//! and fails for causal self-attention over **right**-padded rows (`L = S`, `offset = 0`,
//! `n_b < S`): there the real query `i < n_b` must see `i + 1` keys while the kernel would
//! show it `i + 1 − (S − n_b)`. Such inputs go to the other kernels.
//!
//! A row whose keys are all padded (`n_b = 0`) gets zeros from the kernel (its early exit,
//! `flash_fwd_kernel.h`: "This also covers the case where actual_seqlen_k == 0"), as this
//! crate defines fully masked rows.

use candle::{DType, Device, Tensor};

/// `(batch, heads, seq, head_dim)` → `(batch, seq, heads, head_dim)`, the layout of
/// flash-attn's dense API. A view (no copy): the last dimension keeps its stride, which is all
/// flash-attn needs (it reads the batch, sequence and head strides).
pub fn heads_to_seq_major(t: &Tensor) -> candle::Result<Tensor> {
    check_rank4("heads_to_seq_major", t)?;
    t.transpose(1, 2)
}

/// `(batch, seq, heads, head_dim)` → `(batch, heads, seq, head_dim)`: flash-attn's output back
/// to this crate's layout. A view (no copy).
pub fn seq_major_to_heads(t: &Tensor) -> candle::Result<Tensor> {
    check_rank4("seq_major_to_heads", t)?;
    t.transpose(1, 2)
}

fn check_rank4(what: &str, t: &Tensor) -> candle::Result<()> {
    if t.rank() != 4 {
        candle::bail!("{what} takes a rank-4 tensor, got shape {:?}", t.dims())
    }
    Ok(())
}

/// How one batch of `(B, H, L, D)` queries and `(B, Hkv, S, D)` keys/values with key padding
/// (and possibly a causal constraint) maps onto a varlen kernel call: which keys are kept,
/// the cumulative sequence lengths, and whether the kernel's causal flag is to be set.
///
/// Queries are never dropped (every query row gets an output, as everywhere in this crate):
/// the query side is `B` sequences of `L`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VarlenPlan {
    batch: usize,
    q_len: usize,
    k_len: usize,
    kept_keys: Vec<u32>,
    cu_seqlens_q: Vec<u32>,
    cu_seqlens_k: Vec<u32>,
    max_seqlen_k: usize,
    causal: bool,
}

impl VarlenPlan {
    /// Plans the call for a key padding mask `padding` (`B × S`, row-major, `true` = padding)
    /// with `L = q_len` queries per row and an optional causal constraint (query `i` sees keys
    /// `j ≤ i + offset`).
    ///
    /// Returns `Ok(None)` when the causal constraint cannot be expressed by the kernel's
    /// bottom-right alignment on the packed keys (module docs); errors when `padding` does not
    /// hold `batch × k_len` entries or an index does not fit the kernel's `u32`.
    pub fn new(
        padding: &[bool],
        batch: usize,
        q_len: usize,
        k_len: usize,
        causal_offset: Option<usize>,
    ) -> candle::Result<Option<Self>> {
        if padding.len() != batch * k_len {
            candle::bail!(
                "key padding holds {} entries, expected batch {batch} × keys {k_len}",
                padding.len()
            )
        }
        let too_big = |what: &str, n: usize| -> candle::Result<u32> {
            u32::try_from(n).map_err(|_| {
                candle::Error::Msg(format!(
                    "varlen attention indexes with u32: {what} {n} does not fit"
                ))
            })
        };
        too_big("batch × keys", batch * k_len)?;
        too_big("batch × queries", batch * q_len)?;
        let mut kept_keys = Vec::new();
        let mut cu_seqlens_k = vec![0u32];
        let mut max_seqlen_k = 0;
        // counts[x] = kept keys among positions 0..x of the current row.
        let mut counts = vec![0usize; k_len + 1];
        for (b, row) in padding.chunks(k_len.max(1)).take(batch).enumerate() {
            for (j, &pad) in row.iter().enumerate() {
                counts[j + 1] = counts[j] + usize::from(!pad);
                if !pad {
                    kept_keys.push((b * k_len + j) as u32);
                }
            }
            let n = counts[k_len];
            if let Some(offset) = causal_offset {
                let representable = (0..q_len).all(|i| {
                    let ours = counts[(i + offset + 1).min(k_len)];
                    let kernel = (i + 1 + n).saturating_sub(q_len).min(n);
                    ours == kernel
                });
                if !representable {
                    return Ok(None);
                }
            }
            max_seqlen_k = max_seqlen_k.max(n);
            cu_seqlens_k.push(kept_keys.len() as u32);
        }
        if k_len == 0 {
            // `chunks` yields nothing for an empty row: every sequence has no key.
            cu_seqlens_k = vec![0; batch + 1];
        }
        let cu_seqlens_q = (0..=batch).map(|b| (b * q_len) as u32).collect();
        Ok(Some(Self {
            batch,
            q_len,
            k_len,
            kept_keys,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_k,
            causal: causal_offset.is_some(),
        }))
    }

    /// Plans the call from a per-key additive bias `(B, S)` as [`crate::mask::MaskParts::key_bias`]
    /// holds it (`0` = keep, `-inf` = padding). Returns `Ok(None)` when an entry is anything
    /// else (a float key padding mask that re-weights keys cannot be packed) or the causal
    /// constraint is not representable.
    pub fn from_key_bias(
        key_bias: &Tensor,
        q_len: usize,
        causal_offset: Option<usize>,
    ) -> candle::Result<Option<Self>> {
        let (batch, k_len) = key_bias.dims2()?;
        let values = key_bias
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut padding = Vec::with_capacity(values.len());
        for x in values {
            if x == 0.0 {
                padding.push(false)
            } else if x == f32::NEG_INFINITY {
                padding.push(true)
            } else {
                return Ok(None);
            }
        }
        Self::new(&padding, batch, q_len, k_len, causal_offset)
    }

    /// Batch size `B`.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Queries per sequence `L` (every sequence has all of them).
    pub fn q_len(&self) -> usize {
        self.q_len
    }

    /// The longest packed key sequence (`max_seqlen_k` of the kernel).
    pub fn max_seqlen_k(&self) -> usize {
        self.max_seqlen_k
    }

    /// Kept keys over all rows (`total_k`).
    pub fn total_keys(&self) -> usize {
        self.kept_keys.len()
    }

    /// Whether the kernel's (bottom-right) causal flag is to be set.
    pub fn causal(&self) -> bool {
        self.causal
    }

    /// Cumulative query lengths `0, L, 2L, …, B·L` (`B + 1` entries).
    pub fn cu_seqlens_q(&self) -> &[u32] {
        &self.cu_seqlens_q
    }

    /// Cumulative kept-key lengths `0, n_0, n_0 + n_1, …` (`B + 1` entries).
    pub fn cu_seqlens_k(&self) -> &[u32] {
        &self.cu_seqlens_k
    }

    /// `cu_seqlens_q` and `cu_seqlens_k` as `U32` tensors on `device` (the dtype
    /// candle-flash-attn reads them as).
    pub fn seqlens_tensors(&self, device: &Device) -> candle::Result<(Tensor, Tensor)> {
        let q = Tensor::new(self.cu_seqlens_q.as_slice(), device)?;
        let k = Tensor::new(self.cu_seqlens_k.as_slice(), device)?;
        Ok((q, k))
    }

    /// Queries `(B, H, L, D)` → packed `(B·L, H, D)`, contiguous.
    pub fn pack_queries(&self, q: &Tensor) -> candle::Result<Tensor> {
        let (b, h, l, d) = q.dims4()?;
        if (b, l) != (self.batch, self.q_len) {
            candle::bail!(
                "varlen plan is for batch {} × {} queries, got queries {:?}",
                self.batch,
                self.q_len,
                q.dims()
            )
        }
        heads_to_seq_major(q)?.contiguous()?.reshape((b * l, h, d))
    }

    /// Keys or values `(B, Hkv, S, D)` → the kept rows, packed `(total_k, Hkv, D)`.
    pub fn pack_keys(&self, k: &Tensor) -> candle::Result<Tensor> {
        let (b, h, s, d) = k.dims4()?;
        if (b, s) != (self.batch, self.k_len) {
            candle::bail!(
                "varlen plan is for batch {} × {} keys, got keys/values {:?}",
                self.batch,
                self.k_len,
                k.dims()
            )
        }
        let rows = heads_to_seq_major(k)?
            .contiguous()?
            .reshape((b * s, h, d))?;
        if self.kept_keys.len() == b * s {
            return Ok(rows); // nothing padded: no gather
        }
        let index = Tensor::new(self.kept_keys.as_slice(), k.device())?;
        rows.index_select(&index, 0)
    }

    /// The kernel's packed output `(B·L, H, Dv)` → `(B, H, L, Dv)` (a view of one copy).
    pub fn unpack_output(&self, out: &Tensor) -> candle::Result<Tensor> {
        let (total, h, d) = out.dims3()?;
        if total != self.batch * self.q_len {
            candle::bail!(
                "varlen output has {total} rows, expected batch {} × {} queries",
                self.batch,
                self.q_len
            )
        }
        seq_major_to_heads(&out.reshape((self.batch, self.q_len, h, d))?)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{scaled_dot_product_attention, Mask, SdpaArgs};

    /// The varlen kernel's documented semantics on packed inputs, in plain loops (f32): row `b`
    /// has queries `cu_q[b]..cu_q[b+1]` and keys `cu_k[b]..cu_k[b+1]`; query head `h` uses
    /// key head `h / (H / Hkv)`; with `causal`, query `i` of a row of `lq` queries and `lk`
    /// keys sees packed keys `p ≤ i + lk − lq` (bottom-right); a row with no visible key
    /// gives zeros.
    #[allow(clippy::too_many_arguments)]
    fn varlen_reference(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cu_q: &[u32],
        cu_k: &[u32],
        scale: f32,
        causal: bool,
    ) -> Tensor {
        let (total_q, h, d) = q.dims3().unwrap();
        let (_, hkv, dv) = v.dims3().unwrap();
        let qv = q.to_vec3::<f32>().unwrap();
        let kv = k.to_vec3::<f32>().unwrap();
        let vv = v.to_vec3::<f32>().unwrap();
        let mut out = vec![0f32; total_q * h * dv];
        for b in 0..cu_q.len() - 1 {
            let (q0, q1) = (cu_q[b] as usize, cu_q[b + 1] as usize);
            let (k0, k1) = (cu_k[b] as usize, cu_k[b + 1] as usize);
            let (lq, lk) = ((q1 - q0) as i64, (k1 - k0) as i64);
            for i in 0..(q1 - q0) {
                for head in 0..h {
                    let kh = head / (h / hkv);
                    let visible: Vec<usize> = (0..(k1 - k0))
                        .filter(|&p| !causal || (p as i64) <= i as i64 + lk - lq)
                        .collect();
                    if visible.is_empty() {
                        continue;
                    }
                    let scores: Vec<f32> = visible
                        .iter()
                        .map(|&p| {
                            (0..d)
                                .map(|x| qv[q0 + i][head][x] * kv[k0 + p][kh][x])
                                .sum::<f32>()
                                * scale
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f32 = e.iter().sum();
                    for x in 0..dv {
                        let acc: f32 = visible
                            .iter()
                            .zip(&e)
                            .map(|(&p, w)| w * vv[k0 + p][kh][x])
                            .sum();
                        out[((q0 + i) * h + head) * dv + x] = acc / z;
                    }
                }
            }
        }
        Tensor::from_vec(out, (total_q, h, dv), &Device::Cpu).unwrap()
    }

    fn qkv(b: usize, h: usize, hkv: usize, l: usize, s: usize, d: usize) -> [Tensor; 3] {
        let dev = Device::Cpu;
        [
            Tensor::randn(0f32, 1., (b, h, l, d), &dev).unwrap(),
            Tensor::randn(0f32, 1., (b, hkv, s, d), &dev).unwrap(),
            Tensor::randn(0f32, 1., (b, hkv, s, d), &dev).unwrap(),
        ]
    }

    fn padding_tensor(padding: &[bool], b: usize, s: usize) -> Tensor {
        let bytes: Vec<u8> = padding.iter().map(|&p| u8::from(p)).collect();
        Tensor::from_vec(bytes, (b, s), &Device::Cpu).unwrap()
    }

    /// The largest absolute difference of two `f32` tensors of one shape (also used by the GPU
    /// tests of `flash_cuda`).
    pub(crate) fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// Packs, runs the kernel's semantics and unpacks; compares with this crate's attention
    /// under the same mask. Returns false when the plan declined.
    fn packed_matches_sdpa(
        padding: &[bool],
        (b, h, hkv, l, s, d): (usize, usize, usize, usize, usize, usize),
        causal_offset: Option<usize>,
    ) -> bool {
        let [q, k, v] = qkv(b, h, hkv, l, s, d);
        let Some(plan) = VarlenPlan::new(padding, b, l, s, causal_offset).unwrap() else {
            return false;
        };
        let scale = 0.37f32;
        let out = varlen_reference(
            &plan.pack_queries(&q).unwrap(),
            &plan.pack_keys(&k).unwrap(),
            &plan.pack_keys(&v).unwrap(),
            plan.cu_seqlens_q(),
            plan.cu_seqlens_k(),
            scale,
            plan.causal(),
        );
        let out = plan.unpack_output(&out).unwrap();
        let mut mask = Mask::key_padding(padding_tensor(padding, b, s)).unwrap();
        if let Some(offset) = causal_offset {
            mask = Mask::causal_with_offset(offset).and(mask);
        }
        let args = SdpaArgs {
            mask,
            scale: Some(scale as f64),
            ..Default::default()
        };
        let want = scaled_dot_product_attention(&q, &k, &v, &args)
            .unwrap()
            .output;
        assert_eq!(out.dims(), want.dims());
        let diff = max_diff(&out, &want);
        assert!(diff < 1e-5, "packed varlen differs from sdpa by {diff}");
        true
    }

    fn right_padding(lens: &[usize], s: usize) -> Vec<bool> {
        lens.iter()
            .flat_map(|&n| (0..s).map(move |j| j >= n))
            .collect()
    }

    fn left_padding(lens: &[usize], s: usize) -> Vec<bool> {
        lens.iter()
            .flat_map(|&n| (0..s).map(move |j| j < s - n))
            .collect()
    }

    #[test]
    fn layout_round_trip_is_a_transpose() {
        let t = Tensor::arange(0f32, 2. * 3. * 4. * 8., &Device::Cpu)
            .unwrap()
            .reshape((2, 3, 4, 8))
            .unwrap();
        let s = heads_to_seq_major(&t).unwrap();
        assert_eq!(s.dims(), &[2, 4, 3, 8]);
        // Element (b, seq, head, x) of the flash layout is element (b, head, seq, x) of ours.
        let got = s
            .get(1)
            .unwrap()
            .get(2)
            .unwrap()
            .get(0)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let want = t
            .get(1)
            .unwrap()
            .get(0)
            .unwrap()
            .get(2)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(got, want);
        assert_eq!(s.stride()[3], 1, "flash-attn needs a unit last stride");
        let back = seq_major_to_heads(&s).unwrap();
        assert_eq!(max_diff(&back, &t), 0.0);
        assert!(heads_to_seq_major(&t.flatten_all().unwrap()).is_err());
    }

    #[test]
    fn cumulative_lengths_and_kept_keys() {
        // Row 0: keys 0 and 2 kept; row 1: all padded; row 2: all kept.
        let padding = [false, true, false, true, true, true, false, false, false];
        let plan = VarlenPlan::new(&padding, 3, 2, 3, None).unwrap().unwrap();
        assert_eq!(plan.cu_seqlens_q(), &[0, 2, 4, 6]);
        assert_eq!(plan.cu_seqlens_k(), &[0, 2, 2, 5]);
        assert_eq!(plan.kept_keys, vec![0, 2, 6, 7, 8]);
        assert_eq!((plan.max_seqlen_k(), plan.total_keys()), (3, 5));
        assert!(!plan.causal());
        let (cq, ck) = plan.seqlens_tensors(&Device::Cpu).unwrap();
        assert_eq!(cq.dtype(), DType::U32);
        assert_eq!(ck.to_vec1::<u32>().unwrap(), vec![0, 2, 2, 5]);
        let k = Tensor::arange(0f32, 3. * 2. * 3. * 8., &Device::Cpu)
            .unwrap()
            .reshape((3, 2, 3, 8))
            .unwrap();
        let packed = plan.pack_keys(&k).unwrap();
        assert_eq!(packed.dims(), &[5, 2, 8]);
        // Packed row 1 is batch 0, key 2, both heads.
        let want = k
            .get(0)
            .unwrap()
            .narrow(1, 2, 1)
            .unwrap()
            .squeeze(1)
            .unwrap();
        assert_eq!(max_diff(&packed.get(1).unwrap(), &want), 0.0);
    }

    #[test]
    fn key_padding_of_any_pattern_packs_exactly() {
        let (b, s) = (4, 7);
        let scattered = [
            [false, true, false, false, true, true, false],
            [true, true, true, true, true, true, true], // all padding: zeros
            [false; 7],
            [true, false, true, false, true, false, true],
        ]
        .concat();
        for padding in [
            right_padding(&[7, 3, 1, 5], s),
            left_padding(&[2, 7, 4, 6], s),
            scattered,
        ] {
            // Self-attention and cross-attention shapes, GQA (4 query heads on 2 kv heads).
            assert!(packed_matches_sdpa(&padding, (b, 4, 2, 5, s, 8), None));
            assert!(packed_matches_sdpa(&padding, (b, 2, 2, 1, s, 16), None));
        }
    }

    #[test]
    fn causal_without_padding_is_the_bottom_right_alignment() {
        let none = vec![false; 2 * 6];
        // Self-attention (offset 0 = S - L) and a cached prefix (offset = S - L = 4).
        assert!(packed_matches_sdpa(&none, (2, 2, 1, 6, 6, 8), Some(0)));
        assert!(packed_matches_sdpa(&none, (2, 2, 1, 2, 6, 8), Some(4)));
        // Any other offset is not the kernel's causal mask.
        assert!(VarlenPlan::new(&none, 2, 6, 6, Some(1)).unwrap().is_none());
        assert!(VarlenPlan::new(&none, 2, 2, 6, Some(0)).unwrap().is_none());
    }

    #[test]
    fn causal_with_left_padding_packs_and_right_padding_declines() {
        let (b, s) = (3, 6);
        // Batched decoder prompts, left padded, with and without a cached prefix.
        let left = left_padding(&[6, 3, 0], s);
        assert!(packed_matches_sdpa(&left, (b, 2, 2, 6, s, 8), Some(0)));
        assert!(packed_matches_sdpa(&left, (b, 2, 2, 2, s, 8), Some(4)));
        // Right padding under causal self-attention: real query i sees i + 1 keys, the kernel
        // would show it i + 1 - (S - n).
        let right = right_padding(&[6, 3, 5], s);
        assert!(VarlenPlan::new(&right, b, s, s, Some(0)).unwrap().is_none());
        // A padding mask that pads nothing still packs (one gather-free call).
        let full = right_padding(&[6, 6, 6], s);
        assert!(packed_matches_sdpa(&full, (b, 2, 1, 6, s, 8), Some(0)));
    }

    #[test]
    fn key_bias_must_be_zero_or_minus_infinity() {
        let inf = f32::NEG_INFINITY;
        let bias = Tensor::new(&[[0f32, inf, 0.], [inf, 0., 0.]], &Device::Cpu).unwrap();
        let plan = VarlenPlan::from_key_bias(&bias, 4, None).unwrap().unwrap();
        assert_eq!(plan.cu_seqlens_k(), &[0, 2, 4]);
        assert_eq!(plan.kept_keys, vec![0, 2, 4, 5]);
        let reweighting = Tensor::new(&[[0f32, -0.5, 0.], [0., 0., 0.]], &Device::Cpu).unwrap();
        assert!(VarlenPlan::from_key_bias(&reweighting, 4, None)
            .unwrap()
            .is_none());
    }

    #[test]
    fn mismatched_inputs_are_errors_not_panics() {
        assert!(VarlenPlan::new(&[false; 5], 2, 3, 3, None).is_err());
        let plan = VarlenPlan::new(&[false; 6], 2, 3, 3, None)
            .unwrap()
            .unwrap();
        let [q, k, _] = qkv(2, 2, 2, 4, 3, 8);
        let err = plan.pack_queries(&q).unwrap_err().to_string();
        assert!(err.contains("batch 2 × 3 queries"), "{err}");
        assert!(plan.pack_keys(&k).is_ok());
        let [_, k5, _] = qkv(2, 2, 2, 3, 5, 8);
        assert!(plan.pack_keys(&k5).is_err());
        let bad = Tensor::zeros((5, 2, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(plan.unpack_output(&bad).is_err());
    }
}

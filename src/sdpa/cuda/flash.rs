//! FlashAttention-2 on CUDA through `candle-flash-attn` (feature `flash-attn`).
//!
//! [`try_attention`] is what [`crate::scaled_dot_product_attention`] calls first for CUDA
//! tensors; it returns `Ok(None)` for whatever the kernel cannot compute exactly, and the
//! dispatch then goes on as without the feature. It takes:
//!
//! * dtype `f16` or `bf16` (the kernels accumulate in `f32`), on a GPU of compute capability
//!   8.0 or newer: the kernels are compiled for the `CUDA_COMPUTE_CAP` of the build;
//! * `head_dim` a multiple of 8, at most 512, the same for queries, keys and values;
//! * grouped-query attention (`Hkv` dividing `H`) as it is: the kernel maps query head `h` to
//!   key/value head `h / (H / Hkv)`, as this crate does;
//! * masks: none; causal with `offset = S − L` (flash-attn aligns its causal mask to the
//!   bottom-right corner: query `i` sees keys `0..=i + S − L`); key padding (`true` = padding,
//!   or a float key padding of only `0` / `-inf`), alone or with such a causal mask where
//!   packing keeps the two equal (see [`super::varlen`]: e.g. left padding, not right padding,
//!   under causal self-attention). Boolean and additive attention masks, other causal
//!   offsets and re-weighting float key padding are declined.
//!
//! The caller has already declined weights, dropout and autograd (the kernel has no backward).
//!
//! Layout: flash-attn takes and returns `(B, S, H, D)`; inputs are passed as transposed views
//! (the kernel reads batch, sequence and head strides; only the last dimension must be
//! contiguous) and the output is returned as a transposed view `(B, H, L, D)`. With key
//! padding the varlen API is used: queries `(B·L, H, D)`, kept keys/values `(total_k, Hkv, D)`
//! and `U32` cumulative lengths.

use super::varlen::{heads_to_seq_major, seq_major_to_heads, VarlenPlan};
use crate::mask::{AttentionShape, Mask};
use candle::{DType, Device, Tensor};

/// Why flash-attn cannot take these inputs, or `None` when the inputs themselves are fine
/// (the mask is judged by [`try_attention`]). `q`: `(B, H, L, D)`, `k`: `(B, Hkv, S, D)`,
/// `v`: `(B, Hkv, S, Dv)`, already checked to agree with each other.
pub fn unsupported_reason(q: &Tensor, k: &Tensor, v: &Tensor) -> Option<String> {
    if !q.device().is_cuda() {
        return Some(format!(
            "flash-attn runs on CUDA tensors, got {:?}",
            q.device().location()
        ));
    }
    if !matches!(q.dtype(), DType::F16 | DType::BF16) {
        return Some(format!("flash-attn takes f16 or bf16, got {:?}", q.dtype()));
    }
    let (d, dv) = (q.dims()[3], v.dims()[3]);
    if d != dv {
        return Some(format!(
            "flash-attn needs one head_dim for queries and values, got {d} and {dv}"
        ));
    }
    if d == 0 || !d.is_multiple_of(8) || d > 512 {
        return Some(format!(
            "flash-attn takes a head_dim that is a multiple of 8 and at most 512, got {d}"
        ));
    }
    if q.dims()[2] == 0 || k.dims()[2] == 0 {
        return Some("flash-attn needs at least one query and one key".to_string());
    }
    // The kernel's strides and lengths are u32.
    if [q, k, v].iter().any(|t| t.elem_count() > u32::MAX as usize) {
        return Some("flash-attn indexes with u32: a tensor is too large".to_string());
    }
    None
}

/// Attention through flash-attn when it computes exactly what `mask` asks for, else
/// `Ok(None)` (the caller uses another kernel). Returns `(B, H, L, D)` in the input dtype (a
/// transposed view of the kernel's `(B, L, H, D)` output). Errors are the kernel's (e.g. a
/// GPU older than the build's compute capability).
pub fn try_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    shape: AttentionShape,
    scale: f64,
) -> candle::Result<Option<Tensor>> {
    // CPU (and Metal) tensors leave at once: this runs before every kernel choice.
    if !q.device().is_cuda() || unsupported_reason(q, k, v).is_some() {
        return Ok(None);
    }
    let (q_len, k_len) = (shape.q_len, shape.k_len);
    // flash-attn's causal mask: query i sees keys 0..=i + S - L (bottom-right).
    let bottom_right = |offset: usize| k_len >= q_len && offset == k_len - q_len;
    if mask.is_none() {
        return dense(q, k, v, scale, false).map(Some);
    }
    if let Some(offset) = mask.as_causal() {
        return if bottom_right(offset) {
            dense(q, k, v, scale, true).map(Some)
        } else {
            Ok(None)
        };
    }
    if mask.has_attention_mask_terms() {
        return Ok(None); // boolean or additive attention masks: not expressible
    }
    // Key padding (and causal terms): read the (B, S) padding on the host to pack the keys.
    let parts = mask.decompose(shape, &Device::Cpu)?;
    let Some(key_bias) = parts.key_bias else {
        // Several causal terms only: the strictest offset decides.
        return match parts.causal_offset {
            Some(offset) if bottom_right(offset) => dense(q, k, v, scale, true).map(Some),
            _ => Ok(None),
        };
    };
    if key_bias.track_op() {
        return Ok(None); // a float key padding that wants its gradient
    }
    let Some(plan) = VarlenPlan::from_key_bias(&key_bias, q_len, parts.causal_offset)? else {
        return Ok(None);
    };
    varlen(q, k, v, &plan, scale).map(Some)
}

/// Like [`try_attention`] but an error, naming the reason, when flash-attn cannot take the
/// inputs or the mask (`attn bench attention --impl flash-attn`). `q`: `(B, H, L, D)`, `k`,
/// `v`: `(B, Hkv, S, D)`; returns `(B, H, L, D)`.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
) -> candle::Result<Tensor> {
    let shape = crate::sdpa::shapes::check_qkv(q, k, v)?;
    mask.validate(shape)?;
    if let Some(reason) = unsupported_reason(q, k, v) {
        candle::bail!("{reason}")
    }
    match try_attention(q, k, v, mask, shape, scale)? {
        Some(out) => Ok(out),
        None => candle::bail!(
            "flash-attn cannot express this mask exactly: it takes no mask, causal with \
             offset S - L ({} here), key padding, or both where packing keeps them equal \
             (left padding, not right padding, under a causal mask)",
            shape.k_len as i64 - shape.q_len as i64
        ),
    }
}

/// One dense call: `(B, L, H, D)` views in, `(B, H, L, D)` view out.
fn dense(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> candle::Result<Tensor> {
    let q = heads_to_seq_major(&unit_last_stride(q)?)?;
    let k = heads_to_seq_major(&unit_last_stride(k)?)?;
    let v = heads_to_seq_major(&unit_last_stride(v)?)?;
    let out = candle_flash_attn::flash_attn(&q, &k, &v, scale as f32, causal)?;
    seq_major_to_heads(&out)
}

/// One varlen call over the packed queries and kept keys/values of `plan`.
fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    plan: &VarlenPlan,
    scale: f64,
) -> candle::Result<Tensor> {
    if plan.total_keys() == 0 {
        // Every key of every row is padding: fully masked rows are zeros (sdpa docs); the
        // kernel would get empty key tensors.
        let (b, h, l, _) = q.dims4()?;
        return Tensor::zeros((b, h, l, v.dims()[3]), q.dtype(), q.device());
    }
    let (cu_q, cu_k) = plan.seqlens_tensors(q.device())?;
    let out = candle_flash_attn::flash_attn_varlen(
        &plan.pack_queries(q)?,
        &plan.pack_keys(k)?,
        &plan.pack_keys(v)?,
        &cu_q,
        &cu_k,
        plan.q_len(),
        plan.max_seqlen_k(),
        scale as f32,
        plan.causal(),
    )?;
    plan.unpack_output(&out)
}

fn unit_last_stride(t: &Tensor) -> candle::Result<Tensor> {
    if t.stride().last() == Some(&1) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

#[cfg(test)]
mod tests {
    //! The GPU half runs only where there is one: `#[ignore]`d, and run by scripts/gpu-run.sh
    //! (`--ignored sdpa::flash_cuda`). The packing itself is tested on the CPU in `varlen`.
    use super::*;
    use crate::sdpa::cuda::varlen::tests::max_diff;
    use crate::{scaled_dot_product_attention, SdpaArgs};

    fn randn(shape: (usize, usize, usize, usize), device: &Device) -> Tensor {
        Tensor::randn(0f32, 1., shape, device).unwrap()
    }

    #[test]
    fn declines_cpu_tensors_and_unsupported_shapes() {
        let cpu = Device::Cpu;
        let q = randn((1, 2, 4, 8), &cpu).to_dtype(DType::BF16).unwrap();
        let shape = AttentionShape {
            batch: 1,
            heads: 2,
            q_len: 4,
            k_len: 4,
        };
        let reason = unsupported_reason(&q, &q, &q).unwrap();
        assert!(reason.contains("CUDA"), "{reason}");
        assert!(try_attention(&q, &q, &q, &Mask::none(), shape, 1.0)
            .unwrap()
            .is_none());
        let err = attention(&q, &q, &q, &Mask::none(), 1.0).unwrap_err();
        assert!(err.to_string().contains("CUDA"), "{err}");
    }

    /// flash-attn (bf16) against this crate's f32 attention on the CPU, for every mask kind
    /// it takes; and `scaled_dot_product_attention` must have taken flash-attn (same bits).
    #[test]
    #[ignore = "needs a CUDA GPU (compute capability >= 8.0): scripts/gpu-run.sh runs it"]
    fn matches_cpu_attention_on_the_gpu() {
        let gpu = Device::new_cuda(0).expect("a CUDA device");
        let (b, h, hkv) = (3, 8, 2);
        for (l, s, d) in [(1, 37, 64), (50, 50, 64), (17, 80, 128), (130, 130, 32)] {
            let pad_lens = [s, s / 2, 1];
            let left: Vec<u8> = pad_lens
                .iter()
                .flat_map(|&n| (0..s).map(move |j| u8::from(j < s - n)))
                .collect();
            let right: Vec<u8> = pad_lens
                .iter()
                .flat_map(|&n| (0..s).map(move |j| u8::from(j >= n)))
                .collect();
            let pad = |v: &Vec<u8>| {
                Mask::key_padding(Tensor::from_vec(v.clone(), (b, s), &Device::Cpu).unwrap())
                    .unwrap()
            };
            let masks = [
                ("none", Mask::none()),
                ("causal S-L", Mask::causal_with_offset(s - l)),
                ("right padding", pad(&right)),
                ("left padding", pad(&left)),
                (
                    "causal S-L + left padding",
                    Mask::causal_with_offset(s - l).and(pad(&left)),
                ),
            ];
            let q = randn((b, h, l, d), &Device::Cpu);
            let k = randn((b, hkv, s, d), &Device::Cpu);
            let v = randn((b, hkv, s, d), &Device::Cpu);
            let bf = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&gpu).unwrap();
            // The reference sees the same bf16-rounded inputs.
            let round = |t: &Tensor| {
                t.to_dtype(DType::BF16)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
            };
            for dtype in [DType::BF16, DType::F16] {
                let (qg, kg, vg) = (
                    bf(&q).to_dtype(dtype).unwrap(),
                    bf(&k).to_dtype(dtype).unwrap(),
                    bf(&v).to_dtype(dtype).unwrap(),
                );
                for (name, mask) in &masks {
                    let args = SdpaArgs {
                        mask: mask.clone(),
                        ..Default::default()
                    };
                    let want =
                        scaled_dot_product_attention(&round(&q), &round(&k), &round(&v), &args)
                            .unwrap()
                            .output;
                    let got = attention(&qg, &kg, &vg, mask, 1.0 / (d as f64).sqrt())
                        .unwrap_or_else(|e| panic!("{name} L={l} S={s} D={d}: {e}"));
                    let via_sdpa = scaled_dot_product_attention(&qg, &kg, &vg, &args)
                        .unwrap()
                        .output;
                    let got_cpu = got
                        .to_dtype(DType::F32)
                        .unwrap()
                        .to_device(&Device::Cpu)
                        .unwrap();
                    let diff = max_diff(&got_cpu, &want);
                    assert!(
                        diff < 2e-2,
                        "{name} {dtype:?} L={l} S={s} D={d}: max |flash - f32| = {diff}"
                    );
                    let same = max_diff(
                        &via_sdpa.to_dtype(DType::F32).unwrap(),
                        &got.to_dtype(DType::F32).unwrap(),
                    );
                    assert_eq!(
                        same, 0.0,
                        "{name}: scaled_dot_product_attention did not take flash-attn"
                    );
                }
                // Declined: right padding under causal self-attention, a boolean mask.
                if l == s {
                    let causal_right = Mask::causal().and(pad(&right));
                    let shape = AttentionShape {
                        batch: b,
                        heads: h,
                        q_len: l,
                        k_len: s,
                    };
                    assert!(try_attention(&qg, &kg, &vg, &causal_right, shape, 0.125)
                        .unwrap()
                        .is_none());
                }
            }
        }
    }
}

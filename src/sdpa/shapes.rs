//! Shape checks every attention path shares (a leaf: the dispatcher and the kernels it calls
//! import it, it imports none of them).

use crate::mask::AttentionShape;
use candle::Tensor;

/// Checks ranks, sizes, dtypes and devices of `q`, `k`, `v` (`Hkv` key/value heads must divide
/// the `H` query heads); returns `(B, H, L, S)`.
pub(crate) fn check_qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> candle::Result<AttentionShape> {
    for (name, t) in [("query", q), ("key", k), ("value", v)] {
        if t.rank() != 4 {
            candle::bail!(
                "{name} must be (batch, heads, seq, head_dim), got shape {:?}",
                t.dims()
            )
        }
        if !t.dtype().is_float() {
            candle::bail!("{name} must have a float dtype, got {:?}", t.dtype())
        }
    }
    let (b, h, l, d) = q.dims4()?;
    let (kb, kh, s, kd) = k.dims4()?;
    let (vb, vh, vs, _) = v.dims4()?;
    if kb != b || vb != b {
        candle::bail!(
            "query, key and value must agree on the batch size: query {:?}, key {:?}, value {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    if vh != kh {
        candle::bail!(
            "key and value must have the same number of heads: key {:?}, value {:?}",
            k.dims(),
            v.dims()
        )
    }
    if kh == 0 || !h.is_multiple_of(kh) {
        candle::bail!(
            "the {h} query heads must be a multiple of the {kh} key/value heads (grouped-query \
             attention shares each key/value head among H / Hkv query heads): query {:?}, key {:?}, value {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    if kd != d {
        candle::bail!(
            "query and key must have the same head_dim: query {:?}, key {:?}",
            q.dims(),
            k.dims()
        )
    }
    if vs != s {
        candle::bail!(
            "key and value must have the same sequence length: key {:?}, value {:?}",
            k.dims(),
            v.dims()
        )
    }
    if k.dtype() != q.dtype() || v.dtype() != q.dtype() {
        candle::bail!(
            "query, key and value must share one dtype: {:?}, {:?}, {:?}",
            q.dtype(),
            k.dtype(),
            v.dtype()
        )
    }
    if !k.device().same_device(q.device()) || !v.device().same_device(q.device()) {
        candle::bail!(
            "query, key and value must be on one device: {:?}, {:?}, {:?}",
            q.device().location(),
            k.device().location(),
            v.device().location()
        )
    }
    Ok(AttentionShape {
        batch: b,
        heads: h,
        q_len: l,
        k_len: s,
    })
}

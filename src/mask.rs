//! Attention masks: which keys each query may attend to.
//!
//! One convention for the whole crate, the one of `torch.nn.MultiheadAttention`:
//!
//! * **Boolean masks** (candle dtype `U8`): a non-zero entry means the key may **not** be
//!   attended (`true` = blocked).
//! * **Additive masks** (any float dtype): added to the scaled scores before the softmax;
//!   `-inf` blocks a key, finite values bias it.
//! * **Key padding** `(batch, src_len)`: `true` (non-zero) marks a padding key, blocked for
//!   every query of that batch row. A float key padding mask is additive, as in torch.
//! * **Causal** with an `offset`: query `i` sees keys `0..=i + offset`. The offset is the
//!   number of keys already cached before the first query (incremental decoding).
//!
//! Attention masks (boolean or additive) may be `(L, S)`, `(batch * heads, L, S)` (torch's
//! 3-D layout) or `(batch | 1, heads | 1, L | 1, S)`. Any number of masks combine with
//! [`Mask::and`]: boolean parts are OR-ed, additive parts are summed.
//!
//! A query row whose keys are **all** blocked is defined to produce zeros (output and
//! attention weights), never NaN; see [`crate::sdpa`].

use candle::{DType, Device, Tensor};

/// The sizes a mask is resolved against: `(batch, heads, query length, key length)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size `B`.
    pub batch: usize,
    /// Number of heads `H`.
    pub heads: usize,
    /// Query sequence length `L`.
    pub q_len: usize,
    /// Key sequence length `S`.
    pub k_len: usize,
}

/// One constraint of a [`Mask`]. Tensors are kept as given and checked against the
/// attention shape when the mask is resolved, because torch's 3-D layout needs `heads`.
#[derive(Clone, Debug)]
enum MaskTerm {
    Causal {
        offset: usize,
    },
    /// `U8`, non-zero = blocked. Rank 2, 3 or 4.
    Blocked(Tensor),
    /// Float, added to the scores. Rank 2, 3 or 4.
    Additive(Tensor),
    /// `(batch, S)`: `U8` (non-zero = padding) or float (additive).
    KeyPadding(Tensor),
}

/// A set of attention constraints: none, causal, boolean, additive and key padding, in any
/// combination. Cheap to clone (tensors are reference counted).
///
/// ```
/// use candle::{Device, Tensor};
/// use candle_attention::Mask;
/// # fn main() -> candle::Result<()> {
/// let pad = Tensor::new(&[[0u8, 0, 1], [0, 0, 0]], &Device::Cpu)?; // (batch=2, S=3)
/// let mask = Mask::causal().and(Mask::key_padding(pad)?);
/// assert!(!mask.is_none());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Mask {
    terms: Vec<MaskTerm>,
}

fn is_float(dtype: DType) -> bool {
    dtype.is_float()
}

impl Mask {
    /// No constraint: every query sees every key.
    pub fn none() -> Self {
        Self::default()
    }

    /// Causal mask for self-attention: query `i` sees keys `0..=i`.
    pub fn causal() -> Self {
        Self::causal_with_offset(0)
    }

    /// Causal mask when `offset` keys are already cached before the first query: query `i`
    /// sees keys `0..=i + offset`.
    pub fn causal_with_offset(offset: usize) -> Self {
        Self {
            terms: vec![MaskTerm::Causal { offset }],
        }
    }

    /// A boolean mask (`U8`, non-zero = blocked), shaped `(L, S)`, `(batch * heads, L, S)` or
    /// `(batch | 1, heads | 1, L | 1, S)`. Fails if the dtype is not `U8`.
    pub fn boolean(mask: Tensor) -> candle::Result<Self> {
        check_rank("boolean attention mask", &mask, &[2, 3, 4])?;
        if mask.dtype() != DType::U8 {
            candle::bail!(
                "boolean attention mask must have dtype U8 (non-zero = blocked), got {:?}; \
                 use Mask::additive for a float mask",
                mask.dtype()
            )
        }
        Ok(Self::single(MaskTerm::Blocked(mask)))
    }

    /// A mask of **blocked** positions: non-zero = this key may *not* be attended (torch
    /// `nn.MultiheadAttention`'s boolean `attn_mask`). Any integer dtype; same shapes as
    /// [`Mask::boolean`]. The opposite polarity is [`Mask::allowed`].
    ///
    /// ```
    /// use candle::{Device, Tensor};
    /// use candle_attention::Mask;
    /// # fn main() -> candle::Result<()> {
    /// // Query 0 may not look at key 1.
    /// let blocked = Mask::blocked(Tensor::new(&[[0u8, 1], [0, 0]], &Device::Cpu)?)?;
    /// // The same constraint written as torch's F.scaled_dot_product_attention wants it.
    /// let allowed = Mask::allowed(Tensor::new(&[[1u8, 0], [1, 1]], &Device::Cpu)?)?;
    /// # let _ = (blocked, allowed);
    /// # Ok(()) }
    /// ```
    pub fn blocked(mask: Tensor) -> candle::Result<Self> {
        check_integer("blocked mask", &mask)?;
        Self::boolean(mask.ne(0f64)?)
    }

    /// A mask of **allowed** positions: non-zero = this key *may* be attended, zero = blocked.
    /// This is the polarity of torch's `F.scaled_dot_product_attention` boolean `attn_mask`
    /// (`True` = take part in attention) and of Hugging Face `attention_mask`s. Any integer
    /// dtype; same shapes as [`Mask::boolean`].
    pub fn allowed(mask: Tensor) -> candle::Result<Self> {
        check_integer("allowed mask", &mask)?;
        Self::boolean(mask.eq(0f64)?)
    }

    /// Key padding from a Hugging Face `attention_mask` `(batch, S)`: `1` = a real token (keep),
    /// `0` = padding (blocked). Any integer dtype (`U8`, `U32`, `I64`). The opposite polarity of
    /// [`Mask::key_padding`], which takes `true` = padding as torch does.
    pub fn key_padding_from_attention_mask(attention_mask: &Tensor) -> candle::Result<Self> {
        check_rank("attention_mask", attention_mask, &[2])?;
        check_integer("attention_mask", attention_mask)?;
        Self::key_padding(attention_mask.eq(0f64)?)
    }

    /// An additive mask (float dtype), added to the scaled scores; `-inf` blocks. Shapes as
    /// for [`Mask::boolean`].
    pub fn additive(mask: Tensor) -> candle::Result<Self> {
        check_rank("additive attention mask", &mask, &[2, 3, 4])?;
        if !is_float(mask.dtype()) {
            candle::bail!(
                "additive attention mask must have a float dtype, got {:?}; \
                 use Mask::boolean for a U8 (true = blocked) mask",
                mask.dtype()
            )
        }
        Ok(Self::single(MaskTerm::Additive(mask)))
    }

    /// An attention mask as torch takes it: `U8` is boolean (`true` = blocked), a float
    /// dtype is additive. Other dtypes are an error.
    pub fn attn_mask(mask: Tensor) -> candle::Result<Self> {
        match mask.dtype() {
            DType::U8 => Self::boolean(mask),
            dt if is_float(dt) => Self::additive(mask),
            dt => candle::bail!(
                "attention mask must be U8 (boolean, true = blocked) or a float dtype \
                 (additive), got {dt:?}"
            ),
        }
    }

    /// A key padding mask `(batch, S)`: `U8` non-zero marks padding (blocked), a float mask is
    /// added to the scores of each key.
    pub fn key_padding(mask: Tensor) -> candle::Result<Self> {
        check_rank("key padding mask", &mask, &[2])?;
        let dt = mask.dtype();
        if dt != DType::U8 && !is_float(dt) {
            candle::bail!(
                "key padding mask must be U8 (true = padding) or a float dtype (additive), \
                 got {dt:?}"
            )
        }
        Ok(Self::single(MaskTerm::KeyPadding(mask)))
    }

    fn single(term: MaskTerm) -> Self {
        Self { terms: vec![term] }
    }

    /// Both masks at once: a key is blocked if either blocks it; additive parts add up.
    pub fn and(mut self, other: Mask) -> Self {
        self.terms.extend(other.terms);
        self
    }

    /// True when there is no constraint at all.
    pub fn is_none(&self) -> bool {
        self.terms.is_empty()
    }

    /// The causal offset when the mask is exactly one causal constraint, `None` otherwise.
    /// Kernels use it to skip blocks above the diagonal.
    pub fn as_causal(&self) -> Option<usize> {
        match self.terms.as_slice() {
            [MaskTerm::Causal { offset }] => Some(*offset),
            _ => None,
        }
    }

    /// True when the mask has a boolean or additive attention mask term (anything beyond
    /// causal and key padding). The flash-attn path checks it before copying any mask data.
    #[cfg_attr(not(feature = "flash-attn"), allow(dead_code))]
    pub(crate) fn has_attention_mask_terms(&self) -> bool {
        self.terms
            .iter()
            .any(|t| matches!(t, MaskTerm::Blocked(_) | MaskTerm::Additive(_)))
    }

    /// True when any part of the mask is causal (with whatever offset).
    pub fn has_causal(&self) -> bool {
        self.terms
            .iter()
            .any(|t| matches!(t, MaskTerm::Causal { .. }))
    }

    /// Checks every part of the mask against `shape` without building anything, with an
    /// error that names the mask and both shapes when one does not fit.
    pub fn validate(&self, shape: AttentionShape) -> candle::Result<()> {
        for term in &self.terms {
            match term {
                MaskTerm::Causal { .. } => {}
                MaskTerm::Blocked(t) | MaskTerm::Additive(t) => {
                    attn_mask_as_4d(t, shape)?;
                }
                MaskTerm::KeyPadding(t) => {
                    key_padding_as_4d(t, shape)?;
                }
            }
        }
        Ok(())
    }

    /// Resolves the mask to an additive `f32` bias broadcastable to `(B, H, L, S)`: its shape is
    /// `(B | 1, H | 1, L | 1, S)`, entries are `0`, `-inf` (blocked) or the sum of additive parts.
    /// Returns `None` for an empty mask. The bias lives on `device`.
    pub fn to_bias(
        &self,
        shape: AttentionShape,
        device: &Device,
    ) -> candle::Result<Option<Tensor>> {
        if self.terms.is_empty() {
            return Ok(None);
        }
        let mut blocked: Option<Tensor> = None; // U8, 1 = blocked
        let mut additive: Option<Tensor> = None; // F32
        let mut add_blocked = |t: Tensor| -> candle::Result<()> {
            let t = nonzero(&t)?; // normalise any non-zero byte to 1
            blocked = Some(match blocked.take() {
                None => t,
                Some(b) => b.broadcast_maximum(&t)?,
            });
            Ok(())
        };
        let mut add_additive = |t: Tensor| -> candle::Result<()> {
            let t = t.to_dtype(DType::F32)?;
            additive = Some(match additive.take() {
                None => t,
                Some(a) => add_blocking_wins(&a, &t)?,
            });
            Ok(())
        };
        for term in &self.terms {
            match term {
                MaskTerm::Causal { offset } => {
                    add_blocked(causal_blocked(shape.q_len, shape.k_len, *offset, device)?)?
                }
                MaskTerm::Blocked(t) => add_blocked(attn_mask_as_4d(t, shape)?.to_device(device)?)?,
                MaskTerm::Additive(t) => {
                    add_additive(attn_mask_as_4d(t, shape)?.to_device(device)?)?
                }
                MaskTerm::KeyPadding(t) => {
                    let t = key_padding_as_4d(t, shape)?.to_device(device)?;
                    if t.dtype() == DType::U8 {
                        add_blocked(t)?
                    } else {
                        add_additive(t)?
                    }
                }
            }
        }
        let blocked_bias = match blocked {
            None => None,
            Some(b) => {
                let neg_inf = neg_inf_like(b.shape(), device)?;
                let zero = Tensor::zeros(b.shape(), DType::F32, device)?;
                Some(b.where_cond(&neg_inf, &zero)?)
            }
        };
        let bias = match (blocked_bias, additive) {
            (Some(b), Some(a)) => add_blocking_wins(&b, &a)?,
            (Some(b), None) => b,
            (None, Some(a)) => a,
            (None, None) => return Ok(None),
        };
        // Always 4-D so that callers can rely on the rank.
        Ok(Some(to_rank4(bias)?))
    }
}

/// A [`Mask`] split into the parts a fused kernel applies inside its tiles, without
/// materialising an `(L, S)` matrix for the structured ones. Produced by `Mask::decompose`.
///
/// The sum `causal + key_bias + bias` (with the causal part as `-inf` above the diagonal) is
/// exactly what [`Mask::to_bias`] returns.
#[derive(Clone, Debug, Default)]
pub struct MaskParts {
    /// Causal constraint: query `i` sees keys `0..=i + offset`. Several causal terms keep the
    /// smallest offset (the strictest).
    pub causal_offset: Option<usize>,
    /// Key padding as an additive `f32` bias `(B, S)`: `0`, `-inf` for a padding key, or the
    /// sum of float key padding masks.
    pub key_bias: Option<Tensor>,
    /// Every other term (boolean and additive attention masks) as an additive `f32` bias of
    /// shape `(B | 1, H | 1, L | 1, S)`, as [`Mask::to_bias`] builds it.
    pub bias: Option<Tensor>,
}

impl Mask {
    /// Splits the mask into a causal offset, a per-key bias `(B, S)` and a general bias
    /// `(B | 1, H | 1, L | 1, S)` (see [`MaskParts`]), validating it against `shape`. Tensors
    /// are placed on `device`.
    pub(crate) fn decompose(
        &self,
        shape: AttentionShape,
        device: &Device,
    ) -> candle::Result<MaskParts> {
        self.validate(shape)?;
        let mut parts = MaskParts::default();
        let mut rest = Mask::none();
        for term in &self.terms {
            match term {
                MaskTerm::Causal { offset } => {
                    parts.causal_offset =
                        Some(parts.causal_offset.map_or(*offset, |o| o.min(*offset)))
                }
                MaskTerm::KeyPadding(t) => {
                    let t = t.to_device(device)?;
                    let t = if t.dtype() == DType::U8 {
                        let neg_inf = neg_inf_like(t.shape(), device)?;
                        let zero = Tensor::zeros(t.shape(), DType::F32, device)?;
                        nonzero(&t)?.where_cond(&neg_inf, &zero)?
                    } else {
                        t.to_dtype(DType::F32)?
                    };
                    parts.key_bias = Some(match parts.key_bias.take() {
                        None => t,
                        Some(kb) => add_blocking_wins(&kb, &t)?,
                    });
                }
                MaskTerm::Blocked(_) | MaskTerm::Additive(_) => rest.terms.push(term.clone()),
            }
        }
        parts.bias = rest.to_bias(shape, device)?;
        Ok(parts)
    }
}

/// `a + b` (broadcast, `f32`) where `-inf` in either blocks: `-inf` even where the other
/// holds `+inf` or NaN (plain addition would give NaN there). Masks combine this way, so a
/// blocked position stays blocked whatever an additive mask adds to it, and every kernel can
/// skip blocked keys without reading them.
pub(crate) fn add_blocking_wins(a: &Tensor, b: &Tensor) -> candle::Result<Tensor> {
    let sum = a.broadcast_add(b)?;
    let is_neg_inf = |t: &Tensor| -> candle::Result<Tensor> {
        t.eq(&neg_inf_of(t.dtype(), t.shape(), t.device())?)
    };
    let blocked = is_neg_inf(a)?
        .broadcast_maximum(&is_neg_inf(b)?)?
        .broadcast_as(sum.shape())?;
    let neg_inf = neg_inf_of(sum.dtype(), sum.shape(), a.device())?;
    blocked.where_cond(&neg_inf, &sum)
}

/// `-inf` (`f32`) broadcast to `shape`, filled on `device`: unlike `Tensor::new` or a scalar
/// operand, this copies nothing from the host (on CUDA such a copy waits for the device).
fn neg_inf_like(shape: &candle::Shape, device: &Device) -> candle::Result<Tensor> {
    neg_inf_of(DType::F32, shape, device)
}

/// `-inf` of `dtype` (a float dtype) broadcast to `shape`, filled on `device`.
fn neg_inf_of(dtype: DType, shape: &candle::Shape, device: &Device) -> candle::Result<Tensor> {
    Tensor::full(f32::NEG_INFINITY, (), device)?
        .to_dtype(dtype)?
        .broadcast_as(shape)
}

/// `U8` 1 where `t` (an integer mask) is non-zero, compared on its device (no host scalar).
fn nonzero(t: &Tensor) -> candle::Result<Tensor> {
    t.ne(&Tensor::zeros((), t.dtype(), t.device())?.broadcast_as(t.shape())?)
}

/// Polarity-explicit masks take integer tensors only: a float tensor is more likely an additive
/// mask passed to the wrong constructor.
fn check_integer(what: &str, t: &Tensor) -> candle::Result<()> {
    if t.dtype().is_float() {
        candle::bail!(
            "{what} must have an integer dtype (U8, U32 or I64), got {:?}; \
             use Mask::additive for a float mask",
            t.dtype()
        )
    }
    Ok(())
}

fn check_rank(what: &str, t: &Tensor, ranks: &[usize]) -> candle::Result<()> {
    if !ranks.contains(&t.rank()) {
        candle::bail!(
            "{what} must have rank {}, got shape {:?}",
            ranks
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            t.dims()
        )
    }
    Ok(())
}

fn to_rank4(t: Tensor) -> candle::Result<Tensor> {
    match t.rank() {
        4 => Ok(t),
        2 => t.unsqueeze(0)?.unsqueeze(0),
        3 => t.unsqueeze(0),
        r => candle::bail!("internal: mask of rank {r}"),
    }
}

/// `(L, S)` U8 mask with 1 where key `j > i + offset`.
fn causal_blocked(
    q_len: usize,
    k_len: usize,
    offset: usize,
    device: &Device,
) -> candle::Result<Tensor> {
    if offset.saturating_add(q_len).max(k_len) > u32::MAX as usize {
        candle::bail!("causal mask too large: offset {offset} + {q_len} queries, {k_len} keys")
    }
    let rows =
        Tensor::arange(offset as u32, (offset + q_len) as u32, device)?.reshape((q_len, 1))?;
    let cols = Tensor::arange(0u32, k_len as u32, device)?.reshape((1, k_len))?;
    cols.broadcast_gt(&rows)
}

/// Reshapes a 2-, 3- or 4-D attention mask to `(B | 1, H | 1, L | 1, S)`.
fn attn_mask_as_4d(t: &Tensor, s: AttentionShape) -> candle::Result<Tensor> {
    let dims = t.dims();
    let mismatch = || -> candle::Result<Tensor> {
        candle::bail!(
            "attention mask of shape {dims:?} does not fit {} queries and {} keys with batch {} \
             and {} heads: expected (L, S) = ({}, {}), (batch * heads, L, S) = ({}, {}, {}) or \
             (batch | 1, heads | 1, L | 1, S)",
            s.q_len,
            s.k_len,
            s.batch,
            s.heads,
            s.q_len,
            s.k_len,
            s.batch * s.heads,
            s.q_len,
            s.k_len
        )
    };
    let fits = |d: usize, full: usize| d == full || d == 1;
    match *dims {
        [l, k] if l == s.q_len && k == s.k_len => t.reshape((1, 1, l, k)),
        [bh, l, k] if bh == s.batch * s.heads && l == s.q_len && k == s.k_len => {
            t.reshape((s.batch, s.heads, l, k))
        }
        [b, h, l, k]
            if fits(b, s.batch) && fits(h, s.heads) && fits(l, s.q_len) && k == s.k_len =>
        {
            Ok(t.clone())
        }
        _ => mismatch(),
    }
}

/// Reshapes a `(B, S)` key padding mask to `(B, 1, 1, S)`.
fn key_padding_as_4d(t: &Tensor, s: AttentionShape) -> candle::Result<Tensor> {
    let dims = t.dims();
    if dims != [s.batch, s.k_len] {
        candle::bail!(
            "key padding mask of shape {dims:?} does not match batch {} and key length {}: \
             expected (batch, S) = ({}, {})",
            s.batch,
            s.k_len,
            s.batch,
            s.k_len
        )
    }
    t.reshape((s.batch, 1, 1, s.k_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, heads: usize, q_len: usize, k_len: usize) -> AttentionShape {
        AttentionShape {
            batch,
            heads,
            q_len,
            k_len,
        }
    }

    fn bias_vec(m: &Mask, s: AttentionShape) -> Vec<f32> {
        m.to_bias(s, &Device::Cpu)
            .unwrap()
            .unwrap()
            .broadcast_as((s.batch, s.heads, s.q_len, s.k_len))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn causal_with_offset_blocks_the_future() {
        let inf = f32::NEG_INFINITY;
        let b = bias_vec(&Mask::causal_with_offset(1), shape(1, 1, 2, 4));
        assert_eq!(b, vec![0., 0., inf, inf, 0., 0., 0., inf]);
    }

    #[test]
    fn boolean_and_key_padding_combine() {
        let dev = Device::Cpu;
        let inf = f32::NEG_INFINITY;
        let m = Mask::boolean(Tensor::new(&[[0u8, 1, 0], [0, 0, 0]], &dev).unwrap())
            .unwrap()
            .and(Mask::key_padding(Tensor::new(&[[0u8, 0, 7]], &dev).unwrap()).unwrap());
        let b = bias_vec(&m, shape(1, 1, 2, 3));
        assert_eq!(b, vec![0., inf, inf, 0., 0., inf]);
    }

    #[test]
    fn additive_parts_add_up() {
        let dev = Device::Cpu;
        let m = Mask::additive(Tensor::new(&[[0.5f32, -1.0]], &dev).unwrap())
            .unwrap()
            .and(Mask::key_padding(Tensor::new(&[[1.0f32, 2.0]], &dev).unwrap()).unwrap());
        assert_eq!(bias_vec(&m, shape(1, 1, 1, 2)), vec![1.5, 1.0]);
    }

    #[test]
    fn three_d_masks_split_batch_and_heads() {
        let dev = Device::Cpu;
        // (B*H = 2*2, L=1, S=2): head-specific.
        let t = Tensor::new(&[[[0u8, 1]], [[1, 0]], [[0, 0]], [[1, 1]]], &dev).unwrap();
        let bias = Mask::boolean(t)
            .unwrap()
            .to_bias(shape(2, 2, 1, 2), &dev)
            .unwrap()
            .unwrap();
        assert_eq!(bias.dims(), &[2, 2, 1, 2]);
    }

    #[test]
    fn decomposed_parts_add_up_to_the_bias() {
        let dev = Device::Cpu;
        let s = shape(2, 2, 3, 4);
        let m = Mask::causal_with_offset(1)
            .and(
                Mask::boolean(
                    Tensor::new(&[[0u8, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], &dev).unwrap(),
                )
                .unwrap(),
            )
            .and(
                Mask::key_padding(Tensor::new(&[[0u8, 0, 0, 1], [0, 0, 0, 0]], &dev).unwrap())
                    .unwrap(),
            )
            .and(
                Mask::key_padding(
                    Tensor::new(&[[0.5f32, 0., 1., 0.], [0., -1., 0., 2.]], &dev).unwrap(),
                )
                .unwrap(),
            )
            .and(Mask::causal_with_offset(2));
        let parts = m.decompose(s, &dev).unwrap();
        assert_eq!(parts.causal_offset, Some(1));
        let full = (s.batch, s.heads, s.q_len, s.k_len);
        let mut sum = parts
            .bias
            .unwrap()
            .broadcast_as(full)
            .unwrap()
            .contiguous()
            .unwrap();
        let kb = parts.key_bias.unwrap().reshape((2, 1, 1, 4)).unwrap();
        sum = sum.broadcast_add(&kb).unwrap();
        let causal = Mask::causal_with_offset(1)
            .to_bias(s, &dev)
            .unwrap()
            .unwrap();
        sum = sum.broadcast_add(&causal).unwrap();
        let got: Vec<f32> = sum.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, bias_vec(&m, s));
    }

    #[test]
    fn wrong_shapes_and_dtypes_name_the_problem() {
        let dev = Device::Cpu;
        let m = Mask::boolean(Tensor::zeros((3, 5), DType::U8, &dev).unwrap()).unwrap();
        let err = m.validate(shape(1, 2, 4, 5)).unwrap_err().to_string();
        assert!(err.contains("[3, 5]") && err.contains("(4, 5)"), "{err}");
        let err = Mask::boolean(Tensor::zeros((3, 5), DType::F32, &dev).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("U8") && err.contains("F32"), "{err}");
        let err = Mask::key_padding(Tensor::zeros(5, DType::U8, &dev).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 2") && err.contains("[5]"), "{err}");
        let m = Mask::key_padding(Tensor::zeros((2, 4), DType::U8, &dev).unwrap()).unwrap();
        let err = m.validate(shape(2, 1, 3, 5)).unwrap_err().to_string();
        assert!(err.contains("[2, 4]") && err.contains("(2, 5)"), "{err}");
        let err = Mask::attn_mask(Tensor::zeros((2, 2), DType::I64, &dev).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("I64"), "{err}");
    }
}

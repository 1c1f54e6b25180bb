//! Multi-head attention (Vaswani et al., section 3.2.2), with everything
//! `torch.nn.MultiheadAttention` has.
//!
//! `MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`, `head_i = Attention(Q W_i^Q, K W_i^K,
//! V W_i^V)`, with `d_k = d_v = embed_dim / num_heads`.
//!
//! Layout is batch first: inputs `(batch, seq, features)`, or `(seq, features)` unbatched.

use crate::mask::{AttentionShape, Mask};
use crate::projection::Projection;
use crate::sdpa::{scaled_dot_product_attention, AttentionOutput, SdpaArgs};
use crate::weights::{MhaLayout, MhaWeightsInfo, WeightMatrix, WeightSource};
use candle::{DType, Module, ModuleT, Tensor};
use candle_nn::{Init, VarBuilder};

/// The hyper-parameters of a [`MultiHeadAttention`], named as in `torch.nn.MultiheadAttention`.
#[derive(Clone, Debug, PartialEq)]
pub struct MultiHeadAttentionConfig {
    /// Model size `E` (query features and output features).
    pub embed_dim: usize,
    /// Number of (query) heads `h`; must divide `embed_dim`.
    pub num_heads: usize,
    /// Number of key/value heads `Hkv` (defaults to `num_heads`); must divide `num_heads`.
    /// Fewer than `num_heads` is grouped-query attention (`1`: multi-query): the key and value
    /// projections have `num_kv_heads * head_dim` outputs and each key/value head serves
    /// `num_heads / num_kv_heads` query heads.
    pub num_kv_heads: usize,
    /// Key features (defaults to `embed_dim`).
    pub kdim: usize,
    /// Value features (defaults to `embed_dim`).
    pub vdim: usize,
    /// Whether the input and output projections have biases. With torch's layouts that is all
    /// of them (`in_proj_bias` and `out_proj.bias`) or none. With the Hugging Face layout,
    /// [`MultiHeadAttention::load`] reads "some of them": each of `q_proj.bias`, `k_proj.bias`,
    /// `v_proj.bias`, `out_proj.bias` that the weights lack is a zero bias (Whisper has no
    /// `k_proj.bias`); at least one must be present.
    pub bias: bool,
    /// Learned `bias_k`/`bias_v` `(1, 1, E)` appended to the projected keys/values.
    pub add_bias_kv: bool,
    /// Append a zero key and value to every head (after `bias_k`/`bias_v`).
    pub add_zero_attn: bool,
    /// Dropout probability on the attention weights, in training mode only.
    pub dropout: f32,
}

impl MultiHeadAttentionConfig {
    /// `embed_dim` and `num_heads`, everything else as torch's defaults: `kdim = vdim =
    /// embed_dim`, `num_kv_heads = num_heads`, biases on, no `bias_kv`, no zero attention, no
    /// dropout.
    pub fn new(embed_dim: usize, num_heads: usize) -> Self {
        Self {
            embed_dim,
            num_heads,
            num_kv_heads: num_heads,
            kdim: embed_dim,
            vdim: embed_dim,
            bias: true,
            add_bias_kv: false,
            add_zero_attn: false,
            dropout: 0.0,
        }
    }

    /// The configuration the weights under one prefix describe, with `num_heads` heads (the
    /// one thing weights do not tell).
    pub fn from_weights(info: &MhaWeightsInfo, num_heads: usize) -> Self {
        Self {
            kdim: info.kdim,
            vdim: info.vdim,
            bias: info.bias,
            add_bias_kv: info.add_bias_kv,
            ..Self::new(info.embed_dim, num_heads)
        }
    }

    /// Sets the number of key/value heads (grouped-query attention when below `num_heads`,
    /// multi-query for 1); it must divide `num_heads`.
    pub fn with_num_kv_heads(mut self, num_kv_heads: usize) -> Self {
        self.num_kv_heads = num_kv_heads;
        self
    }

    /// Sets the key input size.
    pub fn with_kdim(mut self, kdim: usize) -> Self {
        self.kdim = kdim;
        self
    }

    /// Sets the value input size.
    pub fn with_vdim(mut self, vdim: usize) -> Self {
        self.vdim = vdim;
        self
    }

    /// Turns projection biases on or off.
    pub fn with_bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// Turns `bias_k`/`bias_v` on or off.
    pub fn with_add_bias_kv(mut self, add_bias_kv: bool) -> Self {
        self.add_bias_kv = add_bias_kv;
        self
    }

    /// Turns the extra zero key/value on or off.
    pub fn with_add_zero_attn(mut self, add_zero_attn: bool) -> Self {
        self.add_zero_attn = add_zero_attn;
        self
    }

    /// Sets the attention dropout probability (applied in training mode only).
    pub fn with_dropout(mut self, dropout: f32) -> Self {
        self.dropout = dropout;
        self
    }

    /// `embed_dim / num_heads`, the size `d_k = d_v` of each head.
    pub fn head_dim(&self) -> usize {
        self.embed_dim.checked_div(self.num_heads).unwrap_or(0)
    }

    /// `num_kv_heads * head_dim`: the output size of the key and value projections (`E`
    /// without grouped-query attention).
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim()
    }

    /// Checks the sizes: all positive, `num_heads` divides `embed_dim`, `num_kv_heads` divides
    /// `num_heads`, dropout in `[0, 1)`.
    pub fn validate(&self) -> candle::Result<()> {
        if self.num_heads == 0 {
            candle::bail!("num_heads must be at least 1, got 0")
        }
        if self.embed_dim == 0 {
            candle::bail!("embed_dim must be at least 1, got 0")
        }
        if !self.embed_dim.is_multiple_of(self.num_heads) {
            candle::bail!(
                "embed_dim {} is not divisible by num_heads {}: each head needs embed_dim / num_heads features",
                self.embed_dim,
                self.num_heads
            )
        }
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            candle::bail!(
                "num_heads {} is not a multiple of num_kv_heads {}: grouped-query attention shares each key/value head among num_heads / num_kv_heads query heads",
                self.num_heads,
                self.num_kv_heads
            )
        }
        if self.num_kv_heads != self.num_heads && (self.add_bias_kv || self.add_zero_attn) {
            candle::bail!(
                "add_bias_kv and add_zero_attn (torch nn.MultiheadAttention options) are not supported with grouped-query attention: num_kv_heads {} != num_heads {}",
                self.num_kv_heads,
                self.num_heads
            )
        }
        if self.kdim == 0 || self.vdim == 0 {
            candle::bail!(
                "kdim and vdim must be at least 1, got kdim {} and vdim {}",
                self.kdim,
                self.vdim
            )
        }
        if !(0.0..1.0).contains(&self.dropout) {
            candle::bail!("dropout must be in [0, 1), got {}", self.dropout)
        }
        Ok(())
    }
}

/// Options of [`MultiHeadAttention::attend`]. `Default`: no mask, no weights (averaged over
/// heads when requested), eval mode.
#[derive(Clone, Debug)]
pub struct AttentionArgs<'a> {
    /// Attention mask: causal, boolean (`true` = blocked) or additive; see [`Mask`].
    pub mask: Mask,
    /// Key padding mask `(batch, S)` (`(S)` for unbatched input): `U8` non-zero = padding,
    /// or float (additive). Same as adding `Mask::key_padding` to `mask`.
    pub key_padding: Option<&'a Tensor>,
    /// Return the attention weights.
    pub need_weights: bool,
    /// Average the weights over heads (`(B, L, S)`) rather than per head (`(B, H, L, S)`).
    pub average_weights: bool,
    /// Training mode: applies attention dropout.
    pub train: bool,
}

impl Default for AttentionArgs<'_> {
    fn default() -> Self {
        Self {
            mask: Mask::none(),
            key_padding: None,
            need_weights: false,
            average_weights: true,
            train: false,
        }
    }
}

/// The stored weights of the input projections: torch's one fused `(E + 2 kv, E)` tensor, or
/// the query, key and value weights.
enum InputWeights {
    Fused(WeightMatrix),
    Separate([WeightMatrix; 3]),
}

/// The input projections of a [`MultiHeadAttention`] as built: Q, K and V fused into one
/// `(E + 2 kv, E)` projection, or three.
enum InputProjections {
    Fused(Projection),
    Separate([Projection; 3]),
}

impl From<Projection> for InputProjections {
    fn from(qkv: Projection) -> Self {
        Self::Fused(qkv)
    }
}

/// Multi-head attention, a [`candle::Module`] (self-attention, no mask) with
/// [`MultiHeadAttention::attend`] for the full query/key/value call.
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    cfg: MultiHeadAttentionConfig,
    layout: MhaLayout,
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    out_proj: Projection,
    /// Q, K and V in one `(E, 3E)` projection (when `kdim = vdim = E`), of which `q_proj`,
    /// `k_proj` and `v_proj` are views: self-attention projects its input once.
    qkv_proj: Option<Projection>,
    /// K and V in one `(E, 2E)` view of `qkv_proj`: encoder-decoder attention projects the
    /// memory once.
    kv_proj: Option<Projection>,
    /// `bias_k` and `bias_v`, each `(1, 1, E)`.
    bias_kv: Option<(Tensor, Tensor)>,
}

impl MultiHeadAttention {
    /// Loads the projections under `vb`'s prefix, detecting the name layout (torch fused,
    /// torch separate or Hugging Face; see [`crate::weights`]).
    ///
    /// The weights must agree with `cfg`: shapes are checked (errors give both shapes; the key
    /// and value projections have `cfg.kv_dim()` outputs), and biases or `bias_k`/`bias_v`
    /// present in the file but off in `cfg` (or the reverse) are an error rather than silently
    /// ignored. In the Hugging Face layout, `cfg.bias` means "some projections have a bias":
    /// each missing one of `q_proj.bias`, `k_proj.bias`, `v_proj.bias`, `out_proj.bias` is a
    /// zero bias (Whisper's attention has no `k_proj.bias`).
    pub fn load(cfg: MultiHeadAttentionConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::load(vb))
    }

    /// Fresh weights for training, initialised as torch does: xavier-uniform input projections,
    /// zero biases, `out_proj.weight` uniform in `±1/sqrt(E)`, xavier-normal `bias_k`/`bias_v`.
    /// Tensors are named in torch's layout (fused unless `kdim`/`vdim` differ from
    /// `embed_dim`), so a trained `VarMap` saves as a torch state dict. With grouped-query
    /// attention (`num_kv_heads < num_heads`, which torch's module lacks) they are named in
    /// the Hugging Face layout, `k_proj.weight` `(num_kv_heads * head_dim, kdim)` and so on.
    /// With a `VarBuilder` over a `VarMap` the tensors become trainable variables.
    pub fn new(cfg: MultiHeadAttentionConfig, vb: VarBuilder) -> candle::Result<Self> {
        Self::from_source(cfg, &WeightSource::init(vb))
    }

    /// The one construction path: the projections from `source` (under its prefix). A source
    /// that loads ([`WeightSource::load`], [`WeightSource::in_place`]) behaves as
    /// [`MultiHeadAttention::load`]: the layout is detected and the weights checked against
    /// `cfg`; one that creates ([`WeightSource::init`]) as [`MultiHeadAttention::new`].
    ///
    /// Shapes: the query projection is `(E, E)`, the key and value projections
    /// `(kv, kdim)` and `(kv, vdim)` with `kv = num_kv_heads * head_dim` (`E` without
    /// grouped-query attention); torch's fused `in_proj_weight` is `(E + 2 kv, E)` and
    /// `in_proj_bias` `(E + 2 kv)`. Q, K and V share one fused projection (self-attention
    /// projects its input once) when they come as one tensor, or as constant tensors that can
    /// be concatenated; weights read in place from a mapped file stay three projections.
    pub fn from_source(
        cfg: MultiHeadAttentionConfig,
        source: &WeightSource,
    ) -> candle::Result<Self> {
        cfg.validate()?;
        let layout = if source.creates() {
            if cfg.num_kv_heads != cfg.num_heads {
                MhaLayout::HuggingFace
            } else if cfg.kdim == cfg.embed_dim && cfg.vdim == cfg.embed_dim {
                MhaLayout::TorchFused
            } else {
                MhaLayout::TorchSeparate
            }
        } else {
            Self::detect_layout(&cfg, source)?
        };
        Self::build(cfg, layout, source)
    }

    /// The name layout of the stored weights under `source`'s prefix, checked against `cfg`'s
    /// biases and `bias_k`/`bias_v`.
    fn detect_layout(
        cfg: &MultiHeadAttentionConfig,
        source: &WeightSource,
    ) -> candle::Result<MhaLayout> {
        let prefix = source.prefix();
        let vb = source.var_builder();
        let layout = MhaLayout::detect(|n| source.contains(n)).ok_or_else(|| {
            // Ask the backend for the tensor anyway: ours lists what exists under the prefix.
            let detail = match vb.get_unchecked("in_proj_weight") {
                Err(e) => e.to_string(),
                Ok(_) => String::new(),
            };
            candle::Error::Msg(format!(
                "{}; {detail}",
                MhaLayout::not_found_message(&prefix)
            ))
        })?;
        let bias_names: &[&str] = match layout {
            MhaLayout::TorchFused | MhaLayout::TorchSeparate => &["in_proj_bias", "out_proj.bias"],
            MhaLayout::HuggingFace => {
                &["q_proj.bias", "k_proj.bias", "v_proj.bias", "out_proj.bias"]
            }
        };
        let present: Vec<&str> = bias_names
            .iter()
            .copied()
            .filter(|n| source.contains(n))
            .collect();
        if present.is_empty() == cfg.bias {
            let what = if present.is_empty() {
                format!("have no projection biases ({})", bias_names.join(", "))
            } else {
                format!("have projection biases ({})", present.join(", "))
            };
            candle::bail!(
                "weights under '{prefix}' {what} but the config says bias = {}",
                cfg.bias
            )
        }
        let present_bias_kv = source.contains("bias_k") || source.contains("bias_v");
        if present_bias_kv != cfg.add_bias_kv {
            candle::bail!(
                "weights under '{prefix}' {} bias_k/bias_v but the config says add_bias_kv = {}",
                if present_bias_kv { "have" } else { "have no" },
                cfg.add_bias_kv
            )
        }
        Ok(layout)
    }

    /// Reads (or creates) every tensor of `layout` from `src`.
    fn build(
        cfg: MultiHeadAttentionConfig,
        layout: MhaLayout,
        src: &WeightSource,
    ) -> candle::Result<Self> {
        let e = cfg.embed_dim;
        let kv = cfg.kv_dim();
        let xavier = |fan_out: usize, fan_in: usize| {
            let bound = (6.0 / (fan_in + fan_out) as f64).sqrt();
            Init::Uniform {
                lo: -bound,
                up: bound,
            }
        };
        // A shape error on a key/value tensor says what size grouped-query attention expects.
        let kv_context = |err: candle::Error| -> candle::Error {
            if kv == e && cfg.num_kv_heads == cfg.num_heads {
                return err;
            }
            candle::Error::Msg(format!(
                "{err} (key/value projections have num_kv_heads {} × head_dim {} = {kv} outputs, query projection {e})",
                cfg.num_kv_heads,
                cfg.head_dim()
            ))
        };
        let zeros = Init::Const(0.0);
        let fused_rows = e + 2 * kv;
        // The input projections' weights first (a shape error names the weight, which says
        // more than its bias's), then their biases: one fused `(E + 2kv, E)` weight, or three.
        let names = match layout {
            MhaLayout::TorchFused => {
                if cfg.kdim != e || cfg.vdim != e {
                    candle::bail!(
                        "fused in_proj_weight under '{}' needs kdim = vdim = embed_dim = {e}, config has kdim {} and vdim {}",
                        src.prefix(),
                        cfg.kdim,
                        cfg.vdim
                    )
                }
                None
            }
            MhaLayout::TorchSeparate => Some(["q_proj_weight", "k_proj_weight", "v_proj_weight"]),
            MhaLayout::HuggingFace => Some(["q_proj.weight", "k_proj.weight", "v_proj.weight"]),
        };
        let weights = match names {
            None => InputWeights::Fused(
                src.matrix((fused_rows, e), "in_proj_weight", xavier(fused_rows, e))
                    .map_err(kv_context)?,
            ),
            Some([q_name, k_name, v_name]) => InputWeights::Separate([
                src.matrix((e, e), q_name, xavier(e, e))?,
                src.matrix((kv, cfg.kdim), k_name, xavier(kv, cfg.kdim))
                    .map_err(kv_context)?,
                src.matrix((kv, cfg.vdim), v_name, xavier(kv, cfg.vdim))
                    .map_err(kv_context)?,
            ]),
        };
        // Hugging Face layouts may carry some biases only (Whisper: no `k_proj.bias`); a
        // missing one is a zero bias. `detect_layout` has checked that at least one is there.
        let has_bias = |name: &str| cfg.bias && (src.creates() || src.contains(name));
        let (q_b, k_b, v_b, fused_b) = if !cfg.bias {
            (None, None, None, None)
        } else {
            match layout {
                MhaLayout::TorchFused | MhaLayout::TorchSeparate => {
                    let b = src
                        .tensor(fused_rows, "in_proj_bias", zeros)
                        .map_err(kv_context)?;
                    (
                        Some(b.narrow(0, 0, e)?),
                        Some(b.narrow(0, e, kv)?),
                        Some(b.narrow(0, e + kv, kv)?),
                        Some(b),
                    )
                }
                MhaLayout::HuggingFace => {
                    let opt = |len: usize, name: &str| -> candle::Result<Option<Tensor>> {
                        has_bias(name)
                            .then(|| src.tensor(len, name, zeros))
                            .transpose()
                    };
                    (
                        opt(e, "q_proj.bias")?,
                        opt(kv, "k_proj.bias").map_err(kv_context)?,
                        opt(kv, "v_proj.bias").map_err(kv_context)?,
                        None,
                    )
                }
            }
        };
        let [q_w, k_w, v_w] = match weights {
            InputWeights::Fused(fused) => {
                let qkv = Projection::from_matrix(fused, fused_b)?;
                return Self::assemble(cfg, layout, qkv.into(), src);
            }
            InputWeights::Separate(parts) => parts,
        };
        // Separate tensors are concatenated into one fused weight only when they are
        // constants of the same inputs: a copy of a `Var` would not see its training updates,
        // and weights read in place from a mapped file lie apart.
        let fused = match (&q_w, &k_w, &v_w) {
            (WeightMatrix::Tensor(q), WeightMatrix::Tensor(k), WeightMatrix::Tensor(v))
                if cfg.kdim == e
                    && cfg.vdim == e
                    && [q, k, v]
                        .into_iter()
                        .chain([&q_b, &k_b, &v_b].into_iter().flatten())
                        .all(|t| !t.track_op()) =>
            {
                let bias = if [&q_b, &k_b, &v_b].iter().all(|b| b.is_none()) {
                    None
                } else {
                    // A missing bias of a partial set is zeros in the fused one.
                    let part = |b: &Option<Tensor>, len: usize| match b {
                        Some(b) => Ok(b.clone()),
                        None => Tensor::zeros(len, q.dtype(), q.device()),
                    };
                    Some(Tensor::cat(
                        &[&part(&q_b, e)?, &part(&k_b, kv)?, &part(&v_b, kv)?],
                        0,
                    )?)
                };
                Some(Projection::new(&Tensor::cat(&[q, k, v], 0)?, bias)?)
            }
            _ => None,
        };
        let inputs = match fused {
            Some(qkv) => InputProjections::Fused(qkv),
            None => InputProjections::Separate([
                Projection::from_matrix(q_w, q_b)?,
                Projection::from_matrix(k_w, k_b)?,
                Projection::from_matrix(v_w, v_b)?,
            ]),
        };
        Self::assemble(cfg, layout, inputs, src)
    }

    /// The output projection and `bias_k`/`bias_v` from `src`, around the input projections.
    fn assemble(
        cfg: MultiHeadAttentionConfig,
        layout: MhaLayout,
        inputs: InputProjections,
        src: &WeightSource,
    ) -> candle::Result<Self> {
        let e = cfg.embed_dim;
        let kv = cfg.kv_dim();
        let out_bound = 1.0 / (e as f64).sqrt();
        let out_w = src.matrix(
            (e, e),
            "out_proj.weight",
            Init::Uniform {
                lo: -out_bound,
                up: out_bound,
            },
        )?;
        let out_b = match layout {
            MhaLayout::HuggingFace => cfg.bias && (src.creates() || src.contains("out_proj.bias")),
            MhaLayout::TorchFused | MhaLayout::TorchSeparate => cfg.bias,
        }
        .then(|| src.tensor(e, "out_proj.bias", Init::Const(0.0)))
        .transpose()?;
        let bias_kv = if cfg.add_bias_kv {
            let hint = Init::Randn {
                mean: 0.0,
                stdev: out_bound,
            };
            Some((
                src.tensor((1, 1, e), "bias_k", hint)?,
                src.tensor((1, 1, e), "bias_v", hint)?,
            ))
        } else {
            None
        };
        let (q_proj, k_proj, v_proj, qkv_proj, kv_proj) = match inputs {
            InputProjections::Fused(qkv) => (
                qkv.narrow_outputs(0, e)?,
                qkv.narrow_outputs(e, kv)?,
                qkv.narrow_outputs(e + kv, kv)?,
                Some(qkv.clone()),
                Some(qkv.narrow_outputs(e, 2 * kv)?),
            ),
            InputProjections::Separate([q, k, v]) => (q, k, v, None, None),
        };
        Ok(Self {
            q_proj,
            k_proj,
            v_proj,
            out_proj: Projection::from_matrix(out_w, out_b)?,
            qkv_proj,
            kv_proj,
            bias_kv,
            layout,
            cfg,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MultiHeadAttentionConfig {
        &self.cfg
    }

    /// The name layout the weights were loaded from (or created in).
    pub fn layout(&self) -> MhaLayout {
        self.layout
    }

    /// The dtype of the weights; inputs must have it.
    pub fn dtype(&self) -> DType {
        self.out_proj.dtype()
    }

    /// Attention of `query` over `key`/`value`.
    ///
    /// * `query` `(B, L, E)`, `key` `(B, S, kdim)`, `value` `(B, S, vdim)`; or unbatched
    ///   `(L, E)`, `(S, kdim)`, `(S, vdim)`. Self-attention passes the same tensor three times.
    /// * `args`: masks (attention masks `(L, S)`, `(B * H, L, S)` or `(B | 1, H | 1, L, S)`; key
    ///   padding `(B, S)`), whether to return weights, training mode.
    /// * Returns `output` `(B, L, E)` (`(L, E)` unbatched) and, if requested, `weights`
    ///   `(B, L, S')` averaged over heads or `(B, H, L, S')` per head (without `B` when
    ///   unbatched), where `S' = S + add_bias_kv + add_zero_attn`, as torch returns them.
    ///
    /// A query whose keys are all masked gets zero attention weights, so its output row is
    /// `out_proj.bias` (zero attention output, projected).
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        let (query_in, key_in, value_in) = (query, key, value);
        let unbatched = query.rank() == 2;
        let expected_rank = if unbatched { 2 } else { 3 };
        for (name, t, feat) in [
            ("query", query, self.cfg.embed_dim),
            ("key", key, self.cfg.kdim),
            ("value", value, self.cfg.vdim),
        ] {
            if t.rank() != 2 && t.rank() != 3 {
                candle::bail!("{name} must be (batch, seq, {feat}) or unbatched (seq, {feat}), got shape {:?}", t.dims())
            }
            if t.rank() != expected_rank {
                candle::bail!(
                    "query {:?} is {} but {name} {:?} is not: all three must be batched (batch, seq, features) or all unbatched (seq, features)",
                    query.dims(),
                    if unbatched { "unbatched" } else { "batched" },
                    t.dims()
                )
            }
            let last = t.dim(candle::D::Minus1)?;
            if last != feat {
                candle::bail!(
                    "{name} has {last} features (shape {:?}) but the layer expects {feat}",
                    t.dims()
                )
            }
            if t.dtype() != self.dtype() {
                candle::bail!(
                    "{name} has dtype {:?} but the layer's weights are {:?}; convert one of them with to_dtype",
                    t.dtype(),
                    self.dtype()
                )
            }
        }
        let batchify = |t: &Tensor| {
            if unbatched {
                t.unsqueeze(0)
            } else {
                Ok(t.clone())
            }
        };
        let (query, key, value) = (batchify(query)?, batchify(key)?, batchify(value)?);
        let (b, _, _) = query.dims3()?;
        let (kb, s, _) = key.dims3()?;
        let (vb, vs, _) = value.dims3()?;
        if kb != b || vb != b {
            candle::bail!(
                "query, key and value must have the same batch size: query {:?}, key {:?}, value {:?}",
                query.dims(),
                key.dims(),
                value.dims()
            )
        }
        if vs != s {
            candle::bail!(
                "key and value must have the same length: key {:?}, value {:?}",
                key.dims(),
                value.dims()
            )
        }
        let key_padding = match args.key_padding {
            Some(kp) if unbatched && kp.rank() == 1 => Some(kp.unsqueeze(0)?),
            kp => kp.cloned(),
        };
        // Self-attention (one tensor passed three times) projects it once.
        let (q, k, v) = match &self.qkv_proj {
            Some(_) if query_in.id() == key_in.id() && key_in.id() == value_in.id() => {
                self.project_self(&query)?
            }
            _ => {
                let (k, v) = self.project_key_value(&key, &value)?;
                (self.project_query(&query)?, k, v)
            }
        };
        let batched_args = AttentionArgs {
            key_padding: key_padding.as_ref(),
            ..args.clone()
        };
        let AttentionOutput { output, weights } =
            self.attend_projected(&q, &k, &v, &batched_args)?;
        if unbatched {
            let weights = weights.map(|w| w.squeeze(0)).transpose()?;
            return Ok(AttentionOutput {
                output: output.squeeze(0)?,
                weights,
            });
        }
        Ok(AttentionOutput { output, weights })
    }

    /// `(B, N, heads · head_dim)` → `(B, heads, N, head_dim)`.
    /// A strided view, not a copy: the tiled kernel reads it in place and the naive one makes
    /// its own contiguous copy.
    fn split_heads(&self, t: &Tensor, heads: usize) -> candle::Result<Tensor> {
        let (b, n, _) = t.dims3()?;
        t.reshape((b, n, heads, self.cfg.head_dim()))?
            .transpose(1, 2)
    }

    /// `(B, N, Σ heads · head_dim)`, the output of a fused projection, → one
    /// `(B, heads[i], N, head_dim)` tensor per part: strided views of it, no copies.
    fn split_fused<const C: usize>(
        &self,
        t: &Tensor,
        heads: [usize; C],
    ) -> candle::Result<[Tensor; C]> {
        let (b, n, _) = t.dims3()?;
        let total: usize = heads.iter().sum();
        let t = t.reshape((b, n, total, self.cfg.head_dim()))?;
        let mut parts = Vec::with_capacity(C);
        let mut start = 0;
        for h in heads {
            parts.push(t.narrow(2, start, h)?.transpose(1, 2)?);
            start += h;
        }
        Ok(parts
            .try_into()
            .expect("one part per projection was pushed"))
    }

    /// Self-attention's three projections of `x` `(B, L, E)`: queries `(B, H, L, head_dim)`,
    /// keys and values `(B, Hkv, L, head_dim)`, the floats of [`MultiHeadAttention::project_query`]
    /// and [`MultiHeadAttention::project_key_value`] on `x`. One fused product where the
    /// weights are fused; otherwise the three products run side by side on the thread pool,
    /// so that a decoding step joins the pool once for them instead of three times (each
    /// product of a few rows is short, and every join can leave a thread to fall asleep and be
    /// woken for the next one). Off the CPU, one after the other.
    pub(crate) fn project_self(&self, x: &Tensor) -> candle::Result<(Tensor, Tensor, Tensor)> {
        if let Some(qkv) = &self.qkv_proj {
            let heads = [
                self.cfg.num_heads,
                self.cfg.num_kv_heads,
                self.cfg.num_kv_heads,
            ];
            let [q, k, v] = self.split_fused(&qkv.forward(x)?, heads)?;
            return Ok((q, k, v));
        }
        let (q, k, v) = (
            || self.q_proj.forward(x),
            || self.k_proj.forward(x),
            || self.v_proj.forward(x),
        );
        // On a GPU the products queue on one stream: nothing to gain from threads.
        let (q, (k, v)) = if x.device().is_cpu() {
            rayon::join(q, || rayon::join(k, v))
        } else {
            (q(), (k(), v()))
        };
        let hkv = self.cfg.num_kv_heads;
        Ok((
            self.split_heads(&q?, self.cfg.num_heads)?,
            self.split_heads(&k?, hkv)?,
            self.split_heads(&v?, hkv)?,
        ))
    }

    /// Projects queries `(B, L, E)` and splits the heads: `(B, H, L, head_dim)`.
    pub fn project_query(&self, query: &Tensor) -> candle::Result<Tensor> {
        self.split_heads(&self.q_proj.forward(query)?, self.cfg.num_heads)
    }

    /// Projects keys `(B, S, kdim)` and values `(B, S, vdim)` and splits the heads: two
    /// `(B, Hkv, S, head_dim)` tensors (`Hkv = num_kv_heads`, which is `H` without
    /// grouped-query attention). This is what a KV cache stores: `bias_k`/`bias_v` and the
    /// zero attention key are not included (they are appended by
    /// [`MultiHeadAttention::attend_projected`]).
    pub fn project_key_value(
        &self,
        key: &Tensor,
        value: &Tensor,
    ) -> candle::Result<(Tensor, Tensor)> {
        let hkv = self.cfg.num_kv_heads;
        if let Some(kv) = &self.kv_proj {
            // Encoder-decoder attention passes the memory as both: one product for both.
            if key.id() == value.id() {
                let [k, v] = self.split_fused(&kv.forward(key)?, [hkv, hkv])?;
                return Ok((k, v));
            }
        }
        Ok((
            self.split_heads(&self.k_proj.forward(key)?, hkv)?,
            self.split_heads(&self.v_proj.forward(value)?, hkv)?,
        ))
    }

    /// The output projection `W^O` (with its bias) on concatenated heads: `heads` `(B, L,
    /// H · d_v)` (or `(L, H · d_v)`) → `(B, L, E)` (or `(L, E)`). With
    /// [`MultiHeadAttention::project_query`] and [`MultiHeadAttention::project_key_value`] it
    /// lets a caller rebuild the block step by step (`crate::explain` does).
    pub fn project_output(&self, heads: &Tensor) -> candle::Result<Tensor> {
        self.out_proj.forward(heads)
    }

    /// Attention over already projected heads, then the output projection.
    ///
    /// * `q` `(B, H, L, head_dim)` from [`MultiHeadAttention::project_query`]; `k`, `v`
    ///   `(B, Hkv, S, head_dim)` from [`MultiHeadAttention::project_key_value`] (e.g. a KV
    ///   cache).
    /// * Masks are resolved against the `S` keys given (key padding `(B, S)`); `bias_k`/`bias_v`
    ///   and the zero key are appended here, visible to every query.
    /// * Returns `output` `(B, L, E)` and, if requested, the weights `(B, L, S')` averaged or
    ///   `(B, H, L, S')` per head.
    pub fn attend_projected(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        let heads = self.attend_heads(q, k, v, args)?;
        Ok(AttentionOutput {
            output: self.out_proj.forward(&heads.output)?,
            weights: heads.weights,
        })
    }

    /// The queries' projection `(B, L, E)` → `(B, L, H · head_dim)`, heads not split (see
    /// [`MultiHeadAttention::split_query_heads`]): a decoding step of several batches projects
    /// all their rows at once and splits them after.
    pub(crate) fn project_query_rows(&self, query: &Tensor) -> candle::Result<Tensor> {
        self.q_proj.forward(query)
    }

    /// `(B, L, H · head_dim)` from [`MultiHeadAttention::project_query_rows`] →
    /// `(B, H, L, head_dim)`.
    pub(crate) fn split_query_heads(&self, q: &Tensor) -> candle::Result<Tensor> {
        self.split_heads(q, self.cfg.num_heads)
    }

    /// [`MultiHeadAttention::attend_heads`] over keys and values `(B, Hkv, S, head_dim)` that a
    /// cache holds in shared slots (`kv`, of shapes `kv_dims` = `(Hkv, S, head_dim, head_dim)`),
    /// read by the kernel in place: the same floats as `attend_heads` on them as tensors.
    /// `None` where only tensors will do (weights asked for, training, `bias_kv`, zero
    /// attention, or a call the CPU kernel would not take; see
    /// `sdpa::attention_over_slots`).
    pub(crate) fn attend_heads_over_slots(
        &self,
        q: &Tensor,
        kv: std::sync::Arc<dyn crate::sdpa::cpu::paged::GatherHeads>,
        kv_dims: (usize, usize, usize, usize),
        args: &AttentionArgs,
    ) -> candle::Result<Option<AttentionOutput>> {
        if args.need_weights || args.train || self.bias_kv.is_some() || self.cfg.add_zero_attn {
            return Ok(None);
        }
        let mask = Self::heads_mask(args)?;
        let Some(heads) = crate::sdpa::attention_over_slots(q, kv, kv_dims, &mask)? else {
            return Ok(None);
        };
        Ok(Some(AttentionOutput {
            output: self.concat_heads(&heads)?,
            weights: None,
        }))
    }

    /// The mask of an attention call: `args.mask` and its key padding as one [`Mask`].
    fn heads_mask(args: &AttentionArgs) -> candle::Result<Mask> {
        let mut mask = args.mask.clone();
        if let Some(kp) = args.key_padding {
            mask = mask.and(Mask::key_padding(kp.clone())?);
        }
        Ok(mask)
    }

    /// Attention's output `(B, H, L, d_v)` as the concatenated heads `(B, L, H · d_v)`.
    fn concat_heads(&self, heads: &Tensor) -> candle::Result<Tensor> {
        let (b, _, l, _) = heads.dims4()?;
        heads.transpose(1, 2)?.reshape((b, l, self.cfg.embed_dim))
    }

    /// [`MultiHeadAttention::attend_projected`] without the output projection: `output` is the
    /// concatenated heads `(B, L, H · d_v)`.
    pub(crate) fn attend_heads(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        args: &AttentionArgs,
    ) -> candle::Result<AttentionOutput> {
        let (b, h, l, hd) = q.dims4()?;
        let s = k.dim(2)?;
        let mut mask = Self::heads_mask(args)?;
        let (mut k, mut v) = (k.clone(), v.clone());
        let mut extra_keys = 0;
        if let Some((bias_k, bias_v)) = &self.bias_kv {
            let as_head = |t: &Tensor| -> candle::Result<Tensor> {
                t.reshape((1, 1, h, hd))?
                    .transpose(1, 2)?
                    .broadcast_as((b, h, 1, hd))
            };
            k = Tensor::cat(&[&k, &as_head(bias_k)?], 2)?;
            v = Tensor::cat(&[&v, &as_head(bias_v)?], 2)?;
            extra_keys += 1;
        }
        if self.cfg.add_zero_attn {
            let zeros = Tensor::zeros((b, h, 1, hd), k.dtype(), k.device())?;
            k = Tensor::cat(&[&k, &zeros], 2)?;
            v = Tensor::cat(&[&v, &zeros], 2)?;
            extra_keys += 1;
        }
        if extra_keys > 0 && !mask.is_none() {
            // The appended keys are visible to every query: resolve the mask on the original
            // keys and pad it with unblocked columns, as torch does.
            let shape = AttentionShape {
                batch: b,
                heads: h,
                q_len: l,
                k_len: s,
            };
            if let Some(bias) = mask.to_bias(shape, q.device())? {
                let pad_shape = (bias.dim(0)?, bias.dim(1)?, bias.dim(2)?, extra_keys);
                let pad = Tensor::zeros(pad_shape, bias.dtype(), bias.device())?;
                mask = Mask::additive(Tensor::cat(&[&bias, &pad], 3)?)?;
            }
        }
        let sdpa = SdpaArgs {
            mask,
            scale: None,
            need_weights: args.need_weights,
            dropout: if args.train { self.cfg.dropout } else { 0.0 },
        };
        let attn = scaled_dot_product_attention(q, &k, &v, &sdpa)?;
        let output = self.concat_heads(&attn.output)?;
        let weights = match attn.weights {
            Some(w) if args.average_weights => Some(w.mean(1)?),
            w => w,
        };
        Ok(AttentionOutput { output, weights })
    }
}

impl MultiHeadAttention {
    /// Self-attention without mask, in eval mode: `xs` `(B, L, E)` or `(L, E)` → same shape.
    /// For training mode (attention dropout) use [`candle::ModuleT::forward_t`].
    pub fn forward(&self, xs: &Tensor) -> candle::Result<Tensor> {
        self.forward_t(xs, false)
    }
}

/// Self-attention without mask: `xs` `(B, L, E)` or `(L, E)` → same shape, with attention
/// dropout when `train` (as torch's module in `.train()` mode).
///
/// `MultiHeadAttention` is a [`ModuleT`] rather than a [`candle::Module`]: candle implements
/// `ModuleT` for every `Module` by ignoring the `train` flag, so a type can be one or the
/// other; like `candle_nn::Dropout` we choose the one that honours training mode. The inherent
/// [`MultiHeadAttention::forward`] is the eval pass.
impl ModuleT for MultiHeadAttention {
    fn forward_t(&self, xs: &Tensor, train: bool) -> candle::Result<Tensor> {
        let args = AttentionArgs {
            train,
            ..Default::default()
        };
        Ok(self.attend(xs, xs, xs, &args)?.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::{save_tensors, TensorFile};
    use candle::Device;

    /// `project_self` gives the floats of the separate projections, both for weights read in
    /// place from a mapped file (three products run side by side) and for constant tensors
    /// (one fused product).
    #[test]
    fn self_projections_equal_the_separate_ones() -> candle::Result<()> {
        let (e, heads) = (64, 4);
        let dev = Device::Cpu;
        let names = ["q_proj", "k_proj", "v_proj", "out_proj"];
        let mut tensors = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let w = Tensor::randn(0f32, 0.2, (e, e), &dev)?;
            let b = Tensor::randn(0f32, 0.1, e, &dev)?.affine(1.0, i as f64)?;
            tensors.push((format!("{name}.weight"), w));
            tensors.push((format!("{name}.bias"), b));
        }
        let dir = tempfile::tempdir().map_err(candle::Error::wrap)?;
        let path = dir.path().join("attn.safetensors");
        let named: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        save_tensors(&named, &path)?;
        let file = TensorFile::open(&path)?;
        let cfg = MultiHeadAttentionConfig::new(e, heads);
        let vb = file.var_builder(DType::F32, &dev);
        let mapped = MultiHeadAttention::from_source(
            cfg.clone(),
            &WeightSource::in_place(vb.clone(), &file),
        )?;
        let fused = MultiHeadAttention::from_source(cfg, &WeightSource::load(vb))?;
        assert!(mapped.qkv_proj.is_none() && fused.qkv_proj.is_some());
        // 36 rows: the row kernel of a decoding step.
        let x = Tensor::randn(0f32, 1.0, (36, 1, e), &dev)?;
        for attn in [&mapped, &fused] {
            let (q, k, v) = attn.project_self(&x)?;
            let (k2, v2) = attn.project_key_value(&x, &x)?;
            let q2 = attn.project_query(&x)?;
            for (got, want) in [(q, q2), (k, k2), (v, v2)] {
                assert_eq!(got.dims(), want.dims());
                let diff = got
                    .flatten_all()?
                    .to_vec1::<f32>()?
                    .into_iter()
                    .zip(want.flatten_all()?.to_vec1::<f32>()?)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                assert_eq!(
                    diff, 0,
                    "project_self differs from the separate projections"
                );
            }
        }
        Ok(())
    }
}

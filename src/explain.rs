//! One attention block of a real model on a real sentence, step by step: the paper's
//!
//! ```text
//! Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V        MultiHead = Concat(head_1, ..., head_h) W^O
//! ```
//!
//! computed with candle ops from the block's own projections, every intermediate kept, per head
//! (`H` heads, `L` queries, `S` keys, `d_k = d_v = d_model / H`):
//!
//! | step | tensor | shape |
//! |---|---|---|
//! | project | [`AttentionSteps::q`], [`AttentionSteps::k`], [`AttentionSteps::v`] | `(H, L, d_k)`, `(H, S, d_k)`, `(H, S, d_v)` |
//! | compare | [`AttentionSteps::scores`] `= Q·Kᵀ` | `(H, L, S)` |
//! | scale | [`AttentionSteps::scaled`] `= scores / √d_k` | `(H, L, S)` |
//! | mask | [`AttentionSteps::mask`] (`0` or `-inf`), [`AttentionSteps::masked`] | `(H, L, S)` |
//! | softmax | [`AttentionSteps::weights`] (rows sum to 1) | `(H, L, S)` |
//! | blend | [`AttentionSteps::blended`] `= weights · V` | `(H, L, d_v)` |
//! | concatenate | [`AttentionSteps::concat`] | `(L, H · d_v)` |
//! | project | [`AttentionSteps::output`] `= concat · W^Oᵀ + b^O` | `(L, d_model)` |
//!
//! [`explain_attention`] does this for any [`MultiHeadAttention`] and inputs;
//! [`Explanation`] does it for a block of a translation model on one text — any model that
//! exposes its stacks and a traced pass ([`ExplainModel`]: a MarianMT directory, the `attn`
//! command's number translator) — with the block's inputs taken from the model's own forward
//! pass ([`crate::transformer::ModelTrace`]) and the output of that pass kept beside the
//! explained one ([`Explanation::forward_output`]) to show they agree.
//!
//! **Which decoder input.** Decoder self-attention and encoder-decoder attention need target
//! tokens: they are the model's own greedy translation of the text, teacher-forced (start
//! token, then the translation without its end token; see [`TeacherForcing`]). Query row `t`
//! reads decoder token `t` and predicts token `t + 1`.
//!
//! **Why `√d_k`** is measured rather than asserted: [`AttentionSteps::scaling_comparison`]
//! takes the softmax of the same scores with and without the division and reports, per query,
//! the largest weight, the entropy and the largest entry of the softmax Jacobian (how far a
//! weight moves when a score moves; it vanishes when the softmax saturates).
//!
//! ```
//! use candle::{DType, Device, Tensor};
//! use candle_attention::explain::explain_attention;
//! use candle_attention::{Mask, MultiHeadAttention, MultiHeadAttentionConfig};
//! use candle_nn::{VarBuilder, VarMap};
//! # fn main() -> candle::Result<()> {
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let mha = MultiHeadAttention::new(MultiHeadAttentionConfig::new(32, 4), vb)?;
//! let x = Tensor::randn(0f32, 1., (5, 32), &Device::Cpu)?; // (L, E)
//! let steps = explain_attention(&mha, &x, &x, &x, &Mask::causal())?;
//! assert_eq!(steps.scores.dims(), &[4, 5, 5]); // (H, L, S)
//! assert_eq!(steps.output.dims(), &[5, 32]); // (L, E)
//! # Ok(()) }
//! ```

use crate::mask::{AttentionShape, Mask};
use crate::mha::MultiHeadAttention;
use crate::transformer::{AttentionTrace, ModelTrace, TransformerDecoder, TransformerEncoder};
use candle::{DType, Tensor, D};
use std::fmt;
use std::str::FromStr;

/// Where one translation looked: tokens and the cross-attention weights of one decoder layer
/// (what attention heatmaps draw). Returned by
/// [`crate::marian::MarianTranslator::cross_attention`] (and by the `attn` command's number
/// translator).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMap {
    /// Source tokens (columns): the normalised English words for the shipped translator, the
    /// sentencepiece pieces (`</s>` last) for MarianMT.
    pub source: Vec<String>,
    /// Output tokens (rows): German morphemes or target pieces, ending with `</s>` when the
    /// model stopped.
    pub output: Vec<String>,
    /// `weights[head][output][source]`, each row a distribution over the source tokens (sums to
    /// ~1; all zeros for a fully masked row).
    pub weights: Vec<Vec<Vec<f32>>>,
    /// The layer (0-based).
    pub layer: usize,
    /// Decoder layers in the model.
    pub num_layers: usize,
}

/// One text and the model's own greedy translation of it, as ids and token labels: what a
/// teacher-forced pass feeds the model to show its attention on a real sentence. Returned by
/// [`crate::marian::MarianTranslator::teacher_forcing`] (and by the `attn` command's number
/// translator).
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherForcing {
    /// The encoder input ids `(S)`, as the model reads the text.
    pub source_ids: Vec<u32>,
    /// One label per source id: the normalised English words for the shipped translator, the
    /// sentencepiece pieces (`</s>` last) for MarianMT.
    pub source_tokens: Vec<String>,
    /// The decoder input ids `(T)`: the start token, then the greedy translation without its
    /// end token. Position `t` reads `decoder_ids[t]` and predicts the token after it.
    pub decoder_ids: Vec<u32>,
    /// One label per decoder input id (`<bos>`, or `<pad>` as Marian's start token, first).
    pub decoder_tokens: Vec<String>,
    /// The translation as text.
    pub translation: String,
}

impl AttentionMap {
    /// For each output token (row), the source token (column) it attends to most, with the
    /// weights averaged over the heads: a word alignment (ties go to the first source token).
    pub fn alignment(&self) -> Vec<usize> {
        let rows = self.output.len();
        let cols = self.source.len();
        (0..rows)
            .map(|r| {
                let mean = |c: usize| -> f32 {
                    self.weights
                        .iter()
                        .map(|head| {
                            head.get(r)
                                .and_then(|row| row.get(c))
                                .copied()
                                .unwrap_or(0.0)
                        })
                        .sum()
                };
                (0..cols).fold(0, |best, c| if mean(c) > mean(best) { c } else { best })
            })
            .collect()
    }
}

/// A translation model whose attention blocks [`Explanation`] can show: its two stacks and a
/// traced teacher-forced pass. Models implement it (MarianMT in this crate; the `attn`
/// command's number translator in its own crate).
pub trait ExplainModel {
    /// The encoder stack.
    fn encoder(&self) -> &TransformerEncoder;
    /// The decoder stack.
    fn decoder(&self) -> &TransformerDecoder;
    /// A teacher-forced eval pass over one text, source ids `(S)` and decoder input ids `(T)`
    /// (start token first), recording every attention block (batch of one).
    fn trace_ids(&self, source_ids: &[u32], decoder_ids: &[u32]) -> candle::Result<ModelTrace>;
}

/// The three uses of attention in the encoder-decoder Transformer (paper section 3.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionUse {
    /// Encoder self-attention: every source token looks at every source token.
    EncoderSelf,
    /// Decoder self-attention: every target position looks at itself and the positions before
    /// it (the causal mask: it cannot look ahead).
    DecoderSelf,
    /// Encoder-decoder attention: every target position looks at every source token.
    Cross,
}

impl AttentionUse {
    /// All three, in the order of the paper.
    pub const ALL: [AttentionUse; 3] = [
        AttentionUse::EncoderSelf,
        AttentionUse::DecoderSelf,
        AttentionUse::Cross,
    ];

    /// The name on the command line: `encoder-self`, `decoder-self` or `cross`.
    pub fn name(self) -> &'static str {
        match self {
            AttentionUse::EncoderSelf => "encoder-self",
            AttentionUse::DecoderSelf => "decoder-self",
            AttentionUse::Cross => "cross",
        }
    }

    /// A phrase for people: `encoder self-attention`, ...
    pub fn describe(self) -> &'static str {
        match self {
            AttentionUse::EncoderSelf => "encoder self-attention",
            AttentionUse::DecoderSelf => "decoder self-attention",
            AttentionUse::Cross => "encoder-decoder (cross) attention",
        }
    }

    /// Whether the block lives in the encoder stack.
    fn in_encoder(self) -> bool {
        self == AttentionUse::EncoderSelf
    }
}

impl fmt::Display for AttentionUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AttentionUse {
    type Err = candle::Error;

    /// Parses a [`AttentionUse::name`]; the error lists the valid names.
    fn from_str(s: &str) -> candle::Result<Self> {
        AttentionUse::ALL
            .into_iter()
            .find(|u| u.name() == s)
            .ok_or_else(|| {
                candle::Error::Msg(format!(
                    "unknown attention use '{s}': valid are encoder-self, decoder-self, cross"
                ))
            })
    }
}

/// Every intermediate of one multi-head attention call on one sequence, per head. `H` heads,
/// `L` queries, `S` keys, `d_k`/`d_v` per head, `E` model features; all `f32`.
#[derive(Clone, Debug)]
pub struct AttentionSteps {
    /// Number of heads `H`.
    pub num_heads: usize,
    /// `d_k`, the size of each head's queries and keys.
    pub head_dim: usize,
    /// `d_v`, the size of each head's values (`d_k` in every model here).
    pub value_dim: usize,
    /// `1 / √d_k`, what the scores are multiplied by.
    pub scale: f64,
    /// The query input `(L, E)`.
    pub query_input: Tensor,
    /// The key input `(S, kdim)` (the value input is the same tensor in every model here).
    pub key_input: Tensor,
    /// Queries `X W^Q` per head, `(H, L, d_k)`.
    pub q: Tensor,
    /// Keys per head, `(H, S, d_k)`.
    pub k: Tensor,
    /// Values per head, `(H, S, d_v)`.
    pub v: Tensor,
    /// Raw scores `Q·Kᵀ`, `(H, L, S)`.
    pub scores: Tensor,
    /// `scores / √d_k`, `(H, L, S)`.
    pub scaled: Tensor,
    /// The additive mask, `0` where a query may look and `-inf` where it may not, `(H, L, S)`;
    /// `None` when nothing is masked.
    pub mask: Option<Tensor>,
    /// `scaled + mask`, what the softmax takes, `(H, L, S)`.
    pub masked: Tensor,
    /// Softmax of each row of `masked`, `(H, L, S)`: rows sum to 1 (a row whose keys are all
    /// masked is all zeros, as in [`MultiHeadAttention::attend`]).
    pub weights: Tensor,
    /// `weights · V` per head, `(H, L, d_v)`.
    pub blended: Tensor,
    /// The heads side by side, `(L, H · d_v)`.
    pub concat: Tensor,
    /// `concat · W^Oᵀ + b^O`, the block's output `(L, E)`.
    pub output: Tensor,
}

/// A `(1, N, F)` or `(N, F)` input as `(N, F)`.
fn one_sequence(name: &str, t: &Tensor) -> candle::Result<Tensor> {
    match t.dims() {
        [_, _] => Ok(t.clone()),
        [1, _, _] => t.squeeze(0),
        dims => candle::bail!(
            "explain takes one sequence: {name} must be (seq, features) or (1, seq, features), got {dims:?}"
        ),
    }
}

/// Runs `mha` on one sequence step by step and keeps every intermediate (see the module docs).
///
/// * `query` `(L, E)`, `key` `(S, kdim)`, `value` `(S, vdim)` (or each with a leading batch of
///   1), in the dtype of the weights;
/// * `mask`: any [`Mask`] (causal, key padding `(1, S)`, boolean, additive), resolved for a
///   batch of one.
///
/// The result equals [`MultiHeadAttention::attend`] with `need_weights` and per-head weights
/// (checked in `tests/explain.rs`). Grouped-query attention is shown with each key/value head
/// repeated for the query heads it serves; torch's `add_bias_kv` / `add_zero_attn`, which
/// append keys that are no token, are refused.
pub fn explain_attention(
    mha: &MultiHeadAttention,
    query: &Tensor,
    key: &Tensor,
    value: &Tensor,
    mask: &Mask,
) -> candle::Result<AttentionSteps> {
    let cfg = mha.config();
    if cfg.add_bias_kv || cfg.add_zero_attn {
        candle::bail!(
            "explain shows attention over the tokens only: this block has add_bias_kv = {} and \
             add_zero_attn = {}, which append keys that are not tokens",
            cfg.add_bias_kv,
            cfg.add_zero_attn
        )
    }
    let (query, key, value) = (
        one_sequence("query", query)?,
        one_sequence("key", key)?,
        one_sequence("value", value)?,
    );
    let (h, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim());
    let l = query.dim(0)?;
    let s = key.dim(0)?;
    let q = mha.project_query(&query.unsqueeze(0)?)?.squeeze(0)?;
    let (k, v) = mha.project_key_value(&key.unsqueeze(0)?, &value.unsqueeze(0)?)?;
    let (mut k, mut v) = (k.squeeze(0)?, v.squeeze(0)?);
    if hkv != h {
        // Query head i reads key/value head i / (H / Hkv).
        let group = (h / hkv) as u32;
        let index: Vec<u32> = (0..h as u32).map(|i| i / group).collect();
        let index = Tensor::new(index.as_slice(), k.device())?;
        k = k.contiguous()?.index_select(&index, 0)?;
        v = v.contiguous()?.index_select(&index, 0)?;
    }
    let to_f32 = |t: Tensor| -> candle::Result<Tensor> { t.to_dtype(DType::F32)?.contiguous() };
    let (q, k, v) = (to_f32(q)?, to_f32(k)?, to_f32(v)?);
    let scale = 1.0 / (d as f64).sqrt();
    let scores = q.matmul(&k.t()?)?;
    let scaled = (&scores * scale)?;
    let shape = AttentionShape {
        batch: 1,
        heads: h,
        q_len: l,
        k_len: s,
    };
    let mask = mask
        .to_bias(shape, q.device())?
        .map(|b| b.broadcast_as((1, h, l, s))?.squeeze(0)?.contiguous())
        .transpose()?;
    let (masked, weights) = match &mask {
        None => (
            scaled.clone(),
            candle_nn::ops::softmax_last_dim(&scaled.contiguous()?)?,
        ),
        Some(bias) => {
            let masked = (&scaled + bias)?;
            // A row with every key blocked would be NaN; it gets zero weights instead, as the
            // attention kernels define it.
            let dead = bias.eq(f64::NEG_INFINITY)?.min_keepdim(D::Minus1)?;
            let dead = dead.broadcast_as(masked.shape())?;
            let zeros = masked.zeros_like()?;
            let safe = dead.where_cond(&zeros, &masked)?;
            let weights = candle_nn::ops::softmax_last_dim(&safe)?;
            (masked, dead.where_cond(&zeros, &weights)?)
        }
    };
    let blended = weights.matmul(&v)?;
    let dv = v.dim(2)?;
    let concat = blended.transpose(0, 1)?.reshape((l, h * dv))?;
    let output = mha
        .project_output(&concat.to_dtype(mha.dtype())?.unsqueeze(0)?)?
        .squeeze(0)?
        .to_dtype(DType::F32)?;
    Ok(AttentionSteps {
        num_heads: h,
        head_dim: d,
        value_dim: dv,
        scale,
        query_input: query.to_dtype(DType::F32)?,
        key_input: key.to_dtype(DType::F32)?,
        q,
        k,
        v,
        scores,
        scaled,
        mask,
        masked,
        weights,
        blended,
        concat,
        output,
    })
}

/// What one softmax row looks like: its peak, its spread and how much it still moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// The key with the largest weight.
    pub argmax: usize,
    /// That weight.
    pub max_weight: f32,
    /// Entropy of the row in bits: 0 when one key takes everything, `log2(n)` when `n` keys
    /// share equally.
    pub entropy_bits: f32,
    /// The largest entry of the softmax Jacobian `∂p_i/∂z_j = p_i (δ_ij − p_j)` in absolute
    /// value: at most 0.25, near 0 when the softmax saturates (the vanishing gradient the paper
    /// scales by `1/√d_k` to avoid).
    pub max_gradient: f32,
}

impl RowStats {
    /// The statistics of a probability row `p` (all zeros for a fully masked row gives zeros).
    pub fn of(p: &[f32]) -> Self {
        let (mut argmax, mut max_weight) = (0, 0f32);
        let (mut first, mut second) = (0f32, 0f32);
        let mut entropy = 0f64;
        let mut diag = 0f32;
        for (j, &w) in p.iter().enumerate() {
            if w > max_weight {
                (argmax, max_weight) = (j, w);
            }
            if w > first {
                (first, second) = (w, first);
            } else if w > second {
                second = w;
            }
            if w > 0.0 {
                entropy -= w as f64 * (w as f64).log2();
            }
            diag = diag.max(w * (1.0 - w));
        }
        Self {
            argmax,
            max_weight,
            entropy_bits: entropy.max(0.0) as f32,
            max_gradient: diag.max(first * second),
        }
    }
}

/// The softmax of one head's scores with and without the `1/√d_k` scaling, row by row (from
/// [`AttentionSteps::scaling_comparison`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ScalingComparison {
    /// The head.
    pub head: usize,
    /// `√d_k`.
    pub sqrt_d_k: f64,
    /// Standard deviation of the raw scores `Q·Kᵀ` over the unmasked entries.
    pub raw_std: f32,
    /// Standard deviation of the scaled scores over the unmasked entries (`raw_std / √d_k`).
    pub scaled_std: f32,
    /// Per query, the softmax of the scaled scores (what the model uses).
    pub scaled: Vec<RowStats>,
    /// Per query, the softmax of the raw scores under the same mask (what it would be without
    /// the division).
    pub unscaled: Vec<RowStats>,
}

/// One head at a glance (from [`AttentionSteps::head_summaries`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HeadSummary {
    /// The head.
    pub head: usize,
    /// Per query: the key it attends to most, with its weight, entropy and gradient.
    pub rows: Vec<RowStats>,
    /// Mean entropy over the queries, in bits.
    pub mean_entropy_bits: f32,
}

/// Softmax of `z` over the entries `allowed` says (zeros elsewhere; all zeros when none is).
fn masked_softmax(z: &[f32], allowed: &[bool]) -> Vec<f32> {
    let max = z
        .iter()
        .zip(allowed)
        .filter(|(_, &a)| a)
        .map(|(&v, _)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return vec![0.0; z.len()];
    }
    let e: Vec<f64> = z
        .iter()
        .zip(allowed)
        .map(|(&v, &a)| if a { ((v - max) as f64).exp() } else { 0.0 })
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|&x| (x / sum) as f32).collect()
}

fn std_dev(values: &[f32]) -> f32 {
    if values.is_empty() {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    var.sqrt() as f32
}

impl AttentionSteps {
    /// Number of queries `L`.
    pub fn num_queries(&self) -> usize {
        self.q.dim(1).unwrap_or(0)
    }

    /// Number of keys `S`.
    pub fn num_keys(&self) -> usize {
        self.k.dim(1).unwrap_or(0)
    }

    /// Checks that `head` exists; the error lists the valid range.
    pub fn check_head(&self, head: usize) -> candle::Result<()> {
        if head >= self.num_heads {
            candle::bail!(
                "head {head} does not exist: this block has {} heads (0..={})",
                self.num_heads,
                self.num_heads - 1
            )
        }
        Ok(())
    }

    /// Head `head` of a per-head tensor (`q`, `scores`, `weights`, ...) as rows of numbers.
    pub fn head_rows(&self, per_head: &Tensor, head: usize) -> candle::Result<Vec<Vec<f32>>> {
        self.check_head(head)?;
        per_head.get(head)?.to_dtype(DType::F32)?.to_vec2()
    }

    /// `blocked[query][key]`: whether the mask stops `query` from looking at `key` in `head`.
    pub fn blocked(&self, head: usize) -> candle::Result<Vec<Vec<bool>>> {
        let (l, s) = (self.num_queries(), self.num_keys());
        match &self.mask {
            None => {
                self.check_head(head)?;
                Ok(vec![vec![false; s]; l])
            }
            Some(m) => Ok(self
                .head_rows(m, head)?
                .into_iter()
                .map(|row| row.into_iter().map(|b| b == f32::NEG_INFINITY).collect())
                .collect()),
        }
    }

    /// The paper's argument for `1/√d_k`, on these numbers: for `head`, the softmax of the
    /// scores with the scaling (the model's weights) and without it (the raw scores under the
    /// same mask), row by row.
    pub fn scaling_comparison(&self, head: usize) -> candle::Result<ScalingComparison> {
        let raw = self.head_rows(&self.scores, head)?;
        let weights = self.head_rows(&self.weights, head)?;
        let blocked = self.blocked(head)?;
        let mut unmasked = Vec::new();
        let mut unscaled = Vec::with_capacity(raw.len());
        for (row, blocked) in raw.iter().zip(&blocked) {
            let allowed: Vec<bool> = blocked.iter().map(|b| !b).collect();
            unmasked.extend(
                row.iter()
                    .zip(&allowed)
                    .filter(|(_, &a)| a)
                    .map(|(&v, _)| v),
            );
            unscaled.push(RowStats::of(&masked_softmax(row, &allowed)));
        }
        let raw_std = std_dev(&unmasked);
        Ok(ScalingComparison {
            head,
            sqrt_d_k: 1.0 / self.scale,
            raw_std,
            scaled_std: (raw_std as f64 * self.scale) as f32,
            scaled: weights.iter().map(|p| RowStats::of(p)).collect(),
            unscaled,
        })
    }

    /// Every head's weights summarised: per query the key it attends to most, and the
    /// entropy.
    pub fn head_summaries(&self) -> candle::Result<Vec<HeadSummary>> {
        (0..self.num_heads)
            .map(|head| {
                let rows: Vec<RowStats> = self
                    .head_rows(&self.weights, head)?
                    .iter()
                    .map(|p| RowStats::of(p))
                    .collect();
                let mean_entropy_bits = if rows.is_empty() {
                    0.0
                } else {
                    rows.iter().map(|r| r.entropy_bits).sum::<f32>() / rows.len() as f32
                };
                Ok(HeadSummary {
                    head,
                    rows,
                    mean_entropy_bits,
                })
            })
            .collect()
    }
}

/// One attention block of a translation model explained on one text: the steps, the tokens on
/// their rows and columns, and the block's output in the model's own forward pass.
#[derive(Clone, Debug)]
pub struct Explanation {
    /// Which of the three uses.
    pub attention: AttentionUse,
    /// The layer (0-based) within its stack.
    pub layer: usize,
    /// Layers in that stack.
    pub num_layers: usize,
    /// The text, its tokens and the model's greedy translation (the decoder input).
    pub example: TeacherForcing,
    /// Labels of the query rows (`L`): source tokens for encoder self-attention, decoder input
    /// tokens otherwise.
    pub query_tokens: Vec<String>,
    /// Labels of the key columns (`S`): source tokens, or decoder input tokens for decoder
    /// self-attention.
    pub key_tokens: Vec<String>,
    /// Every intermediate.
    pub steps: AttentionSteps,
    /// The block's output `(L, E)` as the model's forward pass computed it (through
    /// [`MultiHeadAttention::attend`] and its kernels), to compare with `steps.output`.
    pub forward_output: Tensor,
    /// The next-token logits of that forward pass `(T, target_vocab)`.
    pub logits: Tensor,
}

/// The block of `attention` at `layer`, and its trace; the error lists the valid layers.
fn block<'a>(
    encoder: &'a TransformerEncoder,
    decoder: &'a TransformerDecoder,
    trace: &'a ModelTrace,
    attention: AttentionUse,
    layer: usize,
) -> candle::Result<(&'a MultiHeadAttention, &'a AttentionTrace, usize)> {
    let num_layers = if attention.in_encoder() {
        encoder.layers().len()
    } else {
        decoder.layers().len()
    };
    if layer >= num_layers {
        let stack = if attention.in_encoder() {
            "encoder"
        } else {
            "decoder"
        };
        let valid = match num_layers {
            0 => "none".to_string(),
            n => format!("0..={}", n - 1),
        };
        candle::bail!(
            "layer {layer} does not exist: the {stack} has {num_layers} layers (valid: {valid})"
        )
    }
    Ok(match attention {
        AttentionUse::EncoderSelf => (
            encoder.layers()[layer].self_attn(),
            &trace.encoder[layer],
            num_layers,
        ),
        AttentionUse::DecoderSelf => (
            decoder.layers()[layer].self_attn(),
            &trace.decoder[layer].self_attn,
            num_layers,
        ),
        AttentionUse::Cross => (
            decoder.layers()[layer].cross_attn(),
            &trace.decoder[layer].cross_attn,
            num_layers,
        ),
    })
}

impl Explanation {
    /// Explains block `attention` of `layer` from a traced pass of a model made of `encoder`
    /// and `decoder` over `example` (batch of one): the block's inputs and mask are the ones
    /// the pass gave it. Errors when the layer does not exist (listing the valid ones).
    pub fn from_trace(
        encoder: &TransformerEncoder,
        decoder: &TransformerDecoder,
        trace: &ModelTrace,
        example: TeacherForcing,
        attention: AttentionUse,
        layer: usize,
    ) -> candle::Result<Self> {
        let (mha, block_trace, num_layers) = block(encoder, decoder, trace, attention, layer)?;
        let steps = explain_attention(
            mha,
            &block_trace.query,
            &block_trace.key_value,
            &block_trace.key_value,
            &block_trace.mask,
        )?;
        let (query_tokens, key_tokens) = match attention {
            AttentionUse::EncoderSelf => {
                (example.source_tokens.clone(), example.source_tokens.clone())
            }
            AttentionUse::DecoderSelf => (
                example.decoder_tokens.clone(),
                example.decoder_tokens.clone(),
            ),
            AttentionUse::Cross => (
                example.decoder_tokens.clone(),
                example.source_tokens.clone(),
            ),
        };
        if query_tokens.len() != steps.num_queries() || key_tokens.len() != steps.num_keys() {
            candle::bail!(
                "token labels ({} × {}) do not match the block's {} queries × {} keys",
                query_tokens.len(),
                key_tokens.len(),
                steps.num_queries(),
                steps.num_keys()
            )
        }
        Ok(Self {
            attention,
            layer,
            num_layers,
            example,
            query_tokens,
            key_tokens,
            steps,
            forward_output: one_sequence("output", &block_trace.output)?.to_dtype(DType::F32)?,
            logits: one_sequence("logits", &trace.logits)?,
        })
    }

    /// Explains block `attention` of `layer` of `model` on `example` (the text, its tokens
    /// and the model's greedy translation, e.g. from
    /// [`crate::marian::MarianTranslator::teacher_forcing`]). Errors when the layer does not
    /// exist (listing the valid ones) or the pass fails.
    pub fn of_model(
        model: &impl ExplainModel,
        example: TeacherForcing,
        attention: AttentionUse,
        layer: usize,
    ) -> candle::Result<Self> {
        let trace = model.trace_ids(&example.source_ids, &example.decoder_ids)?;
        Self::from_trace(
            model.encoder(),
            model.decoder(),
            &trace,
            example,
            attention,
            layer,
        )
    }

    /// The largest `|steps.output − forward_output|`: how far the step-by-step computation is
    /// from the model's own forward pass (round-off, about 1e-6).
    pub fn max_forward_difference(&self) -> candle::Result<f32> {
        (&self.steps.output - &self.forward_output)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()
    }
}

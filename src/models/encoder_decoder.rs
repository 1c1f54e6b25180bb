//! The encoder-decoder of the Hugging Face BART family (MarianMT today; M2M100 / NLLB-200 and
//! mBART share it), on this crate's layers: our [`TransformerEncoder`] and
//! [`TransformerDecoder`] (post- or pre-norm, Hugging Face names), our
//! [`MultiHeadAttention`](crate::MultiHeadAttention) and KV caches, token embeddings (scaled),
//! positions, optional embedding and final layer norms, and the output projection (tied or not,
//! with `final_logits_bias` when the family has one).
//!
//! A family is a configuration of this model: its `config.json` becomes an
//! [`EncoderDecoderSpec`] (sizes, norm placement, positions, embedding scale, which tensors
//! exist) and its state dict's names a [`WeightNames`] map. Everything else — loading in place
//! from a mapped file, the encoder and decoder passes, step-by-step decoding through the KV
//! caches ([`StepDecoder`], so [`crate::generation`] serves every family), traces for
//! [`crate::explain`] — is written once, here.
//!
//! The numbers follow transformers' `modeling_marian.py` (and its copies): token embeddings
//! times `sqrt(d_model)` when `scale_embedding`, plus positions, the layers, the final norms
//! where the family has them, `logits = h · Eᵀ + final_logits_bias`.

use super::checkpoint::Checkpoint;
use crate::generation::StepDecoder;
use crate::mask::Mask;
use crate::projection::Projection;
use crate::simd::rows::log_softmax_in_place;
use crate::transformer::decoder_parts::DecoderPart;
use crate::transformer::norm::LayerNorm;
use crate::transformer::{
    DecoderCache, DecoderMasks, EncoderMasks, ModelTrace, TransformerConfig, TransformerDecoder,
    TransformerEncoder,
};
use crate::weights::{
    Int8Matrix, MappedBf16Matrix, MappedMatrix, MatrixLog, Precision, WeightMatrix, WeightSource,
};
use candle::{DType, Device, Module, Tensor, D};

/// How a family encodes positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Marian's sinusoidal table (not stored): for feature `j` the angle is
    /// `pos / 10000^(2·(j / 2) / d)`, `sin` of the even-`j` angles in the first half of the
    /// features and `cos` of the odd-`j` ones in the second; position `t` of a sequence is row
    /// `t` (see [`marian_positions`]).
    MarianSinusoidal,
    /// M2M100's (and NLLB-200's) fairseq sinusoidal table (not stored; see
    /// [`m2m100_positions`]), indexed by position ids computed from the **token ids**: a token
    /// at column `t` gets `padding_idx + (cache length) + (number of non-pad tokens in columns
    /// 0..=t)`, a pad token gets `padding_idx` (the table's zero row). So each row of a padded
    /// batch counts its own tokens, left padding included, and incremental decoding continues
    /// from the cache length (transformers' `create_position_ids_from_input_ids`).
    M2M100Sinusoidal {
        /// `pad_token_id`: the id whose tokens take the zero row, and the offset of the
        /// positions (the first token is at `padding_idx + 1`).
        padding_idx: u32,
    },
    /// Learned positions, one table per stack (`{stack}.embed_positions.weight`,
    /// `(max_position_embeddings + offset, d_model)`): position `t` of a sequence (counted from
    /// the cache length, padding or not) is row `t + offset` (mBART, BART: offset 2).
    Learned {
        /// Rows skipped at the top of the table (2 for mBART).
        offset: usize,
    },
}

/// The shape of a BART-family encoder-decoder: what a family's `config.json` says, in the
/// terms of this crate's layers.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderDecoderSpec {
    /// Model size.
    pub d_model: usize,
    /// Source vocabulary (the encoder's embedding rows).
    pub vocab_size: usize,
    /// Target vocabulary (the decoder's embedding rows and the output size).
    pub target_vocab_size: usize,
    /// Longest sequence the positions cover (source or target).
    pub max_position_embeddings: usize,
    /// The encoder layers (`num_encoder_layers` of them, Hugging Face names).
    pub encoder: TransformerConfig,
    /// The decoder layers (`num_decoder_layers` of them, Hugging Face names).
    pub decoder: TransformerConfig,
    /// Token embeddings are multiplied by this (`sqrt(d_model)` with `scale_embedding`, else 1).
    pub embed_scale: f64,
    /// How positions are encoded.
    pub positions: Positions,
    /// One embedding table for source and target (`shared.weight`, or either stack's
    /// `embed_tokens.weight`); otherwise one per stack.
    pub shared_embeddings: bool,
    /// The output projection is the decoder's embedding table; otherwise `lm_head.weight`.
    pub tie_word_embeddings: bool,
    /// Whether each stack normalises its embeddings (token + position) with a layer norm
    /// before the first layer (`{stack}.layernorm_embedding`, mBART): required when `true`.
    pub embedding_norm: bool,
    /// Whether the output projection adds `final_logits_bias` (`(1, target_vocab)`, read when
    /// stored, zeros otherwise: MarianMT, mBART). `false` for families without one (M2M100):
    /// a stored one is not read, as transformers does not.
    pub final_logits_bias: bool,
    /// Whether each stack ends with a layer norm (`{stack}.layer_norm`, the stacks' naming's
    /// [`crate::transformer::LayerNaming::stack_norm`]): required when `true`, refused when
    /// `false` (a file with them is another family).
    pub final_norms: bool,
    /// The family's name, for messages (e.g. "MarianMT").
    pub family: &'static str,
}

/// The layers of one stack of a BART-family model (`d_model`, `heads`, feed-forward size
/// `ffn`, `layers` of them), as transformers builds them: Hugging Face names, biases, torch's
/// `LayerNorm` epsilon (1e-5), no dropout (inference only); pre-norm with `norm_first` (M2M100,
/// mBART), post-norm otherwise (Marian).
pub(crate) fn bart_stack_config(
    d_model: usize,
    heads: usize,
    ffn: usize,
    layers: usize,
    activation: crate::transformer::Activation,
    norm_first: bool,
) -> TransformerConfig {
    TransformerConfig {
        num_encoder_layers: layers,
        num_decoder_layers: layers,
        dim_feedforward: ffn,
        dropout: 0.0,
        activation,
        layer_norm_eps: 1e-5,
        norm_first,
        bias: true,
        naming: crate::transformer::LayerNaming::HuggingFace,
        ..TransformerConfig::new(d_model, heads)
    }
}

/// Where a family's state dict keeps the tensors this model reads, relative to the model's
/// prefix (`model.` for a `...ForConditionalGeneration` state dict, none for a bare model).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightNames {
    /// The shared embedding table, in the order to try (the first one present is used).
    pub shared_embedding: &'static [&'static str],
    /// The encoder's and the decoder's own tables (`shared_embeddings: false`).
    pub encoder_embedding: &'static str,
    /// See [`WeightNames::encoder_embedding`].
    pub decoder_embedding: &'static str,
    /// The encoder and decoder stacks (their layers are `{stack}.layers.{i}`).
    pub encoder: &'static str,
    /// See [`WeightNames::encoder`].
    pub decoder: &'static str,
    /// The untied output projection (outside the model prefix).
    pub lm_head: &'static str,
    /// The output bias (outside the model prefix; zeros when absent, as transformers' buffer).
    pub final_logits_bias: &'static str,
    /// A stack's learned position table, relative to the stack
    /// ([`Positions::Learned`]).
    pub embed_positions: &'static str,
    /// A stack's embedding layer norm, relative to the stack
    /// ([`EncoderDecoderSpec::embedding_norm`]).
    pub layernorm_embedding: &'static str,
}

impl WeightNames {
    /// The names of transformers' BART family (`modeling_bart.py` and the models copied from
    /// it: Marian, M2M100, mBART).
    pub const BART: WeightNames = WeightNames {
        shared_embedding: &[
            "shared.weight",
            "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight",
        ],
        encoder_embedding: "encoder.embed_tokens.weight",
        decoder_embedding: "decoder.embed_tokens.weight",
        encoder: "encoder",
        decoder: "decoder",
        lm_head: "lm_head.weight",
        final_logits_bias: "final_logits_bias",
        embed_positions: "embed_positions.weight",
        layernorm_embedding: "layernorm_embedding",
    };
}

/// Marian's positional table, `(num_positions, dim)`: for feature `j`, the angle is
/// `pos / 10000^(2·(j / 2) / dim)`; the first `dim / 2` features hold `sin` of the even-`j`
/// angles and the rest `cos` of the odd-`j` ones (not interleaved). Computed in f64, as numpy
/// does in transformers, then converted to `dtype`.
pub fn marian_positions(
    num_positions: usize,
    dim: usize,
    dtype: DType,
    device: &Device,
) -> candle::Result<Tensor> {
    marian_position_rows(0, num_positions, dim, dtype, device)
}

/// Rows `start .. start + len` of [`marian_positions`]' table, `(len, dim)`.
fn marian_position_rows(
    start: usize,
    len: usize,
    dim: usize,
    dtype: DType,
    device: &Device,
) -> candle::Result<Tensor> {
    let half = dim.div_ceil(2);
    let mut values = vec![0f32; len * dim];
    for (i, row) in values.chunks_exact_mut(dim.max(1)).enumerate().take(len) {
        let pos = start + i;
        for j in 0..dim {
            let angle = pos as f64 / 10000f64.powf((2 * (j / 2)) as f64 / dim as f64);
            if j % 2 == 0 {
                row[j / 2] = angle.sin() as f32;
            } else {
                row[half + j / 2] = angle.cos() as f32;
            }
        }
    }
    Tensor::from_vec(values, (len, dim), device)?.to_dtype(dtype)
}

/// M2M100's (fairseq's) sinusoidal table, `(num_positions, dim)`, exactly as transformers'
/// `M2M100SinusoidalPositionalEmbedding.get_embedding` computes it in `f32`: with
/// `half = dim / 2` and `w_j = exp(j · -(ln 10000 / (half - 1)))` (the factor rounded to `f32`,
/// as torch multiplies an `f32` tensor by a Python float), row `p` holds `sin(p · w_j)` in
/// columns `0..half` and `cos(p · w_j)` in `half..2·half` (the product `p · w_j` rounded to
/// `f32` first), a zero column last when `dim` is odd, and row `padding_idx` is zeros.
/// Needs `dim >= 4` (transformers divides by `half - 1`); smaller sizes are an error.
pub fn m2m100_positions(
    num_positions: usize,
    dim: usize,
    padding_idx: Option<usize>,
    dtype: DType,
    device: &Device,
) -> candle::Result<Tensor> {
    let ids: Vec<usize> = (0..num_positions).collect();
    m2m100_position_rows(&ids, dim, padding_idx, dtype, device)
}

/// Rows `ids` of [`m2m100_positions`]' table, `(ids.len(), dim)`.
fn m2m100_position_rows(
    ids: &[usize],
    dim: usize,
    padding_idx: Option<usize>,
    dtype: DType,
    device: &Device,
) -> candle::Result<Tensor> {
    let half = dim / 2;
    if half < 2 {
        candle::bail!(
            "M2M100 sinusoidal positions need d_model >= 4 (transformers divides by d_model / 2 - 1), got {dim}"
        )
    }
    let factor = -((10000f64.ln() / (half - 1) as f64) as f32);
    let freqs: Vec<f32> = (0..half).map(|j| (j as f32 * factor).exp()).collect();
    let mut values = vec![0f32; ids.len() * dim];
    for (&pos, row) in ids.iter().zip(values.chunks_exact_mut(dim)) {
        if Some(pos) == padding_idx {
            continue;
        }
        for (j, &w) in freqs.iter().enumerate() {
            let angle = pos as f32 * w;
            row[j] = angle.sin();
            row[half + j] = angle.cos();
        }
    }
    Tensor::from_vec(values, (ids.len(), dim), device)?.to_dtype(dtype)
}

/// The position ids M2M100 gives `ids` (one row of a batch) when `past` tokens are cached:
/// `padding_idx` for a pad, else `padding_idx + past + (non-pad tokens so far, this one
/// included)` (transformers' `create_position_ids_from_input_ids`).
pub fn m2m100_position_ids(ids: &[u32], padding_idx: u32, past: usize) -> Vec<usize> {
    let mut count = 0usize;
    ids.iter()
        .map(|&id| {
            if id == padding_idx {
                padding_idx as usize
            } else {
                count += 1;
                padding_idx as usize + past + count
            }
        })
        .collect()
}

/// Positions whose rows are computed once when the model is built; rows past them (a
/// `max_position_embeddings` larger than any input seen) are computed for the positions a call
/// uses. A config's position count is only a promise: building its whole table would let a
/// `config.json` with a huge `max_position_embeddings` allocate without bound.
const PRECOMPUTED_POSITIONS: usize = 4096;

/// A BART-family encoder-decoder for inference, built from a family's [`EncoderDecoderSpec`]
/// and state dict. The family types (e.g. [`crate::marian::MarianMTModel`]) are this model with
/// their configuration.
#[derive(Clone, Debug)]
pub struct EncoderDecoderModel {
    spec: EncoderDecoderSpec,
    /// `(vocab_size, d_model)`.
    encoder_embed: EmbeddingTable,
    /// `(target_vocab, d_model)`; the same table as `encoder_embed` when shared.
    decoder_embed: EmbeddingTable,
    /// The encoder's position table, `(rows, d_model)`: for sinusoidal positions its first
    /// rows (computed, at most 4096; later rows are computed when used), for learned ones the
    /// stored table (`max_position_embeddings + offset` rows).
    encoder_positions: Tensor,
    /// The decoder's position table (the encoder's, for sinusoidal positions).
    decoder_positions: Tensor,
    /// The embedding layer norms (`layernorm_embedding`) of the encoder and the decoder, when
    /// the family has them.
    embedding_norms: Option<(LayerNorm, LayerNorm)>,
    encoder: TransformerEncoder,
    decoder: TransformerDecoder,
    /// `h · Eᵀ + final_logits_bias`, `(target_vocab)` outputs.
    lm_head: Projection,
}

/// A token embedding table `(vocab, d_model)`: a tensor, or rows read in place from a mapped
/// file.
#[derive(Clone, Debug)]
enum EmbeddingTable {
    Owned(Tensor),
    Mapped(MappedMatrix),
    /// Quantized to int8: a looked-up row is dequantized (`scale · q`).
    Int8(Int8Matrix),
    /// bf16 rows read in place from a mapped file.
    MappedBf16(MappedBf16Matrix),
}

impl EmbeddingTable {
    /// Rows `ids` (`U32`, any shape `(B, T)`) → `(B, T, d_model)`.
    fn lookup(&self, ids: &Tensor, d: usize) -> candle::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        match self {
            Self::Owned(table) => table
                .index_select(&ids.flatten_all()?, 0)?
                .reshape((b, t, d)),
            Self::Mapped(m) => {
                let rows = m.gather_rows(&ids.flatten_all()?.to_vec1::<u32>()?)?;
                Tensor::from_vec(rows, (b, t, d), ids.device())
            }
            Self::Int8(m) => {
                let rows = m.gather_rows(&ids.flatten_all()?.to_vec1::<u32>()?)?;
                Tensor::from_vec(rows, (b, t, d), ids.device())
            }
            Self::MappedBf16(m) => m
                .gather_rows(&ids.flatten_all()?.to_vec1::<u32>()?)?
                .reshape((b, t, d)),
        }
    }
}

/// What a state dict calls the model: `model.` prefixed (a `...ForConditionalGeneration`) or
/// not (the bare model).
pub(crate) fn model_prefix(contains: impl Fn(&str) -> bool) -> &'static str {
    if contains("model.encoder.layers.0.self_attn.q_proj.weight") || contains("model.shared.weight")
    {
        "model."
    } else {
        ""
    }
}

impl EncoderDecoderModel {
    /// Builds the model of `spec` from a state dict named as `names` says, computing in
    /// `dtype` on `device`. Checks the vocabulary sizes against the embedding tables (an error
    /// names both). With `f32` safetensors weights computed in `f32` on the CPU, the large
    /// matrices are used in place from the mapped file ([`WeightSource::in_place`]): nothing
    /// is copied.
    pub fn load(
        spec: EncoderDecoderSpec,
        names: &WeightNames,
        weights: &Checkpoint,
        dtype: DType,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::load_with(spec, names, weights, dtype.into(), device)
    }

    /// [`EncoderDecoderModel::load`] in a [`Precision`]: a dtype, and with
    /// `precision.quantize`, every weight matrix (projections, embedding tables, the output
    /// projection) quantized as it is loaded (norms, biases and positions stay `f32`).
    ///
    /// A directory `attn convert --quantize int8` wrote ([`Checkpoint::quantization`]) loads
    /// int8 whatever `precision.quantize` says (its matrices read in place from the file);
    /// with a dtype other than `f32` it is an error.
    pub fn load_with(
        spec: EncoderDecoderSpec,
        names: &WeightNames,
        weights: &Checkpoint,
        precision: Precision,
        device: &Device,
    ) -> candle::Result<Self> {
        Self::load_logged(spec, names, weights, precision, device, None)
    }

    /// [`EncoderDecoderModel::load_with`], recording every matrix quantized at load into `log`.
    pub(crate) fn load_logged(
        spec: EncoderDecoderSpec,
        names: &WeightNames,
        weights: &Checkpoint,
        mut precision: Precision,
        device: &Device,
        log: Option<MatrixLog>,
    ) -> candle::Result<Self> {
        if let Some(stored) = weights.quantization() {
            if precision.dtype != DType::F32 {
                candle::bail!(
                    "{} holds {} weights (written by attn convert), which compute in f32: dtype {:?}                      cannot apply",
                    weights.origin(),
                    stored.name(),
                    precision.dtype
                )
            }
            precision.quantize = Some(stored);
        }
        precision.check(device)?;
        let dtype = precision.dtype;
        let prefix = model_prefix(|n| weights.contains(n));
        let name = |n: &str| format!("{prefix}{n}");
        let vb = weights.var_builder(dtype, device);
        let source = match weights.mapped() {
            Some(file) => WeightSource::in_place(vb.clone(), file),
            None => WeightSource::load(vb.clone()),
        }
        .quantized(precision.quantize)?
        .logging(log);
        let d = spec.d_model;
        let first_present = |candidates: &[String]| -> candle::Result<String> {
            candidates
                .iter()
                .find(|n| weights.contains(n))
                .cloned()
                .ok_or_else(|| weights.not_found(&candidates[0]))
        };
        let check_vocab = |tensor: &str, expected: usize, what: &str| -> candle::Result<()> {
            match weights.shape_of(tensor) {
                Some(shape) if shape == [expected, d] => Ok(()),
                Some(shape) => candle::bail!(
                    "'{tensor}' has shape {shape:?} but config.json says {what} = {expected} and \
                     d_model = {d}: the config does not belong to these weights"
                ),
                None => Err(weights.not_found(tensor)),
            }
        };
        let table = |tensor: &str, rows: usize| -> candle::Result<EmbeddingTable> {
            Ok(
                match source.matrix((rows, d), tensor, candle_nn::Init::Const(0.0))? {
                    WeightMatrix::Mapped(m) => EmbeddingTable::Mapped(m),
                    WeightMatrix::Tensor(t) => EmbeddingTable::Owned(t),
                    WeightMatrix::Int8(m) => EmbeddingTable::Int8(m),
                    WeightMatrix::MappedBf16(m) => EmbeddingTable::MappedBf16(m),
                },
            )
        };
        let (encoder_embed, decoder_embed) = if spec.shared_embeddings {
            let candidates: Vec<String> = names.shared_embedding.iter().map(|n| name(n)).collect();
            let shared = first_present(&candidates)?;
            check_vocab(&shared, spec.vocab_size, "vocab_size")?;
            let t = table(&shared, spec.vocab_size)?;
            (t.clone(), t)
        } else {
            let enc = name(names.encoder_embedding);
            let dec = name(names.decoder_embedding);
            check_vocab(&enc, spec.vocab_size, "vocab_size")?;
            check_vocab(&dec, spec.target_vocab_size, "decoder_vocab_size")?;
            (
                table(&enc, spec.vocab_size)?,
                table(&dec, spec.target_vocab_size)?,
            )
        };
        let vocab = spec.target_vocab_size;
        // transformers treats a missing bias as zeros (it is a buffer, not a parameter).
        let bias = if !spec.final_logits_bias {
            None
        } else if weights.contains(names.final_logits_bias) {
            let b = vb.get_unchecked(names.final_logits_bias)?;
            if b.elem_count() != vocab {
                candle::bail!(
                    "{} has shape {:?}, expected (1, {vocab}) for the target vocabulary",
                    names.final_logits_bias,
                    b.dims()
                )
            }
            Some(b.flatten_all()?)
        } else {
            Some(Tensor::zeros(vocab, dtype, device)?)
        };
        let lm_head = if spec.tie_word_embeddings {
            // Tied: the head reads the embedding table where it lies rather than packing a copy.
            match &decoder_embed {
                EmbeddingTable::Mapped(m) => Projection::from_mapped(m.clone(), bias)?,
                EmbeddingTable::Owned(t) => Projection::shared(t, bias)?,
                EmbeddingTable::Int8(m) => Projection::from_int8(m.clone(), bias)?,
                EmbeddingTable::MappedBf16(m) => Projection::from_mapped_bf16(m.clone(), bias)?,
            }
        } else {
            check_vocab(names.lm_head, vocab, "the target vocabulary size")?;
            let w = source.matrix((vocab, d), names.lm_head, candle_nn::Init::Const(0.0))?;
            Projection::from_matrix(w, bias)?
        };
        // The final norms: required where the family has them, refused where it has none (a
        // file with them belongs to another family).
        for (stack, naming) in [
            (names.encoder, spec.encoder.naming),
            (names.decoder, spec.decoder.naming),
        ] {
            let norm = format!("{}.{}.weight", name(stack), naming.stack_norm());
            if weights.contains(&norm) != spec.final_norms {
                candle::bail!(
                    "{} '{norm}' in {}: {} {} final layer norms",
                    if spec.final_norms { "no" } else { "found" },
                    weights.origin(),
                    spec.family,
                    if spec.final_norms { "has" } else { "has no" },
                )
            }
        }
        let encoder = TransformerEncoder::from_source(
            &spec.encoder,
            &source.pp(name(names.encoder)),
            spec.final_norms,
        )?;
        let decoder = TransformerDecoder::from_source(
            &spec.decoder,
            &source.pp(name(names.decoder)),
            spec.final_norms,
        )?;
        let (encoder_positions, decoder_positions) = match spec.positions {
            Positions::MarianSinusoidal => {
                let rows = spec.max_position_embeddings.min(PRECOMPUTED_POSITIONS);
                let table = marian_positions(rows, d, dtype, device)?;
                (table.clone(), table)
            }
            Positions::M2M100Sinusoidal { padding_idx } => {
                // Position ids reach padding_idx + max_position_embeddings.
                let rows = (padding_idx as usize + 1)
                    .saturating_add(spec.max_position_embeddings)
                    .min(PRECOMPUTED_POSITIONS);
                let table = m2m100_positions(rows, d, Some(padding_idx as usize), dtype, device)?;
                (table.clone(), table)
            }
            Positions::Learned { offset } => {
                let rows = spec.max_position_embeddings.saturating_add(offset);
                let learned = |stack: &str| -> candle::Result<Tensor> {
                    let tensor = format!("{}.{}", name(stack), names.embed_positions);
                    match weights.shape_of(&tensor) {
                        Some(shape) if shape == [rows, d] => vb.get((rows, d), &tensor),
                        Some(shape) => candle::bail!(
                            "'{tensor}' in {} has shape {shape:?}, expected ({rows}, {d}): \
                             max_position_embeddings {} + offset {offset} rows of d_model {d}",
                            weights.origin(),
                            spec.max_position_embeddings
                        ),
                        None => Err(weights.not_found(&tensor)),
                    }
                };
                (learned(names.encoder)?, learned(names.decoder)?)
            }
        };
        let embedding_norms = if spec.embedding_norm {
            let norm = |stack: &str| -> candle::Result<LayerNorm> {
                let prefix = format!("{}.{}", name(stack), names.layernorm_embedding);
                if !weights.contains(&format!("{prefix}.weight")) {
                    return Err(weights.not_found(&format!("{prefix}.weight")));
                }
                LayerNorm::new(
                    d,
                    spec.encoder.layer_norm_eps,
                    spec.encoder.bias,
                    vb.pp(prefix),
                )
            };
            Some((norm(names.encoder)?, norm(names.decoder)?))
        } else {
            None
        };
        Ok(Self {
            spec,
            encoder_embed,
            decoder_embed,
            encoder_positions,
            decoder_positions,
            embedding_norms,
            encoder,
            decoder,
            lm_head,
        })
    }

    /// The shape of the model.
    pub fn spec(&self) -> &EncoderDecoderSpec {
        &self.spec
    }

    /// About how many bytes generating `rows` hypotheses (batch × beams) of at most
    /// `max_length` tokens over sources of `source_len` tokens holds at its peak: the decoder's
    /// self-attention caches (keys and values of every layer for every row and position), the
    /// cross-attention keys and values (counted per row, an upper bound: the beams of one
    /// sentence share theirs, see [`DecodeState`]) and the step's logits with their host copy.
    /// Saturating; what
    /// [`EncoderDecoderModel::check_generation_memory`] compares with the free memory.
    pub fn generation_bytes(&self, rows: usize, source_len: usize, max_length: usize) -> u64 {
        let elem = self.dtype().size_in_bytes().max(4) as u64;
        let d = self.spec.d_model as u64;
        let layers = self.spec.decoder.num_decoder_layers as u64;
        let rows = rows as u64;
        let kv = |len: usize| {
            [rows, len as u64, layers, 2, d, elem]
                .iter()
                .fold(1u64, |a, &x| a.saturating_mul(x))
        };
        let logits = [rows, self.spec.target_vocab_size as u64, 4, 2]
            .iter()
            .fold(1u64, |a, &x| a.saturating_mul(x));
        kv(max_length)
            .saturating_add(kv(source_len))
            .saturating_add(logits)
    }

    /// Refuses, before anything is allocated, a generation of `rows` hypotheses (`batch`
    /// sentences × `beams`) of up to `max_length` tokens over `source_len`-token sources that
    /// cannot fit in this machine's free memory ([`crate::device::available_memory`]): an
    /// error with the sizes and what to lower, instead of minutes of work and an abort.
    pub fn check_generation_memory(
        &self,
        batch: usize,
        beams: usize,
        source_len: usize,
        max_length: usize,
    ) -> candle::Result<()> {
        let Some(free) = crate::device::available_memory() else {
            return Ok(());
        };
        let need = self.generation_bytes(batch.saturating_mul(beams), source_len, max_length);
        if need > free {
            let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
            candle::bail!(
                "generating {batch} sentence(s) × {beams} beam(s) of up to {max_length} tokens from \
                 {source_len}-token sources needs about {:.1} GiB (caches and logits), but this \
                 machine has {:.1} GiB free: use fewer beams, a shorter max_new_tokens or smaller \
                 batches",
                gib(need),
                gib(free)
            )
        }
        Ok(())
    }

    /// The dtype the model computes in.
    pub fn dtype(&self) -> DType {
        self.lm_head.dtype()
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        self.lm_head.device()
    }

    /// The encoder stack.
    pub fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    /// The decoder stack.
    pub fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    /// `ids` `(B, T)` (any integer dtype) as `U32`, checked against `vocab` and the position
    /// table.
    fn checked_ids(
        &self,
        what: &str,
        ids: &Tensor,
        vocab: usize,
        start: usize,
    ) -> candle::Result<Tensor> {
        let (_, len) = ids.dims2().map_err(|_| {
            candle::Error::Msg(format!(
                "{what} must be (batch, seq), got shape {:?}",
                ids.dims()
            ))
        })?;
        if ids.dtype().is_float() {
            candle::bail!(
                "{what} must be integer token ids, got dtype {:?}",
                ids.dtype()
            )
        }
        let max_len = self.spec.max_position_embeddings;
        if start + len > max_len {
            candle::bail!(
                "{what} reach position {} but the model allows at most max_position_embeddings = {max_len}",
                start + len
            )
        }
        if ids.elem_count() > 0 {
            let as_i64 = ids.to_dtype(DType::I64)?.flatten_all()?;
            let (lo, hi) = (
                as_i64.min(0)?.to_scalar::<i64>()?,
                as_i64.max(0)?.to_scalar::<i64>()?,
            );
            if lo < 0 || hi >= vocab as i64 {
                let bad = if lo < 0 { lo } else { hi };
                candle::bail!("{what} hold id {bad}, outside the vocabulary of {vocab} tokens")
            }
        }
        ids.to_dtype(DType::U32)
    }

    /// Embeds `ids` (checked `U32`, `(B, T)`) of the encoder or the `decoder` with `start`
    /// tokens before them (the cache length): scaled token embeddings plus positions, then the
    /// embedding layer norm where the family has one, `(B, T, d_model)`.
    /// `host_ids`, when given, are `ids` already on the host (row-major): M2M100's positions
    /// are computed from them without reading the ids back from the device.
    fn embed(
        &self,
        decoder: bool,
        ids: &Tensor,
        start: usize,
        host_ids: Option<&[u32]>,
    ) -> candle::Result<Tensor> {
        let table = if decoder {
            &self.decoder_embed
        } else {
            &self.encoder_embed
        };
        let x = table.lookup(ids, self.spec.d_model)?;
        let x = if self.spec.embed_scale != 1.0 {
            (x * self.spec.embed_scale)?
        } else {
            x
        };
        let x = x.broadcast_add(&self.position_embeddings(decoder, ids, start, host_ids)?)?;
        match &self.embedding_norms {
            Some((enc, dec)) => (if decoder { dec } else { enc }).forward(&x),
            None => Ok(x),
        }
    }

    /// The position embeddings of `ids` `(B, T)` after `start` cached tokens: `(T, d_model)`
    /// when they do not depend on the ids, `(B, T, d_model)` when they do (M2M100). Positions
    /// stay within `max_position_embeddings`, which the callers have checked.
    fn position_embeddings(
        &self,
        decoder: bool,
        ids: &Tensor,
        start: usize,
        host_ids: Option<&[u32]>,
    ) -> candle::Result<Tensor> {
        let table = if decoder {
            &self.decoder_positions
        } else {
            &self.encoder_positions
        };
        let (b, t) = ids.dims2()?;
        let rows = table.dim(0)?;
        match self.spec.positions {
            Positions::MarianSinusoidal => {
                if start + t <= rows {
                    return table.narrow(0, start, t);
                }
                marian_position_rows(start, t, self.spec.d_model, table.dtype(), table.device())
            }
            Positions::Learned { offset } => table.narrow(0, start + offset, t),
            Positions::M2M100Sinusoidal { padding_idx } => {
                let host: Vec<u32> = match host_ids {
                    Some(h) if h.len() == b * t => h.to_vec(),
                    _ => ids.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?,
                };
                let position_ids: Vec<usize> = host
                    .chunks(t.max(1))
                    .flat_map(|row| m2m100_position_ids(row, padding_idx, start))
                    .collect();
                let d = self.spec.d_model;
                let embedded = if position_ids.iter().all(|&p| p < rows) {
                    let index: Vec<u32> = position_ids.iter().map(|&p| p as u32).collect();
                    let index = Tensor::from_vec(index, b * t, table.device())?;
                    table.index_select(&index, 0)?
                } else {
                    m2m100_position_rows(
                        &position_ids,
                        d,
                        Some(padding_idx as usize),
                        table.dtype(),
                        table.device(),
                    )?
                };
                embedded.reshape((b, t, d))
            }
        }
    }

    /// The key padding `(B, S)` `U8` (1 = padding) of a Hugging Face `attention_mask`
    /// (1 = token), checked against `input_ids`.
    fn source_padding(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle::Result<Tensor> {
        if attention_mask.dims() != input_ids.dims() {
            candle::bail!(
                "attention_mask {:?} must have the shape of input_ids {:?}",
                attention_mask.dims(),
                input_ids.dims()
            )
        }
        if attention_mask.dtype().is_float() {
            candle::bail!(
                "attention_mask must be integers (1 = token, 0 = padding), got dtype {:?}",
                attention_mask.dtype()
            )
        }
        attention_mask.to_device(self.device())?.eq(0f64)
    }

    /// The encoder: `input_ids` `(B, S)` and `attention_mask` `(B, S)` (1 = token, 0 =
    /// padding) → `encoder_last_hidden_state` `(B, S, d_model)`.
    pub fn encode(&self, input_ids: &Tensor, attention_mask: &Tensor) -> candle::Result<Tensor> {
        let padding = self.source_padding(input_ids, attention_mask)?;
        self.encode_with_padding(input_ids, &padding)
    }

    /// The encoder's input: `input_ids` `(B, S)` checked against the vocabulary, embedded
    /// (scaled) with positions, `(B, S, d_model)`.
    fn encoder_input(&self, input_ids: &Tensor) -> candle::Result<Tensor> {
        if input_ids.rank() == 2 && input_ids.dim(1)? == 0 {
            candle::bail!(
                "input_ids {:?} have no tokens: transformers refuses an empty input",
                input_ids.dims()
            )
        }
        let ids = self.checked_ids(
            "input_ids",
            &input_ids.to_device(self.device())?,
            self.spec.vocab_size,
            0,
        )?;
        self.embed(false, &ids, 0, None)
    }

    fn encode_with_padding(&self, input_ids: &Tensor, padding: &Tensor) -> candle::Result<Tensor> {
        let x = self.encoder_input(input_ids)?;
        let masks = EncoderMasks {
            src_mask: Mask::none(),
            src_key_padding_mask: Some(padding),
        };
        self.encoder.forward(&x, &masks, false)
    }

    /// A full decoder pass: `decoder_input_ids` `(B, T)` over `memory` `(B, S, d_model)` with
    /// the source `attention_mask` `(B, S)` → `logits` `(B, T, target_vocab)`. Causal, every
    /// target position visible (transformers' default `decoder_attention_mask`).
    pub fn decode(
        &self,
        decoder_input_ids: &Tensor,
        memory: &Tensor,
        attention_mask: &Tensor,
    ) -> candle::Result<Tensor> {
        let (x, padding) = self.full_decoder_input(decoder_input_ids, memory, attention_mask)?;
        let h = self
            .decoder
            .forward(&x, memory, &Self::full_pass_masks(&padding), false)?;
        self.lm_head.forward(&h)
    }

    /// The embedded `decoder_input_ids` `(B, T, d_model)` of a full pass over `memory`, and the
    /// source padding `(B, S)` (1 = padding) of `attention_mask`.
    fn full_decoder_input(
        &self,
        decoder_input_ids: &Tensor,
        memory: &Tensor,
        attention_mask: &Tensor,
    ) -> candle::Result<(Tensor, Tensor)> {
        let ids = self.checked_ids(
            "decoder_input_ids",
            &decoder_input_ids.to_device(self.device())?,
            self.spec.target_vocab_size,
            0,
        )?;
        if ids.dim(0)? != memory.dim(0)? {
            candle::bail!(
                "decoder_input_ids {:?} and the encoder output {:?} have different batch sizes",
                ids.dims(),
                memory.dims()
            )
        }
        let padding = attention_mask.to_device(self.device())?.eq(0f64)?;
        Ok((self.embed(true, &ids, 0, None)?, padding))
    }

    /// Causal over the target, every target position visible (transformers' default
    /// `decoder_attention_mask`), source padding blocked.
    fn full_pass_masks(padding: &Tensor) -> DecoderMasks<'_> {
        DecoderMasks {
            tgt_mask: Mask::causal(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: None,
            memory_key_padding_mask: Some(padding),
        }
    }

    /// `model(input_ids, attention_mask, decoder_input_ids)`: `(logits (B, T, V),
    /// encoder_last_hidden_state (B, S, d_model))`.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        decoder_input_ids: &Tensor,
    ) -> candle::Result<(Tensor, Tensor)> {
        let memory = self.encode(input_ids, attention_mask)?;
        let logits = self.decode(decoder_input_ids, &memory, attention_mask)?;
        Ok((logits, memory))
    }

    /// [`EncoderDecoderModel::forward`] recording every attention block: what each received, the
    /// mask it was given and what it returned (`input_ids`, `attention_mask` `(B, S)`,
    /// `decoder_input_ids` `(B, T)`). `logits` and `memory` equal the plain pass.
    pub fn trace(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        decoder_input_ids: &Tensor,
    ) -> candle::Result<ModelTrace> {
        let padding = self.source_padding(input_ids, attention_mask)?;
        let x = self.encoder_input(input_ids)?;
        let (memory, encoder) = self.encoder.forward_traced(
            &x,
            &EncoderMasks {
                src_mask: Mask::none(),
                src_key_padding_mask: Some(&padding),
            },
        )?;
        let (y, padding) = self.full_decoder_input(decoder_input_ids, &memory, attention_mask)?;
        let (h, decoder) =
            self.decoder
                .forward_traced(&y, &memory, &Self::full_pass_masks(&padding))?;
        Ok(ModelTrace {
            encoder,
            decoder,
            logits: self.lm_head.forward(&h)?,
            memory,
        })
    }

    /// The encoder-decoder attention weights of every decoder layer, per head, `(B, H, T, S)`
    /// each, for `decoder_input_ids` `(B, T)` (a full pass; what attention heatmaps draw).
    pub fn cross_attention_weights(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        decoder_input_ids: &Tensor,
    ) -> candle::Result<Vec<Tensor>> {
        let memory = self.encode(input_ids, attention_mask)?;
        let (x, padding) = self.full_decoder_input(decoder_input_ids, &memory, attention_mask)?;
        self.decoder
            .cross_attention_weights(&x, &memory, &Self::full_pass_masks(&padding))
    }

    /// Runs the encoder and returns the state for step-by-step decoding (one row per source
    /// sentence; see [`StepDecoder`]).
    pub fn start(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle::Result<DecodeState> {
        let padding = self.source_padding(input_ids, attention_mask)?;
        let memory = self.encode_with_padding(input_ids, &padding)?;
        let sources = (0..memory.dim(0)? as u32).collect();
        Ok(DecodeState {
            memory,
            src_padding: padding,
            cache: DecoderCache::default(),
            sources,
            group: 1,
        })
    }

    /// Feeds the next target ids `(rows, T)` and returns their logits `(rows, T, V)`, equal to
    /// the matching rows of [`EncoderDecoderModel::decode`] on the whole prefix.
    pub fn step_logits(&self, state: &mut DecodeState, ids: &Tensor) -> candle::Result<Tensor> {
        let past = state.cache.len();
        let ids = self.checked_ids("decoder ids", ids, self.spec.target_vocab_size, past)?;
        self.step_checked(state, &ids, None)
    }

    /// [`EncoderDecoderModel::step_logits`] for `ids` `(rows, T)` `U32` already checked against the
    /// vocabulary and the position table.
    /// `host_ids`: the same ids on the host, when the caller has them.
    fn step_checked(
        &self,
        state: &mut DecodeState,
        ids: &Tensor,
        host_ids: Option<&[u32]>,
    ) -> candle::Result<Tensor> {
        let past = state.cache.len();
        if ids.dim(0)? != state.rows() {
            candle::bail!(
                "step got {} rows of ids but the decode state has {}",
                ids.dim(0)?,
                state.rows()
            )
        }
        let x = self.embed(true, ids, past, host_ids)?;
        let masks = DecoderMasks {
            tgt_mask: Mask::none(),
            memory_mask: Mask::none(),
            tgt_key_padding_mask: None,
            memory_key_padding_mask: Some(&state.src_padding),
        };
        let h = self
            .decoder
            .forward_cached(&x, &state.memory, &masks, &mut state.cache)?;
        self.lm_head.forward(&h)
    }
}

impl EncoderDecoderModel {
    /// The checks of a step feeding `tokens` to `state`, on the host (`step_logits` would ask
    /// the device for their min and max: two reads back per step on a GPU): one token per
    /// row, inside the vocabulary, within the position table.
    fn check_step_tokens(&self, state: &DecodeState, tokens: &[u32]) -> candle::Result<()> {
        if tokens.len() != state.rows() {
            candle::bail!(
                "step got {} rows of ids but the decode state has {}",
                tokens.len(),
                state.rows()
            )
        }
        let vocab = self.spec.target_vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            candle::bail!("decoder ids hold id {bad}, outside the vocabulary of {vocab} tokens")
        }
        let max_len = self.spec.max_position_embeddings;
        if state.len() + 1 > max_len {
            candle::bail!(
                "decoder ids reach position {} but the model allows at most max_position_embeddings = {max_len}",
                state.len() + 1
            )
        }
        Ok(())
    }

    /// [`StepDecoder::step`] of several decodes at once: feeds `parts[i].1` (one token per
    /// row) to state `parts[i].0` and returns the log-probabilities of every row, `(R, vocab)`
    /// `f32`, part after part (`R` = the rows of all the states). Each part's rows equal what
    /// [`StepDecoder::step`] gives that state alone; the projections, the feed-forward
    /// networks and the output projection read their weights once for all the rows (see
    /// `TransformerDecoder::forward_cached_parts`). A failure may leave the states half
    /// stepped: the caller drops them.
    pub(crate) fn step_parts(
        &self,
        parts: &mut [(&mut DecodeState, &[u32])],
    ) -> candle::Result<Tensor> {
        let mut inputs = Vec::with_capacity(parts.len());
        for (state, tokens) in parts.iter() {
            self.check_step_tokens(state, tokens)?;
            let ids = Tensor::from_slice(tokens, (tokens.len(), 1), self.device())?;
            inputs.push(self.embed(true, &ids, state.len(), Some(tokens))?);
        }
        let x = Tensor::cat(&inputs, 0)?;
        let mut decoder_parts: Vec<DecoderPart<'_>> = parts
            .iter_mut()
            .map(|(state, tokens)| DecoderPart {
                rows: tokens.len(),
                memory: &state.memory,
                memory_padding: &state.src_padding,
                cache: &mut state.cache,
            })
            .collect();
        let h = self.decoder.forward_cached_parts(&x, &mut decoder_parts)?;
        let logits = self.lm_head.forward(&h)?.squeeze(1)?;
        log_softmax_rows(logits.to_dtype(DType::F32)?)
    }
}

/// The encoder output and decoder caches of sentences being decoded, one row per hypothesis.
/// Clones are independent.
///
/// Rows that decode the same sentence and sit next to each other in equal-size groups (the
/// beams of beam search) share one memory row: its encoder output, source padding and the
/// cross-attention keys and values projected from it are held and read once per group
/// (see [`TransformerDecoder::forward_cached`]).
#[derive(Clone, Debug)]
pub struct DecodeState {
    /// `(memory rows, S, d_model)`: row `r` reads memory row `r / group`.
    memory: Tensor,
    /// `(memory rows, S)` `U8`, 1 = source padding.
    src_padding: Tensor,
    cache: DecoderCache,
    /// The source sentence (row of the first state) of each memory row.
    sources: Vec<u32>,
    /// How many consecutive rows share one memory row.
    group: usize,
}

impl DecodeState {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.sources.len() * self.group
    }

    /// Target tokens fed so far.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// True before the first step.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// The encoder output `(memory rows, S, d_model)`: one row per group of
    /// `rows() / memory().dim(0)` consecutive rows, which decode the same sentence.
    pub fn memory(&self) -> &Tensor {
        &self.memory
    }

    /// Keeps rows `rows` (may repeat), in that order. The memory rows follow: when the new
    /// rows form equal-size groups of consecutive rows each reading one memory row (beam
    /// search: the beams of each sentence), a group shares it; otherwise every row gets its
    /// own. When the memory rows do not change (beam search reordering the hypotheses of each
    /// sentence), the encoder memory and its projections stay where they are and only the
    /// self-attention caches move.
    pub fn select_rows(&mut self, rows: &[u32]) -> candle::Result<()> {
        let n = self.rows();
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= n) {
            candle::bail!("row {bad} does not exist: the decode state has {n} rows")
        }
        let reads: Vec<u32> = rows.iter().map(|&r| r / self.group as u32).collect();
        let group = shared_group(&reads);
        let memory_rows: Vec<u32> = reads.iter().step_by(group).copied().collect();
        let device = self.memory.device().clone();
        let index = Tensor::from_slice(rows, rows.len(), &device)?;
        let unchanged = memory_rows.len() == self.sources.len()
            && memory_rows
                .iter()
                .enumerate()
                .all(|(i, &m)| m as usize == i);
        self.group = group;
        if unchanged {
            return self.cache.select_rows_same_memory(&index);
        }
        let memory_index = Tensor::from_slice(&memory_rows, memory_rows.len(), &device)?;
        self.memory = self.memory.index_select(&memory_index, 0)?;
        self.src_padding = self.src_padding.index_select(&memory_index, 0)?;
        self.sources = memory_rows
            .iter()
            .map(|&m| self.sources[m as usize])
            .collect();
        self.cache
            .select_rows_shared_memory(&index, &memory_index, &self.memory)
    }
}

/// The size of the groups of consecutive rows that share one memory row, given the memory row
/// each row reads: the length of the first run when every chunk of that length reads one
/// memory row, else 1 (every row its own).
fn shared_group(reads: &[u32]) -> usize {
    let first = reads
        .iter()
        .take_while(|&&m| Some(&m) == reads.first())
        .count();
    let grouped = first > 1
        && reads.len().is_multiple_of(first)
        && reads.chunks(first).all(|c| c.iter().all(|&m| m == c[0]));
    if grouped {
        first
    } else {
        1
    }
}

/// `log_softmax` over the last dimension of `(rows, V)` `f32` logits, which it consumes. On the
/// CPU the generation processors' row-wise pass (max, sum, write) runs in place in the logits'
/// own buffer, rows in parallel: candle's composed op makes five passes and as many
/// `(rows, V)` buffers, which at beam-search sizes (32 × 58101) costs more than the output
/// projection, and even one copy of the logits per step is 3% of a beam-search step. The
/// logits must be a tensor nothing else reads (the output projection's fresh result): its
/// storage is overwritten. Elsewhere (GPU, autograd), candle's op.
fn log_softmax_rows(logits: Tensor) -> candle::Result<Tensor> {
    if !logits.device().is_cpu() || logits.track_op() {
        return candle_nn::ops::log_softmax(&logits, D::Minus1);
    }
    let logits = logits.contiguous()?;
    logits.inplace_op1(&LogSoftmaxRows)?;
    Ok(logits)
}

/// The in-place CPU pass of [`log_softmax_rows`], as a candle in-place op (the sanctioned way
/// to write into a tensor's storage).
struct LogSoftmaxRows;

impl candle::InplaceOp1 for LogSoftmaxRows {
    fn name(&self) -> &'static str {
        "log-softmax-rows"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle::CpuStorage,
        layout: &candle::Layout,
    ) -> candle::Result<()> {
        use rayon::prelude::*;
        let v = layout.dims().last().copied().unwrap_or(1).max(1);
        let (Some((start, end)), candle::CpuStorage::F32(values)) =
            (layout.contiguous_offsets(), storage)
        else {
            candle::bail!("log-softmax-rows: expected contiguous f32 logits, got {layout:?}")
        };
        values[start..end].par_chunks_mut(v).for_each(|row| {
            // A row with every token impossible stays -inf (instead of -inf - -inf = NaN).
            if row.iter().any(|&z| z > f32::NEG_INFINITY) {
                log_softmax_in_place(row);
            }
        });
        Ok(())
    }
}

/// The stacks and a traced pass over one text, for [`crate::explain::Explanation`].
impl crate::explain::ExplainModel for EncoderDecoderModel {
    fn encoder(&self) -> &TransformerEncoder {
        &self.encoder
    }

    fn decoder(&self) -> &TransformerDecoder {
        &self.decoder
    }

    fn trace_ids(&self, source_ids: &[u32], decoder_ids: &[u32]) -> candle::Result<ModelTrace> {
        let device = self.device();
        let input = Tensor::new(source_ids, device)?.unsqueeze(0)?;
        let dec = Tensor::new(decoder_ids, device)?.unsqueeze(0)?;
        self.trace(&input, &input.ones_like()?, &dec)
    }
}

/// Positions the self-attention caches of a CPU decode are first given (most translations
/// are shorter); a longer one grows them.
const FIRST_CACHE_ROOM: usize = 32;

/// One token per row in, `(rows, V)` next-token log-probabilities (`f32`) out.
impl StepDecoder for EncoderDecoderModel {
    type State = DecodeState;

    fn step(&self, state: &mut DecodeState, tokens: &[u32]) -> candle::Result<Tensor> {
        self.check_step_tokens(state, tokens)?;
        let ids = Tensor::from_slice(tokens, (tokens.len(), 1), self.device())?;
        let logits = self.step_checked(state, &ids, Some(tokens))?.squeeze(1)?;
        log_softmax_rows(logits.to_dtype(DType::F32)?)
    }

    fn reorder(&self, state: &mut DecodeState, rows: &[u32]) -> candle::Result<()> {
        state.select_rows(rows)
    }

    /// On the CPU, the self-attention caches start with room for the first
    /// 32 positions (or the whole decode, when shorter) and then grow by a
    /// quarter (see [`crate::kv_cache::KvCache::append`]); a beam search's move at its first
    /// reorder into slots that its beams share (see [`crate::kv_cache`]). Reserving the whole
    /// decode at once
    /// made every row's room for `max_length` positions resident: the allocator recycles
    /// memory it has used (and zeroes it in full), so a reserve is not lazy pages but memory,
    /// 6 MB a row for MarianMT's 256 positions. Elsewhere the caches grow from the first
    /// step's size.
    fn reserve(&self, state: &mut DecodeState, positions: usize) -> candle::Result<()> {
        if self.device().is_cpu() {
            let room = positions
                .min(FIRST_CACHE_ROOM)
                .min(self.spec.max_position_embeddings);
            state.cache.reserve(room);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_put_sin_first_and_cos_second() {
        let pe = marian_positions(3, 4, DType::F32, &Device::Cpu).unwrap();
        let pe: Vec<Vec<f32>> = pe.to_vec2().unwrap();
        // pos 2: angles 2/10000^0 (j = 0, 1) and 2/10000^0.5 (j = 2, 3).
        let a0 = 2f64;
        let a1 = 2f64 / 100.0;
        let want = [a0.sin(), a1.sin(), a0.cos(), a1.cos()];
        for (got, want) in pe[2].iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-7, "{got} vs {want}");
        }
        assert_eq!(pe[0], vec![0.0, 0.0, 1.0, 1.0]);
    }
}

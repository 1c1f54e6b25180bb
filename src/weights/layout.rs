//! The names attention blocks give their projections ([`MhaLayout`]), recognised in a file
//! ([`MhaWeightsInfo`]).

use super::tensor_file::{join_name, normalize_prefix, TensorFile};

/// How a multi-head attention block's projections are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MhaLayout {
    /// `torch.nn.MultiheadAttention` with one fused `in_proj_weight` `(3E, E)`, rows in q, k, v
    /// order, and `in_proj_bias` `(3E)`.
    TorchFused,
    /// `torch.nn.MultiheadAttention` with `kdim`/`vdim` ≠ `embed_dim`: `q_proj_weight`,
    /// `k_proj_weight`, `v_proj_weight` and still one fused `in_proj_bias` `(3E)`.
    TorchSeparate,
    /// Hugging Face style linear layers: `q_proj.weight`/`.bias`, `k_proj.*`, `v_proj.*`.
    HuggingFace,
}

impl MhaLayout {
    /// The tensor whose presence identifies each layout, in detection order.
    pub const MARKERS: [(MhaLayout, &'static str); 3] = [
        (MhaLayout::TorchFused, "in_proj_weight"),
        (MhaLayout::TorchSeparate, "q_proj_weight"),
        (MhaLayout::HuggingFace, "q_proj.weight"),
    ];

    /// Finds the layout from the names present (`contains` answers for names relative to the
    /// block's prefix). `None` if no marker tensor is there.
    pub fn detect(contains: impl Fn(&str) -> bool) -> Option<MhaLayout> {
        Self::MARKERS
            .iter()
            .find(|(_, marker)| contains(marker))
            .map(|(layout, _)| *layout)
    }

    /// Human-readable description.
    pub fn describe(&self) -> &'static str {
        match self {
            MhaLayout::TorchFused => "torch nn.MultiheadAttention (fused in_proj_weight)",
            MhaLayout::TorchSeparate => {
                "torch nn.MultiheadAttention (separate q/k/v_proj_weight, kdim/vdim != embed_dim)"
            }
            MhaLayout::HuggingFace => "Hugging Face (q_proj/k_proj/v_proj/out_proj)",
        }
    }

    /// The error when no layout is found under `prefix`: says what was looked for.
    pub fn not_found_message(prefix: &str) -> String {
        let looked_for = Self::MARKERS
            .iter()
            .map(|(layout, marker)| {
                format!("{} ({})", join_name(prefix, marker), layout.short_name())
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!("no multi-head attention weights under '{prefix}': looked for {looked_for}")
    }

    fn short_name(&self) -> &'static str {
        match self {
            MhaLayout::TorchFused => "torch fused",
            MhaLayout::TorchSeparate => "torch separate",
            MhaLayout::HuggingFace => "Hugging Face",
        }
    }
}

/// What the weights of one attention block say about its configuration, read from shapes
/// alone (no data is loaded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MhaWeightsInfo {
    /// The prefix the block's tensors live under (`""` for none), without a trailing dot.
    pub prefix: String,
    /// The name layout.
    pub layout: MhaLayout,
    /// `E`, from `out_proj.weight` `(E, E)`.
    pub embed_dim: usize,
    /// Input size of the key projection.
    pub kdim: usize,
    /// Input size of the value projection.
    pub vdim: usize,
    /// Whether the projections have biases.
    pub bias: bool,
    /// Whether `bias_k`/`bias_v` are present.
    pub add_bias_kv: bool,
    /// Number of parameters in the block.
    pub parameters: usize,
}

impl MhaWeightsInfo {
    /// Reads the block under `prefix` of `file`: its layout and sizes, checking that the
    /// shapes agree with each other (errors name the tensors and their shapes). `prefix` may
    /// end with a dot, as torch writes it; [`MhaWeightsInfo::prefix`] is stored without.
    pub fn from_file(file: &TensorFile, prefix: &str) -> candle::Result<Self> {
        let prefix = normalize_prefix(prefix);
        let name = |n: &str| join_name(prefix, n);
        let layout = MhaLayout::detect(|n| file.contains(&name(n))).ok_or_else(|| {
            candle::Error::Msg(format!(
                "{}; {}",
                MhaLayout::not_found_message(prefix),
                file.not_found(&name("in_proj_weight"))
            ))
        })?;
        let shape = |n: &str| file.shape_of(&name(n));
        let out_w = shape("out_proj.weight")?;
        let embed_dim = match out_w.as_slice() {
            [e, e2] if e == e2 => *e,
            _ => candle::bail!(
                "'{}' must be square (E, E), got {out_w:?}",
                name("out_proj.weight")
            ),
        };
        let matrix = |n: &str, rows: usize| -> candle::Result<usize> {
            let s = shape(n)?;
            match s.as_slice() {
                [r, c] if *r == rows => Ok(*c),
                _ => candle::bail!(
                    "'{}' has shape {s:?}, expected ({rows}, in_features) to match out_proj.weight {out_w:?}",
                    name(n)
                ),
            }
        };
        let (kdim, vdim) = match layout {
            MhaLayout::TorchFused => {
                let c = matrix("in_proj_weight", 3 * embed_dim)?;
                if c != embed_dim {
                    candle::bail!(
                        "'{}' has shape [{}, {c}], expected ({}, {embed_dim}) for embed_dim {embed_dim}",
                        name("in_proj_weight"),
                        3 * embed_dim,
                        3 * embed_dim
                    )
                }
                (embed_dim, embed_dim)
            }
            MhaLayout::TorchSeparate => {
                let q = matrix("q_proj_weight", embed_dim)?;
                if q != embed_dim {
                    candle::bail!(
                        "'{}' must be ({embed_dim}, {embed_dim}), got [{embed_dim}, {q}]",
                        name("q_proj_weight")
                    )
                }
                (
                    matrix("k_proj_weight", embed_dim)?,
                    matrix("v_proj_weight", embed_dim)?,
                )
            }
            MhaLayout::HuggingFace => {
                let q = matrix("q_proj.weight", embed_dim)?;
                if q != embed_dim {
                    candle::bail!(
                        "'{}' must be ({embed_dim}, {embed_dim}), got [{embed_dim}, {q}]",
                        name("q_proj.weight")
                    )
                }
                (
                    matrix("k_proj.weight", embed_dim)?,
                    matrix("v_proj.weight", embed_dim)?,
                )
            }
        };
        let bias = match layout {
            MhaLayout::TorchFused | MhaLayout::TorchSeparate => {
                file.contains(&name("in_proj_bias"))
            }
            MhaLayout::HuggingFace => file.contains(&name("q_proj.bias")),
        };
        let add_bias_kv = file.contains(&name("bias_k"));
        let parameters = file
            .names_under(prefix)
            .iter()
            .filter_map(|n| file.summary(n))
            .filter(|s| {
                let rel = &s.name[if prefix.is_empty() {
                    0
                } else {
                    prefix.len() + 1
                }..];
                MHA_TENSOR_NAMES.contains(&rel)
            })
            .map(|s| s.elem_count())
            .sum();
        Ok(Self {
            prefix: prefix.to_string(),
            layout,
            embed_dim,
            kdim,
            vdim,
            bias,
            add_bias_kv,
            parameters,
        })
    }

    /// Every attention block in `file`: each prefix under which a layout marker tensor
    /// appears, sorted by prefix.
    pub fn find_all(file: &TensorFile) -> Vec<candle::Result<Self>> {
        let mut prefixes: Vec<String> = file
            .names()
            .iter()
            .filter_map(|n| {
                MhaLayout::MARKERS.iter().find_map(|(_, marker)| {
                    if *n == *marker {
                        Some(String::new())
                    } else {
                        n.strip_suffix(marker)?
                            .strip_suffix('.')
                            .map(str::to_string)
                    }
                })
            })
            .collect();
        prefixes.sort();
        prefixes.dedup();
        prefixes.iter().map(|p| Self::from_file(file, p)).collect()
    }
}

/// Every tensor name (relative to the block) that belongs to an attention block.
pub const MHA_TENSOR_NAMES: [&str; 15] = [
    "in_proj_weight",
    "in_proj_bias",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "q_proj.weight",
    "q_proj.bias",
    "k_proj.weight",
    "k_proj.bias",
    "v_proj.weight",
    "v_proj.bias",
    "out_proj.weight",
    "out_proj.bias",
    "bias_k",
    "bias_v",
];

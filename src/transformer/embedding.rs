//! Token embeddings scaled by `sqrt(d_model)` and sinusoidal positional encodings (paper
//! sections 3.4 and 3.5).

use candle::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, VarBuilder};

/// A `(vocab, d_model)` embedding table whose outputs are multiplied by `sqrt(d_model)`.
/// Tensor name: `weight`.
#[derive(Clone, Debug)]
pub struct TokenEmbedding {
    embedding: Embedding,
    scale: f64,
}

impl TokenEmbedding {
    /// Reads (or, from a `VarMap`, creates with `N(0, 1)`) `weight` `(vocab, d_model)`.
    pub fn new(vocab: usize, d_model: usize, vb: VarBuilder) -> candle::Result<Self> {
        let weight = vb.get_with_hints(
            (vocab, d_model),
            "weight",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        Ok(Self {
            embedding: Embedding::new(weight, d_model),
            scale: (d_model as f64).sqrt(),
        })
    }

    /// The table `(vocab, d_model)`, e.g. to tie the output projection to it.
    pub fn weight(&self) -> &Tensor {
        self.embedding.embeddings()
    }

    /// Number of tokens in the table.
    pub fn vocab_size(&self) -> usize {
        self.embedding.embeddings().dim(0).unwrap_or(0)
    }

    /// `ids` `(B, T)` `U32` → `(B, T, d_model)`. Ids outside the table are an error that names
    /// the largest id and the table size.
    pub fn forward(&self, ids: &Tensor) -> candle::Result<Tensor> {
        let vocab = self.vocab_size();
        if ids.elem_count() > 0 {
            let max = ids
                .flatten_all()?
                .max(0)?
                .to_dtype(DType::U32)?
                .to_scalar::<u32>()? as usize;
            if max >= vocab {
                candle::bail!("token id {max} is out of range for a vocabulary of {vocab} tokens")
            }
        }
        self.embed(ids)
    }

    /// [`TokenEmbedding::forward`] for ids on the host, `ids` `(B · T)` row-major as `(B, T)`:
    /// checked against the table here (an error names the first id outside it), uploaded
    /// once, embedded `(B, T, d_model)`. What a decoding step uses: the range check on the
    /// device would read the largest id back from it.
    pub fn forward_host_ids(&self, ids: &[u32], (b, t): (usize, usize)) -> candle::Result<Tensor> {
        let vocab = self.vocab_size();
        if ids.len() != b * t {
            candle::bail!("{} token ids do not make a ({b}, {t}) batch", ids.len())
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            candle::bail!("token id {bad} is out of range for a vocabulary of {vocab} tokens")
        }
        let ids = Tensor::from_slice(ids, (b, t), self.embedding.embeddings().device())?;
        self.embed(&ids)
    }

    /// The lookup, scaled, for ids known to be inside the table.
    fn embed(&self, ids: &Tensor) -> candle::Result<Tensor> {
        self.embedding.forward(ids)? * self.scale
    }
}

/// Sinusoidal positional encodings for positions `start..start + len`, `(len, d_model)`:
/// `PE(pos, 2i) = sin(pos / 10000^(2i / d_model))`, `PE(pos, 2i + 1) = cos(...)` (interleaved,
/// as in the paper). Computed in f64 and converted to `dtype` on the host, then copied to
/// `device` (no `f64` on the device: Metal has none).
pub fn sinusoidal_positions(
    start: usize,
    len: usize,
    d_model: usize,
    dtype: DType,
    device: &Device,
) -> candle::Result<Tensor> {
    let mut values = Vec::with_capacity(len * d_model);
    for pos in start..start + len {
        for j in 0..d_model {
            let exponent = (2 * (j / 2)) as f64 / d_model as f64;
            let angle = pos as f64 / 10000f64.powf(exponent);
            values.push(if j % 2 == 0 { angle.sin() } else { angle.cos() });
        }
    }
    Tensor::from_vec(values, (len, d_model), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_the_paper() {
        // sin/cos(pos / 10000^(2i/6)) for pos 3 and 4, d_model 6 (values from Python's math).
        let expected = [
            [
                0.14112000806,
                -0.9899924966,
                0.13879810108,
                0.990320699136,
                0.00646325907,
                0.999979112923,
            ],
            [
                -0.756802495308,
                -0.653643620864,
                0.184598723621,
                0.982813975907,
                0.008617632094,
                0.999962867519,
            ],
        ];
        let pe = sinusoidal_positions(3, 2, 6, DType::F64, &Device::Cpu).unwrap();
        let pe: Vec<Vec<f64>> = pe.to_vec2().unwrap();
        for (row, want) in pe.iter().zip(expected) {
            for (v, w) in row.iter().zip(want) {
                assert!((v - w).abs() < 1e-10, "{v} vs {w}");
            }
        }
    }
}

//! The model's side of generation: the [`StepDecoder`] trait, and how the searches fetch a
//! step's answer to the host and reorder the model's rows.

use super::config::Resolved;
use candle::{DType, Result, Tensor};

/// A model decoded one token at a time: what every search of [`crate::generation`] drives.
///
/// The state holds one row per hypothesis being extended (e.g. the per-layer KV caches and the
/// encoder memory of each row). A model family implements this once and gets
/// [`crate::generation::generate`] with every `transformers` setting.
pub trait StepDecoder {
    /// Per-row decoding state.
    type State;

    /// Feeds one token per row (`tokens.len()` == number of rows) and returns the
    /// log-probabilities of the next token, a `(rows, vocab)` tensor (any float dtype, any
    /// device).
    fn step(&self, state: &mut Self::State, tokens: &[u32]) -> Result<Tensor>;

    /// Rebuilds the state so that new row `i` is old row `rows[i]` (rows may repeat or be
    /// dropped; the number of rows may change).
    fn reorder(&self, state: &mut Self::State, rows: &[u32]) -> Result<()>;
}

/// Checks one step's output `(rows, vocab)` of a [`StepDecoder`] fed `rows` tokens, the
/// vocabulary (`check_vocab` at the first step, the same size afterwards), and copies it to the
/// host as `f32`: `(rows · vocab values, vocab)`.
fn step_to_host(
    log_probs: &Tensor,
    rows: usize,
    vocab: &mut Option<usize>,
    check_vocab: impl FnOnce(usize) -> Result<()>,
) -> Result<(Vec<f32>, usize)> {
    let (got_rows, v) = match log_probs.dims() {
        &[r, v] => (r, v),
        dims => candle::bail!(
            "StepDecoder::step must return (rows, vocab) log-probabilities, got shape {dims:?} for {rows} rows"
        ),
    };
    if got_rows != rows {
        candle::bail!(
            "StepDecoder::step was fed {rows} tokens but returned log-probabilities for {got_rows} rows"
        )
    }
    match *vocab {
        None => {
            check_vocab(v)?;
            *vocab = Some(v);
        }
        Some(prev) if prev != v => candle::bail!(
            "StepDecoder::step changed the vocabulary size from {prev} to {v} between steps"
        ),
        Some(_) => {}
    }
    let data = log_probs
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok((data, v))
}

/// One step's log-probabilities copied to the host as `f32`, `rows * vocab` values.
pub(super) struct HostStep {
    data: Vec<f32>,
    pub(super) rows: usize,
    pub(super) vocab: usize,
}

impl HostStep {
    /// The `vocab` values of `row`.
    pub(super) fn row(&self, row: usize) -> &[f32] {
        &self.data[row * self.vocab..(row + 1) * self.vocab]
    }
}

/// Feeds `tokens` (one per row) and checks the answer: `(rows, vocab)`, the same vocabulary
/// at every step, the configured ids inside it (checked at the first step).
pub(super) fn fetch_step<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    tokens: &[u32],
    vocab: &mut Option<usize>,
    cfg: &Resolved,
) -> Result<HostStep> {
    let out = model.step(state, tokens)?;
    let rows = tokens.len();
    let (data, v) = step_to_host(&out, rows, vocab, |v| cfg.check_vocab(v))?;
    Ok(HostStep {
        data,
        rows,
        vocab: v,
    })
}

/// Calls `reorder` unless `rows` is the identity on `current_rows` rows.
pub(super) fn reorder_unless_identity<M: StepDecoder>(
    model: &M,
    state: &mut M::State,
    rows: &[u32],
    current_rows: usize,
) -> Result<()> {
    let identity =
        rows.len() == current_rows && rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    if identity {
        Ok(())
    } else {
        model.reorder(state, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_reorders_are_skipped() {
        struct Counter(std::cell::Cell<usize>);
        impl StepDecoder for Counter {
            type State = ();
            fn step(&self, _: &mut (), _: &[u32]) -> Result<Tensor> {
                unreachable!()
            }
            fn reorder(&self, _: &mut (), _: &[u32]) -> Result<()> {
                self.0.set(self.0.get() + 1);
                Ok(())
            }
        }
        let m = Counter(std::cell::Cell::new(0));
        reorder_unless_identity(&m, &mut (), &[0, 1, 2], 3).unwrap();
        assert_eq!(m.0.get(), 0);
        reorder_unless_identity(&m, &mut (), &[0, 1], 3).unwrap();
        reorder_unless_identity(&m, &mut (), &[0, 0, 1], 3).unwrap();
        assert_eq!(m.0.get(), 2);
    }

    #[test]
    fn bad_step_shapes_are_named() {
        let t = Tensor::zeros((2, 3), DType::F32, &candle::Device::Cpu).unwrap();
        let mut vocab = None;
        let err = step_to_host(&t, 3, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("fed 3 tokens"), "{err}");
        let t3 = Tensor::zeros((2, 3, 1), DType::F32, &candle::Device::Cpu).unwrap();
        let err = step_to_host(&t3, 2, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("(rows, vocab)"), "{err}");
        step_to_host(&t, 2, &mut vocab, |_| Ok(())).unwrap();
        let t4 = Tensor::zeros((2, 4), DType::F32, &candle::Device::Cpu).unwrap();
        let err = step_to_host(&t4, 2, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("from 3 to 4"), "{err}");
    }
}

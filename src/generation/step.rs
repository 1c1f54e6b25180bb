//! The model's side of generation: the [`StepDecoder`] trait, and how the searches fetch a
//! step's answer to the host and reorder the model's rows.

use super::config::Resolved;
use super::hypothesis::Hypothesis;
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

    /// Told once before the first step: no row will be fed more than `positions` tokens. A
    /// decoder may size its caches for that at once (the default does nothing); it changes
    /// no result.
    fn reserve(&self, state: &mut Self::State, positions: usize) -> Result<()> {
        let _ = (state, positions);
        Ok(())
    }
}

/// What the first half of a search step leaves to do: feed these tokens (one per state row)
/// and hand the model's answer to the second half, or nothing, the search having ended
/// (with these items handed out).
pub(crate) enum StepStart {
    Feed(Vec<u32>),
    Ended(Vec<(usize, Vec<Hypothesis>)>),
}

/// Checks one step's output `(rows, vocab)` of a [`StepDecoder`] fed `rows` tokens and the
/// vocabulary (`check_vocab` at the first step, the same size afterwards); returns the
/// vocabulary size.
fn check_step(
    log_probs: &Tensor,
    rows: usize,
    vocab: &mut Option<usize>,
    check_vocab: impl FnOnce(usize) -> Result<()>,
) -> Result<usize> {
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
    Ok(v)
}

/// One step's log-probabilities on the host as `f32`, `rows * vocab` values.
pub(super) struct HostStep {
    values: HostValues,
    pub(super) rows: usize,
    pub(super) vocab: usize,
}

/// Where a step's values lie.
enum HostValues {
    /// A contiguous CPU `f32` tensor, read in place: copying it would cost a pass over
    /// `rows × vocab` values on one thread every step (at beam-search sizes, 32 × 58101 values,
    /// 3–4% of the whole run).
    InPlace(Tensor),
    /// Any other tensor (another device or dtype, a strided view), copied.
    Copied(Vec<f32>),
}

impl HostStep {
    /// Reads a step's `(rows, vocab)` output: in place when it is a contiguous CPU `f32` tensor,
    /// else converted and copied to the host.
    fn new(log_probs: Tensor, rows: usize, vocab: usize) -> Result<Self> {
        let in_place = log_probs.device().is_cpu()
            && log_probs.dtype() == DType::F32
            && log_probs.is_contiguous();
        let values = if in_place {
            HostValues::InPlace(log_probs)
        } else {
            HostValues::Copied(
                log_probs
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            )
        };
        Ok(Self {
            values,
            rows,
            vocab,
        })
    }

    /// Runs `f` on the `rows * vocab` values, row-major, borrowed where they lie.
    pub(super) fn with_values<R>(&self, f: impl FnOnce(&[f32]) -> Result<R>) -> Result<R> {
        let len = self.rows * self.vocab;
        match &self.values {
            HostValues::InPlace(t) => {
                let (storage, layout) = t.storage_and_layout();
                f(&crate::simd::cpu_f32(&storage)?[layout.start_offset()..][..len])
            }
            HostValues::Copied(v) => f(&v[..len]),
        }
    }
}

/// Checks a step's answer `log_probs` to `rows` tokens fed: `(rows, vocab)`, the same
/// vocabulary at every step, the configured ids inside it (checked at the first step); then
/// reads it.
pub(super) fn host_step(
    log_probs: Tensor,
    rows: usize,
    vocab: &mut Option<usize>,
    cfg: &Resolved,
) -> Result<HostStep> {
    let v = check_step(&log_probs, rows, vocab, |v| cfg.check_vocab(v))?;
    HostStep::new(log_probs, rows, v)
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
        let err = check_step(&t, 3, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("fed 3 tokens"), "{err}");
        let t3 = Tensor::zeros((2, 3, 1), DType::F32, &candle::Device::Cpu).unwrap();
        let err = check_step(&t3, 2, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("(rows, vocab)"), "{err}");
        check_step(&t, 2, &mut vocab, |_| Ok(())).unwrap();
        let t4 = Tensor::zeros((2, 4), DType::F32, &candle::Device::Cpu).unwrap();
        let err = check_step(&t4, 2, &mut vocab, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("from 3 to 4"), "{err}");
    }
}

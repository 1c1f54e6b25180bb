//! What every translator (text in, text out over an [`EncoderDecoderModel`]) does the same
//! way, whatever its family and tokenizer: generating a padded batch so that one failing row
//! never takes the others' results with it, and the cross-attention map of a hypothesis.

use super::encoder_decoder::EncoderDecoderModel;
use crate::explain::AttentionMap;
use crate::generation::Hypothesis;
use candle::Tensor;

/// `generate` on the whole `batch`, or, when that fails, on each row alone: one result per row,
/// each its hypotheses best first. Rows of a padded batch are independent, so the fallback
/// changes no output; it only confines an error (e.g. a translation running past the model's
/// positions) to the row that caused it.
pub(crate) fn generate_rows(
    batch: &[Vec<u32>],
    generate: impl Fn(&[Vec<u32>]) -> candle::Result<Vec<Vec<Hypothesis>>>,
) -> Vec<candle::Result<Vec<Hypothesis>>> {
    match generate(batch) {
        Ok(all) => all.into_iter().map(Ok).collect(),
        Err(_) if batch.len() > 1 => batch
            .iter()
            .map(|ids| generate(std::slice::from_ref(ids)).map(|mut one| one.swap_remove(0)))
            .collect(),
        Err(e) => vec![Err(e)],
    }
}

/// Where `hypothesis` (generated from `source_ids`) looked: the encoder-decoder attention of
/// decoder `layer` (default: the last) over the source tokens, per head, one row per generated
/// token, from a teacher-forced pass over the hypothesis; tokens named by `label`.
pub(crate) fn attention_map(
    model: &EncoderDecoderModel,
    source_ids: &[u32],
    hypothesis: &Hypothesis,
    layer: Option<usize>,
    label: impl Fn(u32) -> String,
) -> candle::Result<AttentionMap> {
    let device = model.device();
    let sequence = &hypothesis.tokens;
    let input = Tensor::new(source_ids, device)?.unsqueeze(0)?;
    let mask = input.ones_like()?;
    // Rows: the generated tokens, fed as the decoder input shifted by the start token.
    let generated = &sequence[1.min(sequence.len())..];
    let decoder_input = &sequence[..sequence.len().saturating_sub(1)];
    let dec = Tensor::new(decoder_input, device)?.unsqueeze(0)?;
    let all = model.cross_attention_weights(&input, &mask, &dec)?;
    let num_layers = all.len();
    let layer = layer.unwrap_or(num_layers.saturating_sub(1));
    let weights = all.get(layer).ok_or_else(|| {
        candle::Error::Msg(format!(
            "layer {layer} does not exist: the model has {num_layers} decoder layers (0..{num_layers})"
        ))
    })?;
    let weights: Vec<Vec<Vec<f32>>> = weights
        .squeeze(0)?
        .to_dtype(candle::DType::F32)?
        .to_vec3()?;
    Ok(AttentionMap {
        source: source_ids.iter().map(|&id| label(id)).collect(),
        output: generated.iter().map(|&id| label(id)).collect(),
        weights,
        layer,
        num_layers,
    })
}

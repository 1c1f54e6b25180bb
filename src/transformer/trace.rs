//! What each attention block of a forward pass received and returned, recorded by the layers
//! themselves during a real (eval) pass: the inputs `crate::explain` rebuilds a block from, and
//! the outputs it is checked against.

use crate::mask::Mask;
use candle::Tensor;

/// One attention block of a forward pass: its inputs, the mask it was given and its output,
/// batch first. Recorded by [`super::TransformerEncoder::forward_traced`] and
/// [`super::TransformerDecoder::forward_traced`].
#[derive(Clone, Debug)]
pub struct AttentionTrace {
    /// The query input `(B, L, d_model)`: the layer input, or its pre-norm when `norm_first`;
    /// for encoder-decoder attention, the output of the layer's self-attention sublayer.
    pub query: Tensor,
    /// The key and value input `(B, S, d_model)`: the query input again for self-attention,
    /// the encoder memory for encoder-decoder attention.
    pub key_value: Tensor,
    /// The attention mask and key padding the block was given, as one [`Mask`].
    pub mask: Mask,
    /// The block's output `(B, L, d_model)`, after `W^O`, before dropout and the residual.
    pub output: Tensor,
}

impl AttentionTrace {
    /// Records a block call: `mask` and `key_padding` (`(B, S)`, if any) are combined the way
    /// [`crate::MultiHeadAttention::attend_projected`] combines them.
    pub(crate) fn new(
        query: &Tensor,
        key_value: &Tensor,
        mask: &Mask,
        key_padding: Option<&Tensor>,
        output: &Tensor,
    ) -> candle::Result<Self> {
        let mut mask = mask.clone();
        if let Some(kp) = key_padding {
            mask = mask.and(Mask::key_padding(kp.clone())?);
        }
        Ok(Self {
            query: query.clone(),
            key_value: key_value.clone(),
            mask,
            output: output.clone(),
        })
    }
}

/// The two attention blocks of one decoder layer in a traced pass.
#[derive(Clone, Debug)]
pub struct DecoderLayerTrace {
    /// Masked (causal) self-attention over the target.
    pub self_attn: AttentionTrace,
    /// Encoder-decoder attention: target queries over the encoder memory.
    pub cross_attn: AttentionTrace,
}

/// A whole encoder-decoder forward pass (eval mode), with every attention block recorded.
#[derive(Clone, Debug)]
pub struct ModelTrace {
    /// Encoder self-attention, one per encoder layer.
    pub encoder: Vec<AttentionTrace>,
    /// Decoder blocks, one per decoder layer.
    pub decoder: Vec<DecoderLayerTrace>,
    /// The encoder output `(B, S, d_model)`.
    pub memory: Tensor,
    /// The next-token logits `(B, T, target_vocab)`: equal to the model's plain forward pass.
    pub logits: Tensor,
}

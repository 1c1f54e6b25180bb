//! Arbitrary bytes as a weights file: read it (header, offsets, dtypes, shapes), find every
//! attention block in it, load each into `MultiHeadAttention`, and read it as an
//! `nn.Transformer` state dict, as `attn inspect`, `attn run mha` and `attn run transformer` do.
//!
//! Invariants: no panic; whatever loads runs on an input of the width it declares.

use candle::{DType, Device, Tensor};
use candle_attention::transformer::{Transformer, TransformerConfig, TransformerMasks};
use candle_attention::{
    AttentionArgs, Mask, MhaWeightsInfo, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile,
};

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let dev = Device::Cpu;
    let Ok(file) = TensorFile::from_bytes(data.to_vec(), "fuzz.safetensors") else {
        return;
    };
    // What `attn inspect` reads.
    let _ = file.summaries();
    for name in file.names() {
        let _ = file.load(name, &dev);
        let _ = file.load_as(name, DType::F32, &dev);
    }
    for info in MhaWeightsInfo::find_all(&file).into_iter().flatten() {
        for heads in [1, 2, 3] {
            let cfg = MultiHeadAttentionConfig::from_weights(&info, heads);
            let vb = file.var_builder(DType::F32, &dev);
            let vb = if info.prefix.is_empty() {
                vb
            } else {
                vb.pp(&info.prefix)
            };
            let Ok(mha) = MultiHeadAttention::load(cfg.clone(), vb) else {
                continue;
            };
            let q = Tensor::ones((1, 3, cfg.embed_dim), DType::F32, &dev).unwrap();
            let k = Tensor::ones((1, 2, cfg.kdim), DType::F32, &dev).unwrap();
            let v = Tensor::ones((1, 2, cfg.vdim), DType::F32, &dev).unwrap();
            let args = AttentionArgs {
                mask: Mask::none(),
                key_padding: None,
                need_weights: true,
                average_weights: true,
                train: false,
            };
            mha.attend(&q, &k, &v, &args)
                .expect("a block that loaded must run on inputs of its declared sizes");
        }
    }
    for prefix in ["", "transformer", "model"] {
        let Ok(cfg) = TransformerConfig::from_weights(&file, prefix, 2) else {
            continue;
        };
        let vb = file.var_builder(DType::F32, &dev);
        let vb = if prefix.is_empty() { vb } else { vb.pp(prefix) };
        let Ok(model) = Transformer::load(cfg.clone(), vb) else {
            continue;
        };
        let src = Tensor::ones((1, 3, cfg.d_model), DType::F32, &dev).unwrap();
        let tgt = Tensor::ones((1, 2, cfg.d_model), DType::F32, &dev).unwrap();
        model
            .forward(&src, &tgt, &TransformerMasks::default(), false)
            .expect("a transformer that loaded must run on inputs of its width");
    }
}

//! Arbitrary bytes as an `attn run mha` / `attn run transformer` input file. The first byte
//! picks the command and its flags; the rest is the safetensors input file. The model is
//! either a fixed one (E = 16) or one sized to fit the file's own tensors, so both the
//! "shapes disagree" errors and the paths past them are reached.
//!
//! Invariants: no panic, and the memory limit is honoured (an input that needs more than it
//! for naive attention is refused, not allocated).

use attn_cli::torch_io::{
    run_mha, run_transformer, TorchMhaInputs, TorchMhaOptions, TorchTransformerInputs,
};
use candle::{DType, Device};
use candle_attention::transformer::{Transformer, TransformerConfig};
use candle_attention::{MultiHeadAttention, MultiHeadAttentionConfig, TensorFile};
use candle_nn::VarBuilder;

/// Small enough that libFuzzer's own 2 GiB RSS limit is never the one that trips.
const LIMIT: u64 = 64 << 20;

fn last_dim(t: Option<&candle::Tensor>) -> Option<usize> {
    t.and_then(|t| t.dims().last().copied())
}

fn fits(e: usize, heads: usize) -> bool {
    (1..=64).contains(&e) && e.is_multiple_of(heads)
}

/// Runs one input; panics on a finding.
pub fn check(data: &[u8]) {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let dev = Device::Cpu;
    let Ok(file) = TensorFile::from_bytes(bytes.to_vec(), "inputs.safetensors") else {
        return;
    };
    let transformer = flags & 1 != 0;
    let batch_first = flags & 2 != 0;
    let fit_model = flags & 4 != 0;
    let heads = [1, 2, 4, 8][((flags >> 3) & 3) as usize];
    let vb = VarBuilder::zeros(DType::F32, &dev);
    if transformer {
        let Ok(inputs) = TorchTransformerInputs::from_file(&file, DType::F32, &dev) else {
            return;
        };
        let e = if fit_model {
            last_dim(Some(&inputs.src)).unwrap_or(16)
        } else {
            16
        };
        if !fits(e, heads) {
            return;
        }
        let mut cfg = TransformerConfig::new(e, heads);
        cfg.num_encoder_layers = 1;
        cfg.num_decoder_layers = 1;
        cfg.dim_feedforward = 8;
        let model = Transformer::new(cfg, vb).expect("a valid config builds");
        let _ = run_transformer(&model, &inputs, batch_first, Some(LIMIT));
    } else {
        let Ok(inputs) = TorchMhaInputs::from_file(&file, DType::F32, &dev) else {
            return;
        };
        let mut cfg = MultiHeadAttentionConfig::new(16, heads);
        if fit_model {
            let e = last_dim(Some(&inputs.query)).unwrap_or(16);
            if !fits(e, heads) {
                return;
            }
            cfg = MultiHeadAttentionConfig::new(e, heads)
                .with_kdim(last_dim(inputs.key.as_ref()).unwrap_or(e).clamp(1, 64))
                .with_vdim(last_dim(inputs.value.as_ref()).unwrap_or(e).clamp(1, 64))
                .with_add_bias_kv(flags & 0x20 != 0);
        }
        let cfg = cfg.with_add_zero_attn(flags & 0x40 != 0);
        let mha = MultiHeadAttention::new(cfg, vb).expect("a valid config builds");
        let opts = TorchMhaOptions {
            batch_first,
            causal: flags & 0x80 != 0,
            need_weights: flags & 0x20 == 0,
            average_weights: flags & 0x40 == 0,
            max_attention_bytes: Some(LIMIT),
        };
        let _ = run_mha(&mha, &inputs, opts);
    }
}

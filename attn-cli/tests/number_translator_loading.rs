//! The number translator's model loads the same through `TensorFile` and candle's own
//! memory-mapped `VarBuilder`.

#[path = "../../tests/common/mod.rs"]
mod common;

use attn_cli::number_translator::{Seq2Seq, Seq2SeqConfig};
use candle::{DType, Device, Tensor};
use candle_attention::TensorFile;
use candle_nn::VarBuilder;
use common::{compare, repo_root};

#[test]
fn the_shipped_model_loads_the_same_through_candles_mmaped_var_builder() {
    let dir = repo_root().join("weights");
    let cfg = Seq2SeqConfig::load(dir.join("config.json")).unwrap();
    let weights = dir.join("model.safetensors");
    let ours = Seq2Seq::load(
        cfg.clone(),
        TensorFile::open(&weights)
            .unwrap()
            .var_builder(DType::F32, &Device::Cpu),
    )
    .unwrap();
    let theirs = Seq2Seq::load(
        cfg, // SAFETY: the committed weights are not modified while the tests run.
        unsafe {
            VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu).unwrap()
        },
    )
    .unwrap();
    let src = Tensor::new(&[[5u32, 6, 7, 2]], &Device::Cpu).unwrap();
    let tgt = Tensor::new(&[[1u32, 8, 9]], &Device::Cpu).unwrap();
    let a = ours.forward(&src, &tgt, false).unwrap();
    let b = theirs.forward(&src, &tgt, false).unwrap();
    assert_eq!(compare(&b, &a, 0.0, 0.0).unwrap(), 0.0);
}

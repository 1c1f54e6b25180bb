//! Loading weights: `TensorFile` memory-maps (and still validates and reads torch `BOOL`
//! tensors), candle's own `VarBuilder::from_mmaped_safetensors` works wherever this crate takes
//! a `VarBuilder`, and a block prefix may end with torch's trailing dot.

mod common;

use candle::{DType, Device};
use candle_attention::transformer::{Transformer, TransformerConfig, TransformerMasks};
use candle_attention::{
    Mask, MhaWeightsInfo, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile,
};
use candle_nn::VarBuilder;
use common::{compare, mha_cases, repo_root, transformer_cases, uniform};
use std::path::Path;

/// candle's memory-mapped `VarBuilder` over `path`.
fn mmaped(path: &Path) -> VarBuilder<'static> {
    // SAFETY: the committed fixture files are not modified while the tests run.
    unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &Device::Cpu).unwrap() }
}

/// Every tensor of `a` equals the same tensor of `b` exactly (dtype, shape, bits).
fn same_tensors(a: &TensorFile, b: &TensorFile) {
    assert_eq!(a.names(), b.names());
    for name in a.names() {
        let x = a.load(name, &Device::Cpu).unwrap();
        let y = b.load(name, &Device::Cpu).unwrap();
        assert_eq!(x.dtype(), y.dtype(), "{name}");
        assert_eq!(x.dims(), y.dims(), "{name}");
        let (x, y) = (
            x.to_dtype(DType::F64).unwrap().flatten_all().unwrap(),
            y.to_dtype(DType::F64).unwrap().flatten_all().unwrap(),
        );
        let (x, y): (Vec<f64>, Vec<f64>) = (x.to_vec1().unwrap(), y.to_vec1().unwrap());
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{name} differs"
        );
    }
}

#[test]
fn open_maps_the_file_and_loads_what_reading_it_loads() {
    let path = repo_root().join("weights/mha_demo.safetensors");
    let mapped = TensorFile::open(&path).unwrap();
    assert!(mapped.is_mapped());
    let read = TensorFile::from_bytes(std::fs::read(&path).unwrap(), "read").unwrap();
    assert!(!read.is_mapped());
    same_tensors(&mapped, &read);
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path).unwrap().into_boxed_slice());
    let embedded = TensorFile::from_static(bytes, "embedded").unwrap();
    assert!(!embedded.is_mapped());
    same_tensors(&mapped, &embedded);
}

#[test]
fn bool_tensors_load_from_a_mapped_file() {
    let mut seen = 0;
    for case in mha_cases() {
        let file = TensorFile::open(case.file("inputs")).unwrap();
        assert!(file.is_mapped());
        for s in file.summaries().into_iter().filter(|s| s.dtype == "BOOL") {
            let t = file.load(&s.name, &Device::Cpu).unwrap();
            assert_eq!(t.dtype(), DType::U8);
            assert_eq!(t.dims(), s.shape.as_slice());
            let values: Vec<u8> = t.flatten_all().unwrap().to_vec1().unwrap();
            assert!(values.iter().all(|&v| v <= 1), "{}: 0 or 1", s.name);
            seen += 1;
        }
    }
    assert!(seen > 0, "the fixtures hold BOOL masks");
}

#[test]
fn a_truncated_file_is_refused_when_mapped() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(repo_root().join("weights/mha_demo.safetensors")).unwrap();
    let path = dir.path().join("cut.safetensors");
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let err = TensorFile::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("cut.safetensors is not a valid safetensors file"),
        "{err}"
    );
}

/// `MultiHeadAttention::load` from candle's mmaped backend gives what `TensorFile` gives.
#[test]
fn candles_mmaped_var_builder_loads_attention() {
    let path = repo_root().join("weights/mha_demo.safetensors");
    let cfg = MultiHeadAttentionConfig::new(64, 8);
    let ours = MultiHeadAttention::load(
        cfg.clone(),
        TensorFile::open(&path)
            .unwrap()
            .var_builder(DType::F32, &Device::Cpu)
            .pp("self_attn"),
    )
    .unwrap();
    let theirs = MultiHeadAttention::load(cfg, mmaped(&path).pp("self_attn")).unwrap();
    let x = uniform(&[2, 6, 64], 7);
    let err = compare(
        &theirs.forward(&x).unwrap(),
        &ours.forward(&x).unwrap(),
        0.0,
        0.0,
    )
    .unwrap();
    assert_eq!(err, 0.0);
}

/// The same for a `torch.nn.Transformer` under a prefix.
#[test]
fn candles_mmaped_var_builder_loads_transformers() {
    let case = transformer_cases()
        .into_iter()
        .find(|c| !c.prefix.is_empty())
        .expect("a prefixed transformer fixture");
    let path = case.file("weights");
    let file = TensorFile::open(&path).unwrap();
    let cfg = TransformerConfig {
        norm_first: case.norm_first,
        ..TransformerConfig::from_weights(&file, &case.prefix, case.nhead).unwrap()
    };
    let ours = Transformer::load(
        cfg.clone(),
        file.var_builder(DType::F32, &Device::Cpu).pp(&case.prefix),
    )
    .unwrap();
    let theirs = Transformer::load(cfg.clone(), mmaped(&path).pp(&case.prefix)).unwrap();
    let (src, tgt) = (
        uniform(&[2, 5, cfg.d_model], 1),
        uniform(&[2, 4, cfg.d_model], 2),
    );
    let masks = TransformerMasks {
        tgt_mask: Mask::causal(),
        ..Default::default()
    };
    let a = ours.forward(&src, &tgt, &masks, false).unwrap();
    let b = theirs.forward(&src, &tgt, &masks, false).unwrap();
    assert_eq!(compare(&b, &a, 0.0, 0.0).unwrap(), 0.0);
}

/// torch writes module prefixes with a trailing dot (`state_dict(prefix=...)`); both forms
/// name the same block.
#[test]
fn a_prefix_may_end_with_a_dot() {
    let case = mha_cases()
        .into_iter()
        .find(|c| !c.prefix.is_empty())
        .expect("a prefixed attention fixture");
    let file = TensorFile::open(case.file("weights")).unwrap();
    let plain = MhaWeightsInfo::from_file(&file, &case.prefix).unwrap();
    let dotted = MhaWeightsInfo::from_file(&file, &format!("{}.", case.prefix)).unwrap();
    assert_eq!(plain, dotted);
    assert_eq!(dotted.prefix, case.prefix);
    assert_eq!(
        file.names_under(&format!("{}.", case.prefix)),
        file.names_under(&case.prefix)
    );

    let t = transformer_cases()
        .into_iter()
        .find(|c| !c.prefix.is_empty())
        .expect("a prefixed transformer fixture");
    let file = TensorFile::open(t.file("weights")).unwrap();
    assert_eq!(
        TransformerConfig::from_weights(&file, &format!("{}.", t.prefix), t.nhead).unwrap(),
        TransformerConfig::from_weights(&file, &t.prefix, t.nhead).unwrap()
    );
}

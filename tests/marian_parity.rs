//! MarianMT against transformers: encoder states and logits of `MarianMTModel(...)` on padded
//! batches, for every fixture variant (tests/fixtures/make_marian_fixtures.py), and the
//! positional table.

use candle::{DType, Device, Tensor};
use candle_attention::marian::{marian_positions, MarianMTModel};
use candle_attention::TensorFile;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian")
}

/// Every fixture directory (one per variant).
fn variants() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("tests/fixtures/marian exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 4,
        "expected the fixture variants, found {dirs:?}"
    );
    dirs
}

/// Largest |a - b| / (1 + |b|); NaN anywhere gives NaN, which fails every `<=` check.
fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    a.iter().zip(&b).fold(0f32, |m, (x, y)| {
        let d = (x - y).abs() / (1.0 + y.abs());
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}

fn ids(file: &TensorFile, name: &str) -> Tensor {
    file.load(name, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::U32)
        .unwrap()
}

#[test]
fn logits_and_encoder_states_match_transformers() {
    for dir in variants() {
        let model = MarianMTModel::from_dir(&dir, &Device::Cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        let (logits, memory) = model
            .forward(
                &ids(&inputs, "input_ids"),
                &ids(&inputs, "attention_mask"),
                &ids(&inputs, "decoder_input_ids"),
            )
            .unwrap();
        let want_logits = expected.load("logits", &Device::Cpu).unwrap();
        let want_memory = expected
            .load("encoder_last_hidden_state", &Device::Cpu)
            .unwrap();
        let (dl, dm) = (
            max_rel_diff(&logits, &want_logits),
            max_rel_diff(&memory, &want_memory),
        );
        println!("{}: logits {dl:.2e}, encoder {dm:.2e}", dir.display());
        // fp32 round-off through 2 + 2 layers and a softmax-free output: 1e-4 relative.
        assert!(dl <= 1e-4, "{}: logits differ by {dl}", dir.display());
        assert!(
            dm <= 1e-4,
            "{}: encoder states differ by {dm}",
            dir.display()
        );
    }
}

#[test]
fn step_by_step_decoding_equals_the_full_pass() {
    use candle_attention::StepDecoder;
    for dir in variants() {
        let model = MarianMTModel::from_dir(&dir, &Device::Cpu).unwrap();
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let (input_ids, mask) = (ids(&inputs, "input_ids"), ids(&inputs, "attention_mask"));
        let dec = ids(&inputs, "decoder_input_ids");
        let (full, _) = model.forward(&input_ids, &mask, &dec).unwrap();
        let full = candle_nn::ops::log_softmax(&full, candle::D::Minus1).unwrap();
        let mut state = model.start(&input_ids, &mask).unwrap();
        let tokens: Vec<Vec<u32>> = dec.to_vec2().unwrap();
        for t in 0..dec.dim(1).unwrap() {
            let column: Vec<u32> = tokens.iter().map(|row| row[t]).collect();
            let step = model.step(&mut state, &column).unwrap();
            let want = full.narrow(1, t, 1).unwrap().squeeze(1).unwrap();
            let d = max_rel_diff(&step, &want);
            assert!(d <= 1e-5, "{}: step {t} differs by {d}", dir.display());
        }
    }
}

#[test]
fn positions_match_transformers_table() {
    let file = TensorFile::open(fixtures().join("positions.safetensors")).unwrap();
    for name in file.names() {
        let want = file.load(name, &Device::Cpu).unwrap();
        let (n, d) = want.dims2().unwrap();
        let got = marian_positions(n, d, DType::F32, &Device::Cpu).unwrap();
        let diff = max_rel_diff(&got, &want);
        // Both compute in f64 and round to f32: identical up to libm's last bit.
        assert!(diff <= 1e-7, "{name}: {diff}");
    }
}

//! MarianMT against transformers: encoder states and logits of `MarianMTModel(...)` on padded
//! batches, for every fixture variant (tests/fixtures/make_marian_fixtures.py), and the
//! positional table. The models run on the test device (`ATTN_TEST_DEVICE`, CPU by default;
//! `tests/common`).

mod common;

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
        let model = MarianMTModel::from_dir(&dir, &common::test_device())
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
        let model = MarianMTModel::from_dir(&dir, &common::test_device()).unwrap();
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

/// `generate()` token for token: every case of every variant's `cases.json` (greedy and beam
/// search on padded batches; length limits, min tokens, bad words, forced EOS, length
/// penalties, early stopping, renormalisation), replayed with the same settings.
#[test]
fn generate_matches_transformers_token_for_token() {
    use candle_attention::generation::{generate_padded, GenerationConfig};
    use candle_attention::marian::MarianConfig;
    let mut cases_run = 0;
    let mut mismatches = Vec::new();
    for dir in variants() {
        let model = MarianMTModel::from_dir(&dir, &common::test_device()).unwrap();
        let model_cfg = MarianConfig::load(dir.join("config.json")).unwrap();
        let inputs = TensorFile::open(dir.join("inputs.safetensors")).unwrap();
        let expected = TensorFile::open(dir.join("expected.safetensors")).unwrap();
        let cases: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap())
                .unwrap();
        let gen_defaults: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("generation_config.json")).unwrap(),
        )
        .unwrap();
        for (name, case) in cases["cases"].as_object().unwrap() {
            let mut settings = gen_defaults.clone();
            for (k, v) in case["kwargs"].as_object().unwrap() {
                settings[k] = v.clone();
            }
            let mut cfg = GenerationConfig::from_json_str(&settings.to_string()).unwrap();
            cfg.max_position_embeddings = Some(model_cfg.max_position_embeddings);
            let rows: Vec<u32> = case["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_u64().unwrap() as u32)
                .collect();
            let width = case["source_width"].as_u64().unwrap() as usize;
            let index = Tensor::new(rows.as_slice(), &Device::Cpu).unwrap();
            let pick = |t: Tensor| {
                t.index_select(&index, 0)
                    .unwrap()
                    .narrow(1, 0, width)
                    .unwrap()
            };
            let mask = pick(ids(&inputs, "attention_mask"));
            let input_ids = pick(ids(&inputs, "input_ids"));
            let state = model.start(&input_ids, &mask).unwrap();
            let (got, shape) = generate_padded(&model, state, rows.len(), &cfg)
                .unwrap_or_else(|e| panic!("{}: {name}: {e}", dir.display()));
            let want = expected
                .load(&format!("sequences.{name}"), &Device::Cpu)
                .unwrap();
            let want_shape = want.dims2().unwrap();
            let want: Vec<u32> = want
                .flatten_all()
                .unwrap()
                .to_dtype(DType::U32)
                .unwrap()
                .to_vec1()
                .unwrap();
            cases_run += 1;
            if shape != want_shape || got != want {
                mismatches.push(format!(
                    "{} {name}: got {shape:?} {got:?}, transformers {want_shape:?} {want:?}",
                    dir.file_name().unwrap().to_string_lossy()
                ));
            }
        }
    }
    println!(
        "generate(): {cases_run} cases, {} mismatches",
        mismatches.len()
    );
    assert!(cases_run >= 50, "only {cases_run} cases found");
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

//! Bad MarianMT directories and inputs: clear errors that name the problem, never a panic.

use candle::{Device, Tensor};
use candle_attention::marian::MarianMTModel;
use std::path::{Path, PathBuf};

fn base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/marian/base")
}

/// A copy of the base fixture with `config.json` edited by `edit` and the files in `drop` left
/// out.
fn variant(edit: impl Fn(&mut serde_json::Value), drop: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(base()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !drop.contains(&name.as_str()) {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let cfg_path = dir.path().join("config.json");
    if cfg_path.exists() {
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        edit(&mut cfg);
        std::fs::write(&cfg_path, serde_json::to_string(&cfg).unwrap()).unwrap();
    }
    dir
}

fn load_err(dir: &Path) -> String {
    MarianMTModel::from_dir(dir, &Device::Cpu)
        .expect_err("loading must fail")
        .to_string()
}

#[test]
fn directories_that_are_not_marian_models() {
    let none = variant(|_| {}, &["config.json"]);
    let err = load_err(none.path());
    assert!(
        err.contains("config.json is missing") && err.contains("model.safetensors"),
        "{err}"
    );
    let bart = variant(|c| c["model_type"] = "bart".into(), &[]);
    assert!(load_err(bart.path()).contains("not a MarianMT model"));
    let no_weights = variant(|_| {}, &["model.safetensors"]);
    let err = load_err(no_weights.path());
    assert!(
        err.contains("has no weights") && err.contains("config.json"),
        "{err}"
    );
    assert!(load_err(Path::new("/nonexistent/opus-mt")).contains("not a directory"));
}

#[test]
fn vocabulary_sizes_that_disagree_with_the_weights() {
    let dir = variant(|c| c["vocab_size"] = 120.into(), &[]);
    let err = load_err(dir.path());
    assert!(
        err.contains("vocab_size = 120") && err.contains("[96, 64]"),
        "{err}"
    );
    let dir = variant(|c| c["d_model"] = 32.into(), &[]);
    let err = load_err(dir.path());
    assert!(err.contains("d_model = 32"), "{err}");
}

#[test]
fn missing_tensors_are_named_with_what_exists() {
    // A state dict without the second decoder layer's fc1: rewrite the file without it.
    let dir = variant(|_| {}, &[]);
    let file = candle_attention::TensorFile::open(dir.path().join("model.safetensors")).unwrap();
    let kept: Vec<(String, Tensor)> = file
        .names()
        .into_iter()
        .filter(|n| *n != "model.decoder.layers.1.fc1.weight")
        .map(|n| (n.to_string(), file.load(n, &Device::Cpu).unwrap()))
        .collect();
    drop(file);
    let refs: Vec<(&str, &Tensor)> = kept.iter().map(|(n, t)| (n.as_str(), t)).collect();
    candle_attention::save_tensors(&refs, dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("model.decoder.layers.1.fc1.weight") && err.contains("fc2"),
        "{err}"
    );
}

#[test]
fn inputs_the_model_cannot_take() {
    let model = MarianMTModel::from_dir(base(), &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    let long: Vec<u32> = vec![5; 65];
    let ids = Tensor::from_vec(long, (1, 65), &dev).unwrap();
    let mask = Tensor::ones((1, 65), candle::DType::U32, &dev).unwrap();
    let err = model.encode(&ids, &mask).unwrap_err().to_string();
    assert!(
        err.contains("65") && err.contains("max_position_embeddings = 64"),
        "{err}"
    );
    let ids = Tensor::new(&[[3u32, 96, 0]], &dev).unwrap();
    let mask = Tensor::ones((1, 3), candle::DType::U32, &dev).unwrap();
    let err = model.encode(&ids, &mask).unwrap_err().to_string();
    assert!(err.contains("id 96") && err.contains("96 tokens"), "{err}");
    let short_mask = Tensor::ones((1, 2), candle::DType::U32, &dev).unwrap();
    let ids = Tensor::new(&[[3u32, 4, 0]], &dev).unwrap();
    let err = model.encode(&ids, &short_mask).unwrap_err().to_string();
    assert!(err.contains("attention_mask [1, 2]"), "{err}");
}

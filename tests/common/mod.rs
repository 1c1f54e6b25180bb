//! Helpers shared by the integration tests: the fixture manifest and tensor comparison.
#![allow(dead_code)]

pub mod explain;
pub mod fuzz;

use candle::{DType, Tensor};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A CPU `f32` tensor of `shape` with values uniform in [-1, 1) from a seeded LCG:
/// deterministic, which candle's own RNG is not per call (property tests drive the seed).
pub fn uniform(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let values: Vec<f32> = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(values, shape, &candle::Device::Cpu).unwrap()
}

/// The repository root: this package's directory, or its parent for the `attn-cli` member,
/// whose tests include this module too.
pub fn repo_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    if dir.join("tests/fixtures").is_dir() {
        dir.to_path_buf()
    } else {
        dir.parent()
            .expect("attn-cli lives in the repository")
            .to_path_buf()
    }
}

/// `tests/fixtures/mha`.
pub fn mha_fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/mha")
}

/// One case of `tests/fixtures/mha/manifest.json` (written by `tests/fixtures/make_fixtures.py`).
#[derive(Debug, Deserialize, Clone)]
pub struct MhaCase {
    pub name: String,
    pub layout: String,
    pub prefix: String,
    pub embed_dim: usize,
    pub num_heads: usize,
    pub kdim: usize,
    pub vdim: usize,
    pub bias: bool,
    pub add_bias_kv: bool,
    pub add_zero_attn: bool,
    pub batch_first: bool,
    pub unbatched: bool,
    pub causal: bool,
    pub need_weights: bool,
    pub average_attn_weights: bool,
    pub dtype: String,
    pub atol: f64,
    pub rtol: f64,
    pub description: String,
}

impl MhaCase {
    pub fn file(&self, kind: &str) -> PathBuf {
        mha_fixtures().join(format!("{}.{kind}.safetensors", self.name))
    }

    pub fn dtype(&self) -> DType {
        match self.dtype.as_str() {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            other => panic!("unknown dtype {other} in manifest"),
        }
    }
}

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<MhaCase>,
}

pub fn mha_cases() -> Vec<MhaCase> {
    let text =
        std::fs::read_to_string(mha_fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str::<Manifest>(&text)
        .expect("valid manifest")
        .cases
}

/// Largest `|a - b|`, after checking shapes and the `atol + rtol * |b|` bound element-wise.
/// Returns `Err` with the worst element when the bound is broken.
pub fn compare(actual: &Tensor, expected: &Tensor, atol: f64, rtol: f64) -> Result<f64, String> {
    if actual.dims() != expected.dims() {
        return Err(format!(
            "shape {:?} != expected {:?}",
            actual.dims(),
            expected.dims()
        ));
    }
    let a: Vec<f64> = actual
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f64> = expected
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let mut max_err = 0f64;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if !x.is_finite() || !y.is_finite() {
            return Err(format!("non-finite value at {i}: got {x}, expected {y}"));
        }
        let err = (x - y).abs();
        if err > atol + rtol * y.abs() {
            return Err(format!("element {i}: got {x}, expected {y} (|diff| {err:.3e} > {atol:e} + {rtol:e}·|expected|)"));
        }
        max_err = max_err.max(err);
    }
    Ok(max_err)
}

/// `tests/fixtures/transformer`.
pub fn transformer_fixtures() -> PathBuf {
    repo_root().join("tests/fixtures/transformer")
}

/// One case of `tests/fixtures/transformer/manifest.json` (written by
/// `tests/fixtures/make_transformer_fixtures.py`).
#[derive(Debug, Deserialize, Clone)]
pub struct TransformerCase {
    pub name: String,
    pub prefix: String,
    pub d_model: usize,
    pub nhead: usize,
    pub num_encoder_layers: usize,
    pub num_decoder_layers: usize,
    pub dim_feedforward: usize,
    pub activation: String,
    pub norm_first: bool,
    pub batch_first: bool,
    pub layer_norm_eps: f64,
    pub bias: bool,
    pub atol: f64,
    pub rtol: f64,
    pub compare_mask_name: Option<String>,
    pub description: String,
}

impl TransformerCase {
    pub fn file(&self, kind: &str) -> PathBuf {
        transformer_fixtures().join(format!("{}.{kind}.safetensors", self.name))
    }
}

#[derive(Deserialize)]
struct TransformerManifest {
    cases: Vec<TransformerCase>,
}

pub fn transformer_cases() -> Vec<TransformerCase> {
    let text = std::fs::read_to_string(transformer_fixtures().join("manifest.json"))
        .expect("manifest.json");
    serde_json::from_str::<TransformerManifest>(&text)
        .expect("valid manifest")
        .cases
}

/// Compares `output` and `attn_weights` in `actual` with the expected file; returns the two
/// max abs errors (weights `None` when the case has none).
pub fn check_mha_outputs(
    case: &MhaCase,
    output: &candle::Tensor,
    weights: Option<&candle::Tensor>,
) -> Result<(f64, Option<f64>), String> {
    let expected = candle_attention::TensorFile::open(case.file("expected")).unwrap();
    let exp_out = expected.load("output", &candle::Device::Cpu).unwrap();
    if output.dtype() != exp_out.dtype() {
        return Err(format!(
            "output dtype {:?}, torch's {:?}",
            output.dtype(),
            exp_out.dtype()
        ));
    }
    let out_err =
        compare(output, &exp_out, case.atol, case.rtol).map_err(|e| format!("output: {e}"))?;
    let w_err = match (weights, expected.contains("attn_weights")) {
        (Some(w), true) => {
            let exp_w = expected.load("attn_weights", &candle::Device::Cpu).unwrap();
            Some(
                compare(w, &exp_w, case.atol, case.rtol)
                    .map_err(|e| format!("attn_weights: {e}"))?,
            )
        }
        (None, false) => None,
        (w, e) => return Err(format!("weights returned: {}, expected: {e}", w.is_some())),
    };
    Ok((out_err, w_err))
}

/// torch's output for a Transformer case (every position is compared).
pub fn transformer_expected_output(case: &TransformerCase) -> candle::Tensor {
    assert!(
        case.compare_mask_name.is_none(),
        "{}: every position is compared",
        case.name
    );
    candle_attention::TensorFile::open(case.file("expected"))
        .unwrap()
        .load("output", &candle::Device::Cpu)
        .unwrap()
}

/// The device the device-aware tests run on: `ATTN_TEST_DEVICE` (`cpu`, `cuda`, `cuda:N`,
/// `metal`, `metal:N`; see `candle_attention::device_from_name`), the CPU when unset. A device
/// this build lacks fails the test with the feature to enable, rather than silently testing the
/// CPU: `ATTN_TEST_DEVICE=cuda cargo test --features cuda`.
pub fn test_device() -> candle::Device {
    match std::env::var("ATTN_TEST_DEVICE") {
        Ok(name) if !name.trim().is_empty() => candle_attention::device_from_name(&name)
            .unwrap_or_else(|e| panic!("ATTN_TEST_DEVICE={name:?}: {e}")),
        _ => candle::Device::Cpu,
    }
}

/// Largest absolute error the device-aware tests accept between an attention output computed
/// in `dtype` on `device` and the `f32` CPU naive reference, for inputs of order 1 (README,
/// "Tolerances"):
///
/// | dtype | CPU | CUDA / Metal |
/// |---|---|---|
/// | f32 | 1e-5 | 1e-4 (other summation orders; Metal's fast `exp`) |
/// | f16 | 1e-2 | 1e-2 |
/// | bf16 | 6e-2 | 6e-2 |
///
/// Half precision: inputs rounded to the dtype are compared with the `f32` reference on the
/// same rounded values; what remains is the rounding of the scores and probabilities fed to
/// the matmuls and of the output (f16: 2⁻¹¹ relative, bf16: 2⁻⁸, a few ulps accumulated).
pub fn tolerance(dtype: DType, device: &candle::Device) -> f32 {
    match (dtype, device.is_cpu()) {
        (DType::F32, true) => 1e-5,
        (DType::F32, false) => 1e-4,
        (DType::F64, _) => 1e-10,
        (DType::F16, _) => 1e-2,
        (DType::BF16, _) => 6e-2,
        (other, _) => panic!("no tolerance for {other:?}"),
    }
}

/// Largest `|a - b|` of two tensors of one shape (any float dtype, any device), in `f32`; NaN
/// when any difference is NaN or infinite-minus-infinite (candle's own `max` skips NaN, which
/// would let `max_abs_diff(..) <= tol` pass on NaN outputs).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "compared tensors differ in shape");
    let flat = |t: &Tensor| -> Vec<f32> {
        t.to_device(&candle::Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    flat(a)
        .iter()
        .zip(&flat(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, |m, d| {
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}

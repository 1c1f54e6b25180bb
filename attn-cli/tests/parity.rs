//! `attn run mha` and `attn run transformer` against torch on the committed fixtures (the
//! library's own parity tests are `tests/parity_mha.rs` and `tests/parity_transformer.rs`).

#[path = "../../tests/common/mod.rs"]
mod common;

use candle::Device;
use candle_attention::TensorFile;
use common::{
    check_mha_outputs, compare, mha_cases, transformer_cases, transformer_expected_output, MhaCase,
    TransformerCase,
};
use std::path::Path;
use std::process::Command;

/// Runs `attn run mha` on `case` with `--prefix` written as `case.prefix + prefix_suffix`;
/// an error with the reason when it fails or is off torch.
fn run_mha_case(case: &MhaCase, dir: &Path, prefix_suffix: &str) -> Result<(), String> {
    let out_path = dir.join(format!("{}.out.safetensors", case.name));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn"));
    cmd.args([
        "run",
        "mha",
        "--num-heads",
        &case.num_heads.to_string(),
        "--dtype",
        &case.dtype,
    ])
    .arg("--weights")
    .arg(case.file("weights"))
    .arg("--inputs")
    .arg(case.file("inputs"))
    .arg("--output")
    .arg(&out_path);
    if !case.prefix.is_empty() {
        cmd.args(["--prefix", &format!("{}{prefix_suffix}", case.prefix)]);
    }
    for (flag, on) in [
        ("--batch-first", case.batch_first),
        ("--add-zero-attn", case.add_zero_attn),
        ("--causal", case.causal),
        ("--no-weights", !case.need_weights),
        (
            "--per-head-weights",
            case.need_weights && !case.average_attn_weights,
        ),
    ] {
        if on {
            cmd.arg(flag);
        }
    }
    let result = cmd.output().unwrap();
    if !result.status.success() {
        return Err(format!(
            "exit {:?}: {}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    let written = TensorFile::open(&out_path).unwrap();
    let output = written.load("output", &Device::Cpu).unwrap();
    let weights = written
        .contains("attn_weights")
        .then(|| written.load("attn_weights", &Device::Cpu).unwrap());
    check_mha_outputs(case, &output, weights.as_ref()).map(|_| ())
}

/// Runs `attn run transformer` on `case`, `--prefix` as in [`run_mha_case`].
fn run_transformer_case(
    case: &TransformerCase,
    dir: &Path,
    prefix_suffix: &str,
) -> Result<(), String> {
    let out_path = dir.join(format!("{}.out.safetensors", case.name));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_attn"));
    cmd.args([
        "run",
        "transformer",
        "--num-heads",
        &case.nhead.to_string(),
        "--activation",
        &case.activation,
    ])
    .args(["--layer-norm-eps", &case.layer_norm_eps.to_string()])
    .arg("--weights")
    .arg(case.file("weights"))
    .arg("--inputs")
    .arg(case.file("inputs"))
    .arg("--output")
    .arg(&out_path);
    if !case.prefix.is_empty() {
        cmd.args(["--prefix", &format!("{}{prefix_suffix}", case.prefix)]);
    }
    if case.norm_first {
        cmd.arg("--norm-first");
    }
    if case.batch_first {
        cmd.arg("--batch-first");
    }
    let result = cmd.output().unwrap();
    if !result.status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).to_string());
    }
    let output = TensorFile::open(&out_path)
        .unwrap()
        .load("output", &Device::Cpu)
        .unwrap();
    compare(
        &output,
        &transformer_expected_output(case),
        case.atol,
        case.rtol,
    )
    .map(|_| ())
}

#[test]
fn cli_run_mha_matches_torch_on_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let failures: Vec<String> = mha_cases()
        .iter()
        .filter_map(|case| {
            let r = run_mha_case(case, dir.path(), "");
            r.err().map(|e| format!("{}: {e}", case.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "attn run mha off torch:\n{}",
        failures.join("\n")
    );
}

#[test]
fn cli_run_transformer_matches_torch_on_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let failures: Vec<String> = transformer_cases()
        .iter()
        .filter_map(|case| {
            let r = run_transformer_case(case, dir.path(), "");
            r.err().map(|e| format!("{}: {e}", case.name))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "attn run transformer off torch:\n{}",
        failures.join("\n")
    );
}

/// `--prefix model.encoder.layers.0.self_attn.` (torch's `state_dict` form, trailing dot) works
/// exactly like the same prefix without the dot, for both commands.
#[test]
fn prefix_with_torchs_trailing_dot() {
    let dir = tempfile::tempdir().unwrap();
    let mha: Vec<MhaCase> = mha_cases()
        .into_iter()
        .filter(|c| !c.prefix.is_empty())
        .collect();
    let transformer: Vec<TransformerCase> = transformer_cases()
        .into_iter()
        .filter(|c| !c.prefix.is_empty())
        .collect();
    assert!(
        !mha.is_empty() && !transformer.is_empty(),
        "prefixed fixtures exist"
    );
    for case in &mha {
        run_mha_case(case, dir.path(), ".").unwrap_or_else(|e| panic!("{}: {e}", case.name));
    }
    for case in &transformer {
        run_transformer_case(case, dir.path(), ".")
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    }
}

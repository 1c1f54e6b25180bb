//! Parity with `torch.nn.Transformer` on the committed fixtures
//! (`tests/fixtures/make_transformer_fixtures.py`), through the library and through
//! `attn run transformer`. The reference was computed on torch's documented Python path (the
//! nested-tensor "fast path" was disabled and fenced off), so padded positions are compared
//! too. `--nocapture` prints the table of max abs errors.

mod common;

use candle::{DType, Device};
use candle_attention::torch_io::{run_transformer, TorchTransformerInputs};
use candle_attention::transformer::{Transformer, TransformerConfig};
use candle_attention::TensorFile;
use common::{compare, transformer_cases, TransformerCase};
use std::process::Command;

fn config(case: &TransformerCase) -> TransformerConfig {
    TransformerConfig {
        num_encoder_layers: case.num_encoder_layers,
        num_decoder_layers: case.num_decoder_layers,
        dim_feedforward: case.dim_feedforward,
        activation: case.activation.parse().unwrap(),
        layer_norm_eps: case.layer_norm_eps,
        norm_first: case.norm_first,
        bias: case.bias,
        ..TransformerConfig::new(case.d_model, case.nhead)
    }
}

fn expected_output(case: &TransformerCase) -> candle::Tensor {
    assert!(
        case.compare_mask_name.is_none(),
        "{}: every position is compared",
        case.name
    );
    TensorFile::open(case.file("expected"))
        .unwrap()
        .load("output", &Device::Cpu)
        .unwrap()
}

#[test]
fn library_matches_torch_on_every_fixture() {
    let dev = Device::Cpu;
    let mut failures = Vec::new();
    println!("{:<32} {:>12}  description", "case", "output err");
    for case in transformer_cases() {
        let weights = TensorFile::open(case.file("weights")).unwrap();
        let from_weights =
            TransformerConfig::from_weights(&weights, &case.prefix, case.nhead).unwrap();
        let cfg = config(&case);
        assert_eq!(
            (
                from_weights.num_encoder_layers,
                from_weights.num_decoder_layers,
                from_weights.d_model,
                from_weights.dim_feedforward,
                from_weights.bias
            ),
            (
                cfg.num_encoder_layers,
                cfg.num_decoder_layers,
                cfg.d_model,
                cfg.dim_feedforward,
                cfg.bias
            ),
            "{}: sizes read from the weights",
            case.name
        );
        let vb = weights.var_builder(DType::F32, &dev);
        let vb = if case.prefix.is_empty() {
            vb
        } else {
            vb.pp(&case.prefix)
        };
        let model = Transformer::load(cfg, vb).unwrap();
        let inputs = TorchTransformerInputs::from_file(
            &TensorFile::open(case.file("inputs")).unwrap(),
            DType::F32,
            &dev,
        )
        .unwrap();
        let output = run_transformer(&model, &inputs, case.batch_first, None).unwrap();
        match compare(&output, &expected_output(&case), case.atol, case.rtol) {
            Ok(err) => println!("{:<32} {:>12.2e}  {}", case.name, err, case.description),
            Err(e) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    assert!(
        failures.is_empty(),
        "cases off torch:\n{}",
        failures.join("\n")
    );
}

#[test]
fn cli_run_transformer_matches_torch_on_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for case in transformer_cases() {
        let out_path = dir.path().join(format!("{}.out.safetensors", case.name));
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
            cmd.args(["--prefix", &case.prefix]);
        }
        if case.norm_first {
            cmd.arg("--norm-first");
        }
        if case.batch_first {
            cmd.arg("--batch-first");
        }
        let result = cmd.output().unwrap();
        if !result.status.success() {
            failures.push(format!(
                "{}: {}",
                case.name,
                String::from_utf8_lossy(&result.stderr)
            ));
            continue;
        }
        let output = TensorFile::open(&out_path)
            .unwrap()
            .load("output", &Device::Cpu)
            .unwrap();
        if let Err(e) = compare(&output, &expected_output(&case), case.atol, case.rtol) {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "attn run transformer off torch:\n{}",
        failures.join("\n")
    );
}

#[test]
fn fixtures_cover_the_issue() {
    let cases = transformer_cases();
    let any = |f: fn(&TransformerCase) -> bool| cases.iter().any(f);
    assert!(
        any(|c| !c.norm_first && c.activation == "relu")
            && any(|c| c.norm_first && c.activation == "gelu")
    );
    assert!(any(|c| c.batch_first) && any(|c| !c.batch_first));
    assert!(any(|c| c.num_encoder_layers != c.num_decoder_layers) && any(|c| !c.prefix.is_empty()));
}

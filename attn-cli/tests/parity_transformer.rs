//! Parity with `torch.nn.Transformer` on the committed fixtures
//! (`tests/fixtures/make_transformer_fixtures.py`), through the library (`attn run
//! transformer` in `attn-cli/tests/parity.rs`). The reference was computed on torch's documented Python path (the
//! nested-tensor "fast path" was disabled and fenced off), so padded positions are compared
//! too. `--nocapture` prints the table of max abs errors.

#[path = "../../tests/common/mod.rs"]
mod common;

use attn_cli::torch_io::{run_transformer, TorchTransformerInputs};
use candle::{DType, Device};
use candle_attention::transformer::{Transformer, TransformerConfig};
use candle_attention::TensorFile;
use common::{compare, transformer_cases, transformer_expected_output, TransformerCase};

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
        match compare(
            &output,
            &transformer_expected_output(&case),
            case.atol,
            case.rtol,
        ) {
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

//! Parity with `torch.nn.MultiheadAttention` on the committed fixtures
//! (`tests/fixtures/make_fixtures.py` regenerates them), through the library (the `attn run mha`
//! command's parity test is `attn-cli/tests/parity.rs`). Run with `--nocapture` to print the table of max abs errors.

#[path = "../../tests/common/mod.rs"]
mod common;

use attn_cli::torch_io::{run_mha, TorchMhaInputs, TorchMhaOptions};
use candle::Device;
use candle_attention::{
    MhaLayout, MhaWeightsInfo, MultiHeadAttention, MultiHeadAttentionConfig, TensorFile,
};
use common::{check_mha_outputs, compare, mha_cases, MhaCase};

fn options(case: &MhaCase) -> TorchMhaOptions {
    TorchMhaOptions {
        batch_first: case.batch_first,
        causal: case.causal,
        need_weights: case.need_weights,
        average_weights: case.average_attn_weights,
        max_attention_bytes: None,
    }
}

/// Builds the configuration from the manifest (not from the weights), so that loading checks
/// the file against what the case says it is.
fn config(case: &MhaCase) -> MultiHeadAttentionConfig {
    MultiHeadAttentionConfig::new(case.embed_dim, case.num_heads)
        .with_kdim(case.kdim)
        .with_vdim(case.vdim)
        .with_bias(case.bias)
        .with_add_bias_kv(case.add_bias_kv)
        .with_add_zero_attn(case.add_zero_attn)
}

fn expected_layout(case: &MhaCase) -> MhaLayout {
    match case.layout.as_str() {
        "torch_fused" => MhaLayout::TorchFused,
        "torch_separate" => MhaLayout::TorchSeparate,
        "hf" => MhaLayout::HuggingFace,
        other => panic!("unknown layout {other}"),
    }
}

#[test]
fn library_matches_torch_on_every_fixture() {
    let device = Device::Cpu;
    let mut failures = Vec::new();
    println!(
        "{:<28} {:<6} {:>12} {:>12}  description",
        "case", "dtype", "output err", "weights err"
    );
    for case in mha_cases() {
        let weights = TensorFile::open(case.file("weights")).unwrap();
        let info = MhaWeightsInfo::from_file(&weights, &case.prefix).unwrap();
        assert_eq!(
            info.layout,
            expected_layout(&case),
            "{}: detected layout",
            case.name
        );
        assert_eq!(
            MultiHeadAttentionConfig::from_weights(&info, case.num_heads)
                .with_add_zero_attn(case.add_zero_attn),
            config(&case),
            "{}: configuration read from the weights",
            case.name
        );
        let vb = weights.var_builder(case.dtype(), &device);
        let vb = if case.prefix.is_empty() {
            vb
        } else {
            vb.pp(&case.prefix)
        };
        let mha = MultiHeadAttention::load(config(&case), vb).unwrap();
        let inputs = TorchMhaInputs::from_file(
            &TensorFile::open(case.file("inputs")).unwrap(),
            case.dtype(),
            &device,
        )
        .unwrap();
        let out = run_mha(&mha, &inputs, options(&case)).unwrap();
        match check_mha_outputs(&case, &out.output, out.attn_weights.as_ref()) {
            Ok((o, w)) => println!(
                "{:<28} {:<6} {:>12.2e} {:>12}  {}",
                case.name,
                case.dtype,
                o,
                w.map(|w| format!("{w:.2e}")).unwrap_or("-".into()),
                case.description
            ),
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
fn fixtures_cover_every_option() {
    let cases = mha_cases();
    let any = |f: fn(&MhaCase) -> bool| cases.iter().any(f);
    assert!(
        any(|c| c.layout == "torch_fused")
            && any(|c| c.layout == "torch_separate")
            && any(|c| c.layout == "hf")
    );
    assert!(
        any(|c| c.batch_first) && any(|c| !c.batch_first && !c.unbatched) && any(|c| c.unbatched)
    );
    assert!(any(|c| c.kdim != c.embed_dim && c.vdim != c.embed_dim));
    assert!(
        any(|c| !c.bias) && any(|c| c.add_bias_kv) && any(|c| c.add_zero_attn) && any(|c| c.causal)
    );
    assert!(any(|c| !c.need_weights) && any(|c| c.need_weights && !c.average_attn_weights));
    assert!(any(|c| c.embed_dim == 512 && c.num_heads == 8));
    assert!(any(|c| c.dtype == "f16") && any(|c| c.dtype == "bf16"));
    assert!(any(|c| !c.prefix.is_empty() && c.layout == "hf"));
}

/// The demo checkpoint in `weights/` (what the README's first command runs) matches torch.
#[test]
fn shipped_demo_checkpoint_matches_torch() {
    use candle_attention::{AttentionArgs, Mask};
    let dev = Device::Cpu;
    let root = common::repo_root().join("weights");
    let weights = TensorFile::open(root.join("mha_demo.safetensors")).unwrap();
    let io = TensorFile::open(root.join("mha_demo_io.safetensors")).unwrap();
    let mha = MultiHeadAttention::load(
        MultiHeadAttentionConfig::new(64, 8),
        weights
            .var_builder(candle::DType::F32, &dev)
            .pp("self_attn"),
    )
    .unwrap();
    let query = io.load("query", &dev).unwrap();
    let padding = io.load("key_padding_mask", &dev).unwrap();
    let args = AttentionArgs {
        mask: Mask::causal(),
        key_padding: Some(&padding),
        need_weights: true,
        ..Default::default()
    };
    let out = mha.attend(&query, &query, &query, &args).unwrap();
    compare(
        &out.output,
        &io.load("expected_output", &dev).unwrap(),
        1e-5,
        1e-5,
    )
    .unwrap();
    compare(
        &out.weights.unwrap(),
        &io.load("expected_weights", &dev).unwrap(),
        1e-5,
        1e-5,
    )
    .unwrap();
}

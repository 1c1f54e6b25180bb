//! Replays the fuzz inputs through the fuzz targets' own checks (`fuzz/checks/*.rs`, the
//! same code `cargo fuzz` runs): every input a fuzzer ever crashed on
//! (`fuzz/regressions/<target>/`, one file per finding, named after it) and every committed
//! seed (`fuzz/seeds/<target>/`). A check panics on a finding, so a regression fails here.
//! These are the targets of the `attn` command's own parsers (`attn run` inputs, the number
//! translator's tokenizer); the library's replay in `tests/fuzz_regressions.rs`.

#[path = "../../fuzz/checks/run_inputs.rs"]
mod run_inputs;
#[path = "../../fuzz/checks/tokenizer.rs"]
mod tokenizer;

#[path = "../../tests/common/mod.rs"]
mod common;
use common::fuzz::replay;

#[test]
fn run_inputs_inputs() {
    assert!(replay("run_inputs", run_inputs::check) >= 20);
}

#[test]
fn tokenizer_inputs() {
    assert!(replay("tokenizer", tokenizer::check) >= 20);
}

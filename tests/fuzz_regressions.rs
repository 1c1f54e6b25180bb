//! Replays the fuzz inputs through the fuzz targets' own checks (`fuzz/checks/*.rs`, the
//! same code `cargo fuzz` runs): every input a fuzzer ever crashed on
//! (`fuzz/regressions/<target>/`, one file per finding, named after it) and every committed
//! seed (`fuzz/seeds/<target>/`). A check panics on a finding, so a regression fails here.
//! (The targets of the `attn` command's own parsers replay in
//! `attn-cli/tests/fuzz_regressions.rs`.)

#[path = "../fuzz/checks/hub_config.rs"]
mod hub_config;
#[path = "../fuzz/checks/load_weights.rs"]
mod load_weights;
#[path = "../fuzz/checks/marian_tokenizer.rs"]
mod marian_tokenizer;
#[path = "../fuzz/checks/masks.rs"]
mod masks;
#[path = "../fuzz/checks/multilingual_hub.rs"]
mod multilingual_hub;
#[path = "../fuzz/checks/pth_reader.rs"]
mod pth_reader;
#[path = "../fuzz/checks/spm_model.rs"]
mod spm_model;

mod common;
use common::fuzz::replay;

#[test]
fn load_weights_inputs() {
    assert!(replay("load_weights", load_weights::check) >= 10);
}

#[test]
fn masks_inputs() {
    assert!(replay("masks", masks::check) >= 6);
}

#[test]
fn spm_model_inputs() {
    assert!(replay("spm_model", spm_model::check) >= 6);
}

#[test]
fn hub_config_inputs() {
    assert!(replay("hub_config", hub_config::check) >= 8);
}

#[test]
fn multilingual_hub_inputs() {
    assert!(replay("multilingual_hub", multilingual_hub::check) >= 12);
}

#[test]
fn marian_tokenizer_inputs() {
    assert!(replay("marian_tokenizer", marian_tokenizer::check) >= 20);
}

#[test]
fn pth_reader_inputs() {
    assert!(replay("pth_reader", pth_reader::check) >= 20);
}

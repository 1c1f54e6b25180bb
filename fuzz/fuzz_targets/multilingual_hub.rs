//! libFuzzer entry point; the check itself is in `fuzz/checks/multilingual_hub.rs`, shared with
//! the regression tests (`tests/fuzz_regressions.rs`).
#![no_main]

#[path = "../checks/multilingual_hub.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));

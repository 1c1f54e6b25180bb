//! libFuzzer entry point; the check itself is in `fuzz/checks/marian_tokenizer.rs`, shared with the
//! regression tests (`tests/fuzz_regressions.rs`).
#![no_main]

#[path = "../checks/marian_tokenizer.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));

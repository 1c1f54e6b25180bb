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

use std::path::Path;

/// Runs `check` on every file under `fuzz/{seeds,regressions}/<target>`; returns how many.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in ["seeds", "regressions"] {
        let dir = root.join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let result = std::panic::catch_unwind(|| check(&data));
            assert!(result.is_ok(), "{target}: {} fails again", file.display());
            n += 1;
        }
    }
    n
}

#[test]
fn run_inputs_inputs() {
    assert!(replay("run_inputs", run_inputs::check) >= 20);
}

#[test]
fn tokenizer_inputs() {
    assert!(replay("tokenizer", tokenizer::check) >= 20);
}

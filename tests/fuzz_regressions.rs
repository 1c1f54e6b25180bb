//! Replays the fuzz inputs through the fuzz targets' own checks (`fuzz/checks/*.rs`, the
//! same code `cargo fuzz` runs): every input a fuzzer ever crashed on
//! (`fuzz/regressions/<target>/`, one file per finding, named after it) and every committed
//! seed (`fuzz/seeds/<target>/`). A check panics on a finding, so a regression fails here.

#[path = "../fuzz/checks/load_weights.rs"]
mod load_weights;
#[path = "../fuzz/checks/masks.rs"]
mod masks;
#[path = "../fuzz/checks/pth_reader.rs"]
mod pth_reader;
#[path = "../fuzz/checks/run_inputs.rs"]
mod run_inputs;
#[path = "../fuzz/checks/tokenizer.rs"]
mod tokenizer;

use std::path::Path;

/// Runs `check` on every file under `fuzz/{seeds,regressions}/<target>`; returns how many.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
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
fn load_weights_inputs() {
    assert!(replay("load_weights", load_weights::check) >= 10);
}

#[test]
fn run_inputs_inputs() {
    assert!(replay("run_inputs", run_inputs::check) >= 20);
}

#[test]
fn masks_inputs() {
    assert!(replay("masks", masks::check) >= 6);
}

#[test]
fn tokenizer_inputs() {
    assert!(replay("tokenizer", tokenizer::check) >= 20);
}

#[test]
fn pth_reader_inputs() {
    assert!(replay("pth_reader", pth_reader::check) >= 20);
}

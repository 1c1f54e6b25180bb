//! Replaying fuzz inputs through the fuzz targets' checks (the library's and the command's
//! `fuzz_regressions` tests).

/// Runs `check` on every file under `fuzz/{seeds,regressions}/<target>`; returns how many.
pub fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = super::repo_root().join("fuzz");
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

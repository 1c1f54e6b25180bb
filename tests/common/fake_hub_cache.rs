//! A Hugging Face hub cache written as `huggingface_hub` writes it, for the `hub` tests of the
//! library (tests/hub_cache.rs) and of the CLI (attn-cli/tests/hub_cli.rs):
//!
//! ```text
//! models--ORG--NAME/blobs/<hash>
//! models--ORG--NAME/snapshots/<commit>/<file> -> ../../blobs/<hash>   (relative symlinks)
//! models--ORG--NAME/refs/<revision>            (the commit)
//! ```
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The files of a complete MarianMT model directory, from the fixture `marian_e2e` (made by
/// tests/fixtures/make_marian_e2e_fixture.py): config, weights, tokenizer.
pub const MARIAN_FILES: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "source.spm",
    "target.spm",
    "vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// `(name, contents)` of `names` in the fixture directory `dir`.
pub fn read_files(dir: &Path, names: &[&str]) -> Vec<(String, Vec<u8>)> {
    names
        .iter()
        .map(|n| {
            let bytes = std::fs::read(dir.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
            (n.to_string(), bytes)
        })
        .collect()
}

/// A 64-hex-digit name for `bytes` (as the hub names blobs by their sha256; any stable hex
/// name serves a cache).
pub fn blob_name(bytes: &[u8]) -> String {
    (0..4u64)
        .map(|seed| {
            let mut h = 0xcbf29ce484222325u64 ^ seed.wrapping_mul(0x9e3779b97f4a7c15);
            for &b in bytes {
                h = (h ^ b as u64).wrapping_mul(0x100000001b3);
            }
            format!("{h:016x}")
        })
        .collect()
}

/// `models--ORG--NAME` of `repo` under `cache`.
pub fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

/// Writes `files` as the snapshot `commit` of `repo`: contents in `blobs/`, the snapshot's
/// entries relative symlinks to them. The snapshot directory.
pub fn write_snapshot(
    cache: &Path,
    repo: &str,
    commit: &str,
    files: &[(String, Vec<u8>)],
) -> PathBuf {
    let dir = repo_dir(cache, repo);
    let blobs = dir.join("blobs");
    let snapshot = dir.join("snapshots").join(commit);
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    for (name, bytes) in files {
        let blob = blob_name(bytes);
        std::fs::write(blobs.join(&blob), bytes).unwrap();
        let link = snapshot.join(name);
        let _ = std::fs::remove_file(&link);
        symlink(&Path::new("../../blobs").join(&blob), &link);
    }
    snapshot
}

/// Points `refs/<revision>` of `repo` at `commit`.
pub fn write_ref(cache: &Path, repo: &str, revision: &str, commit: &str) {
    let path = repo_dir(cache, repo).join("refs").join(revision);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, commit).unwrap();
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

#[cfg(windows)]
fn symlink(target: &Path, link: &Path) {
    // Windows may refuse symlinks without developer mode; huggingface_hub then copies.
    if std::os::windows::fs::symlink_file(target, link).is_err() {
        std::fs::copy(link.parent().unwrap().join(target), link).unwrap();
    }
}

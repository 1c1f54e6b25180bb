//! `--model ORG/NAME[@REVISION]` (feature `hub`) as scripts call it: `attn translate --model
//! test-org/tiny-marian` against a hub cache this test writes (the MarianMT fixture
//! `marian_e2e` as blobs, relative symlinks and refs), with `HF_HUB_OFFLINE=1` so nothing
//! touches the network: a cached id translates as its directory does; an id that is not cached
//! fails at once (exit code 1) with an error naming it, the cache and how to download it.
#![cfg(feature = "hub")]

#[path = "../../tests/common/fake_hub_cache.rs"]
mod fake_hub_cache;
use fake_hub_cache::{read_files, write_ref, write_snapshot, MARIAN_FILES};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/marian_e2e")
}

/// `attn args` with the hub cache `cache`, offline.
fn attn(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn"))
        .args(args)
        .env("HF_HUB_CACHE", cache)
        .env("HF_HOME", cache.join("home"))
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
}

fn translate(cache: &Path, model: &str) -> Output {
    attn(
        cache,
        &[
            "translate",
            "--model",
            model,
            "--max-new-tokens",
            "5",
            "hello",
        ],
    )
}

fn cache_with_tiny_marian() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let files = read_files(&fixture(), &MARIAN_FILES);
    write_snapshot(tmp.path(), "test-org/tiny-marian", COMMIT, &files);
    write_ref(tmp.path(), "test-org/tiny-marian", "main", COMMIT);
    tmp
}

#[test]
fn a_cached_hub_id_translates_as_its_directory() {
    let cache = cache_with_tiny_marian();
    let by_id = translate(cache.path(), "test-org/tiny-marian");
    let stderr = String::from_utf8_lossy(&by_id.stderr);
    assert!(by_id.status.success(), "{stderr}");
    let by_dir = translate(cache.path(), fixture().to_str().unwrap());
    assert!(
        by_dir.status.success(),
        "{}",
        String::from_utf8_lossy(&by_dir.stderr)
    );
    let text = String::from_utf8(by_id.stdout).unwrap();
    assert!(!text.trim().is_empty());
    assert_eq!(text, String::from_utf8(by_dir.stdout).unwrap());
    // A revision through refs/.
    write_ref(cache.path(), "test-org/tiny-marian", "v1.0", COMMIT);
    let tagged = translate(cache.path(), "test-org/tiny-marian@v1.0");
    assert!(
        tagged.status.success(),
        "{}",
        String::from_utf8_lossy(&tagged.stderr)
    );
    assert_eq!(String::from_utf8(tagged.stdout).unwrap(), text);
}

#[test]
fn an_id_not_cached_fails_offline_naming_id_cache_and_download() {
    let cache = cache_with_tiny_marian();
    let out = translate(cache.path(), "test-org/absent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("test-org/absent"), "{stderr}");
    assert!(
        stderr.contains(&cache.path().display().to_string()),
        "{stderr}"
    );
    assert!(stderr.contains("HF_HUB_OFFLINE"), "{stderr}");
    assert!(
        stderr.contains("huggingface-cli download test-org/absent"),
        "{stderr}"
    );
}

/// Every command that takes a model directory takes a cached hub id the same way: `inspect`
/// describes the snapshot, `convert` converts it, `explain` explains with it, `generate` and
/// `run seq2seq` load it.
#[test]
fn every_model_command_takes_a_hub_id() {
    let cache = cache_with_tiny_marian();
    let id = "test-org/tiny-marian";
    let ok = |out: &Output| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        String::from_utf8(out.stdout.clone()).unwrap()
    };
    let dir = fixture();
    let dir = dir.to_str().unwrap();
    let described = |model: &str| {
        let mut v: serde_json::Value =
            serde_json::from_str(&ok(&attn(cache.path(), &["inspect", model, "--json"]))).unwrap();
        let v_map = v.as_object_mut().unwrap();
        v_map.remove("directory");
        v_map.remove("weights");
        v
    };
    assert_eq!(described(id), described(dir));

    let converted = cache.path().join("int8");
    ok(&attn(
        cache.path(),
        &[
            "convert",
            "--model",
            id,
            "--output",
            converted.to_str().unwrap(),
            "--quantize",
            "int8",
        ],
    ));
    assert!(converted.join("config.json").is_file());

    // The same explanation, past the line that names the model's directory.
    let explained = |model: &str| {
        let out = ok(&attn(cache.path(), &["explain", "--model", model, "hello"]));
        out[out.find("text:").unwrap()..].to_string()
    };
    assert_eq!(explained(id), explained(dir));

    let out = attn(cache.path(), &["inspect", "weights/absent.safetensors"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.safetensors"));
}

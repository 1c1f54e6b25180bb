//! Hub model ids (feature `hub`), offline: `ModelId::parse`, and `hub::resolve_in` /
//! `hub::resolve` against hub caches the tests write as `huggingface_hub` does (blobs, relative
//! symlinks, refs), with the MarianMT fixture `marian_e2e` in them so a resolved snapshot is
//! loaded and translates. The download path runs against a local stand-in for the hub's HTTP
//! API (file listing, `resolve/` with ranges), never the network.
#![cfg(feature = "hub")]

#[path = "common/fake_hub_cache.rs"]
mod fake_hub_cache;
use fake_hub_cache::{read_files, repo_dir, write_ref, write_snapshot, MARIAN_FILES};

use candle_attention::hub::{self, ModelId};
use candle_attention::{TranslateOptions, Translator};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// `(name, contents)` of a model's files.
type Files = Vec<(String, Vec<u8>)>;

const REPO: &str = "test-org/tiny-marian";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const OTHER_COMMIT: &str = "fedcba9876543210fedcba9876543210fedcba98";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn marian_files() -> Files {
    read_files(&fixtures().join("marian_e2e"), &MARIAN_FILES)
}

fn without(files: &[(String, Vec<u8>)], name: &str) -> Files {
    files.iter().filter(|(n, _)| n != name).cloned().collect()
}

fn id(s: &str) -> ModelId {
    ModelId::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
}

fn err(result: candle::Result<PathBuf>) -> String {
    match result {
        Ok(p) => panic!("expected an error, got {}", p.display()),
        Err(e) => e.to_string(),
    }
}

/// The fixture's translations of a few texts, loaded from `dir`.
fn translate(dir: &Path) -> Vec<String> {
    let t = Translator::from_dir(dir).unwrap();
    t.translate(
        &["Is it forty-two?", "nine hundred ninety-nine"],
        &TranslateOptions::default(),
    )
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap().text)
    .collect()
}

#[test]
fn model_ids_parse() {
    let m = id("Helsinki-NLP/opus-mt-en-de");
    assert_eq!(
        (m.repo.as_str(), m.revision.as_str()),
        ("Helsinki-NLP/opus-mt-en-de", "main")
    );
    assert_eq!(m.to_string(), "Helsinki-NLP/opus-mt-en-de");
    assert_eq!(m.cache_folder(), "models--Helsinki-NLP--opus-mt-en-de");
    assert_eq!(
        m.download_command(),
        "huggingface-cli download Helsinki-NLP/opus-mt-en-de"
    );
    let m = id("facebook/nllb-200-distilled-600M@v1.0");
    assert_eq!(m.revision, "v1.0");
    assert_eq!(m.to_string(), "facebook/nllb-200-distilled-600M@v1.0");
    assert!(m.download_command().ends_with("--revision v1.0"));
    assert_eq!(id(&format!("a/b@{COMMIT}")).revision, COMMIT);
    assert_eq!(id("a_b.c/d@refs/pr/1").revision, "refs/pr/1");
    for bad in [
        "",
        "t5-small",
        "/",
        "org/",
        "/name",
        "a/b/c",
        "./model",
        "../model",
        "/abs/path",
        "org/na me",
        " org/name",
        "org/name@",
        "org/name@a b",
        "org/name@../x",
        "org/name@x/../y",
        "org/name@a@b",
        "org/name@/x",
        "org/name@x/",
        "org/..name",
        "org/name--x",
        "-org/name",
        "org/name.",
        "~/model",
        "C:\\models\\x",
        "org\\name",
    ] {
        assert_eq!(ModelId::parse(bad), None, "{bad:?} should be refused");
    }
    let long = format!("org/{}", "n".repeat(97));
    assert_eq!(ModelId::parse(&long), None);
}

#[test]
fn a_cached_snapshot_is_returned_and_loads_through_its_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let files = marian_files();
    let snapshot = write_snapshot(cache, REPO, COMMIT, &files);
    write_ref(cache, REPO, "main", COMMIT);

    let got = hub::resolve_in(cache, &id(REPO), true).unwrap();
    assert_eq!(got, snapshot);
    for (name, bytes) in &files {
        let path = got.join(name);
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(&std::fs::read(&path).unwrap(), bytes, "{name}");
    }
    let direct = translate(&fixtures().join("marian_e2e"));
    assert_eq!(translate(&got), direct);
    assert!(direct.iter().all(|t| !t.is_empty()));
}

#[test]
fn revisions_resolve_through_refs_or_as_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let main = write_snapshot(cache, REPO, COMMIT, &marian_files());
    let tagged = write_snapshot(cache, REPO, OTHER_COMMIT, &marian_files());
    write_ref(cache, REPO, "main", COMMIT);
    write_ref(cache, REPO, "v1.0", &format!("{OTHER_COMMIT}\n"));
    write_ref(cache, REPO, "refs/pr/1", OTHER_COMMIT);

    assert_eq!(hub::resolve_in(cache, &id(REPO), true).unwrap(), main);
    let v1 = hub::resolve_in(cache, &id(&format!("{REPO}@v1.0")), true).unwrap();
    assert_eq!(v1, tagged);
    let pr = hub::resolve_in(cache, &id(&format!("{REPO}@refs/pr/1")), true).unwrap();
    assert_eq!(pr, tagged);
    // A commit is its own snapshot, with no ref naming it.
    let by_commit = hub::resolve_in(cache, &id(&format!("{REPO}@{OTHER_COMMIT}")), true);
    assert_eq!(by_commit.unwrap(), tagged);
    assert_eq!(translate(&v1), translate(&main));
}

#[test]
fn a_model_not_cached_fails_offline_naming_id_cache_and_download() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    write_snapshot(cache, REPO, COMMIT, &marian_files());
    write_ref(cache, REPO, "main", COMMIT);

    let e = err(hub::resolve_in(cache, &id("test-org/absent"), true));
    let looked = repo_dir(cache, "test-org/absent").join("refs/main");
    assert!(e.contains("test-org/absent"), "{e}");
    assert!(e.contains(&looked.display().to_string()), "{e}");
    assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
    assert!(
        e.contains("`huggingface-cli download test-org/absent`"),
        "{e}"
    );

    // A revision the cache has no ref for.
    let e = err(hub::resolve_in(cache, &id(&format!("{REPO}@v2")), true));
    assert!(e.contains(&format!("{REPO}@v2")), "{e}");
    assert!(
        e.contains(&repo_dir(cache, REPO).join("refs/v2").display().to_string()),
        "{e}"
    );
    assert!(
        e.contains(&format!("huggingface-cli download {REPO} --revision v2")),
        "{e}"
    );

    // A commit without a snapshot.
    let e = err(hub::resolve_in(
        cache,
        &id(&format!("{REPO}@{OTHER_COMMIT}")),
        true,
    ));
    let snapshot = repo_dir(cache, REPO).join("snapshots").join(OTHER_COMMIT);
    assert!(e.contains(&snapshot.display().to_string()), "{e}");
}

#[test]
fn an_incomplete_snapshot_fails_offline_naming_what_it_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let files = marian_files();
    let cases: [(&str, Files, &str); 4] = [
        (
            "test-org/no-weights",
            without(&files, "model.safetensors"),
            "model.safetensors (or pytorch_model.bin)",
        ),
        (
            "test-org/no-spm",
            without(&files, "source.spm"),
            "source.spm",
        ),
        (
            "test-org/no-config",
            without(&files, "config.json"),
            "config.json",
        ),
        (
            "test-org/no-vocab",
            without(&without(&files, "vocab.json"), "target.spm"),
            "target.spm, vocab.json",
        ),
    ];
    for (repo, files, missing) in cases {
        let snapshot = write_snapshot(cache, repo, COMMIT, &files);
        write_ref(cache, repo, "main", COMMIT);
        let e = err(hub::resolve_in(cache, &id(repo), true));
        assert!(e.contains(repo), "{e}");
        assert!(e.contains(&snapshot.display().to_string()), "{e}");
        assert!(e.contains(&format!("lacks {missing},")), "{e}");
        assert!(
            e.contains(&format!("huggingface-cli download {repo}")),
            "{e}"
        );
    }

    // A symlink whose blob is gone is a missing file.
    let repo = "test-org/dangling";
    write_snapshot(cache, repo, COMMIT, &files);
    write_ref(cache, repo, "main", COMMIT);
    let blob = std::fs::canonicalize(
        repo_dir(cache, repo)
            .join("snapshots")
            .join(COMMIT)
            .join("target.spm"),
    )
    .unwrap();
    std::fs::remove_file(blob).unwrap();
    let e = err(hub::resolve_in(cache, &id(repo), true));
    assert!(e.contains("lacks target.spm,"), "{e}");

    // The weights as pytorch_model.bin serve as well.
    let repo = "test-org/pth";
    let mut pth = without(&files, "model.safetensors");
    pth.push(("pytorch_model.bin".into(), b"stand-in".to_vec()));
    let snapshot = write_snapshot(cache, repo, COMMIT, &pth);
    write_ref(cache, repo, "main", COMMIT);
    assert_eq!(hub::resolve_in(cache, &id(repo), true).unwrap(), snapshot);

    // A sharded checkpoint is refused as such, online or not.
    let repo = "test-org/sharded";
    let mut sharded = without(&files, "model.safetensors");
    sharded.push(("model.safetensors.index.json".into(), b"{}".to_vec()));
    write_snapshot(cache, repo, COMMIT, &sharded);
    write_ref(cache, repo, "main", COMMIT);
    for offline in [true, false] {
        let e = err(hub::resolve_in(cache, &id(repo), offline));
        assert!(e.contains("sharded"), "{e}");
        assert!(e.contains("model.safetensors.index.json"), "{e}");
    }

    // A separate target vocabulary is needed when the tokenizer config says so.
    let repo = "test-org/separate";
    let mut separate = without(&files, "tokenizer_config.json");
    separate.push((
        "tokenizer_config.json".into(),
        br#"{"separate_vocabs": true}"#.to_vec(),
    ));
    write_snapshot(cache, repo, COMMIT, &separate);
    write_ref(cache, repo, "main", COMMIT);
    let e = err(hub::resolve_in(cache, &id(repo), true));
    assert!(e.contains("lacks target_vocab.json,"), "{e}");
}

#[test]
fn multilingual_snapshots_need_their_tokenizer_files() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path();
    let nllb_dir = fixtures().join("multilingual_e2e/nllb");
    let names = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "sentencepiece.bpe.model",
        "special_tokens_map.json",
        "tokenizer_config.json",
    ];
    let nllb = read_files(&nllb_dir, &names);
    let repo = "test-org/tiny-nllb";
    let snapshot = write_snapshot(cache, repo, COMMIT, &nllb);
    write_ref(cache, repo, "main", COMMIT);
    let got = hub::resolve_in(cache, &id(repo), true).unwrap();
    assert_eq!(got, snapshot);
    candle_attention::tokenizers::load_multilingual_tokenizer(&got).unwrap();

    let repo = "test-org/nllb-no-spm";
    write_snapshot(
        cache,
        repo,
        COMMIT,
        &without(&nllb, "sentencepiece.bpe.model"),
    );
    write_ref(cache, repo, "main", COMMIT);
    let e = err(hub::resolve_in(cache, &id(repo), true));
    assert!(e.contains("lacks sentencepiece.bpe.model,"), "{e}");
    // With a tokenizer.json, NLLB's sentencepiece file is not read.
    let repo = "test-org/nllb-json";
    let mut json = without(&nllb, "sentencepiece.bpe.model");
    json.push(("tokenizer.json".into(), b"{}".to_vec()));
    let snapshot = write_snapshot(cache, repo, COMMIT, &json);
    write_ref(cache, repo, "main", COMMIT);
    assert_eq!(hub::resolve_in(cache, &id(repo), true).unwrap(), snapshot);
    // M2M100's tokenizer needs vocab.json as well.
    let repo = "test-org/m2m";
    let mut m2m = without(&nllb, "tokenizer_config.json");
    m2m.push((
        "tokenizer_config.json".into(),
        br#"{"tokenizer_class": "M2M100Tokenizer"}"#.to_vec(),
    ));
    write_snapshot(cache, repo, COMMIT, &m2m);
    write_ref(cache, repo, "main", COMMIT);
    let e = err(hub::resolve_in(cache, &id(repo), true));
    assert!(e.contains("lacks vocab.json,"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// A stand-in for the hub's HTTP API: `GET /api/models/{repo}/revision/{rev}` (the file list and
// commit) and `GET /{repo}/resolve/{rev}/{file}` with `Range` (206, `ETag`, `X-Repo-Commit`,
// `Content-Range`), as hf-hub's blocking client uses them. Every request is recorded.

struct FakeRepo {
    repo: String,
    commit: String,
    /// Branch and tag names that point at `commit`.
    revisions: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
}

struct FakeHub {
    endpoint: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl FakeHub {
    fn start(repos: Vec<FakeRepo>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let repos = Arc::new(repos);
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (repos, log) = (repos.clone(), log.clone());
                std::thread::spawn(move || serve(stream, &repos, &log));
            }
        });
        FakeHub { endpoint, requests }
    }

    /// The requests since the last call, as `path` (the file downloads as `file` only once
    /// each: hf-hub asks for a file's first byte, then for all of it).
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }

    /// The files downloaded (whole-file requests) since the last call.
    fn downloaded(&self) -> Vec<String> {
        let mut files: Vec<String> = self
            .take()
            .into_iter()
            .filter_map(|r| {
                r.strip_suffix(" bytes=0-")
                    .map(|p| p.rsplit('/').next().unwrap().to_string())
            })
            .collect();
        files.sort();
        files
    }
}

fn serve(stream: TcpStream, repos: &[FakeRepo], log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut range = None;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("range") {
                    range = Some(v.trim().to_string());
                }
            }
        }
        log.lock().unwrap().push(match &range {
            Some(r) => format!("{path} {r}"),
            None => path.clone(),
        });
        let (status, headers, body) = respond(&path, range.as_deref(), repos);
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&body).is_err() {
            return;
        }
    }
}

fn respond(
    path: &str,
    range: Option<&str>,
    repos: &[FakeRepo],
) -> (String, Vec<(String, String)>, Vec<u8>) {
    let not_found = || {
        (
            "404 Not Found".to_string(),
            vec![],
            b"{\"error\":\"not found\"}".to_vec(),
        )
    };
    let path = path.replace("%2F", "/");
    let at = |rev: &str, r: &FakeRepo| rev == r.commit || r.revisions.iter().any(|x| x == rev);
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found();
        };
        let Some(r) = repos.iter().find(|r| r.repo == repo && at(rev, r)) else {
            return not_found();
        };
        let siblings: Vec<serde_json::Value> = r
            .files
            .iter()
            .map(|(n, _)| serde_json::json!({ "rfilename": n }))
            .collect();
        let body = serde_json::json!({ "id": r.repo, "sha": r.commit, "siblings": siblings });
        let headers = vec![("Content-Type".into(), "application/json".into())];
        return ("200 OK".into(), headers, body.to_string().into_bytes());
    }
    let Some((repo, rest)) = path[1..].split_once("/resolve/") else {
        return not_found();
    };
    let Some((rev, file)) = rest.split_once('/') else {
        return not_found();
    };
    let Some(r) = repos.iter().find(|r| r.repo == repo && at(rev, r)) else {
        return not_found();
    };
    let Some((_, bytes)) = r.files.iter().find(|(n, _)| n == file) else {
        return not_found();
    };
    let (start, end) = match range
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
    {
        Some((s, e)) => (
            s.parse::<usize>().unwrap(),
            if e.is_empty() {
                bytes.len() - 1
            } else {
                e.parse::<usize>().unwrap()
            },
        ),
        None => (0, bytes.len() - 1),
    };
    let headers = vec![
        (
            "ETag".into(),
            format!("\"{}\"", fake_hub_cache::blob_name(bytes)),
        ),
        ("X-Repo-Commit".into(), r.commit.clone()),
        (
            "Content-Range".into(),
            format!("bytes {start}-{end}/{}", bytes.len()),
        ),
    ];
    (
        "206 Partial Content".into(),
        headers,
        bytes[start..=end].to_vec(),
    )
}

/// Everything that reads the environment (`HF_HUB_CACHE`, `HF_HOME`, `HF_HUB_OFFLINE`,
/// `HF_ENDPOINT`): one test, so that no other test of this process sees it change.
#[test]
fn the_environment_picks_cache_offline_mode_and_endpoint() {
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
        "HF_HUB_OFFLINE",
        "HF_ENDPOINT",
        "HF_TOKEN",
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ] {
        std::env::remove_var(var);
    }
    let tmp = tempfile::tempdir().unwrap();

    // The cache directory, as huggingface_hub finds it.
    let home = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into()));
    assert_eq!(hub::cache_dir(), home.join(".cache/huggingface/hub"));
    std::env::set_var("XDG_CACHE_HOME", tmp.path().join("xdg"));
    assert_eq!(hub::cache_dir(), tmp.path().join("xdg/huggingface/hub"));
    std::env::set_var("HF_HOME", tmp.path().join("hf"));
    assert_eq!(hub::cache_dir(), tmp.path().join("hf/hub"));
    std::env::set_var("HF_HUB_CACHE", "");
    assert_eq!(hub::cache_dir(), tmp.path().join("hf/hub"));
    let cache = tmp.path().join("cache");
    std::env::set_var("HF_HUB_CACHE", &cache);
    assert_eq!(hub::cache_dir(), cache);

    // HF_HUB_OFFLINE's true values.
    assert!(!hub::offline());
    for (value, offline) in [
        ("1", true),
        ("ON", true),
        ("yes", true),
        ("True", true),
        ("0", false),
        ("false", false),
        ("", false),
        ("no", false),
    ] {
        std::env::set_var("HF_HUB_OFFLINE", value);
        assert_eq!(hub::offline(), offline, "HF_HUB_OFFLINE={value:?}");
    }

    // Offline: the cache only.
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let snapshot = write_snapshot(&cache, REPO, COMMIT, &marian_files());
    write_ref(&cache, REPO, "main", COMMIT);
    assert_eq!(hub::resolve(&id(REPO)).unwrap(), snapshot);
    assert_eq!(hub::resolve_path_or_id(REPO).unwrap(), snapshot);
    // The library's entry points take the id as they take a directory.
    let direct = translate(&fixtures().join("marian_e2e"));
    let from_id = Translator::from_pretrained(REPO).unwrap();
    assert_eq!(from_id.dir(), snapshot);
    let built = Translator::builder(REPO).beam(1).build().unwrap();
    let texts = ["Is it forty-two?", "nine hundred ninety-nine"];
    for t in [from_id, built] {
        let got: Vec<String> = t
            .translate(&texts, &TranslateOptions::default())
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap().text)
            .collect();
        assert_eq!(got, direct);
    }
    let fixture = fixtures().join("marian_e2e");
    let fixture_arg = fixture.to_str().unwrap();
    assert_eq!(hub::resolve_path_or_id(fixture_arg).unwrap(), fixture);
    let e = err(hub::resolve_path_or_id("no-such-model-dir"));
    assert!(
        e.contains("no-such-model-dir: no such file or directory"),
        "{e}"
    );
    let e = err(hub::resolve_path_or_id("test-org/absent"));
    assert!(e.contains("not a local directory"), "{e}");
    assert!(
        e.contains(
            &repo_dir(&cache, "test-org/absent")
                .join("refs/main")
                .display()
                .to_string()
        ),
        "{e}"
    );
    assert!(
        e.contains("huggingface-cli download test-org/absent"),
        "{e}"
    );

    // Online, against the stand-in hub: only the files the family needs, one weight format.
    std::env::remove_var("HF_HUB_OFFLINE");
    let mut listed = marian_files();
    for junk in [
        "pytorch_model.bin",
        "tf_model.h5",
        "rust_model.ot",
        "README.md",
        "sentencepiece.bpe.model",
    ] {
        listed.push((junk.into(), format!("{junk} stand-in").into_bytes()));
    }
    let mut pth_only = without(&marian_files(), "model.safetensors");
    pth_only.push((
        "pytorch_model.bin".into(),
        std::fs::read(fixtures().join("marian/gelu_noscale/pytorch_model.bin")).unwrap(),
    ));
    let mut sharded = without(&marian_files(), "model.safetensors");
    sharded.push(("model.safetensors.index.json".into(), b"{}".to_vec()));
    sharded.push(("model-00001-of-00002.safetensors".into(), b"x".to_vec()));
    let nllb = read_files(
        &fixtures().join("multilingual_e2e/nllb"),
        &[
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "sentencepiece.bpe.model",
            "special_tokens_map.json",
            "tokenizer_config.json",
        ],
    );
    let mut nllb_listed = nllb.clone();
    nllb_listed.push(("source.spm".into(), b"not for NLLB".to_vec()));
    let fake = |repo: &str, commit: &str, files: Files| FakeRepo {
        repo: repo.into(),
        commit: commit.into(),
        revisions: vec!["main".into(), "v1.0".into()],
        files,
    };
    let hub_server = FakeHub::start(vec![
        fake(REPO, OTHER_COMMIT, listed),
        fake("test-org/pth-only", COMMIT, pth_only),
        fake("test-org/sharded", COMMIT, sharded),
        fake("test-org/tiny-nllb", COMMIT, nllb_listed),
    ]);
    std::env::set_var("HF_ENDPOINT", &hub_server.endpoint);
    let online = tmp.path().join("online");
    std::env::set_var("HF_HUB_CACHE", &online);

    let got = hub::resolve(&id(REPO)).unwrap();
    let mut want: Vec<String> = MARIAN_FILES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(hub_server.downloaded(), want);
    let dir = repo_dir(&online, REPO);
    assert_eq!(got, dir.join("snapshots").join(OTHER_COMMIT));
    assert_eq!(
        std::fs::read_to_string(dir.join("refs/main")).unwrap(),
        OTHER_COMMIT
    );
    assert!(
        !dir.join("refs").join(OTHER_COMMIT).exists(),
        "no ref named by the commit"
    );
    for name in MARIAN_FILES {
        let link = std::fs::read_link(got.join(name)).unwrap();
        assert!(
            link.starts_with("../../blobs"),
            "{name} -> {}",
            link.display()
        );
    }
    assert_eq!(translate(&got), translate(&fixture));
    // Complete in the cache now: no request at all, online or not.
    assert_eq!(hub::resolve(&id(REPO)).unwrap(), got);
    assert_eq!(hub_server.take(), Vec::<String>::new());
    // A tag of the same commit: the listing only, then refs/v1.0.
    assert_eq!(hub::resolve(&id(&format!("{REPO}@v1.0"))).unwrap(), got);
    assert_eq!(
        hub_server.take(),
        vec![format!("/api/models/{REPO}/revision/v1.0")]
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("refs/v1.0")).unwrap(),
        OTHER_COMMIT
    );

    // pytorch_model.bin when there is no model.safetensors.
    let got = hub::resolve(&id("test-org/pth-only")).unwrap();
    assert!(hub_server
        .downloaded()
        .contains(&"pytorch_model.bin".to_string()));
    assert!(got.join("pytorch_model.bin").is_file());
    // A sharded checkpoint: refused before any weight is fetched.
    let e = err(hub::resolve(&id("test-org/sharded")));
    assert!(
        e.contains("sharded") && e.contains("test-org/sharded"),
        "{e}"
    );
    assert!(hub_server
        .downloaded()
        .iter()
        .all(|f| !f.contains("safetensors")));
    // NLLB: its tokenizer files, not Marian's.
    let got = hub::resolve(&id("test-org/tiny-nllb")).unwrap();
    let mut want: Vec<String> = nllb.iter().map(|(n, _)| n.clone()).collect();
    want.sort();
    assert_eq!(hub_server.downloaded(), want);
    candle_attention::tokenizers::load_multilingual_tokenizer(&got).unwrap();

    // A repository the hub does not have, and a hub that cannot be reached.
    let e = err(hub::resolve(&id("test-org/absent")));
    assert!(
        e.contains("test-org/absent")
            && e.contains("downloading it from the Hugging Face hub failed"),
        "{e}"
    );
    assert!(
        e.contains("huggingface-cli download test-org/absent"),
        "{e}"
    );
    std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:1");
    let e = err(hub::resolve(&id("test-org/other")));
    assert!(
        e.contains("test-org/other") && e.contains("hub failed"),
        "{e}"
    );
}

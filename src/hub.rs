//! Hugging Face hub model ids (feature `hub`): `ORG/NAME[@REVISION]` to a local model directory.
//!
//! [`resolve`] looks in the hub cache first, laid out as `huggingface_hub` and `transformers`
//! write it (so a model either of them downloaded is found, and the other way round):
//!
//! ```text
//! $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
//! └── models--ORG--NAME
//!     ├── blobs/<hash>                       the file contents
//!     ├── refs/<revision>                    a branch or tag: the commit it points to
//!     └── snapshots/<commit>/<file>          relative symlinks to ../../blobs/<hash>
//! ```
//!
//! A snapshot that already holds what the family's loaders need (`config.json`, the weights,
//! the tokenizer files) is returned without touching the network. Otherwise, unless
//! `HF_HUB_OFFLINE` is set, the missing files are downloaded with `hf-hub`'s blocking client into
//! that same cache: only the ones the model's family reads (see [`resolve_in`]), never both
//! weight formats. With `HF_HUB_OFFLINE` set a model that is not cached fails at once, with an
//! error naming the id, the cache path looked at and how to download it.
//!
//! ```no_run
//! # fn main() -> candle::Result<()> {
//! use candle_attention::{hub, marian::MarianTranslator};
//! let dir = hub::resolve_path_or_id("Helsinki-NLP/opus-mt-en-de")?; // or a directory path
//! let translator = MarianTranslator::from_dir(dir, &candle::Device::Cpu)?;
//! # Ok(()) }
//! ```
//!
//! Environment, as `huggingface_hub` reads it: `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME`
//! ([`cache_dir`]), `HF_HUB_OFFLINE` ([`offline`]), `HF_TOKEN` (else the token file that
//! `huggingface-cli login` writes, `$HF_HOME/token`) for gated and private models, and
//! `HF_ENDPOINT` (a mirror).

use crate::models::seq2seq::Family;
use std::fmt;
use std::path::{Path, PathBuf};

/// `candle::bail!` without the backtrace it attaches under `RUST_BACKTRACE`: these messages are
/// read by people, often inside another error's.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err(candle::Error::Msg(format!($($arg)*)))
    };
}

/// A model on the Hugging Face hub: its repository and a revision (a branch, a tag or a commit).
///
/// Only `ORG/NAME` ids are accepted, not the legacy bare names (`t5-small`): every model this
/// crate loads lives under an organisation (`Helsinki-NLP/opus-mt-en-de`,
/// `facebook/nllb-200-distilled-600M`), and a bare word is far more often a mistyped directory
/// than a hub id, so [`resolve_path_or_id`] reports it as a path that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ModelId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit hash; `main` when the id names none.
    pub revision: String,
}

impl ModelId {
    /// Parses `ORG/NAME` or `ORG/NAME@REVISION` (the revision defaults to `main`).
    ///
    /// `ORG` and `NAME` are the hub's repository names: ASCII letters, digits, `-`, `_` and
    /// `.`, at most 96 characters, neither starting nor ending with `-` or `.`, with no `--` or
    /// `..`. The revision is a branch, tag or commit (`v1.0`, `refs/pr/1`, 40 hex digits): no
    /// whitespace, `\`, `@`, and no empty, `.` or `..` segment between its `/`s. Anything else
    /// (a bare `NAME`, a third path component, an absolute or relative path) is `None`.
    pub fn parse(s: &str) -> Option<ModelId> {
        let (repo, revision) = match s.split_once('@') {
            Some((repo, revision)) => (repo, revision),
            None => (s, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        if !valid_repo_part(org) || !valid_repo_part(name) || !valid_revision(revision) {
            return None;
        }
        Some(ModelId {
            repo: repo.to_string(),
            revision: revision.to_string(),
        })
    }

    /// The repository's folder in the hub cache: `models--ORG--NAME`.
    pub fn cache_folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }

    /// The command that downloads this model into the cache (`huggingface-cli download ...`).
    pub fn download_command(&self) -> String {
        if self.revision == "main" {
            format!("huggingface-cli download {}", self.repo)
        } else {
            format!(
                "huggingface-cli download {} --revision {}",
                self.repo, self.revision
            )
        }
    }
}

impl fmt::Display for ModelId {
    /// `ORG/NAME`, with `@REVISION` unless the revision is `main`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.revision == "main" {
            write!(f, "{}", self.repo)
        } else {
            write!(f, "{}@{}", self.repo, self.revision)
        }
    }
}

fn valid_repo_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 96
        && part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !part.starts_with(['-', '.'])
        && !part.ends_with(['-', '.'])
        && !part.contains("--")
        && !part.contains("..")
}

fn valid_revision(revision: &str) -> bool {
    !revision.is_empty()
        && revision.len() <= 255
        && !revision
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '\\' | '@'))
        && revision
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..")
}

fn is_commit_hash(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// An environment variable, unless it is unset or empty.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    if let Some(home) = env_var("HF_HOME") {
        return PathBuf::from(home);
    }
    let cache = env_var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home_dir().join(".cache"));
    cache.join("huggingface")
}

fn home_dir() -> PathBuf {
    env_var("HOME")
        .or_else(|| env_var("USERPROFILE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The hub cache, as `huggingface_hub` finds it: `$HF_HUB_CACHE` (or its legacy name
/// `$HUGGINGFACE_HUB_CACHE`) if set, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    env_var("HF_HUB_CACHE")
        .or_else(|| env_var("HUGGINGFACE_HUB_CACHE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// Whether `HF_HUB_OFFLINE` is set to a true value (`1`, `ON`, `YES` or `TRUE`, any case, as
/// `huggingface_hub` reads it): then [`resolve`] never touches the network.
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

/// The snapshot directory of `id` in the hub cache at [`cache_dir`], downloading what it lacks
/// unless [`offline`]: [`resolve_in`] with the environment's cache and offline setting.
pub fn resolve(id: &ModelId) -> candle::Result<PathBuf> {
    resolve_in(&cache_dir(), id, offline())
}

/// A model directory argument: a path that exists is returned as it is; anything else of the
/// form `ORG/NAME[@REVISION]` is a hub id, [`resolve`]d; anything else is an error saying that
/// the path does not exist.
pub fn resolve_path_or_id(arg: &str) -> candle::Result<PathBuf> {
    let path = Path::new(arg);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match ModelId::parse(arg) {
        Some(id) => resolve(&id).map_err(|e| {
            candle::Error::Msg(format!(
                "{arg} is not a local directory (no such path), so it was taken as a Hugging \
                 Face hub id: {e}"
            ))
        }),
        None => fail!(
            "{arg}: no such file or directory (and not a Hugging Face hub id of the form \
             ORG/NAME or ORG/NAME@REVISION)"
        ),
    }
}

/// The snapshot directory of `id` in the hub cache `cache`, holding the files the model's family
/// needs.
///
/// Offline first: `refs/<revision>` names the commit (a revision that is itself a 40-hex commit
/// is its own snapshot), and a `snapshots/<commit>/` that has `config.json`, a weight file and
/// the tokenizer files the loaders require is returned without any network access.
///
/// Otherwise, with `offline` the call fails at once, naming the id, the cache path and how to
/// download the model. Online, the repository's file list at that revision is fetched and then,
/// into `snapshots/<commit>/` (files already there are kept): `config.json`, then
/// `generation_config.json` (if the repository has one), the weights (`model.safetensors` if the
/// repository has it, else `pytorch_model.bin`; a checkpoint sharded into
/// `*.index.json` is refused, as the loaders do not read those), and the tokenizer files of the
/// family `config.json` names that the repository has: for MarianMT `source.spm`, `target.spm`,
/// `vocab.json`, `target_vocab.json`, `tokenizer_config.json`, `special_tokens_map.json`; for
/// M2M100 / NLLB-200 and mBART-50 `sentencepiece.bpe.model`, `vocab.json`, `tokenizer.json`,
/// `tokenizer_config.json`, `special_tokens_map.json`. `refs/<revision>` is then pointed at the
/// commit, as `huggingface_hub` does.
pub fn resolve_in(cache: &Path, id: &ModelId, offline: bool) -> candle::Result<PathBuf> {
    let repo_dir = cache.join(id.cache_folder());
    let cached = cached_snapshot(&repo_dir, id);
    if let Some(snapshot) = &cached {
        let missing = missing_files(snapshot)?;
        if missing.is_empty() {
            return Ok(snapshot.clone());
        }
        if offline {
            fail!(
                "{id}: the cached snapshot {} lacks {}, and HF_HUB_OFFLINE is set, so nothing is \
                 downloaded; download the model with `{}`, or run once online without \
                 HF_HUB_OFFLINE",
                snapshot.display(),
                missing.join(", "),
                id.download_command()
            )
        }
    } else if offline {
        let looked_at = if is_commit_hash(&id.revision) {
            repo_dir.join("snapshots").join(&id.revision)
        } else {
            repo_dir.join("refs").join(&id.revision)
        };
        fail!(
            "{id} is not in the Hugging Face cache (looked for {}) and HF_HUB_OFFLINE is set, \
             so nothing is downloaded; download it with `{}`, or run once online without \
             HF_HUB_OFFLINE",
            looked_at.display(),
            id.download_command()
        )
    }
    download(cache, id).map_err(|failure| match failure {
        Failure::Hub(e) => {
            let state = match &cached {
                Some(snapshot) => {
                    format!("the cached snapshot {} is incomplete", snapshot.display())
                }
                None => format!("it is not in the cache ({})", repo_dir.display()),
            };
            candle::Error::Msg(format!(
                "{id}: {state}, and downloading it from the Hugging Face hub failed: {e}. Check \
                 the id and revision, the network (or HF_ENDPOINT), and HF_TOKEN (or \
                 `huggingface-cli login`) for a gated or private model; or download it with `{}`",
                id.download_command()
            ))
        }
        Failure::Model(e) => candle::Error::Msg(format!("{id}: {e}")),
    })
}

/// Why a download failed: the hub (network, HTTP, the cache's files) or the model itself
/// (sharded, no weights, not a supported family), which no retry changes.
enum Failure {
    Hub(String),
    Model(candle::Error),
}

impl From<candle::Error> for Failure {
    fn from(e: candle::Error) -> Self {
        Failure::Model(e)
    }
}

fn model_failure(message: String) -> Failure {
    Failure::Model(candle::Error::Msg(message))
}

/// A hub error for people: what was being done, and what an HTTP status means here.
fn hub_failure(what: &str, id: &ModelId, e: hf_hub::api::sync::ApiError) -> Failure {
    let text = e.to_string();
    let status = text
        .rsplit("http status: ")
        .next()
        .filter(|_| text.contains("http status: "))
        .and_then(|s| s.trim().parse::<u16>().ok());
    Failure::Hub(match status {
        Some(401 | 404) => format!(
            "{what}: {text} (no model {} at revision {} on the hub, or a private or gated one)",
            id.repo, id.revision
        ),
        Some(403) => format!(
            "{what}: {text} (access denied: a gated model needs its terms accepted on the hub \
             and HF_TOKEN set)"
        ),
        _ => format!("{what}: {text}"),
    })
}

/// `snapshots/<commit>` of `id` in its cache folder, if that directory exists.
fn cached_snapshot(repo_dir: &Path, id: &ModelId) -> Option<PathBuf> {
    let commit = match std::fs::read_to_string(repo_dir.join("refs").join(&id.revision)) {
        Ok(commit) => commit.trim().to_string(),
        Err(_) if is_commit_hash(&id.revision) => id.revision.clone(),
        Err(_) => return None,
    };
    if commit.is_empty() || !valid_revision(&commit) {
        return None;
    }
    let snapshot = repo_dir.join("snapshots").join(commit);
    snapshot.is_dir().then_some(snapshot)
}

/// The weight files a model may have, in order of preference.
const WEIGHTS: [&str; 2] = ["model.safetensors", "pytorch_model.bin"];
/// The indexes of sharded checkpoints, which the loaders do not read.
const SHARD_INDEXES: [&str; 2] = [
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
];
/// The tokenizer files the MarianMT tokenizer reads (the last three optional).
const MARIAN_TOKENIZER: [&str; 6] = [
    "source.spm",
    "target.spm",
    "vocab.json",
    "target_vocab.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];
/// The tokenizer files the M2M100, NLLB-200 and mBART-50 tokenizers read, the family chosen by
/// `tokenizer_config.json` or by these files.
const MULTILINGUAL_TOKENIZER: [&str; 5] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "sentencepiece.bpe.model",
    "vocab.json",
    "tokenizer.json",
];

fn tokenizer_files(family: Family) -> &'static [&'static str] {
    match family {
        Family::Marian => &MARIAN_TOKENIZER,
        Family::M2M100 | Family::MBart => &MULTILINGUAL_TOKENIZER,
    }
}

/// What a snapshot lacks of the files the loaders require (empty: it loads). A sharded
/// checkpoint is an error.
fn missing_files(dir: &Path) -> candle::Result<Vec<String>> {
    let has = |name: &str| dir.join(name).is_file();
    let mut missing = Vec::new();
    if !WEIGHTS.iter().any(|w| has(w)) {
        if let Some(index) = SHARD_INDEXES.iter().find(|i| has(i)) {
            return Err(sharded(&dir.join(index).display().to_string()));
        }
        missing.push(format!("{} (or {})", WEIGHTS[0], WEIGHTS[1]));
    }
    if !has("config.json") {
        missing.insert(0, "config.json".to_string());
        return Ok(missing);
    }
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json"));
    let required: Vec<&str> = match Family::of_dir(dir)? {
        Family::Marian => {
            let mut required = vec!["source.spm", "target.spm", "vocab.json"];
            if tokenizer_config
                .get("separate_vocabs")
                .and_then(|v| v.as_bool())
                == Some(true)
            {
                required.push("target_vocab.json");
            }
            required
        }
        Family::M2M100 | Family::MBart => {
            let class = tokenizer_config
                .get("tokenizer_class")
                .and_then(|c| c.as_str())
                .map(|c| c.trim_end_matches("Fast"));
            match class {
                Some("M2M100Tokenizer") => vec!["vocab.json", "sentencepiece.bpe.model"],
                // With a tokenizer.json the sentencepiece file is not read.
                Some("NllbTokenizer" | "MBart50Tokenizer") if has("tokenizer.json") => vec![],
                _ => vec!["sentencepiece.bpe.model"],
            }
        }
    };
    missing.extend(required.into_iter().filter(|f| !has(f)).map(str::to_string));
    Ok(missing)
}

/// A JSON file's top-level object; empty when the file is absent or not a JSON object (the
/// loaders report such files themselves).
fn read_json(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn sharded(what: &str) -> candle::Error {
    candle::Error::Msg(format!(
        "{what}: the checkpoint is sharded (*.index.json), which this crate does not load; save \
         the model as one file with save_pretrained(max_shard_size=\"100GB\")"
    ))
}

/// The token for gated and private models: `$HF_TOKEN`, else the file `huggingface-cli login`
/// writes (`$HF_TOKEN_PATH`, else `$HF_HOME/token`).
fn token() -> Option<String> {
    if let Some(token) = env_var("HF_TOKEN") {
        return Some(token.trim().to_string());
    }
    let path = env_var("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"));
    let token = std::fs::read_to_string(path).ok()?.trim().to_string();
    (!token.is_empty()).then_some(token)
}

/// Downloads what `id` needs into `cache` (see [`resolve_in`]); the snapshot directory.
fn download(cache: &Path, id: &ModelId) -> Result<PathBuf, Failure> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Cache, Repo, RepoType};
    use std::io::IsTerminal;

    let msg = |what: String| move |e| hub_failure(&what, id, e);
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.to_path_buf()))
        .with_token(token())
        .with_progress(std::io::stderr().is_terminal());
    if let Some(endpoint) = env_var("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    let api = builder
        .build()
        .map_err(msg("starting the hub client".into()))?;
    let info = api
        .repo(Repo::with_revision(
            id.repo.clone(),
            RepoType::Model,
            id.revision.clone(),
        ))
        .info()
        .map_err(msg("listing the repository's files".into()))?;
    let commit = info.sha.trim().to_string();
    if !is_commit_hash(&commit) {
        return Err(Failure::Hub(format!(
            "listing the repository's files: the hub answered the commit {commit:?}, not a \
             commit hash"
        )));
    }
    let listed: Vec<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    let has = |name: &str| listed.contains(&name);
    // Every file comes from that one commit, whatever the branch does meanwhile.
    let pinned = api.repo(Repo::with_revision(
        id.repo.clone(),
        RepoType::Model,
        commit.clone(),
    ));
    let repo_dir = cache.join(id.cache_folder());
    let snapshot = repo_dir.join("snapshots").join(&commit);
    let fetch = |name: &str| -> Result<(), Failure> {
        let link = snapshot.join(name);
        if !link.is_file() {
            // A link whose blob is gone would block hf-hub's new one.
            if link.symlink_metadata().is_ok() {
                let _ = std::fs::remove_file(&link);
            }
            pinned
                .download(name)
                .map_err(msg(format!("downloading {name}")))?;
        }
        Ok(())
    };

    let weights = match WEIGHTS.iter().find(|w| has(w)) {
        Some(weights) => *weights,
        None => {
            if let Some(index) = SHARD_INDEXES.iter().find(|i| has(i)) {
                return Err(sharded(&format!("the repository has {index}")).into());
            }
            return Err(model_failure(format!(
                "the repository has neither {} nor {}; it has {}",
                WEIGHTS[0],
                WEIGHTS[1],
                listed.join(", ")
            )));
        }
    };
    if !has("config.json") {
        return Err(model_failure(format!(
            "the repository has no config.json at {}: not a transformers model; it has {}",
            id.revision,
            listed.join(", ")
        )));
    }
    // hf-hub records each download under a ref named by the commit (`refs/<commit>`), which
    // huggingface_hub never writes: removed again unless it was there before.
    let commit_ref = repo_dir.join("refs").join(&commit);
    let stray_ref = !commit_ref.exists();
    let fetched = (|| {
        fetch("config.json")?;
        let family = Family::of_dir(&snapshot)?;
        if has("generation_config.json") {
            fetch("generation_config.json")?;
        }
        fetch(weights)?;
        for name in tokenizer_files(family) {
            if has(name) {
                fetch(name)?;
            }
        }
        Ok::<_, Failure>(family)
    })();
    if stray_ref {
        let _ = std::fs::remove_file(&commit_ref);
    }
    let family = fetched?;
    if id.revision != commit {
        let ref_path = repo_dir.join("refs").join(&id.revision);
        let written = ref_path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&ref_path, &commit));
        written.map_err(|e| Failure::Hub(format!("cannot write {}: {e}", ref_path.display())))?;
    }
    let missing = missing_files(&snapshot)?;
    if !missing.is_empty() {
        return Err(model_failure(format!(
            "the repository at {commit} lacks {}, which a {} model needs",
            missing.join(", "),
            family.name()
        )));
    }
    Ok(snapshot)
}

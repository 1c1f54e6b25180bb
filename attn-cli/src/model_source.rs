//! Where a `--model` comes from: a directory, or (feature `hub`, on by default) a Hugging Face
//! hub id `ORG/NAME[@REVISION]` resolved through the local hub cache
//! ([`candle_attention::hub`]: `HF_HUB_CACHE` / `HF_HOME`, downloads unless `HF_HUB_OFFLINE`).

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The model directory `arg` names: a path that exists is returned as it is; anything else of
/// the form `ORG/NAME[@REVISION]` is a hub id, resolved to its snapshot in the hub cache (with
/// the feature `hub`; without it, an error saying this build has no hub support); anything else
/// is an error saying the path does not exist.
pub fn resolve_model(arg: &Path) -> Result<PathBuf> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    match arg.to_str() {
        Some(text) => resolve_id(text),
        None => bail!("{}: no such file or directory", arg.display()),
    }
}

#[cfg(feature = "hub")]
fn resolve_id(arg: &str) -> Result<PathBuf> {
    use anyhow::Context;
    use candle_attention::hub;
    match hub::ModelId::parse(arg) {
        Some(id) => hub::resolve(&id).with_context(|| {
            format!(
                "resolving the model id {id} (no local directory {arg} exists, so it names a \
                 Hugging Face hub model)"
            )
        }),
        None => bail!(
            "{arg}: no such file or directory (nor a Hugging Face hub id ORG/NAME or \
             ORG/NAME@REVISION)"
        ),
    }
}

#[cfg(not(feature = "hub"))]
fn resolve_id(arg: &str) -> Result<PathBuf> {
    let parts: Vec<&str> = arg.split('@').next().unwrap_or("").split('/').collect();
    let id_like =
        parts.len() == 2 && parts.iter().all(|p| !p.is_empty()) && !arg.starts_with(['.', '~']);
    if id_like {
        bail!(
            "{arg}: no such directory, and this attn was built without hub support, so it \
             cannot resolve Hugging Face model ids: rebuild it with the `hub` feature \
             (`cargo install --features hub`, a default feature), or download the model \
             (`huggingface-cli download {arg}`) and pass its directory"
        )
    }
    bail!("{arg}: no such file or directory")
}

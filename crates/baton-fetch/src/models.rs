//! From what the user typed to a model on a device: a path, `hf:OWNER/REPO/FILE`, or a
//! name from assets/models.toml, fetched into the cache when missing and checksummed, so
//! the runtime is handed a local path and a verified identity and never touches the
//! network itself.

use super::{checksum, FetchError, FetchProgress, HubOptions, Kind, Manifest, SilentProgress};
use baton_runtime::model::{DigestCheck, LoadOptions, Model, ModelError, Placement, ResolvedModel};
use candle_core::Device;
use std::path::Path;

/// Why a model could not be opened: it could not be found or fetched, or it could not be
/// loaded once it was.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Resolve `spec` (fetching if needed) and load it onto `device`, computing as the
/// device does by default.
pub fn open_model(
    spec: &str,
    device: &Device,
    progress: &dyn FetchProgress,
) -> Result<Model, OpenError> {
    open_model_on(spec, &Placement::on(device.clone()), progress)
}

/// Resolve `spec` (fetching if needed) and load it where `on` says, computing as it says.
pub fn open_model_on(
    spec: &str,
    on: &Placement,
    progress: &dyn FetchProgress,
) -> Result<Model, OpenError> {
    let resolved = resolve_model(spec, progress)?;
    let opts = LoadOptions::for_device(&on.device).computing(on.compute);
    Ok(Model::load(&resolved, &on.device, opts)?)
}

/// Turn `spec` into a local path and its checksum: an existing path, `hf:OWNER/REPO/FILE`,
/// or a manifest name (fetched into the cache if missing).
pub fn resolve_model(
    spec: &str,
    progress: &dyn FetchProgress,
) -> Result<ResolvedModel, FetchError> {
    resolve_model_in(
        &super::cache_root(),
        spec,
        &HubOptions::from_env()?,
        progress,
    )
}

/// [`resolve_model`] with the cache under `root` and the hub reached as `hub` says.
pub fn resolve_model_in(
    root: &Path,
    spec: &str,
    hub: &HubOptions,
    progress: &dyn FetchProgress,
) -> Result<ResolvedModel, FetchError> {
    let as_path = Path::new(spec);
    let manifest = Manifest::builtin()?;
    let known = manifest
        .entry(spec)
        .filter(|e| e.kind == Kind::Model)
        .is_some();
    // A bare known name is the known model even when a file or folder here has that
    // name (an output folder, say); that one is reached by writing it as a path.
    if known && as_path.exists() && !looks_like_a_path(spec) {
        tracing::warn!(
            spec,
            "a path of this name exists here; using the known model (write ./{spec} for the path)"
        );
    } else if as_path.exists() {
        let name = as_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string());
        let (sha256, sha256_check) = local_sha256_checked(as_path)?;
        return Ok(ResolvedModel {
            name,
            path: as_path.to_path_buf(),
            sha256,
            source: None,
            sha256_check,
        });
    }
    if spec.starts_with("hf:") {
        return super::resolve_hub_in(root, spec, hub, progress);
    }
    match manifest.entry(spec) {
        Some(entry) if entry.kind == Kind::Model => {
            let fetched = super::ensure_in_with(root, entry, Some(hub), progress)?;
            Ok(ResolvedModel {
                name: entry.name.clone(),
                path: fetched.path,
                sha256: entry.sha256.clone(),
                source: Some(fetched.source_used),
                sha256_check: if fetched.hashed_now {
                    DigestCheck::HashedNow
                } else {
                    DigestCheck::Stamp
                },
            })
        }
        _ => Err(FetchError::UnknownModel {
            spec: spec.to_string(),
            known: manifest
                .entries()
                .iter()
                .filter(|e| e.kind == Kind::Model)
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Whether `spec` was written as a path rather than a bare name.
fn looks_like_a_path(spec: &str) -> bool {
    spec.contains('/') || spec.contains(std::path::MAIN_SEPARATOR) || spec.starts_with('.')
}

/// The checksum that binds artifacts and sessions to a local model: of the file for a
/// GGUF file; for a safetensors directory, of the sorted list of (file name, sha256) of
/// its weight files.
pub fn local_sha256(path: &Path) -> Result<String, FetchError> {
    Ok(local_sha256_checked(path)?.0)
}

/// [`local_sha256`], saying whether every byte was hashed now or a stamp was trusted
/// (for a directory: a stamp for any of its files).
pub fn local_sha256_checked(path: &Path) -> Result<(String, DigestCheck), FetchError> {
    if !path.is_dir() {
        return file_sha256(path);
    }
    let mut check = DigestCheck::HashedNow;
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // A directory without weight files hashes as the empty list: the loader then
    // refuses it with its own message.
    let files =
        baton_runtime::model::weights::list_safetensors(path).map_err(|e| FetchError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: e,
        })?;
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        h.update(name.as_bytes());
        h.update(b"\0");
        let (sha, c) = file_sha256(&f)?;
        if c == DigestCheck::Stamp {
            check = DigestCheck::Stamp;
        }
        h.update(sha.as_bytes());
        h.update(b"\n");
    }
    Ok((hex::encode(h.finalize()), check))
}

/// sha256 of a file, remembered in a sidecar next to it (keyed by size and mtime) so a
/// 1 GB model is hashed once, not at every start.
fn file_sha256(path: &Path) -> Result<(String, DigestCheck), FetchError> {
    if let (Some(sc), Some((size, mtime))) =
        (checksum::read_sidecar(path), checksum::size_mtime(path))
    {
        if sc.size == size && sc.mtime_ns == mtime {
            return Ok((sc.sha256, DigestCheck::Stamp));
        }
    }
    let (sha, _) = super::sha256_file(path, &SilentProgress)?;
    // A read-only location is fine: the hash is then just computed again next time.
    if let Err(e) = checksum::write_sidecar(path, &sha, "local file", false) {
        tracing::debug!(path = %path.display(), error = %e, "could not write checksum sidecar");
    }
    Ok((sha, DigestCheck::HashedNow))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_hash_depends_on_its_weight_files_and_not_on_other_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.safetensors"), b"one").unwrap();
        std::fs::write(dir.path().join("b.safetensors"), b"two").unwrap();
        let first = local_sha256(dir.path()).unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        assert_eq!(local_sha256(dir.path()).unwrap(), first);
        std::fs::write(dir.path().join("b.safetensors"), b"three").unwrap();
        assert_ne!(local_sha256(dir.path()).unwrap(), first);
    }

    #[test]
    fn a_file_hash_is_its_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(
            local_sha256(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn an_unknown_name_lists_the_known_models() {
        let e = resolve_model("no-such-model-xyz", &SilentProgress).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, FetchError::UnknownModel { .. }), "{msg}");
        assert!(msg.contains("qwen2.5-coder-0.5b"), "{msg}");
    }

    #[test]
    fn a_bare_known_name_is_the_known_model_and_a_path_is_written_as_one() {
        assert!(!looks_like_a_path("qwen2.5-coder-0.5b"));
        assert!(looks_like_a_path("./qwen2.5-coder-0.5b"));
        assert!(looks_like_a_path("models/x.gguf"));
        assert!(looks_like_a_path("../x"));
    }

    #[test]
    fn a_short_hub_reference_says_how_to_write_one() {
        let e = resolve_model("hf:Qwen/only-two", &SilentProgress).unwrap_err();
        assert!(matches!(e, FetchError::BadHubReference(_)), "{e}");
        assert!(e.to_string().contains("hf:OWNER/REPO/FILE"), "{e}");
    }
}

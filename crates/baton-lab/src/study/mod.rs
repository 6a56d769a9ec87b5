//! Drift studies: many scripted conversations × pairs × directions × named settings ×
//! repeats, planned into work items with stable ids ([`plan`]), each run as an ordinary
//! recorded session, on one machine or split into shards for a cluster scheduler.

pub mod file;
mod gap;
mod items;
mod leftovers;
pub mod lock;
pub mod plan;
pub mod recall_scripts;
pub mod report;
pub mod run;

pub use file::{Direction, Study, StudyScript, Variant};
pub use plan::{plan, Manifest, Shard, WorkItem, MANIFEST_FILE};

use baton_engine::headless::ScriptError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "cannot write {path}: {source}; make that directory writable, or give another --out \
         directory"
    )]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "shard {shard} of {dir} is being run by another `baton study run` ({holder}): wait \
         for it to end, or give another --out directory (the lock, {lock}, is released when \
         that process ends)"
    )]
    Running {
        dir: PathBuf,
        shard: String,
        holder: String,
        lock: PathBuf,
    },
    #[error(
        "work item id {id:?} {reason}: an id names its session file under items/, so it must \
         be a plain file name"
    )]
    BadItemId { id: String, reason: String },
    #[error("study file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("a script of the study does not parse: {0}")]
    Script(#[from] ScriptError),
    #[error("{0}")]
    Shard(String),
    #[error("{0}")]
    Item(String),
    #[error("{dir} holds the items of another study ({other}): give another --out directory, or remove that one")]
    OtherStudy { dir: PathBuf, other: String },
    #[error("{path} is not a study manifest ({reason}); it is left as it is: give another --out directory")]
    BadManifest { path: PathBuf, reason: String },
}

/// Saves `manifest` in `dir` (created if missing), or finds it there already: a
/// directory holding another study's manifest is refused and left untouched.
pub fn save_manifest(dir: &Path, manifest: &Manifest) -> Result<PathBuf, StudyError> {
    let io = |path: &Path, e: std::io::Error| StudyError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    manifest.check_ids()?;
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join(MANIFEST_FILE);
    if let Some(there) = read_manifest(dir)? {
        return same_study(dir, &there, manifest).map(|()| path);
    }
    let json = serde_json::to_string_pretty(manifest).map_err(|e| StudyError::BadManifest {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    // Every shard of an array starts at once and writes the manifest: each writes its
    // own temporary file (a shared name was truncated and renamed away under another
    // shard), then links it into place, which fails where one is there already, so the
    // first manifest stays and the others are checked against it.
    let partial = dir.join(format!(
        ".{MANIFEST_FILE}.{}.{}.partial",
        std::process::id(),
        unique()
    ));
    std::fs::write(&partial, json).map_err(|e| io(&partial, e))?;
    let placed = match std::fs::hard_link(&partial, &path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        // A file system without hard links: the rename is still atomic.
        Err(_) => std::fs::rename(&partial, &path).map_err(|e| io(&path, e)),
    };
    let _ = std::fs::remove_file(&partial);
    placed?;
    match read_manifest(dir)? {
        Some(there) => same_study(dir, &there, manifest).map(|()| path),
        None => Err(StudyError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "gone right after saving"),
        }),
    }
}

fn same_study(dir: &Path, there: &Manifest, manifest: &Manifest) -> Result<(), StudyError> {
    if there.study_sha256 == manifest.study_sha256 {
        return Ok(());
    }
    Err(StudyError::OtherStudy {
        dir: dir.to_path_buf(),
        other: format!(
            "{}, study file sha256 {}",
            there.study,
            &there.study_sha256[..there.study_sha256.len().min(12)]
        ),
    })
}

/// A number no other call in this process and, with the clock, hardly any other
/// process on a shared file system gives.
fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The manifest saved in `dir`, if any.
pub fn read_manifest(dir: &Path) -> Result<Option<Manifest>, StudyError> {
    let path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StudyError::Io { path, source: e }),
    };
    let m: Manifest = serde_json::from_str(&text).map_err(|e| StudyError::BadManifest {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if m.format != plan::MANIFEST_FORMAT || m.version != plan::MANIFEST_VERSION {
        return Err(StudyError::BadManifest {
            path,
            reason: format!(
                "format {} version {}, this baton writes {} version {}",
                m.format,
                m.version,
                plan::MANIFEST_FORMAT,
                plan::MANIFEST_VERSION
            ),
        });
    }
    // An id is joined to the items folder: one edited to `../x` would be read, and
    // written, outside the output directory.
    m.check_ids().map_err(|e| StudyError::BadManifest {
        path,
        reason: e.to_string(),
    })?;
    Ok(Some(m))
}

#[cfg(test)]
mod tests;

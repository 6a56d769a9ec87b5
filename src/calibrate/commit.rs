//! Putting what a calibration keeps in place whole: the artifacts and their readable
//! copies, the statistics beside them, and a poor mapper's under `poor/`. Everything is
//! first written into a staging directory of its own inside the mapper directory (the
//! same filesystem), and moved into place by renames only once all of it is written. A
//! write that fails part way (a full disk) leaves the mappers and statistics in use
//! exactly as they were, and the staging directory is removed; so is one a failed
//! rename leaves, after what it had moved is moved back.
//!
//! As learning's shards do, each writer stages under a name no other writer uses (time,
//! process, count), so two calibrations of one directory never write into each other's
//! files; and one commit's renames run under an exclusive lock of the directory, so two
//! finishing at once cannot pair one's artifact with the other's statistics.

use super::saved_stats::{self, SavedStats};
use super::{save_fitted, CalibrateError, Fitted, Saved};
use crate::mapper::artifact::CorpusInfo;
use crate::model::Model;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The folder of a mapper directory that keeps mappers worse than no context apart.
pub const POOR: &str = "poor";
/// How a staging directory's name begins (a leading dot keeps it out of listings).
pub const STAGING_PREFIX: &str = ".calibration-";

/// What one calibration keeps.
pub struct Keep<'a> {
    /// Mappers made the default.
    pub kept: Vec<&'a Fitted>,
    /// Mappers kept apart under [`POOR`], the ones in use staying.
    pub apart: Vec<&'a Fitted>,
    /// Statistics to keep (none: not kept), each beside its direction's mapper: under
    /// [`POOR`] when that mapper is kept apart.
    pub stats: &'a [SavedStats],
}

/// Where everything went, once in place.
pub struct Kept {
    pub kept: Vec<Saved>,
    pub apart: Vec<Saved>,
    /// The statistics' directories, in the order of [`Keep::stats`].
    pub stats: Vec<PathBuf>,
}

fn err(path: &Path, e: impl std::fmt::Display) -> CalibrateError {
    CalibrateError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Writes what `keep` holds into the mapper directory `dir`, all of it or nothing.
pub fn save_calibration(
    dir: &Path,
    models: [&Model; 2],
    corpus: &CorpusInfo,
    keep: Keep<'_>,
) -> Result<Kept, CalibrateError> {
    write_all(dir, models, corpus, keep).map_err(|e| CalibrateError::NotKept(Box::new(e)))
}

fn write_all(
    dir: &Path,
    models: [&Model; 2],
    corpus: &CorpusInfo,
    keep: Keep<'_>,
) -> Result<Kept, CalibrateError> {
    let mut staging = Staging::new(dir)?;
    let poor_dir = staging.new_root().join(POOR);
    let kept = save_fitted(keep.kept, models, corpus, staging.new_root())?;
    let apart = save_fitted(keep.apart.iter().copied(), models, corpus, &poor_dir)?;
    let mut stats = Vec::new();
    for st in keep.stats {
        // A poor map's statistics go beside it, so that the mapper in use keeps the
        // statistics it was fitted from (learning adds to those).
        let is_poor = keep.apart.iter().any(|f| {
            f.source.sha256 == st.meta.source.sha256 && f.target.sha256 == st.meta.target.sha256
        });
        let home = if is_poor {
            poor_dir.clone()
        } else {
            staging.new_root().to_path_buf()
        };
        let at = saved_stats::stats_dir_in(&home, &st.meta.source, &st.meta.target);
        saved_stats::save(st, &at)?;
        stats.push(staging.stage(&at)?);
    }
    let mut place = |saved: Vec<Saved>| -> Result<Vec<Saved>, CalibrateError> {
        saved
            .into_iter()
            .map(|s| {
                staging.stage(&s.path.with_extension("json"))?;
                let path = staging.stage(&s.path)?;
                Ok(Saved { meta: s.meta, path })
            })
            .collect()
    };
    let kept = place(kept)?;
    let apart = place(apart)?;
    staging.commit()?;
    Ok(Kept { kept, apart, stats })
}

/// A staging directory in a mapper directory: things written under [`Self::new_root`]
/// at the paths they are to have under the mapper directory, then put there by
/// [`Self::commit`]. Dropped uncommitted, it is removed with everything in it.
pub struct Staging {
    dir: PathBuf,
    root: PathBuf,
    new: PathBuf,
    /// Staged paths, relative to the mapper directory.
    entries: Vec<PathBuf>,
}

/// A step of a commit, undone in reverse order when a later one fails.
enum Step {
    /// What was at `at` was moved (or, for a file, linked) to `aside`.
    Aside { at: PathBuf, aside: PathBuf },
    /// The staged `from` was renamed to `at`.
    Placed { from: PathBuf, at: PathBuf },
}

impl Staging {
    /// A fresh staging directory in `dir` (made if missing), named as no other writer's.
    pub fn new(dir: &Path) -> Result<Self, CalibrateError> {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let root = dir.join(format!(
            "{STAGING_PREFIX}{nanos}-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        let new = root.join("new");
        remove_stale_stagings(dir, STALE_STAGING);
        std::fs::create_dir(&root).map_err(|e| err(&root, e))?;
        let staging = Self {
            dir: dir.to_path_buf(),
            root,
            new,
            entries: Vec::new(),
        };
        std::fs::create_dir(&staging.new).map_err(|e| err(&staging.new, e))?;
        Ok(staging)
    }

    /// The directory standing for the mapper directory until the commit.
    pub fn new_root(&self) -> &Path {
        &self.new
    }

    /// Marks `staged` (a file or directory written under [`Self::new_root`]) to be put
    /// in place; the path it will have.
    pub fn stage(&mut self, staged: &Path) -> Result<PathBuf, CalibrateError> {
        let rel = staged
            .strip_prefix(&self.new)
            .map_err(|_| err(staged, "not in the staging directory"))?
            .to_path_buf();
        let at = self.dir.join(&rel);
        if !self.entries.contains(&rel) {
            self.entries.push(rel);
        }
        Ok(at)
    }

    /// Puts every staged path in place. Directories go first and artifacts last, so a
    /// reader that finds a new artifact finds the statistics beside it new too. On a
    /// failure every step taken is undone, and the staging directory goes either way.
    pub fn commit(mut self) -> Result<(), CalibrateError> {
        let rank = |rel: &PathBuf| {
            let is_dir = self.new.join(rel).is_dir();
            let artifact = rel.extension().is_some_and(|x| x == "safetensors");
            (!is_dir, artifact)
        };
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_by_key(|rel| rank(rel));
        let _lock = lock(&self.dir)?;
        let mut steps = Vec::new();
        let moved = entries.iter().try_for_each(|rel| self.put(rel, &mut steps));
        if let Err(e) = moved {
            undo(steps);
            return Err(e);
        }
        Ok(())
    }

    fn put(&self, rel: &Path, steps: &mut Vec<Step>) -> Result<(), CalibrateError> {
        let from = self.new.join(rel);
        let at = self.dir.join(rel);
        let aside = self.root.join("old").join(rel);
        for d in [at.parent(), aside.parent()].into_iter().flatten() {
            std::fs::create_dir_all(d).map_err(|e| err(d, e))?;
        }
        if let Ok(m) = std::fs::symlink_metadata(&at) {
            // A file is linked aside and replaced in one rename, so a reader never finds
            // it missing; a directory cannot be renamed over, so it steps aside first.
            let linked = m.is_file() && std::fs::hard_link(&at, &aside).is_ok();
            if !linked {
                std::fs::rename(&at, &aside).map_err(|e| err(&at, e))?;
            }
            steps.push(Step::Aside {
                at: at.clone(),
                aside,
            });
        }
        std::fs::rename(&from, &at).map_err(|e| err(&at, e))?;
        steps.push(Step::Placed { from, at });
        Ok(())
    }
}

/// How old a staging directory must be to count as a killed writer's: a live one exists
/// only while its calibration writes and commits, seconds to a minute or two.
const STALE_STAGING: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the staging directories that writers killed before they finished left in
/// `dir`, judged by age so that a live writer's (this host's or another's on a shared
/// filesystem) is never touched. Failing to remove one is only logged.
fn remove_stale_stagings(dir: &Path, older_than: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(STAGING_PREFIX) {
            continue;
        }
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= older_than);
        let path = entry.path();
        if stale && entry.file_type().is_ok_and(|t| t.is_dir()) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(dir = %path.display(), "removed a killed calibration's staging")
                }
                Err(e) => {
                    tracing::warn!(dir = %path.display(), "could not remove a killed calibration's staging: {e}")
                }
            }
        }
    }
}

/// Moves back what `steps` moved, newest first.
fn undo(steps: Vec<Step>) {
    for step in steps.into_iter().rev() {
        let (from, to) = match &step {
            Step::Placed { from, at } => (at, from),
            Step::Aside { at, aside } => (aside, at),
        };
        if let Err(e) = std::fs::rename(from, to) {
            tracing::error!(
                from = %from.display(),
                to = %to.display(),
                "could not move back a file of an interrupted calibration commit: {e}"
            );
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.root.display(), "could not remove staging: {e}");
            }
        }
    }
}

/// An exclusive lock of the directory itself, held while the handle lives.
#[cfg(unix)]
fn lock(dir: &Path) -> Result<std::fs::File, CalibrateError> {
    let f = std::fs::File::open(dir).map_err(|e| err(dir, e))?;
    f.lock().map_err(|e| err(dir, e))?;
    Ok(f)
}

/// Elsewhere a directory cannot be opened as a file: commits are not ordered.
#[cfg(not(unix))]
fn lock(_dir: &Path) -> Result<(), CalibrateError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                if p.is_dir() {
                    out.push((rel + "/", Vec::new()));
                    stack.push(p);
                } else {
                    out.push((rel, std::fs::read(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn previous(dir: &Path) {
        write(&dir.join("m.safetensors"), "old artifact");
        write(&dir.join("m.json"), "old json");
        write(&dir.join("stats/m/keys.safetensors"), "old keys");
        write(&dir.join("stats/m/meta.json"), "old meta");
    }

    #[test]
    fn a_commit_replaces_files_and_directories_whole_and_leaves_no_staging() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let mut s = Staging::new(dir.path()).unwrap();
        let new = s.new_root().to_path_buf();
        write(&new.join("m.safetensors"), "new artifact");
        write(&new.join("stats/m/values.safetensors"), "new values");
        write(&new.join("poor/p.safetensors"), "poor");
        for p in ["m.safetensors", "stats/m", "poor/p.safetensors"] {
            s.stage(&new.join(p)).unwrap();
        }
        s.commit().unwrap();
        let names: Vec<String> = tree(dir.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "m.json",
                "m.safetensors",
                "poor/",
                "poor/p.safetensors",
                "stats/",
                "stats/m/",
                "stats/m/values.safetensors"
            ]
        );
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("m.safetensors"), "new artifact");
        assert_eq!(read("m.json"), "old json", "what was not staged stays");
    }

    #[test]
    fn a_failed_rename_moves_back_what_was_already_moved() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let before = tree(dir.path());
        let mut s = Staging::new(dir.path()).unwrap();
        let new = s.new_root().to_path_buf();
        write(&new.join("stats/m/keys.safetensors"), "new keys");
        write(&new.join("m.safetensors"), "new artifact");
        s.stage(&new.join("stats/m")).unwrap();
        s.stage(&new.join("m.safetensors")).unwrap();
        // The artifact's staged file vanishes: its rename, the last step, fails after
        // the statistics were moved.
        std::fs::remove_file(new.join("m.safetensors")).unwrap();
        assert!(s.commit().is_err());
        assert_eq!(tree(dir.path()), before);
    }

    #[test]
    fn a_killed_writers_staging_goes_once_old_and_a_young_one_stays() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(format!("{STAGING_PREFIX}1-999999-0"));
        std::fs::create_dir_all(old.join("new")).unwrap();
        write(&old.join("new/keys.safetensors"), "half");
        let keep = dir.path().join("mapper.safetensors");
        write(&keep, "in use");
        // Young: a writer may still be at work in it.
        remove_stale_stagings(dir.path(), std::time::Duration::from_secs(3600));
        assert!(old.exists());
        remove_stale_stagings(dir.path(), std::time::Duration::ZERO);
        assert!(!old.exists());
        assert!(keep.exists(), "only staging directories are removed");
    }

    #[test]
    fn a_staging_dropped_uncommitted_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let before = tree(dir.path());
        {
            let s = Staging::new(dir.path()).unwrap();
            write(&s.new_root().join("m.safetensors"), "new");
        }
        assert_eq!(tree(dir.path()), before);
    }
}

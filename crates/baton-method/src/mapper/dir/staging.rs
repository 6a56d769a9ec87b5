//! Every write into a mapper directory: a calibration's artifacts and statistics, a
//! learned shard, a gate's line. What is written goes first into a staging directory of
//! its own inside the mapper directory (the same filesystem), at the path it is to have
//! there, and is moved into place by renames only once all of it is written. A write
//! that fails part way (a full disk) leaves the directory exactly as it was; so does a
//! rename that fails, once what it had moved is moved back.
//!
//! Each writer stages under a name no other writer uses (time, process, count), and
//! keeps a lock file in its staging directory locked while it lives: the operating
//! system drops that lock when a writer dies however it dies, so a staging directory
//! whose lock can be taken is a dead writer's and can go, and a live one's (this host's
//! or another's on a shared filesystem) is never touched. One commit's renames run
//! under an exclusive lock of the mapper directory, so two finishing at once cannot
//! pair one's artifact with the other's statistics.

use super::{DirError, MapperDir};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// How a staging directory's name begins (a leading dot keeps it out of listings).
const PREFIX: &str = ".staging-";
/// What earlier versions named a calibration's staging directory.
const LEGACY_PREFIX: &str = ".calibration-";
/// A legacy shard write's folder or file in a shards folder ends so.
const LEGACY_PARTIAL: &str = ".partial";
const LOCK: &str = "writer.lock";
/// A staging directory's lock is taken a moment after it is made: younger than this,
/// an unlocked one may be a writer that has not locked it yet.
const FRESH: Duration = Duration::from_secs(60);
/// Writers of earlier versions held no lock: their leftovers go by age, past the
/// longest such a write took.
const LEGACY: Duration = Duration::from_secs(3600);

/// A staging directory in a mapper directory. Files are written under
/// [`Self::new_root`], named as they are to be named in the mapper directory, marked
/// with [`Self::stage`], then put in place by [`Self::commit`]. Dropped uncommitted, it
/// is removed with everything in it.
pub struct Staging {
    dir: PathBuf,
    root: PathBuf,
    new: MapperDir,
    /// Staged paths, relative to the mapper directory.
    entries: Vec<PathBuf>,
    /// Paths to take out of the mapper directory at the commit, relative to it.
    removals: Vec<PathBuf>,
    _lock: File,
}

/// A step of a commit, undone in reverse order when a later one fails.
enum Step {
    /// What was at `at` was moved (or, for a file, linked) to `aside`.
    Aside { at: PathBuf, aside: PathBuf },
    /// The staged `from` was renamed to `at`.
    Placed { from: PathBuf, at: PathBuf },
}

fn write_err(path: &Path, e: impl std::fmt::Display) -> DirError {
    DirError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// A name no other writer picks: the time to the nanosecond (so names sort by age), the
/// process, and a count within it.
pub fn unique_name() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{nanos:020}-{}-{}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

impl Staging {
    /// A fresh staging directory in `dir` (made if missing), locked while this lives.
    pub(super) fn new(dir: &MapperDir) -> Result<Self, DirError> {
        let path = dir.path();
        std::fs::create_dir_all(path).map_err(|e| dir.not_writable(e))?;
        dir.clear_leftovers();
        let root = path.join(format!("{PREFIX}{}", unique_name()));
        std::fs::create_dir(&root).map_err(|e| dir.not_writable(e))?;
        let lock = File::create(root.join(LOCK)).and_then(|f| f.lock().map(|()| f));
        let lock = match lock {
            Ok(l) => l,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&root);
                return Err(write_err(&root, e));
            }
        };
        let staging = Self {
            dir: path.to_path_buf(),
            new: MapperDir {
                path: root.join("new"),
                named: dir.named,
            },
            root,
            entries: Vec::new(),
            removals: Vec::new(),
            _lock: lock,
        };
        std::fs::create_dir(staging.new.path()).map_err(|e| write_err(staging.new.path(), e))?;
        Ok(staging)
    }

    /// The mapper directory as it will be: name what is to be written through it.
    pub fn new_root(&self) -> &MapperDir {
        &self.new
    }

    /// Marks `staged` (a file or directory written under [`Self::new_root`]) to be put
    /// in place; the path it will have.
    pub fn stage(&mut self, staged: &Path) -> Result<PathBuf, DirError> {
        let rel = staged
            .strip_prefix(self.new.path())
            .map_err(|_| write_err(staged, "not in the staging directory"))?
            .to_path_buf();
        let at = self.dir.join(&rel);
        if !self.entries.contains(&rel) {
            self.entries.push(rel);
        }
        Ok(at)
    }

    /// Writes `bytes` as `at` (a path named through [`Self::new_root`]) and stages it.
    pub fn write(&mut self, at: &Path, bytes: &[u8]) -> Result<PathBuf, DirError> {
        if let Some(parent) = at.parent() {
            std::fs::create_dir_all(parent).map_err(|e| write_err(parent, e))?;
        }
        std::fs::write(at, bytes).map_err(|e| write_err(at, e))?;
        self.stage(at)
    }

    /// Marks `at`, a file or folder of the mapper directory, to be taken out of it at the
    /// commit: moved aside under the directory's lock, with the commit's other steps, and
    /// gone with the staging directory.
    pub fn remove(&mut self, at: &Path) -> Result<(), DirError> {
        let rel = at
            .strip_prefix(&self.dir)
            .map_err(|_| write_err(at, "not in the mapper directory"))?
            .to_path_buf();
        if !self.removals.contains(&rel) {
            self.removals.push(rel);
        }
        Ok(())
    }

    /// Puts every staged path in place. Directories go first and artifacts last, so a
    /// reader that finds a new artifact finds the statistics beside it new too. Files
    /// are on disk before they are renamed, so a crash after the commit loses nothing.
    /// On a failure every step taken is undone; the staging directory goes either way.
    pub fn commit(mut self) -> Result<(), DirError> {
        let rank = |rel: &PathBuf| {
            let is_dir = self.new.path().join(rel).is_dir();
            let artifact = rel.extension().is_some_and(|x| x == super::ARTIFACT_EXT);
            (!is_dir, artifact)
        };
        let mut entries = std::mem::take(&mut self.entries);
        entries.sort_by_key(|rel| rank(rel));
        for rel in &entries {
            let from = self.new.path().join(rel);
            if from.is_file() {
                File::open(&from)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| write_err(&from, e))?;
            }
        }
        let _lock = lock(&self.dir)?;
        let mut steps = Vec::new();
        let moved = entries
            .iter()
            .try_for_each(|rel| self.put(rel, &mut steps))
            .and_then(|()| {
                let removals = std::mem::take(&mut self.removals);
                removals
                    .iter()
                    .try_for_each(|rel| self.take_out(rel, &mut steps))
            });
        if let Err(e) = moved {
            undo(steps);
            return Err(e);
        }
        // A rename is durable once its folder is; a failure here leaves every file in
        // place for every reader, so it is logged rather than reported as lost.
        let mut folders: Vec<PathBuf> = entries
            .iter()
            .filter_map(|rel| self.dir.join(rel).parent().map(Path::to_path_buf))
            .collect();
        folders.dedup();
        for f in folders {
            if let Err(e) = File::open(&f).and_then(|f| f.sync_all()) {
                tracing::warn!("could not flush {}: {e}", f.display());
            }
        }
        Ok(())
    }

    fn put(&self, rel: &Path, steps: &mut Vec<Step>) -> Result<(), DirError> {
        let from = self.new.path().join(rel);
        let at = self.dir.join(rel);
        let aside = self.root.join("old").join(rel);
        for d in [at.parent(), aside.parent()].into_iter().flatten() {
            std::fs::create_dir_all(d).map_err(|e| write_err(d, e))?;
        }
        if let Ok(m) = std::fs::symlink_metadata(&at) {
            // A file is linked aside and replaced in one rename, so a reader never finds
            // it missing; a directory cannot be renamed over, so it steps aside first.
            let linked = m.is_file() && std::fs::hard_link(&at, &aside).is_ok();
            if !linked {
                std::fs::rename(&at, &aside).map_err(|e| write_err(&at, e))?;
            }
            steps.push(Step::Aside {
                at: at.clone(),
                aside,
            });
        }
        std::fs::rename(&from, &at).map_err(|e| write_err(&at, e))?;
        steps.push(Step::Placed { from, at });
        Ok(())
    }
}

impl Staging {
    fn take_out(&self, rel: &Path, steps: &mut Vec<Step>) -> Result<(), DirError> {
        let at = self.dir.join(rel);
        if std::fs::symlink_metadata(&at).is_err() {
            return Ok(());
        }
        let aside = self.root.join("old").join(rel);
        if let Some(d) = aside.parent() {
            std::fs::create_dir_all(d).map_err(|e| write_err(d, e))?;
        }
        std::fs::rename(&at, &aside).map_err(|e| write_err(&at, e))?;
        steps.push(Step::Aside { at, aside });
        Ok(())
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
                "could not move back a file of an interrupted commit: {e}"
            );
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Still locked while it goes: no writer takes it for a dead one's meanwhile.
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.root.display(), "could not remove staging: {e}");
            }
        }
    }
}

/// An exclusive lock of the directory itself, held while the handle lives.
#[cfg(unix)]
fn lock(dir: &Path) -> Result<File, DirError> {
    let f = File::open(dir).map_err(|e| write_err(dir, e))?;
    f.lock().map_err(|e| write_err(dir, e))?;
    Ok(f)
}

/// Elsewhere a directory cannot be opened as a file: commits are not ordered.
#[cfg(not(unix))]
fn lock(_dir: &Path) -> Result<(), DirError> {
    Ok(())
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|d| d > age)
}

/// Whether `dir`, a write's own folder with a lock file, is one no live writer holds.
fn abandoned(dir: &Path) -> bool {
    let lock = dir.join(LOCK);
    match File::open(&lock) {
        // The lock is taken (and dropped with the file) only to learn that no one holds it.
        Ok(f) => f.try_lock().is_ok() && older_than(&lock, FRESH),
        // Killed between making the folder and its lock.
        Err(_) => older_than(dir, FRESH),
    }
}

/// Removes what dead writers left directly in `folder`: staging directories no live
/// writer holds, and what earlier versions' writers left (by age). How many entries.
pub(super) fn remove_leftovers(folder: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let dead = if kind.is_dir() && (name.starts_with(PREFIX) || name.ends_with(LEGACY_PARTIAL))
        {
            abandoned(&path)
        } else if kind.is_dir() && name.starts_with(LEGACY_PREFIX) {
            older_than(&path, LEGACY)
        } else {
            kind.is_file()
                && (name.ends_with(LEGACY_PARTIAL) || name.starts_with(".tmp"))
                && older_than(&path, LEGACY)
        };
        let gone = dead
            && if kind.is_dir() {
                std::fs::remove_dir_all(&path).is_ok()
            } else {
                std::fs::remove_file(&path).is_ok()
            };
        if gone {
            tracing::info!(
                "removed {}, left by a write that never ended",
                path.display()
            );
            removed += 1;
        }
    }
    removed
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
        let mut s = MapperDir::named(dir.path()).stage().unwrap();
        let new = s.new_root().path().to_path_buf();
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
    fn a_removal_takes_a_folder_out_at_the_commit_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let mut s = MapperDir::named(dir.path()).stage().unwrap();
        s.remove(&dir.path().join("stats/m")).unwrap();
        s.remove(&dir.path().join("not-there")).unwrap();
        assert!(
            s.remove(Path::new("/elsewhere")).is_err(),
            "only the directory's own"
        );
        assert!(
            dir.path().join("stats/m/keys.safetensors").is_file(),
            "not yet"
        );
        s.commit().unwrap();
        let names: Vec<String> = tree(dir.path()).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["m.json", "m.safetensors", "stats/"]);
    }

    #[test]
    fn a_failed_rename_moves_back_what_was_already_moved() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let before = tree(dir.path());
        let mut s = MapperDir::named(dir.path()).stage().unwrap();
        let new = s.new_root().path().to_path_buf();
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
    fn a_staging_dropped_uncommitted_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        previous(dir.path());
        let before = tree(dir.path());
        {
            let mut s = MapperDir::named(dir.path()).stage().unwrap();
            let at = s.new_root().path().join("m.safetensors");
            s.write(&at, b"new").unwrap();
        }
        assert_eq!(tree(dir.path()), before);
    }

    fn age(path: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        let f = File::options().write(true).open(path).unwrap();
        f.set_modified(t).unwrap();
    }

    #[test]
    fn a_dead_writers_staging_goes_and_a_live_ones_stays() {
        let dir = tempfile::tempdir().unwrap();
        let mapper_dir = MapperDir::named(dir.path());
        let live = mapper_dir.stage().unwrap();
        let dead = dir
            .path()
            .join(format!("{PREFIX}00000000000000000001-999999-0"));
        std::fs::create_dir_all(dead.join("new")).unwrap();
        write(&dead.join("new/keys.safetensors"), "half");
        write(&dead.join(LOCK), "");
        // Unlocked but young: its writer may not have locked it yet.
        assert_eq!(remove_leftovers(dir.path()), 0);
        age(&dead.join(LOCK), 120);
        age(&live.root.join(LOCK), 120);
        let legacy = dir.path().join(format!("{LEGACY_PREFIX}1-2-0"));
        std::fs::create_dir_all(&legacy).unwrap();
        let kept = dir.path().join("mapper.safetensors");
        write(&kept, "in use");
        assert_eq!(remove_leftovers(dir.path()), 1, "the dead one alone");
        assert!(!dead.exists() && live.root.exists() && legacy.exists() && kept.exists());
        drop(live);
    }

    #[test]
    fn leftovers_of_earlier_versions_go_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path();
        let old = [".tmpQwErTy", ".0001-7-0.partial"].map(|n| folder.join(n));
        let young = [".tmpAsDfGh", ".0002-7-0.partial"].map(|n| folder.join(n));
        for p in old.iter().chain(&young) {
            write(p, "half");
        }
        for p in &old {
            age(p, 2 * 3600);
        }
        let kept = folder.join("notes.tmp");
        write(&kept, "not a write's");
        age(&kept, 2 * 3600);
        assert_eq!(remove_leftovers(folder), 2);
        assert!(old.iter().all(|p| !p.exists()) && young.iter().all(|p| p.exists()));
        assert!(kept.exists());
    }
}

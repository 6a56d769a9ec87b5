//! Where a shard is written before it is renamed into place, and what a killed writer
//! leaves there. Each write gets a folder of its own beside the shards,
//! `.<name>.partial/`, holding a lock file the writer keeps locked until the shard is
//! in place: the writer's temporary files (the safetensors writer adds one of its own)
//! all land in that folder, and the operating system drops the lock when the writer
//! dies however it dies, so a folder whose lock can be taken is a dead writer's and can
//! go. Writers learning at once into one directory each keep theirs locked, so a start
//! never removes a live writer's files.
//!
//! Earlier versions wrote in the shard folder itself (`.<name>.partial` and the
//! safetensors writer's `.tmpXXXXXX`); such files, past an hour old, are no live write's.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const PARTIAL: &str = ".partial";
const LOCK: &str = "writer.lock";
/// A folder's lock is taken a moment after the folder is made: younger than this, an
/// unlocked folder may be a writer that has not locked it yet.
const FRESH: Duration = Duration::from_secs(60);
/// Loose files of earlier versions' writes took seconds to write.
const LEGACY: Duration = Duration::from_secs(3600);

/// A write's own folder, locked while this lives and removed with it.
pub(super) struct Staging {
    dir: PathBuf,
    _lock: File,
}

impl Staging {
    /// The folder for the shard `name` in `folder`, made and locked.
    pub(super) fn new(folder: &Path, name: &str) -> std::io::Result<Self> {
        let dir = folder.join(format!(".{name}{PARTIAL}"));
        std::fs::create_dir(&dir)?;
        let lock = File::create(dir.join(LOCK)).and_then(|f| f.lock().map(|()| f));
        match lock {
            Ok(lock) => Ok(Self { dir, _lock: lock }),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// `file` inside the folder.
    pub(super) fn join(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Still locked while it goes: no start takes it for a dead writer's meanwhile.
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("could not remove {}: {e}", self.dir.display());
        }
    }
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|d| d > age)
}

/// Whether `dir` is a write folder no live writer holds.
fn abandoned(dir: &Path) -> bool {
    let lock = dir.join(LOCK);
    match File::open(&lock) {
        // The lock is taken (and dropped with the file) only to learn that no one holds it.
        Ok(f) => f.try_lock().is_ok() && older_than(&lock, FRESH),
        // Killed between making the folder and its lock.
        Err(_) => older_than(dir, FRESH),
    }
}

/// Removes what dead writers left in the shard folder `folder`; how many entries.
/// Shards themselves, and what a live writer holds, are left.
pub fn remove_leftovers(folder: &Path) -> usize {
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
        let gone = if kind.is_dir() && name.ends_with(PARTIAL) {
            abandoned(&path) && std::fs::remove_dir_all(&path).is_ok()
        } else if kind.is_file()
            && (name.ends_with(PARTIAL) || name.starts_with(".tmp"))
            && older_than(&path, LEGACY)
        {
            std::fs::remove_file(&path).is_ok()
        } else {
            false
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

    fn age(path: &Path, by: Duration) {
        let f = File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - by).unwrap();
    }

    #[test]
    fn a_dead_writers_folder_goes_and_a_live_ones_stays() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path();
        let shard = folder.join("0001-1-0.safetensors");
        std::fs::write(&shard, b"a shard").unwrap();
        let live = Staging::new(folder, "0002-1-0").unwrap();
        std::fs::write(live.join(".tmpAbC123"), b"half").unwrap();
        age(&live.join(LOCK), 2 * FRESH);
        // A writer killed mid-write: its folder and lock file stay, unlocked.
        let dead = folder.join(".0003-9-0.partial");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(".tmpXyZ789"), vec![0u8; 4096]).unwrap();
        std::fs::write(dead.join(LOCK), b"").unwrap();
        age(&dead.join(LOCK), 2 * FRESH);
        // One that has only just made its folder and not locked it yet.
        let starting = folder.join(".0004-9-0.partial");
        std::fs::create_dir(&starting).unwrap();
        std::fs::write(starting.join(LOCK), b"").unwrap();

        assert_eq!(remove_leftovers(folder), 1);
        assert!(!dead.exists());
        assert!(live.join(".tmpAbC123").is_file() && starting.is_dir() && shard.is_file());
        let live_dir = live.join("");
        drop(live);
        assert!(!live_dir.exists(), "a write's folder goes with it");
    }

    #[test]
    fn loose_files_of_earlier_writers_go_once_old() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path();
        let old = [".tmpQwErTy", ".0001-7-0.partial"].map(|n| folder.join(n));
        let new = [".tmpAsDfGh", ".0002-7-0.partial"].map(|n| folder.join(n));
        for p in old.iter().chain(&new) {
            std::fs::write(p, b"half a shard").unwrap();
        }
        for p in &old {
            age(p, 2 * LEGACY);
        }
        let kept = folder.join("notes.tmp");
        std::fs::write(&kept, b"not ours").unwrap();
        age(&kept, 2 * LEGACY);
        assert_eq!(remove_leftovers(folder), 2);
        assert!(old.iter().all(|p| !p.exists()));
        assert!(new.iter().all(|p| p.exists()) && kept.exists());
    }
}

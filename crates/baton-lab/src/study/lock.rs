//! One run at a time per shard of an output directory. Two runs of the same items would
//! each run every one, and the second's renames would replace the first's sessions; a
//! run therefore holds an advisory lock on `<out>/.shard-<index>-of-<count>.lock`, which
//! the operating system releases when the process ends however it ends, so a lock file
//! left by a killed run blocks nothing. The file holds its holder's pid and host, to name
//! it in the refusal.
//!
//! Shards of one count never share an item, so they run at once; a run with another
//! count shares items with them, so it is refused while any of them runs (each run locks
//! its own file before it looks at the others', so of two starting together at least the
//! later one sees the earlier).

use super::plan::Shard;
use super::StudyError;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

const PREFIX: &str = ".shard-";
const SUFFIX: &str = ".lock";

/// A shard's lock, held until dropped.
#[derive(Debug)]
pub struct ShardLock {
    _file: File,
    path: PathBuf,
}

impl ShardLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn lock_name(shard: Shard) -> String {
    format!("{PREFIX}{}-of-{}{SUFFIX}", shard.index, shard.count)
}

/// The shard a lock file's name says, if it is one.
fn shard_of(name: &str) -> Option<Shard> {
    let (index, count) = name
        .strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)?
        .split_once("-of-")?;
    Shard::new(index.parse().ok()?, count.parse().ok()?).ok()
}

/// Who holds a lock, as its file says.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.rewind().and_then(|_| file.read_to_string(&mut text));
    match text.trim() {
        // Locked, and not written yet: the holder has only just started.
        "" => "a run that has just started".into(),
        t => t.to_string(),
    }
}

/// This process, as a lock file names it.
fn me() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    match host {
        Some(h) => format!("pid {} on {h}", std::process::id()),
        None => format!("pid {}", std::process::id()),
    }
}

/// Takes `shard`'s lock in `out` (which must exist), or says who runs it, or which run of
/// another shard count shares its items.
pub fn acquire(out: &Path, shard: Shard) -> Result<ShardLock, StudyError> {
    let path = out.join(lock_name(shard));
    let write = |e: std::io::Error| StudyError::Write {
        path: path.clone(),
        source: e,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(write)?;
    if !try_lock(&file, &path)? {
        // Another run looking at this lock (below) holds it a moment: look once more.
        std::thread::sleep(Duration::from_millis(100));
        if !try_lock(&file, &path)? {
            return Err(running(out, name(shard), holder(&mut file), &path));
        }
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", me()))
        .and_then(|()| file.flush())
        .map_err(write)?;
    let lock = ShardLock {
        _file: file,
        path: path.clone(),
    };
    for (other, other_path) in lock_files(out)? {
        if other.count == shard.count {
            continue;
        }
        let Ok(mut f) = File::open(&other_path) else {
            continue;
        };
        match f.try_lock_shared() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let what = format!("{} (which shares items with {})", name(other), name(shard));
                return Err(running(out, what, holder(&mut f), &other_path));
            }
            Err(TryLockError::Error(e)) => {
                return Err(StudyError::Io {
                    path: other_path,
                    source: e,
                })
            }
        }
    }
    Ok(lock)
}

/// Whether the lock was taken; an error that is not another holder is one.
fn try_lock(file: &File, path: &Path) -> Result<bool, StudyError> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(StudyError::Write {
            path: path.to_path_buf(),
            source: e,
        }),
    }
}

fn name(shard: Shard) -> String {
    format!("{}/{}", shard.index, shard.count)
}

fn running(out: &Path, shard: String, holder: String, lock: &Path) -> StudyError {
    StudyError::Running {
        dir: out.to_path_buf(),
        shard,
        holder,
        lock: lock.to_path_buf(),
    }
}

/// The shard lock files in `out`.
fn lock_files(out: &Path) -> Result<Vec<(Shard, PathBuf)>, StudyError> {
    let entries = std::fs::read_dir(out).map_err(|e| StudyError::Io {
        path: out.to_path_buf(),
        source: e,
    })?;
    Ok(entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let shard = shard_of(e.file_name().to_str()?)?;
            Some((shard, e.path()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(i: usize, n: usize) -> Shard {
        Shard::new(i, n).unwrap()
    }

    #[test]
    fn a_second_run_of_a_shard_is_refused_naming_the_first_and_runs_once_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let first = acquire(dir.path(), Shard::WHOLE).unwrap();
        let e = acquire(dir.path(), Shard::WHOLE).unwrap_err().to_string();
        let pid = format!("pid {}", std::process::id());
        assert!(
            e.contains(&pid) && e.contains("shard 0/1") && e.contains("another --out"),
            "{e}"
        );
        drop(first);
        // The file stays, naming a process that no longer holds it: no obstacle.
        assert!(dir.path().join(".shard-0-of-1.lock").is_file());
        acquire(dir.path(), Shard::WHOLE).unwrap();
    }

    #[test]
    fn a_lock_file_left_by_a_dead_run_blocks_nothing_and_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".shard-1-of-2.lock");
        std::fs::write(&path, "pid 4000000 on elsewhere\n").unwrap();
        let lock = acquire(dir.path(), shard(1, 2)).unwrap();
        assert_eq!(lock.path(), path);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn shards_of_one_count_run_together_and_another_count_waits_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let a = acquire(dir.path(), shard(0, 2)).unwrap();
        let b = acquire(dir.path(), shard(1, 2)).unwrap();
        let e = acquire(dir.path(), shard(0, 3)).unwrap_err().to_string();
        assert!(e.contains("shard 0/2") || e.contains("shard 1/2"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        // The refused run keeps no lock of its own.
        drop(b);
        drop(a);
        acquire(dir.path(), shard(0, 3)).unwrap();
    }

    #[test]
    fn only_shard_lock_names_are_read_as_shards() {
        assert_eq!(shard_of(".shard-2-of-5.lock"), Some(shard(2, 5)));
        for name in [
            ".shard-5-of-5.lock",
            ".shard-x-of-5.lock",
            "shard-0-of-1.lock",
            ".shard-0-of-1.lock.partial",
        ] {
            assert_eq!(shard_of(name), None, "{name}");
        }
    }
}

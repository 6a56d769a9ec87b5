//! `baton fetch --verify`: hash again what the cache holds, whatever its stamps say.
//!
//! A normal start trusts a file's `<file>.verified` stamp while the file's size and
//! modification time are unchanged, so a 1 GB model is not hashed at every start; a file
//! damaged without either changing would go unnoticed. Verifying reads every byte: a
//! file is compared with its manifest digest (or, for a hub download without a pinned
//! digest, with the digest computed when it was downloaded), a data tree file by file
//! with its `MANIFEST.sha256`. What no longer matches is removed and fetched again.

use super::checksum::{self, read_sidecar, sha256_file};
use super::{ensure_in, entry_path_in, Entry, FetchError, FetchProgress, Source};
use std::fs;
use std::path::{Path, PathBuf};

/// What verifying one entry found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// Every byte matches.
    Intact { path: PathBuf },
    /// Something did not match (named) and the entry was fetched again.
    Refetched { path: PathBuf, problem: String },
    /// Not in the cache: nothing to verify.
    Absent { path: PathBuf },
}

/// Verifies `entry` under `root`, fetching it again if it is damaged.
pub fn verify_in(
    root: &Path,
    entry: &Entry,
    progress: &dyn FetchProgress,
) -> Result<Verified, FetchError> {
    let path = entry_path_in(root, entry);
    if !path.exists() {
        return Ok(Verified::Absent { path });
    }
    progress.message(&format!("verifying {}", path.display()));
    let problem = if entry.is_tree() {
        tree_problem(&path, progress)?
    } else {
        file_problem(&path, entry, progress)?
    };
    let Some(problem) = problem else {
        return Ok(Verified::Intact { path });
    };
    tracing::warn!("{}: {problem}; fetching it again", path.display());
    progress.message(&format!(
        "{}: {problem}; removed, fetching it again",
        path.display()
    ));
    if entry.is_tree() {
        fs::remove_dir_all(&path).map_err(|e| FetchError::io("cannot remove", &path, e))?;
    } else {
        checksum::remove_with_sidecar(&path);
    }
    let fetched = ensure_in(root, entry, progress)?;
    Ok(Verified::Refetched {
        path: fetched.path,
        problem,
    })
}

/// Why the file does not match, or `None`; a match renews its stamp.
fn file_problem(
    path: &Path,
    entry: &Entry,
    progress: &dyn FetchProgress,
) -> Result<Option<String>, FetchError> {
    let (sha, _) = sha256_file(path, progress)?;
    let mut accepted: Vec<String> = entry
        .accepted_sha256()
        .into_iter()
        .map(str::to_string)
        .collect();
    let stamp = read_sidecar(path);
    // An unpinned hub download has only the digest computed from its bytes on arrival.
    if let Some(sc) = stamp.as_ref().filter(|sc| sc.unpinned) {
        if entry.sources.iter().any(Source::is_unpinned) {
            accepted.push(sc.sha256.clone());
        }
    }
    if !accepted.contains(&sha) {
        return Ok(Some(format!(
            "sha256 {sha} is not the expected {}",
            accepted.join(" or ")
        )));
    }
    let source = stamp
        .as_ref()
        .map(|sc| sc.source.clone())
        .unwrap_or_else(|| "local file".into());
    let unpinned = stamp.is_some_and(|sc| sc.unpinned && sc.sha256 == sha);
    checksum::write_sidecar(path, &sha, &source, unpinned)?;
    Ok(None)
}

/// Why the tree does not match its `MANIFEST.sha256`, or `None`.
fn tree_problem(dir: &Path, progress: &dyn FetchProgress) -> Result<Option<String>, FetchError> {
    let list = dir.join("MANIFEST.sha256");
    let Ok(text) = fs::read_to_string(&list) else {
        return Ok(Some("its MANIFEST.sha256 is missing".into()));
    };
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let Some((want, rel)) = line.split_once("  ") else {
            return Ok(Some(format!("MANIFEST.sha256 line {} is malformed", n + 1)));
        };
        let file = dir.join(rel);
        if !file.is_file() {
            return Ok(Some(format!("{rel} is missing")));
        }
        let (have, _) = sha256_file(&file, progress)?;
        if have != want {
            return Ok(Some(format!("{rel} has sha256 {have}, not {want}")));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, SilentProgress};

    const HELLO: &[u8] = b"hello\n";
    const HELLO_SHA: &str = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";

    fn entry(file: Option<&str>) -> Entry {
        Entry {
            name: "thing".into(),
            kind: Kind::Data,
            description: String::new(),
            file: file.map(str::to_string),
            size: None,
            sha256: HELLO_SHA.into(),
            sources: vec![],
        }
    }

    #[test]
    fn an_intact_file_is_intact_and_a_missing_one_absent() {
        let root = tempfile::tempdir().unwrap();
        let e = entry(Some("hello.txt"));
        let p = entry_path_in(root.path(), &e);
        assert!(matches!(
            verify_in(root.path(), &e, &SilentProgress),
            Ok(Verified::Absent { .. })
        ));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, HELLO).unwrap();
        let v = verify_in(root.path(), &e, &SilentProgress).unwrap();
        assert_eq!(v, Verified::Intact { path: p.clone() });
        assert_eq!(
            read_sidecar(&p).map(|s| s.sha256),
            Some(HELLO_SHA.to_string())
        );
    }

    #[test]
    fn a_file_damaged_behind_a_valid_stamp_is_caught() {
        let root = tempfile::tempdir().unwrap();
        let e = entry(Some("hello.txt"));
        let p = entry_path_in(root.path(), &e);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, HELLO).unwrap();
        checksum::write_sidecar(&p, HELLO_SHA, "test", false).unwrap();
        // Same size, same modification time: the stamp still looks valid.
        let mtime = fs::metadata(&p).unwrap().modified().unwrap();
        fs::write(&p, b"jello\n").unwrap();
        fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert!(checksum::trusted_sidecar(&p, &[HELLO_SHA], false).is_some());
        // With no source to fetch from, the damage is named in the fetch error.
        let err = verify_in(root.path(), &e, &SilentProgress)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.is_some(),
            "a damaged file with no source cannot come back as intact"
        );
        assert!(!p.exists(), "the damaged file is removed");
    }

    #[test]
    fn a_tree_is_checked_file_by_file() {
        let root = tempfile::tempdir().unwrap();
        let e = entry(None);
        let dir = entry_path_in(root.path(), &e);
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/a.txt"), HELLO).unwrap();
        fs::write(
            dir.join("MANIFEST.sha256"),
            format!("{HELLO_SHA}  sub/a.txt\n"),
        )
        .unwrap();
        assert_eq!(tree_problem(&dir, &SilentProgress).unwrap(), None);
        fs::write(dir.join("sub/a.txt"), b"jello\n").unwrap();
        let p = tree_problem(&dir, &SilentProgress)
            .unwrap()
            .unwrap_or_default();
        assert!(p.contains("sub/a.txt has sha256"), "{p}");
        fs::remove_file(dir.join("sub/a.txt")).unwrap();
        let p = tree_problem(&dir, &SilentProgress)
            .unwrap()
            .unwrap_or_default();
        assert!(p.contains("sub/a.txt is missing"), "{p}");
    }
}

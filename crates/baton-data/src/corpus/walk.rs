//! The files named text inputs stand for: files as given, directories walked for the
//! files this reads. A directory is entered once however many ways lead to it (a
//! symbolic link back to a parent made the walk endless), and a file reached twice is
//! read once.

use super::{supported, CorpusError};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn io(path: &Path, source: std::io::Error) -> CorpusError {
    CorpusError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What the walk has met, by canonical path.
#[derive(Default)]
struct Seen {
    dirs: HashSet<PathBuf>,
    files: HashSet<PathBuf>,
}

impl Seen {
    fn first(set: &mut HashSet<PathBuf>, path: &Path) -> Result<bool, CorpusError> {
        let real = std::fs::canonicalize(path).map_err(|e| io(path, e))?;
        Ok(set.insert(real))
    }
}

/// Files as given, and directories walked recursively for supported files, each named
/// directory's files in sorted order (so a corpus and its fingerprint are reproducible).
pub fn expand_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    let mut seen = Seen::default();
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                CorpusError::NotText {
                    path: p.clone(),
                    reason: "does not exist".into(),
                }
            } else {
                io(p, e)
            }
        })?;
        if meta.is_dir() {
            let mut found = walk(p, &mut seen)?;
            found.sort();
            out.extend(found);
        } else if !meta.is_file() {
            return Err(CorpusError::NotText {
                path: p.clone(),
                reason: "is not a regular file (a device, pipe or socket)".into(),
            });
        } else if Seen::first(&mut seen.files, p)? {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The supported regular files under `root`. The tree is walked without following
/// links first, and links are followed after, to what was not met yet: a file inside
/// the tree is kept under its own path, and which of two ways to it is kept never
/// depends on the order a directory lists them in.
fn walk(root: &Path, seen: &mut Seen) -> Result<Vec<PathBuf>, CorpusError> {
    let mut found = Vec::new();
    let mut links = std::collections::VecDeque::new();
    if Seen::first(&mut seen.dirs, root)? {
        walk_real(root, seen, &mut found, &mut links)?;
    }
    while let Some(link) = links.pop_front() {
        match std::fs::metadata(&link) {
            Ok(m) if m.is_dir() => {
                if Seen::first(&mut seen.dirs, &link)? {
                    walk_real(&link, seen, &mut found, &mut links)?;
                }
            }
            Ok(m) => {
                if m.is_file() && supported(&link) && Seen::first(&mut seen.files, &link)? {
                    found.push(link);
                }
            }
            // A broken link to a text file is named when it is read.
            Err(_) if supported(&link) => found.push(link),
            Err(_) => {}
        }
    }
    Ok(found)
}

/// Walks `root` (already counted as seen) without following links, adding its
/// supported files to `found` and the links it meets to `links`.
fn walk_real(
    root: &Path,
    seen: &mut Seen,
    found: &mut Vec<PathBuf>,
    links: &mut std::collections::VecDeque<PathBuf>,
) -> Result<(), CorpusError> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries = std::fs::read_dir(&dir)
            .map_err(|e| io(&dir, e))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io(&dir, e))?;
        entries.sort();
        let mut subdirs = Vec::new();
        for path in entries {
            let kind = std::fs::symlink_metadata(&path)
                .map_err(|e| io(&path, e))?
                .file_type();
            if kind.is_symlink() {
                links.push_back(path);
            } else if kind.is_dir() {
                if Seen::first(&mut seen.dirs, &path)? {
                    subdirs.push(path);
                }
            } else if kind.is_file() && supported(&path) && Seen::first(&mut seen.files, &path)? {
                found.push(path);
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_link_back_to_a_parent_ends_the_walk_and_each_file_is_read_once() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("texts");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), "one").unwrap();
        std::fs::write(root.join("sub/b.txt"), "two").unwrap();
        // A loop, a second way into a directory already met, and a link to a file.
        symlink(&root, root.join("sub/loop")).unwrap();
        symlink(root.join("sub"), root.join("again")).unwrap();
        symlink(root.join("a.txt"), root.join("sub/a-link.txt")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let named = vec![root.clone(), root.join("a.txt")];
        std::thread::spawn(move || tx.send(expand_inputs(&named)));
        let files = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the walk ends")
            .unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["a.txt", "sub/b.txt"]);
    }

    #[test]
    fn a_path_that_does_not_exist_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = expand_inputs(&[dir.path().join("nope.txt")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("nope.txt") && e.contains("does not exist"),
            "{e}"
        );
    }
}

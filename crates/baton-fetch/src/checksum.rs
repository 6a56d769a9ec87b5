//! sha256 of files and streams, and the `<file>.verified` sidecar that spares re-hashing a
//! large file at every start.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{FetchError, FetchProgress};

/// Copy buffer size for hashing and joining.
const BUF: usize = 1 << 20;

/// A writer that hashes and counts everything written through it.
pub struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flushes and returns the inner writer, the hex digest and the byte count.
    pub fn finish(mut self) -> io::Result<(W, String, u64)> {
        self.inner.flush()?;
        Ok((
            self.inner,
            hex::encode(self.hasher.finalize()),
            self.written,
        ))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Copies `reader` into `writer` in large blocks, reporting `base + copied` to `progress`.
pub fn copy_with_progress<R: Read + ?Sized, W: Write>(
    reader: &mut R,
    writer: &mut W,
    base: u64,
    total: Option<u64>,
    progress: &dyn FetchProgress,
) -> io::Result<u64> {
    let mut buf = vec![0u8; BUF];
    let mut copied = 0u64;
    let mut last_report = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        writer.write_all(&buf[..n])?;
        copied += n as u64;
        if copied - last_report >= 4 * BUF as u64 {
            progress.bytes(base + copied, total);
            last_report = copied;
        }
    }
    progress.bytes(base + copied, total);
    Ok(copied)
}

/// sha256 (lowercase hex) and size of a file.
pub fn sha256_file(path: &Path, progress: &dyn FetchProgress) -> Result<(String, u64), FetchError> {
    let mut file = fs::File::open(path).map_err(|e| FetchError::io("cannot open", path, e))?;
    let total = file.metadata().ok().map(|m| m.len());
    let mut hw = HashingWriter::new(io::sink());
    copy_with_progress(&mut file, &mut hw, 0, total, progress)
        .map_err(|e| FetchError::io("cannot read", path, e))?;
    let (_, sha, size) = hw
        .finish()
        .map_err(|e| FetchError::io("cannot read", path, e))?;
    Ok((sha, size))
}

/// What the sidecar `<file>.verified` records about a verified file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sidecar {
    pub size: u64,
    /// Modification time in nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
    pub sha256: String,
    /// Label of the source the file came from.
    pub source: String,
    /// True when the digest was not checked against a pinned value (hub file without sha256).
    #[serde(default)]
    pub unpinned: bool,
}

/// Path of the sidecar of `file`.
pub fn sidecar_path(file: &Path) -> PathBuf {
    let mut name = file
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".verified");
    file.with_file_name(name)
}

/// Size and mtime (ns) of a file, `None` if it does not exist or cannot be read.
pub fn size_mtime(path: &Path) -> Option<(u64, u64)> {
    let meta = fs::metadata(path).ok()?;
    let mtime = u64::try_from(
        meta.modified()
            .ok()?
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_nanos(),
    )
    .ok()?;
    Some((meta.len(), mtime))
}

/// Reads the sidecar of `file`, if present and well formed.
pub fn read_sidecar(file: &Path) -> Option<Sidecar> {
    let text = fs::read_to_string(sidecar_path(file)).ok()?;
    toml::from_str(&text).ok()
}

/// Writes the sidecar of `file` for its current size and mtime.
pub fn write_sidecar(
    file: &Path,
    sha256: &str,
    source: &str,
    unpinned: bool,
) -> Result<Sidecar, FetchError> {
    let (size, mtime_ns) = size_mtime(file).ok_or_else(|| {
        FetchError::io(
            "cannot stat",
            file,
            io::Error::new(io::ErrorKind::NotFound, "file vanished"),
        )
    })?;
    let sc = Sidecar {
        size,
        mtime_ns,
        sha256: sha256.to_string(),
        source: source.to_string(),
        unpinned,
    };
    let text = toml::to_string(&sc).map_err(|e| {
        FetchError::io(
            "cannot encode sidecar for",
            file,
            io::Error::other(e.to_string()),
        )
    })?;
    let path = sidecar_path(file);
    fs::write(&path, text).map_err(|e| FetchError::io("cannot write", &path, e))?;
    Ok(sc)
}

/// Whether the sidecar can be trusted for `file` without re-hashing: it must exist, match
/// the file's current size and mtime, and record a digest in `accepted` (or be an unpinned
/// hub download, when `allow_unpinned`).
pub fn trusted_sidecar(file: &Path, accepted: &[&str], allow_unpinned: bool) -> Option<Sidecar> {
    let sc = read_sidecar(file)?;
    let (size, mtime) = size_mtime(file)?;
    if sc.size != size || sc.mtime_ns != mtime {
        return None;
    }
    if accepted.contains(&sc.sha256.as_str()) || (sc.unpinned && allow_unpinned) {
        Some(sc)
    } else {
        None
    }
}

/// Removes `file` and its sidecar; missing files are not an error.
pub fn remove_with_sidecar(file: &Path) {
    for p in [file.to_path_buf(), sidecar_path(file)] {
        if let Err(e) = fs::remove_file(&p) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("could not remove {}: {e}", p.display());
            }
        }
    }
}

/// Checks `file` against an expected size and a set of accepted digests and returns its
/// digest. On mismatch the file (and its sidecar) is removed and an error returned.
pub fn verify_or_remove(
    file: &Path,
    expected_size: Option<u64>,
    accepted: &[&str],
    progress: &dyn FetchProgress,
) -> Result<String, FetchError> {
    if let (Some(want), Some((have, _))) = (expected_size, size_mtime(file)) {
        if want != have {
            remove_with_sidecar(file);
            return Err(FetchError::SizeMismatch {
                path: file.to_path_buf(),
                expected: want,
                actual: have,
            });
        }
    }
    let (sha, _) = sha256_file(file, progress)?;
    if !accepted.contains(&sha.as_str()) {
        remove_with_sidecar(file);
        return Err(FetchError::ChecksumMismatch {
            path: file.to_path_buf(),
            expected: accepted.join(" or "),
            actual: sha,
        });
    }
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SilentProgress;

    const HELLO_SHA: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn sha_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"hello").unwrap();
        assert_eq!(
            sha256_file(&p, &SilentProgress).unwrap(),
            (HELLO_SHA.to_string(), 5)
        );
    }

    #[test]
    fn verify_rejects_and_removes_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"hellO").unwrap();
        write_sidecar(&p, "whatever", "test", false).unwrap();
        let err = verify_or_remove(&p, Some(5), &[HELLO_SHA], &SilentProgress).unwrap_err();
        assert!(matches!(err, FetchError::ChecksumMismatch { .. }), "{err}");
        assert!(!p.exists());
        assert!(!sidecar_path(&p).exists());

        // a truncated file is caught by size, before hashing
        fs::write(&p, b"hel").unwrap();
        let err = verify_or_remove(&p, Some(5), &[HELLO_SHA], &SilentProgress).unwrap_err();
        assert!(
            matches!(err, FetchError::SizeMismatch { actual: 3, .. }),
            "{err}"
        );
        assert!(!p.exists());

        fs::write(&p, b"hello").unwrap();
        verify_or_remove(&p, Some(5), &[HELLO_SHA], &SilentProgress).unwrap();
        assert!(p.exists());
    }

    #[test]
    fn sidecar_trusted_only_when_size_and_mtime_match() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.gguf");
        fs::write(&p, b"hello").unwrap();
        assert!(
            trusted_sidecar(&p, &[HELLO_SHA], false).is_none(),
            "no sidecar yet"
        );
        write_sidecar(&p, HELLO_SHA, "pypi", false).unwrap();
        assert_eq!(sidecar_path(&p), dir.path().join("model.gguf.verified"));
        assert!(trusted_sidecar(&p, &[HELLO_SHA], false).is_some());
        // a different accepted digest: not trusted
        assert!(trusted_sidecar(&p, &["00"], false).is_none());

        // same size, different mtime: not trusted
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(10))
            .unwrap();
        drop(f);
        assert!(trusted_sidecar(&p, &[HELLO_SHA], false).is_none());

        // rewrite sidecar, then change size: not trusted
        write_sidecar(&p, HELLO_SHA, "pypi", false).unwrap();
        assert!(trusted_sidecar(&p, &[HELLO_SHA], false).is_some());
        fs::write(&p, b"hello!").unwrap();
        assert!(trusted_sidecar(&p, &[HELLO_SHA], false).is_none());

        // unpinned hub download: trusted only when allowed
        write_sidecar(&p, "abc", "hf", true).unwrap();
        assert!(trusted_sidecar(&p, &[HELLO_SHA], false).is_none());
        assert!(trusted_sidecar(&p, &[HELLO_SHA], true).is_some());

        // garbage sidecar: not trusted
        fs::write(sidecar_path(&p), "not toml [").unwrap();
        assert!(trusted_sidecar(&p, &[HELLO_SHA], true).is_none());
    }
}

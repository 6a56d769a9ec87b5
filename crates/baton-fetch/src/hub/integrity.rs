//! Whether a finished hub download is the file the hub announced: its length, and the
//! digest its ETag names. The hub names a file stored in LFS by its SHA-256 and one kept
//! in git by the SHA-1 of its git blob (`blob <len>\0` then the bytes); hf-hub stores the
//! file under that name without checking either.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::super::{FetchError, FetchProgress};
use super::HubFile;

/// What an ETag promises about the bytes.
#[derive(Debug, PartialEq, Eq)]
enum Promise {
    Sha256(String),
    GitSha1(String),
    Nothing,
}

fn promise(etag: &str) -> Promise {
    let hex = |n: usize| etag.len() == n && etag.bytes().all(|b| b.is_ascii_hexdigit());
    if hex(64) {
        Promise::Sha256(etag.to_ascii_lowercase())
    } else if hex(40) {
        Promise::GitSha1(etag.to_ascii_lowercase())
    } else {
        Promise::Nothing
    }
}

/// The SHA-1 git names a blob of `bytes` by (what the hub's ETag is for a file kept in
/// git rather than LFS).
pub fn git_blob_sha1(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex::encode(h.finalize())
}

/// Checks the blob `pointer` leads to against the size the hub announced (`total`) and
/// the digest its name (the ETag) promises. A blob that fails is removed, with its
/// pointer, so the next try downloads it anew.
pub(super) fn check_download(
    pointer: &Path,
    total: u64,
    url: &str,
    progress: &dyn FetchProgress,
) -> Result<HubFile, FetchError> {
    let blob = fs::canonicalize(pointer).unwrap_or_else(|_| pointer.to_path_buf());
    let etag = blob
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let corrupt = |problem: String| {
        for p in [&blob, &pointer.to_path_buf()] {
            if let Err(e) = fs::remove_file(p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("could not remove {}: {e}", p.display());
                }
            }
        }
        FetchError::HubCorrupt {
            url: url.to_string(),
            problem,
        }
    };
    let size = fs::metadata(&blob)
        .map_err(|e| FetchError::io("cannot stat", &blob, e))?
        .len();
    if total > 0 && size != total {
        return Err(corrupt(format!(
            "{size} bytes arrived where the hub announced {total}"
        )));
    }
    let promise = promise(&etag);
    progress.message(&format!("verifying {}", blob.display()));
    let (sha256, sha1) = digests(
        &blob,
        size,
        matches!(promise, Promise::GitSha1(_)),
        progress,
    )?;
    let etag_checked = match &promise {
        Promise::Sha256(want) if *want != sha256 => {
            return Err(corrupt(format!(
                "its sha256 is {sha256}, but the hub names its content {want}"
            )))
        }
        Promise::GitSha1(want) if sha1.as_deref() != Some(want.as_str()) => {
            return Err(corrupt(format!(
                "its git blob SHA-1 is {}, but the hub names its content {want}",
                sha1.unwrap_or_default()
            )))
        }
        Promise::Nothing => {
            tracing::warn!(
                "{url}: the hub's ETag `{etag}` names no digest; only the size was checked"
            );
            false
        }
        _ => true,
    };
    Ok(HubFile {
        sha256,
        size,
        etag,
        etag_checked,
    })
}

/// SHA-256 of the file, and with `git` also the SHA-1 of it as a git blob, in one read.
fn digests(
    path: &Path,
    size: u64,
    git: bool,
    progress: &dyn FetchProgress,
) -> Result<(String, Option<String>), FetchError> {
    let mut file = fs::File::open(path).map_err(|e| FetchError::io("cannot open", path, e))?;
    let mut sha256 = Sha256::new();
    let mut sha1 = git.then(|| {
        let mut h = Sha1::new();
        h.update(format!("blob {size}\0").as_bytes());
        h
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut read = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FetchError::io("cannot read", path, e)),
        };
        sha256.update(&buf[..n]);
        if let Some(h) = sha1.as_mut() {
            h.update(&buf[..n]);
        }
        read += n as u64;
        progress.bytes(read, Some(size));
    }
    Ok((
        hex::encode(sha256.finalize()),
        sha1.map(|h| hex::encode(h.finalize())),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SilentProgress;

    #[test]
    fn the_git_blob_sha1_is_gits() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_sha1(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
    }

    #[test]
    fn an_etag_promises_by_its_form() {
        assert_eq!(promise(&"AB".repeat(32)), Promise::Sha256("ab".repeat(32)));
        assert_eq!(promise(&"a".repeat(40)), Promise::GitSha1("a".repeat(40)));
        assert_eq!(promise("W-xyz"), Promise::Nothing);
    }

    #[test]
    fn a_blob_that_is_not_its_name_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let good = git_blob_sha1(b"hello\n");
        let blob = dir.path().join(&good);
        fs::write(&blob, b"hello\n").unwrap();
        let f = check_download(&blob, 6, "u", &SilentProgress).unwrap();
        assert!(f.etag_checked);
        assert_eq!(f.etag, good);

        let bad = dir.path().join("a".repeat(64));
        fs::write(&bad, b"hello\n").unwrap();
        let e = check_download(&bad, 6, "u", &SilentProgress).unwrap_err();
        assert!(e.to_string().contains("sha256"), "{e}");
        assert!(!bad.exists());

        let short = dir.path().join(&good);
        fs::write(&short, b"hel").unwrap();
        let e = check_download(&short, 6, "u", &SilentProgress).unwrap_err();
        assert!(e.to_string().contains("3 bytes arrived"), "{e}");
        assert!(!short.exists());
    }
}

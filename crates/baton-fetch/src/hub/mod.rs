//! Hugging Face hub source, with bounded waits so an offline machine falls through fast
//! and a silent server cannot hang a fetch.
//!
//! hf-hub's sync client has no timeouts of its own, so the hub is first probed with a
//! bounded DNS lookup and TCP connect, and each download runs on a worker thread watched
//! for a silent start or a stalled transfer. A worker given up on is left to end when its
//! connection does; it only ever writes inside baton's hub cache dir.
//!
//! hf-hub follows a relative redirect without limit, so those are walked first, bounded
//! (`redirects`): a loop is named as one after a few requests.
//!
//! hf-hub keeps what arrived of a file as `<blob>.part` and asks for the rest with a
//! `Range` request the next time, so a transfer cut part way is resumed: at once, up to
//! [`HubOptions::resumes`] times, and otherwise at the next run. hf-hub checks neither the
//! length nor the digest of what it stored; both are checked here against what the hub
//! announced (its `ETag` names the file's SHA-256, or the SHA-1 of its git blob).

mod errors;
mod integrity;
mod probe;
mod redirects;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Repo, RepoType};

use super::{FetchError, FetchProgress};
use errors::{classify, Failure};

pub use integrity::git_blob_sha1;

/// Where the hub is, who asks, and how long it may stay silent.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// Base URL of the hub; hf-hub's default when `None` (`HF_ENDPOINT` sets it).
    pub endpoint: Option<String>,
    /// Access token for private and gated repos (`HF_TOKEN`, or hf-hub's token file).
    pub token: Option<String>,
    /// Why the hub is not to be tried at all (`BATON_OFFLINE_HUB`, `HF_HUB_OFFLINE`).
    pub offline: Option<String>,
    /// Budget for resolving the hub's host and opening a TCP connection to it.
    pub connect_timeout: Duration,
    /// Budget from a request until the hub has said how large the file is.
    pub answer_timeout: Duration,
    /// A transfer that moves no byte for this long is abandoned.
    pub stall_timeout: Duration,
    /// How many times a transfer cut part way is resumed within one fetch.
    pub resumes: usize,
}

impl Default for HubOptions {
    /// The hub's defaults, with nothing read from the environment.
    fn default() -> Self {
        HubOptions {
            endpoint: None,
            token: None,
            offline: None,
            connect_timeout: Duration::from_secs(4),
            answer_timeout: Duration::from_secs(20),
            stall_timeout: Duration::from_secs(60),
            resumes: 3,
        }
    }
}

/// Name of the setting for how long the hub may stay silent.
pub const TIMEOUT_VAR: &str = "BATON_HUB_TIMEOUT";

impl HubOptions {
    /// The options the environment asks for: `HF_ENDPOINT`, `HF_TOKEN`, the offline
    /// switches, and `BATON_HUB_TIMEOUT` (seconds the hub may stay silent, before its
    /// first answer and during a transfer).
    pub fn from_env() -> Result<Self, FetchError> {
        let mut opts = HubOptions {
            endpoint: std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()),
            token: std::env::var("HF_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .or_else(|| hf_hub::Cache::from_env().token()),
            offline: offline_reason(),
            ..HubOptions::default()
        };
        if let Ok(v) = std::env::var(TIMEOUT_VAR) {
            let secs = parse_seconds(&v).ok_or(FetchError::BadSetting {
                var: TIMEOUT_VAR,
                value: v,
                expected: "give a positive number of seconds, e.g. 60",
            })?;
            opts.answer_timeout = secs;
            opts.stall_timeout = secs;
        }
        Ok(opts)
    }
}

fn parse_seconds(v: &str) -> Option<Duration> {
    let secs: f64 = v.trim().parse().ok()?;
    (secs.is_finite() && secs > 0.0 && secs < 1e9).then(|| Duration::from_secs_f64(secs))
}

/// Why the hub is skipped without trying, if it is.
pub fn offline_reason() -> Option<String> {
    for var in ["BATON_OFFLINE_HUB", "HF_HUB_OFFLINE"] {
        if let Ok(v) = std::env::var(var) {
            let v = v.trim().to_ascii_lowercase();
            if !v.is_empty() && v != "0" && v != "false" && v != "no" {
                return Some(format!("{var}={v} is set"));
            }
        }
    }
    None
}

/// One file of one hub repo.
#[derive(Debug, Clone, Copy)]
pub struct HubRequest<'a> {
    pub repo: &'a str,
    pub file: &'a str,
    /// A branch, tag or commit; the repo's main branch when `None`.
    pub revision: Option<&'a str>,
}

/// What a finished hub download is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubFile {
    pub sha256: String,
    pub size: u64,
    /// The hub's name for the file's content (quotes removed).
    pub etag: String,
    /// Whether the bytes were checked against the digest the ETag names; false when the
    /// hub sent an ETag of a form that names no digest baton knows.
    pub etag_checked: bool,
}

#[derive(Clone, Default)]
struct Shared {
    total: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    started: Arc<AtomicBool>,
}

impl hf_hub::api::Progress for Shared {
    fn init(&mut self, size: usize, _filename: &str) {
        self.total.store(size as u64, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        self.started.store(true, Ordering::Relaxed);
    }
    fn update(&mut self, size: usize) {
        self.done.fetch_add(size as u64, Ordering::Relaxed);
    }
    fn finish(&mut self) {}
}

/// Downloads `req` from the hub into `cache_dir`, checks it against what the hub
/// announced, and moves it to `dest` (replacing nothing on failure).
pub fn fetch_file(
    req: &HubRequest<'_>,
    cache_dir: &Path,
    dest: &Path,
    opts: &HubOptions,
    progress: &dyn FetchProgress,
) -> Result<HubFile, FetchError> {
    if let Some(why) = &opts.offline {
        return Err(FetchError::HubSkipped(why.clone()));
    }
    let mut builder = ApiBuilder::new()
        .with_cache_dir(cache_dir.to_path_buf())
        .with_progress(false)
        // Resumes are driven here: each is a fresh call that reopens the part file, so
        // it asks for the range that file really lacks.
        .with_retries(0);
    if let Some(endpoint) = &opts.endpoint {
        builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
    }
    if opts.token.is_some() {
        builder = builder.with_token(opts.token.clone());
    }
    let api = builder
        .build()
        .map_err(|e| FetchError::Hub(e.to_string()))?;
    let repo = match req.revision {
        Some(rev) => Repo::with_revision(req.repo.to_string(), RepoType::Model, rev.to_string()),
        None => Repo::new(req.repo.to_string(), RepoType::Model),
    };
    let url = api.repo(repo.clone()).url(req.file);
    if !probe::proxy_configured() {
        probe::probe(&url, opts.connect_timeout)
            .map_err(|e| FetchError::Hub(format!("hub unreachable: {e}")))?;
    }
    redirects::check(&url, opts.token.as_deref(), opts.answer_timeout)?;
    let at = errors::Where {
        repo: req.repo,
        file: req.file,
        revision: req.revision.unwrap_or("main"),
        url: &url,
    };
    let blobs = cache_dir.join(repo.folder_name()).join("blobs");

    let mut attempt = 0;
    let (pointer, total) = loop {
        let failure = match download_once(api.repo(repo.clone()), req.file, &url, opts, progress)? {
            Ok(done) => break done,
            Err(failure) => failure,
        };
        let (err, retry) = classify(failure, &at, &blobs);
        if !retry || attempt >= opts.resumes {
            return Err(err);
        }
        attempt += 1;
        tracing::warn!("{err}; resuming ({attempt} of {})", opts.resumes);
        progress.message(&format!("{err}; resuming"));
    };
    let file = integrity::check_download(&pointer, total, &url, progress)?;
    install(&pointer, dest)?;
    Ok(file)
}

/// One call of hf-hub's download, watched: the pointer path and the announced size, or
/// why hf-hub failed. Gives up (the outer error) when the hub stays silent too long.
fn download_once(
    api_repo: ApiRepo,
    file: &str,
    url: &str,
    opts: &HubOptions,
    progress: &dyn FetchProgress,
) -> Result<Result<(PathBuf, u64), Failure>, FetchError> {
    let shared = Shared::default();
    let (tx, rx) = mpsc::channel::<Result<PathBuf, ApiError>>();
    let worker_progress = shared.clone();
    let file_owned = file.to_string();
    std::thread::Builder::new()
        .name("baton-hub".into())
        .spawn(move || {
            let _ = tx.send(api_repo.download_with_progress(&file_owned, worker_progress));
        })
        .map_err(|e| FetchError::Hub(format!("cannot start download thread: {e}")))?;

    let begun = Instant::now();
    let mut last_done = 0u64;
    let mut last_move = Instant::now();
    loop {
        let failed = match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Ok(path)) => return Ok(Ok((path, shared.total.load(Ordering::Relaxed)))),
            Ok(Err(e)) => Some(e),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(FetchError::Hub(
                    "download thread ended without a result".into(),
                ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => None,
        };
        let started = shared.started.load(Ordering::Relaxed);
        let done = shared.done.load(Ordering::Relaxed);
        let total = shared.total.load(Ordering::Relaxed);
        if let Some(error) = failed {
            return Ok(Err(Failure {
                error,
                started,
                done,
                total,
            }));
        }
        if !started {
            if begun.elapsed() > opts.answer_timeout {
                return Err(FetchError::HubTimeout {
                    url: url.to_string(),
                    stage: "did not answer".into(),
                    secs: opts.answer_timeout.as_secs_f64(),
                });
            }
            continue;
        }
        progress.bytes(done, (total > 0).then_some(total));
        if done != last_done {
            last_done = done;
            last_move = Instant::now();
        } else if last_move.elapsed() > opts.stall_timeout {
            return Err(FetchError::HubTimeout {
                url: url.to_string(),
                stage: format!("stopped sending at byte {done} of {total}"),
                secs: opts.stall_timeout.as_secs_f64(),
            });
        }
    }
}

/// Moves the checked blob out of the hub cache to `dest` (so it is not stored twice),
/// through a temp file when it must be copied, so `dest` is whole or absent.
fn install(pointer: &Path, dest: &Path) -> Result<(), FetchError> {
    let blob = std::fs::canonicalize(pointer).unwrap_or_else(|_| pointer.to_path_buf());
    if std::fs::rename(&blob, dest).is_err() {
        let mut tmp = dest.as_os_str().to_owned();
        tmp.push(format!(".{}.copy", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let copied = std::fs::copy(&blob, &tmp).and_then(|_| std::fs::rename(&tmp, dest));
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&tmp);
            return Err(FetchError::io("cannot copy hub file to", dest, e));
        }
        let _ = std::fs::remove_file(&blob);
    }
    let _ = std::fs::remove_file(pointer);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_setting_is_seconds_and_nothing_else() {
        assert_eq!(parse_seconds("60"), Some(Duration::from_secs(60)));
        assert_eq!(parse_seconds(" 0.5 "), Some(Duration::from_millis(500)));
        for bad in ["", "0", "-3", "ten", "inf", "NaN", "1e12"] {
            assert_eq!(parse_seconds(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_offline_switch_is_honoured_without_a_connection() {
        let opts = HubOptions {
            offline: Some("BATON_OFFLINE_HUB=1 is set".into()),
            // A port nothing listens on: were it tried, the error would differ.
            endpoint: Some("http://127.0.0.1:9".into()),
            ..HubOptions::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let req = HubRequest {
            repo: "a/b",
            file: "c",
            revision: None,
        };
        let err = fetch_file(
            &req,
            dir.path(),
            &dir.path().join("out"),
            &opts,
            &super::super::SilentProgress,
        )
        .unwrap_err();
        assert!(matches!(err, FetchError::HubSkipped(_)), "{err}");
    }
}

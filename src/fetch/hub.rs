//! Hugging Face hub source, with short timeouts so an offline machine falls through fast.
//!
//! hf-hub's sync client has no timeouts of its own, so the hub is first probed with a
//! bounded DNS lookup and TCP connect, and the download runs on a worker thread watched
//! for a stalled start or a stalled transfer. A worker given up on is left to die with the
//! process; it only ever writes inside baton's hub cache dir.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Repo, RepoType};

use super::{FetchError, FetchProgress};

/// Budget for resolving the hub host and opening a TCP connection to it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(4);
/// Budget from the start of the download until the file's size is known.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// A transfer that moves no byte for this long is abandoned.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

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

/// Host and port of an http(s) URL.
fn host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else {
        443
    };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default_port);
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default_port)),
    }
}

fn proxy_configured() -> bool {
    [
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ]
    .iter()
    .any(|v| std::env::var(v).map(|s| !s.is_empty()).unwrap_or(false))
}

/// Resolves and connects to the host of `url` within `timeout`.
fn probe(url: &str, timeout: Duration) -> Result<(), String> {
    let (host, port) = host_port(url).ok_or_else(|| format!("cannot parse hub URL {url}"))?;
    let (tx, rx) = mpsc::channel();
    let h = host.clone();
    std::thread::spawn(move || {
        let res = (h.as_str(), port)
            .to_socket_addrs()
            .map(|a| a.collect::<Vec<_>>());
        let _ = tx.send(res);
    });
    let start = Instant::now();
    let addrs = match rx.recv_timeout(timeout) {
        Ok(Ok(addrs)) if !addrs.is_empty() => addrs,
        Ok(Ok(_)) => return Err(format!("{host} resolves to no address")),
        Ok(Err(e)) => return Err(format!("cannot resolve {host}: {e}")),
        Err(_) => return Err(format!("resolving {host} took over {}s", timeout.as_secs())),
    };
    let mut last = String::new();
    for addr in addrs.iter().take(3) {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("cannot connect to {host} ({addr}): {e}"),
        }
    }
    if last.is_empty() {
        last = format!("connecting to {host} took over {}s", timeout.as_secs());
    }
    Err(last)
}

/// Downloads `repo`/`file` from the hub into `cache_dir` and moves the result to `dest`.
pub fn fetch_file(
    repo: &str,
    file: &str,
    revision: Option<&str>,
    cache_dir: &Path,
    dest: &Path,
    progress: &dyn FetchProgress,
) -> Result<(), FetchError> {
    if let Some(why) = offline_reason() {
        return Err(FetchError::HubSkipped(why));
    }
    let mut builder = ApiBuilder::new()
        .with_cache_dir(cache_dir.to_path_buf())
        .with_progress(false)
        .with_retries(0);
    if let Ok(endpoint) = std::env::var("HF_ENDPOINT") {
        builder = builder.with_endpoint(endpoint);
    }
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| hf_hub::Cache::from_env().token());
    if token.is_some() {
        builder = builder.with_token(token);
    }
    let api = builder
        .build()
        .map_err(|e| FetchError::Hub(e.to_string()))?;
    let repo = match revision {
        Some(rev) => Repo::with_revision(repo.to_string(), RepoType::Model, rev.to_string()),
        None => Repo::new(repo.to_string(), RepoType::Model),
    };
    let api_repo = api.repo(repo);
    let url = api_repo.url(file);
    if !proxy_configured() {
        probe(&url, PROBE_TIMEOUT).map_err(|e| FetchError::Hub(format!("hub unreachable: {e}")))?;
    }

    let shared = Shared::default();
    let (tx, rx) = mpsc::channel::<Result<PathBuf, String>>();
    let worker_progress = shared.clone();
    let file_owned = file.to_string();
    std::thread::Builder::new()
        .name("baton-hub".into())
        .spawn(move || {
            let res = api_repo
                .download_with_progress(&file_owned, worker_progress)
                .map_err(|e| e.to_string());
            let _ = tx.send(res);
        })
        .map_err(|e| FetchError::Hub(format!("cannot start download thread: {e}")))?;

    let begun = Instant::now();
    let mut last_done = 0u64;
    let mut last_move = Instant::now();
    let pointer = loop {
        match rx.recv_timeout(Duration::from_millis(250)) {
            Ok(Ok(path)) => break path,
            Ok(Err(e)) => return Err(FetchError::Hub(e)),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(FetchError::Hub(
                    "download thread ended without a result".into(),
                ))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if !shared.started.load(Ordering::Relaxed) {
            if begun.elapsed() > START_TIMEOUT {
                return Err(FetchError::Hub(format!(
                    "no answer from the hub within {}s",
                    START_TIMEOUT.as_secs()
                )));
            }
            continue;
        }
        let done = shared.done.load(Ordering::Relaxed);
        let total = shared.total.load(Ordering::Relaxed);
        progress.bytes(done, (total > 0).then_some(total));
        if done != last_done {
            last_done = done;
            last_move = Instant::now();
        } else if last_move.elapsed() > STALL_TIMEOUT {
            return Err(FetchError::Hub(format!(
                "transfer stalled for {}s at {done} bytes",
                STALL_TIMEOUT.as_secs()
            )));
        }
    };

    // The pointer is a symlink into the hub cache's blob store: move the blob out so the
    // file is not stored twice, falling back to a copy.
    let blob = std::fs::canonicalize(&pointer).unwrap_or_else(|_| pointer.clone());
    if std::fs::rename(&blob, dest).is_ok() {
        let _ = std::fs::remove_file(&pointer);
    } else {
        std::fs::copy(&blob, dest)
            .map_err(|e| FetchError::io("cannot copy hub file to", dest, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_and_port() {
        assert_eq!(
            host_port("https://example.org/a/b"),
            Some(("example.org".into(), 443))
        );
        assert_eq!(
            host_port("http://127.0.0.1:9/x"),
            Some(("127.0.0.1".into(), 9))
        );
        assert_eq!(
            host_port("https://[::1]:8443/x"),
            Some(("::1".into(), 8443))
        );
        assert_eq!(host_port("nonsense"), None);
    }

    #[test]
    fn probe_fails_fast_on_closed_port() {
        // Port 9 (discard) on loopback: nothing listens, the connect is refused at once.
        let t = Instant::now();
        assert!(probe("http://127.0.0.1:9/", Duration::from_secs(2)).is_err());
        assert!(t.elapsed() < Duration::from_secs(3));
    }
}

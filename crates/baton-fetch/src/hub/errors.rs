//! hf-hub's errors turned into ones that say what happened and what to do, and whether
//! another try within the same fetch can help.

use std::io;
use std::path::Path;

use hf_hub::api::sync::ApiError;

use super::super::FetchError;

/// The file a failed download was for.
pub(super) struct Where<'a> {
    pub repo: &'a str,
    pub file: &'a str,
    pub revision: &'a str,
    pub url: &'a str,
}

/// A download hf-hub gave up on, with how far it had come.
pub(super) struct Failure {
    pub error: ApiError,
    /// Whether the hub had announced the file's size (the transfer had begun).
    pub started: bool,
    /// Bytes in the part file, counting those kept from an earlier try.
    pub done: u64,
    pub total: u64,
}

/// The error to report for `failure`, and whether a fresh try may get further.
pub(super) fn classify(failure: Failure, at: &Where<'_>, blobs: &Path) -> (FetchError, bool) {
    let Failure {
        error,
        started,
        done,
        total,
    } = failure;
    let url = at.url.to_string();
    let status = match &error {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::StatusCode(code) => Some(*code),
            _ => None,
        },
        _ => None,
    };
    match status {
        Some(404) => {
            return (
                FetchError::HubNotFound {
                    repo: at.repo.to_string(),
                    file: at.file.to_string(),
                    revision: at.revision.to_string(),
                    url,
                },
                false,
            )
        }
        Some(status @ (401 | 403)) => {
            return (
                FetchError::HubDenied {
                    repo: at.repo.to_string(),
                    status,
                    url,
                },
                false,
            )
        }
        // A range past the end: the part file holds the whole file or more, yet was never
        // moved into place. Only a fresh start can tell, so the part goes.
        Some(416) => {
            remove_parts(blobs);
            return (
                FetchError::Hub(format!(
                    "{url} refused to resume from the partial download in {}; it was \
                     removed, and the next try starts afresh",
                    blobs.display()
                )),
                true,
            );
        }
        Some(code) => {
            let retry = (500..600).contains(&code) && started;
            return (
                FetchError::Hub(format!("{url} answered HTTP {code}")),
                retry,
            );
        }
        None => {}
    }
    match error {
        ApiError::InvalidResume => {
            remove_parts(blobs);
            (
                FetchError::Hub(format!(
                    "the partial download of {url} in {} was longer than the file; it was \
                     removed, and the next try starts afresh",
                    blobs.display()
                )),
                true,
            )
        }
        ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => (
            FetchError::Hub(format!(
                "{url} answered without a valid `{h}` header, so it is not a hub file \
                 endpoint (check HF_ENDPOINT)"
            )),
            false,
        ),
        ApiError::LockAcquisition(lock) => (
            FetchError::Hub(format!(
                "another download of this file holds the lock {}; wait for it to finish \
                 and run again",
                lock.display()
            )),
            false,
        ),
        error if started && connection_lost(&error) => (
            FetchError::HubCut {
                url,
                done,
                total,
                reason: error.to_string(),
            },
            true,
        ),
        error => (FetchError::Hub(format!("{url}: {error}")), false),
    }
}

/// Whether `error` is the connection going away (as opposed to a local disk error, say).
fn connection_lost(error: &ApiError) -> bool {
    let io_lost = |e: &io::Error| {
        matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::TimedOut
        ) || e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(ureq_lost)
    };
    match error {
        ApiError::IoError(e) => io_lost(e),
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::Io(io) => io_lost(io),
            other => ureq_lost(other),
        },
        ApiError::TooManyRetries(inner) => connection_lost(inner),
        _ => false,
    }
}

fn ureq_lost(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ),
        ureq::Error::Timeout(_) | ureq::Error::BodyStalled | ureq::Error::Protocol(_) => true,
        _ => false,
    }
}

/// Removes hf-hub's partial downloads of one repo.
fn remove_parts(blobs: &Path) {
    let Ok(rd) = std::fs::read_dir(blobs) else {
        return;
    };
    for entry in rd.filter_map(Result::ok) {
        let p = entry.path();
        if p.extension().is_some_and(|x| x == "part") {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!("could not remove {}: {e}", p.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Where<'static> {
        Where {
            repo: "o/r",
            file: "f.gguf",
            revision: "main",
            url: "http://h/o/r/resolve/main/f.gguf",
        }
    }

    fn status(code: u16) -> Failure {
        Failure {
            error: ApiError::RequestError(Box::new(ureq::Error::StatusCode(code))),
            started: false,
            done: 0,
            total: 0,
        }
    }

    #[test]
    fn statuses_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let (e, retry) = classify(status(404), &at(), dir.path());
        assert!(matches!(e, FetchError::HubNotFound { .. }) && !retry, "{e}");
        let (e, retry) = classify(status(401), &at(), dir.path());
        assert!(e.to_string().contains("HF_TOKEN") && !retry, "{e}");
        let (e, retry) = classify(status(500), &at(), dir.path());
        assert!(e.to_string().contains("HTTP 500") && !retry, "{e}");
    }

    #[test]
    fn a_lost_connection_mid_transfer_is_a_cut_and_a_full_disk_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let lost = Failure {
            error: ApiError::IoError(io::Error::new(io::ErrorKind::UnexpectedEof, "gone")),
            started: true,
            done: 10,
            total: 20,
        };
        let (e, retry) = classify(lost, &at(), dir.path());
        assert!(
            matches!(e, FetchError::HubCut { done: 10, .. }) && retry,
            "{e}"
        );
        let disk = Failure {
            error: ApiError::IoError(io::Error::new(io::ErrorKind::StorageFull, "full")),
            started: true,
            done: 10,
            total: 20,
        };
        let (e, retry) = classify(disk, &at(), dir.path());
        assert!(!matches!(e, FetchError::HubCut { .. }) && !retry, "{e}");
    }

    #[test]
    fn a_refused_resume_drops_the_part_file() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("abc.part");
        std::fs::write(&part, b"xx").unwrap();
        let (_, retry) = classify(status(416), &at(), dir.path());
        assert!(retry);
        assert!(!part.exists());
    }
}

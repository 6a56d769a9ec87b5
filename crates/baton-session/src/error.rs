//! What can go wrong with a session file, said so that the message names the file and,
//! where there is one, the fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{} already exists: a session file is never overwritten; pick another file name or move the old file away", path.display())]
    Exists { path: PathBuf },
    #[error("{} is a directory: name a session file to record to, e.g. {}", path.display(), path.join("session.jsonl").display())]
    IsADirectory { path: PathBuf },
    #[error("cannot record to {}: {} is a file, not a directory; pick a path inside a directory", path.display(), blocker.display())]
    NotADirectory { path: PathBuf, blocker: PathBuf },
    #[error("cannot create the session file {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write to the session file {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read the session file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is empty: not a baton session file", path.display())]
    Empty { path: PathBuf },
    #[error("{}: line 1 is not a baton session header ({detail})", path.display())]
    NotASession { path: PathBuf, detail: String },
    #[error("{}: session format version {found}, but this baton ({ours}) reads version {supported} only: written by a newer baton? upgrade baton to read it", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        found: u64,
        supported: u32,
        ours: &'static str,
    },
    #[error("{}: line {line}: {detail}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },
    #[error("cannot encode a session line: {0}")]
    Encode(#[from] serde_json::Error),
}

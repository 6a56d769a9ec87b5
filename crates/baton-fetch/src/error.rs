//! Errors of the fetch module. Every message says what went wrong and what to do about it.

use std::path::PathBuf;

/// Why an artifact could not be fetched or verified.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The embedded manifest does not parse or is inconsistent (a bug in baton).
    #[error("the built-in model manifest is invalid: {0} (fix assets/models.toml and rebuild)")]
    Manifest(String),

    /// A name that is not in the manifest.
    #[error("unknown model or data set `{name}`; known names: {known}")]
    UnknownName { name: String, known: String },

    /// A pair name that is not in the manifest.
    #[error("no pair `{name}` in assets/models.toml (pairs: {known})")]
    UnknownPair { name: String, known: String },

    /// A model spec that is no path, no hub reference and no manifest model name.
    #[error(
        "model `{spec}` not found: it is not a file or directory, not hf:OWNER/REPO/FILE, \
         and not a model name in assets/models.toml (known: {known})"
    )]
    UnknownModel { spec: String, known: String },

    /// `hf:` followed by something other than OWNER/REPO/FILE.
    #[error(
        "`{0}` is not a hub reference: write hf:OWNER/REPO/FILE, e.g. \
         hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )]
    BadHubReference(String),

    /// The cache dir is a file, or under one.
    #[error("{0}")]
    CacheDir(String),

    /// A filesystem operation failed.
    #[error(
        "{action} {path}: {source} (check free disk space and permissions, \
         or set BATON_CACHE_DIR to a writable directory)"
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A needed external program is missing.
    #[error("{program} not found: {install}; {manual}")]
    ToolMissing {
        program: &'static str,
        install: &'static str,
        manual: String,
    },

    /// An external program (pip, npm) ran and failed.
    #[error("`{command}` failed ({status}): {detail} (check network access to the package index and retry)")]
    ToolFailed {
        command: String,
        status: String,
        detail: String,
    },

    /// A downloaded archive is unreadable or lacks what the manifest expects.
    #[error(
        "archive {path}: {problem} (the download was removed; retry, or report a stale manifest)"
    )]
    Archive { path: PathBuf, problem: String },

    /// A file's size differs from the manifest.
    #[error("size mismatch for {path}: expected {expected} bytes, got {actual} (the file was removed; run again to refetch)")]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },

    /// A file's sha256 differs from the manifest.
    #[error("sha256 mismatch for {path}: expected {expected}, got {actual} (the file was removed; run again to refetch)")]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
    },

    /// The hub source was not tried on purpose.
    #[error("hub skipped: {0}")]
    HubSkipped(String),

    /// The hub could not be reached or the download failed.
    #[error("hub download failed: {0} (set BATON_OFFLINE_HUB=1 to skip the hub)")]
    Hub(String),

    /// The hub answered that the file (or revision) is not there.
    #[error(
        "the hub has no file `{file}` in repo `{repo}` at revision `{revision}` (HTTP 404 \
         from {url}): check the spelling of the repo and of the file's path in it, as \
         hf:OWNER/REPO/FILE"
    )]
    HubNotFound {
        repo: String,
        file: String,
        revision: String,
        url: String,
    },

    /// The hub refused the repo: it does not exist, or it needs a token.
    #[error(
        "the hub refused repo `{repo}` (HTTP {status} from {url}): it does not exist, or it \
         is private or gated; check its name, and for a gated or private repo accept its \
         terms on the hub and set HF_TOKEN to an access token"
    )]
    HubDenied {
        repo: String,
        status: u16,
        url: String,
    },

    /// The hub went silent: no answer, or a transfer that stopped moving.
    #[error(
        "the hub at {url} {stage} for {secs}s: it is down or unreachable from here; retry \
         later, set BATON_HUB_TIMEOUT=SECONDS to wait longer, or BATON_OFFLINE_HUB=1 to \
         skip the hub"
    )]
    HubTimeout {
        url: String,
        stage: String,
        secs: f64,
    },

    /// The connection closed before the whole file came.
    #[error(
        "the transfer of {url} was cut at {done} of {total} bytes ({reason}); the part \
         downloaded is kept: run again to resume from it"
    )]
    HubCut {
        url: String,
        done: u64,
        total: u64,
        reason: String,
    },

    /// The bytes that came are not the file the hub announced.
    #[error(
        "the file from {url} is corrupt: {problem} (the download was removed; run again to \
         fetch it anew)"
    )]
    HubCorrupt { url: String, problem: String },

    /// A setting in the environment that does not parse.
    #[error("{var}=`{value}` is not valid: {expected}")]
    BadSetting {
        var: &'static str,
        value: String,
        expected: &'static str,
    },

    /// Every source of an entry failed.
    #[error("could not fetch `{name}`: every source failed:\n{}\n{hint}", format_failures(.failures))]
    AllSourcesFailed {
        name: String,
        failures: Vec<(String, FetchError)>,
        hint: String,
    },
}

fn format_failures(failures: &[(String, FetchError)]) -> String {
    failures
        .iter()
        .map(|(label, err)| format!("  - {label}: {err}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl FetchError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        FetchError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

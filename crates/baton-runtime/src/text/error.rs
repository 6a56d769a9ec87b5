//! What can go wrong building or using a tokenizer.

use std::fmt;
use std::path::PathBuf;

/// Errors from building or using a [`TextTokenizer`].
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load tokenizer file {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("GGUF metadata has no `{0}`; cannot build the tokenizer")]
    MissingKey(String),
    #[error("GGUF metadata `{key}` is malformed: {message}")]
    BadMetadata { key: String, message: String },
    #[error(
        "unsupported tokenizer model `tokenizer.ggml.model = \"{0}\"`; supported: \"gpt2\" (byte-level BPE)"
    )]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer `tokenizer.ggml.pre = \"{name}\"`; supported: {supported}")]
    UnsupportedPre { name: String, supported: String },
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    #[error("cannot encode text: {0}")]
    Encode(String),
    #[error("cannot decode token ids: {0}")]
    Decode(String),
    #[error("token id {id} is outside the vocabulary ({vocab_size} tokens)")]
    UnknownId { id: u32, vocab_size: usize },
    #[error(
        "the two models use different tokenizers (fingerprint {a} vs {b}); KV transfer needs identical token ids: pick two models of the same family"
    )]
    Mismatch { a: String, b: String },
}

pub(crate) fn build_err(e: impl fmt::Display) -> TokenizerError {
    TokenizerError::Build(e.to_string())
}

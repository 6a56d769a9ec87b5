use std::path::PathBuf;

/// Everything that can go wrong loading or running a model. Each message names the
/// problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model file not found: {0} (check the path, or pass a name from assets/models.toml such as qwen2.5-coder-0.5b)")]
    NotFound(PathBuf),
    #[error("{path} is neither a GGUF file nor a safetensors directory: {reason}")]
    UnknownFormat { path: PathBuf, reason: String },
    #[error("{path} is not a readable GGUF file: {reason} (the file may be truncated or corrupt: fetch it again)")]
    BadGguf { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("unsupported architecture `{arch}`: baton runs qwen2, qwen3, llama and mistral (full attention) models")]
    UnsupportedArchitecture { arch: String },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The attention path asked for cannot run here; the message names why and the fix.
    #[error("{0}")]
    Attention(String),
    #[error("model metadata is missing `{key}`{hint}")]
    MissingMetadata { key: String, hint: String },
    #[error("model metadata `{key}` is invalid: {reason}")]
    BadMetadata { key: String, reason: String },
    #[error("weight tensor `{name}` is missing or unreadable: {reason}")]
    MissingTensor { name: String, reason: String },
    #[error("the input is {len} tokens long, past this model's context of {max} tokens: shorten the prompt or start a new conversation")]
    ContextOverflow { len: usize, max: usize },
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    BadToken { id: u32, vocab: usize },
    #[error("KV cache mismatch: {0}")]
    Cache(String),
    #[error("generation cancelled")]
    Cancelled,
    #[error(
        "the prompt is empty: give some text to continue (or use --chat to answer it as a message)"
    )]
    EmptyPrompt,
    /// A forward pass stopped early because its caller asked (not an error to report).
    #[error("forward pass interrupted")]
    Interrupted,
    #[error(transparent)]
    Tokenizer(#[from] crate::text::TokenizerError),
    #[error(transparent)]
    ChatTemplate(#[from] crate::text::ChatTemplateError),
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Kernel(#[from] crate::kernels::KernelError),
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

//! Text in and out of a model: tokenizers (from tokenizer.json or GGUF metadata), streaming
//! detokenization and chat templates.

pub mod chat_template;
mod error;
mod fingerprint;
mod gguf_meta;
mod gguf_tokenizer;
mod literal;
mod message;
mod pre_tokenizer;
mod special_tokens;
pub mod stream;
pub mod tokenizer;

pub use chat_template::{ChatTemplate, ChatTemplateError, PrefixStability};
pub use error::TokenizerError;
pub use message::{ChatMessage, Role};
pub use stream::TokenStream;
pub use tokenizer::{ensure_same_tokenizer, PreTokenizerKind, TextTokenizer};

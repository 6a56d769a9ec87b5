//! The model runtime: the CPU kernels, the decoder over a KV cache that the caller owns,
//! and the text side (tokenizers, chat templates, streaming detokenization). Nothing here
//! knows about a second model or a handoff.

pub mod kernels;
pub mod model;
pub mod os;
pub mod text;

//! How faithful a mapper is, measured: on held-out text ([`text`]: attention cosine per
//! layer, next-token agreement, continuation perplexity) and on benchmark tasks
//! ([`tasks`]: retention against the target's own prefill, raw and floor-normalised).

pub mod tasks;
pub mod text;

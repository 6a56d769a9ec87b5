//! Text in and out of a model: tokenizers (from tokenizer.json or GGUF metadata) and
//! chat templates.

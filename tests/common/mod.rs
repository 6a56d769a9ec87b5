//! Shared helpers for the end-to-end tests: real inputs come from baton's own fetcher
//! (the same cache CI fills), so these tests run for real wherever the suite runs.
#![allow(dead_code)]

pub mod synthetic;

use std::path::PathBuf;

/// Path of a manifest entry, fetched into the cache if missing. An environment variable
/// may point at a local copy instead.
pub fn artifact(env_var: &str, manifest_name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    match baton::fetch::ensure_by_name(manifest_name, &baton::fetch::SilentProgress) {
        Ok(f) => f.path,
        Err(e) => panic!("cannot fetch `{manifest_name}` for this test (set {env_var} to a local copy instead): {e}"),
    }
}

pub fn qwen_small() -> PathBuf {
    artifact("BATON_TEST_QWEN_GGUF", "qwen2.5-coder-0.5b")
}

pub fn qwen_large() -> PathBuf {
    artifact("BATON_TEST_QWEN_GGUF_2", "qwen2.5-coder-1.5b")
}

pub fn smollm() -> PathBuf {
    artifact("BATON_TEST_OTHER_GGUF", "smollm2-135m")
}

pub fn qwen_tokenizer_json() -> PathBuf {
    artifact("BATON_TEST_QWEN_TOKENIZER_JSON", "qwen-tokenizer-json")
}

/// Real inputs by variable name: the manifest's artifacts (fetched if missing), or a local
/// copy named by the variable. Only inputs outside the manifest may be absent, and then
/// the caller skips.
pub fn env_path(var: &str) -> Option<PathBuf> {
    match var {
        "BATON_TEST_QWEN_GGUF" => Some(qwen_small()),
        "BATON_TEST_QWEN_GGUF_2" => Some(qwen_large()),
        "BATON_TEST_OTHER_GGUF" => Some(smollm()),
        "BATON_TEST_QWEN_TOKENIZER_JSON" => Some(qwen_tokenizer_json()),
        _ => match std::env::var_os(var) {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ => {
                eprintln!("note: {var} is not set; skipping");
                None
            }
        },
    }
}

//! Shared helpers for the end-to-end tests: real inputs come from baton's own fetcher
//! (the same cache CI fills), so these tests run for real wherever the suite runs.
#![allow(dead_code)]

pub mod engine_rig;
pub mod fuzz;
pub mod handoff_pair;
pub mod learn_rig;
pub mod python;
pub mod study_rig;
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

/// Qwen3's tokenizer_config.json: its chat template calls Python string methods.
pub fn qwen_tokenizer_config() -> PathBuf {
    artifact("BATON_TEST_QWEN_TOKENIZER_CONFIG", "qwen-tokenizer-config")
}

pub fn llama3_tokenizer_json() -> PathBuf {
    artifact("BATON_TEST_LLAMA3_TOKENIZER_JSON", "llama3-tokenizer-json")
}

/// Whether the int8 kernels run on this CPU (AVX-512 VNNI or AVX2, or their portable
/// path where asked for), so an int8 map is not the f32 one under another name.
pub fn int8_kernels() -> bool {
    baton::kernels::int8::enabled()
}

/// `m`'s cache of `ids`, as a prefill leaves it.
pub fn prefill(m: &baton::model::Model, ids: &[u32]) -> baton::model::KvCache {
    let mut cache = m.decoder.new_cache();
    m.decoder
        .forward(ids, &mut cache, &baton::model::ForwardOptions::cache_only())
        .unwrap();
    cache
}

/// Whether `mapper` runs on the int8 kernels. Where this CPU lacks them it must have
/// fallen back to f32 (asserted), and `test`, an int8 comparison, is reported skipped.
pub fn int8_or_skipped(mapper: &baton::mapper::CacheMapper, test: &str) -> bool {
    use baton::mapper::MapPrecision;
    if int8_kernels() {
        return true;
    }
    assert_eq!(mapper.precision(), MapPrecision::F32);
    skipped(
        test,
        "no int8 kernels here (no AVX2): the int8 map falls back to f32, nothing to compare",
    );
    false
}

/// Says that `test` did not run and why, past the test harness's output capture (see
/// docs/testing.md's list of tests that can be skipped).
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// Overwrite element `index` of tensor `name` in the safetensors file at `path` with
/// `bytes` (one element's little-endian bytes): a file damaged where no checksum of the
/// format looks.
pub fn poison_tensor(path: &std::path::Path, name: &str, index: usize, bytes: &[u8]) {
    let mut file = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let start = header[name]["data_offsets"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("no tensor {name} in {}", path.display()))
        as usize;
    let at = 8 + n + start + index * bytes.len();
    file[at..at + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, file).unwrap();
}

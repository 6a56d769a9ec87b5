//! The readers that take files from users, fed damaged copies of real inputs: session
//! files, run scripts and the GGUF header with the metadata baton reads from it (model
//! config, tokenizer, chat template). Every input must end in a value or an error, never a
//! panic. Mapper artifacts get the same treatment in `mapper_synthetic`, which has one.
//!
//! The damage is seeded (ChaCha), so a failure names the case that reproduces it: byte
//! flips, bytes set to 0 or 0xFF, cuts, repeated and inserted runs, and 8-byte fields
//! overwritten with huge lengths (the way a length prefix sends a reader astray). Each
//! reader gets `BATON_FUZZ_CASES` cases (default 400; CI runs the default).

mod common;

use baton::headless::Script;
use baton::model::ModelConfig;
use baton::protocol::{Event, ModelInfo};
use baton::session::{parse_session, SessionHeader, SessionWriter};
use baton::text::{ChatTemplate, TextTokenizer};
use candle_core::quantized::gguf_file::Content;
use common::fuzz::{cases, fuzz};
use std::path::Path;

fn model(name: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        path: format!("/m/{name}.gguf"),
        sha256: "a".repeat(64),
        arch: "qwen2".into(),
        n_layer: 2,
        n_kv_head: 1,
        head_dim: 4,
    }
}

#[test]
fn damaged_session_files_are_read_or_refused_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let header = SessionHeader::new(
        vec![model("a"), model("b")],
        vec![],
        "cpu",
        serde_json::json!({"max_tokens": 8}),
    );
    let mut w = SessionWriter::create(&path, &header).unwrap();
    for e in [
        Event::UserMessage {
            turn: 1,
            text: "hello".into(),
        },
        Event::Bookmark {
            turn: 1,
            note: "n".into(),
        },
        Event::Done { turn: 1 },
        Event::ShutDown,
    ] {
        w.append(&e).unwrap();
    }
    drop(w);
    let seed = std::fs::read(&path).unwrap();
    assert!(parse_session(&seed, &path).is_ok());
    let read = |b: &[u8]| parse_session(b, &path).is_ok();
    fuzz("session", &seed, seed.len(), cases(), &read);
}

#[test]
fn damaged_run_scripts_are_read_or_refused_never_a_panic() {
    let seed = include_str!("../assets/demo.toml").as_bytes();
    assert!(Script::parse(include_str!("../assets/demo.toml"), "demo.toml").is_ok());
    let read = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(text) => Script::parse(text, "fuzzed.toml").is_ok(),
        Err(_) => false,
    };
    fuzz("run script", seed, seed.len(), cases(), &read);
}

/// The GGUF header and metadata up to the first tensor's data, of a real model.
fn gguf_header_bytes(path: &Path) -> Vec<u8> {
    let content = baton::model::load::read_gguf_header(path).unwrap();
    let bytes = std::fs::read(path).unwrap();
    bytes[..content.tensor_data_offset as usize].to_vec()
}

#[test]
fn damaged_gguf_headers_are_read_or_refused_never_a_panic() {
    let seed = gguf_header_bytes(&common::smollm());
    let read = |b: &[u8]| {
        // The header as candle reads it, then what baton builds from its metadata.
        let Ok(content) = Content::read(&mut std::io::Cursor::new(b)) else {
            return false;
        };
        let config = ModelConfig::from_gguf(&content.metadata).is_ok();
        let tok = TextTokenizer::from_gguf(&content).is_ok();
        let _ = ChatTemplate::from_gguf(&content);
        config && tok
    };
    // Damage lands in the first 64 KiB: the counts, keys, value types and the first
    // metadata values, where lengths are read from the file.
    fuzz("gguf header", &seed, 64 * 1024, cases(), &read);
}

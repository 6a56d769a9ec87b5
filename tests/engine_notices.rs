//! What the engine says on screen when it starts, on two tiny models: a mapper that did
//! no better than no context on its own held-out windows is named, with the command that
//! fixes it, and a good one is not.

mod common;

use baton::protocol::Event;
use common::engine_rig::{rig_with, write_pair};
use std::path::Path;

/// Set the held-out next-token KL of every artifact under `dir` to `factor` times the
/// no-context KL its report holds: in the metadata the artifact is read from (the
/// safetensors header's `baton` entry), rewritten with its tensors as they were.
fn set_kl(dir: &Path, factor: f64) {
    for entry in std::fs::read_dir(dir.join("mappers")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let meta = header["__metadata__"]["baton"]
            .as_str()
            .unwrap()
            .to_string();
        let mut meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
        let none = meta["report"]["agreement_no_context"]["kl"]
            .as_f64()
            .unwrap();
        meta["report"]["agreement"]["kl"] = serde_json::json!(none * factor);
        header["__metadata__"]["baton"] = serde_json::Value::String(meta.to_string());
        let mut head = serde_json::to_vec(&header).unwrap();
        // The data that follows stays aligned as the format asks: pad the header.
        while !head.len().is_multiple_of(8) {
            head.push(b' ');
        }
        let mut out = (head.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&head);
        out.extend_from_slice(&bytes[8 + n..]);
        std::fs::write(&path, out).unwrap();
    }
}

fn poor_notices(dir: &Path) -> Vec<String> {
    let rig = rig_with(dir, |_| {});
    rig.drain()
        .into_iter()
        .filter_map(|e| match e {
            Event::Notice { message } if message.contains("worth less than none") => Some(message),
            _ => None,
        })
        .collect()
}

#[test]
fn a_map_worse_than_no_context_is_said_on_screen_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    set_kl(dir.path(), 0.5);
    assert!(poor_notices(dir.path()).is_empty());
    set_kl(dir.path(), 2.0);
    let said = poor_notices(dir.path());
    assert_eq!(said.len(), 2, "one per direction: {said:?}");
    assert!(
        said.iter().all(|m| m.contains("`baton calibrate`")),
        "{said:?}"
    );
}

//! What the engine says on screen when it starts, on two tiny models: a mapper that did
//! no better than no context on its own held-out windows is named, with the command that
//! fixes it, and a good one is not.

mod common;

use baton::protocol::Event;
use common::engine_rig::{rig_with, write_pair};
use std::path::Path;

/// Set the held-out next-token KL of every artifact under `dir` to `factor` times the
/// no-context KL its report holds.
fn set_kl(dir: &Path, factor: f64) {
    for entry in std::fs::read_dir(dir.join("mappers")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let mut v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let none = v["report"]["agreement_no_context"]["kl"].as_f64().unwrap();
            v["report"]["agreement"]["kl"] = serde_json::json!(none * factor);
            std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
        }
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

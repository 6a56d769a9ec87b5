//! What a killed run leaves in the items folder: its items' sessions half-recorded under
//! `<id>.jsonl.<pid>.partial`. No rerun takes them for sessions, but they stay until
//! removed; a run removes its shard's at its start, holding the shard's lock, so that no
//! live run can be writing them (one of another shard count sharing these items is
//! refused by the lock as well).

use super::lock::ShardLock;
use super::plan::{Manifest, Shard};
use super::StudyError;
use std::collections::HashSet;
use std::path::Path;

/// Where the items' sessions go in a study's output directory.
pub const ITEMS_DIR: &str = "items";

/// The item a partial session's file name is of, if it is one: `<id>.jsonl.<pid>.partial`.
fn partial_of(name: &str) -> Option<&str> {
    let (rest, pid) = name.strip_suffix(".partial")?.rsplit_once('.')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.strip_suffix(".jsonl")
}

/// Removes the partial sessions of `shard`'s items under `out`, whose lock `_held` proves
/// is this run's; how many were removed. A file that cannot be removed is logged and
/// left: it stops nothing.
pub(super) fn remove_partials(
    out: &Path,
    manifest: &Manifest,
    shard: Shard,
    _held: &ShardLock,
) -> Result<usize, StudyError> {
    let dir = out.join(ITEMS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(StudyError::Io {
                path: dir,
                source: e,
            })
        }
    };
    let mine: HashSet<&str> = shard
        .items(manifest)
        .iter()
        .map(|i| i.id.as_str())
        .collect();
    let mut removed = 0;
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(partial_of) else {
            continue;
        };
        if !mine.contains(id) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::debug!("removed {}, left by a run that ended", path.display());
                removed += 1;
            }
            Err(e) => tracing::warn!("could not remove {}: {e}", path.display()),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_partial_sessions_name_an_item() {
        assert_eq!(
            partial_of("a.b-to-c.map.r1.jsonl.42.partial"),
            Some("a.b-to-c.map.r1")
        );
        for name in [
            "a.jsonl",
            "a.jsonl.failed",
            "a.jsonl.x42.partial",
            "a.jsonl..partial",
            "a.json.42.partial",
            ".manifest.json.42.7-0.partial",
        ] {
            assert_eq!(partial_of(name), None, "{name}");
        }
    }
}

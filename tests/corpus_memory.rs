//! A corpus larger than the memory the process may have calibrates: `baton calibrate`
//! reads a 2 GiB text file under a 1.5 GiB address-space limit (`ulimit -v`), shows its
//! progress, and saves mappers. Reading the file into memory whole, as an earlier build
//! did, cannot even hold its text under that limit.

mod common;

use common::synthetic::Tiny;
use std::io::Write;
use std::process::Command;

const CORPUS_BYTES: u64 = 2 << 30;
/// The address space allowed, in KiB: below the corpus's size, above what the binary maps
/// for itself (its code, the tiny models, thread stacks and allocator arenas).
const LIMIT_KIB: u64 = 1536 << 10;

#[test]
fn a_2_gib_corpus_calibrates_under_a_smaller_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny {
        context: 256,
        ..Tiny::new("qwen2")
    };
    tiny.write_chat_model(&dir.path().join("a"), 5);
    tiny.write_chat_model(&dir.path().join("b"), 6);
    let corpus = dir.path().join("big.txt");
    {
        let mut block = String::new();
        for seed in 0..64 {
            block.push_str(&tiny.text(2000, 11 + seed));
            block.push('\n');
        }
        let mut f = std::io::BufWriter::new(std::fs::File::create(&corpus).unwrap());
        let mut written = 0u64;
        while written < CORPUS_BYTES {
            f.write_all(block.as_bytes()).unwrap();
            written += block.len() as u64;
        }
        f.flush().unwrap();
    }
    let args = [
        "calibrate",
        "--source",
        &dir.path().join("a").display().to_string(),
        "--target",
        &dir.path().join("b").display().to_string(),
        "--corpus",
        &corpus.display().to_string(),
        "--sequences",
        "6",
        "--seq-len",
        "48",
        "--select-sequences",
        "2",
        "--k",
        "1",
        "--token-features",
        "off",
        "--accept-poor",
        "--mapper-dir",
        &dir.path().join("mappers").display().to_string(),
    ]
    .map(|a| format!("'{a}'"))
    .join(" ");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {LIMIT_KIB} && exec '{}' {args}",
            env!("CARGO_BIN_EXE_baton")
        ))
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "calibrate failed: {err}");
    // Progress while the corpus is read: plain lines, stderr being no terminal.
    assert!(err.contains("reading the corpus (MiB)"), "{err}");
    let saved = std::fs::read_dir(dir.path().join("mappers"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .count();
    assert_eq!(saved, 2, "a mapper each way: {err}");
    eprintln!(
        "calibrate's peak resident memory: {} MiB",
        peak_child_rss_kib() >> 10
    );
}

/// The largest resident set of the children waited for so far, in KiB.
fn peak_child_rss_kib() -> i64 {
    // SAFETY: getrusage only writes the struct it is given.
    unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut r);
        r.ru_maxrss
    }
}

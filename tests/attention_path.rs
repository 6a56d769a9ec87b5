//! `--attention` through the binary: `baton info` names the path a model attends on, and
//! the fused path is refused where it cannot run (a build without its kernels, the CPU)
//! with a message naming why and the way out, before any weight is read.

mod common;

use common::engine_rig::tiny;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn baton(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .env("BATON_CACHE_DIR", dir.join("cache"))
        .env_remove("BATON_ACTIVATIONS")
        .env_remove("BATON_ATTENTION")
        .env_remove("BATON_DEVICE")
        .output()
        .unwrap()
}

fn attention(dir: &Path, args: &[&str]) -> String {
    let out = baton(dir, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["attention"].as_str().unwrap_or_default().to_string()
}

#[test]
fn info_names_the_path_and_fused_is_refused_off_the_gpu() {
    let d = tempfile::tempdir().unwrap();
    let model = d.path().join("m");
    tiny().write_chat_model(&model, 5);
    let m = model.to_str().unwrap();
    // f32 on the CPU runs baton's exact kernels whatever the flag; bf16 runs the batched
    // path a GPU runs by default.
    assert_eq!(attention(d.path(), &["info", "--json", "-m", m]), "exact");
    let bf16 = ["--activations", "bf16", "info", "--json", "-m", m];
    assert_eq!(attention(d.path(), &bf16), "batched");
    let out = baton(d.path(), &["info", "-m", m]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("attention     exact:"), "{table}");

    let out = baton(
        d.path(),
        &[
            "--attention",
            "fused",
            "--activations",
            "bf16",
            "info",
            "-m",
            m,
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--attention fused cannot run here"), "{err}");
    assert!(err.contains("--attention batched"), "{err}");
    let why = if baton::model::attention::fused::coverage().is_some() {
        "--device cuda"
    } else {
        "scripts/check-cuda --flash"
    };
    assert!(err.contains(why), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

//! The GPU check (`scripts/device-check`) dry-run on the CPU: tiny random-weight models
//! of the real vocabulary, bf16 activations, every step the GPU machine runs. A step the
//! binary or the scripts no longer support fails here, not on a lent GPU with minutes of
//! time on it.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::Command;

/// The same packages as the safetensors test: one install serves both.
const PIP_PACKAGES: &[&str] = &["gguf==0.19.0", "safetensors==0.8.0", "numpy"];

#[test]
fn the_device_check_dry_runs_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("tokenizer");
    std::fs::create_dir_all(&tok).unwrap();
    std::fs::copy(common::qwen_tokenizer_json(), tok.join("tokenizer.json")).unwrap();
    std::fs::copy(
        common::qwen_tokenizer_config(),
        tok.join("tokenizer_config.json"),
    )
    .unwrap();
    let out = dir.path().join("out");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = Command::new(root.join("scripts/device-check"))
        .arg("--dry-run")
        .arg(env!("CARGO_BIN_EXE_baton"))
        .arg(&tok)
        .arg(&out)
        .env("PYTHONPATH", common::python::packages(PIP_PACKAGES))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let log = std::fs::read_to_string(out.join("check.log")).unwrap();
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("check.json")).unwrap()).unwrap();
    assert_eq!(doc["format"], "baton.device-check");
    // What the binary was built with, so that a device's first call says whether it ran
    // the fused attention kernels: this test's binary is built without them.
    let build = doc["build"].as_str().unwrap_or_default();
    assert!(
        build.starts_with(&format!("baton {}", env!("CARGO_PKG_VERSION"))),
        "{}",
        doc["build"]
    );
    assert_eq!(doc["fused_attention"], cfg!(feature = "flash"), "{build}");
    let fused_steps = ["generate-fused", "paths", "bench-fused"];
    for (name, step) in doc["steps"].as_object().unwrap() {
        if fused_steps.contains(&name.as_str()) && !cfg!(feature = "flash") {
            // Without the kernels the fused steps say so, and why, instead of failing.
            let why = step["skipped"].as_str().unwrap_or_default();
            assert!(why.contains("scripts/check-cuda --flash"), "{name}: {step}");
            continue;
        }
        if fused_steps.contains(&name.as_str()) && name != "paths" {
            // With them, on the dry run's CPU, the binary refuses the fused path by name.
            assert_eq!(step["exit"], 1, "{name}: {step}");
            assert!(
                step["error"].to_string().contains("--device cuda"),
                "{step}"
            );
            continue;
        }
        assert_eq!(step["exit"], 0, "{name}: {step}\n{log}");
    }
    let steps = &doc["steps"];
    assert!(steps["generate"]["decode_tok_s"].as_f64().unwrap() > 0.0);
    // Either PyTorch ran the same ids, or the check says why it did not.
    let logits = &steps["logits"]["result"];
    assert!(
        logits["cosine"].is_number() || logits["skipped"].is_string(),
        "{logits}"
    );
    let bench = steps["bench"]["result"]["results"].as_array().unwrap();
    assert!(!bench.is_empty(), "{}", steps["bench"]);
    // The prefill table: every length of both bench steps, short and long, with the
    // target's re-prefill and the map on the batched path; PyTorch's prefill beside it
    // where torch ran.
    let table = doc["prefill"].as_array().unwrap();
    let tokens: Vec<u64> = table.iter().filter_map(|r| r["tokens"].as_u64()).collect();
    assert_eq!(tokens, [128, 256, 384], "{}", doc["prefill"]);
    for row in table {
        assert!(row["reprefill_batched_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["map_batched_ms"].as_f64().unwrap() > 0.0, "{row}");
    }
    let torch = &steps["prefill-torch"]["result"];
    match torch["results"].as_array() {
        Some(rows) => {
            assert_eq!(rows.len(), 3, "{torch}");
            assert!(table.iter().all(|r| r["batched_over_torch"].is_number()));
        }
        None => assert!(torch["skipped"].is_string(), "{torch}"),
    }
    let eval = &steps["eval"]["result"]["results"][0]["text"];
    assert!(eval["cosine_continuation"].is_array(), "{eval}");
    // The map in bf16 against the same mapper in f32 on the CPU: per-layer attention
    // cosines within bf16's reach (0.002 in the tiny test of bf16 activations).
    let diff = &doc["map_device_vs_cpu"]["max_abs_difference"];
    let cos = diff["attention_cosine"].as_f64().unwrap_or(f64::NAN);
    assert!(cos < 0.02, "{}", doc["map_device_vs_cpu"]);
}

//! A Hugging Face safetensors directory from outside: the default 0.5B GGUF's weights
//! written out by a Python script that knows nothing of baton (tensor names from the
//! `gguf` package's TensorNameMap, values dequantized by `gguf.quants.dequantize`,
//! config.json from the GGUF metadata), loaded the way `--model DIR` loads it, and held to
//! the GGUF path's logits on the same ids.
//!
//! The script's Python packages are installed with pip (pinned, into baton's cache dir,
//! once) as the ordinary client installs them.

mod common;

use baton::fetch::{resolve_model, SilentProgress};
use baton::model::{ForwardOptions, LoadOptions, Logits, Model};
use candle_core::{Device, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;

const PIP_PACKAGES: &[&str] = &["gguf==0.19.0", "safetensors==0.8.0", "numpy"];

const PROMPT: &str = "def quicksort(xs):\n    \"\"\"Sort a list of numbers.\"\"\"\n    \
     if len(xs) <= 1:\n        return xs\n    pivot = xs[len(xs) // 2]\n";

fn python() -> String {
    common::python::python()
}

fn python_packages() -> PathBuf {
    common::python::packages(PIP_PACKAGES)
}

/// Runs the converter on `gguf`, writing the model directory `out`.
fn convert(gguf: &Path, out: &Path) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_to_safetensors.py");
    let result = Command::new(python())
        .arg(&script)
        .arg(gguf)
        .arg(out)
        .arg(common::qwen_tokenizer_json())
        .env("PYTHONPATH", python_packages())
        .output()
        .expect("run the converter");
    assert!(
        result.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&result.stderr)
    );
}

fn all_logits(m: &Model, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = m.decoder.new_cache();
    let out = m
        .decoder
        .forward(
            ids,
            &mut cache,
            &ForwardOptions {
                logits: Logits::All,
                probe_positions: vec![],
            },
        )
        .expect("forward");
    let logits: Tensor = out.logits.expect("logits");
    logits.to_vec2::<f32>().expect("logits as rows")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap_or(0)
}

#[test]
fn a_safetensors_directory_written_from_the_gguf_gives_the_gguf_paths_logits() {
    let gguf = common::qwen_small();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("qwen2.5-coder-0.5b-hf");
    convert(&gguf, &dir);

    let dev = Device::Cpu;
    // The file's own blocks, not re-quantized: the same numbers the directory holds.
    let native = LoadOptions {
        convert_slow_blocks: false,
        compute: Default::default(),
    };
    let from_gguf = Model::load(
        &resolve_model(gguf.to_str().unwrap(), &SilentProgress).unwrap(),
        &dev,
        native,
    )
    .unwrap();
    let from_dir = Model::load(
        &resolve_model(dir.to_str().unwrap(), &SilentProgress).unwrap(),
        &dev,
        native,
    )
    .unwrap();
    assert_eq!(
        from_dir.identity.format,
        baton::model::ModelFormat::Safetensors
    );
    assert!(
        from_dir.template.is_some(),
        "tokenizer_config.json's template"
    );

    // Qwen3's tokenizer.json (Qwen2.5's vocabulary and merges, four tokens more) cuts the
    // prompt as the GGUF's own vocabulary does.
    let ids = from_gguf.tokenizer.encode(PROMPT).unwrap();
    assert_eq!(from_dir.tokenizer.encode(PROMPT).unwrap(), ids);

    let a = all_logits(&from_gguf, &ids);
    let b = all_logits(&from_dir, &ids);
    let n = ids.len();
    let cos: Vec<f64> = (0..n).map(|i| cosine(&a[i], &b[i])).collect();
    let same_top = (0..n).filter(|&i| argmax(&a[i]) == argmax(&b[i])).count();
    let max_abs = (0..n)
        .flat_map(|i| a[i].iter().zip(&b[i]).map(|(x, y)| (x - y).abs()))
        .fold(0f32, f32::max);
    let worst = cos.iter().cloned().fold(1.0, f64::min);
    let mean = cos.iter().sum::<f64>() / n as f64;
    eprintln!(
        "{n} positions: cosine min {worst:.6}, mean {mean:.6}, last {:.6}; top-1 same at \
         {same_top}/{n}; max |dlogit| {max_abs:.3}",
        cos[n - 1]
    );
    // The weights are the same numbers; what differs is the arithmetic: the GGUF path
    // quantizes each activation row to 8 bits before its quantized matmul, the directory
    // multiplies in f32. Measured on this prompt: cosine min 0.9988 (the second position,
    // where activations are largest), mean 0.9998, last 0.9997, top-1 the same at every
    // position, max |dlogit| 0.61. The same directory with Q and K permuted as llama.cpp
    // permutes LLaMA-style models gives cosine min 0.45 (last 0.58), and with a RoPE base
    // of 1e4 instead of 1e6 min 0.92, mean 0.993, last 0.958 while top-1 still agrees at
    // 36 of 37 positions: top-1 alone does not tell, the cosine does.
    assert!(worst >= 0.998, "cosines {cos:?}");
    assert!(mean >= 0.9995, "mean cosine {mean}: {cos:?}");
    assert!(cos[n - 1] >= 0.999, "last position cosine {}", cos[n - 1]);
    assert_eq!(
        argmax(&a[n - 1]),
        argmax(&b[n - 1]),
        "top-1 at the last position"
    );
    for i in (0..n).filter(|&i| argmax(&a[i]) != argmax(&b[i])) {
        let (ta, tb) = (argmax(&a[i]), argmax(&b[i]));
        let margin = b[i][tb] - b[i][ta];
        assert!(margin < 0.25, "position {i}: not a near-tie ({margin})");
    }
}

#[test]
fn an_untied_directory_without_its_output_projection_is_refused_by_name() {
    let tiny = common::synthetic::Tiny::new("qwen2");
    let mut weights = tiny.weights(3);
    weights.remove("lm_head.weight");
    let dir = tempfile::tempdir().unwrap();
    common::synthetic::write_model(&tiny, dir.path(), &weights);
    let load = || {
        baton::model::load_decoder(
            dir.path(),
            &Device::Cpu,
            LoadOptions::for_device(&Device::Cpu),
        )
    };
    // Saying nothing is transformers' default: tied, the embedding is the projection.
    assert!(load().is_ok());

    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["tie_word_embeddings"] = serde_json::json!(false);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let msg = load().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("lm_head.weight"), "{msg}");
    assert!(msg.contains("tie_word_embeddings to false"), "{msg}");
}

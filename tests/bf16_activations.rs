//! The reduced-precision path a GPU runs (bf16 activations), run on the CPU through the
//! binary with `--activations bf16`, on two tiny chat models generated here: calibrate,
//! a scripted conversation with a switch (a 30% re-read plan, learning and repair on),
//! and eval all complete, and what they measure stays near the f32 run's. Without this,
//! only a GPU would show a bf16 tensor read as f32 (calibration's capture once failed
//! that way on CUDA, after 6 s).

mod common;

use common::engine_rig::tiny;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn baton(dir: &Path, activations: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .args(["--activations", activations])
        .current_dir(dir)
        .env("BATON_CACHE_DIR", dir.join("cache"))
        .env_remove("BATON_ACTIVATIONS")
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The held-out attention cosine the calibration of `mappers` reported, source to target.
fn heldout_cosine(mappers: &Path) -> f64 {
    let json = std::fs::read_dir(mappers)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|x| x == "json")
                && p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("a__to__b")
        })
        .expect("a mapper a → b");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["report"]["full_cosine"]
        .as_f64()
        .unwrap_or_else(|| panic!("a held-out cosine in {}", v["report"]))
}

/// The mean attention cosine of the session's first switch.
fn switch_cosine(session: &Path) -> f64 {
    let s = baton::session::read_session(session).unwrap();
    let rows = baton::protocol::SwitchRows::of(s.events());
    let row = rows.first().expect("a switch");
    row.cosine_mean().expect("the switch was measured")
}

#[test]
fn calibrate_a_switch_and_eval_run_with_bf16_activations() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tiny().write_chat_model(&d.join("a"), 5);
    tiny().write_chat_model(&d.join("b"), 6);
    let corpus = d.join("corpus.txt");
    let text: Vec<String> = (0..4).map(|i| tiny().text(2000, 41 + i)).collect();
    std::fs::write(&corpus, text.join("\n")).unwrap();
    let script = d.join("s.toml");
    std::fs::write(
        &script,
        format!(
            "max_tokens = 6\nreread = \"0.3\"\n\n[[step]]\nuser = \"{}\"\n\n[[step]]\nswitch = true\n\n[[step]]\nuser = \"{}\"\n",
            tiny().chat_text(150, 3),
            tiny().chat_text(8, 4),
        ),
    )
    .unwrap();

    let mut measured = Vec::new();
    for dtype in ["f32", "bf16"] {
        let mappers = format!("mappers-{dtype}");
        ok(baton(
            d,
            dtype,
            &[
                "calibrate",
                "-s",
                "a",
                "-t",
                "b",
                "-M",
                &mappers,
                "-c",
                "corpus.txt",
                "-N",
                "6",
                "--seq-len",
                "48",
                "--stride",
                "1",
                "--select-sequences",
                "2",
                "-k",
                "2",
                "--token-features",
                "off",
                "--accept-poor",
            ],
        ));
        let cal = heldout_cosine(&d.join(&mappers));

        let session = format!("{dtype}.jsonl");
        let transcript = ok(baton(
            d,
            dtype,
            &[
                "run", "-f", "s.toml", "-s", "a", "-t", "b", "-M", &mappers, "-r", &session,
                "--repair",
            ],
        ));
        assert!(transcript.contains("[turn 2]"), "{transcript}");
        let switch = switch_cosine(&d.join(&session));

        let eval: Value = serde_json::from_str(&ok(baton(
            d,
            dtype,
            &[
                "eval",
                "-s",
                "a",
                "-t",
                "b",
                "-M",
                &mappers,
                "--texts",
                "corpus.txt",
                "--limit",
                "2",
                "--prefix",
                "32",
                "--continuation",
                "8",
                "-D",
                "source-to-target",
                "-j",
            ],
        )))
        .unwrap();
        let text = &eval["results"][0]["text"];
        let cos: Vec<f64> = text["cosine_continuation"]
            .as_array()
            .unwrap_or_else(|| panic!("attention cosines in {eval}"))
            .iter()
            .filter_map(Value::as_f64)
            .collect();
        assert!(!cos.is_empty(), "{eval}");
        let eval_cos = cos.iter().sum::<f64>() / cos.len() as f64;
        measured.push((dtype, cal, switch, eval_cos));
    }
    eprintln!("(dtype, calibration, switch, eval) attention cosines: {measured:?}");
    let (_, c32, s32, e32) = measured[0];
    let (_, c16, s16, e16) = measured[1];
    // bf16 keeps 8 bits of mantissa, a relative error of at most 0.4% a value; measured
    // here it moves these cosines by about 0.002. A mapper fitted on misread activations
    // moves them by far more than 0.02. Not equal either: the run did compute in bf16.
    for (what, a, b) in [
        ("calibration", c32, c16),
        ("switch", s32, s16),
        ("eval", e32, e16),
    ] {
        assert!(
            b.is_finite() && (a - b).abs() < 0.02,
            "{what}: f32 {a}, bf16 {b}"
        );
        assert_ne!(a, b, "{what}: the bf16 run gave the f32 run's very number");
    }
}

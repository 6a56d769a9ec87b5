//! Bad input gets one clear error naming the problem, never a panic.

mod common;

use baton::model::{load_decoder, LoadOptions, ModelError};
use baton::text::ensure_same_tokenizer;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::Path;
use std::process::Command;

fn load_err(path: &Path) -> ModelError {
    match load_decoder(path, &Device::Cpu, LoadOptions::for_device(&Device::Cpu)) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e,
    }
}

/// A metadata-only GGUF with one tiny tensor, for architectures baton must refuse.
fn tiny_gguf(path: &Path, arch: &str, extra: &[(&str, Value)]) {
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), Value::U32(1)),
        (format!("{arch}.embedding_length"), Value::U32(32)),
        (format!("{arch}.feed_forward_length"), Value::U32(64)),
        (format!("{arch}.attention.head_count"), Value::U32(4)),
        (format!("{arch}.context_length"), Value::U32(128)),
        (format!("{arch}.vocab_size"), Value::U32(16)),
    ];
    for (k, v) in extra {
        md.push((k.to_string(), v.clone()));
    }
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t = QTensor::quantize(
        &Tensor::zeros((1, 32), candle_core::DType::F32, &Device::Cpu).unwrap(),
        GgmlDType::F32,
    )
    .unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &[("token_embd.weight", &t)]).unwrap();
}

#[test]
fn missing_file_is_named() {
    let e = load_err(Path::new("/definitely/not/here.gguf"));
    assert!(matches!(e, ModelError::NotFound(_)), "{e}");
    assert!(e.to_string().contains("/definitely/not/here.gguf"), "{e}");
}

#[test]
fn a_file_that_is_not_a_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(&p, "hello, not a model").unwrap();
    let e = load_err(&p);
    assert!(matches!(e, ModelError::UnknownFormat { .. }), "{e}");
    assert!(e.to_string().contains("GGUF"), "{e}");
    // A directory without config.json is no safetensors model either.
    let e = load_err(dir.path());
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn truncated_gguf_is_caught_before_any_tensor_is_read() {
    let src = common::smollm();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 3]).unwrap();
    let e = load_err(&p);
    assert!(matches!(e, ModelError::BadGguf { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    // Cut inside the header: still a clear GGUF error.
    std::fs::write(&p, &bytes[..100]).unwrap();
    assert!(matches!(load_err(&p), ModelError::BadGguf { .. }));
}

#[test]
fn unsupported_and_sliding_window_architectures_are_refused_with_reason() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gemma.gguf");
    tiny_gguf(&p, "gemma3", &[]);
    let e = load_err(&p);
    assert!(
        matches!(e, ModelError::UnsupportedArchitecture { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("gemma3"), "{e}");

    let p = dir.path().join("mistral-swa.gguf");
    tiny_gguf(
        &p,
        "llama",
        &[("llama.attention.sliding_window", Value::U32(4096))],
    );
    let e = load_err(&p);
    assert!(e.to_string().contains("sliding-window"), "{e}");
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let dev = Device::Cpu;
    let m = load_decoder(&common::smollm(), &dev, LoadOptions::for_device(&dev)).unwrap();
    let ctx = m.decoder.config().context_length;
    let ids = vec![1u32; ctx + 1];
    let mut cache = m.decoder.new_cache();
    let e = m.decoder.next_logits(&ids, &mut cache).unwrap_err();
    assert!(matches!(e, ModelError::ContextOverflow { .. }), "{e}");
    assert!(e.to_string().contains(&ctx.to_string()), "{e}");
    assert_eq!(cache.len(), 0, "a refused input leaves the cache untouched");
}

#[test]
fn a_pair_with_different_tokenizers_is_refused() {
    let dev = Device::Cpu;
    let qwen = baton::fetch::open_model(
        common::qwen_small().to_str().unwrap(),
        &dev,
        &baton::fetch::SilentProgress,
    )
    .unwrap();
    let smol = baton::fetch::open_model(
        common::smollm().to_str().unwrap(),
        &dev,
        &baton::fetch::SilentProgress,
    )
    .unwrap();
    let e = ensure_same_tokenizer(&qwen.tokenizer, &smol.tokenizer).unwrap_err();
    assert!(e.to_string().contains("different tokenizers"), "{e}");
}

#[test]
fn the_binary_reports_errors_in_one_line_and_exits_non_zero() {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["info", "--model", "no-such-model-name"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error:") && err.contains("qwen2.5-coder-0.5b"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_backtrace_asked_for_never_lands_inside_an_error_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.gguf");
    let bytes = std::fs::read(common::smollm()).unwrap();
    for cut in [100, bytes.len() / 3] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["info", "--model", p.to_str().unwrap()])
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error:"), "{err}");
        assert!(
            !err.contains("backtrace") && err.trim().lines().count() <= 2,
            "{err}"
        );
    }
}

#[test]
fn the_workbench_without_a_terminal_says_so_and_names_the_headless_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("interactive terminal") && err.contains("baton run --script"),
        "{err}"
    );
}

#[test]
fn impossible_options_are_refused_by_the_binary_before_any_model_loads() {
    for (args, says) in [
        (&["eval", "--anchor", "500"][..], "--anchor 500"),
        (&["eval", "--prefix", "0"], "--prefix"),
        (
            &["generate", "-p", "hi", "--temperature", "NaN"],
            "temperature",
        ),
        (
            &["generate", "-p", "hi", "--max-tokens", "0"],
            "--max-tokens",
        ),
        (
            &["bench", "--suffix", "1000", "--lengths", "128"],
            "--suffix 1000",
        ),
        (&["bench", "--repeats", "0"], "--repeats"),
        (&["calibrate", "--sequences", "0"], "--merge-stats"),
        (
            &["eval", "--learn", "--no-text", "--tasks", "hellaswag"],
            "--conversations N",
        ),
        (
            &[
                "eval",
                "--learn",
                "--conversations",
                "2",
                "--key-gain",
                "1.25",
            ],
            "--key-gain",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(args)
            // A model name that does not exist: had the check come after loading, the
            // error would name the model instead.
            .args(if args[0] == "generate" {
                &["--model", "no-such-model"][..]
            } else {
                &["--source", "no-such-model"][..]
            })
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("no-such-model"),
            "{args:?} loaded first: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn an_empty_prompt_is_named_as_such() {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["generate", "-p", "", "--model"])
        .arg(common::qwen_small())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the prompt is empty"), "{err}");
    assert!(!err.contains("KV cache"), "{err}");
}

#[test]
fn a_folder_named_like_a_known_model_does_not_shadow_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("qwen2.5-coder-0.5b")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.path())
        .args(["info", "--model", "qwen2.5-coder-0.5b", "--json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\"name\": \"qwen2.5-coder-0.5b\""), "{text}");
    // Written as a path, the folder is what is opened (and it holds no model).
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .current_dir(dir.path())
        .args(["info", "--model", "./qwen2.5-coder-0.5b"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn a_record_path_under_a_file_is_refused_before_anything_loads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["workbench", "--source", "no-such-model", "--record"])
        .arg(file.join("s.jsonl"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("notes.txt is a file, not a directory"),
        "{err}"
    );
    assert!(!err.contains("no-such-model"), "{err}");
}

#[test]
fn info_says_whether_the_digest_was_hashed_now_or_trusted_from_its_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("copy.gguf");
    std::fs::copy(common::smollm(), &p).unwrap();
    let check = || {
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["info", "--json", "--model", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            v["sha256_check"].as_str().unwrap_or_default().to_string(),
            v["identity"]["sha256"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    let (first, sha) = check();
    assert_eq!(first, "hashed_now");
    let (second, again) = check();
    assert_eq!(second, "stamp", "the second start trusts the stamp");
    assert_eq!(sha, again);
    // A changed modification time voids the stamp: hashed again.
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    assert_eq!(check().0, "hashed_now");
}

#[test]
fn a_mapper_dir_that_is_a_file_is_refused_before_any_work_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("afile");
    std::fs::write(&file, "not a directory").unwrap();
    let f = file.to_str().unwrap();
    for args in [
        &["calibrate", "--mapper-dir", f][..],
        &["run", "--script", "none.toml", "--mapper-dir", f],
        &["eval", "--mapper-dir", f],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is a file, not a directory") && err.contains("afile"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("baton calibrate"), "the wrong fix: {err}");
    }
}

#[test]
fn a_vocabulary_larger_than_the_embedding_is_refused_at_load() {
    use common::synthetic::Tiny;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tiny.gguf");
    let tiny = Tiny::new("llama");
    tiny.write_gguf(&p, 1);
    // The metadata's vocabulary size, a u32 after its key and its type, made 8 larger
    // than the 128 embedding rows.
    let mut bytes = std::fs::read(&p).unwrap();
    let key = b"llama.vocab_size";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key is in the file")
        + key.len()
        + 4;
    assert_eq!(bytes[at..at + 4], 128u32.to_le_bytes());
    bytes[at..at + 4].copy_from_slice(&136u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let e = load_err(&p).to_string();
    assert!(e.contains("136 tokens") && e.contains("128 rows"), "{e}");
    // As written (a vocabulary the embedding covers), it loads.
    tiny.write_gguf(&p, 1);
    load_decoder(&p, &Device::Cpu, LoadOptions::for_device(&Device::Cpu)).unwrap();
}

/// `baton <args> --source no-such-model`'s stderr, or `None` when it ran past `limit`
/// (and was killed).
fn stderr_within(args: &[&std::ffi::OsStr], limit: std::time::Duration) -> Option<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .args(["--source", "no-such-model"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{args:?}");
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn text_inputs_that_hold_no_text_are_refused_by_path_before_any_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-dir");
    std::fs::create_dir(&empty).unwrap();
    let binary = dir.path().join("blob.txt");
    std::fs::write(&binary, [0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0]).unwrap();
    let zeros = dir.path().join("zeros.txt");
    std::fs::write(&zeros, [0u8; 64]).unwrap();
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    let missing = dir.path().join("missing.txt");
    let mappers = dir.path().join("mappers");
    for (path, says) in [
        (&empty, "holds no file baton reads as text"),
        (&binary, "binary file"),
        (&zeros, "binary file"),
        (&latin1, "not UTF-8"),
        (&missing, "does not exist"),
    ] {
        for flag in [&["eval", "--texts"][..], &["calibrate", "--corpus"]] {
            let mut args: Vec<&std::ffi::OsStr> = flag.iter().map(|s| s.as_ref()).collect();
            args.extend([
                path.as_os_str(),
                "--mapper-dir".as_ref(),
                mappers.as_os_str(),
            ]);
            let err = stderr_within(&args, std::time::Duration::from_secs(60))
                .unwrap_or_else(|| panic!("{flag:?} {} did not end", path.display()));
            let name = path.file_name().unwrap().to_str().unwrap();
            assert!(err.contains(name) && err.contains(says), "{flag:?}: {err}");
            // Had the models been loaded first, the error would name the missing model.
            assert!(
                !err.contains("no-such-model"),
                "{flag:?} loaded first: {err}"
            );
            assert!(!err.contains("panicked"), "{flag:?}: {err}");
        }
    }
}

#[cfg(unix)]
#[test]
fn texts_with_a_link_back_to_their_own_directory_are_read_and_the_command_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let texts = dir.path().join("texts");
    std::fs::create_dir_all(texts.join("sub")).unwrap();
    std::fs::write(texts.join("sub/story.txt"), "once upon a time\n".repeat(50)).unwrap();
    std::os::unix::fs::symlink(&texts, texts.join("sub/loop")).unwrap();
    let mappers = dir.path().join("mappers");
    for flag in ["--texts", "--corpus"] {
        let cmd = if flag == "--texts" {
            "eval"
        } else {
            "calibrate"
        };
        let args: Vec<&std::ffi::OsStr> = vec![
            cmd.as_ref(),
            flag.as_ref(),
            texts.as_os_str(),
            "--mapper-dir".as_ref(),
            mappers.as_os_str(),
        ];
        let err = stderr_within(&args, std::time::Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{cmd} with a link loop in {flag} did not end"));
        // The text was read, and the next thing the command does is open the models.
        assert!(err.contains("no-such-model"), "{cmd}: {err}");
    }
}

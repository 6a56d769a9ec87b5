//! Settings read from the environment, through the binary: a bad value is an error that
//! names the variable it came from (not a flag the person never typed), the value, what
//! is accepted and the fix; and it is never ignored in silence.

use std::path::Path;
use std::process::{Command, Output};

/// `baton ARGS` with a cache dir of its own and none of the variables under test set.
fn baton(cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_baton"));
    c.args(args)
        .env("BATON_CACHE_DIR", cache)
        .env_remove("BATON_LOG_DIR");
    for var in [
        "BATON_CPU_LEVEL",
        "BATON_DEVICE",
        "BATON_ACTIVATIONS",
        "BATON_ATTENTION",
        "BATON_MAPPER_DIR",
    ] {
        c.env_remove(var);
    }
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("baton runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(c: Command) -> String {
    let o = run(c);
    let err = stderr(&o);
    assert!(!o.status.success(), "accepted: {err}");
    err
}

fn accepted(c: Command) {
    let o = run(c);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn an_unknown_cpu_level_is_refused_with_the_accepted_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = baton(dir.path(), &["mappers"]);
    c.env("BATON_CPU_LEVEL", "foo");
    let err = refused(c);
    for part in ["BATON_CPU_LEVEL", "`foo`", "avx2", "avx512", "unset"] {
        assert!(err.contains(part), "{part} not in: {err}");
    }
    for level in ["avx2", "AVX512", ""] {
        let mut c = baton(dir.path(), &["mappers"]);
        c.env("BATON_CPU_LEVEL", level);
        accepted(c);
    }
}

#[test]
fn a_cache_dir_that_is_a_file_is_refused_by_every_command_that_uses_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cache");
    std::fs::write(&file, "not a directory").unwrap();
    for cache in [file.clone(), file.join("below")] {
        for args in [&["mappers"][..], &["info", "-m", "qwen2.5-coder-0.5b"]] {
            let err = refused(baton(&cache, args));
            assert!(
                err.contains("BATON_CACHE_DIR")
                    && err.contains(&cache.display().to_string())
                    && err.contains("not a directory"),
                "{args:?}: {err}"
            );
            assert!(!err.contains("no mappers yet"), "{err}");
        }
    }
    // A cache dir that does not exist yet is made when needed.
    accepted(baton(&dir.path().join("new"), &["mappers"]));
}

#[test]
fn a_bad_value_names_the_variable_it_came_from_or_else_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file = file.display().to_string();
    let cases = [
        ("BATON_DEVICE", "gpu9", "--device", "cpu, cuda or cuda:N"),
        (
            "BATON_ACTIVATIONS",
            "xyz",
            "--activations",
            "auto, f32, bf16 or f16",
        ),
        (
            "BATON_ATTENTION",
            "flash",
            "--attention",
            "batched or fused",
        ),
        (
            "BATON_MAPPER_DIR",
            file.as_str(),
            "--mapper-dir",
            "not a directory",
        ),
    ];
    for (var, value, flag, accepted_values) in cases {
        let mut c = baton(dir.path(), &["mappers"]);
        c.env(var, value);
        let err = refused(c);
        for part in [var, value, accepted_values] {
            assert!(err.contains(part), "{var}: {part} not in: {err}");
        }
        assert!(!err.contains(&format!("'{flag}")), "{var}: {err}");

        // The same value on the command line: the flag is named.
        let err = refused(baton(dir.path(), &["mappers", flag, value]));
        assert!(err.contains(flag) && err.contains(accepted_values), "{err}");
        assert!(!err.contains(var), "{flag}: {err}");
    }
    // A command's flag overrides its variable, so a bad variable under a good flag is no
    // error. (A global flag's variable is read by clap for every command level, so a
    // bad BATON_DEVICE is refused, by name, even beside --device.)
    let mut c = baton(
        dir.path(),
        &[
            "mappers",
            "--mapper-dir",
            &dir.path().join("m").display().to_string(),
        ],
    );
    c.env("BATON_MAPPER_DIR", &file);
    accepted(c);
}

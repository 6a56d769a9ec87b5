//! `baton study` through the binary on two tiny chat models generated here: a study's
//! items run as recorded sessions, a rerun skips what is finished, shards split the items
//! between processes, and bad input is refused naming the problem.

mod common;

use common::study_rig::study_in;
use std::path::Path;
use std::process::{Command, Output};

fn baton(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .current_dir(dir)
        .env("BATON_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

fn sessions(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out.join("items"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_study_runs_its_items_as_sessions_and_a_rerun_skips_what_is_finished() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    let err = ok(&baton(
        &["study", "run", "study.toml", "--out", "out", "--jobs", "2"],
        d,
    ));
    assert!(
        err.contains("4 recorded, 0 finished before, 0 failed"),
        "{err}"
    );
    let names = sessions(&d.join("out"));
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(".jsonl")), "{names:?}");
    for n in &names {
        let s = baton::session::read_session(d.join("out/items").join(n)).unwrap();
        assert!(
            s.events()
                .any(|e| matches!(e, baton::protocol::Event::Switch(_))),
            "{n} holds its switch"
        );
    }

    // A rerun runs nothing; one removed session (and a killed run's leftover) runs again.
    let err = ok(&baton(&["study", "run", "study.toml", "--out", "out"], d));
    assert!(err.contains("0 recorded, 4 finished before"), "{err}");
    let gone = d.join("out/items").join(&names[1]);
    std::fs::remove_file(&gone).unwrap();
    std::fs::write(gone.with_extension("jsonl.4242.partial"), "{\"cut").unwrap();
    let err = ok(&baton(&["study", "run", "study.toml", "--out", "out"], d));
    assert!(err.contains("1 recorded, 3 finished before"), "{err}");
    assert!(gone.is_file());

    // Four shards in another directory record the same items between them.
    for shard in ["0/4", "1/4", "2/4", "3/4"] {
        ok(&baton(
            &[
                "study",
                "run",
                "study.toml",
                "--out",
                "sharded",
                "--shard",
                shard,
            ],
            d,
        ));
    }
    let sharded: Vec<String> = sessions(&d.join("sharded"))
        .into_iter()
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    assert_eq!(sharded, names);

    // The report: every item found, a group per variant, the tail variant paired with
    // the map on the same two conversations; the sharded run reports the same.
    let report = |out: &str| {
        let o = baton(&["study", "report", out, "--against", "map", "--json"], d);
        ok(&o);
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let r = report("out");
    assert_eq!(r["items"], 4);
    assert_eq!(r["missing"].as_array().unwrap().len(), 0);
    let groups = r["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    for g in groups {
        assert_eq!(g["conversations"], 2);
        let turn2 = g["turns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["turn"] == 2)
            .expect("turn 2 is scored");
        let f1 = turn2["f1"]["value"]
            .as_f64()
            .expect("an F1 against the expected answer");
        assert!((0.0..=1.0).contains(&f1));
        // The switch before turn 2 was measured: its attention cosine is that turn's.
        let cosine = turn2["attention_cosine"]["value"]
            .as_f64()
            .expect("a cosine");
        assert!(cosine > 0.0 && cosine <= 1.0, "{cosine}");
    }
    let c = &r["comparisons"][0];
    assert_eq!(
        (c["variant"].as_str(), c["pairs"].as_u64()),
        (Some("tail"), Some(2))
    );
    assert_eq!(report("sharded"), r, "shards merge into the same report");

    // The drift curves, one per variant, as SVG.
    ok(&baton(
        &["study", "report", "out", "--plot", "drift.svg"],
        d,
    ));
    let svg = std::fs::read_to_string(d.join("drift.svg")).unwrap();
    assert!(
        svg.contains("Drift by turn") && svg.contains("map") && svg.contains("tail"),
        "{}",
        &svg[..svg.len().min(400)]
    );

    // A missing session is named.
    std::fs::remove_file(&gone).unwrap();
    let text = ok_stdout(&baton(&["study", "report", "out"], d));
    assert!(
        text.contains("INCOMPLETE: 1 item has no session")
            && text.contains(names[1].trim_end_matches(".jsonl")),
        "{text}"
    );
}

fn ok_stdout(out: &Output) -> String {
    ok(out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bad_study_input_is_refused_naming_the_problem_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    let refused = |args: &[&str], want: &[&str]| {
        let out = baton(args, d);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{w:?} not in {err}");
        }
    };
    refused(
        &[
            "study",
            "run",
            "study.toml",
            "--out",
            "out",
            "--shard",
            "2/2",
        ],
        &["out of range", "0 to 1"],
    );
    refused(
        &[
            "study",
            "run",
            "study.toml",
            "--out",
            "out",
            "--shard",
            "auto",
        ],
        &["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"],
    );
    // An output directory holding another study's manifest is left as it is.
    ok(&baton(&["study", "plan", "study.toml", "--out", "out"], d));
    let manifest = std::fs::read(d.join("out/manifest.json")).unwrap();
    let other = std::fs::read_to_string(d.join("study.toml"))
        .unwrap()
        .replace("tail = 8", "tail = 16");
    std::fs::write(d.join("other.toml"), other).unwrap();
    refused(
        &["study", "run", "other.toml", "--out", "out"],
        &["another study", "tiny"],
    );
    assert_eq!(
        std::fs::read(d.join("out/manifest.json")).unwrap(),
        manifest
    );
    // A variant key the study does not know, and a script that does not parse.
    let typo = std::fs::read_to_string(d.join("study.toml"))
        .unwrap()
        .replace("tail = 8", "tial = 8");
    std::fs::write(d.join("typo.toml"), typo).unwrap();
    refused(
        &["study", "plan", "typo.toml"],
        &["[variants.tail]", "tial", "mapper_dir, reread, learn, tail"],
    );
    std::fs::write(d.join("conversations/three.toml"), "[[step]]\nuser = 3\n").unwrap();
    refused(&["study", "plan", "study.toml"], &["three.toml"]);
}

/// The tiny study with `extra` appended to its top-level keys (before the variants).
fn study_with(d: &Path, extra: &str) {
    let path = d.join("study.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.find("[variants.").unwrap();
    std::fs::write(&path, format!("{}{extra}\n{}", &text[..at], &text[at..])).unwrap();
}

#[test]
fn a_study_killed_mid_run_resumes_without_redoing_finished_items() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    study_with(d, "repeats = 3");
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["study", "run", "study.toml", "--out", "out", "--jobs", "1"])
        .current_dir(d)
        .env("BATON_CACHE_DIR", d.join("cache"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let finished = || {
        std::fs::read_dir(d.join("out/items")).map_or(0, |r| {
            r.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
                .count()
        })
    };
    let waited = std::time::Instant::now();
    while finished() < 2 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be killed"
        );
        assert!(
            waited.elapsed().as_secs() < 120,
            "no item finished in 2 min"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SIGKILL: nothing of the run's own gets to clean up.
    child.kill().unwrap();
    child.wait().unwrap();
    let before = finished();
    assert!(
        (2..12).contains(&before),
        "{before} of 12 finished at the kill"
    );

    let err = ok(&baton(&["study", "run", "study.toml", "--out", "out"], d));
    assert!(
        err.contains(&format!(
            "{} recorded, {before} finished before, 0 failed",
            12 - before
        )),
        "{err}"
    );
    // What the killed run left half-written is no session: every .jsonl reads whole.
    for n in sessions(&d.join("out"))
        .iter()
        .filter(|n| n.ends_with(".jsonl"))
    {
        let s = baton::session::read_session(d.join("out/items").join(n)).unwrap();
        assert!(s.warnings.is_empty(), "{n}: {:?}", s.warnings);
    }
    // The interrupted study reports as one run without a break does.
    ok(&baton(&["study", "run", "study.toml", "--out", "clean"], d));
    let report = |out: &str| ok_stdout(&baton(&["study", "report", out, "--json"], d));
    assert_eq!(report("out"), report("clean"));
}

#[test]
fn a_variant_without_the_switch_gives_the_source_alone_and_the_gap_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    let text = std::fs::read_to_string(d.join("study.toml")).unwrap();
    std::fs::write(
        d.join("study.toml"),
        format!("{text}\n[variants.alone]\nswitch = false\nmapper_dir = \"mappers\"\n"),
    )
    .unwrap();
    let err = ok(&baton(&["study", "run", "study.toml", "--out", "out"], d));
    assert!(err.contains("6 recorded"), "{err}");
    for n in sessions(&d.join("out")) {
        let s = baton::session::read_session(d.join("out/items").join(&n)).unwrap();
        let switched = s
            .events()
            .any(|e| matches!(e, baton::protocol::Event::Switch(_)));
        assert_eq!(switched, !n.contains(".alone."), "{n}");
        if n.contains(".alone.") {
            // Nothing handed over, nothing to learn: no learner reads the mappers'
            // saved statistics while the item runs, nor holds its end up.
            assert_eq!(s.header.settings["learn"], false, "{n}");
        }
    }
    let o = baton(&["study", "report", "out", "--json"], d);
    let r: serde_json::Value = serde_json::from_str(&ok_stdout(&o)).unwrap();
    for g in r["groups"].as_array().unwrap() {
        let alone = g["variant"] == "alone";
        assert_eq!(g["source_alone"], alone);
        // Measured for the handoffs (from the alone run of the same conversations), not
        // for the baseline itself.
        if alone {
            assert!(g["gap_recovered"].is_null(), "{g}");
            assert!(
                g["reference_f1"].is_null(),
                "nothing re-prefilled without a switch"
            );
        } else {
            assert!(g["gap_recovered"].is_object(), "{g}");
        }
    }
    let text = ok_stdout(&baton(&["study", "report", "out"], d));
    assert!(
        text.contains("no switch: the first model answers alone") && text.contains("gap recovered"),
        "{text}"
    );
}

#[test]
fn a_second_run_of_a_shard_is_refused_naming_the_first_and_a_dead_runs_leftovers_go() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    ok(&baton(&["study", "plan", "study.toml", "--out", "out"], d));
    let out = d.join("out");
    let manifest = baton::lab::study::read_manifest(&out).unwrap().unwrap();
    std::fs::create_dir_all(out.join("items")).unwrap();
    let leftover = out
        .join("items")
        .join(format!("{}.jsonl.4242.partial", manifest.items[0].id));
    std::fs::write(&leftover, "{\"cut").unwrap();

    // The first run holds the shard: the second records nothing and touches nothing.
    let first = baton::lab::study::lock::acquire(&out, baton::lab::study::Shard::WHOLE).unwrap();
    let o = baton(&["study", "run", "study.toml", "--out", "out"], d);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("pid {}", std::process::id()))
            && err.contains("shard 0/1")
            && err.contains("another --out"),
        "{err}"
    );
    assert!(!err.contains("[1/4]"), "no item ran: {err}");
    assert_eq!(
        sessions(&out),
        vec![leftover.file_name().unwrap().to_string_lossy().into_owned()]
    );

    // It ends (its lock file stays behind, naming it): the next run goes ahead and
    // clears what the dead run left half-recorded.
    drop(first);
    let err = ok(&baton(&["study", "run", "study.toml", "--out", "out"], d));
    assert!(err.contains("4 recorded"), "{err}");
    assert!(!leftover.exists());
    assert!(
        sessions(&out).iter().all(|n| n.ends_with(".jsonl")),
        "{:?}",
        sessions(&out)
    );

    // One item's file replaced by another file: the report says so and goes on.
    let foreign = out
        .join("items")
        .join(format!("{}.jsonl", manifest.items[1].id));
    std::fs::write(&foreign, "some other file\n").unwrap();
    let o = baton(&["study", "report", "out"], d);
    let text = ok_stdout(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("warning: item {} skipped", manifest.items[1].id)),
        "{err}"
    );
    assert!(
        text.contains("3 of 4 items recorded") && text.contains("SKIPPED: 1"),
        "{text}"
    );
}

#[test]
fn an_output_directory_that_cannot_be_written_is_refused_before_any_model_loads() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    ok(&baton(&["study", "plan", "study.toml", "--out", "out"], d));
    let chmod = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    for sub in ["out/items", "fresh", "writable", "writable/items", "logs"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    // Root writes whatever the mode says: where the test is root's, the run is another
    // user's, who may read the study and the models and write the logs only.
    let root = std::fs::metadata(d).unwrap().uid() == 0;
    chmod(d, 0o755);
    chmod(&d.join("logs"), 0o777);
    std::fs::copy(
        d.join("out/manifest.json"),
        d.join("writable/manifest.json"),
    )
    .unwrap();
    chmod(&d.join("writable"), 0o777);
    let unwritable = ["out", "out/items", "fresh", "writable/items"];
    for p in unwritable {
        chmod(&d.join(p), 0o555);
    }
    // The other user may not reach the build's binary: it runs a link to it (or a copy,
    // across file systems) in the study's directory.
    let bin = if root {
        let at = d.join("baton");
        let built = Path::new(env!("CARGO_BIN_EXE_baton"));
        if std::fs::hard_link(built, &at).is_err() {
            std::fs::copy(built, &at).unwrap();
        }
        at
    } else {
        env!("CARGO_BIN_EXE_baton").into()
    };
    let run = |out: &str| {
        let mut c = Command::new(&bin);
        c.args(["study", "run", "study.toml", "--out", out])
            .current_dir(d)
            .env("BATON_CACHE_DIR", d.join("cache"))
            .env("BATON_LOG_DIR", d.join("logs"));
        if root {
            c.uid(65534).gid(65534);
        }
        c.output().unwrap()
    };
    // The lock, the items folder, and (with no manifest yet) the manifest each refuse.
    for (out, names) in [
        ("out", ".shard-0-of-1.lock"),
        ("writable", "items"),
        ("fresh", ".manifest.json"),
    ] {
        let o = run(out);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{out}: {err}");
        assert!(
            err.contains("cannot write")
                && err.contains(&format!("{out}/{names}"))
                && err.contains("--out")
                && !err.contains("cannot read"),
            "{out}: {err}"
        );
        assert!(!err.contains("[1/4]"), "{out}: an item ran: {err}");
    }
    for p in unwritable {
        chmod(&d.join(p), 0o755);
    }
}

#[test]
fn study_run_takes_the_mapper_dir_from_the_environment_and_a_failed_item_keeps_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    // The variants name no mappers directory of their own: the command's serves them.
    let text = std::fs::read_to_string(d.join("study.toml")).unwrap();
    std::fs::write(
        d.join("study.toml"),
        text.replace("mapper_dir = \"mappers\"\n", ""),
    )
    .unwrap();
    let run = |mapper_dir: &Path| {
        Command::new(env!("CARGO_BIN_EXE_baton"))
            .args(["study", "run", "study.toml", "--out", "out"])
            .current_dir(d)
            .env("BATON_CACHE_DIR", d.join("cache"))
            .env("BATON_MAPPER_DIR", mapper_dir)
            .output()
            .unwrap()
    };
    // A directory with no mapper: every item fails, and keeps a file naming why.
    let empty = d.join("no-mappers");
    std::fs::create_dir_all(&empty).unwrap();
    let out = run(&empty);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("0 recorded, 0 finished before, 4 failed"),
        "{err}"
    );
    let names = sessions(&d.join("out"));
    let failed: Vec<&String> = names
        .iter()
        .filter(|n| n.ends_with(".jsonl.failed"))
        .collect();
    assert_eq!(failed.len(), 4, "{names:?}");
    for n in &failed {
        let kept = std::fs::read_to_string(d.join("out/items").join(n)).unwrap();
        assert!(
            kept.contains("no mapper from") && kept.contains("no-mappers"),
            "{n}: {kept}"
        );
    }
    // The directory that holds the pair's mappers, named the same way: every item runs
    // (the cache dir holds none), and what the failed run kept goes.
    let err = ok(&run(&d.join("mappers")));
    assert!(
        err.contains("4 recorded, 0 finished before, 0 failed"),
        "{err}"
    );
    let names = sessions(&d.join("out"));
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.ends_with(".jsonl")), "{names:?}");
}

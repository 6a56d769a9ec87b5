use super::*;
use std::collections::HashMap;

const SCRIPT: &str = r#"
[[step]]
user = "Anna earns 48,000 dollars a year."

[[step]]
switch = true

[[step]]
user = "How much does Anna earn?"
expect = ["48,000", "48000 dollars"]
"#;

const STUDY: &str = r#"
name = "facts"
scripts = ["conversations"]
repeats = 2

[variants.map]
learn = false

[variants.reread]
reread = "20%"
tail = 32
"#;

/// A study directory with two scripts; the study file's text is `study`.
fn study_dir(study: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let convs = dir.path().join("conversations");
    std::fs::create_dir_all(&convs).unwrap();
    std::fs::write(convs.join("salary.toml"), SCRIPT).unwrap();
    std::fs::write(convs.join("city.toml"), SCRIPT.replace("Anna", "Ben")).unwrap();
    std::fs::write(convs.join("notes.txt"), "not a script").unwrap();
    let path = dir.path().join("study.toml");
    std::fs::write(&path, study).unwrap();
    (dir, path)
}

#[test]
fn a_study_expands_into_every_combination_with_readable_stable_ids() {
    let (_d, path) = study_dir(STUDY);
    let study = Study::load(&path).unwrap();
    assert_eq!(study.name, "facts");
    let m = plan(&study);
    // 2 scripts × 1 pair × 2 directions × 2 variants × 2 repeats.
    assert_eq!(m.items.len(), 16);
    let ids: std::collections::BTreeSet<&str> = m.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), 16, "ids are unique");
    let first = &m.items[0];
    assert_eq!(
        first.id,
        "conversations-city.qwen2.5-coder-0.5b-to-qwen2.5-coder-1.5b.map.r1"
    );
    assert_eq!(first.expected[&2], vec!["48,000", "48000 dollars"]);
    let back = m
        .items
        .iter()
        .find(|i| i.direction == Direction::TargetToSource)
        .unwrap();
    assert_eq!(back.models[0], "qwen2.5-coder-1.5b");

    // Another script and another variant leave every earlier id as it was.
    let (_d2, more) = study_dir(&format!("{STUDY}\n[variants.learn]\nlearn = true\n"));
    std::fs::write(
        more.parent().unwrap().join("conversations/zoo.toml"),
        SCRIPT,
    )
    .unwrap();
    let bigger = plan(&Study::load(&more).unwrap());
    assert_eq!(bigger.items.len(), 3 * 2 * 3 * 2);
    let bigger_ids: std::collections::BTreeSet<&str> =
        bigger.items.iter().map(|i| i.id.as_str()).collect();
    assert!(ids.is_subset(&bigger_ids));
}

#[test]
fn bad_study_files_are_refused_naming_the_problem_and_the_fix() {
    let cases = [
        (
            STUDY.replace("tail = 32", "tial = 32"),
            vec![
                "[variants.reread]",
                "tial",
                "mapper_dir, reread, learn, tail, switch",
            ],
        ),
        (
            STUDY.replace("reread = \"20%\"", "reread = \"lots\""),
            vec!["[variants.reread] reread", "lots"],
        ),
        (
            STUDY.replace("repeats = 2", "repeats = 0"),
            vec!["repeats = 0"],
        ),
        (
            "scripts = [\"conversations\"]\n".to_string(),
            vec!["[variants.NAME]"],
        ),
        (
            STUDY.replace("[variants.map]", "[variants.\"a b\"]"),
            vec!["\"a b\"", "letters"],
        ),
        (format!("{STUDY}\nshards = 3\n"), vec!["shards"]),
        (
            format!("{STUDY}\n[variants.alone]\nswitch = false\ntail = 8\n"),
            vec!["[variants.alone]", "switch = false", "leave them out"],
        ),
        (
            format!("{STUDY}\n[variants.alone]\nswitch = false\n[variants.solo]\nswitch = false\n"),
            vec!["[variants.solo]", "[variants.alone]", "keep one"],
        ),
    ];
    for (text, want) in cases {
        let (_d, path) = study_dir(&text);
        let e = Study::load(&path).unwrap_err().to_string();
        assert!(e.contains("study.toml"), "{e}");
        for w in want {
            assert!(e.contains(w), "{w:?} not in: {e}");
        }
    }
}

#[test]
fn a_script_that_does_not_parse_is_named() {
    let (d, path) = study_dir(STUDY);
    std::fs::write(
        d.path().join("conversations/broken.toml"),
        "[[step]]\nuser = \"hi\"\nswitch = true\n",
    )
    .unwrap();
    let e = Study::load(&path).unwrap_err().to_string();
    assert!(e.contains("step 1") && e.contains("exactly one"), "{e}");
    std::fs::write(d.path().join("conversations/broken.toml"), "[[step]\n").unwrap();
    let e = Study::load(&path).unwrap_err().to_string();
    assert!(e.contains("broken.toml"), "{e}");
    // `expect` belongs on a user step.
    std::fs::write(
        d.path().join("conversations/broken.toml"),
        "[[step]]\nswitch = true\nexpect = [\"x\"]\n",
    )
    .unwrap();
    let e = Study::load(&path).unwrap_err().to_string();
    assert!(e.contains("`expect` goes on the `user` step"), "{e}");
}

#[test]
fn shards_split_the_items_without_overlap_and_refuse_an_index_out_of_range() {
    let (_d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    let mut seen: Vec<&str> = Vec::new();
    for i in 0..4 {
        let shard = Shard::parse(&format!("{i}/4")).unwrap();
        seen.extend(shard.items(&m).iter().map(|w| w.id.as_str()));
    }
    let mut all: Vec<&str> = m.items.iter().map(|w| w.id.as_str()).collect();
    seen.sort();
    all.sort();
    assert_eq!(seen, all, "every item in exactly one shard");

    let e = Shard::parse("4/4").unwrap_err().to_string();
    assert!(e.contains("out of range") && e.contains("0 to 3"), "{e}");
    assert!(Shard::parse("1-4")
        .unwrap_err()
        .to_string()
        .contains("INDEX/COUNT"));
    assert!(Shard::parse("0/0").is_err());
}

#[test]
fn the_automatic_shard_comes_from_slurm_or_an_indexed_job() {
    let env = |vars: &[(&str, &str)]| {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    };
    let slurm = env(&[
        ("SLURM_ARRAY_TASK_ID", "5"),
        ("SLURM_ARRAY_TASK_MIN", "3"),
        ("SLURM_ARRAY_TASK_COUNT", "4"),
    ]);
    assert_eq!(
        Shard::auto(&slurm, None).unwrap(),
        Shard::new(2, 4).unwrap()
    );
    let k8s = env(&[("JOB_COMPLETION_INDEX", "1")]);
    assert_eq!(
        Shard::auto(&k8s, Some(3)).unwrap(),
        Shard::new(1, 3).unwrap()
    );
    assert!(Shard::auto(&k8s, None)
        .unwrap_err()
        .to_string()
        .contains("--shards"));
    let e = Shard::auto(&env(&[]), None).unwrap_err().to_string();
    assert!(e.contains("--shard INDEX/COUNT"), "{e}");
    let past = env(&[("JOB_COMPLETION_INDEX", "3")]);
    assert!(Shard::auto(&past, Some(3))
        .unwrap_err()
        .to_string()
        .contains("out of range"));
}

#[test]
fn an_output_directory_of_another_study_is_refused_and_left_as_it_is() {
    let (d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    let out = d.path().join("out");
    let saved = save_manifest(&out, &m).unwrap();
    // The same study again: found, not rewritten.
    assert_eq!(save_manifest(&out, &m).unwrap(), saved);
    assert_eq!(read_manifest(&out).unwrap().unwrap(), m);
    let other = plan(
        &Study::parse(
            &STUDY.replace("repeats = 2", "repeats = 3"),
            &path,
            path.parent().unwrap(),
        )
        .unwrap(),
    );
    let before = std::fs::read(&saved).unwrap();
    let e = save_manifest(&out, &other).unwrap_err().to_string();
    assert!(e.contains("another study") && e.contains("facts"), "{e}");
    assert_eq!(std::fs::read(&saved).unwrap(), before);
    std::fs::write(&saved, "{}").unwrap();
    assert!(matches!(
        read_manifest(&out),
        Err(StudyError::BadManifest { .. })
    ));
}

#[test]
fn shards_saving_the_manifest_at_once_all_find_it() {
    let (d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    let out = d.path().join("out");
    let saved: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| save_manifest(&out, &m)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in saved {
        assert_eq!(r.unwrap(), out.join(MANIFEST_FILE));
    }
    assert_eq!(read_manifest(&out).unwrap().unwrap(), m);
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from(MANIFEST_FILE)]);
}

#[test]
fn an_item_id_that_is_not_a_plain_name_is_refused_when_saved_and_when_read() {
    let (d, path) = study_dir(STUDY);
    let good = plan(&Study::load(&path).unwrap());
    for (bad, why) in [
        ("../../escaped", "path separator"),
        ("..", "names a directory"),
        ("", "is empty"),
        ("a\0b", "NUL"),
        ("a\\b", "path separator"),
    ] {
        let mut m = good.clone();
        m.items[3].id = bad.into();
        let out = d.path().join("made");
        let e = save_manifest(&out, &m).unwrap_err().to_string();
        assert!(e.contains(&format!("{bad:?}")) && e.contains(why), "{e}");
        assert!(!out.join(MANIFEST_FILE).exists(), "nothing saved");

        // A saved manifest edited to hold it.
        let out = d.path().join("edited");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join(MANIFEST_FILE), serde_json::to_string(&m).unwrap()).unwrap();
        let e = read_manifest(&out).unwrap_err();
        assert!(matches!(e, StudyError::BadManifest { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains(&format!("{bad:?}")) && e.contains("plain file name"),
            "{e}"
        );
        assert!(report::report(&m, &out, None).is_err());
    }
}

#[test]
fn a_file_that_is_not_a_session_is_skipped_by_the_report_with_its_reason() {
    let (d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    let out = d.path().join("out");
    save_manifest(&out, &m).unwrap();
    let items = out.join(run::ITEMS_DIR);
    std::fs::create_dir_all(&items).unwrap();
    std::fs::write(run::session_path(&out, &m.items[2]), "not a session\n").unwrap();
    let r = report::report(&m, &out, Some("map")).unwrap();
    assert_eq!(r.unreadable.len(), 1);
    assert_eq!(r.unreadable[0].id, m.items[2].id);
    assert!(
        r.unreadable[0].reason.contains("session"),
        "{:?}",
        r.unreadable
    );
    assert_eq!(r.missing.len(), m.items.len() - 1);
    let text = report::render(&r);
    assert!(
        text.contains("0 of 16 items recorded") && text.contains("SKIPPED: 1 item's file"),
        "{text}"
    );
}

/// `out` with a half-recorded session of every item, as killed runs leave them.
fn partials_of_every_item(out: &std::path::Path, m: &Manifest) -> Vec<std::path::PathBuf> {
    let items = out.join(run::ITEMS_DIR);
    std::fs::create_dir_all(&items).unwrap();
    m.items
        .iter()
        .map(|i| {
            let p = items.join(format!("{}.jsonl.4242.partial", i.id));
            std::fs::write(&p, "{\"cut").unwrap();
            p
        })
        .collect()
}

#[test]
fn a_run_removes_its_shards_half_recorded_sessions_only_while_it_holds_the_lock() {
    let (d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    let out = d.path().join("out");
    save_manifest(&out, &m).unwrap();
    let partials = partials_of_every_item(&out, &m);
    let kept = [".failed", ""].map(|ext| {
        let p = run::session_path(&out, &m.items[0]).with_extension(format!("jsonl{ext}"));
        std::fs::write(&p, "kept").unwrap();
        p
    });
    let half = Shard::new(0, 2).unwrap();

    // Another run holds the shard: nothing of its items is touched.
    let other = lock::acquire(&out, half).unwrap();
    let e = run::prepare(&out, &m, half).unwrap_err().to_string();
    assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
    assert!(partials.iter().all(|p| p.exists()));
    drop(other);

    let _held = run::prepare(&out, &m, half).unwrap();
    for (k, p) in partials.iter().enumerate() {
        assert_eq!(p.exists(), k % 2 == 1, "{}", p.display());
    }
    assert!(
        kept.iter().all(|p| p.is_file()),
        "sessions and failed runs stay"
    );
}

#[test]
fn an_output_directory_that_cannot_take_files_is_refused_as_a_write() {
    let (d, path) = study_dir(STUDY);
    let m = plan(&Study::load(&path).unwrap());
    // A file where the items folder belongs.
    let out = d.path().join("out");
    save_manifest(&out, &m).unwrap();
    std::fs::write(out.join(run::ITEMS_DIR), "in the way").unwrap();
    let e = run::prepare(&out, &m, Shard::WHOLE)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot write") && e.contains("items") && e.contains("--out"),
        "{e}"
    );
    // A file where the output directory belongs.
    let blocked = d.path().join("blocked");
    std::fs::write(&blocked, "in the way").unwrap();
    let e = save_manifest(&blocked.join("out"), &m)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot write") && e.contains("blocked"),
        "{e}"
    );
}

/// The engine set-up of the first item of `variant` in `study`'s plan.
fn config_of(study: &Study, m: &Manifest, variant: &str) -> baton_engine::EngineConfig {
    let item = m
        .items
        .iter()
        .find(|i| i.variant == variant)
        .unwrap_or_else(|| panic!("no item of {variant}"));
    let (cfg, _) = run::item_config(
        study,
        m,
        item,
        &baton_runtime::model::Placement::on(candle_core::Device::Cpu),
        "s.jsonl".into(),
    )
    .unwrap();
    cfg
}

#[test]
fn the_example_studys_variants_run_different_plans_and_the_map_runs_none() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/study/example.toml");
    let study = Study::load(&path).unwrap();
    let m = plan(&study);
    let switching: Vec<&String> = study
        .variants
        .iter()
        .filter(|(_, v)| !v.stays())
        .map(|(name, _)| name)
        .collect();
    assert!(switching.len() >= 2, "{switching:?}");
    let plans: Vec<Option<String>> = switching
        .iter()
        .map(|v| {
            config_of(&study, &m, v)
                .settings
                .reread
                .map(|r| r.to_string())
        })
        .collect();
    for (i, p) in plans.iter().enumerate() {
        for (j, q) in plans.iter().enumerate().skip(i + 1) {
            assert_ne!(
                p, q,
                "variants {} and {} run the same plan",
                switching[i], switching[j]
            );
        }
    }
    // The variant named for the map alone re-reads nothing.
    assert_eq!(config_of(&study, &m, "map").settings.reread, None);
    assert!(config_of(&study, &m, "reread").settings.reread.is_some());
}

#[test]
fn an_item_without_a_switch_does_not_learn() {
    let (_d, path) = study_dir(&format!("{STUDY}\n[variants.alone]\nswitch = false\n"));
    let study = Study::load(&path).unwrap();
    let m = plan(&study);
    // Learning is on by default: an item that never switches would set up a learner
    // (reading the mappers' saved statistics) for nothing.
    assert!(baton_engine::Settings::default().learn);
    assert!(!config_of(&study, &m, "alone").settings.learn);
}

#[test]
fn the_commands_mapper_dir_serves_the_variants_that_name_none() {
    let (d, path) = study_dir(&format!(
        "{STUDY}\n[variants.own]\nmapper_dir = \"theirs\"\n"
    ));
    let mut study = Study::load(&path).unwrap();
    let m = plan(&study);
    use baton_method::mapper::dir::MapperDir;
    assert_eq!(
        config_of(&study, &m, "map").mapper_dir,
        MapperDir::default_location()
    );
    study.mapper_dir = Some("from-env".into());
    assert_eq!(
        config_of(&study, &m, "map").mapper_dir,
        MapperDir::named("from-env")
    );
    assert_eq!(
        config_of(&study, &m, "own").mapper_dir,
        MapperDir::named(d.path().join("theirs"))
    );
}

#[test]
fn a_variants_plan_may_name_its_layers_and_the_run_gets_them() {
    let (_d, path) = study_dir(&STUDY.replace(
        "reread = \"20%\"",
        "reread = \"up:20%:facts:word:upper=14\"",
    ));
    let study = Study::load(&path).unwrap();
    let o = study.variants["reread"].overrides().unwrap();
    let plan = o.reread.unwrap().0.unwrap();
    assert_eq!(
        plan.layers,
        Some(baton_method::handoff::layers::LayerSplit::Upper(14))
    );
    assert_eq!(plan.to_string(), "up:20%:facts:word:upper=14");
    // A layer word that is not one is refused as the plan's flag refuses it.
    let (_d, path) = study_dir(&STUDY.replace("reread = \"20%\"", "reread = \"20%:upper=x\""));
    let e = Study::load(&path).unwrap_err().to_string();
    assert!(
        e.contains("upper=") && e.contains("not a layer number"),
        "{e}"
    );
}

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

//! The Slurm path for real: a single-node Slurm cluster on this machine (Slurm and munge
//! from Debian's packages, installed when missing, by `scripts/slurm-up`), a study of four
//! items on tiny generated models submitted as a two-task array with `--shard auto`, and
//! the report as a job that runs after the array succeeded. Its report is the report of
//! the same study run in one process.

mod common;

use common::study_rig::study_in;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Stops the cluster's daemons however the test ends.
struct Cluster(PathBuf);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["--down", &self.0.display().to_string()])
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-up")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn a_study_submitted_as_a_slurm_array_reports_as_one_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    study_in(d);
    let slurm = d.join("slurm");
    let _cluster = Cluster(slurm.clone());
    run(Command::new(script()).arg(&slurm));
    let conf = slurm.join("slurm.conf");
    let baton = env!("CARGO_BIN_EXE_baton");
    let sbatch = |args: &[&str]| {
        run(Command::new("sbatch")
            .args(args)
            .current_dir(d)
            .env("SLURM_CONF", &conf)
            .env("BATON_CACHE_DIR", d.join("cache")))
    };
    let array = sbatch(&[
        "--parsable",
        "--array=0-1",
        "--output=slurm/shard-%a.out",
        "--wrap",
        &format!("{baton} study run study.toml --out sharded --shard auto --jobs 1"),
    ]);
    let array = array.trim().split(';').next().unwrap().to_string();
    sbatch(&[
        "--wait",
        &format!("--dependency=afterok:{array}"),
        "--kill-on-invalid-dep=yes",
        "--output=slurm/report.out",
        "--wrap",
        &format!("{baton} study report sharded --against map --json > sharded.json"),
    ]);
    let shard_logs: String = (0..2)
        .map(|i| std::fs::read_to_string(d.join(format!("slurm/shard-{i}.out"))).unwrap())
        .collect();
    assert!(
        shard_logs.contains("shard 0/2") && shard_logs.contains("shard 1/2"),
        "{shard_logs}"
    );
    let sharded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("sharded.json")).unwrap()).unwrap();
    assert_eq!(
        sharded["missing"].as_array().map(Vec::len),
        Some(0),
        "{sharded}"
    );

    // The same study in one process.
    let local = |args: &[&str]| {
        run(Command::new(baton)
            .args(args)
            .current_dir(d)
            .env("BATON_CACHE_DIR", d.join("cache")))
    };
    local(&[
        "study",
        "run",
        "study.toml",
        "--out",
        "whole",
        "--jobs",
        "2",
    ]);
    let whole: serde_json::Value = serde_json::from_str(&local(&[
        "study",
        "report",
        "whole",
        "--against",
        "map",
        "--json",
    ]))
    .unwrap();
    assert_eq!(sharded, whole);
}

//! A calibration's output is put in place whole or not at all: on a disk that fills up
//! part way through writing it, the mappers and statistics already there stay byte for
//! byte as they were, and nothing of the attempt is left behind. And a map worse than no
//! context never replaces a mapper in use.

mod common;

use baton::calibrate::{
    calibrate_with, corpus_info, keep, save_calibration, CalibrateOptions, Calibrated, CorpusName,
    Direction, Keep, NoProgress, Outcome, PoorFate, Run,
};
use baton::data::corpus::{self, Document};
use baton::model::Model;
use common::synthetic::{model_pair, Tiny};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

fn opts(sequences: usize) -> CalibrateOptions {
    CalibrateOptions {
        sequences,
        ..common::engine_rig::opts()
    }
}

fn calibrated(a: &Model, b: &Model, tiny: &Tiny, o: &CalibrateOptions) -> Calibrated {
    let docs: Vec<Document> = (0..3)
        .map(|i| Document::new(format!("d{i}"), tiny.text(3000, 7 + i)))
        .collect();
    let name = CorpusName {
        files: "synthetic".into(),
        fingerprint: corpus::fingerprint(&docs),
    };
    let run = Run {
        docs: &docs,
        corpus: &name,
        directions: &[Direction::Forward, Direction::Backward],
        opts: o,
    };
    calibrate_with(a, b, &run, Vec::new(), &NoProgress, &AtomicBool::new(false)).unwrap()
}

/// Writes `c` as one calibration into `dir`, statistics kept.
fn save(
    dir: &Path,
    [a, b]: [&Model; 2],
    c: &Calibrated,
    o: &CalibrateOptions,
) -> Result<(), String> {
    save_calibration(
        &baton::mapper::dir::MapperDir::named(dir),
        [a, b],
        &corpus_info(&[], "synthetic", o),
        Keep {
            kept: c.fitted.iter().collect(),
            apart: Vec::new(),
            stats: &c.stats,
        },
    )
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// Every file and directory under `dir`, with the files' bytes.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if p.is_dir() {
                out.push((rel, Vec::new()));
                stack.push(p);
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// A small tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(at).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the filesystem of `at` with a file there, then frees `free` bytes of it.
fn fill_leaving(at: &Path, free: u64) {
    let mut f = std::fs::File::create(at).unwrap();
    let block = vec![0u8; 4096];
    let mut len = 0u64;
    while f.write_all(&block).is_ok() {
        len += block.len() as u64;
    }
    let _ = f.flush();
    f.set_len(len.saturating_sub(free)).unwrap();
}

#[test]
fn a_calibration_that_fills_the_disk_leaves_the_previous_mappers_as_they_were() {
    const NAME: &str = "a_calibration_that_fills_the_disk_leaves_the_previous_mappers_as_they_were";
    let tiny = Tiny::new("qwen2");
    let (models, a, b) = model_pair(&tiny, &tiny.weights(1), &tiny.weights(2));
    let mnt = models.path().join("disk");
    let _disk = match Tmpfs::mount(&mnt, "2m") {
        Ok(d) => d,
        Err(why) => return common::skipped(NAME, &why),
    };
    let dir = mnt.join("mappers");
    let (old_opts, new_opts) = (opts(4), opts(6));
    save(
        &dir,
        [&a, &b],
        &calibrated(&a, &b, &tiny, &old_opts),
        &old_opts,
    )
    .unwrap();
    let before = tree(&dir);
    // Both directions' artifacts, readable copies and statistics.
    assert_eq!(before.iter().filter(|(_, b)| !b.is_empty()).count(), 10);
    let new = calibrated(&a, &b, &tiny, &new_opts);
    let filler = mnt.join("filler");
    let mut failures = Vec::new();
    // Ever more room, a page at a time: every write the calibration makes fails in turn,
    // until all of it fits.
    for pages in 0..256u64 {
        fill_leaving(&filler, pages * 4096);
        let result = save(&dir, [&a, &b], &new, &new_opts);
        std::fs::remove_file(&filler).unwrap();
        match result {
            Err(e) => {
                assert!(e.contains("No space left"), "{e}");
                assert!(
                    tree(&dir) == before,
                    "with {pages} pages free a failed write changed the mapper directory \
                     ({e}): {:?}",
                    tree(&dir).iter().map(|(p, _)| p).collect::<Vec<_>>()
                );
                failures.push(pages);
            }
            Ok(()) => break,
        }
    }
    // It failed at the first write and at later ones (artifacts already staged).
    assert!(failures.len() > 4, "{failures:?}");
    let after = tree(&dir);
    let names = |t: &[(PathBuf, Vec<u8>)]| t.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(names(&after), names(&before), "no staging left behind");
    assert_ne!(after, before, "the successful write replaced the mappers");
    let (art, _) = baton::mapper::dir::MapperDir::named(&dir)
        .open_for(&a, &b)
        .unwrap();
    assert_eq!(art.meta.corpus.sequences, 6);
}

/// `c`, its first map made worse than no context on its held-out windows and its second
/// better (tiny random models give either).
fn first_made_poor(mut c: Calibrated) -> Calibrated {
    let kl = |kl| baton::metrics::NextTokenAgreement {
        top1: 0.1,
        kl,
        positions: 10,
    };
    for (f, mapped) in c.fitted.iter_mut().zip([2.0, 1.0]) {
        f.report.agreement = Some(kl(mapped));
        f.report.agreement_no_context = Some(kl(1.5));
    }
    c
}

fn keep_poor(dir: &Path, [a, b]: [&Model; 2], c: &Calibrated, accept: bool) -> Outcome {
    keep(
        [a, b],
        &baton::mapper::dir::MapperDir::named(dir),
        &corpus_info(&[], "synthetic", &opts(4)),
        &c.fitted,
        &c.stats,
        accept,
    )
    .unwrap()
}

#[test]
fn a_poor_map_never_replaces_a_mapper_in_use_and_is_the_default_where_there_is_none() {
    let tiny = Tiny::new("qwen2");
    let (models, a, b) = model_pair(&tiny, &tiny.weights(1), &tiny.weights(2));
    let o = opts(4);
    let poor = first_made_poor(calibrated(&a, &b, &tiny, &o));
    let poor_source = poor.fitted[0].source.name.clone();
    let default_path = |dir: &Path| {
        let (s, t) = if poor.fitted[0].source.sha256 == a.identity.sha256 {
            (&a, &b)
        } else {
            (&b, &a)
        };
        baton::mapper::dir::MapperDir::named(dir)
            .open_for(s, t)
            .unwrap()
            .0
            .path
    };

    // No mapper in use: the poor one is the default, and the message says so.
    let fresh = models.path().join("fresh");
    let out = keep_poor(&fresh, [&a, &b], &poor, false);
    assert_eq!(out.poor.len(), 1, "only the first map is poor");
    assert_eq!(out.poor[0].fate, PoorFate::Default);
    assert_eq!(out.poor[0].source, poor_source);
    assert_eq!(out.poor[0].path, default_path(&fresh));
    assert!(
        out.apart.is_empty()
            && !baton::mapper::dir::MapperDir::named(&fresh)
                .poor()
                .path()
                .exists()
    );
    assert!(out.poor[0].message().contains("for want of a better one"));

    // A mapper in use: the poor one goes under poor/, the one in use stays byte for byte.
    let used = models.path().join("used");
    save(&used, [&a, &b], &calibrated(&a, &b, &tiny, &o), &o).unwrap();
    let in_use = std::fs::read(default_path(&used)).unwrap();
    let out = keep_poor(&used, [&a, &b], &poor, false);
    assert_eq!(out.poor[0].fate, PoorFate::Apart);
    assert!(out.poor[0]
        .path
        .starts_with(baton::mapper::dir::MapperDir::named(&used).poor().path()));
    assert!(out.poor[0].path.is_file());
    assert_eq!(std::fs::read(default_path(&used)).unwrap(), in_use);
    let said = out.poor[0].message();
    assert!(
        said.contains("kept apart") && said.contains("--accept-poor"),
        "{said}"
    );
    // The good direction was made the default as usual.
    assert_eq!(out.kept.len(), 1);

    // Asked to, it replaces the one in use.
    let out = keep_poor(&used, [&a, &b], &poor, true);
    assert_eq!(out.poor[0].fate, PoorFate::Default);
    assert_ne!(std::fs::read(default_path(&used)).unwrap(), in_use);
}

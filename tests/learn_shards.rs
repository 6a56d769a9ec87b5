//! What a mapper learned, on disk, between tiny models generated here: every accepted
//! update is a shard of its positions' features, so the learned state grows with the
//! positions learned and a new update never rewrites an old one; two learners keeping
//! updates in one directory at once lose none of them; a damaged shard is refused by
//! name; and statistics an earlier version kept are read as a base the shards add to.

mod common;

use baton::calibrate::saved_stats::{self, write_dir};
use baton::calibrate::{Direction, DirectionStats, WindowFeatures};
use baton::learn::store::{self, LearnedMeta, LearnedStep};
use baton::learn::{shard, Update};
use baton::mapper::artifact::{self, MapperMeta, ModelRef};
use baton::mapper::dir::{MapperDir, PairFiles};
use baton::model::Model;
use common::learn_rig::{calibrate_into, conversation, docs, learn_once, open, refs};
use common::synthetic::{model_pair, Tiny};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Barrier;

/// A calibrated tiny pair in a fresh directory.
fn calibrated() -> (tempfile::TempDir, Tiny, Model, Model) {
    let tiny = Tiny::new("llama");
    let (_m, a, b) = model_pair(&tiny, &tiny.weights(3), &tiny.weights(4));
    let dir = tempfile::tempdir().unwrap();
    calibrate_into(&a, &b, &docs(&tiny), dir.path());
    (dir, tiny, a, b)
}

fn width(m: &ModelRef) -> usize {
    m.layers * m.kv_heads * m.head_dim
}

fn features(rows: usize, width: usize, seed: u64) -> WindowFeatures {
    let v = |k: u64| -> Vec<f32> {
        (0..rows * width)
            .map(|i| {
                let t = (i as u64 * 2_654_435_761 + seed * 7919 + k * 104_729) % 10_007;
                (t as f32 / 10_007.0 - 0.5) * 4.0
            })
            .collect()
    };
    WindowFeatures {
        keys: v(1),
        values: v(2),
        rows,
    }
}

/// An update of `rows` positions between the models `sr` and `tr` name.
fn update(sr: &ModelRef, tr: &ModelRef, rows: usize, seed: u64) -> Update {
    Update {
        source: features(rows, width(sr), seed),
        target: features(rows, width(tr), seed + 1),
    }
}

/// A step kept as an earlier version kept it, with no mapper named: it belongs to the
/// mapper it is no older than.
fn step(from: &str, tokens: usize) -> LearnedStep {
    LearnedStep {
        mapper: None,
        from: from.into(),
        unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        tokens,
        before: 0.5,
        after: 0.6,
    }
}

fn calibration(dir: &Path, sr: &ModelRef, tr: &ModelRef) -> DirectionStats {
    saved_stats::load(
        &MapperDir::named(dir).pair(sr, tr).stats(),
        Direction::Forward,
        sr,
        tr,
    )
    .unwrap()
    .stats
}

/// Where a → b keeps what it learns.
struct At {
    dir: MapperDir,
    pair: PairFiles,
    /// The mapper it learns on.
    mapper: MapperMeta,
}

/// Where a → b keeps what it learns, and its (empty) description.
fn learned(dir: &Path, a: &Model, b: &Model) -> (At, LearnedMeta, ModelRef, ModelRef) {
    let (sr, tr) = refs(a, b);
    let mapper_dir = MapperDir::named(dir);
    let pair = mapper_dir.pair(&sr, &tr);
    let mapper = artifact::load_meta(&pair.artifact()).unwrap();
    let meta = LearnedMeta::new(sr.clone(), tr.clone(), 0);
    let at = At {
        dir: mapper_dir,
        pair,
        mapper,
    };
    (at, meta, sr, tr)
}

#[test]
fn a_shard_grows_with_the_positions_it_holds_and_the_next_update_leaves_it_untouched() {
    let (dir, _tiny, a, b) = calibrated();
    let (at, meta, sr, tr) = learned(dir.path(), &a, &b);
    let first = store::append(&at.dir, &meta, &update(&sr, &tr, 40, 1), &step("one", 40)).unwrap();
    // Four tensors of f32: source and target keys and values of every position.
    let row_bytes = 2 * (width(&sr) + width(&tr)) * 4;
    let bytes = std::fs::read(&first).unwrap();
    let (data, header) = data_bytes(&first);
    assert_eq!(data, 40 * row_bytes);
    assert!(header < 4096, "the header is small: {header} bytes");
    let before = std::fs::metadata(&first).unwrap();

    let second =
        store::append(&at.dir, &meta, &update(&sr, &tr, 100, 2), &step("two", 100)).unwrap();
    assert_eq!(data_bytes(&second).0, 100 * row_bytes);
    let after = std::fs::metadata(&first).unwrap();
    assert_eq!(
        (
            before.ino(),
            before.mtime(),
            before.mtime_nsec(),
            before.len()
        ),
        (after.ino(), after.mtime(), after.mtime_nsec(), after.len()),
        "the first shard was not rewritten"
    );
    assert_eq!(std::fs::read(&first).unwrap(), bytes);
    // Nothing but the two shards: no copy of the statistics, no summary to rewrite.
    let mut names: Vec<_> = walk(&at.pair.learned());
    names.sort();
    assert_eq!(names, {
        let mut s = vec![first.clone(), second.clone()];
        s.sort();
        s
    });
    let m = store::read_meta(&at.pair, Some(&at.mapper))
        .unwrap()
        .unwrap();
    assert_eq!((m.tokens, m.steps.len()), (140, 2));
    assert!(m
        .summary()
        .contains("learned from 140 positions in 2 updates"));

    // Loading adds both updates to the calibration, exactly as adding them in turn does.
    let mut loaded = calibration(dir.path(), &sr, &tr);
    let m = store::load_into(&at.pair, &mut loaded, &sr, &tr, &at.mapper)
        .unwrap()
        .unwrap();
    assert_eq!(m.tokens, 140);
    let mut expected = calibration(dir.path(), &sr, &tr);
    for (rows, seed) in [(40, 1), (100, 2)] {
        update(&sr, &tr, rows, seed).add_to(&mut expected).unwrap();
    }
    assert!(loaded.keys == expected.keys && loaded.values == expected.values);
}

/// The bytes of a shard's tensors, and of its header.
fn data_bytes(p: &Path) -> (usize, usize) {
    let bytes = std::fs::read(p).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (bytes.len() - 8 - header, header)
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn two_writers_appending_at_once_to_one_directory_lose_nothing() {
    let (dir, _tiny, a, b) = calibrated();
    let (at, meta, sr, tr) = learned(dir.path(), &a, &b);
    let start = Barrier::new(2);
    let kept: Vec<Vec<(PathBuf, usize)>> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (at, meta, sr, tr, start) = (&at, &meta, &sr, &tr, &start);
                s.spawn(move || {
                    start.wait();
                    (0..4u64)
                        .map(|i| {
                            let rows = 16 + (w * 4 + i) as usize;
                            let from = format!("writer {w}, update {i}");
                            let u = update(sr, tr, rows, w * 100 + i);
                            (
                                store::append(&at.dir, meta, &u, &step(&from, rows)).unwrap(),
                                rows,
                            )
                        })
                        .collect()
                })
            })
            .collect();
        writers.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<&(PathBuf, usize)> = kept.iter().flatten().collect();
    assert!(all.iter().all(|(p, _)| p.exists()));
    let total: usize = all.iter().map(|(_, rows)| rows).sum();
    let m = store::read_meta(&at.pair, Some(&at.mapper))
        .unwrap()
        .unwrap();
    assert_eq!(m.steps.len(), 8);
    assert_eq!(m.tokens, total as u64);
    for w in 0..2 {
        for i in 0..4 {
            let from = format!("writer {w}, update {i}");
            assert!(m.steps.iter().any(|s| s.from == from), "{from} lost");
        }
    }
    let mut stats = calibration(dir.path(), &sr, &tr);
    let base = stats.keys.count();
    store::load_into(&at.pair, &mut stats, &sr, &tr, &at.mapper).unwrap();
    assert_eq!(stats.keys.count(), base + total as u64);
}

#[test]
fn two_learners_keeping_updates_in_one_directory_at_once_keep_all_of_them() {
    let (dir, tiny, a, b) = calibrated();
    let start = Barrier::new(2);
    // Each learner was opened before the other kept anything, as two runs started
    // together are.
    let learners = [
        open(&a, &b, dir.path(), true),
        open(&a, &b, dir.path(), true),
    ];
    let kept: Vec<Vec<(PathBuf, usize)>> = std::thread::scope(|s| {
        let runs: Vec<_> = learners
            .into_iter()
            .enumerate()
            .map(|(run, mut opened)| {
                let (a, b, tiny, start) = (&a, &b, &tiny, &start);
                s.spawn(move || {
                    start.wait();
                    let mut kept = Vec::new();
                    for seed in [101, 102, 103] {
                        let ids = conversation(tiny, a, seed + 10 * run as u64);
                        let o = learn_once(&mut opened.learner, a, b, &ids).expect("enough text");
                        if o.accepted {
                            let label = format!("run {run}, seed {seed}");
                            let path = opened.keep(&label, &o).unwrap().expect("an update");
                            kept.push((path, o.tokens));
                        }
                    }
                    kept
                })
            })
            .collect();
        runs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<&(PathBuf, usize)> = kept.iter().flatten().collect();
    assert!(
        !all.is_empty(),
        "some update was taken on this in-domain text"
    );
    assert!(
        all.iter().all(|(p, _)| p.exists()),
        "every kept update is on disk"
    );
    let total: u64 = all.iter().map(|(_, t)| *t as u64).sum();
    let (at, ..) = learned(dir.path(), &a, &b);
    let m = store::read_meta(&at.pair, Some(&at.mapper))
        .unwrap()
        .unwrap();
    assert_eq!(m.steps.len(), all.len());
    assert_eq!(m.tokens, total);
    // The next session starts from both runs' updates.
    assert_eq!(
        open(&a, &b, dir.path(), true).learner.learned_tokens(),
        total
    );
}

#[test]
fn a_damaged_shard_is_refused_naming_its_tensor_and_the_fix() {
    let (dir, _tiny, a, b) = calibrated();
    let (at, meta, sr, tr) = learned(dir.path(), &a, &b);
    let path = store::append(&at.dir, &meta, &update(&sr, &tr, 20, 1), &step("x", 20)).unwrap();
    common::poison_tensor(&path, "target.values", 3, &f32::NAN.to_le_bytes());
    let mut stats = calibration(dir.path(), &sr, &tr);
    let e = store::load_into(&at.pair, &mut stats, &sr, &tr, &at.mapper)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`target.values`") && e.contains("not a finite"),
        "{e}"
    );
    assert!(e.contains("--reset-learned"), "{e}");
    assert!(e.contains(&path.display().to_string()), "{e}");
    // The listing still reads the headers, which are whole.
    assert_eq!(
        store::read_meta(&at.pair, Some(&at.mapper))
            .unwrap()
            .unwrap()
            .tokens,
        20
    );

    // A shard of other models is refused as such.
    let (other, _) = refs(&b, &a);
    let mut foreign = sr.clone();
    foreign.sha256 = other.sha256.clone();
    let e = shard::read(&path, &foreign, &tr).unwrap_err().to_string();
    assert!(e.contains("other models"), "{e}");
    // A shard still being written is not one.
    std::fs::write(path.with_file_name(".half.partial"), b"half").unwrap();
    assert_eq!(shard::list(&at.pair).unwrap(), vec![path]);
}

#[test]
fn statistics_an_earlier_version_kept_are_a_base_the_shards_add_to_and_stay_as_they_were() {
    let (dir, _tiny, a, b) = calibrated();
    let (at, _, sr, tr) = learned(dir.path(), &a, &b);
    // The earlier layout: the learned statistics and learned.json, saved whole.
    let cal = calibration(dir.path(), &sr, &tr);
    let mut base = DirectionStats::new(
        Direction::Forward,
        (sr.layers, width(&sr) / sr.layers),
        (tr.layers, width(&tr) / tr.layers),
        cal.token_layers > 0,
    )
    .unwrap();
    update(&sr, &tr, 30, 7).add_to(&mut base).unwrap();
    let mut old = LearnedMeta::new(sr.clone(), tr.clone(), cal.token_layers);
    old.record(step("earlier", 30));
    write_dir(
        &at.pair.learned(),
        &base,
        "learned.json",
        &serde_json::to_string_pretty(&old).unwrap(),
    )
    .unwrap();
    let stamp = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec(), m.len())
    };
    let files = ["keys.safetensors", "values.safetensors", "learned.json"]
        .map(|f| at.pair.learned().join(f));
    let before = files.clone().map(|p| stamp(&p));

    store::append(&at.dir, &old, &update(&sr, &tr, 20, 8), &step("now", 20)).unwrap();
    assert_eq!(
        files.clone().map(|p| stamp(&p)),
        before,
        "the base is not rewritten"
    );
    let m = store::read_meta(&at.pair, Some(&at.mapper))
        .unwrap()
        .unwrap();
    assert_eq!((m.tokens, m.steps.len()), (50, 2));

    let mut loaded = calibration(dir.path(), &sr, &tr);
    store::load_into(&at.pair, &mut loaded, &sr, &tr, &at.mapper).unwrap();
    let mut expected = cal;
    // The base as its files hold it: their matrices are f32.
    let stored = |f: &str| baton::mapper::PairStats::load(&at.pair.learned().join(f)).unwrap();
    expected.keys.merge(&stored("keys.safetensors")).unwrap();
    expected
        .values
        .merge(&stored("values.safetensors"))
        .unwrap();
    update(&sr, &tr, 20, 8).add_to(&mut expected).unwrap();
    assert!(loaded.keys == expected.keys && loaded.values == expected.values);
    assert_eq!(open(&a, &b, dir.path(), true).learner.learned_tokens(), 50);

    // A reset forgets the base and the shards alike.
    assert!(store::reset(&at.dir, &at.pair).unwrap());
    assert!(store::read_meta(&at.pair, Some(&at.mapper))
        .unwrap()
        .is_none());
}

/// `path`'s modification time set `secs` seconds back.
fn age(path: &Path, secs: u64) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(secs))
        .unwrap();
}

#[test]
fn a_learner_starting_clears_what_killed_writers_left_and_keeps_a_live_ones() {
    let (dir, _tiny, a, b) = calibrated();
    let (at, meta, sr, tr) = learned(dir.path(), &a, &b);
    let kept = store::append(&at.dir, &meta, &update(&sr, &tr, 16, 1), &step("one", 16)).unwrap();
    let shards = at.pair.shards();
    // A write killed mid-way: its folder, unlocked, with the writer's half file.
    let dead = shards.join(".00000000000000000001-4242-0.partial");
    std::fs::create_dir(&dead).unwrap();
    std::fs::write(dead.join(".tmpAbC123"), vec![0u8; 1 << 20]).unwrap();
    std::fs::write(dead.join("writer.lock"), b"").unwrap();
    age(&dead.join("writer.lock"), 3600);
    // An earlier version's loose temporary file, long past any write.
    let loose = shards.join(".tmpXyZ789");
    std::fs::write(&loose, vec![0u8; 1 << 20]).unwrap();
    age(&loose, 2 * 86_400);
    // A write in progress in another process: its folder's lock is held.
    let live = shards.join(".00000000000000000002-4343-0.partial");
    std::fs::create_dir(&live).unwrap();
    let lock = std::fs::File::create(live.join("writer.lock")).unwrap();
    lock.lock().unwrap();
    age(&live.join("writer.lock"), 3600);

    let opened = open(&a, &b, dir.path(), true);
    assert_eq!(opened.meta.tokens, 16);
    assert!(!dead.exists() && !loose.exists());
    assert!(live.is_dir() && kept.is_file());
    drop(lock);
}

#[test]
fn what_a_mapper_learned_stays_with_it_when_a_calibration_replaces_it() {
    let (dir, tiny, a, b) = calibrated();
    // A workbench learning on the first mapper keeps an update.
    let mut running = open(&a, &b, dir.path(), true);
    let take = |opened: &mut baton::learn::Opened, seed: u64| {
        for s in seed..seed + 8 {
            let ids = conversation(&tiny, &a, s);
            let o = learn_once(&mut opened.learner, &a, &b, &ids).expect("enough text");
            if o.accepted {
                return opened
                    .keep("a conversation", &o)
                    .unwrap()
                    .expect("an update");
            }
        }
        panic!("no update was taken on this in-domain text");
    };
    let before = take(&mut running, 101);
    let (at, ..) = learned(dir.path(), &a, &b);
    let first = at.mapper.clone();
    assert!(store::read_meta(&at.pair, Some(&first))
        .unwrap()
        .is_some_and(|m| m.steps.len() == 1 && m.not_applied == 0));

    // A calibration replaces the mapper while that workbench still learns on the old one.
    calibrate_into(&a, &b, &docs(&tiny), dir.path());
    let (at, ..) = learned(dir.path(), &a, &b);
    assert_ne!(at.mapper.identity(), first.identity(), "a new mapper");
    let after = take(&mut running, 201);
    assert!(before.is_file() && after.is_file(), "nothing is deleted");

    // The new mapper starts from its calibration: neither update is applied to it, and
    // both are counted as not applied, with the fix.
    let fresh = open(&a, &b, dir.path(), true);
    assert_eq!(fresh.learner.learned_tokens(), 0);
    assert_eq!((fresh.meta.steps.len(), fresh.meta.not_applied), (0, 2));
    // As `baton mappers` says it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["mappers", "--mapper-dir"])
        .arg(at.dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("2 more updates kept here are not applied to this mapper")
            && listing.contains("--reset-learned"),
        "{listing}"
    );
    // What it learns itself is its own.
    let mut fresh = fresh;
    take(&mut fresh, 301);
    let again = open(&a, &b, dir.path(), true);
    assert_eq!((again.meta.steps.len(), again.meta.not_applied), (1, 2));
    assert!(again.learner.learned_tokens() > 0);
}

//! Running a study's items: each an ordinary recorded session, written under a temporary
//! name and renamed to `<out>/items/<id>.jsonl` only once its run completed, so a rerun
//! skips what is finished and a killed run leaves no half file where a session belongs.
//! Several items run at once with `jobs`, each on an engine of its own.

use super::file::{Study, Variant};
use super::leftovers;
use super::lock::{self, ShardLock};
use super::plan::{Manifest, Shard, WorkItem};
use super::StudyError;
use baton_engine::headless::run_headless;
use baton_engine::{EngineConfig, RereadOverride, SettingsOverrides};
use baton_runtime::model::Placement;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

pub use super::leftovers::ITEMS_DIR;

/// The session file of `item` under `out`.
pub fn session_path(out: &Path, item: &WorkItem) -> PathBuf {
    out.join(ITEMS_DIR).join(format!("{}.jsonl", item.id))
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Run and recorded now.
    Done { seconds: f64 },
    /// Its session was there already.
    Finished,
    /// Its run failed; no session was put in place.
    Failed(String),
}

impl Variant {
    /// The settings this variant sets over the script's.
    pub fn overrides(&self) -> Result<SettingsOverrides, StudyError> {
        let reread = match &self.reread {
            Some(r) => Some(
                r.parse::<RereadOverride>()
                    .map_err(|e| StudyError::Item(format!("reread {r:?}: {e}")))?,
            ),
            None => None,
        };
        Ok(SettingsOverrides {
            learn: self.learn,
            tail: self.tail,
            reread,
            ..SettingsOverrides::default()
        })
    }
}

/// The engine set-up of `item`: its models in order, the script's settings, then the
/// variant's, recording to `record`, with the variant's mappers directory or else the
/// study's. Learning keeps nothing: every item of a variant starts from the same
/// mapper, whichever ran first; an item without a switch does not learn at all.
pub fn item_config(
    study: &Study,
    manifest: &Manifest,
    item: &WorkItem,
    on: &Placement,
    record: PathBuf,
) -> Result<(EngineConfig, Vec<baton_protocol::Command>), StudyError> {
    let script = study
        .scripts
        .iter()
        .find(|s| s.name == item.script)
        .ok_or_else(|| StudyError::Item(format!("the study has no script {}", item.script)))?;
    let variant = manifest
        .variants
        .get(&item.variant)
        .ok_or_else(|| StudyError::Item(format!("the study has no variant {}", item.variant)))?;
    let mut cfg = EngineConfig::new(item.models.clone(), on.device.clone());
    cfg.compute = on.compute;
    cfg.settings.apply(&script.script.settings);
    cfg.settings.apply(&variant.overrides()?);
    if variant.stays() {
        // Nothing is handed over, so nothing is learned: a learner set up anyway reads
        // the mappers' saved statistics in the background, and the item waited for it
        // at its end, longer than its whole conversation took.
        cfg.settings.learn = false;
    }
    // A variant's own directory first, then the command's (flag or BATON_MAPPER_DIR).
    if let Some(d) = variant.mapper_dir.as_ref().or(study.mapper_dir.as_ref()) {
        cfg.mapper_dir = baton_method::mapper::dir::MapperDir::named(d);
    }
    cfg.learning.keep = false;
    cfg.record = Some(record);
    let steps = script
        .script
        .steps
        .iter()
        .filter(|c| !(variant.stays() && matches!(c, baton_protocol::Command::Switch)))
        .cloned()
        .collect();
    Ok((cfg, steps))
}

/// Makes `out` ready for `shard`'s run, before any model loads: its items folder there
/// and writable, the shard's lock taken (refused while another run holds it), and what
/// a killed run of the shard left half-recorded removed.
pub fn prepare(out: &Path, manifest: &Manifest, shard: Shard) -> Result<ShardLock, StudyError> {
    manifest.check_ids()?;
    let dir = out.join(ITEMS_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| StudyError::Write {
        path: dir.clone(),
        source: e,
    })?;
    let lock = lock::acquire(out, shard)?;
    // A folder that exists can still refuse new files, which would otherwise show only
    // as every item failing once its models are loaded.
    let probe = dir.join(format!(".write-check.{}", std::process::id()));
    std::fs::File::create(&probe).map_err(|e| StudyError::Write {
        path: probe.clone(),
        source: e,
    })?;
    let _ = std::fs::remove_file(&probe);
    let removed = leftovers::remove_partials(out, manifest, shard, &lock)?;
    if removed > 0 {
        tracing::info!(
            "removed {removed} half-recorded sessions of shard {}/{} from a run that ended",
            shard.index,
            shard.count
        );
    }
    Ok(lock)
}

/// Runs the items of `shard` not finished yet under `out`, `jobs` at a time; `told` hears
/// of each as it ends. The study's manifest must be saved in `out` already; the shard is
/// locked for the run (see [`prepare`]).
pub fn run_items(
    study: &Study,
    manifest: &Manifest,
    out: &Path,
    shard: Shard,
    jobs: usize,
    on: &Placement,
    told: &(dyn Fn(&WorkItem, &Outcome) + Sync),
) -> Result<Vec<(String, Outcome)>, StudyError> {
    let _lock = prepare(out, manifest, shard)?;
    let items = shard.items(manifest);
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(items.len()));
    let work = || loop {
        let k = next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(k) else { break };
        let outcome = run_one(study, manifest, out, item, on);
        told(item, &outcome);
        if let Ok(mut r) = results.lock() {
            r.push((k, item.id.clone(), outcome));
        }
    };
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(items.len().max(1)) {
            s.spawn(work);
        }
    });
    let mut done = results.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(k, _, _)| *k);
    Ok(done.into_iter().map(|(_, id, o)| (id, o)).collect())
}

fn run_one(
    study: &Study,
    manifest: &Manifest,
    out: &Path,
    item: &WorkItem,
    on: &Placement,
) -> Outcome {
    let path = session_path(out, item);
    if path.is_file() {
        return Outcome::Finished;
    }
    // A name of this process's own: a run killed before the rename leaves a file no
    // rerun mistakes for a session, and the rerun starts the item again.
    let partial = path.with_extension(format!("jsonl.{}.partial", std::process::id()));
    let _ = std::fs::remove_file(&partial);
    let started = Instant::now();
    let ran = item_config(study, manifest, item, on, partial.clone())
        .map_err(|e| e.to_string())
        .and_then(|(cfg, steps)| run_headless(cfg, &steps, &mut |_| {}).map_err(|e| e.to_string()));
    match ran {
        Ok(r) if !r.failed() => match std::fs::rename(&partial, &path) {
            Ok(()) => {
                // What an earlier failed run kept no longer says how the item went.
                let _ = std::fs::remove_file(path.with_extension("jsonl.failed"));
                Outcome::Done {
                    seconds: started.elapsed().as_secs_f64(),
                }
            }
            Err(e) => Outcome::Failed(format!("cannot put {} in place: {e}", path.display())),
        },
        Ok(r) => {
            let cause = r.errors.join("; ");
            keep_failed(&partial, &path, &item.id, &cause);
            Outcome::Failed(cause)
        }
        Err(e) => {
            keep_failed(&partial, &path, &item.id, &e);
            Outcome::Failed(e)
        }
    }
}

/// Keeps what a failed item left for a look, as `<id>.jsonl.failed`, a name no rerun
/// takes for done: its session, whose `error` events name the cause; or, where it failed
/// before its session began (its models or mappers did not load), a line naming the
/// cause.
fn keep_failed(partial: &Path, path: &Path, id: &str, cause: &str) {
    let failed = path.with_extension("jsonl.failed");
    if std::fs::rename(partial, &failed).is_ok() {
        return;
    }
    let line = format!("study item {id} failed before its session began: {cause}\n");
    if let Err(e) = std::fs::write(&failed, line) {
        tracing::warn!("cannot keep {}: {e}", failed.display());
    }
}

/// How many items to run at once on this machine: one per two cores (an engine's
/// matrix work takes more than one), and as many as the memory holds at about 3 GB an
/// engine of the default pair.
pub fn default_jobs() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_cores = (cores / 2).max(1);
    let by_memory =
        available_memory_bytes().map_or(usize::MAX, |b| ((b / (3 << 30)) as usize).max(1));
    by_cores.min(by_memory)
}

fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

//! What a mapper learned, kept beside its artifact apart from the calibration's own
//! statistics: `<mapper dir>/learned/<artifact name>/` holds one shard per accepted
//! update (see [`super::shard`]) and, where an earlier version kept what was learned as
//! statistics, those as a base the shards add to (`keys.safetensors`,
//! `values.safetensors` and `learned.json`, read and never rewritten). What was learned
//! in all, and where from, is read from the base and the shards themselves, so there is
//! no summary to fall out of step with them. Removing the directory (`baton mappers
//! --reset-learned`) returns the mapper to its calibration.

use super::learner::Update;
use super::shard::{self, ShardHeader};
pub use super::step::LearnedStep;
use super::LearnError;
use crate::calibrate::DirectionStats;
use crate::mapper::artifact::{self, ModelRef};
use crate::mapper::PairStats;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "baton-learned";
pub const VERSION: u32 = 1;
const META: &str = "learned.json";

/// What was learned between two models: the base's description (`learned.json`) with
/// every shard's step counted in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedMeta {
    pub format: String,
    pub version: u32,
    pub source: ModelRef,
    pub target: ModelRef,
    pub token_layers: usize,
    /// Positions learned in all.
    pub tokens: u64,
    pub steps: Vec<LearnedStep>,
}

impl LearnedMeta {
    pub fn new(source: ModelRef, target: ModelRef, token_layers: usize) -> Self {
        Self {
            format: FORMAT.into(),
            version: VERSION,
            source,
            target,
            token_layers,
            tokens: 0,
            steps: Vec::new(),
        }
    }

    /// Counts a kept step.
    pub fn record(&mut self, step: LearnedStep) {
        self.tokens += step.tokens as u64;
        self.steps.push(step);
    }

    /// For `baton mappers`.
    pub fn summary(&self) -> String {
        let mut sources: Vec<&str> = self.steps.iter().map(|s| s.from.as_str()).collect();
        sources.dedup();
        let last = sources.last().copied().unwrap_or("-");
        format!(
            "learned from {} positions in {} updates ({} sources, the last {last})",
            self.tokens,
            self.steps.len(),
            sources.len()
        )
    }
}

/// Where what `source → target` learned lives under `mapper_dir`.
pub fn learned_dir_in(mapper_dir: &Path, source: &ModelRef, target: &ModelRef) -> PathBuf {
    artifact::beside_artifact(mapper_dir, "learned", source, target)
}

fn bad(path: &Path, reason: impl Into<String>) -> LearnError {
    LearnError::Store {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Keeps `update`, taken by `step`, as a new shard in `dir`; its path once it is on
/// disk whole. Other writers' shards are left as they are.
pub fn append(
    dir: &Path,
    meta: &LearnedMeta,
    update: &Update,
    step: &LearnedStep,
) -> Result<PathBuf, LearnError> {
    let header = ShardHeader {
        source: meta.source.clone(),
        target: meta.target.clone(),
        token_layers: meta.token_layers,
        step: step.clone(),
    };
    shard::write(dir, &header, update)
}

const FIX: &str = "remove it with `baton mappers --reset-learned`";

/// The base's description: `learned.json`, where an earlier version kept what was
/// learned as statistics.
fn read_base(dir: &Path) -> Result<Option<LearnedMeta>, LearnError> {
    let path = dir.join(META);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| bad(&path, format!("not readable: {e}; {FIX}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(&path, e.to_string())),
    }
}

/// What was learned in `dir`, from the base's description and the shards' headers (the
/// features are not read); `None` when nothing was.
pub fn read_meta(dir: &Path) -> Result<Option<LearnedMeta>, LearnError> {
    let base = read_base(dir)?;
    let shards = shard::list(dir)?;
    let mut meta = base;
    for path in &shards {
        let h = shard::read_header(path)?;
        meta.get_or_insert_with(|| {
            LearnedMeta::new(h.source.clone(), h.target.clone(), h.token_layers)
        })
        .record(h.step);
    }
    Ok(meta)
}

/// Adds what was learned between these models to `stats` (the calibration's, loaded
/// source-first or target-first): the base's statistics if there are any, then every
/// shard, one at a time. `None` when nothing was learned.
pub fn load_into(
    dir: &Path,
    stats: &mut DirectionStats,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<Option<LearnedMeta>, LearnError> {
    let mut meta = match read_base(dir)? {
        Some(base) => {
            add_base(dir, &base, stats, source, target)?;
            Some(base)
        }
        None => None,
    };
    for path in shard::list(dir)? {
        let (h, update) = shard::read(&path, source, target)?;
        update.add_to(stats)?;
        meta.get_or_insert_with(|| LearnedMeta::new(h.source, h.target, stats.token_layers))
            .record(h.step);
    }
    Ok(meta)
}

/// Adds the statistics an earlier version kept, described by `meta`, to `stats`.
fn add_base(
    dir: &Path,
    meta: &LearnedMeta,
    stats: &mut DirectionStats,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<(), LearnError> {
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(bad(
            dir,
            format!(
                "format {} version {}, this build reads {FORMAT} version {VERSION}: {FIX}",
                meta.format, meta.version
            ),
        ));
    }
    if meta.source.sha256 != source.sha256 || meta.target.sha256 != target.sha256 {
        return Err(bad(
            dir,
            format!(
                "learned between other models ({} -> {}): {FIX}",
                meta.source.name, meta.target.name
            ),
        ));
    }
    let shape = |p: &PairStats| (p.l_s(), p.d_s(), p.l_t(), p.d_t());
    // One half at a time, so that only one half is ever held twice.
    for (name, into) in [
        ("keys.safetensors", &mut stats.keys),
        ("values.safetensors", &mut stats.values),
    ] {
        let half = PairStats::load(&dir.join(name))?;
        if meta.token_layers != stats.token_layers || shape(&half) != shape(into) {
            return Err(bad(
                dir,
                format!(
                    "learned for a mapper of another shape (with or without token \
                     features): {FIX}"
                ),
            ));
        }
        if half.count() != meta.tokens {
            return Err(bad(
                dir,
                format!("{META} and the statistics disagree on the count: {FIX}"),
            ));
        }
        into.merge(&half)?;
    }
    Ok(())
}
/// Forgets what was learned; true when there was something.
pub fn reset(dir: &Path) -> Result<bool, LearnError> {
    if !dir.exists() {
        return Ok(false);
    }
    std::fs::remove_dir_all(dir).map_err(|e| bad(dir, e.to_string()))?;
    Ok(true)
}

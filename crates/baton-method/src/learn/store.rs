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
use crate::mapper::artifact::{MapperMeta, ModelRef};
use crate::mapper::dir::{MapperDir, PairFiles};
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
    /// Steps kept beside the mapper that are not applied to it: learned on another
    /// mapper of the pair (one a calibration replaced since), or a calibration window
    /// kept twice.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_applied: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
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
            not_applied: 0,
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
        let mut line = format!(
            "learned from {} positions in {} updates ({} sources, the last {last})",
            self.tokens,
            self.steps.len(),
            sources.len()
        );
        if self.not_applied > 0 {
            line += &format!(
                "; {} more updates kept here are not applied to this mapper (learned on \
                 a mapper a calibration replaced, or read twice): `baton mappers \
                 --reset-learned` removes them",
                self.not_applied
            );
        }
        line
    }
}

/// How a learned step read in the background is labelled: this and the window's number.
pub const CALIBRATION_WINDOW: &str = "calibration window ";

/// Which kept steps a mapper applies: its own, each calibration window once.
struct Applies<'a> {
    mapper: Option<&'a MapperMeta>,
    windows: std::collections::HashSet<String>,
}

impl<'a> Applies<'a> {
    fn new(mapper: Option<&'a MapperMeta>) -> Self {
        Self {
            mapper,
            windows: Default::default(),
        }
    }

    /// Whether `step` is applied; a window's first step is, a second is not.
    fn take(&mut self, step: &LearnedStep) -> bool {
        if self.mapper.is_some_and(|m| !step.belongs_to(m)) {
            return false;
        }
        !step.from.starts_with(CALIBRATION_WINDOW) || self.windows.insert(step.from.clone())
    }
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
    dir: &MapperDir,
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
fn read_base(pair: &PairFiles) -> Result<Option<LearnedMeta>, LearnError> {
    let path = pair.learned().join(META);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| bad(&path, format!("not readable: {e}; {FIX}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(&path, e.to_string())),
    }
}

/// What `mapper` (or, with none, any mapper of the pair) learned, from the base's
/// description and the shards' headers (the features are not read); `None` when nothing
/// was kept.
pub fn read_meta(
    pair: &PairFiles,
    mapper: Option<&MapperMeta>,
) -> Result<Option<LearnedMeta>, LearnError> {
    let mut applies = Applies::new(mapper);
    let mut meta = read_base(pair)?.map(|base| base_applied(base, &mut applies));
    for path in &shard::list(pair)? {
        let h = shard::read_header(path)?;
        let m = meta.get_or_insert_with(|| {
            LearnedMeta::new(h.source.clone(), h.target.clone(), h.token_layers)
        });
        match applies.take(&h.step) {
            true => m.record(h.step),
            false => m.not_applied += 1,
        }
    }
    Ok(meta)
}

/// The legacy base as it counts for a mapper: all of it, or (when a step of it is not
/// the mapper's) none of it, its steps counted as not applied.
fn base_applied(mut base: LearnedMeta, applies: &mut Applies<'_>) -> LearnedMeta {
    let steps = std::mem::take(&mut base.steps);
    let tokens = std::mem::take(&mut base.tokens);
    let all = steps.iter().all(|s| applies.take(s));
    if all {
        base.steps = steps;
        base.tokens = tokens;
    } else {
        base.not_applied = steps.len();
    }
    base
}

/// Adds what `mapper` learned between these models to `stats` (the calibration's,
/// loaded source-first or target-first): the base's statistics if there are any and
/// they are its, then every shard of its, one at a time. What was learned on another
/// mapper of the pair is counted, not added. `None` when nothing was kept.
pub fn load_into(
    pair: &PairFiles,
    stats: &mut DirectionStats,
    source: &ModelRef,
    target: &ModelRef,
    mapper: &MapperMeta,
) -> Result<Option<LearnedMeta>, LearnError> {
    let mut applies = Applies::new(Some(mapper));
    let mut meta = match read_base(pair)? {
        Some(base) => {
            let base = base_applied(base, &mut applies);
            if base.not_applied == 0 {
                add_base(&pair.learned(), &base, stats, source, target)?;
            }
            Some(base)
        }
        None => None,
    };
    for path in shard::list(pair)? {
        let h = shard::read_header(&path)?;
        let m = meta.get_or_insert_with(|| {
            LearnedMeta::new(h.source.clone(), h.target.clone(), stats.token_layers)
        });
        if !applies.take(&h.step) {
            m.not_applied += 1;
            continue;
        }
        let (h, update) = shard::read(&path, source, target)?;
        update.add_to(stats)?;
        m.record(h.step);
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
/// Forgets what was learned for `pair` in `dir`; true when there was something. The
/// learned folder goes as every write there goes, through a staging directory and under
/// the directory's lock, so a shard that a running workbench commits meanwhile lands
/// either before it (and goes with it) or after it (into a fresh folder), never into a
/// folder half removed.
pub fn reset(dir: &MapperDir, pair: &PairFiles) -> Result<bool, LearnError> {
    let learned = pair.learned();
    if !learned.exists() {
        return Ok(false);
    }
    let mut staging = dir.stage()?;
    staging.remove(&learned)?;
    staging.commit()?;
    Ok(true)
}

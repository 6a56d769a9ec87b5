//! What a mapper learned, kept beside its artifact apart from the calibration's own
//! statistics: `<mapper dir>/learned/<artifact name>/` holds the key and value
//! statistics of the accepted updates and `learned.json`, which says how many positions
//! they hold and where they came from. Removing the directory (`baton mappers
//! --reset-learned`) returns the mapper to its calibration.

use super::{LearnError, LearnOutcome};
use crate::calibrate::saved_stats::write_dir;
use crate::calibrate::DirectionStats;
use crate::mapper::artifact::{self, ModelRef};
use crate::mapper::PairStats;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "baton-learned";
pub const VERSION: u32 = 1;
const META: &str = "learned.json";

/// One accepted update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedStep {
    /// Where the text came from (a session file, an eval conversation).
    pub from: String,
    pub unix: u64,
    pub tokens: usize,
    /// Held-out cosine before and after, both halves combined.
    pub before: f64,
    pub after: f64,
}

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

    /// Counts an accepted step.
    pub fn record(&mut self, from: &str, o: &LearnOutcome) {
        self.tokens = o.learned_tokens;
        self.steps.push(LearnedStep {
            from: from.to_string(),
            unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tokens: o.tokens,
            before: o.before.combined(),
            after: o.after.combined(),
        });
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

pub fn save(dir: &Path, stats: &DirectionStats, meta: &LearnedMeta) -> Result<(), LearnError> {
    let json = serde_json::to_string_pretty(meta).map_err(|e| bad(dir, e.to_string()))?;
    Ok(write_dir(dir, stats, META, &json)?)
}

pub fn read_meta(dir: &Path) -> Result<Option<LearnedMeta>, LearnError> {
    let path = dir.join(META);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            bad(
                &path,
                format!("not readable: {e}; remove it with `baton mappers --reset-learned`"),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(&path, e.to_string())),
    }
}

/// What was learned between these models, shaped as `like` (the calibration's
/// statistics it adds to); `None` when nothing was.
pub fn load(
    dir: &Path,
    like: &DirectionStats,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<Option<(DirectionStats, LearnedMeta)>, LearnError> {
    let Some(meta) = read_meta(dir)? else {
        return Ok(None);
    };
    let fix = "remove it with `baton mappers --reset-learned`";
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(bad(
            dir,
            format!(
                "format {} version {}, this build reads {FORMAT} version {VERSION}: {fix}",
                meta.format, meta.version
            ),
        ));
    }
    if meta.source.sha256 != source.sha256 || meta.target.sha256 != target.sha256 {
        return Err(bad(
            dir,
            format!(
                "learned between other models ({} -> {}): {fix}",
                meta.source.name, meta.target.name
            ),
        ));
    }
    let keys = PairStats::load(&dir.join("keys.safetensors"))?;
    let values = PairStats::load(&dir.join("values.safetensors"))?;
    let shape = |p: &PairStats| (p.l_s(), p.d_s(), p.l_t(), p.d_t());
    if meta.token_layers != like.token_layers
        || shape(&keys) != shape(&like.keys)
        || shape(&values) != shape(&like.values)
    {
        return Err(bad(
            dir,
            format!(
                "learned for a mapper of another shape (with or without token features): {fix}"
            ),
        ));
    }
    if keys.count() != meta.tokens || values.count() != meta.tokens {
        return Err(bad(
            dir,
            format!("{META} and the statistics disagree on the count: {fix}"),
        ));
    }
    Ok(Some((
        DirectionStats {
            direction: like.direction,
            keys,
            values,
            token_layers: meta.token_layers,
        },
        meta,
    )))
}

/// Forgets what was learned; true when there was something.
pub fn reset(dir: &Path) -> Result<bool, LearnError> {
    if !dir.exists() {
        return Ok(false);
    }
    std::fs::remove_dir_all(dir).map_err(|e| bad(dir, e.to_string()))?;
    Ok(true)
}

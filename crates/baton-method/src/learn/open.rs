//! Setting a learner up beside a mapper artifact: the calibration's saved statistics,
//! what was learned before (if it is to be used), and the fixed calibration text the
//! updates are judged on.

use super::judge::Slice;
use super::learner::Learner;
use super::refit::Structure;
use super::store::{self, LearnedMeta, LearnedStep};
use super::{LearnError, LearnOutcome};
use crate::calibrate::saved_stats;
use crate::calibrate::Direction;
use crate::mapper::artifact::{MapperArtifact, MapperMeta, ModelRef};
use crate::mapper::dir::{MapperDir, PairFiles};
use crate::mapper::CacheMapper;
use crate::metrics::probe_positions;
use baton_data::corpus::{self, Document, Split};
use baton_runtime::model::Model;
use std::path::PathBuf;

/// Windows of calibration text in the judged slice, and their length: enough probes to
/// steady the score, little enough to judge an update in a few seconds.
pub const CALIBRATION_WINDOWS: usize = 2;
pub const CALIBRATION_LEN: usize = 256;
const CALIBRATION_PROBES: usize = 16;

/// A learner with where it keeps what it learns.
pub struct Opened {
    pub learner: Learner,
    /// What this mapper learned, its own steps only.
    pub meta: LearnedMeta,
    /// The mapper directory what it learns is kept in.
    pub dir: MapperDir,
    /// The mapper it learns on: what it keeps is bound to it.
    pub mapper: MapperMeta,
}

/// The fixed calibration text updates are judged on: the first windows of the corpus's
/// selection split, which no fit reads.
pub fn calibration_slices(
    src: &Model,
    tgt: &Model,
    docs: &[Document],
    anchor: usize,
) -> Result<Vec<Slice>, LearnError> {
    let windows = corpus::windows(
        docs,
        &tgt.tokenizer,
        Split::Select,
        CALIBRATION_LEN,
        CALIBRATION_WINDOWS,
    )
    .map_err(crate::calibrate::CalibrateError::from)?;
    windows
        .into_iter()
        .map(|w| {
            let probes: Vec<usize> = probe_positions(w.len(), CALIBRATION_PROBES)
                .into_iter()
                .filter(|&p| p >= anchor)
                .collect();
            Slice::read(src, tgt, w, probes, anchor)
        })
        .collect()
}

/// Why a trained mapper does not learn from use: learning re-solves the ridge maps from
/// statistics, which would drop the trained heads without a word.
fn not_learnable(art: &MapperArtifact, source: &str, target: &str) -> String {
    format!(
        "learning from use re-solves ridge maps, and {source} -> {target} is a {} mapper \
         whose trained networks it would drop: it is used as calibrated. Run with \
         --no-learn to say so, or calibrate a ridge mapper (`baton calibrate --mapper ridge`) \
         to learn from use",
        art.meta.kind
    )
}

/// A learner for `art` (loaded from `mapper_dir`, `mapper` its maps ready to apply):
/// with `use_learned`, starting from what was learned before.
#[allow(clippy::too_many_arguments)]
pub fn open(
    src: &Model,
    tgt: &Model,
    art: &MapperArtifact,
    mapper: CacheMapper,
    mapper_dir: &MapperDir,
    use_learned: bool,
    slices: Vec<Slice>,
    anchor: usize,
) -> Result<Opened, LearnError> {
    let sr = ModelRef::new(&src.identity, src.config());
    let tr = ModelRef::new(&tgt.identity, tgt.config());
    let files = mapper_dir.pair(&sr, &tr);
    let stats_dir = files.stats();
    if art.heads.is_some() {
        return Err(LearnError::Unsupported(not_learnable(
            art, &sr.name, &tr.name,
        )));
    }
    if saved_stats::read_meta(&stats_dir)?.is_none() {
        return Err(LearnError::Unsupported(format!(
            "learning adds to the calibration's statistics, and {} has none for {} -> {}: \
             calibrate with `baton calibrate` (without --no-save-stats), or turn learning \
             off with --no-learn",
            mapper_dir.path().display(),
            sr.name,
            tr.name
        )));
    }
    // Loaded source-first whatever the pair's order on the command line.
    let calibration = saved_stats::load(&stats_dir, Direction::Forward, &sr, &tr)?.stats;
    let structure = Structure::of(
        &art.keys,
        &art.values,
        art.meta.lambda,
        art.meta.standardize,
        &art.meta.report,
        src.config().kv_width(),
        tgt.config().head_dim,
    )?;
    // A start of learning is where what a killed writer left is cleared away.
    mapper_dir.clear_leftovers();
    let mut stats = calibration;
    let meta = match use_learned {
        true => store::load_into(&files, &mut stats, &sr, &tr, &art.meta)?,
        false => None,
    }
    .unwrap_or_else(|| LearnedMeta::new(sr, tr, stats.token_layers));
    let learner = Learner::new(
        src,
        tgt,
        structure,
        stats,
        meta.tokens,
        slices,
        anchor,
        mapper,
    )?;
    Ok(Opened {
        learner,
        meta,
        dir: mapper_dir.clone(),
        mapper: art.meta.clone(),
    })
}

impl Opened {
    /// What is kept about this pair in the mapper directory.
    pub fn files(&self) -> PairFiles {
        self.dir.pair(&self.mapper.source, &self.mapper.target)
    }

    /// Keeps the update the learner took last as a new shard, counted in `meta` once it
    /// is on disk; its path. `Ok(None)` when there is no update to keep.
    pub fn keep(&mut self, from: &str, o: &LearnOutcome) -> Result<Option<PathBuf>, LearnError> {
        let Some(update) = self.learner.take_update() else {
            return Ok(None);
        };
        let step = LearnedStep::of(from, o, &self.mapper);
        let path = store::append(&self.dir, &self.meta, &update, &step)?;
        self.meta.record(step);
        Ok(Some(path))
    }
}

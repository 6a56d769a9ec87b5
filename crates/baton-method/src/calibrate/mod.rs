//! Calibration: fit the mappers between two models of one family from what both do on
//! the same text, and choose among them on text the fit never saw.
//!
//! The phases, each in its own module:
//!
//! 1. `capture`: both models prefill the calibration windows; the paired key and value
//!    features of every kept position accumulate into
//!    [`PairStats`](crate::mapper::PairStats) for every requested direction at once.
//!    Both also read the held-out windows, keeping their caches and their own queries at
//!    probe positions.
//! 2. Per direction, source layers are ranked per target layer by single-layer R², and
//!    `sweep` fits a ridge map from the top-k source layers for every (k, λ) and scores
//!    it with `heldout`: attention-output cosine at the probes and next-token agreement
//!    of the target continuing each window from the mapped prefix. R² ranks layers only;
//!    it does not predict handoff quality, so it never chooses.
//! 3. [`choice`] picks the point by the chosen held-out measure under the cap on k, and
//!    prefers a cheaper k within the tolerance. It is pure.
//! 4. `rank` optionally cuts the chosen maps to a reduced rank.
//! 5. The maps and a [`CalibrationReport`] of everything measured come back as
//!    [`Fitted`], which the caller writes as the artifact.
//!
//! This module runs the capture and merges the statistics; `fit` runs phases 2 to 4 for
//! one direction.

mod capture;
pub mod choice;
pub mod commit;
mod error;
mod fit;
mod gains;
mod heldout;
mod job;
mod options;
mod rank;
pub mod residual;
mod save;
pub mod saved_stats;
mod sweep;
mod token_choice;
pub mod train;

pub use crate::mapper::calibration_report::{CalibrationReport, RankPoint, SkippedK, SweepPoint};
pub use commit::{save_calibration, Keep, Kept};
pub use error::CalibrateError;
pub use heldout::continuation_start;
pub use job::{calibrate_and_save, keep, Job, Outcome, PoorFate, PoorMap};
pub use options::{
    CalibrateOptions, RankChoice, SelectBy, TokenFeatures, AUTO_RANKS, DEFAULT_KEY_GAIN_MATCHED,
    DEFAULT_MAX_K, K_TOLERANCE, RANK_TOLERANCE,
};
pub use save::{corpus_info, save_fitted, Saved};

use crate::mapper::artifact::ModelRef;
use crate::mapper::ridge::LayerMap;
use crate::mapper::CacheMapper;
use crate::mapper::SourceScales;
use baton_data::corpus::{self, Document, Split};
use baton_runtime::model::{Model, ModelIdentity};
pub use capture::{capture, capture_until, Captured, DirectionStats, StatsRows, WindowFeatures};
use saved_stats::{SavedStats, StatsMeta, StatsSource};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Direction {
    /// First model to second.
    Forward,
    /// Second model to first.
    Backward,
}

impl Direction {
    /// `(source, target)` of this direction between `first` and `second`.
    pub fn pick<T>(self, first: T, second: T) -> (T, T) {
        match self {
            Direction::Forward => (first, second),
            Direction::Backward => (second, first),
        }
    }
}

/// Progress of a long calibration, for a bar with ETA.
pub trait CalibrationProgress {
    fn phase(&self, name: &str, total: u64);
    fn advance(&self, n: u64);
    fn note(&self, msg: &str);
}

pub struct NoProgress;
impl CalibrationProgress for NoProgress {
    fn phase(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn note(&self, _: &str) {}
}

/// A fitted mapper for one direction, ready to save or apply.
pub struct Fitted {
    pub source: ModelIdentity,
    pub target: ModelIdentity,
    pub k: usize,
    pub lambda: f64,
    pub standardize: bool,
    pub keys: Vec<LayerMap>,
    pub values: Vec<LayerMap>,
    /// The source features' means and deviations, for the int8 map.
    pub source_scales: SourceScales,
    pub report: CalibrationReport,
    /// Source layers past the source's own that the maps read: the token block's pieces.
    pub token_layers: usize,
    /// The trained heads of a residual or mlp mapper, and how they were trained.
    pub heads: Option<crate::mapper::nonlinear::Heads>,
    pub training: Option<crate::mapper::nonlinear::TrainingReport>,
}

impl Fitted {
    pub fn cache_mapper(&self, src: &Model, tgt: &Model) -> Result<CacheMapper, CalibrateError> {
        let m = heldout::to_cache_mapper(src, tgt, &self.keys, &self.values, &self.source_scales)?;
        Ok(match &self.heads {
            Some(h) => m.with_heads(h)?,
            None => m,
        })
    }
}

/// Checked between windows and between sweep points: a cancel is honoured within one
/// prefill or one fit, and nothing is written.
fn check_cancel(cancel: &AtomicBool) -> Result<(), CalibrateError> {
    if cancel.load(Ordering::Relaxed) {
        Err(CalibrateError::Cancelled)
    } else {
        Ok(())
    }
}

/// Calibrate the mappers between `a` and `b` for the requested directions.
pub fn calibrate(
    a: &Model,
    b: &Model,
    docs: &[Document],
    directions: &[Direction],
    opts: &CalibrateOptions,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<Vec<Fitted>, CalibrateError> {
    let corpus = CorpusName {
        files: "(not recorded)".into(),
        fingerprint: corpus::fingerprint(docs),
    };
    let run = Run {
        docs,
        corpus: &corpus,
        directions,
        opts,
    };
    Ok(calibrate_with(a, b, &run, Vec::new(), progress, cancel)?.fitted)
}

/// The corpus a calibration reads, as the saved statistics record it.
pub struct CorpusName {
    pub files: String,
    pub fingerprint: String,
}

/// What one calibration is asked to do.
pub struct Run<'a> {
    pub docs: &'a [Document],
    pub corpus: &'a CorpusName,
    pub directions: &'a [Direction],
    pub opts: &'a CalibrateOptions,
}

/// The fitted maps and the statistics they were fitted from (this run's windows plus
/// whatever saved statistics were merged in), to keep beside the artifacts.
pub struct Calibrated {
    pub fitted: Vec<Fitted>,
    pub stats: Vec<SavedStats>,
}

/// Calibrate as [`calibrate`] does, adding `prior` statistics (saved by an earlier run,
/// each with the directory it came from) to those of this run's windows. With
/// `opts.sequences` 0 nothing new is captured and the maps are fitted again from the
/// saved statistics alone: only the held-out windows are read.
pub fn calibrate_with(
    a: &Model,
    b: &Model,
    run: &Run<'_>,
    prior: Vec<(std::path::PathBuf, SavedStats)>,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<Calibrated, CalibrateError> {
    let Run {
        docs,
        directions,
        opts,
        ..
    } = *run;
    check_run(a, b, directions, opts, &prior)?;
    let len = opts.seq_len;
    let fit_windows = mixed_windows(
        a,
        docs,
        Split::Fit,
        len,
        (opts.skip_windows, opts.sequences),
        opts.chat_share,
    )?;
    let sel_windows = mixed_windows(
        a,
        docs,
        Split::Select,
        len,
        (0, opts.select_sequences),
        opts.chat_share,
    )?;
    let metas = stats_metas(a, b, run, &prior)?;
    let mut fresh = if fit_windows.is_empty() {
        Vec::new()
    } else {
        capture::allocate(a, b, directions, opts.token_features.on())?
    };
    let stats_bytes: usize = fresh
        .iter()
        .map(DirectionStats::memory_bytes)
        .sum::<usize>()
        + prior
            .iter()
            .map(|(_, p)| p.stats.memory_bytes())
            .sum::<usize>();
    tracing::info!(stats_bytes, "calibration statistics allocated");

    let t0 = Instant::now();
    if !fit_windows.is_empty() {
        capture::capture_fit(a, b, &fit_windows, opts, &mut fresh, progress, cancel)?;
    }
    let held = capture::capture_heldout(a, b, sel_windows, opts, progress, cancel)?;
    let capture_seconds = t0.elapsed().as_secs_f64();
    let stats = merge_stats(directions, metas, fresh, prior)?;

    let t1 = Instant::now();
    let mut out = stats
        .iter()
        .map(|s| {
            let st = &s.stats;
            let (src, tgt) = st.direction.pick(a, b);
            let mut f = fit::fit_direction(src, tgt, st, &held, opts, progress, cancel)?;
            f.report.capture_seconds = capture_seconds;
            f.report.stats_bytes = stats_bytes;
            f.report.sequences = s.meta.windows();
            Ok(f)
        })
        .collect::<Result<Vec<_>, CalibrateError>>()?;
    let fit_seconds = t1.elapsed().as_secs_f64();
    for f in &mut out {
        f.report.fit_seconds = fit_seconds;
    }
    if opts.train.kind != crate::mapper::nonlinear::MapperKind::Ridge {
        let windows = mixed_windows(
            a,
            docs,
            Split::Fit,
            len,
            (0, opts.train.windows),
            opts.chat_share,
        )?;
        let anchor = opts.skip_first.max(crate::mapper::DEFAULT_ANCHOR);
        train::train_heads(
            a,
            b,
            &mut out,
            &stats,
            &windows,
            &held,
            &opts.train,
            anchor,
            progress,
            cancel,
        )?;
    }
    Ok(Calibrated { fitted: out, stats })
}

/// Refuses, before anything is read, a run that cannot work: models with different
/// tokenizers, no direction, a k past a source's layers, or no statistics to fit from.
fn check_run(
    a: &Model,
    b: &Model,
    directions: &[Direction],
    opts: &CalibrateOptions,
    prior: &[(std::path::PathBuf, SavedStats)],
) -> Result<(), CalibrateError> {
    baton_runtime::text::ensure_same_tokenizer(&a.tokenizer, &b.tokenizer)
        .map_err(|e| CalibrateError::Model(e.into()))?;
    if directions.is_empty() {
        return Err(CalibrateError::Options(
            "no direction to calibrate: ask for at least one".into(),
        ));
    }
    opts.validate_with_prior(!prior.is_empty())?;
    for d in directions {
        let source = match d {
            Direction::Forward => a,
            Direction::Backward => b,
        };
        let layers = source.config().n_layer;
        // `all` (usize::MAX) means every layer; a number past the count is a mistake
        // that would otherwise quietly become a different k.
        if let Some(&k) = opts
            .k_sweep
            .iter()
            .find(|&&k| k != usize::MAX && k > layers)
        {
            return Err(CalibrateError::Options(format!(
                "--k {k}: {} has {layers} layers; give k up to {layers}, or `all`",
                source.identity.name
            )));
        }
        if opts.sequences == 0 && !prior.iter().any(|(_, p)| p.stats.direction == *d) {
            let (s, t) = d.pick(a, b);
            return Err(CalibrateError::Options(format!(
                "--sequences 0 fits from saved statistics alone, and none of those given \
                 hold {} -> {}: give --sequences 1 or more, or statistics of that direction",
                s.identity.name, t.identity.name
            )));
        }
    }
    Ok(())
}

/// What the statistics of each direction will record about themselves, checked against
/// the `prior` statistics they are to be merged with: before the capture, so a merge
/// that cannot add up does not cost it.
fn stats_metas(
    a: &Model,
    b: &Model,
    run: &Run<'_>,
    prior: &[(std::path::PathBuf, SavedStats)],
) -> Result<Vec<StatsMeta>, CalibrateError> {
    let Run {
        corpus,
        directions,
        opts,
        ..
    } = *run;
    let src_ref = |d: Direction| {
        let (s, t) = d.pick(a, b);
        (
            ModelRef::new(&s.identity, s.config()),
            ModelRef::new(&t.identity, t.config()),
        )
    };
    let this_run = (opts.sequences > 0).then(|| StatsSource {
        corpus: corpus.files.clone(),
        fingerprint: corpus.fingerprint.clone(),
        first_window: opts.skip_windows,
        windows: opts.sequences,
        seq_len: opts.seq_len,
        stride: opts.stride,
        chat_share: opts.chat_share,
        observations: 0,
    });
    let token_layers = |d: Direction| -> Result<usize, CalibrateError> {
        let ((_, ds), (_, dt)) = d.pick(capture::geometry(a), capture::geometry(b));
        Ok(if opts.token_features.on() {
            crate::mapper::token_block::block_layers(ds, dt)?
        } else {
            0
        })
    };
    let mut metas = Vec::new();
    for &d in directions {
        let (source, target) = src_ref(d);
        let meta = StatsMeta {
            format: saved_stats::FORMAT.into(),
            version: saved_stats::VERSION,
            source,
            target,
            token_layers: token_layers(d)?,
            skip_first: opts.skip_first,
            attention_weight: opts.attention_weight,
            observations: 0,
            sources: this_run.clone().into_iter().collect(),
        };
        for (dir, p) in prior.iter().filter(|(_, p)| p.stats.direction == d) {
            saved_stats::check_merge(&meta, &p.meta, dir)?;
        }
        metas.push(meta);
    }
    Ok(metas)
}

/// Per direction, this run's statistics (`fresh`, in the order of `directions`) with
/// the saved ones of that direction merged in.
fn merge_stats(
    directions: &[Direction],
    metas: Vec<StatsMeta>,
    fresh: Vec<DirectionStats>,
    prior: Vec<(std::path::PathBuf, SavedStats)>,
) -> Result<Vec<SavedStats>, CalibrateError> {
    let mut fresh = fresh.into_iter();
    let mut prior = prior;
    let mut stats = Vec::new();
    for (&d, mut meta) in directions.iter().zip(metas) {
        let mine: Vec<(std::path::PathBuf, SavedStats)> = {
            let (mine, rest): (Vec<_>, Vec<_>) =
                prior.into_iter().partition(|(_, p)| p.stats.direction == d);
            prior = rest;
            mine
        };
        // This run's windows start the sum; without any, the first saved statistics do.
        let mut mine = mine.into_iter();
        let mut merged = match fresh.next() {
            Some(st) => {
                let n = st.keys.count();
                meta.observations = n;
                if let Some(s) = meta.sources.first_mut() {
                    s.observations = n;
                }
                SavedStats { stats: st, meta }
            }
            None => mine
                .next()
                .map(|(_, p)| p)
                .ok_or_else(|| CalibrateError::Options("no statistics to fit from".into()))?,
        };
        for (dir, p) in mine {
            saved_stats::merge_into(&mut merged, &p, &dir)?;
        }
        stats.push(merged);
    }
    Ok(stats)
}

/// `count` windows of `split` after its first `skip`, `share` of them chat-shaped
/// (rounded), the rest plain; the skip is shared out the same way.
pub(crate) fn mixed_windows(
    m: &Model,
    docs: &[Document],
    split: Split,
    len: usize,
    (skip, count): (usize, usize),
    share: f64,
) -> Result<Vec<Vec<u32>>, CalibrateError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let chat_of = |n: usize| ((n as f64) * share).round() as usize;
    let (chat, chat_skip) = (chat_of(count), chat_of(skip));
    let (plain, plain_skip) = (count - chat, skip - chat_skip);
    let mut out = corpus::windows(docs, &m.tokenizer, split, len, plain_skip + plain)?;
    out.drain(..plain_skip);
    if chat > 0 {
        let template = m.chat_template().map_err(|e| {
            CalibrateError::Options(format!(
                "--chat-share {share} needs a chat template, and {} has none ({e}); use --chat-share 0",
                m.identity.name
            ))
        })?;
        let mut more = baton_data::chat_corpus::chat_windows(
            docs,
            &m.tokenizer,
            template,
            split,
            len,
            chat_skip + chat,
        )?;
        more.drain(..chat_skip);
        out.extend(more);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_direction_picks_source_and_target() {
        assert_eq!(Direction::Forward.pick("a", "b"), ("a", "b"));
        assert_eq!(Direction::Backward.pick("a", "b"), ("b", "a"));
    }

    #[test]
    fn a_set_cancel_flag_stops_and_a_clear_one_does_not() {
        assert!(check_cancel(&AtomicBool::new(false)).is_ok());
        assert!(matches!(
            check_cancel(&AtomicBool::new(true)),
            Err(CalibrateError::Cancelled)
        ));
    }
}

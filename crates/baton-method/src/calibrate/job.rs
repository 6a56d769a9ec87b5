//! One calibration from corpus to files: capture and fit, decide what
//! becomes the default, and put artifacts and statistics in place whole. `baton
//! calibrate` and the workbench's first run both go through it, so they keep one rule
//! for a map worse than no context, and say it in the same words.
//!
//! The rule: such a map never replaces a mapper in use; it is kept apart under `poor/`.
//! Where no mapper is in use for its direction it becomes the default, since a
//! workbench with a poor map can still switch and measure, and one without none cannot.
//! `accept_poor` makes it the default anyway.

use super::commit::{save_calibration, Keep};
use super::saved_stats::{SavedStats, StatsMeta};
use super::{
    calibrate_with, corpus_info, CalibrateError, CalibrateOptions, CalibrationProgress, CorpusName,
    Direction, Fitted, Run, Saved,
};
use crate::mapper::artifact::{CorpusInfo, ModelRef};
use crate::mapper::dir::MapperDir;
use baton_data::corpus;
use baton_runtime::model::Model;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

/// What one calibration is to read, fit and keep.
pub struct Job<'a> {
    /// The mapper directory everything goes into.
    pub dir: &'a MapperDir,
    /// The corpus files, and what was read from them (read first, so that a bad file
    /// is found before the models load).
    pub files: &'a [PathBuf],
    pub corpus: corpus::Corpus,
    pub directions: &'a [Direction],
    pub opts: &'a CalibrateOptions,
    /// Statistics saved by earlier runs, each with the directory it came from, added to
    /// this run's.
    pub prior: Vec<(PathBuf, SavedStats)>,
    /// Keep the statistics beside the mappers (learning and later calibrations add to
    /// them).
    pub save_stats: bool,
    /// Make a map worse than no context the default even over a mapper in use.
    pub accept_poor: bool,
}

/// What became of a map worse than no context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoorFate {
    /// Kept apart under `poor/`; the mapper in use stays.
    Apart,
    /// Made the default: there was none, or `accept_poor` asked for it.
    Default,
}

/// A map that did worse than no context on its own held-out windows.
#[derive(Debug, Clone, PartialEq)]
pub struct PoorMap {
    pub source: String,
    pub target: String,
    /// Next-token KL with the mapped context, and with none.
    pub mapped_kl: f64,
    pub none_kl: f64,
    pub fate: PoorFate,
    /// Where it was written.
    pub path: PathBuf,
}

impl PoorMap {
    /// The line the person is shown: what is wrong, what was done, and the fix.
    pub fn message(&self) -> String {
        let what = format!(
            "the {} -> {} map is worse than no context on its own held-out windows (next-token KL {:.3} against {:.3} with no context)",
            self.source, self.target, self.mapped_kl, self.none_kl
        );
        match self.fate {
            PoorFate::Apart => format!(
                "{what}: kept apart at {}, the mapper in use stays; calibrate with more text (--sequences, --seq-len), or pass --accept-poor to make it the default",
                self.path.display()
            ),
            PoorFate::Default => format!(
                "{what}: it is the default for want of a better one; `baton calibrate` with more text (--sequences, --seq-len) fits one"
            ),
        }
    }
}

/// Where everything went.
pub struct Outcome {
    /// Made the default (poor ones included where the rule made them so).
    pub kept: Vec<Saved>,
    /// Kept apart under `poor/`.
    pub apart: Vec<Saved>,
    /// Each direction's statistics kept, and where.
    pub stats: Vec<(StatsMeta, PathBuf)>,
    pub poor: Vec<PoorMap>,
}

/// Runs `job` on `models` to the end: nothing is written unless all of it is, and a
/// write that fails leaves the mapper directory as it was.
pub fn calibrate_and_save(
    models: [&Model; 2],
    job: Job<'_>,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<Outcome, CalibrateError> {
    let corpus::Corpus { docs, fingerprint } = job.corpus;
    let name = CorpusName {
        files: corpus::describe(job.files),
        fingerprint,
    };
    let run = Run {
        docs: &docs,
        corpus: &name,
        directions: job.directions,
        opts: job.opts,
    };
    let done = calibrate_with(models[0], models[1], &run, job.prior, progress, cancel)?;
    let info = corpus_info(job.files, &name.fingerprint, job.opts);
    let stats: &[SavedStats] = if job.save_stats { &done.stats } else { &[] };
    keep(models, job.dir, &info, &done.fitted, stats, job.accept_poor)
}

/// Puts `fitted` and `stats` in place in `dir` by the rule for poor maps, all of it or
/// nothing.
pub fn keep(
    models: [&Model; 2],
    dir: &MapperDir,
    corpus: &CorpusInfo,
    fitted: &[Fitted],
    stats: &[SavedStats],
    accept_poor: bool,
) -> Result<Outcome, CalibrateError> {
    let fates: Vec<Option<PoorFate>> = fitted
        .iter()
        .map(|f| poor_fate(f, dir, models, accept_poor))
        .collect();
    let pick = |fate: fn(Option<PoorFate>) -> bool| -> Vec<&Fitted> {
        fitted
            .iter()
            .zip(&fates)
            .filter(|(_, p)| fate(**p))
            .map(|(f, _)| f)
            .collect()
    };
    let kept = save_calibration(
        dir,
        models,
        corpus,
        Keep {
            kept: pick(|p| p != Some(PoorFate::Apart)),
            apart: pick(|p| p == Some(PoorFate::Apart)),
            stats,
        },
    )?;
    let mut poor = Vec::new();
    let mut apart_paths = kept.apart.iter().map(|s| s.path.clone());
    for (f, fate) in fitted.iter().zip(&fates) {
        let (Some(fate), Some((mapped_kl, none_kl))) = (fate, f.report.worse_than_no_context())
        else {
            continue;
        };
        let path = match fate {
            PoorFate::Apart => apart_paths.next().unwrap_or_default(),
            PoorFate::Default => kept
                .kept
                .iter()
                .find(|s| s.meta.source.sha256 == f.source.sha256)
                .map(|s| s.path.clone())
                .unwrap_or_default(),
        };
        poor.push(PoorMap {
            source: f.source.name.clone(),
            target: f.target.name.clone(),
            mapped_kl,
            none_kl,
            fate: *fate,
            path,
        });
    }
    Ok(Outcome {
        stats: stats
            .iter()
            .map(|s| s.meta.clone())
            .zip(kept.stats)
            .collect(),
        kept: kept.kept,
        apart: kept.apart,
        poor,
    })
}

/// `None` for a map at least as good as no context; else what the rule makes of it.
fn poor_fate(f: &Fitted, dir: &MapperDir, models: [&Model; 2], accept: bool) -> Option<PoorFate> {
    f.report.worse_than_no_context()?;
    let (s, t) = if f.source.sha256 == models[0].identity.sha256 {
        (models[0], models[1])
    } else {
        (models[1], models[0])
    };
    let in_use = dir
        .pair(
            &ModelRef::new(&s.identity, s.config()),
            &ModelRef::new(&t.identity, t.config()),
        )
        .artifact()
        .is_file();
    Some(if in_use && !accept {
        PoorFate::Apart
    } else {
        PoorFate::Default
    })
}

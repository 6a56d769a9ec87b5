//! Training the heads of a `residual` or `mlp` mapper after the ridge fit, on CPU with
//! candle's autograd and AdamW.
//!
//! - **Data, streamed.** Each epoch both models prefill the training windows again, one
//!   window at a time, and every direction's heads take one step per window: no window's
//!   features outlive its step. The input of a target layer's head is what its ridge map
//!   reads (the selected source layers' RoPE-stripped features side by side).
//! - **Loss.** By default the error of the target's attention output under its own queries
//!   at probe positions, `‖o(K̂, V̂) − o(K, V)‖² / ‖o(K, V)‖²` per target layer, the mapped
//!   keys rotated by the target's RoPE and the anchor positions the target's own, as a
//!   handoff uses them. `kv-mse` minimises the keys' and values' error in the target's
//!   standardized units instead.
//! - **Each target layer on its own.** Every layer's heads (keys and values) have their own
//!   optimiser and loss, so a layer's training never moves another's.
//! - **Early stopping** on the held-out windows calibration already reads: after every
//!   epoch each layer's held-out loss is measured and its best weights kept; a direction
//!   stops training when its mean held-out loss over the layers has not improved for
//!   `patience` epochs. (Waiting for every layer to stop improving ran to epoch 7 on the
//!   default pair while the mean had been best at epoch 1 or 2: a few layers' noise kept
//!   the whole direction training past where it overfit.)
//! - **Widths chosen on held-out windows**: several hidden widths (`hidden`) train side
//!   by side on the same windows, each with its own early stop, and each direction keeps
//!   the one whose kept weights score best on the held-out windows. A window's features
//!   and truth are built once for all of them: reading a window costs more than a step.
//! - **Seeded**: the initial weights come from the seed and the windows are read in a
//!   fixed order, so the same inputs and seed give the same heads.

mod attention;
mod net;
mod trainer;

use super::capture::{capture, HeldOutCaptures};
use super::heldout::HeldOutScorer;
use super::saved_stats::SavedStats;
use super::{check_cancel, CalibrateError, CalibrationProgress, Direction, Fitted};
use crate::mapper::nonlinear::{CandidateScore, Heads, MapperKind, TrainLoss, TrainingReport};
use crate::metrics::probe_positions;
use baton_runtime::model::Model;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use trainer::Trainer;

/// How heads are trained (`baton calibrate --mapper residual|mlp` and its `--train-*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    pub kind: MapperKind,
    pub loss: TrainLoss,
    /// Training windows read each epoch (the first of the fit split).
    pub windows: usize,
    /// Epochs at most; early stopping usually ends sooner.
    pub epochs: usize,
    /// Epochs without a gain in a direction's mean held-out loss before it stops.
    pub patience: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// Hidden widths to try in place of the kind's own, each trained on the same
    /// windows; each direction keeps the one with the lowest held-out loss.
    pub hidden: Vec<Vec<usize>>,
    /// Query positions per training window the attention loss reads.
    pub probes: usize,
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            kind: MapperKind::Ridge,
            loss: TrainLoss::Attention,
            windows: 64,
            epochs: 3,
            patience: 1,
            learning_rate: 1e-3,
            seed: 0,
            hidden: Vec::new(),
            probes: 64,
        }
    }
}

impl TrainOptions {
    /// Refuses settings that would train nothing or diverge before any model loads.
    pub fn validate(&self) -> Result<(), String> {
        if self.kind == MapperKind::Ridge {
            return Ok(());
        }
        let kind = self.kind;
        if self.windows == 0 || self.epochs == 0 {
            return Err(format!(
                "--train-windows {} --train-epochs {}: a {kind} mapper needs at least one \
                 window and one epoch to train on",
                self.windows, self.epochs
            ));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0 && self.learning_rate < 1.0)
        {
            return Err(format!(
                "--train-lr {}: a learning rate above 0 and below 1, e.g. 0.001",
                self.learning_rate
            ));
        }
        if let Some(h) = self.hidden.iter().find(|h| h.is_empty() || h.contains(&0)) {
            return Err(format!(
                "--train-hidden {h:?}: give one or more hidden widths above 0, e.g. 256 or 512,512"
            ));
        }
        if self.probes == 0 {
            return Err("a trained mapper's loss needs at least one probe position".into());
        }
        Ok(())
    }
}

fn err(e: impl std::fmt::Display) -> CalibrateError {
    CalibrateError::Options(format!("training the heads: {e}"))
}

impl Fitted {
    /// A number per direction for seeding.
    fn direction_tag(&self) -> u64 {
        u64::from(
            self.source
                .sha256
                .bytes()
                .take(4)
                .fold(0u32, |a, b| a.rotate_left(8) ^ u32::from(b)),
        )
    }
}

/// Trains the heads of every direction in `fitted` (whose statistics are `stats`, in the
/// same order) on `windows`, stopping early on the held-out windows, and puts them with
/// their training report into each `Fitted`.
#[allow(clippy::too_many_arguments)]
pub(super) fn train_heads(
    a: &Model,
    b: &Model,
    fitted: &mut [Fitted],
    stats: &[SavedStats],
    windows: &[Vec<u32>],
    held: &HeldOutCaptures,
    opts: &TrainOptions,
    anchor: usize,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<(), CalibrateError> {
    let started = Instant::now();
    let mut trainers = Vec::new();
    for (f, st) in fitted.iter().zip(stats) {
        let (src, tgt) = st.stats.direction.pick(a, b);
        trainers.push(Trainer::new(src, tgt, f, st, opts, anchor)?);
    }
    // The starting point: the ridge map, and the heads as initialised.
    for t in &mut trainers {
        let (ridge, start) = t.heldout(held, true)?;
        t.ridge_loss = ridge;
        t.keep_best(&start, 0, opts.patience)?;
    }
    progress.phase(
        "training the heads (windows)",
        (opts.epochs * windows.len()) as u64,
    );
    for epoch in 1..=opts.epochs {
        for ids in windows {
            check_cancel(cancel)?;
            let probes = probe_positions(ids.len(), opts.probes);
            let (ca, cb) = (capture(a, ids, &probes)?, capture(b, ids, &probes)?);
            for t in trainers.iter_mut().filter(|t| !t.done()) {
                let (s, g) = t.direction.pick(&ca, &cb);
                let x = t.sample(s, g, ids, &probes)?;
                t.step(&x)?;
            }
            progress.advance(1);
        }
        for t in trainers.iter_mut().filter(|t| !t.done()) {
            let (_, losses) = t.heldout(held, false)?;
            let lines = t.keep_best(&losses, epoch, opts.patience)?;
            progress.note(&format!(
                "epoch {epoch}, {}: ridge {:.4}; {}",
                t.direction_name(),
                crate::metrics::mean(&t.ridge_loss),
                lines.join("; ")
            ));
        }
        if trainers.iter().all(Trainer::done) {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let (_, activation, _) = opts.kind.architecture().ok_or_else(|| err("ridge"))?;
    let directions: Vec<Direction> = trainers.iter().map(|t| t.direction).collect();
    for (f, t) in fitted.iter_mut().zip(trainers) {
        let candidates: Vec<CandidateScore> = t
            .candidates
            .iter()
            .map(|c| CandidateScore {
                hidden: c.hidden.clone(),
                heldout: c.kept_loss(),
                epochs: c.epochs,
            })
            .collect();
        let chosen = t
            .candidates
            .into_iter()
            .min_by(|x, y| x.kept_loss().total_cmp(&y.kept_loss()))
            .ok_or_else(|| err("no width to train"))?;
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let mut best_epoch = Vec::new();
        let mut trained = Vec::new();
        for l in chosen.layers {
            let (k, v) = l.best.ok_or_else(|| err("no weights were kept"))?;
            keys.push(k);
            values.push(v);
            best_epoch.push(l.best_epoch);
            trained.push(l.best_loss);
        }
        f.heads = Some(Heads {
            kind: opts.kind,
            keys,
            values,
        });
        f.training = Some(TrainingReport {
            loss: opts.loss,
            hidden: chosen.hidden,
            activation,
            seed: opts.seed,
            learning_rate: opts.learning_rate,
            windows: windows.len(),
            seq_len: windows.first().map_or(0, Vec::len),
            epochs: chosen.epochs,
            best_epoch,
            heldout_ridge: t.ridge_loss,
            heldout_trained: trained,
            ridge_cosine: crate::metrics::mean(&f.report.cosine),
            ridge_top1: f.report.agreement.map_or(f64::NAN, |a| a.top1),
            seconds,
            candidates,
        });
    }
    // The report's held-out cosine and agreement are the map's as it will run: the
    // trained one's (the ridge map's stay in the training report).
    progress.phase("scoring the trained maps", directions.len() as u64);
    for (f, d) in fitted.iter_mut().zip(directions) {
        let (src, tgt) = d.pick(a, b);
        let scorer = HeldOutScorer::new(src, tgt, held.view(d), anchor, &f.source_scales)?;
        let scored = scorer.score_mapper(&f.cache_mapper(src, tgt)?)?;
        f.report.cosine = scored.cosine;
        f.report.agreement = Some(scored.agreement);
        progress.advance(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::trainer::EarlyStop;
    use super::*;

    #[test]
    fn a_direction_stops_once_its_mean_held_out_loss_stops_improving() {
        let mut stop = EarlyStop::default();
        // The starting map, then a gain, then a mean no better: one stale epoch.
        for (mean, stale) in [(0.47, 0), (0.46, 0), (0.461, 1), (0.459, 0), (0.459, 1)] {
            stop.observe(mean);
            assert_eq!(stop.stale, stale, "after {mean}");
        }
        assert_eq!(stop.best, 0.459);
    }

    #[test]
    fn training_settings_that_cannot_train_are_refused_naming_the_flag() {
        let trained = |f: &dyn Fn(&mut TrainOptions)| {
            let mut o = TrainOptions {
                kind: MapperKind::Residual,
                ..TrainOptions::default()
            };
            f(&mut o);
            o.validate()
        };
        assert!(trained(&|_| {}).is_ok());
        for (change, flag) in [
            (
                &(|o: &mut TrainOptions| o.epochs = 0) as &dyn Fn(&mut TrainOptions),
                "--train-epochs 0",
            ),
            (&|o: &mut TrainOptions| o.windows = 0, "--train-windows 0"),
            (
                &|o: &mut TrainOptions| o.learning_rate = f64::NAN,
                "--train-lr NaN",
            ),
            (
                &|o: &mut TrainOptions| o.learning_rate = 0.0,
                "--train-lr 0",
            ),
            (
                &|o: &mut TrainOptions| o.hidden = vec![vec![256], vec![256, 0]],
                "--train-hidden [256, 0]",
            ),
        ] {
            let e = trained(change).unwrap_err();
            assert!(e.contains(flag), "{flag:?} not in {e}");
        }
        // A ridge mapper trains nothing, so its training settings do not matter.
        let ridge = TrainOptions {
            epochs: 0,
            ..TrainOptions::default()
        };
        assert!(ridge.validate().is_ok());
    }
}

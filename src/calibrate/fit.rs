//! The fit of one direction from its statistics: rank the source layers, sweep (k, λ),
//! choose, choose where the token block is read, apply the gains and optionally cut the
//! maps to a reduced rank.

use super::capture::{self, DirectionStats, HeldOutCaptures};
use super::choice::{self, ChoiceRule};
use super::gains::{self, AppliedGains};
use super::heldout::{self, HeldOutScorer, Scored};
use super::{check_cancel, rank, sweep, token_choice};
use super::{
    CalibrateError, CalibrateOptions, CalibrationProgress, CalibrationReport, Fitted, SkippedK,
    SweepPoint, TokenFeatures,
};
use crate::mapper::packed::SourceScales;
use crate::mapper::report::BlockLayers;
use crate::mapper::ridge::RidgeOptions;
use crate::mapper::select::single_layer_r2;
use crate::mapper::PairStats;
use crate::model::Model;
use std::sync::atomic::AtomicBool;

/// Rank, sweep, choose and optionally reduce the maps of one direction.
pub(super) fn fit_direction(
    src: &Model,
    tgt: &Model,
    st: &DirectionStats,
    held: &HeldOutCaptures,
    opts: &CalibrateOptions,
    progress: &dyn CalibrationProgress,
    cancel: &AtomicBool,
) -> Result<Fitted, CalibrateError> {
    let (sk, sv) = (&st.keys, &st.values);
    let view = held.view(st.direction);
    let (hk, hv) = capture::heldout_stats(src, tgt, view, sk, st.token_layers, opts)?;
    let base = RidgeOptions {
        lambda: opts.lambdas.first().copied().unwrap_or(0.01),
        standardize: opts.standardize,
        ..RidgeOptions::default()
    };
    let scales = SourceScales::from_stats(sk, sv);
    let r2k = single_layer_r2(sk, &base)?;
    let r2v = single_layer_r2(sv, &base)?;
    // Scored as the maps are used: behind the anchor the workbench keeps by default.
    let anchor = opts.skip_first.max(crate::mapper::apply::DEFAULT_ANCHOR);
    let scorer = HeldOutScorer::new(src, tgt, view, anchor, &scales)?;
    let steps = FitSteps {
        src,
        tgt,
        fit: sweep::FitInputs {
            keys: sk,
            values: sv,
            rank_k: &r2k,
            rank_v: &r2v,
            base,
            token_layers: st.token_layers,
        },
        held_keys: &hk,
        held_values: &hv,
        scales: &scales,
        scorer: &scorer,
        opts,
        progress,
        cancel,
        names: format!("{} -> {}", src.identity.name, tgt.identity.name),
    };
    let own_layers = sk.l_s() - st.token_layers;
    let outcome = steps.run(own_layers)?;
    let heldout::Scored { keys, values, held } = outcome.reduced.scored;
    let report = CalibrationReport {
        observations: sk.count(),
        sequences: opts.sequences,
        seq_len: opts.seq_len,
        stride: opts.stride,
        skip_first: opts.skip_first,
        select_sequences: opts.select_sequences,
        sweep: outcome.points,
        skipped_k: outcome.skipped,
        max_k: (opts.max_k < own_layers).then_some(opts.max_k),
        best_above_max_k: outcome.best_above_max_k,
        r2_k: sweep::layer_r2(&hk, &keys)?,
        r2_v: sweep::layer_r2(&hv, &values)?,
        cosine: held.cosine,
        agreement: Some(held.agreement),
        single_layer_r2_k: r2k,
        single_layer_r2_v: r2v,
        // The capture and the statistics are shared by the directions; the caller fills
        // in their cost, and the fit time once every direction is done.
        capture_seconds: 0.0,
        fit_seconds: 0.0,
        stats_bytes: 0,
        rank_sweep: outcome.reduced.sweep,
        full_cosine: Some(outcome.full_cosine),
        token_block: outcome.token_block,
        key_gain: opts.key_gain,
        value_gain: opts.value_gain,
        attention_weight: opts.attention_weight,
        matched_key_gains: outcome.applied.keys,
        matched_value_gains: outcome.applied.values,
    };
    Ok(Fitted {
        source: src.identity.clone(),
        target: tgt.identity.clone(),
        k: outcome.k,
        lambda: outcome.lambda,
        standardize: opts.standardize,
        keys,
        values,
        source_scales: scales,
        report,
        token_layers: st.token_layers,
    })
}

/// What every step of one direction's fit reads: the two models, the statistics and
/// their held-out counterparts, the scorer, and the caller's options, progress and
/// cancel flag.
struct FitSteps<'a> {
    src: &'a Model,
    tgt: &'a Model,
    fit: sweep::FitInputs<'a>,
    held_keys: &'a PairStats,
    held_values: &'a PairStats,
    scales: &'a SourceScales,
    scorer: &'a HeldOutScorer<'a>,
    opts: &'a CalibrateOptions,
    progress: &'a dyn CalibrationProgress,
    cancel: &'a AtomicBool,
    /// `source -> target`, for the progress bar's phases.
    names: String,
}

/// What the steps settled on, for the maps and the report.
struct FitOutcome {
    points: Vec<SweepPoint>,
    skipped: Vec<SkippedK>,
    k: usize,
    lambda: f64,
    best_above_max_k: Option<SweepPoint>,
    token_block: Option<BlockLayers>,
    applied: AppliedGains,
    /// The held-out cosine of the maps before any rank reduction.
    full_cosine: f64,
    reduced: rank::RankOutcome,
}

/// The swept points, the one chosen and its full maps.
struct Swept {
    points: Vec<SweepPoint>,
    k: usize,
    lambda: f64,
    best_above_max_k: Option<SweepPoint>,
    full: Scored,
}

impl FitSteps<'_> {
    fn run(&self, own_layers: usize) -> Result<FitOutcome, CalibrateError> {
        let plan = self.plan_ks(own_layers);
        let swept = self.sweep_and_choose(&plan.ks)?;
        let (full, token_block) = self.with_token_block(swept.full, swept.k, swept.lambda)?;
        let (full, applied) = self.apply_gains(full)?;
        let full_cosine = full.held.mean_cosine();
        let reduced = self.reduce_rank(full)?;
        Ok(FitOutcome {
            points: swept.points,
            skipped: plan.skipped,
            k: swept.k,
            lambda: swept.lambda,
            best_above_max_k: swept.best_above_max_k,
            token_block,
            applied,
            full_cosine,
            reduced,
        })
    }

    /// The ks the observations can fit, telling the user of those left out.
    fn plan_ks(&self, own_layers: usize) -> sweep::KPlan {
        let sk = self.fit.keys;
        let plan = sweep::plan_ks(
            &self.opts.k_sweep,
            own_layers,
            sk.d_s(),
            self.fit.token_layers,
            sk.count(),
        );
        for s in &plan.skipped {
            self.progress.note(&format!(
                "k={:<3} skipped: {} (calibrate on more sequences to try it)",
                s.k, s.reason
            ));
        }
        if plan.fell_back {
            self.progress
                .note("no k in the sweep fits the observations: using k=1");
        }
        plan
    }

    fn sweep_and_choose(&self, ks: &[usize]) -> Result<Swept, CalibrateError> {
        let opts = self.opts;
        let rule = ChoiceRule::from(opts);
        let sweep_plan = sweep::SweepPlan {
            ks,
            lambdas: &opts.lambdas,
            rule,
            label: format!("sweep {}", self.names),
        };
        let swept = sweep::run(
            &self.fit,
            self.held_keys,
            self.held_values,
            &sweep_plan,
            self.scorer,
            self.progress,
            self.cancel,
        )?;
        let points = swept.points;
        let choice = choice::choose(&points, &rule)
            .ok_or_else(|| CalibrateError::Options("empty k sweep".into()))?;
        for note in choice.notes(&points, &rule) {
            self.progress.note(&note);
        }
        let (k, lambda) = (points[choice.chosen].k, points[choice.chosen].lambda);
        let best_above_max_k = choice.best_above_max_k.map(|i| points[i].clone());
        let full = match swept.kept {
            Some((i, scored)) if i == choice.chosen => scored,
            // Fitted again rather than kept from the sweep: holding every point's maps
            // would cost hundreds of MB for a choice only a tolerance makes.
            _ => self.fit.fit_and_score(k, lambda, self.scorer)?,
        };
        Ok(Swept {
            points,
            k,
            lambda,
            best_above_max_k,
            full,
        })
    }

    /// Per layer, whether its maps read the token block, when the options ask for a
    /// choice and the statistics hold a block.
    fn with_token_block(
        &self,
        full: Scored,
        k: usize,
        lambda: f64,
    ) -> Result<(Scored, Option<BlockLayers>), CalibrateError> {
        let by = match self.opts.token_features {
            TokenFeatures::Cosine => Some(token_choice::By::Cosine),
            TokenFeatures::R2 => Some(token_choice::By::R2 {
                keys: self.held_keys,
                values: self.held_values,
            }),
            TokenFeatures::All | TokenFeatures::Off => None,
        };
        let Some(by) = by.filter(|_| self.fit.token_layers > 0) else {
            return Ok((full, None));
        };
        check_cancel(self.cancel)?;
        let without = self.fit.fit_with_block(k, lambda, false)?;
        let (scored, chosen) = token_choice::choose(full, without, by, self.scorer)?;
        self.progress.note(&format!(
            "token block read by the keys of {} and the values of {} of {} layers: \
             held-out cosine {:.4} (block everywhere {:.4}, nowhere {:.4})",
            chosen.keys.len(),
            chosen.values.len(),
            scored.keys.len(),
            scored.held.mean_cosine(),
            chosen.cosine_everywhere,
            chosen.cosine_nowhere
        ));
        Ok((scored, Some(chosen)))
    }

    fn apply_gains(&self, full: Scored) -> Result<(Scored, AppliedGains), CalibrateError> {
        let gain_inputs = gains::GainInputs {
            scales: self.scales,
            source_width: self.src.config().kv_width(),
            target_head_dim: self.tgt.config().head_dim,
            held_keys: self.held_keys,
            held_values: self.held_values,
        };
        gains::apply(full, self.opts, &gain_inputs, self.scorer, self.progress)
    }

    fn reduce_rank(&self, full: Scored) -> Result<rank::RankOutcome, CalibrateError> {
        match self.opts.rank {
            None => Ok(rank::RankOutcome {
                scored: full,
                sweep: Vec::new(),
            }),
            Some(choice) => {
                let step = rank::RankStep {
                    choice,
                    keys: self.fit.keys,
                    values: self.fit.values,
                    width: self.tgt.config().kv_width(),
                    label: format!("rank {}", self.names),
                };
                rank::run(&step, full, self.scorer, self.progress, self.cancel)
            }
        }
    }
}

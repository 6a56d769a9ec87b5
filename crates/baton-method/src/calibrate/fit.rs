//! One direction's fit from its statistics: rank the source layers, sweep (k, λ) scored
//! on the held-out windows, choose, decide which maps read the token block, apply the
//! gains and optionally reduce the rank. The result is the maps with their calibration
//! report.

use super::capture::{self, DirectionStats, HeldOutCaptures};
use super::choice::{self, ChoiceRule};
use super::heldout::{self, HeldOutScorer};
use super::{check_cancel, gains, rank, sweep, token_choice};
use super::{
    CalibrateError, CalibrateOptions, CalibrationProgress, CalibrationReport, Fitted, SkippedK,
    SweepPoint, TokenFeatures,
};
use crate::mapper::calibration_report::BlockLayers;
use crate::mapper::ridge::RidgeOptions;
use crate::mapper::select::single_layer_r2;
use crate::mapper::{PairStats, SourceScales};
use baton_runtime::model::Model;
use std::sync::atomic::AtomicBool;

/// What every step of one direction's fit reads.
struct Step<'a> {
    tgt: &'a Model,
    opts: &'a CalibrateOptions,
    /// The held-out windows' statistics of keys and values.
    held_keys: &'a PairStats,
    held_values: &'a PairStats,
    scorer: &'a HeldOutScorer<'a>,
    progress: &'a dyn CalibrationProgress,
    cancel: &'a AtomicBool,
    /// `"<source> -> <target>"`, for progress labels.
    names: String,
}

/// The swept points and the one chosen, with its maps fitted and scored.
struct Swept {
    points: Vec<SweepPoint>,
    skipped: Vec<SkippedK>,
    k: usize,
    lambda: f64,
    best_above_max_k: Option<SweepPoint>,
    full: heldout::Scored,
}

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
    let scales = SourceScales::from_stats(sk, sv);
    let (base, r2k, r2v) = rank_layers(sk, sv, opts)?;
    // Scored as the maps are used: behind the anchor the workbench keeps by default.
    let anchor = opts.skip_first.max(crate::mapper::DEFAULT_ANCHOR);
    let scorer = HeldOutScorer::new(src, tgt, view, anchor, &scales)?;
    let fit = sweep::FitInputs {
        keys: sk,
        values: sv,
        rank_k: &r2k,
        rank_v: &r2v,
        base,
        token_layers: st.token_layers,
    };
    let step = Step {
        tgt,
        opts,
        held_keys: &hk,
        held_values: &hv,
        scorer: &scorer,
        progress,
        cancel,
        names: format!("{} -> {}", src.identity.name, tgt.identity.name),
    };
    let Swept {
        points,
        skipped,
        k,
        lambda,
        best_above_max_k,
        full,
    } = sweep_and_choose(&step, &fit)?;
    let (full, token_block) = place_token_block(&step, &fit, full, k, lambda)?;
    let (full, applied) = apply_gains(&step, src, &scales, full)?;
    let full_cosine = full.held.mean_cosine();
    let reduced = reduce_rank(&step, sk, sv, full)?;
    let heldout::Scored { keys, values, held } = reduced.scored;
    let own_layers = sk.l_s() - st.token_layers;
    let report = CalibrationReport {
        observations: sk.count(),
        sequences: opts.sequences,
        seq_len: opts.seq_len,
        stride: opts.stride,
        skip_first: opts.skip_first,
        select_sequences: opts.select_sequences,
        sweep: points,
        skipped_k: skipped,
        max_k: (opts.max_k < own_layers).then_some(opts.max_k),
        best_above_max_k,
        r2_k: sweep::layer_r2(&hk, &keys)?,
        r2_v: sweep::layer_r2(&hv, &values)?,
        cosine: held.cosine,
        agreement: Some(held.agreement),
        agreement_no_context: Some(scorer.no_context()),
        single_layer_r2_k: r2k,
        single_layer_r2_v: r2v,
        // The capture and the statistics are shared by the directions; the caller fills
        // in their cost, and the fit time once every direction is done.
        capture_seconds: 0.0,
        fit_seconds: 0.0,
        stats_bytes: 0,
        rank_sweep: reduced.sweep,
        full_cosine: Some(full_cosine),
        token_block,
        key_gain: opts.key_gain,
        value_gain: opts.value_gain,
        attention_weight: opts.attention_weight,
        matched_key_gains: applied.keys,
        matched_value_gains: applied.values,
    };
    Ok(Fitted {
        source: src.identity.clone(),
        target: tgt.identity.clone(),
        k,
        lambda,
        standardize: opts.standardize,
        keys,
        values,
        source_scales: scales,
        report,
        token_layers: st.token_layers,
        heads: None,
        training: None,
    })
}

/// Single-layer R², [target layer][source layer].
type LayerR2 = Vec<Vec<f64>>;

/// The ridge options every fit shares but λ, and the single-layer R² of every source
/// layer for every target layer, keys and values, which rank the source layers.
fn rank_layers(
    keys: &PairStats,
    values: &PairStats,
    opts: &CalibrateOptions,
) -> Result<(RidgeOptions, LayerR2, LayerR2), CalibrateError> {
    let base = RidgeOptions {
        lambda: opts.lambdas.first().copied().unwrap_or(0.01),
        standardize: opts.standardize,
        ..RidgeOptions::default()
    };
    let r2k = single_layer_r2(keys, &base)?;
    let r2v = single_layer_r2(values, &base)?;
    Ok((base, r2k, r2v))
}

/// The chosen maps with the asked-for (or matched) gains on their keys and values.
fn apply_gains(
    step: &Step<'_>,
    src: &Model,
    scales: &SourceScales,
    full: heldout::Scored,
) -> Result<(heldout::Scored, gains::AppliedGains), CalibrateError> {
    let inputs = gains::GainInputs {
        scales,
        source_width: src.config().kv_width(),
        target_head_dim: step.tgt.config().head_dim,
        held_keys: step.held_keys,
        held_values: step.held_values,
    };
    gains::apply(full, step.opts, &inputs, step.scorer, step.progress)
}

/// Sweeps the planned k (those the observations can fit) and every λ, scores each point
/// on the held-out windows and chooses one; its maps come back fitted and scored.
fn sweep_and_choose(step: &Step<'_>, fit: &sweep::FitInputs<'_>) -> Result<Swept, CalibrateError> {
    let (opts, progress) = (step.opts, step.progress);
    let own_layers = fit.keys.l_s() - fit.token_layers;
    let plan = sweep::plan_ks(
        &opts.k_sweep,
        own_layers,
        fit.keys.d_s(),
        fit.token_layers,
        fit.keys.count(),
    );
    for s in &plan.skipped {
        progress.note(&format!(
            "k={:<3} skipped: {} (calibrate on more sequences to try it)",
            s.k, s.reason
        ));
    }
    if plan.fell_back {
        progress.note("no k in the sweep fits the observations: using k=1");
    }
    let rule = ChoiceRule::from(opts);
    let sweep_plan = sweep::SweepPlan {
        ks: &plan.ks,
        lambdas: &opts.lambdas,
        rule,
        label: format!("sweep {}", step.names),
    };
    let swept = sweep::run(
        fit,
        step.held_keys,
        step.held_values,
        &sweep_plan,
        step.scorer,
        progress,
        step.cancel,
    )?;
    let points = swept.points;
    let choice = choice::choose(&points, &rule)
        .ok_or_else(|| CalibrateError::Options("empty k sweep".into()))?;
    for note in choice.notes(&points, &rule) {
        progress.note(&note);
    }
    let (k, lambda) = (points[choice.chosen].k, points[choice.chosen].lambda);
    let best_above_max_k = choice.best_above_max_k.map(|i| points[i].clone());
    let full = match swept.kept {
        Some((i, scored)) if i == choice.chosen => scored,
        // Fitted again rather than kept from the sweep: holding every point's maps
        // would cost hundreds of MB for a choice only a tolerance makes.
        _ => fit.fit_and_score(k, lambda, step.scorer)?,
    };
    Ok(Swept {
        points,
        skipped: plan.skipped,
        k,
        lambda,
        best_above_max_k,
        full,
    })
}

/// Where the token block is on and chosen per layer, which maps read it: the chosen
/// maps against the same fit without the block, layer by layer.
fn place_token_block(
    step: &Step<'_>,
    fit: &sweep::FitInputs<'_>,
    full: heldout::Scored,
    k: usize,
    lambda: f64,
) -> Result<(heldout::Scored, Option<BlockLayers>), CalibrateError> {
    let by = match step.opts.token_features {
        TokenFeatures::Cosine => Some(token_choice::By::Cosine),
        TokenFeatures::R2 => Some(token_choice::By::R2 {
            keys: step.held_keys,
            values: step.held_values,
        }),
        TokenFeatures::All | TokenFeatures::Off => None,
    };
    let (Some(by), true) = (by, fit.token_layers > 0) else {
        return Ok((full, None));
    };
    check_cancel(step.cancel)?;
    let without = fit.fit_with_block(k, lambda, false)?;
    let (scored, chosen) = token_choice::choose(full, without, by, step.scorer)?;
    step.progress.note(&format!(
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

/// The maps cut to a reduced rank when asked for, else as they are.
fn reduce_rank(
    step: &Step<'_>,
    keys: &PairStats,
    values: &PairStats,
    full: heldout::Scored,
) -> Result<rank::RankOutcome, CalibrateError> {
    let Some(choice) = step.opts.rank else {
        return Ok(rank::RankOutcome {
            scored: full,
            sweep: Vec::new(),
        });
    };
    let rank_step = rank::RankStep {
        choice,
        keys,
        values,
        width: step.tgt.config().kv_width(),
        label: format!("rank {}", step.names),
    };
    rank::run(&rank_step, full, step.scorer, step.progress, step.cancel)
}

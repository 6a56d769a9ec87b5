//! The handoff: what the target needs to be ready (its anchor and the mapped suffix, or
//! a re-prefill when the gate refuses the map), and the fidelity measures the switch's
//! measurement later applies to it: per-layer attention-output cosine (the target's true
//! queries at probe positions), R² of keys and values, and key-error concentration.

use super::config::Settings;
use super::load::LoadedMapper;
use super::slot::{split, Slot};
use super::EngineError;
use baton_method::handoff::fidelity;
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::metrics::QueryGram;
use baton_protocol::{
    CacheOrigin, EstimateBasis, GateDecision, ModelName, SwitchEstimate, SwitchMetrics,
    SwitchTimings,
};
use baton_runtime::model::{KvCache, Model};
use candle_core::Tensor;

/// What a handoff did, for the measurement that follows it.
pub(super) struct Handoff {
    pub index: u32,
    pub turn: u32,
    pub source: usize,
    pub target: usize,
    pub context_tokens: usize,
    /// Leading positions of the target's primary cache it computed itself and that
    /// should become its truth (0 when there are none to keep).
    pub own_prefix: usize,
    /// How many first positions of the handed-over cache the target computed itself
    /// (reference path or not): where its repair starts.
    pub own_held: usize,
    /// The gate refused the map and the target re-prefilled instead.
    pub reprefilled: bool,
    /// The estimate was made at the handoff (the gate needed it): the measurement does
    /// not make it again.
    pub estimated: bool,
    pub timings: SwitchTimings,
    /// For the switch event: the models' names, the positions the target did not hold
    /// before, the gate's decision and the estimate it rested on.
    pub names: (ModelName, ModelName),
    pub suffix_tokens: usize,
    pub gate: Option<GateDecision>,
    pub estimate: Option<SwitchEstimate>,
}

/// What a switch may touch: both models' slots, the mappers between them, the
/// conversation's ids and the settings.
pub(super) struct Sides<'a> {
    pub slots: &'a mut [Slot; 2],
    pub mappers: &'a [LoadedMapper; 2],
    pub history: &'a [u32],
    pub settings: &'a Settings,
}

/// Hand the conversation held by slot `a` to the other model; `None` when there was
/// nothing to hand over. The gate decides here, from what is known before anything is
/// measured: `measured_cosine` (the cosine last measured this way, with the reference
/// path on), the estimate's prediction, or the mapper's calibration cosine (see
/// [`baton_protocol::Event::Switch`]).
pub(super) fn hand_over(
    sides: Sides<'_>,
    a: usize,
    index: u32,
    turn: u32,
    measured_cosine: Option<f64>,
) -> Result<Option<Handoff>, EngineError> {
    let b = 1 - a;
    let Sides {
        slots,
        mappers,
        history,
        settings,
    } = sides;
    let n = slots[a].primary.len();
    if n == 0 {
        return Ok(None);
    }
    let history = &history[..n];
    // The gate needs the estimate before it decides; otherwise the measurement makes
    // it, while the engine is idle, so that it never holds up the switch.
    let estimate = match settings.gate {
        Some(_) => estimate(
            slots,
            mappers,
            &slots[a].primary,
            history,
            settings.anchor,
            a,
        )?,
        None => None,
    };
    let gate = settings
        .gate
        .map(|threshold| decide(threshold, estimate, measured_cosine, &mappers[a]));
    let reprefill = gate.is_some_and(|g| g.used == CacheOrigin::Reprefilled);
    let names = (slots[a].name(), slots[b].name());
    let (sa, sb) = split(slots, a);
    let plan = plan_for(sb, history, reprefill, settings);
    // What the target computed itself when it was last active, up to the tail: with
    // the reference path on it becomes the truth the measurement starts from.
    let held = sb.primary.len().min(n - settings.tail.min(n));
    let own_held = if sb.origin == CacheOrigin::True {
        held
    } else {
        0
    };
    let own_prefix = if settings.reference { own_held } else { 0 };
    let mut primary = std::mem::replace(&mut sb.primary, sb.model.decoder.new_cache());
    // A re-prefill copies what the target's truth already holds; a map copies the
    // precomputed opening as its anchor.
    let exact = if reprefill {
        Some(&sb.truth)
    } else {
        sb.opening(history)
    };
    let inputs = HandoffInputs {
        source: &sa.model,
        source_cache: &sa.primary,
        target: &sb.model,
        mapper: &mappers[a].mapper,
        tokens: history,
        exact,
    };
    // The handoff is what the switch itself costs: the anchor the target computes and
    // the map, or the re-prefill the gate chose.
    let built = plan.build(&inputs, &mut primary);
    sb.primary = primary;
    let built = built?;
    // Handed back a conversation it holds all of itself (nothing said since it was
    // active but what it re-read as its tail), the target maps nothing: its cache stays
    // its own and has nothing to repair.
    sb.origin = if reprefill {
        CacheOrigin::Reprefilled
    } else if own_held > 0 && plan.mapped().is_empty() {
        CacheOrigin::True
    } else {
        CacheOrigin::Mapped
    };
    let timings = SwitchTimings {
        source_prefill_ms: None,
        map_full_ms: None,
        map_suffix_ms: (!reprefill && held > 0).then_some(built.map_ms),
        reprefill_full_ms: None,
        reprefill_suffix_ms: None,
        end_to_end_ms: built.total_ms(),
    };
    Ok(Some(Handoff {
        index,
        turn,
        source: a,
        target: b,
        context_tokens: n,
        own_prefix,
        own_held,
        reprefilled: reprefill,
        estimated: settings.gate.is_some(),
        timings,
        names,
        suffix_tokens: n - held,
        gate,
        estimate,
    }))
}

/// The target's cache after the switch of `history`. The newest `tail` positions are the
/// target's to read; what it holds of them (a pre-map, an earlier handoff) is dropped and read again.
/// A re-prefill keeps only what the target computed itself and starts from its truth
/// otherwise.
fn plan_for(target: &Slot, history: &[u32], reprefill: bool, settings: &Settings) -> HandoffPlan {
    let n = history.len();
    if reprefill {
        let own = if target.origin == CacheOrigin::True {
            target.primary.len()
        } else {
            0
        };
        return HandoffPlan::reprefill(n).holding(own);
    }
    // The opening is the target's own, copied from what it computed when it loaded.
    let plan = HandoffPlan::new(n)
        .anchor(target.anchor_for(history, settings.anchor))
        .tail(settings.tail);
    let held = target.primary.len().min(plan.tail_start());
    plan.holding(held)
}

/// The gate's choice: re-prefill when the best estimate at hand is below `threshold`.
fn decide(
    threshold: f64,
    estimate: Option<SwitchEstimate>,
    measured: Option<f64>,
    mapper: &LoadedMapper,
) -> GateDecision {
    let predicted = estimate.and_then(|e| e.predicted_cosine);
    let (estimate, basis) = match (measured, predicted) {
        (Some(m), _) => (m, EstimateBasis::Measured),
        (None, Some(p)) => (p, EstimateBasis::Predicted),
        (None, None) => (mapper.calibration_cosine, EstimateBasis::Calibration),
    };
    let used = if estimate < threshold {
        CacheOrigin::Reprefilled
    } else {
        CacheOrigin::Mapped
    };
    GateDecision {
        threshold,
        estimate,
        used,
        basis: Some(basis),
    }
}

/// What slot `source`'s first `history.len()` positions say about the map before any
/// re-prefill (see [`baton_method::gate`]): their feature distance past the anchor, the round
/// trip of the newest of them through the other direction's mapper, and the cosine the
/// gate's line predicts from the estimate it was fitted on.
pub(super) fn estimate(
    slots: &[Slot; 2],
    mappers: &[LoadedMapper; 2],
    source_cache: &KvCache,
    history: &[u32],
    anchor: usize,
    source: usize,
) -> Result<Option<SwitchEstimate>, EngineError> {
    let n = history.len();
    let (m, back) = (&mappers[source], &mappers[1 - source]);
    let (slot, other) = (&slots[source], &slots[1 - source]);
    let from = anchor.min(n);
    let (src_rope, tgt_rope) = (slot.model.decoder.rope(), other.model.decoder.rope());
    let failed = |e: baton_method::gate::GateError| {
        EngineError::Internal(format!("the gate's estimate: {e}"))
    };
    let distance = baton_method::gate::feature_distance(&m.mapper, source_cache, src_rope, from, n)
        .map_err(failed)?;
    let (rs, re) = baton_method::gate::estimate::round_trip_range(from, n);
    let inputs = baton_method::gate::estimate::RoundTrip {
        forward: &m.mapper,
        reverse: &back.mapper,
        src: source_cache,
        tokens: history,
        src_rope,
        tgt_rope,
    };
    let trip = baton_method::gate::round_trip(inputs, rs, re).map_err(failed)?;
    if distance.is_none() && trip.is_none() {
        return Ok(None);
    }
    let predicted = m.gate.as_ref().and_then(|g| {
        let x = match g.estimator.as_str() {
            baton_method::gate::fit::ROUND_TRIP => trip,
            baton_method::gate::fit::FEATURE_DISTANCE => distance,
            _ => None,
        };
        x.map(|x| g.predict(x))
    });
    Ok(Some(SwitchEstimate {
        feature_distance: distance,
        round_trip: trip,
        predicted_cosine: predicted,
    }))
}

/// No layer measured yet, room for `n_layer`.
pub fn empty_metrics(n_layer: usize) -> SwitchMetrics {
    SwitchMetrics {
        attention_cosine: Vec::with_capacity(n_layer),
        r2_k: Vec::with_capacity(n_layer),
        r2_v: Vec::with_capacity(n_layer),
        key_error_concentration: Vec::with_capacity(n_layer),
        top1_agreement: None,
        kl: None,
    }
}

/// Compare positions `0..n` of `mapped` with `truth` at layer `l` for `model` (see
/// [`baton_method::handoff::fidelity`]) and append the layer's values to `out`.
#[allow(clippy::too_many_arguments)]
pub fn layer_metrics(
    model: &Model,
    gram: &QueryGram,
    truth: &KvCache,
    mapped: &KvCache,
    n: usize,
    queries: &[Tensor],
    probes: &[usize],
    l: usize,
    out: &mut SwitchMetrics,
) -> Result<(), EngineError> {
    let f = fidelity::layer_fidelity(model, gram, truth, mapped, n, queries.get(l), probes, l)?;
    out.key_error_concentration.push(f.key_error_concentration);
    out.r2_k.push(f.r2_k);
    out.r2_v.push(f.r2_v);
    out.attention_cosine.push(f.attention_cosine);
    Ok(())
}

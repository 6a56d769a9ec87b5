//! The handoff: what the target needs to be ready (its anchor and the mapped suffix, or
//! a re-prefill when the gate refuses the map), and the fidelity measures the switch's
//! measurement later applies to it: per-layer attention-output cosine (the target's true
//! queries at probe positions), R² of keys and values, and key-error concentration.

use super::core::{no_logits, split, synced_ms, Engine, FollowUp};
use crate::eval::fidelity;
use crate::mapper::CacheMapper;
use crate::metrics::QueryGram;
use crate::model::{KvCache, Model};
use crate::protocol::{
    CacheOrigin, EstimateBasis, Event, GateDecision, SwitchEstimate, SwitchMetrics, SwitchTimings,
};
use candle_core::Tensor;
use std::time::Instant;

use super::EngineError;

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
    /// The gate refused the map and the target re-prefilled instead.
    pub reprefilled: bool,
    /// The estimate was made at the handoff (the gate needed it): the measurement does
    /// not make it again.
    pub estimated: bool,
    pub timings: SwitchTimings,
}

impl Engine {
    /// Hand the conversation to the other model and emit `Switch`; `None` when there
    /// was nothing to hand over. The gate decides here, from what is known before
    /// anything is measured: the cosine last measured for this direction, or the
    /// mapper's calibration cosine (see [`Event::Switch`]).
    pub(super) fn handoff(&mut self) -> Result<Option<Handoff>, EngineError> {
        let a = self.active;
        let b = 1 - a;
        let n = self.slots[a].primary.len();
        let index = self.switches;
        let (from_name, to_name) = (self.slots[a].name(), self.slots[b].name());
        if n == 0 {
            self.active = b;
            self.out.emit(Event::Notice {
                message: format!("{to_name} is active; there was no conversation to hand over"),
            });
            return Ok(None);
        }
        // The gate needs the estimate before it decides; otherwise the measurement makes
        // it, while the engine is idle, so that it never holds up the switch.
        let mut estimate = None;
        if self.settings.gate.is_some() {
            estimate = self.estimate(a, n)?;
        }
        let gate = self.settings.gate.map(|threshold| {
            let predicted = estimate.and_then(|e: SwitchEstimate| e.predicted_cosine);
            let measured = self.measured_cosine[a].filter(|_| self.settings.reference);
            let (estimate, basis) = match (measured, predicted) {
                (Some(m), _) => (m, EstimateBasis::Measured),
                (None, Some(p)) => (p, EstimateBasis::Predicted),
                (None, None) => (
                    self.mappers[a].calibration_cosine,
                    EstimateBasis::Calibration,
                ),
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
        });
        let reprefill = gate.is_some_and(|g| g.used == CacheOrigin::Reprefilled);
        let mapper: &CacheMapper = &self.mappers[a].mapper;
        let history = &self.conv.history[..n];
        let (sa, sb) = split(&mut self.slots, a);
        // The newest `tail` positions are the target's to read; what it holds of them
        // (a pre-map, an earlier handoff) is dropped and read again.
        let tail_start = n - self.settings.tail.min(n);
        let held = sb.primary.len().min(tail_start);
        sb.primary.truncate(held);
        let own_prefix = if self.settings.reference && sb.origin == CacheOrigin::True {
            held
        } else {
            0
        };
        // The handoff is what the switch itself costs: the anchor the target computes and
        // the map, or the re-prefill the gate chose.
        let t_handoff = Instant::now();
        let mut map_suffix_ms = None;
        if reprefill {
            // From what the target computed itself: its own positions, or its truth.
            let mut cache = if sb.origin == CacheOrigin::True {
                std::mem::replace(&mut sb.primary, sb.model.decoder.new_cache())
            } else {
                sb.truth.try_clone_prefix(n)?
            };
            let have = cache.len();
            if have < n {
                sb.model
                    .decoder
                    .forward(&history[have..], &mut cache, &no_logits())?;
            }
            sb.primary = cache;
            sb.origin = CacheOrigin::Reprefilled;
        } else {
            let mut prior = held;
            let anchor = self.settings.anchor.min(n);
            if prior < anchor {
                sb.fill_anchor(history, anchor)?;
                prior = anchor;
            }
            let map_end = tail_start.max(prior);
            let t_map = Instant::now();
            map_onto(
                mapper,
                &sa.model,
                &sa.primary,
                history,
                &sb.model,
                &mut sb.primary,
                prior,
                map_end,
            )?;
            map_suffix_ms = Some(synced_ms(sb.model.decoder.device(), t_map));
            if map_end < n {
                sb.model
                    .decoder
                    .forward(&history[map_end..], &mut sb.primary, &no_logits())?;
            }
            sb.origin = CacheOrigin::Mapped;
        }
        let handoff_ms = synced_ms(sb.model.decoder.device(), t_handoff);
        let timings = SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: None,
            map_suffix_ms: map_suffix_ms.filter(|_| held > 0),
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: handoff_ms,
        };
        self.active = b;
        self.switches += 1;
        self.follow_up = Some(FollowUp { index });
        let turn = self.turn + 1;
        self.out.emit(Event::Switch {
            index,
            turn,
            from: from_name,
            to: to_name,
            context_tokens: n,
            suffix_tokens: n - held,
            timings,
            metrics: None,
            gate,
            measurement_follows: true,
            estimate,
        });
        Ok(Some(Handoff {
            index,
            turn,
            source: a,
            target: b,
            context_tokens: n,
            own_prefix,
            reprefilled: reprefill,
            estimated: self.settings.gate.is_some(),
            timings,
        }))
    }
}

impl Engine {
    /// What slot `source`'s first `n` positions say about the map before any re-prefill
    /// (see [`crate::gate`]): their feature distance past the anchor, the round trip of
    /// the newest of them through the other direction's mapper, and the cosine the
    /// gate's line predicts from the estimate it was fitted on.
    pub(super) fn estimate(
        &self,
        source: usize,
        n: usize,
    ) -> Result<Option<SwitchEstimate>, EngineError> {
        let (m, back) = (&self.mappers[source], &self.mappers[1 - source]);
        let (slot, other) = (&self.slots[source], &self.slots[1 - source]);
        let from = self.settings.anchor.min(n);
        let (src_rope, tgt_rope) = (slot.model.decoder.rope(), other.model.decoder.rope());
        let failed =
            |e: crate::gate::GateError| EngineError::Internal(format!("the gate's estimate: {e}"));
        let distance = crate::gate::feature_distance(&m.mapper, &slot.primary, src_rope, from, n)
            .map_err(failed)?;
        let (rs, re) = crate::gate::estimate::round_trip_range(from, n);
        let trip = crate::gate::round_trip(
            &m.mapper,
            &back.mapper,
            &slot.primary,
            &self.conv.history[..n],
            src_rope,
            tgt_rope,
            rs,
            re,
        )
        .map_err(failed)?;
        if distance.is_none() && trip.is_none() {
            return Ok(None);
        }
        let predicted = m.gate.as_ref().and_then(|g| {
            let x = match g.estimator.as_str() {
                "round_trip" => trip,
                "feature_distance" => distance,
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
/// [`crate::eval::fidelity`]) and append the layer's values to `out`.
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

/// Map positions `from..to` of `src_cache`, which holds `tokens`, onto the end of `dst`
/// (which must hold exactly `from` positions).
#[allow(clippy::too_many_arguments)]
pub fn map_onto(
    mapper: &CacheMapper,
    src: &Model,
    src_cache: &KvCache,
    tokens: &[u32],
    tgt: &Model,
    dst: &mut KvCache,
    from: usize,
    to: usize,
) -> Result<(), EngineError> {
    if dst.len() != from {
        return Err(EngineError::Internal(format!(
            "the target cache holds {} positions, expected {from}",
            dst.len()
        )));
    }
    if to > from {
        let layers = mapper.map_range(
            src_cache,
            tokens,
            src.decoder.rope(),
            tgt.decoder.rope(),
            from,
            to,
        )?;
        dst.extend_with(&layers)?;
    }
    Ok(())
}

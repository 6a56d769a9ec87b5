//! A switch row as `baton report --json` writes it: flat, in the layout version 1 of the
//! report gave it, so that programs reading reports keep working whatever shape the
//! row takes in memory. Fields may be added here, none renamed or removed without a
//! version change.

use baton_protocol::{GateDecision, MapperState, SwitchRow};
use serde::{Serialize, Serializer};

/// The keys of a version-1 switch row, for the test that holds the layout.
#[cfg(test)]
pub(super) const VERSION_1_KEYS: &[&str] = &[
    "index",
    "turn",
    "from",
    "to",
    "context_tokens",
    "suffix_tokens",
    "handoff_ms",
    "measured",
    "map_full_ms",
    "map_suffix_ms",
    "reprefill_full_ms",
    "reprefill_suffix_ms",
    "end_to_end_ms",
    "speedup_full",
    "speedup_suffix",
    "cosine_mean",
    "cosine_min",
    "top1_agreement",
    "kl",
    "gate",
    "feature_distance",
    "round_trip",
    "predicted_cosine",
    "mapper",
    "reread",
    "reread_positions",
    "reread_ms",
    "dropped_positions",
    "reprefilled",
];

/// `handoff_ms` is the switch until the target was ready; `end_to_end_ms` what the user
/// then waited for the first token of the next answer (the handoff until that turn
/// reports it). `measured` is false while the measurement is missing (the session ended
/// first) or stopped early.
#[derive(Serialize)]
struct Flat<'a> {
    index: u32,
    turn: u32,
    from: &'a str,
    to: &'a str,
    context_tokens: usize,
    suffix_tokens: usize,
    handoff_ms: f64,
    measured: bool,
    map_full_ms: Option<f64>,
    map_suffix_ms: Option<f64>,
    reprefill_full_ms: Option<f64>,
    reprefill_suffix_ms: Option<f64>,
    end_to_end_ms: f64,
    speedup_full: Option<f64>,
    speedup_suffix: Option<f64>,
    cosine_mean: Option<f64>,
    cosine_min: Option<f64>,
    top1_agreement: Option<f64>,
    kl: Option<f64>,
    gate: Option<GateDecision>,
    feature_distance: Option<f64>,
    round_trip: Option<f64>,
    predicted_cosine: Option<f64>,
    mapper: Option<MapperState>,
    reread: Option<&'a str>,
    reread_positions: Option<usize>,
    reread_ms: Option<f64>,
    dropped_positions: Option<usize>,
    reprefilled: bool,
    /// The plan's layers: over how many positions, and their part of `reread_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    layer_positions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    layers_ms: Option<f64>,
}

impl<'a> Flat<'a> {
    fn of(s: &'a SwitchRow) -> Self {
        let t = &s.timings;
        let r = s.reread.as_ref();
        Self {
            index: s.index,
            turn: s.turn,
            from: s.from.as_str(),
            to: s.to.as_str(),
            context_tokens: s.context_tokens,
            suffix_tokens: s.suffix_tokens,
            handoff_ms: s.handoff_ms,
            measured: s.measured(),
            map_full_ms: t.map_full_ms,
            map_suffix_ms: t.map_suffix_ms,
            reprefill_full_ms: t.reprefill_full_ms,
            reprefill_suffix_ms: t.reprefill_suffix_ms,
            end_to_end_ms: s.end_to_end_ms(),
            speedup_full: t.speedup_full(),
            speedup_suffix: t.speedup_suffix(),
            cosine_mean: s.cosine_mean(),
            cosine_min: s.cosine_min(),
            top1_agreement: s.top1_agreement(),
            kl: s.kl(),
            gate: s.gate,
            feature_distance: s.estimate.and_then(|e| e.feature_distance),
            round_trip: s.estimate.and_then(|e| e.round_trip),
            predicted_cosine: s.estimate.and_then(|e| e.predicted_cosine),
            mapper: s.mapper,
            reread: s.plan.as_deref(),
            reread_positions: r.map(|r| r.positions),
            reread_ms: r.map(|r| r.ms),
            dropped_positions: r.map(|r| r.dropped),
            reprefilled: r.is_some_and(|r| r.reprefilled),
            layer_positions: r.and_then(|r| r.layers).map(|l| l.0),
            layers_ms: r.and_then(|r| r.layers).map(|l| l.1),
        }
    }
}

pub(super) fn rows<S: Serializer>(rows: &[SwitchRow], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(rows.iter().map(Flat::of))
}

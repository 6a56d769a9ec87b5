//! What a switch and a generation measured: timings, fidelity, the gate's decision and estimate, and the state of the mapper used.

use super::float;
use super::kinds::CacheOrigin;
use serde::{Deserialize, Serialize};

/// What a speedup measured away from the CPU is set against, said wherever one is
/// printed: baton's own re-prefill on that device, which no GPU has yet timed beside a
/// production prefill in this build. `None` on the CPU, where the re-prefill was timed
/// beside llama.cpp's on AVX-512 and AVX2 and was the faster (docs/runtime.md).
pub fn unverified_baseline(device_is_cpu: bool) -> Option<&'static str> {
    (!device_is_cpu).then_some(
        "speedups on this device are against baton's own re-prefill, not yet timed beside \
         a production prefill (PyTorch's) in this build; an earlier build's was 8-25x slower \
         than PyTorch's on an H200, which inflated its speedups as much (docs/gpu.md)",
    )
}

/// Where the time of one generation went. `first_token_ms` counts from the generation's
/// start (the prefill of what the model had not read, the message included, then the
/// first step); `waited_ms` from the message's sending, so it adds whatever the message
/// waited behind before that: a plan's choosing and re-read after a switch, a
/// measurement giving way. The second is what the person waited.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GenerationTimings {
    #[serde(with = "float")]
    pub prefill_ms: f64,
    #[serde(with = "float")]
    pub first_token_ms: f64,
    #[serde(with = "float")]
    pub decode_tokens_per_s: f64,
    #[serde(with = "float")]
    pub total_ms: f64,
    /// From the message's sending to this path's first token; `None` in sessions that
    /// did not record it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "float::option"
    )]
    pub waited_ms: Option<f64>,
}

/// Where the time of one switch went. "Full" covers the whole conversation's cache;
/// "suffix" only the tokens added since the target last held a cache (the incremental
/// handoff). A `None` was not measured (e.g. the reference path was off, or, in the
/// [`Event::Switch`] of a session of format 1.1 or later, not yet: the handoff event
/// carries only `map_suffix_ms` and `end_to_end_ms`, [`Event::SwitchMeasured`] the rest).
/// `end_to_end_ms` is the handoff: the switch command taken to the target's cache in
/// place (what the user waits for is [`Event::SwitchFollowUp`]'s `end_to_end_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SwitchTimings {
    #[serde(default, with = "float::option")]
    pub source_prefill_ms: Option<f64>,
    #[serde(default, with = "float::option")]
    pub map_full_ms: Option<f64>,
    #[serde(default, with = "float::option")]
    pub map_suffix_ms: Option<f64>,
    #[serde(default, with = "float::option")]
    pub reprefill_full_ms: Option<f64>,
    #[serde(default, with = "float::option")]
    pub reprefill_suffix_ms: Option<f64>,
    #[serde(with = "float")]
    pub end_to_end_ms: f64,
}

impl SwitchTimings {
    /// How many times faster mapping the whole cache was than re-prefilling it.
    pub fn speedup_full(&self) -> Option<f64> {
        ratio(self.reprefill_full_ms?, self.map_full_ms?)
    }

    /// How many times faster mapping only the new tokens was than re-prefilling them.
    pub fn speedup_suffix(&self) -> Option<f64> {
        ratio(self.reprefill_suffix_ms?, self.map_suffix_ms?)
    }
}

fn ratio(slow: f64, fast: f64) -> Option<f64> {
    (fast > 0.0 && slow.is_finite() && fast.is_finite()).then(|| slow / fast)
}

/// How faithful a mapped cache was, measured against the target's own cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchMetrics {
    /// Attention-output cosine per target layer.
    #[serde(with = "float::vec")]
    pub attention_cosine: Vec<f64>,
    #[serde(with = "float::vec")]
    pub r2_k: Vec<f64>,
    #[serde(with = "float::vec")]
    pub r2_v: Vec<f64>,
    /// Per target layer: how much of the key error falls on the few keys attention
    /// actually weighs.
    #[serde(with = "float::vec")]
    pub key_error_concentration: Vec<f64>,
    #[serde(default, with = "float::option")]
    pub top1_agreement: Option<f64>,
    #[serde(default, with = "float::option")]
    pub kl: Option<f64>,
}

impl SwitchMetrics {
    /// Mean attention cosine over the layers; `None` when a layer's could not be computed
    /// (NaN or infinite): a mean that skipped it would look better than the cache is.
    pub fn cosine_mean(&self) -> Option<f64> {
        self.all_finite()
            .then(|| finite_mean(self.attention_cosine.iter().copied()))
            .flatten()
    }

    /// The worst layer's attention cosine; `None` when a layer's could not be computed.
    pub fn cosine_min(&self) -> Option<f64> {
        self.all_finite()
            .then(|| self.attention_cosine.iter().copied().reduce(f64::min))
            .flatten()
    }

    /// The first layer whose attention cosine could not be computed.
    pub fn first_uncomputed_layer(&self) -> Option<usize> {
        self.attention_cosine.iter().position(|v| !v.is_finite())
    }

    fn all_finite(&self) -> bool {
        self.first_uncomputed_layer().is_none()
    }
}

/// The mean of the finite values (a layer whose measure could not be computed is NaN);
/// `None` when there are none. Screens, reports and session summaries all average this
/// way.
pub fn finite_mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (n, sum) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    (n > 0).then(|| sum / n as f64)
}

/// The gate's choice at a switch: map when the fidelity estimate clears the threshold,
/// re-prefill otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateDecision {
    #[serde(with = "float")]
    pub threshold: f64,
    #[serde(with = "float")]
    pub estimate: f64,
    pub used: CacheOrigin,
    /// Where the estimate came from (absent in sessions before format 1.2).
    #[serde(default)]
    pub basis: Option<EstimateBasis>,
}

/// What a gate's estimate rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimateBasis {
    /// The attention cosine last measured for this direction (reference path on).
    Measured,
    /// Predicted from this conversation's feature distance by the gate study's line.
    Predicted,
    /// The mapper's calibration cosine, a constant.
    Calibration,
}

/// What a switch can say about its fidelity before anything is re-prefilled (see
/// `baton_method::gate`): how far the source features handed over lie from the calibration's
/// (mean squared standardised distance, about 1 on calibration-like text), how well the
/// newest of them survive a map to the target and back (cosine), and the attention
/// cosine the gate study's line predicts from one of them, when the pair has a line.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SwitchEstimate {
    #[serde(default, with = "float::option")]
    pub feature_distance: Option<f64>,
    #[serde(default, with = "float::option")]
    pub round_trip: Option<f64>,
    #[serde(default, with = "float::option")]
    pub predicted_cosine: Option<f64>,
}

/// Which state of a direction's mapper a switch mapped with: as calibrated (no update),
/// or with the learning updates taken so far, earlier sessions' included. Learning runs
/// in the background and a switch never waits for it, so two runs of one script may map
/// with different states; this says which.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapperState {
    /// Learning updates in the mapper (0: as calibrated).
    pub updates: u32,
    /// Positions of conversation text those updates learned from.
    pub learned_tokens: u64,
}

impl MapperState {
    pub fn is_calibrated(&self) -> bool {
        self.updates == 0
    }
}

impl std::fmt::Display for MapperState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_calibrated() {
            write!(f, "calibrated")
        } else {
            write!(
                f,
                "learned, update {} ({} positions)",
                self.updates, self.learned_tokens
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_speedup_off_the_cpu_names_its_unverified_baseline() {
        assert_eq!(unverified_baseline(true), None);
        let said = unverified_baseline(false).expect("said off the CPU");
        assert!(
            said.contains("re-prefill") && said.contains("PyTorch"),
            "{said}"
        );
    }
}

//! The Command/Event types: the only contract between the engine and its callers (the
//! terminal UI, the headless runner, session files). It depends on nothing else in the
//! crate, so a caller that only reads or writes these never has to pull in the engine.
//!
//! Every type is tagged with a `"type"` field in snake case, so a session file stays
//! readable line by line.

use serde::{Deserialize, Serialize};

/// What a caller asks the engine to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// A user message: starts the next turn.
    Submit { text: String },
    /// Hand the conversation to the other model.
    Switch,
    /// Stop the generation in progress (what was generated so far is kept), or the
    /// measurement of the last switch when that is what runs (reported as stopped).
    Cancel,
    /// Turn the re-prefilled reference path on or off (it costs a second generation).
    SetReference { enabled: bool },
    /// Turn background repair on or off: while idle, the active model re-prefills the
    /// conversation into its own cache, replacing mapped positions chunk by chunk.
    SetRepair { enabled: bool },
    /// Mark the current turn with a note, to find it again in the session file.
    Bookmark { note: String },
    /// Finish what runs in the background (the last switch's measurement, learning from
    /// it, a repair that is on) and say so with a notice starting "background work
    /// done": a headless run sends it last, so that its session holds all of it.
    Finish,
    /// Stop the engine; it answers with [`Event::ShutDown`].
    Shutdown,
}

/// Which of the two paths a turn was generated on. Before the first switch there is only
/// the primary path, reported as `Mapped` with a [`CacheOrigin::True`] cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    /// The primary path, shown to the user: after a switch, the target's cache comes
    /// from the mapper.
    Mapped,
    /// The shadow path: the target re-prefills the whole conversation itself, as the
    /// yardstick for the mapped one.
    Reference,
}

/// How the cache a model generates from was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheOrigin {
    /// The model prefilled the conversation itself.
    True,
    /// The cache was mapped from the other model's.
    Mapped,
    /// The model re-prefilled the conversation after a switch.
    Reprefilled,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    Eos,
    MaxTokens,
    Cancelled,
}

/// A loaded model, enough to tell later which weights a session ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    pub path: String,
    pub sha256: String,
    pub arch: String,
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// A loaded mapper artifact, bound to the two models it was fitted between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MapperInfo {
    /// The artifact's file name.
    pub id: String,
    pub source: String,
    pub target: String,
    pub sha256: String,
    /// Source layers feeding each target layer.
    pub k: usize,
}

/// Where the time of one generation went.
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
    /// Mean attention cosine over the layers that have a finite value.
    pub fn cosine_mean(&self) -> Option<f64> {
        let finite: Vec<f64> = finite(&self.attention_cosine).collect();
        (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
    }

    /// The worst layer's attention cosine.
    pub fn cosine_min(&self) -> Option<f64> {
        finite(&self.attention_cosine).reduce(f64::min)
    }
}

fn finite(values: &[f64]) -> impl Iterator<Item = f64> + '_ {
    values.iter().copied().filter(|v| v.is_finite())
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
/// `crate::gate`): how far the source features handed over lie from the calibration's
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

/// What the engine tells its callers; session files record these, one per line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Progress of fetching, loading or calibrating.
    Loading {
        stage: String,
        done: u64,
        total: u64,
        #[serde(default, with = "float::option")]
        eta_seconds: Option<f64>,
    },
    /// Both models are loaded; `active` indexes `models`.
    Ready {
        models: Vec<ModelInfo>,
        active: usize,
        mappers: Vec<MapperInfo>,
        device: String,
    },
    UserMessage {
        turn: u32,
        text: String,
    },
    /// A model starts answering on one path.
    TurnStarted {
        turn: u32,
        path: PathKind,
        model: String,
        cache: CacheOrigin,
    },
    /// One streamed token; not recorded, [`Event::Generation`] sums them up.
    Token {
        turn: u32,
        path: PathKind,
        text: String,
        id: u32,
    },
    /// One path's complete answer to a turn.
    Generation {
        turn: u32,
        path: PathKind,
        model: String,
        text: String,
        token_ids: Vec<u32>,
        prompt_tokens: usize,
        timings: GenerationTimings,
        stop: StopKind,
    },
    /// The conversation was handed over and the target is ready for the next message;
    /// `index` counts switches from 0 and `turn` is the first turn the new model answers
    /// from the handed-over cache.
    ///
    /// With `measurement_follows` (every switch with a conversation, from session format
    /// 1.1 on) this is the handoff alone: `timings` holds the suffix map and the handoff
    /// time, `metrics` is `None`, and [`Event::SwitchMeasured`] with the same `index`
    /// brings the rest later. Without it (older sessions) everything was measured before
    /// this event and is in it.
    ///
    /// `gate` was decided at the handoff, before anything was measured: its estimate is
    /// the mean attention cosine last measured for this direction, or the mapper's
    /// calibration cosine before the first measurement.
    Switch {
        index: u32,
        turn: u32,
        from: String,
        to: String,
        context_tokens: usize,
        suffix_tokens: usize,
        timings: SwitchTimings,
        metrics: Option<SwitchMetrics>,
        gate: Option<GateDecision>,
        #[serde(default)]
        measurement_follows: bool,
        /// The estimate made without a re-prefill (session format 1.2 on).
        #[serde(default)]
        estimate: Option<SwitchEstimate>,
        /// The state of the mapper the handoff used (session format 1.3 on; `None` in
        /// older files).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mapper: Option<MapperState>,
    },
    /// What switch `index` costs against a re-prefill and how faithful its cache is,
    /// measured after its handoff: the whole cache mapped again and timed, the target's
    /// full and suffix re-prefill (reference path on), and the per-layer metrics of the
    /// handed-over cache against the re-prefilled one. `timings` holds every timing of
    /// the switch, the handoff's included.
    ///
    /// The measurement runs while the engine is otherwise idle, a step at a time. A
    /// message sent meanwhile is taken after the step in progress and the measurement
    /// is postponed, not dropped: it resumes once the engine is idle again, and
    /// `yielded_to` lists the turns that went first. It does not yield to a switch,
    /// which waits for it, since the next switch changes the caches it measures.
    /// `stopped` says why it ended early (a cancel, an error); `metrics` is then `None`
    /// and the timings hold what was measured by then.
    SwitchMeasured {
        index: u32,
        turn: u32,
        timings: SwitchTimings,
        metrics: Option<SwitchMetrics>,
        #[serde(default)]
        yielded_to: Vec<u32>,
        #[serde(default)]
        stopped: Option<String>,
        /// The estimate made without a re-prefill, when the switch itself did not need
        /// one (no gate): made here, off the handoff, next to what was measured.
        #[serde(default)]
        estimate: Option<SwitchEstimate>,
    },
    /// The mapped path's answer against the reference path's, for a turn after a switch.
    TurnComparison {
        turn: u32,
        identical: bool,
        /// The index of the first token where the two answers differ.
        first_difference: Option<usize>,
        /// The fraction of token positions where the two answers agree.
        #[serde(with = "float")]
        agreement: f64,
    },
    /// What the first turn after a switch says about it: teacher-forced next-token
    /// agreement and KL of the mapped cache against the reference cache on the user's
    /// message (computed after the mapped answer, so it never delays it), and the
    /// end-to-end time the user waited: from the message reaching the engine to the
    /// target's first token. The handoff counts only where the message waited for it.
    /// (Sessions before format 1.1 wrote the handoff plus that turn's time to first
    /// token here.)
    SwitchFollowUp {
        index: u32,
        turn: u32,
        #[serde(default, with = "float::option")]
        top1_agreement: Option<f64>,
        #[serde(default, with = "float::option")]
        kl: Option<f64>,
        positions: usize,
        #[serde(with = "float")]
        first_token_ms: f64,
        #[serde(with = "float")]
        end_to_end_ms: f64,
    },
    /// The mapper `from -> to` learned (or declined to learn) from the conversation
    /// handed over at switch `index`: both models' own caches of its first positions,
    /// from that switch's measurement, added to its statistics and solved again. The
    /// update is taken (`accepted`) only if the held-out cosine does not drop; it is
    /// the mean of two halves weighted alike, the conversation's newest `held_out`
    /// positions (kept out of the fit) and a fixed calibration text, each given before
    /// and after. `learned_tokens` counts every position the mapper has learned from,
    /// earlier sessions' included; `kept` says it was saved for the next session.
    /// (Session format 1.2 on.)
    MapperLearned {
        index: u32,
        turn: u32,
        from: String,
        to: String,
        tokens: usize,
        held_out: usize,
        #[serde(with = "float")]
        before: f64,
        #[serde(with = "float")]
        after: f64,
        #[serde(with = "float")]
        conversation_before: f64,
        #[serde(with = "float")]
        conversation_after: f64,
        #[serde(default, with = "float::option")]
        calibration_before: Option<f64>,
        #[serde(default, with = "float::option")]
        calibration_after: Option<f64>,
        accepted: bool,
        learned_tokens: u64,
        #[serde(with = "float")]
        seconds: f64,
        kept: bool,
    },
    /// How far the background repair of `model`'s cache got: its first `repaired`
    /// positions of `total` are its own prefill, the rest as they were (mapped, or
    /// computed over mapped positions). Not recorded; [`Event::CacheRepaired`] sums it up.
    RepairProgress {
        model: String,
        repaired: usize,
        total: usize,
    },
    /// The repair of `model`'s cache after switch `index` ended: `complete` when every
    /// position is its own prefill (the cache is then the model's own), else cut short
    /// by the next switch or by turning repair off. `after_switch_ms` runs from the
    /// handoff to the end, `compute_ms` sums the prefill work alone (the rest is the
    /// engine serving turns, measuring, or waiting). (Session format 1.2 on.)
    CacheRepaired {
        index: u32,
        turn: u32,
        model: String,
        repaired: usize,
        total: usize,
        complete: bool,
        #[serde(with = "float")]
        after_switch_ms: f64,
        #[serde(with = "float")]
        compute_ms: f64,
    },
    /// Something the user should know that is not an error (a queued switch, a pre-map).
    Notice {
        message: String,
    },
    Bookmark {
        turn: u32,
        note: String,
    },
    /// A fatal error ends the engine; any other leaves it ready for the next command.
    Error {
        message: String,
        fatal: bool,
    },
    /// A turn finished on every path.
    Done {
        turn: u32,
    },
    ShutDown,
}

impl Event {
    /// Every `type` tag an [`Event`] can carry, so a reader can tell an event type added
    /// by a newer baton from a damaged line.
    pub const TYPES: &'static [&'static str] = &[
        "loading",
        "ready",
        "user_message",
        "turn_started",
        "token",
        "generation",
        "switch",
        "switch_measured",
        "turn_comparison",
        "switch_follow_up",
        "mapper_learned",
        "repair_progress",
        "cache_repaired",
        "notice",
        "bookmark",
        "error",
        "done",
        "shut_down",
    ];

    /// Whether a session file keeps this event. Streamed tokens are summed up by
    /// `Generation` and loading progress by `Ready`; both would only bloat the file.
    pub fn is_recorded(&self) -> bool {
        !matches!(
            self,
            Event::Token { .. } | Event::Loading { .. } | Event::RepairProgress { .. }
        )
    }

    /// The turn the event belongs to, for those that belong to one.
    pub fn turn(&self) -> Option<u32> {
        match self {
            Event::UserMessage { turn, .. }
            | Event::TurnStarted { turn, .. }
            | Event::Token { turn, .. }
            | Event::Generation { turn, .. }
            | Event::Switch { turn, .. }
            | Event::SwitchMeasured { turn, .. }
            | Event::TurnComparison { turn, .. }
            | Event::SwitchFollowUp { turn, .. }
            | Event::MapperLearned { turn, .. }
            | Event::CacheRepaired { turn, .. }
            | Event::Bookmark { turn, .. }
            | Event::Done { turn } => Some(*turn),
            Event::Loading { .. }
            | Event::Ready { .. }
            | Event::RepairProgress { .. }
            | Event::Notice { .. }
            | Event::Error { .. }
            | Event::ShutDown => None,
        }
    }
}

/// JSON has no NaN or infinity and serde_json writes them as `null`, which would then
/// fail to read back as a number; a degenerate metric must not make a session unreadable,
/// so `null` reads back as NaN.
mod float {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }

    /// An absent measurement stays `None`; a NaN one becomes `None` too, since JSON
    /// cannot tell them apart.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            v.filter(|x| x.is_finite()).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            Option::<f64>::deserialize(d)
        }
    }

    pub mod vec {
        use serde::{Deserialize, Deserializer, Serialize, Serializer};

        pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
            v.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
            Ok(Vec::<Option<f64>>::deserialize(d)?
                .into_iter()
                .map(|x| x.unwrap_or(f64::NAN))
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings() -> GenerationTimings {
        GenerationTimings {
            prefill_ms: 12.5,
            first_token_ms: 14.0,
            decode_tokens_per_s: 31.0,
            total_ms: 400.0,
        }
    }

    fn switch_timings() -> SwitchTimings {
        SwitchTimings {
            source_prefill_ms: Some(80.0),
            map_full_ms: Some(4.0),
            map_suffix_ms: Some(1.0),
            reprefill_full_ms: Some(120.0),
            reprefill_suffix_ms: Some(5.0),
            end_to_end_ms: 6.5,
        }
    }

    fn one_of_each() -> Vec<Event> {
        let model = ModelInfo {
            name: "a".into(),
            path: "models/a.gguf".into(),
            sha256: "ab".repeat(32),
            arch: "qwen2".into(),
            n_layer: 24,
            n_kv_head: 2,
            head_dim: 64,
        };
        vec![
            Event::Loading {
                stage: "calibrating".into(),
                done: 3,
                total: 10,
                eta_seconds: Some(4.5),
            },
            Event::Ready {
                models: vec![
                    model.clone(),
                    ModelInfo {
                        name: "b".into(),
                        ..model
                    },
                ],
                active: 0,
                mappers: vec![MapperInfo {
                    id: "a--b.safetensors".into(),
                    source: "a".into(),
                    target: "b".into(),
                    sha256: "cd".repeat(32),
                    k: 4,
                }],
                device: "cpu".into(),
            },
            Event::UserMessage {
                turn: 1,
                text: "hello \"there\"\n".into(),
            },
            Event::TurnStarted {
                turn: 1,
                path: PathKind::Reference,
                model: "b".into(),
                cache: CacheOrigin::Reprefilled,
            },
            Event::Token {
                turn: 1,
                path: PathKind::Mapped,
                text: "hi".into(),
                id: 7,
            },
            Event::Generation {
                turn: 1,
                path: PathKind::Mapped,
                model: "a".into(),
                text: "hi there".into(),
                token_ids: vec![7, 8, 9],
                prompt_tokens: 20,
                timings: timings(),
                stop: StopKind::MaxTokens,
            },
            Event::Switch {
                index: 0,
                turn: 2,
                from: "a".into(),
                to: "b".into(),
                context_tokens: 100,
                suffix_tokens: 10,
                timings: switch_timings(),
                metrics: Some(SwitchMetrics {
                    attention_cosine: vec![0.9, 0.8],
                    r2_k: vec![0.7, 0.6],
                    r2_v: vec![0.5, 0.4],
                    key_error_concentration: vec![0.3, 0.2],
                    top1_agreement: Some(0.75),
                    kl: None,
                }),
                gate: Some(GateDecision {
                    threshold: 0.9,
                    estimate: 0.95,
                    used: CacheOrigin::Mapped,
                    basis: Some(EstimateBasis::Predicted),
                }),
                measurement_follows: false,
                estimate: Some(SwitchEstimate {
                    feature_distance: Some(1.2),
                    round_trip: Some(0.93),
                    predicted_cosine: Some(0.95),
                }),
                mapper: Some(MapperState {
                    updates: 2,
                    learned_tokens: 300,
                }),
            },
            Event::SwitchMeasured {
                index: 0,
                turn: 2,
                timings: switch_timings(),
                metrics: None,
                yielded_to: vec![2],
                stopped: Some("cancelled".into()),
                estimate: None,
            },
            Event::TurnComparison {
                turn: 2,
                identical: false,
                first_difference: Some(3),
                agreement: 0.5,
            },
            Event::SwitchFollowUp {
                index: 0,
                turn: 2,
                top1_agreement: Some(0.9),
                kl: Some(0.2),
                positions: 17,
                first_token_ms: 120.0,
                end_to_end_ms: 310.5,
            },
            Event::MapperLearned {
                index: 0,
                turn: 2,
                from: "a".into(),
                to: "b".into(),
                tokens: 120,
                held_out: 40,
                before: 0.7,
                after: 0.75,
                conversation_before: 0.6,
                conversation_after: 0.7,
                calibration_before: Some(0.8),
                calibration_after: None,
                accepted: true,
                learned_tokens: 500,
                seconds: 2.5,
                kept: true,
            },
            Event::RepairProgress {
                model: "b".into(),
                repaired: 256,
                total: 900,
            },
            Event::CacheRepaired {
                index: 0,
                turn: 3,
                model: "b".into(),
                repaired: 900,
                total: 900,
                complete: true,
                after_switch_ms: 9000.0,
                compute_ms: 6500.0,
            },
            Event::Notice {
                message: "switch queued".into(),
            },
            Event::Bookmark {
                turn: 2,
                note: "drift starts".into(),
            },
            Event::Error {
                message: "out of memory".into(),
                fatal: true,
            },
            Event::Done { turn: 2 },
            Event::ShutDown,
        ]
    }

    #[test]
    fn every_event_round_trips_through_json() {
        let events = one_of_each();
        assert_eq!(events.len(), Event::TYPES.len());
        for e in events {
            let line = serde_json::to_string(&e).unwrap();
            assert!(!line.contains('\n'), "{line}");
            let back: Event = serde_json::from_str(&line).unwrap();
            assert_eq!(back, e, "{line}");
        }
    }

    #[test]
    fn every_event_carries_a_listed_snake_case_tag() {
        let tags: Vec<String> = one_of_each()
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(tags, Event::TYPES);
    }

    #[test]
    fn every_command_round_trips_through_json() {
        let commands = vec![
            Command::Submit { text: "x".into() },
            Command::Switch,
            Command::Cancel,
            Command::SetReference { enabled: true },
            Command::Bookmark { note: "n".into() },
            Command::Finish,
            Command::Shutdown,
        ];
        for c in commands {
            let line = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Command>(&line).unwrap(), c);
        }
        assert_eq!(
            serde_json::to_string(&Command::SetReference { enabled: false }).unwrap(),
            r#"{"type":"set_reference","enabled":false}"#
        );
    }

    #[test]
    fn only_tokens_and_loading_and_repair_progress_are_left_out_of_the_file() {
        let left_out: Vec<&str> = one_of_each()
            .iter()
            .filter(|e| !e.is_recorded())
            .map(|e| match e {
                Event::Token { .. } => "token",
                Event::Loading { .. } => "loading",
                Event::RepairProgress { .. } => "repair_progress",
                _ => "other",
            })
            .collect();
        assert_eq!(left_out, ["loading", "token", "repair_progress"]);
    }

    #[test]
    fn non_finite_metrics_survive_a_round_trip() {
        let m = SwitchMetrics {
            attention_cosine: vec![f64::NAN, 0.5],
            r2_k: vec![],
            r2_v: vec![],
            key_error_concentration: vec![],
            top1_agreement: Some(f64::NAN),
            kl: Some(f64::INFINITY),
        };
        let back: SwitchMetrics =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert!(back.attention_cosine[0].is_nan());
        assert_eq!(back.attention_cosine[1], 0.5);
        assert_eq!(back.top1_agreement, None);
        assert_eq!(back.kl, None);
        assert_eq!(back.cosine_mean(), Some(0.5));
        assert_eq!(back.cosine_min(), Some(0.5));
    }

    #[test]
    fn speedups_are_reprefill_over_map() {
        let t = switch_timings();
        assert_eq!(t.speedup_full(), Some(30.0));
        assert_eq!(t.speedup_suffix(), Some(5.0));
        let unmeasured = SwitchTimings {
            reprefill_full_ms: None,
            map_suffix_ms: Some(0.0),
            ..t
        };
        assert_eq!(unmeasured.speedup_full(), None);
        assert_eq!(unmeasured.speedup_suffix(), None);
        // A handoff event, before its measurement: no full map timed yet.
        let handoff = SwitchTimings {
            map_full_ms: None,
            ..t
        };
        assert_eq!(handoff.speedup_full(), None);
    }

    #[test]
    fn a_switch_line_from_an_older_session_still_reads() {
        // Format 1.0: everything measured before the event, no `measurement_follows`.
        let line = r#"{"type":"switch","index":0,"turn":2,"from":"a","to":"b","context_tokens":9,"suffix_tokens":9,"timings":{"source_prefill_ms":null,"map_full_ms":4.0,"map_suffix_ms":null,"reprefill_full_ms":40.0,"reprefill_suffix_ms":null,"end_to_end_ms":5.0},"metrics":null,"gate":null}"#;
        match serde_json::from_str::<Event>(line).unwrap() {
            Event::Switch {
                timings,
                measurement_follows,
                ..
            } => {
                assert!(!measurement_follows);
                assert_eq!(timings.map_full_ms, Some(4.0));
                assert_eq!(timings.speedup_full(), Some(10.0));
            }
            other => panic!("{other:?}"),
        }
        // A measurement event written without its optional fields.
        let line = r#"{"type":"switch_measured","index":1,"turn":3,"timings":{"map_full_ms":2.0,"end_to_end_ms":1.0},"metrics":null}"#;
        match serde_json::from_str::<Event>(line).unwrap() {
            Event::SwitchMeasured {
                yielded_to,
                stopped,
                timings,
                ..
            } => {
                assert!(yielded_to.is_empty() && stopped.is_none());
                assert_eq!(timings.map_full_ms, Some(2.0));
                assert_eq!(timings.reprefill_full_ms, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cosine_summaries_of_no_layers_are_none() {
        let m = SwitchMetrics {
            attention_cosine: vec![],
            r2_k: vec![],
            r2_v: vec![],
            key_error_concentration: vec![],
            top1_agreement: None,
            kl: None,
        };
        assert_eq!(m.cosine_mean(), None);
        assert_eq!(m.cosine_min(), None);
    }
}

//! What the engine tells its callers.

use super::float;
use super::ids::ModelName;
use super::kinds::{CacheOrigin, MapperInfo, ModelInfo, PathKind, PlanText, StopKind};
use super::measures::{
    GateDecision, GenerationTimings, MapperState, SwitchEstimate, SwitchMetrics, SwitchTimings,
};
use serde::{Deserialize, Serialize};

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
    /// A model starts answering on one path. `repaired`: while the background repair of
    /// the cache answered over is underway, how many of its first positions are the
    /// model's own prefill; the answer depends on it, so a replay repairs as far before
    /// the same turn. (Session format 1.5 on.)
    TurnStarted {
        turn: u32,
        path: PathKind,
        model: ModelName,
        cache: CacheOrigin,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repaired: Option<usize>,
    },
    /// One streamed token; not recorded, [`Event::Generation`] sums them up.
    Token {
        turn: u32,
        path: PathKind,
        text: String,
        id: u32,
    },
    /// How much of the turn's new input (`total` ids: the message, with what the
    /// template adds) the model on `path` has read before its first token. Sent after
    /// each prefill chunk, only for input longer than one chunk. Not recorded: the
    /// prefill's time is in [`Event::Generation`].
    PrefillProgress {
        turn: u32,
        path: PathKind,
        done: usize,
        total: usize,
    },
    /// One path's complete answer to a turn.
    Generation {
        turn: u32,
        path: PathKind,
        model: ModelName,
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
    Switch(SwitchEvent),
    /// The target re-read part of switch `index`'s mapped history when the message of
    /// `turn` arrived, before answering it: the spans chosen with the message known, and
    /// the time it took, choosing (`select_ms`), computing the layers the plan names
    /// (`layers_ms`) and re-reading (`reread_ms`). The message waited for all of them:
    /// they are part of the handoff's cost.
    SwitchReread {
        index: u32,
        turn: u32,
        /// The setting, as `20%:source-attention:word`.
        setting: String,
        /// Positions re-read, of the `context_tokens` handed over.
        positions: usize,
        context_tokens: usize,
        /// The spans re-read, `[start, end)` each, in increasing order.
        spans: Vec<[usize; 2]>,
        /// The text of each span, so that a reader sees which words were read again.
        #[serde(default)]
        texts: Vec<String>,
        #[serde(with = "float")]
        select_ms: f64,
        #[serde(with = "float")]
        reread_ms: f64,
        /// The spans dropped from attention, `[start, end)` each (session format 1.5
        /// on; none before): every other mapped position not re-read stays mapped.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dropped: Vec<[usize; 2]>,
        /// The plan was predicted to cost at least the re-prefill it replaces, so the
        /// target re-read every mapped position instead (the re-prefill of the mapped
        /// part) and chose nothing.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reprefilled: bool,
        /// The whole context in order, each run of text marked with what the plan made
        /// of it (session format 1.5 on; empty before).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        parts: Vec<PlanText>,
        /// What the guard predicted before the plan ran, in milliseconds at the target's
        /// measured speed: the plan (choosing and re-reading) and the re-prefill of every
        /// position it may re-read, which it replaces (absent where
        /// no speed was measured yet), beside `select_ms` and `reread_ms`, what it cost
        /// (session minor 7 on).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::option"
        )]
        predicted_ms: Option<f64>,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::option"
        )]
        reprefill_predicted_ms: Option<f64>,
        /// Where the plan names layers (`upper=M` or `lower=M` in its setting): the
        /// positions the target computed those layers of itself, and the time it took,
        /// before the re-read; part of the handoff's cost (session minor 9 on).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layer_positions: Option<usize>,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::option"
        )]
        layers_ms: Option<f64>,
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
    /// `yielded_to` lists the turns that went first. A switch goes first too: the
    /// measurement then keeps its own copy of the positions it measures, which the
    /// switch rebuilds, so it measures the cache as it was handed over; measurements
    /// run in the order of their switches. `stopped` says why it ended early (a cancel, an error); `metrics` is then `None`
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
        from: ModelName,
        to: ModelName,
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
    /// The mapper `from -> to` read one more window of calibration text while the
    /// workbench was idle, and weighed it as learning weighs an update: `accepted` when
    /// the held-out cosine did not drop (`before` → `after`), and it is then the mapper
    /// in use. `windows` of `full` are now read (the first run's included); at `full` it
    /// has read as much text as the full calibration and stops. `kept`: saved for the
    /// next session. (Session format 1.6 on.)
    BackgroundCalibration {
        from: ModelName,
        to: ModelName,
        windows: usize,
        full: usize,
        accepted: bool,
        #[serde(with = "float")]
        before: f64,
        #[serde(with = "float")]
        after: f64,
        kept: bool,
    },
    /// How far the background repair of `model`'s cache got: its first `repaired`
    /// positions of `total` are its own prefill, the rest as they were (mapped, or
    /// computed over mapped positions). Not recorded; [`Event::CacheRepaired`] sums it up.
    RepairProgress {
        model: ModelName,
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
        model: ModelName,
        repaired: usize,
        total: usize,
        complete: bool,
        #[serde(with = "float")]
        after_switch_ms: f64,
        #[serde(with = "float")]
        compute_ms: f64,
    },
    /// A setting changed mid-session (the workbench's Ctrl-E, Ctrl-T, Ctrl-R, Ctrl-P, a
    /// script's step): `setting` is its key in the session header's settings (`reread`,
    /// `reference`, `repair`) and `value` what it became (`40%:facts:word`, `off`, `on`),
    /// from `turn` (the last turn started) on. A replay sends the same change at the same
    /// step. (Session format 1.8 on; older files say it only in a notice.)
    SettingChanged {
        #[serde(default)]
        turn: u32,
        setting: String,
        #[serde(default)]
        value: String,
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

/// A handoff from one model to another; the fields sit flat in the tagged event object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchEvent {
    pub index: u32,
    pub turn: u32,
    pub from: ModelName,
    pub to: ModelName,
    pub context_tokens: usize,
    pub suffix_tokens: usize,
    pub timings: SwitchTimings,
    pub metrics: Option<SwitchMetrics>,
    pub gate: Option<GateDecision>,
    #[serde(default)]
    pub measurement_follows: bool,
    /// The estimate made without a re-prefill (session format 1.2 on).
    #[serde(default)]
    pub estimate: Option<SwitchEstimate>,
    /// The state of the mapper the handoff used (session format 1.3 on; `None` in
    /// older files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper: Option<MapperState>,
    /// The re-read the target will make at the first message, as
    /// `20%:source-attention:word` (session format 1.4 on; `None`: it answers from
    /// the map as handed over). What it re-read is [`Event::SwitchReread`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reread: Option<String>,
}

/// The settings an [`Event::SettingChanged`] names, by their keys in the session
/// header's settings, and the values of the switches among them.
pub mod setting {
    pub const REREAD: &str = "reread";
    pub const REFERENCE: &str = "reference";
    pub const REPAIR: &str = "repair";
    pub const ON: &str = "on";
    pub const OFF: &str = "off";
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
        "prefill_progress",
        "generation",
        "switch",
        "switch_reread",
        "switch_measured",
        "turn_comparison",
        "switch_follow_up",
        "mapper_learned",
        "background_calibration",
        "repair_progress",
        "cache_repaired",
        "setting_changed",
        "notice",
        "bookmark",
        "error",
        "done",
        "shut_down",
    ];

    /// Whether a session file keeps this event. Streamed tokens and prefill progress are
    /// summed up by `Generation` and loading progress by `Ready`; they would only bloat
    /// the file.
    pub fn is_recorded(&self) -> bool {
        !matches!(
            self,
            Event::Token { .. }
                | Event::PrefillProgress { .. }
                | Event::Loading { .. }
                | Event::RepairProgress { .. }
        )
    }

    /// The turn the event belongs to, for those that belong to one.
    pub fn turn(&self) -> Option<u32> {
        match self {
            Event::UserMessage { turn, .. }
            | Event::TurnStarted { turn, .. }
            | Event::Token { turn, .. }
            | Event::PrefillProgress { turn, .. }
            | Event::Generation { turn, .. }
            | Event::Switch(SwitchEvent { turn, .. })
            | Event::SwitchMeasured { turn, .. }
            | Event::TurnComparison { turn, .. }
            | Event::SwitchFollowUp { turn, .. }
            | Event::SwitchReread { turn, .. }
            | Event::MapperLearned { turn, .. }
            | Event::CacheRepaired { turn, .. }
            | Event::Bookmark { turn, .. }
            | Event::SettingChanged { turn, .. }
            | Event::Done { turn } => Some(*turn),
            Event::Loading { .. }
            | Event::Ready { .. }
            | Event::BackgroundCalibration { .. }
            | Event::RepairProgress { .. }
            | Event::Notice { .. }
            | Event::Error { .. }
            | Event::ShutDown => None,
        }
    }
}

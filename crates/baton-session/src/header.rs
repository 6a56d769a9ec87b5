//! The first line of a session file and the envelope of every line after it.

use super::clock::UtcTime;
use baton_protocol::{Event, MapperInfo, ModelInfo};
use serde::{Deserialize, Serialize};

/// The `format` value that marks a baton session file.
pub const FORMAT: &str = "baton-session";
/// The layout version this baton writes and reads; a reader refuses any other.
pub const VERSION: u32 = 1;
/// Additions within [`VERSION`], each readable by a reader of an earlier one (which skips
/// event types it does not know). This baton reads every minor version of its layout.
///
/// - 0: a `switch` event carries every measurement of the switch; `switch_follow_up`'s
///   `end_to_end_ms` is the handoff plus the next turn's time to first token.
/// - 1: a `switch` event with `measurement_follows` is the handoff alone, and a
///   `switch_measured` event with the same index brings the rest, often after the next
///   turn; `switch_follow_up`'s `end_to_end_ms` runs from the message reaching the
///   engine to the target's first token.
/// - 2: `mapper_learned` events say what a mapper learned from the conversation.
/// - 3: a `switch` event says which state of its mapper it used (`mapper`): a switch
///   no longer waits for learning, so the state depends on what had finished.
/// - 4: a `switch` event names the re-read it will make (`reread`), and a
///   `switch_reread` event says what the target re-read at the next message.
/// - 5: a `turn_started` event over a cache being repaired says how far the repair had
///   got (`repaired`), and every repair a session starts ends with `cache_repaired`
///   (also one cut short before its first chunk, or by the end of the session).
/// - 6: `background_calibration` events say what a mapper took from the calibration
///   text it read while the workbench was idle.
/// - 7: a `switch_reread` event says what the guard predicted the plan and the
///   re-prefill it replaces would cost (`predicted_ms`, `reprefill_predicted_ms`), and
///   its plan may re-read positions mapped at an earlier switch (any the target never
///   computed); its `index` is the latest switch to the model, whose plan it is.
/// - 8: a `setting_changed` event records a setting changed mid-session (the plan, the
///   reference path, repair), so a replay makes the same change at the same step; before
///   it only a notice said so.
/// - 9: a plan may name layers (`upper=M`, `lower=M` at the end of its setting), and its
///   `switch_reread` event says over how many positions the target computed them and
///   how long that took (`layer_positions`, `layers_ms`).
pub const MINOR: u32 = 9;

/// Line 1 of a session file: which build, models, mappers and settings produced it, so a
/// report or a replay can tell whether it is looking at comparable runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionHeader {
    pub format: String,
    pub version: u32,
    /// See [`MINOR`]; absent (0) in files written before there was one.
    #[serde(default)]
    pub minor: u32,
    /// When the session started, RFC 3339 in UTC.
    pub created: String,
    pub baton_version: String,
    pub models: Vec<ModelInfo>,
    pub mappers: Vec<MapperInfo>,
    pub device: String,
    /// Whatever the caller ran with (sampling, gate threshold, ...), kept as given.
    #[serde(default)]
    pub settings: serde_json::Value,
}

impl SessionHeader {
    /// A header for a session starting now, in this baton's format.
    pub fn new(
        models: Vec<ModelInfo>,
        mappers: Vec<MapperInfo>,
        device: impl Into<String>,
        settings: serde_json::Value,
    ) -> Self {
        Self {
            format: FORMAT.into(),
            version: VERSION,
            minor: MINOR,
            created: UtcTime::now().rfc3339(),
            baton_version: env!("CARGO_PKG_VERSION").into(),
            models,
            mappers,
            device: device.into(),
            settings,
        }
    }

    /// The header for the session an engine's `Ready` event opens; `None` for any
    /// other event.
    pub fn from_ready(event: &Event, settings: serde_json::Value) -> Option<Self> {
        match event {
            Event::Ready {
                models,
                mappers,
                device,
                ..
            } => Some(Self::new(
                models.clone(),
                mappers.clone(),
                device.clone(),
                settings,
            )),
            _ => None,
        }
    }
}

/// One event as a session file holds it: `seq` counts recorded events from 0 and `t_ms`
/// is the time since the session file was created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    pub seq: u64,
    pub t_ms: f64,
    pub event: Event,
}

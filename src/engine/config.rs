//! What the engine is started with.

use crate::calibrate::CalibrateOptions;
use crate::model::Sampling;
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Settings that shape a conversation; recorded in the session header so that a replay
/// runs under the same ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Run the re-prefilled reference path after each switch.
    pub reference: bool,
    /// Re-prefill instead of mapping when the fidelity estimate is below this.
    pub gate: Option<f64>,
    /// Map the inactive model's cache after every turn, so a switch finds it ready.
    pub premap: bool,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub system_prompt: Option<String>,
    /// Query positions per switch for the attention-output cosine.
    pub probes: usize,
    /// Leading positions a model computes itself instead of receiving them mapped, the
    /// first time it takes over (the template's opening, which attention leans on
    /// heavily; a server keeps it cached for every model anyway).
    #[serde(default)]
    pub anchor: usize,
    /// The newest positions of the conversation the target reads itself at a switch
    /// instead of receiving them mapped: the handoff then costs their prefill, and the
    /// facts said last reach the target as it would have read them.
    #[serde(default)]
    pub tail: usize,
    /// Learn from the conversation at every measured switch (reference path on): both
    /// models' own caches are added to the mappers' statistics and solved again in the
    /// background; an update is taken only if its held-out cosine does not drop.
    #[serde(default)]
    pub learn: bool,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions chunk by chunk.
    /// Off by default, so that drift is studied on the mapped cache as it is.
    #[serde(default)]
    pub repair: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            reference: true,
            gate: None,
            premap: false,
            max_tokens: 256,
            sampling: Sampling::greedy(),
            system_prompt: None,
            probes: 32,
            anchor: crate::mapper::DEFAULT_ANCHOR,
            tail: 0,
            learn: false,
            repair: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The two models (manifest names, paths or hub references); the first starts active.
    pub models: [String; 2],
    pub device: Device,
    /// Where mapper artifacts are found (None: the cache dir's mappers/).
    pub mapper_dir: Option<PathBuf>,
    /// When a direction has no artifact: calibrate one with these options (a quick first
    /// run) instead of failing.
    pub calibrate_missing: Option<CalibrateOptions>,
    pub settings: Settings,
    /// Record the session to this file.
    pub record: Option<PathBuf>,
    /// Where learning keeps what it learns and what it starts from (with
    /// `settings.learn`).
    pub learning: super::learning::LearnSetup,
}

impl EngineConfig {
    pub fn new(models: [String; 2], device: Device) -> Self {
        Self {
            models,
            device,
            mapper_dir: None,
            calibrate_missing: None,
            settings: Settings::default(),
            record: None,
            learning: Default::default(),
        }
    }
}

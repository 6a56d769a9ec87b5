//! What the engine is started with.

use super::setting_checks;
use baton_data::corpus::Document;
use baton_method::calibrate::CalibrateOptions;
use baton_method::handoff::reread::RereadSetting;
use baton_method::mapper::dir::MapperDir;
use baton_runtime::model::{Compute, Sampling};
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
    /// background; an update is taken only if its held-out cosine does not drop. On by
    /// default; a session header without it was recorded before learning existed, and
    /// reads as off.
    #[serde(default)]
    pub learn: bool,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions chunk by chunk.
    /// Off by default, so that drift is studied on the mapped cache as it is.
    #[serde(default)]
    pub repair: bool,
    /// At the first message after a switch, the target re-reads part of the mapped
    /// history before it answers, chosen with the message known (see
    /// [`baton_method::handoff::reread`]). `None`: it answers from the map as handed over (and
    /// every session header written before the re-read existed reads so).
    #[serde(default)]
    pub reread: Option<RereadSetting>,
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
            anchor: baton_method::mapper::DEFAULT_ANCHOR,
            tail: 0,
            learn: true,
            repair: false,
            reread: DEFAULT_REREAD,
        }
    }
}

/// The plan a conversation starts with, the best point of the measured curve at about
/// half the re-prefill's time (docs/plan.md; no point meets every target): on a switch
/// up, re-read the 40% of the mapped history past the opening that the message asks
/// about (`facts`: its own words found in the history, numbers and names, and what the
/// smaller model's heads seek out as it reads the message) and keep the rest mapped;
/// on a switch down no plan cheaper than the re-prefill keeps the smaller model's
/// answer, so the map is handed over as it is. Dropping the rest instead answers the
/// recall suite better at less cost, but loses worked examples on GSM8K and the facts
/// of a short note; dropping it only for a question about the history (`focus` at 30%)
/// keeps the note's facts but not GSM8K's accuracy, and answers the recall suite's
/// second half worse (docs/plan.md).
pub const DEFAULT_REREAD: Option<RereadSetting> = Some(RereadSetting::DEFAULT);

impl Settings {
    /// These settings with what `o` sets put over them; what it leaves out stays.
    pub fn apply(&mut self, o: &SettingsOverrides) {
        let SettingsOverrides {
            max_tokens,
            gate,
            premap,
            reference,
            tail,
            learn,
            repair,
            reread,
            system,
        } = o;
        if let Some(v) = *max_tokens {
            self.max_tokens = v;
        }
        if let Some(v) = *gate {
            self.gate = Some(v);
        }
        if let Some(v) = *premap {
            self.premap = v;
        }
        if let Some(v) = *reference {
            self.reference = v;
        }
        if let Some(v) = *tail {
            self.tail = v;
        }
        if let Some(v) = *learn {
            self.learn = v;
        }
        if let Some(v) = *repair {
            self.repair = v;
        }
        if let Some(v) = reread {
            self.reread = v.0;
        }
        if let Some(v) = system {
            self.system_prompt = Some(v.clone());
        }
    }
}

/// The settings a conversation may be started with, each one left out or set: the flags
/// of `baton workbench`, `baton demo` and `baton run`, and the top-level keys of a script
/// (see [`crate::headless::script`]). What is left out keeps its value in
/// [`Settings::default`]; [`Settings::apply`] puts the rest over it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsOverrides {
    /// Longest answer, in tokens (default 256).
    #[serde(default, deserialize_with = "setting_checks::max_tokens_key")]
    pub max_tokens: Option<usize>,
    /// Re-prefill instead of mapping when the switch's fidelity estimate (mean
    /// attention cosine, -1 to 1) is below this.
    #[serde(default, deserialize_with = "setting_checks::gate_key")]
    pub gate: Option<f64>,
    /// Map the inactive model's cache after every turn, so a switch finds it ready.
    pub premap: Option<bool>,
    /// Start with the re-prefilled reference path off (Ctrl-R toggles it); a script's
    /// `reference = false`.
    pub reference: Option<bool>,
    /// At a switch, the target reads the newest N tokens of the conversation itself
    /// instead of receiving them mapped: a longer handoff for the facts said last
    /// (default 0).
    pub tail: Option<usize>,
    /// Do not learn from the conversation: the mappers stay as calibrated (what they
    /// learned in earlier sessions is not used either); a script's `learn = false`.
    pub learn: Option<bool>,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions (Ctrl-P toggles).
    pub repair: Option<bool>,
    /// At the first message after a switch the target re-reads this much of the mapped
    /// history before answering: a share (0.2 or 20%) or a time (150ms), optionally with
    /// the selector and span growth (0.2:source-attention:word); 0 or off for none. A
    /// script's `reread = 0.2` or `reread = "150ms"`.
    pub reread: Option<RereadOverride>,
    /// The system prompt the conversation starts with.
    pub system: Option<String>,
}

/// A re-read setting given as a flag (`workbench`, `run`, `eval`, `bench`) or a script
/// key: `None` inside turns it off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RereadOverride(pub Option<RereadSetting>);

impl std::str::FromStr for RereadOverride {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        RereadSetting::parse(s).map(Self).map_err(|e| e.to_string())
    }
}

impl Serialize for RereadOverride {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(r) => s.serialize_str(&r.to_string()),
            None => s.serialize_str("off"),
        }
    }
}

impl<'de> Deserialize<'de> for RereadOverride {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A script may write the share as a number (`reread = 0.2`); whatever it wrote
        // goes through the flag's parser.
        setting_checks::reread_text(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A count that must be at least 1 (0 would mean nothing to do, or divide by zero); a
/// value parser for flags.
pub fn at_least_one(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{v}` is not a count: {e}")),
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The two models (manifest names, paths or hub references); the first starts active.
    pub models: [String; 2],
    pub device: Device,
    /// The models' activations and attention path.
    pub compute: Compute,
    /// Where mapper artifacts are found, and what is learned is kept.
    pub mapper_dir: MapperDir,
    /// When a direction has no artifact: calibrate one with these options (a quick first
    /// run) instead of failing.
    pub calibrate_missing: Option<CalibrateOptions>,
    pub settings: Settings,
    /// Record the session to this file.
    pub record: Option<PathBuf>,
    /// Where learning keeps what it learns and what it starts from (with
    /// `settings.learn`).
    pub learning: LearnSetup,
    /// Repair only as far as [`baton_protocol::Command::RepairTo`] says, never while
    /// idle (a replay's answers then depend on no timing).
    pub paced_repair: bool,
}

impl EngineConfig {
    pub fn new(models: [String; 2], device: Device) -> Self {
        Self {
            models,
            device,
            compute: Compute::default(),
            mapper_dir: MapperDir::default_location(),
            calibrate_missing: None,
            settings: Settings::default(),
            record: None,
            learning: Default::default(),
            paced_repair: false,
        }
    }
}

/// How the engine learns, beyond whether it does (`Settings::learn`).
#[derive(Debug, Clone)]
pub struct LearnSetup {
    /// Keep what is learned beside the artifacts, for the next session to start from.
    pub keep: bool,
    /// Start from what earlier sessions learned (else from the calibration alone).
    pub use_learned: bool,
    /// The text the fixed calibration slice is cut from (None: the default corpus),
    /// and background calibration's windows.
    pub slice_docs: Option<Vec<Document>>,
    /// Read further calibration windows while idle, up to the full calibration's text
    /// (the workbench; never a scripted run, whose answers must not depend on timing).
    pub background_calibration: bool,
}

impl Default for LearnSetup {
    fn default() -> Self {
        Self {
            keep: true,
            use_learned: true,
            slice_docs: None,
            background_calibration: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_what_they_set_and_keep_the_rest() {
        let mut s = Settings::default();
        assert!(s.learn && s.reference && !s.premap && !s.repair);
        s.apply(&SettingsOverrides::default());
        assert_eq!(s, Settings::default());
        s.apply(&SettingsOverrides {
            learn: Some(false),
            tail: Some(16),
            system: Some("hi".into()),
            ..Default::default()
        });
        assert!(!s.learn);
        assert_eq!(s.tail, 16);
        assert_eq!(s.system_prompt.as_deref(), Some("hi"));
        assert_eq!(s.max_tokens, Settings::default().max_tokens);
        s.apply(&SettingsOverrides {
            reread: Some("0.3:round-trip".parse().unwrap()),
            ..Default::default()
        });
        assert_eq!(s.reread.unwrap().to_string(), "30%:round-trip:word");
        s.apply(&SettingsOverrides {
            reread: Some("off".parse().unwrap()),
            ..Default::default()
        });
        assert_eq!(s.reread, None);
    }

    #[test]
    fn a_script_gives_the_reread_as_a_number_or_a_string_and_a_bad_one_is_named() {
        let o: SettingsOverrides = toml::from_str("reread = 0.25").unwrap();
        assert_eq!(o.reread.unwrap().0.unwrap().to_string(), "25%:facts:word");
        let o: SettingsOverrides = toml::from_str("reread = \"100ms:deviation\"").unwrap();
        assert_eq!(
            o.reread.unwrap().0.unwrap().to_string(),
            "100ms:deviation:word"
        );
        let e = toml::from_str::<SettingsOverrides>("reread = 3").unwrap_err();
        assert!(e.to_string().contains("re-read budget"), "{e}");
    }
}

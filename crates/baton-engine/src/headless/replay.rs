//! Running a conversation without a screen: a script's steps, or a recorded session's
//! commands replayed on this build with the settings it was recorded under, so its
//! numbers can be compared with the recording's.

use super::recorded::{recorded_commands, RecordedCommands};
use super::script::{self, ScriptError};
use crate as engine;
use crate::{EngineConfig, Settings};
use baton_fetch::Manifest;
use baton_protocol::{Command, Event, ModelInfo};
use baton_session::Session;
use candle_core::Device;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{path} names {count} models, a replay needs two")]
    ModelCount { path: String, count: usize },
    #[error("{path}: the header's settings are not this baton's ({reason}); replay it with the baton that recorded it")]
    Settings { path: String, reason: String },
    #[error(transparent)]
    Fetch(#[from] baton_fetch::FetchError),
}

/// The engine set-up that replays `recorded` (read from `path`) on `device`: the same
/// two models and the same settings. Manifest names resolve anywhere; a model opened
/// from a path is looked for at that path again.
pub fn replay_config(
    recorded: &Session,
    path: &Path,
    device: Device,
) -> Result<EngineConfig, ReplayError> {
    let models = &recorded.header.models;
    if models.len() != 2 {
        return Err(ReplayError::ModelCount {
            path: path.display().to_string(),
            count: models.len(),
        });
    }
    let manifest = Manifest::builtin()?;
    let spec = |m: &ModelInfo| match manifest.entry(m.name.as_str()) {
        Some(_) => m.name.to_string(),
        None => m.path.clone(),
    };
    let mut cfg = EngineConfig::new([spec(&models[0]), spec(&models[1])], device);
    cfg.paced_repair = true;
    cfg.settings =
        serde_json::from_value::<Settings>(recorded.header.settings.clone()).map_err(|e| {
            ReplayError::Settings {
                path: path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
    Ok(cfg)
}

/// The commands that produced `recorded`, in order.
pub fn replay_steps(recorded: &Session) -> Vec<Command> {
    replay_commands(recorded).commands
}

/// The commands that produced `recorded`, in order, with the settings changes among them
/// (each at the step it was made), and the changes a replay cannot make.
pub fn replay_commands(recorded: &Session) -> RecordedCommands {
    let events: Vec<Event> = recorded.events().cloned().collect();
    recorded_commands(&events)
}

/// Starts an engine on `cfg`, waits for it to be ready, sends `steps` one by one (each
/// after the previous one completed) and shuts it down; every event goes to `on_event`.
pub fn run_headless(
    cfg: EngineConfig,
    steps: &[Command],
    on_event: &mut dyn FnMut(&Event),
) -> Result<Ran, ScriptError> {
    let mut ran = Ran::default();
    let on_event = &mut |e: &Event| {
        if let Event::Error { message, .. } = e {
            ran.errors.push(message.clone());
        }
        on_event(e)
    };
    let handle = engine::spawn(cfg);
    script::wait_ready(&handle.events, on_event)?;
    tracing::info!(steps = steps.len(), "running headless steps");
    script::run_steps(steps, &|c| handle.send(c), &handle.events, on_event)?;
    // What the last switch started (its measurement, learning, a repair) belongs in the
    // session too.
    script::run_steps(
        &[Command::Finish],
        &|c| handle.send(c),
        &handle.events,
        on_event,
    )?;
    handle.shutdown();
    Ok(ran)
}

/// How a headless run went: the errors the engine reported on the way (a turn or a
/// switch that failed, a recording that stopped). The run goes on after each, as the
/// workbench does, but a caller that checks a script must fail when any came.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ran {
    pub errors: Vec<String>,
}

impl Ran {
    pub fn failed(&self) -> bool {
        !self.errors.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_session::fixtures;

    #[test]
    fn a_replay_uses_the_recorded_settings_and_models() {
        let mut s = fixtures::session();
        let mut want = Settings::default();
        want.max_tokens = 7;
        want.reference = !want.reference;
        s.header.settings = serde_json::to_value(&want).unwrap();
        let cfg = replay_config(&s, Path::new("s.jsonl"), Device::Cpu).unwrap();
        assert_eq!(cfg.settings, want);
        // Names not in the manifest are looked for at their recorded paths.
        assert_eq!(
            cfg.models.to_vec(),
            s.header
                .models
                .iter()
                .map(|m| m.path.clone())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn settings_of_another_build_are_refused_by_name() {
        let s = fixtures::session();
        let e = replay_config(&s, Path::new("s.jsonl"), Device::Cpu).unwrap_err();
        assert!(matches!(e, ReplayError::Settings { .. }), "{e}");
        assert!(e.to_string().contains("s.jsonl"), "{e}");
    }

    #[test]
    fn a_session_with_one_model_cannot_be_replayed() {
        let mut s = fixtures::session();
        s.header.models.truncate(1);
        let e = replay_config(&s, Path::new("s.jsonl"), Device::Cpu).unwrap_err();
        assert!(e.to_string().contains("names 1 models"), "{e}");
    }

    #[test]
    fn the_steps_of_a_recording_are_its_messages_and_switches_in_order() {
        let steps = replay_steps(&fixtures::session());
        assert!(
            matches!(steps.first(), Some(Command::Submit { .. })),
            "{steps:?}"
        );
        assert!(
            steps.iter().any(|c| matches!(c, Command::Switch)),
            "{steps:?}"
        );
    }
}

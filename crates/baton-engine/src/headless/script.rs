//! Scripted conversations: a TOML file of user messages and switches (and the settings
//! to run them under) that drives the engine without a terminal UI.
//!
//! ```toml
//! reference = true      # optional settings, see `SettingsOverrides`
//! max_tokens = 96
//! tail = 32            # the target reads the newest 32 tokens itself at a switch
//!
//! [[step]]
//! user = "Write a function that reverses a string."
//!
//! [[step]]
//! switch = true
//!
//! [[step]]
//! bookmark = "first answer after the switch"
//!
//! [[step]]
//! user = "What was the salary again?"
//! expect = ["48,000", "48000 dollars"]   # answers a study scores this turn against
//! ```

use crate::SettingsOverrides;
use baton_protocol::{Command, Event};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::mpsc::Receiver;

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("script {path} is not valid TOML for a baton script: {reason}")]
    Parse { path: String, reason: String },
    #[error("script step {index}: {reason}")]
    Step { index: usize, reason: String },
    #[error("the engine stopped: {0}")]
    Engine(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    user: Option<String>,
    switch: Option<bool>,
    bookmark: Option<String>,
    reference: Option<bool>,
    expect: Option<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// The settings at the top of the file.
    pub settings: SettingsOverrides,
    pub steps: Vec<Command>,
    /// Expected answers by turn (the n-th user message is turn n), where a step gives
    /// them.
    pub expected: std::collections::BTreeMap<u32, Vec<String>>,
}

impl Script {
    pub fn parse(text: &str, path: &str) -> Result<Self, ScriptError> {
        let bad = |reason: String| ScriptError::Parse {
            path: path.to_string(),
            reason,
        };
        // The settings sit at the top level beside the steps. serde's flatten would accept
        // a misspelled setting silently, so the steps are taken out and the rest is read
        // as the settings, which refuse an unknown key.
        let mut table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let raw_steps: Vec<RawStep> = match table.remove("step") {
            Some(v) => v.try_into().map_err(|e| bad(format!("[[step]]: {e}")))?,
            None => Vec::new(),
        };
        let settings: SettingsOverrides = toml::Value::Table(table)
            .try_into()
            .map_err(|e| bad(e.to_string()))?;
        let mut steps = Vec::with_capacity(raw_steps.len());
        let mut expected = std::collections::BTreeMap::new();
        let mut turn = 0u32;
        for (i, s) in raw_steps.into_iter().enumerate() {
            let index = i + 1;
            let mut found = Vec::new();
            if let Some(answers) = s.expect {
                if s.user.is_none() {
                    return Err(ScriptError::Step {
                        index,
                        reason: "`expect` goes on the `user` step whose answer it is".into(),
                    });
                }
                if answers.is_empty() || answers.iter().any(|a| a.trim().is_empty()) {
                    return Err(ScriptError::Step {
                        index,
                        reason: "`expect` needs one or more non-empty answers".into(),
                    });
                }
                expected.insert(turn + 1, answers);
            }
            if let Some(text) = s.user {
                turn += 1;
                if text.trim().is_empty() {
                    return Err(ScriptError::Step {
                        index,
                        reason: "`user` is empty: give the message text".into(),
                    });
                }
                found.push(Command::Submit { text });
            }
            if let Some(sw) = s.switch {
                if !sw {
                    return Err(ScriptError::Step {
                        index,
                        reason: "`switch = false` does nothing: remove the step or write `switch = true`".into(),
                    });
                }
                found.push(Command::Switch);
            }
            if let Some(note) = s.bookmark {
                found.push(Command::Bookmark { note });
            }
            if let Some(enabled) = s.reference {
                found.push(Command::SetReference { enabled });
            }
            if found.len() != 1 {
                return Err(ScriptError::Step {
                    index,
                    reason: format!(
                        "a step holds exactly one of `user`, `switch`, `bookmark`, `reference` (found {})",
                        found.len()
                    ),
                });
            }
            steps.extend(found);
        }
        if steps.is_empty() {
            return Err(ScriptError::Parse {
                path: path.to_string(),
                reason: "no [[step]] entries: add at least one `[[step]] user = \"...\"`".into(),
            });
        }
        Ok(Self {
            settings,
            steps,
            expected,
        })
    }

    /// The demo conversation, built in so `baton demo` works from any directory.
    pub fn demo() -> Result<Self, ScriptError> {
        Self::parse(
            include_str!("../../../../assets/demo.toml"),
            "assets/demo.toml",
        )
    }

    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScriptError::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        Self::parse(&text, &path.display().to_string())
    }
}

/// Wait for the engine to be ready; every event seen is passed to `on_event`.
pub fn wait_ready(
    events: &Receiver<Event>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<(), ScriptError> {
    loop {
        let e = events
            .recv()
            .map_err(|_| ScriptError::Engine("the engine thread ended".into()))?;
        on_event(&e);
        match e {
            Event::Ready { .. } => return Ok(()),
            Event::Error {
                message,
                fatal: true,
            } => return Err(ScriptError::Engine(message)),
            _ => {}
        }
    }
}

/// Send each step and wait for what completes it. A non-fatal error in a step is
/// reported through `on_event` and the script goes on; a fatal one ends it. A switch
/// step completes at its handoff, as a user would go on typing; its measurement runs
/// when the engine is next idle, and the script waits for every one before it ends, so
/// that the session records them all.
pub fn run_steps(
    steps: &[Command],
    send: &dyn Fn(Command),
    events: &Receiver<Event>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<(), ScriptError> {
    let mut unmeasured = BTreeSet::new();
    let mut next = |unmeasured: &mut BTreeSet<u32>| -> Result<Event, ScriptError> {
        let e = events
            .recv()
            .map_err(|_| ScriptError::Engine("the engine thread ended".into()))?;
        on_event(&e);
        match &e {
            Event::Error {
                message,
                fatal: true,
            } => return Err(ScriptError::Engine(message.clone())),
            Event::Switch(baton_protocol::SwitchEvent {
                index,
                measurement_follows: true,
                ..
            }) => {
                unmeasured.insert(*index);
            }
            Event::SwitchMeasured { index, .. } => {
                unmeasured.remove(index);
            }
            _ => {}
        }
        Ok(e)
    };
    for cmd in steps {
        send(cmd.clone());
        while !cmd.answered_by(&next(&mut unmeasured)?) {}
    }
    while !unmeasured.is_empty() {
        next(&mut unmeasured)?;
    }
    Ok(())
}

pub use super::recorded::session_commands;

#[cfg(test)]
mod tests {
    use super::*;
    use baton_protocol::PathKind;

    #[test]
    fn a_recorded_repair_becomes_a_repair_as_far_before_the_same_step() {
        use baton_protocol::CacheOrigin;
        let started = |turn, repaired| Event::TurnStarted {
            turn,
            path: PathKind::Mapped,
            model: "b".into(),
            cache: CacheOrigin::Mapped,
            repaired,
        };
        let repaired = |repaired, complete| Event::CacheRepaired {
            index: 0,
            turn: 2,
            model: "b".into(),
            repaired,
            total: 300,
            complete,
            after_switch_ms: 1.0,
            compute_ms: 1.0,
        };
        let said = |turn: u32| Event::UserMessage {
            turn,
            text: format!("m{turn}"),
        };
        let events = vec![
            said(2),
            started(2, Some(128)),
            repaired(300, true),
            said(3),
            started(3, None),
            repaired(40, false),
            Event::Notice {
                message: "b is active; there was no conversation to hand over".into(),
            },
        ];
        let submit = |t: u32| Command::Submit {
            text: format!("m{t}"),
        };
        assert_eq!(
            session_commands(&events),
            vec![
                Command::RepairTo { positions: 128 },
                submit(2),
                Command::RepairTo { positions: 300 },
                submit(3),
                Command::RepairTo { positions: 40 },
                Command::Switch,
            ]
        );
    }

    #[test]
    fn the_built_in_demo_parses_and_talks_and_switches() {
        let demo = Script::demo().unwrap();
        assert!(demo
            .steps
            .iter()
            .any(|c| matches!(c, Command::Submit { .. })));
        assert!(demo.steps.iter().any(|c| matches!(c, Command::Switch)));
    }

    #[test]
    fn a_script_parses_into_settings_and_commands() {
        let s = Script::parse(
            "reference = false\nmax_tokens = 12\n[[step]]\nuser = \"hi\"\n[[step]]\nswitch = true\n[[step]]\nbookmark = \"b\"\n[[step]]\nreference = true\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(s.settings.reference, Some(false));
        assert_eq!(s.settings.max_tokens, Some(12));
        assert_eq!(
            s.steps,
            vec![
                Command::Submit { text: "hi".into() },
                Command::Switch,
                Command::Bookmark { note: "b".into() },
                Command::SetReference { enabled: true },
            ]
        );
        let mut settings = crate::Settings::default();
        settings.apply(&s.settings);
        assert!(!settings.reference);
        assert_eq!(settings.max_tokens, 12);
    }

    #[test]
    fn every_setting_a_script_may_set_is_read_and_a_misspelled_one_is_named() {
        let s = Script::parse(
            "reference = false\ngate = 0.9\npremap = true\nmax_tokens = 12\nsystem = \"be brief\"\ntail = 32\nlearn = false\nrepair = true\nreread = \"0.2:deviation\"\n[[step]]\nuser = \"hi\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            s.settings,
            SettingsOverrides {
                max_tokens: Some(12),
                gate: Some(0.9),
                premap: Some(true),
                reference: Some(false),
                tail: Some(32),
                learn: Some(false),
                repair: Some(true),
                reread: Some("0.2:deviation".parse().unwrap()),
                system: Some("be brief".into()),
            }
        );
        let e = Script::parse("no_reference = true\n[[step]]\nuser = \"a\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("no_reference"), "{e}");
        let e = Script::parse("tail = \"x\"\n[[step]]\nuser = \"a\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("t is not valid TOML"), "{e}");
    }

    #[test]
    fn a_script_is_checked_as_the_flags_are() {
        use crate::setting_checks::{check_gate, check_max_tokens};
        let parse = |settings: &str| {
            Script::parse(&format!("{settings}\n[[step]]\nuser = \"a\"\n"), "t.toml")
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let e = parse("max_tokens = 0");
        assert!(e.contains(&check_max_tokens(0).unwrap_err()), "{e}");
        let e = parse("gate = 7.5");
        assert!(e.contains(&check_gate(7.5).unwrap_err()), "{e}");
        let e = parse("gate = nan");
        assert!(e.contains("not NaN"), "{e}");
        let e = parse("reread = true");
        assert!(
            e.contains("re-read budget \"true\"") && e.contains("150ms"),
            "{e}"
        );
        let ok = Script::parse(
            "max_tokens = 1\ngate = 1.0\nreread = \"off\"\n[[step]]\nuser = \"a\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(ok.settings.max_tokens, Some(1));
        assert_eq!(ok.settings.gate, Some(1.0));
    }

    #[test]
    fn a_recorded_session_gives_back_its_commands() {
        let events = vec![
            Event::UserMessage {
                turn: 1,
                text: "a".into(),
            },
            Event::Done { turn: 1 },
            Event::Notice {
                message: "reference path off".into(),
            },
            Event::Notice {
                message: "pre-mapped 3 tokens into b in 1.0 ms".into(),
            },
            Event::Bookmark {
                turn: 1,
                note: "n".into(),
            },
            Event::UserMessage {
                turn: 2,
                text: "b".into(),
            },
        ];
        assert_eq!(
            session_commands(&events),
            vec![
                Command::Submit { text: "a".into() },
                Command::SetReference { enabled: false },
                Command::Bookmark { note: "n".into() },
                Command::Submit { text: "b".into() },
            ]
        );
    }

    #[test]
    fn bad_steps_name_the_step_and_the_fix() {
        let e = Script::parse("[[step]]\nuser = \"a\"\nswitch = true\n", "t").unwrap_err();
        assert!(
            e.to_string().contains("step 1") && e.to_string().contains("exactly one"),
            "{e}"
        );
        let e =
            Script::parse("[[step]]\nuser = \"a\"\n[[step]]\nswitch = false\n", "t").unwrap_err();
        assert!(e.to_string().contains("step 2"), "{e}");
        let e = Script::parse("[[step]]\nsay = \"a\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("say"), "{e}");
        let e = Script::parse("max_token = 3\n[[step]]\nuser = \"a\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("max_token"), "{e}");
        let e = Script::parse("max_tokens = 3\n", "t").unwrap_err();
        assert!(e.to_string().contains("no [[step]]"), "{e}");
    }
}

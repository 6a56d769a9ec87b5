//! What a recorded session's events say was asked of the engine: the commands a replay
//! sends again, in order, and the changes the recording made that this baton cannot make.

use baton_method::handoff::reread::RereadSetting;
use baton_protocol::{setting, Command, Event, PathKind};

/// The commands that produced a recorded session, in order: its user messages,
/// switches, bookmarks and setting changes (for a replay on the current build).
pub fn session_commands(events: &[Event]) -> Vec<Command> {
    recorded_commands(events).commands
}

/// A recording's commands, and what it changed that a replay cannot change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordedCommands {
    pub commands: Vec<Command>,
    /// One line for each setting the recording changed that no command of this baton
    /// sets (a setting of a newer baton, or an older file's notice that does not read).
    pub unapplied: Vec<String>,
}

pub fn recorded_commands(events: &[Event]) -> RecordedCommands {
    // From format 1.8 on every change is a `setting_changed` event, with the notice a
    // person reads beside it; before, the notice is all there is.
    let structured = events
        .iter()
        .any(|e| matches!(e, Event::SettingChanged { .. }));
    let mut r = RecordedCommands::default();
    let mut turn = 0;
    for e in events {
        let out = &mut r.commands;
        match e {
            Event::UserMessage { text, turn: t } => {
                turn = *t;
                out.push(Command::Submit { text: text.clone() })
            }
            Event::Switch(_) => out.push(Command::Switch),
            Event::Notice { message } if message.contains("no conversation to hand over") => {
                out.push(Command::Switch)
            }
            Event::SettingChanged {
                turn,
                setting,
                value,
            } => match change(setting, value) {
                Some(c) => out.push(c),
                None => r.unapplied.push(format!(
                    "after turn {turn} the recording set {setting} to {value:?}, which this baton cannot set"
                )),
            },
            Event::Notice { message } if !structured => match notice_change(message) {
                Some(Ok(c)) => out.push(c),
                Some(Err(())) => r.unapplied.push(format!(
                    "after turn {turn} the recording changed a setting this replay cannot apply (only a notice says so: {message:?})"
                )),
                None => {}
            },
            Event::Bookmark { note, .. } => out.push(Command::Bookmark { note: note.clone() }),
            // How far the repair had got where it ended (a switch, or complete between
            // turns), and where an answer started over a cache being repaired: a replay
            // repairs as far at the same step.
            Event::CacheRepaired { repaired, .. } => out.push(Command::RepairTo {
                positions: *repaired,
            }),
            Event::TurnStarted {
                path: PathKind::Mapped,
                repaired: Some(positions),
                ..
            } => {
                let at = out
                    .iter()
                    .rposition(|c| matches!(c, Command::Submit { .. }))
                    .unwrap_or(out.len());
                out.insert(
                    at,
                    Command::RepairTo {
                        positions: *positions,
                    },
                );
            }
            _ => {}
        }
    }
    r
}

/// The command that makes a recorded `setting_changed`, if this baton has one.
fn change(name: &str, value: &str) -> Option<Command> {
    let switch = || match value {
        setting::ON => Some(true),
        setting::OFF => Some(false),
        _ => None,
    };
    match name {
        setting::REREAD => {
            let parsed = RereadSetting::parse(value).ok()?;
            Some(Command::SetReread { setting: parsed })
        }
        setting::REFERENCE => switch().map(|enabled| Command::SetReference { enabled }),
        setting::REPAIR => switch().map(|enabled| Command::SetRepair { enabled }),
        _ => None,
    }
}

/// The command an older file's notice of a setting change stands for: `None` for a
/// notice that is no such change, `Err` for one whose setting does not read back.
fn notice_change(message: &str) -> Option<Result<Command, ()>> {
    if let Some(state) = message.strip_prefix("reference path ") {
        return Some(Ok(Command::SetReference {
            enabled: state.ends_with("on"),
        }));
    }
    if let Some(state) = message.strip_prefix("cache repair ") {
        return Some(Ok(Command::SetRepair {
            enabled: state.ends_with("on"),
        }));
    }
    let plan = message.strip_prefix("re-read ")?;
    if plan.starts_with("off") {
        return Some(Ok(Command::SetReread { setting: None }));
    }
    let text = plan.strip_suffix(" at the first message after a switch");
    Some(match text.map(RereadSetting::parse) {
        Some(Ok(Some(plan))) => Ok(Command::SetReread {
            setting: Some(plan),
        }),
        _ => Err(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(m: &str) -> Event {
        Event::Notice { message: m.into() }
    }

    fn submit(n: u32) -> Event {
        Event::UserMessage {
            turn: n,
            text: format!("m{n}"),
        }
    }

    #[test]
    fn a_recorded_setting_change_is_sent_again_where_it_was_made() {
        let events = [
            submit(1),
            Event::SettingChanged {
                turn: 1,
                setting: "reread".into(),
                value: "40%:facts:word".into(),
            },
            notice("re-read 40%:facts:word at the first message after a switch"),
            Event::SettingChanged {
                turn: 1,
                setting: "reference".into(),
                value: "off".into(),
            },
            notice("reference path off"),
            submit(2),
            Event::SettingChanged {
                turn: 2,
                setting: "reread".into(),
                value: "off".into(),
            },
            notice("re-read off: the target answers from the map as handed over"),
        ];
        let r = recorded_commands(&events);
        assert!(r.unapplied.is_empty(), "{:?}", r.unapplied);
        assert_eq!(
            r.commands,
            [
                Command::Submit { text: "m1".into() },
                Command::SetReread {
                    setting: Some("40%:facts:word".parse().unwrap())
                },
                Command::SetReference { enabled: false },
                Command::Submit { text: "m2".into() },
                Command::SetReread { setting: None },
            ],
            "each change once, from its event, not again from its notice"
        );
    }

    #[test]
    fn an_older_files_notices_are_applied_where_they_read_and_named_where_not() {
        let events = [
            submit(1),
            notice("re-read up:20%:facts:word at the first message after a switch"),
            notice("cache repair on"),
            submit(2),
            notice("re-read 40% by some rule this baton never had"),
            notice("re-read off: the target answers from the map as handed over"),
            notice("no re-read before this answer: too short"),
        ];
        let r = recorded_commands(&events);
        assert_eq!(
            r.commands,
            [
                Command::Submit { text: "m1".into() },
                Command::SetReread {
                    setting: Some("up:20%:facts:word".parse().unwrap())
                },
                Command::SetRepair { enabled: true },
                Command::Submit { text: "m2".into() },
                Command::SetReread { setting: None },
            ]
        );
        assert_eq!(r.unapplied.len(), 1, "{:?}", r.unapplied);
        assert!(
            r.unapplied[0].contains("after turn 2") && r.unapplied[0].contains("some rule"),
            "{:?}",
            r.unapplied
        );
    }

    #[test]
    fn a_setting_this_baton_does_not_know_is_named_not_dropped_silently() {
        let events = [Event::SettingChanged {
            turn: 3,
            setting: "temperature".into(),
            value: "0.7".into(),
        }];
        let r = recorded_commands(&events);
        assert!(r.commands.is_empty());
        assert!(
            r.unapplied[0].contains("temperature") && r.unapplied[0].contains("after turn 3"),
            "{:?}",
            r.unapplied
        );
    }
}

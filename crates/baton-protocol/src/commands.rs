//! What a caller asks the engine to do.

use super::events::Event;
use crate::plan::RereadSetting;
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
    /// Set the plan at the first message after a switch, or `None` for the map alone.
    /// It applies from the next switch on. Written as the plan's text
    /// (`up:40%:facts:word`), as `--plan` takes it.
    SetReread {
        #[serde(with = "crate::plan::as_text")]
        setting: Option<RereadSetting>,
    },
    /// Mark the current turn with a note, to find it again in the session file.
    Bookmark { note: String },
    /// Finish what runs in the background (the last switch's measurement, learning from
    /// it, a repair that is on) and say so with a notice starting "background work
    /// done": a headless run sends it last, so that its session holds all of it.
    Finish,
    /// Repair the active model's cache until its first `positions` are the model's own
    /// prefill (or the repair is complete), then say how far it got: a replay repairs as
    /// far as the recording had before the same step.
    RepairTo { positions: usize },
    /// Stop the engine; it answers with [`Event::ShutDown`].
    Shutdown,
}

impl Command {
    /// Whether `e` answers this command: the engine handles commands in order and ends
    /// each with one of these events, so a driver (a script, the demo) knows when to send
    /// the next.
    pub fn answered_by(&self, e: &Event) -> bool {
        match (self, e) {
            (Command::Submit { .. }, Event::Done { .. }) => true,
            (Command::Switch, Event::Switch(_)) => true,
            (Command::Switch, Event::Notice { message }) => message.contains("no conversation"),
            (Command::Bookmark { .. }, Event::Bookmark { .. }) => true,
            (Command::SetReference { .. }, Event::Notice { message }) => {
                message.starts_with("reference path")
            }
            (Command::SetRepair { .. }, Event::Notice { message }) => {
                message.starts_with("cache repair")
            }
            (Command::SetReread { .. }, Event::Notice { message }) => {
                message.starts_with("re-read")
            }
            (Command::Finish, Event::Notice { message }) => message.starts_with("background work"),
            (Command::RepairTo { .. }, Event::Notice { message }) => {
                message.starts_with("repaired to")
            }
            (Command::Cancel, Event::Notice { .. }) => true,
            (_, Event::Error { .. }) => true,
            _ => false,
        }
    }
}

//! What a caller asks the engine to do.

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

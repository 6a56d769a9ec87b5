//! The workbench's state and the one function that changes it: [`App::update`] takes a
//! key, an engine event, a scroll, a resize or a tick and answers with the commands to
//! send. Nothing here touches the terminal, so every behaviour is testable as data.
//!
//! The app holds what the engine reported and where the session stands ([`Phase`]); the
//! panels it draws with keep their own view state (scroll, measure, typed text, notice)
//! and are handed the rest when drawn ([`view`]).

mod actions;
mod demo;
mod events;
mod keymap;
mod plan_cycle;
mod queue;
#[cfg(test)]
mod tests;
mod view;

pub use view::{render, render_panel, Panel};

use super::keys::Key;
use super::layout::{self, Areas};
use super::panels::input_box::InputBox;
use super::panels::layers::{LayerView, Layers};
use super::panels::status::{Level, MessageLine};
use super::panels::transcript::{Conversation, Transcript};
use super::phase::Phase;
use super::records::{Entry, TurnPair};
use baton_protocol::plan::RereadSetting;
use baton_protocol::{Command, Event, MapperInfo, ModelInfo};
use baton_protocol::{SwitchRow, SwitchRows};
use demo::Demo;
use queue::Queued;
use ratatui::layout::Rect;

/// What the workbench knows before the engine says anything.
#[derive(Debug, Clone, PartialEq)]
pub struct AppInfo {
    /// Where the session is being recorded; `None` when it is not.
    pub record_path: Option<String>,
    /// A scripted demo drives the conversation (see [`App::load_demo`]).
    pub demo: bool,
    /// Shown on the loading screen, e.g. when a quick mapper is being calibrated.
    pub quick_mapper_note: Option<String>,
    /// Whether the engine starts with the reference path on.
    pub reference: bool,
    /// Newest tokens the target reads itself at a switch (0: all mapped).
    pub tail: usize,
    /// Whether the engine starts with background repair on.
    pub repair: bool,
    /// The plan at the first message after a switch; `None`: the map alone.
    pub reread: Option<RereadSetting>,
}

impl Default for AppInfo {
    fn default() -> Self {
        Self {
            record_path: None,
            demo: false,
            quick_mapper_note: None,
            reference: true,
            tail: 0,
            repair: false,
            reread: None,
        }
    }
}

// Boxing the event would cost an allocation per streamed token to save a copy of a few
// hundred bytes per message.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    Key(Key),
    Engine(Event),
    /// Transcript scroll in lines: negative goes back towards older turns.
    Scroll(i32),
    Resize(u16, u16),
    /// Pasted text, inserted where the cursor is.
    Paste(String),
    /// A timer tick, for the busy indicator.
    Tick,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Send(Command),
    Quit,
}

/// What covers the screen until a key closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overlay {
    None,
    Help,
    ConfirmQuit,
}

/// The workbench: everything the screen shows, and what the engine is busy with.
#[derive(Debug, Clone)]
pub struct App {
    info: AppInfo,
    size: (u16, u16),
    /// Loading, taking commands (idle, answering, switching) or stopped.
    phase: Phase,
    models: Vec<ModelInfo>,
    active: usize,
    device: String,
    mappers: Vec<MapperInfo>,
    reference: bool,
    repair: bool,
    /// The re-read setting last asked of the engine.
    reread: Option<RereadSetting>,
    /// The plan Ctrl-E last stepped to off: the next step brings back its selector and
    /// spans.
    reread_before_off: Option<RereadSetting>,
    /// Whether the conversation panel lists the words each switch's re-read read again.
    mark_reread: bool,
    /// The active model's cache repaired so far, of its length, since the last switch.
    repaired: Option<(usize, usize)>,
    /// Per mapper (by its source model), calibration windows read in the background,
    /// of the full calibration's.
    calibration: std::collections::BTreeMap<String, (usize, usize)>,
    overlay: Overlay,
    /// The confirmation was opened by a typed `q`: any key but y/n/Esc types on, the `q`
    /// included, so a message starting with q loses nothing.
    quit_from_q: bool,
    transcript: Vec<Entry>,
    pair: Option<TurnPair>,
    switches: SwitchRows,
    context_tokens: usize,
    /// The newest turn the engine has announced, and whether the turn sent last has been
    /// announced yet (until then the latest turn is the previous one).
    latest_turn: u32,
    turn_announced: bool,
    recording_stopped: bool,
    demo: Option<Demo>,
    /// A message sent while a switch runs, waiting for it to finish.
    queued: Option<Queued>,
    dirty: bool,
    // The panels that keep view state of their own.
    input: InputBox,
    transcript_panel: Transcript,
    layers: Layers,
    message_line: MessageLine,
}

impl App {
    pub fn new(info: AppInfo) -> Self {
        Self {
            reference: info.reference,
            repair: info.repair,
            reread: info.reread,
            reread_before_off: None,
            mark_reread: false,
            repaired: None,
            calibration: Default::default(),
            info,
            size: (layout::MIN_WIDTH, layout::MIN_HEIGHT),
            phase: Phase::default(),
            models: Vec::new(),
            active: 0,
            device: String::new(),
            mappers: Vec::new(),
            overlay: Overlay::None,
            quit_from_q: false,
            transcript: Vec::new(),
            pair: None,
            switches: SwitchRows::default(),
            context_tokens: 0,
            latest_turn: 0,
            turn_announced: false,
            recording_stopped: false,
            demo: None,
            queued: None,
            dirty: true,
            input: InputBox::default(),
            transcript_panel: Transcript::default(),
            layers: Layers::default(),
            message_line: MessageLine::default(),
        }
    }

    pub fn update(&mut self, msg: Msg) -> Vec<Effect> {
        match msg {
            Msg::Tick => {
                // Only a busy screen changes with time; an idle one is not redrawn.
                if self.animating() {
                    self.message_line.tick();
                    self.dirty = true;
                }
                vec![]
            }
            Msg::Key(k) => {
                self.dirty = true;
                self.on_key(k)
            }
            Msg::Engine(e) => {
                self.dirty = true;
                self.on_event(e)
            }
            Msg::Scroll(lines) => {
                self.dirty = true;
                self.scroll_lines(lines)
            }
            Msg::Resize(w, h) => {
                self.dirty = true;
                self.size = (w, h);
                self.scroll_lines(0)
            }
            Msg::Paste(text) => {
                self.dirty = true;
                self.input.paste(&text);
                vec![]
            }
        }
    }

    /// Whether anything changed since the last [`App::mark_drawn`]: the runner draws only
    /// then, at a bounded rate, so a stream of tokens costs one frame per interval.
    pub fn needs_redraw(&self) -> bool {
        self.dirty
    }

    pub fn mark_drawn(&mut self) {
        self.dirty = false;
    }

    /// Whether something on screen moves with time (the busy indicator): the runner
    /// needs to send [`Msg::Tick`]s only then. A stopped engine shows no indicator, even
    /// with a measurement left unfinished.
    pub fn animating(&self) -> bool {
        self.busy() || (self.measuring().is_some() && !self.phase.stopped())
    }

    /// The message being typed.
    pub fn input_text(&self) -> &str {
        self.input.message()
    }

    /// The line the status bar shows for notices, warnings and errors.
    pub fn status_text(&self) -> Option<&str> {
        self.message_line.text()
    }

    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    pub fn layer_view(&self) -> LayerView {
        self.layers.measure()
    }

    pub fn reference_enabled(&self) -> bool {
        self.reference
    }

    /// The message of the error that stopped the engine, if one did.
    pub fn fatal_error(&self) -> Option<&str> {
        self.phase.fatal()
    }

    /// Whether the engine is generating or switching.
    pub fn busy(&self) -> bool {
        self.phase.busy()
    }

    /// The switch whose measurement the engine has yet to report. It runs while the
    /// engine is otherwise idle and gives way to a message, so it never blocks one.
    fn measuring(&self) -> Option<&SwitchRow> {
        self.switches.last().filter(|s| s.measuring())
    }

    fn active_model(&self) -> Option<&ModelInfo> {
        self.models.get(self.active)
    }

    fn other_model(&self) -> Option<&ModelInfo> {
        self.models.get(1 - self.active.min(1))
    }

    fn say(&mut self, level: Level, text: impl Into<String>) {
        self.message_line.say(level, text);
    }

    /// Where the panels are at the current size; `None` when the screen is too small.
    fn areas(&self) -> Option<Areas> {
        layout::layout(Rect::new(0, 0, self.size.0, self.size.1), self.input_rows())
    }

    /// Rows of text the input box shows.
    fn input_rows(&self) -> u16 {
        self.input.rows() as u16
    }

    /// The transcript as its panel draws it.
    fn conversation(&self) -> Conversation<'_> {
        Conversation {
            entries: &self.transcript,
            switches: &self.switches,
            mark_reread: self.mark_reread,
        }
    }
}

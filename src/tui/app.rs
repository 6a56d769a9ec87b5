//! The workbench's state and the one function that changes it: [`App::update`] takes a
//! key, an engine event, a scroll, a resize or a tick and answers with the commands to
//! send. Nothing here touches the terminal, so every behaviour is testable as data.

use super::demo::Demo;
use super::input::LineInput;
use super::keys::Key;
use super::phase::Phase;
use super::view;
use crate::protocol::{Command, Event, MapperInfo, ModelInfo};

pub(crate) use super::records::*;

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

/// Which per-layer measure the layer panel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayerView {
    #[default]
    Cosine,
    R2,
    Concentration,
}

impl LayerView {
    pub fn next(self) -> Self {
        match self {
            Self::Cosine => Self::R2,
            Self::R2 => Self::Concentration,
            Self::Concentration => Self::Cosine,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlay {
    None,
    Help,
    ConfirmQuit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusMessage {
    pub text: String,
    pub level: Level,
}

/// The workbench: everything the screen shows, and what the engine is busy with.
#[derive(Debug, Clone)]
pub struct App {
    pub(crate) info: AppInfo,
    pub(crate) size: (u16, u16),
    /// Loading, taking commands (idle, answering, switching) or stopped.
    pub(crate) phase: Phase,
    pub(crate) models: Vec<ModelInfo>,
    pub(crate) active: usize,
    pub(crate) device: String,
    pub(crate) mappers: Vec<MapperInfo>,
    pub(crate) reference: bool,
    pub(crate) repair: bool,
    /// The active model's cache repaired so far, of its length, since the last switch.
    pub(crate) repaired: Option<(usize, usize)>,
    pub(crate) input: LineInput,
    /// The bookmark note being typed; the message keeps its own buffer meanwhile.
    pub(crate) bookmark: Option<LineInput>,
    pub(crate) overlay: Overlay,
    /// The confirmation was opened by a typed `q`: any key but y/n/Esc types on, the `q`
    /// included, so a message starting with q loses nothing.
    pub(crate) quit_from_q: bool,
    pub(crate) transcript: Vec<Entry>,
    /// The first transcript line shown; `None` follows the newest text.
    pub(crate) scroll_top: Option<usize>,
    pub(crate) pair: Option<TurnPair>,
    pub(crate) switches: Vec<SwitchRecord>,
    pub(crate) context_tokens: usize,
    /// The newest turn the engine has announced, and whether the turn sent last has been
    /// announced yet (until then the latest turn is the previous one).
    pub(crate) latest_turn: u32,
    pub(crate) turn_announced: bool,
    pub(crate) status: Option<StatusMessage>,
    pub(crate) recording_stopped: bool,
    pub(crate) layer_view: LayerView,
    pub(crate) demo: Option<Demo>,
    pub(crate) spinner: usize,
    dirty: bool,
}

impl App {
    pub fn new(info: AppInfo) -> Self {
        Self {
            reference: info.reference,
            repair: info.repair,
            repaired: None,
            info,
            size: (view::MIN_WIDTH, view::MIN_HEIGHT),
            phase: Phase::default(),
            models: Vec::new(),
            active: 0,
            device: String::new(),
            mappers: Vec::new(),
            input: LineInput::default(),
            bookmark: None,
            overlay: Overlay::None,
            quit_from_q: false,
            transcript: Vec::new(),
            scroll_top: None,
            pair: None,
            switches: Vec::new(),
            context_tokens: 0,
            latest_turn: 0,
            turn_announced: false,
            status: None,
            recording_stopped: false,
            layer_view: LayerView::default(),
            demo: None,
            spinner: 0,
            dirty: true,
        }
    }

    pub fn update(&mut self, msg: Msg) -> Vec<Effect> {
        match msg {
            Msg::Tick => {
                // Only a busy screen changes with time; an idle one is not redrawn.
                if self.busy() || self.measuring().is_some() {
                    self.spinner = self.spinner.wrapping_add(1);
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
                match self.bookmark.as_mut() {
                    Some(note) => note.insert_str(&text),
                    None => self.input.insert_str(&text),
                }
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

    /// The message being typed.
    pub fn input_text(&self) -> &str {
        self.input.text()
    }

    /// The line the status bar shows for notices, warnings and errors.
    pub fn status_text(&self) -> Option<&str> {
        self.status.as_ref().map(|s| s.text.as_str())
    }

    pub fn context_tokens(&self) -> usize {
        self.context_tokens
    }

    pub fn layer_view(&self) -> LayerView {
        self.layer_view
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
    pub(crate) fn measuring(&self) -> Option<&SwitchRecord> {
        self.switches.last().filter(|s| s.measuring())
    }

    pub(crate) fn active_model(&self) -> Option<&ModelInfo> {
        self.models.get(self.active)
    }

    pub(crate) fn other_model(&self) -> Option<&ModelInfo> {
        self.models.get(1 - self.active.min(1))
    }

    /// A model's name shortened against the other model's, for narrow places.
    pub(crate) fn short_name(&self, name: &str) -> String {
        let [a, b] = match self.models.as_slice() {
            [a, b] => [a, b],
            _ => return name.to_string(),
        };
        let (sa, sb) = super::panels::short_names(&a.name, &b.name);
        if name == a.name {
            sa
        } else if name == b.name {
            sb
        } else {
            name.to_string()
        }
    }

    pub(crate) fn say(&mut self, level: Level, text: impl Into<String>) {
        self.status = Some(StatusMessage {
            text: text.into(),
            level,
        });
    }
}

//! The terminal workbench's state machine and screen. [`App`] holds everything shown and
//! changes only through [`App::update`]; [`render`] draws it. The terminal itself (raw
//! mode, the event loop, the engine's channel) belongs to the runner, which feeds
//! [`Msg`]s in, carries out the [`Effect`]s that come back, and redraws when
//! [`App::needs_redraw`] says so.
//!
//! Dependencies run one way: `app` uses the panels, the panels use the leaf modules
//! (`layout`, `records`, `input`, `keys`, `wrap`) and never the app.

mod app;
mod input;
mod keys;
mod layout;
mod monochrome;
mod panels;
mod phase;
mod records;
mod wrap;

pub use app::{render, render_panel, App, AppInfo, Effect, Msg, Panel};
pub use keys::{Key, KeyCode};
pub use layout::{MIN_HEIGHT, MIN_WIDTH};
pub use monochrome::{colour_allowed, strip_colours};
pub use panels::layers::LayerView;

//! The terminal workbench's state machine and screen. [`App`] holds everything shown and
//! changes only through [`App::update`]; [`render`] draws it. The terminal itself (raw
//! mode, the event loop, the engine's channel) belongs to the runner, which feeds
//! [`Msg`]s in, carries out the [`Effect`]s that come back, and redraws when
//! [`App::needs_redraw`] says so.

mod actions;
mod app;
mod demo;
mod events;
mod input;
mod keys;
pub mod panels;
mod phase;
mod records;
#[cfg(test)]
mod tests;
mod view;
mod wrap;

pub use app::{App, AppInfo, Effect, LayerView, Msg};
pub use keys::{Key, KeyCode};
pub use view::{render, MIN_HEIGHT, MIN_WIDTH};

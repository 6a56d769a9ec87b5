//! The handed-over cache: what the target model holds after a switch, described once as
//! a [`HandoffPlan`] and built once by [`HandoffPlan::build`].
//!
//! A switch gives the target a cache of the whole conversation. Its leading positions
//! (the anchor: the attention sink and the template's opening) the target computes
//! itself, since they cost almost nothing and the map fits them worst; the middle is
//! mapped from the source model's cache; the newest positions (the tail) the target may
//! read itself, on top of the mapped middle. The workbench's switch, the text, task and
//! recall evaluations, the latency bench, learning's judge and calibration's held-out
//! scoring all build the cache this way, so a measurement always measures what a switch
//! hands over.

mod build;
pub mod fidelity;
pub mod layers;
mod plan;
pub mod reread;

pub use build::{BuildTimings, EditMapped, HandoffInputs};
pub use plan::HandoffPlan;

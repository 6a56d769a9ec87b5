//! baton: hand a conversation from one language model to another of the same family by
//! mapping the source model's KV cache into the target's, and measure what that costs and
//! how faithful it is.

pub mod calibrate;
pub mod engine;
pub mod fetch;
pub mod logging;
pub mod mapper;
pub mod metrics;
pub mod model;
pub mod protocol;
pub mod session;
pub mod text;
pub mod tui;
pub mod workbench;

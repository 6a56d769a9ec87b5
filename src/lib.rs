//! baton: hand a conversation from one language model to another of the same family by
//! mapping the source model's KV cache into the target's, and measure what that costs and
//! how faithful it is.

// Re-read spans are lists of ranges: a list of one span is a list of one range.
#![allow(clippy::single_range_in_vec_init)]

pub mod calibrate;
pub mod console;
pub mod data;
pub mod engine;
pub mod fetch;
pub mod gate;
pub mod handoff;
pub mod headless;
pub mod kernels;
pub mod lab;
pub mod learn;
pub mod logging;
pub mod mapper;
pub mod metrics;
pub mod model;
pub mod os;
pub mod protocol;
pub mod session;
pub mod text;
pub mod tui;
pub mod workbench;

#[cfg(test)]
mod test_support;

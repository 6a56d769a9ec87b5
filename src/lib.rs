//! baton: hand a conversation from one language model to another of the same family by
//! mapping the source model's KV cache into the target's, and measure what that costs and
//! how faithful it is.
//!
//! This crate is the front: the workbench runner, the log file and the `baton` binary.
//! The layers live in their own crates (see ARCHITECTURE.md); they are re-exported here
//! under the names the binary, the tests and the benchmarks use.

pub use baton_console as console;
pub use baton_data as data;
pub use baton_engine as engine;
pub use baton_engine::headless;
pub use baton_fetch as fetch;
pub use baton_lab as lab;
pub use baton_method::{calibrate, gate, handoff, learn, mapper, metrics};
pub use baton_protocol as protocol;
pub use baton_runtime::{kernels, model, os, text};
pub use baton_session as session;
pub use baton_tui as tui;

pub mod logging;
pub mod workbench;

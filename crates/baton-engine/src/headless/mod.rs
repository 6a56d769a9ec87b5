//! Driving the engine without a screen: a TOML script's steps ([`script`]), or a recorded
//! session's commands replayed on this build ([`replay`]). Both talk to the engine only
//! through its public API and [`baton_protocol`], as the workbench does.

pub mod recorded;
pub mod replay;
pub mod script;

pub use replay::{replay_config, replay_steps, run_headless, Ran, ReplayError};
pub use script::{Script, ScriptError};

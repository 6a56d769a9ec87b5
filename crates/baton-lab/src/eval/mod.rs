//! How faithful a mapper is, measured: on held-out text ([`text`]: attention cosine per
//! layer, next-token agreement, continuation perplexity) and on benchmark tasks
//! ([`tasks`]: retention against the target's own prefill, raw and floor-normalised)
//! and in conversations ([`recall`]: facts of a passage asked for after a switch).
//! [`run`] does all of it for `baton eval`; [`eval_json`] is the JSON document it prints.
//! The per-layer measures are [`baton_method::handoff::fidelity`], shared with the workbench's
//! switches.

mod error;
pub mod eval_json;
pub mod gate_study;
pub mod recall;
pub mod reread;
pub mod run;
pub mod tasks;
pub mod text;

pub use error::EvalError;
pub use eval_json::{DirectionEval, EvalReport};
pub use run::{evaluate, EvalPlan, EvalProgress, Gains};

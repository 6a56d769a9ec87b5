//! Choosing what the target re-reads of a handed-over cache, once the next message is
//! known.
//!
//! The map keeps the gist of a conversation and loses its facts. The target can recompute
//! a chosen part of the cache itself ([`baton_runtime::model::Decoder::reread`]); which part is
//! the question here. A [`Selector`] scores every mapped position of the history, the
//! opening (the system prompt) is always taken, the best-scored positions grow into the
//! spans around them (words or sentences, [`SpanGrowth`]), and spans are taken until the
//! [`RereadBudget`] is spent. The selectors:
//! - `source-attention`: the source model reads the message over its own cache of the
//!   history, and each position scores the attention the message's tokens give it,
//!   summed over layers and heads. The small model reads the message: cheap, and its
//!   cache of the history is exact;
//! - `target-attention`: the same read by the target over the mapped cache (it sees what
//!   the target will attend to, through the map's error);
//! - `round-trip`: the predicted error per position, one minus the cosine of the source's
//!   own keys and values with what mapping them to the target and back gives (the gate's
//!   round trip, position by position; it needs the reverse mapper);
//! - `deviation`: the target computes its first layers itself for every position and each
//!   position scores how far the map is from them there (CacheBlend's choice);
//! - `recency`: the newest positions, the same as a longer tail: the baseline;
//! - `cheaper-attention`: `source-attention` or `target-attention`, whichever model is
//!   the smaller, so choosing stays cheap in both directions;
//! - `contrast`: the cheaper model's read, scored by what some heads seek out beyond
//!   their layer's average, so that the sinks and template tokens every head reads
//!   cancel;
//! - `message-words`: the message's own words found in the history, spread to the
//!   positions around them; `rare`: numbers and names; `facts`: the three together.
//!
//! What becomes of the chosen positions and of the rest is the plan's [`PlanKind`]:
//! re-read over the map, re-read with the rest dropped, kept with the rest dropped,
//! re-read with the rest kept where the map is trusted, or, by what the message asks
//! ([`focus`]), dropped for a question about the history and mapped otherwise.

mod choice;
pub mod cost;
pub mod focus;
pub mod lexical;
mod scores;
mod spans;

pub use choice::{choose, decide, RereadChoice, TRUSTED_SHARE};
pub use cost::{predict, PlanCost};
pub use scores::{score_positions, SelectInputs};
pub use spans::{opening_len, opening_len_within, pick_spans, unit_starts};

pub use baton_protocol::plan::{
    PlanError, PlanKind, RereadBudget, RereadSetting, Selector, SpanGrowth,
};
use baton_runtime::model::ModelConfig;

/// Whether `setting` runs on a switch from `source` to `target`.
pub fn applies(setting: &RereadSetting, source: &ModelConfig, target: &ModelConfig) -> bool {
    setting.applies_between(source.weights_per_token(), target.weights_per_token())
}

#[derive(Debug, thiserror::Error)]
pub enum RereadError {
    #[error(transparent)]
    Model(#[from] baton_runtime::model::ModelError),
    #[error(transparent)]
    Gate(#[from] crate::gate::GateError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Metric(#[from] crate::metrics::MetricError),
    #[error("{0}")]
    Input(String),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

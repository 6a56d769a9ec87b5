//! What a plan is predicted to cost against the re-prefill it replaces, before anything
//! runs: no plan may cost more than the target reading the mapped part itself.
//!
//! Costs are counted in positions the target reads (its prefill's cost per position),
//! so the prediction needs no clock:
//! - re-reading `n` positions costs [`REREAD_OVERHEAD`]` × n`: a re-read streams all the
//!   target's weights per call and attends span by span, and the bench measured a 20%
//!   re-read at about 30% of the re-prefill at 256 to 4,096 tokens (docs/reread.md);
//! - choosing by attention costs the message read once by the model that reads it,
//!   scaled by that model's weights per token against the target's; `deviation` reads
//!   two of the target's layers for every candidate; the round trip and recency cost
//!   next to nothing;
//! - the re-prefill it replaces reads every mapped position once (where the target
//!   already holds a prefix as its own, only the rest: the suffix re-prefill).

use super::scores::cheaper_reader;
use super::{RereadError, RereadSetting, SelectInputs, Selector};
use std::ops::Range;

/// A re-read position's cost in prefill positions (see the module doc).
pub const REREAD_OVERHEAD: f64 = 1.5;

/// A plan's predicted cost against the re-prefill's, in target positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanCost {
    /// Choosing and re-reading.
    pub plan: f64,
    /// Re-reading every candidate instead.
    pub reprefill: f64,
}

impl PlanCost {
    /// Whether the plan is predicted to cost at least the re-prefill: then the target
    /// re-prefills instead.
    pub fn reaches_reprefill(&self) -> bool {
        self.plan >= self.reprefill
    }
}

/// Predict the cost of `setting` over `candidates` (the mapped positions) with the
/// message (`inputs.tokens[inputs.history..]`) known.
pub fn predict(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: Range<usize>,
    ms_per_position: Option<f64>,
) -> Result<PlanCost, RereadError> {
    let opening = super::opening_len(&inputs.target.tokenizer, &inputs.tokens[..inputs.history]);
    let opening_in = opening.min(candidates.end).saturating_sub(candidates.start);
    let budget = setting
        .positions(inputs.history, ms_per_position)?
        .max(opening_in)
        .min(candidates.len());
    let reread = if setting.kind.rereads() {
        budget as f64 * REREAD_OVERHEAD
    } else {
        0.0
    };
    let message = inputs.tokens.len().saturating_sub(inputs.history) as f64;
    let target_w = inputs.target.config().weights_per_token().max(1) as f64;
    let source_w = inputs.source.config().weights_per_token() as f64;
    let selector = match setting.selector {
        Selector::CheaperAttention => cheaper_reader(inputs),
        s => s,
    };
    let choose = match selector {
        Selector::SourceAttention => message * source_w / target_w,
        Selector::TargetAttention | Selector::CheaperAttention => message,
        Selector::Deviation => {
            candidates.end as f64 * 2.0 / inputs.target.config().n_layer.max(1) as f64
        }
        Selector::RoundTrip | Selector::Recency => 0.0,
    };
    Ok(PlanCost {
        plan: reread + choose,
        reprefill: candidates.len() as f64,
    })
}

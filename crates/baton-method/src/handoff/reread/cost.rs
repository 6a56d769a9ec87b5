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
//!   already holds a prefix as its own, only the rest: the suffix re-prefill);
//! - every forward call, whatever its rows, streams all of its model's weights once:
//!   [`CALL_POSITIONS`] a call, for the plan's calls (choosing, re-reading) and the
//!   re-prefill's one. On histories of a few hundred tokens that is what made plans
//!   cost more than their positions say;
//! - the round trip (the trusted plan's estimate of each mapped position's error) maps
//!   every candidate there and back: [`ROUND_TRIP_PER_POSITION`] a candidate;
//! - layers the plan names ([`crate::handoff::layers`]) cost their share of the
//!   target's layers of a prefill of the positions they run over, its call included.
//!
//! Both constants were measured on the recall suite's switches down (a 0.5B target, 95
//! to 491 tokens: a 30% re-read took 63% of the re-prefill, the trusted plan's round trip
//! another 26%, 0.3 positions a candidate). Predictions still err, so a plan predicted
//! to cost [`MARGIN`] of the re-prefill or more re-prefills instead.

use super::focus::Resolved;
use super::scores::cheaper_reader;
use super::{PlanKind, RereadError, RereadSetting, SelectInputs, Selector};
use baton_runtime::model::position_set::PositionSet;

/// A re-read position's cost in prefill positions (see the module doc).
pub const REREAD_OVERHEAD: f64 = 1.5;

/// A forward call's cost beyond its rows, in prefill positions (see the module doc).
pub const CALL_POSITIONS: f64 = 32.0;

/// The round trip's cost a candidate position, in prefill positions.
pub const ROUND_TRIP_PER_POSITION: f64 = 0.3;

/// The share of the re-prefill's predicted cost at which a plan re-prefills instead.
pub const MARGIN: f64 = 0.9;

/// Re-reading `positions` positions, its call included, in prefill positions.
pub fn reread_cost(positions: usize) -> f64 {
    if positions == 0 {
        return 0.0;
    }
    positions as f64 * REREAD_OVERHEAD + CALL_POSITIONS
}

/// A plan's predicted cost against the re-prefill's, in target positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanCost {
    /// Choosing, the layers the plan names, and re-reading.
    pub plan: f64,
    /// Of which re-reading (its call included).
    pub reread: f64,
    /// Of which the layers the plan names (0 for a plan of positions alone). With the
    /// re-read, what is left to pay once choosing is done.
    pub layers: f64,
    /// Re-reading every candidate instead.
    pub reprefill: f64,
}

impl PlanCost {
    /// Whether the plan is predicted to cost at least the re-prefill: then the target
    /// re-prefills instead.
    pub fn reaches_reprefill(&self) -> bool {
        self.plan >= MARGIN * self.reprefill
    }

    /// The guard as the plan runs: with choosing done in `chose_ms` and the re-read still
    /// to come, whether the plan would now cost the re-prefill's share or more. The
    /// re-prefill costs `ms_per_position` (the target's measured prefill speed) a
    /// position; the re-read costs `reread_ms_per_position` a position of its predicted
    /// cost where earlier re-reads measured it, the prefill speed otherwise.
    pub fn passes_reprefill_after_choosing(
        &self,
        chose_ms: f64,
        ms_per_position: f64,
        reread_ms_per_position: Option<f64>,
    ) -> bool {
        let reread = self.reread * reread_ms_per_position.unwrap_or(ms_per_position);
        let layers = self.layers * ms_per_position;
        chose_ms + reread + layers >= MARGIN * self.reprefill * ms_per_position
    }
}

/// Predict the cost of `setting` over `candidates` (the positions the target did not
/// compute itself) with the message (`inputs.tokens[inputs.history..]`) known. The
/// re-prefill it is held against reads every candidate; the opening, where the target
/// holds it, is no candidate and costs neither.
pub fn predict(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
    ms_per_position: Option<f64>,
    focus: &Resolved,
) -> Result<PlanCost, RereadError> {
    let opening = super::opening_len(&inputs.target.tokenizer, &inputs.tokens[..inputs.history]);
    let opening_in = candidates.count_before(opening);
    let budget = setting
        .positions(
            inputs.history - opening.min(inputs.history),
            ms_per_position,
        )?
        .max(opening_in)
        .min(candidates.count());
    let budget = focus.budget(budget, opening_in, candidates);
    let selector = match setting.selector {
        Selector::CheaperAttention => cheaper_reader(inputs),
        s => s,
    };
    // Who reads the message to choose: `contrast` and `facts` read it with the cheaper
    // model, as `cheaper-attention` does.
    let reader = match selector {
        Selector::Contrast | Selector::Facts | Selector::SentenceFacts => cheaper_reader(inputs),
        s => s,
    };
    let parts = PlanParts {
        rereads: if setting.kind.rereads() { budget } else { 0 },
        message: inputs.tokens.len().saturating_sub(inputs.history),
        reader_weights: match reader {
            Selector::SourceAttention => {
                inputs.source.config().weights_per_token() as f64
                    / inputs.target.config().weights_per_token().max(1) as f64
            }
            _ => 1.0,
        },
        selector,
        // Choosing is skipped where the opening fills the budget.
        chooses: budget > opening_in,
        round_trip: setting.kind == PlanKind::Trusted,
        candidates: candidates.count(),
        reach: candidates.span().end,
        target_layers: inputs.target.config().n_layer,
        layers: setting.layers.map(|split| {
            let over =
                crate::handoff::layers::positions(split, candidates, &[], inputs.source_cache);
            (
                over.count(),
                split.share_of_prefill(inputs.target.config().n_layer),
            )
        }),
    };
    Ok(parts.cost())
}

/// What a plan does, in sizes: all its cost depends on.
#[derive(Debug, Clone)]
pub struct PlanParts {
    /// Positions re-read.
    pub rereads: usize,
    /// The message's length, which an attention selector reads.
    pub message: usize,
    /// The reading model's weights per token against the target's.
    pub reader_weights: f64,
    pub selector: Selector,
    /// Whether the selector runs at all (a budget the opening fills scores nothing).
    pub chooses: bool,
    /// Whether the plan estimates each candidate's error by the round trip.
    pub round_trip: bool,
    /// Positions the plan may re-read: the re-prefill reads them all.
    pub candidates: usize,
    /// One past the last candidate: how far a selector that reads the history reads.
    pub reach: usize,
    pub target_layers: usize,
    /// The layers the plan names: the positions they run over and their share of a
    /// prefill's layers.
    pub layers: Option<(usize, f64)>,
}

impl PlanParts {
    /// The plan's cost and the re-prefill's, in target positions (see the module doc).
    pub fn cost(&self) -> PlanCost {
        let n = self.candidates as f64;
        let mut calls = 0.0;
        let mut plan = 0.0;
        let reread = reread_cost(self.rereads);
        let selector = if self.chooses {
            Some(self.selector)
        } else {
            None
        };
        match selector {
            Some(Selector::SourceAttention)
            | Some(Selector::TargetAttention)
            | Some(Selector::CheaperAttention)
            | Some(Selector::Contrast)
            | Some(Selector::Facts)
            | Some(Selector::SentenceFacts) => {
                plan += self.message as f64 * self.reader_weights;
                calls += self.reader_weights;
            }
            Some(Selector::Deviation) => {
                plan += self.reach as f64 * 2.0 / self.target_layers.max(1) as f64;
                calls += 1.0;
            }
            Some(Selector::RoundTrip)
            | Some(Selector::Recency)
            | Some(Selector::MessageWords)
            | Some(Selector::MessageSentences)
            | Some(Selector::Rare)
            | None => {}
        }
        if self.round_trip || selector == Some(Selector::RoundTrip) {
            plan += n * ROUND_TRIP_PER_POSITION;
        }
        let layers = match self.layers {
            Some((positions, share)) if positions > 0 => {
                (positions as f64 + CALL_POSITIONS) * share
            }
            _ => 0.0,
        };
        PlanCost {
            plan: plan + calls * CALL_POSITIONS + reread + layers,
            reread,
            layers,
            reprefill: n + CALL_POSITIONS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(rereads: usize, selector: Selector, round_trip: bool, n: usize) -> PlanParts {
        PlanParts {
            rereads,
            message: 16,
            reader_weights: 1.0,
            selector,
            chooses: true,
            round_trip,
            candidates: n,
            reach: n + 1,
            target_layers: 24,
            layers: None,
        }
    }

    #[test]
    fn a_plan_pays_for_its_calls_and_round_trip_and_short_histories_re_prefill() {
        // 40% of 1,000 positions re-read, the message read once: two calls.
        let c = parts(400, Selector::TargetAttention, false, 1000).cost();
        assert_eq!(c.plan, 400.0 * 1.5 + 16.0 + 2.0 * CALL_POSITIONS);
        assert_eq!(c.reprefill, 1000.0 + CALL_POSITIONS);
        assert!(!c.reaches_reprefill());
        // The same share of 80 positions: the calls outweigh the saving.
        assert!(parts(32, Selector::TargetAttention, false, 80)
            .cost()
            .reaches_reprefill());
        // The trusted plan's round trip: 30% re-read of 260 positions, as measured down
        // (63% + 25% of the re-prefill), is near enough to the re-prefill to give way.
        let trusted = parts(78, Selector::TargetAttention, true, 260).cost();
        let plain = parts(78, Selector::TargetAttention, false, 260).cost();
        assert_eq!(trusted.plan - plain.plan, 260.0 * ROUND_TRIP_PER_POSITION);
        assert!(trusted.reaches_reprefill() && !plain.reaches_reprefill());
        // Recency chooses for free: only the re-read call.
        let tail = parts(100, Selector::Recency, false, 1000).cost();
        assert_eq!(tail.plan, 150.0 + CALL_POSITIONS);
        assert_eq!(
            tail.reread, tail.plan,
            "recency's whole cost is its re-read"
        );
    }

    #[test]
    fn layers_cost_their_share_of_a_prefill_and_count_after_choosing() {
        // Upper layers from 14 of 28 over 600 positions: half a prefill of them.
        let mut p = parts(200, Selector::Recency, false, 1000);
        let plain = p.cost();
        p.layers = Some((600, 0.5));
        let c = p.cost();
        assert_eq!(c.layers, (600.0 + CALL_POSITIONS) * 0.5);
        assert_eq!(c.plan - plain.plan, c.layers);
        assert_eq!(c.reread, plain.reread);
        // With them the same choosing passes the re-prefill sooner: 300 + 32 reread
        // positions, 316 of layers, against 0.9 × 1,032 at 1 ms a position.
        assert!(!plain.passes_reprefill_after_choosing(300.0, 1.0, None));
        assert!(c.passes_reprefill_after_choosing(300.0, 1.0, None));
        // Layers over no position cost nothing.
        p.layers = Some((0, 0.5));
        assert_eq!(p.cost(), plain);
    }

    #[test]
    fn choosing_that_ran_long_takes_the_plan_past_the_reprefill_as_it_runs() {
        // 40% of 1,000 re-read: 632 positions left to pay once chosen, against a
        // re-prefill of 1,032; at 2 ms a position, choosing may take up to 592 ms.
        let c = parts(400, Selector::TargetAttention, false, 1000).cost();
        assert_eq!(c.reread, 400.0 * 1.5 + CALL_POSITIONS);
        assert!(!c.passes_reprefill_after_choosing(100.0, 2.0, None));
        assert!(!c.passes_reprefill_after_choosing(590.0, 2.0, None));
        assert!(c.passes_reprefill_after_choosing(600.0, 2.0, None));
        // Re-reads measured at 3 ms a predicted position leave choosing less room.
        assert!(c.passes_reprefill_after_choosing(100.0, 2.0, Some(3.0)));
        assert!(!c.passes_reprefill_after_choosing(100.0, 2.0, Some(2.5)));
    }
}

//! The plans Ctrl-E, Ctrl-T and Ctrl-Y step through, as values, and the words that
//! confirm a step.
//!
//! Ctrl-E steps the budget within the plan's kind, Ctrl-T the kind at the same budget,
//! and Ctrl-Y the layers the target computes itself, so no key changes what another one
//! set. A step sets one plan for both directions: a plan for switches up only becomes
//! one for every switch.

use crate::panels::session_line::layers_alone;
use baton_protocol::plan::{LayerSplit, PlanKind, RereadBudget, RereadSetting};

/// The shares Ctrl-E steps through, after the kind's first step.
const BUDGETS: [f64; 4] = [0.1, 0.2, 0.3, 0.4];

/// What Ctrl-T starts from when no plan is set: the budget of the kind after the map.
const FROM_OFF: f64 = 0.2;

fn both_directions(plan: RereadSetting) -> RereadSetting {
    RereadSetting {
        up_only: false,
        ..plan
    }
}

/// The plan after `current` in its kind's budget cycle: a re-read over the map goes off →
/// 10% → 20% → 30% → 40% → off (a map plan of 0% is no plan), every other kind 0% → 10%
/// → 20% → 30% → 40% → 0% (0% of a drop keeps only the opening, a plan of its own). A
/// share between the steps goes to the next step up, a time budget to the start. The
/// kind, selector, spans and layers stay; from off, those of `before_off`, the plan
/// Ctrl-E last turned off, if any, as a re-read over the map.
pub(super) fn next_budget(
    current: Option<&RereadSetting>,
    before_off: Option<&RereadSetting>,
) -> Option<RereadSetting> {
    let Some(current) = current else {
        let from = before_off.copied().unwrap_or(RereadSetting::DEFAULT);
        return Some(RereadSetting {
            budget: RereadBudget::Share(BUDGETS[0]),
            kind: PlanKind::Map,
            ..both_directions(from)
        });
    };
    let next = match current.budget {
        RereadBudget::Share(now) => BUDGETS.iter().copied().find(|b| *b > now + 1e-9),
        RereadBudget::Millis(_) => None,
    };
    let budget = match (next, current.kind) {
        (Some(b), _) => b,
        (None, PlanKind::Map) => return None,
        (None, _) => 0.0,
    };
    Some(RereadSetting {
        budget: RereadBudget::Share(budget),
        ..both_directions(*current)
    })
}

/// The plan of the next kind the product carries ([`PlanKind::PRODUCT`]), the rest kept;
/// off becomes the kind after the map at 20%. A budget of 0% stays only where the next
/// kind has such a plan: a map plan of 0% would be no plan, so it takes the first step.
/// A kind the product does not carry (a plan from a study) steps to the map.
pub(super) fn next_plan_kind(current: Option<&RereadSetting>) -> RereadSetting {
    let from = current.copied().unwrap_or(RereadSetting {
        budget: RereadBudget::Share(FROM_OFF),
        ..RereadSetting::DEFAULT
    });
    let kinds = PlanKind::PRODUCT;
    let next = match (current, kinds.iter().position(|k| *k == from.kind)) {
        (Some(_), Some(i)) => kinds[(i + 1) % kinds.len()],
        (Some(_), None) => PlanKind::Map,
        (None, _) => kinds[1],
    };
    let budget = match from.budget {
        RereadBudget::Share(s) if s == 0.0 && next == PlanKind::Map => {
            RereadBudget::Share(BUDGETS[0])
        }
        b => b,
    };
    RereadSetting {
        kind: next,
        budget,
        ..both_directions(from)
    }
}

/// The layers Ctrl-Y steps through for a target of `n_layer` layers: its upper quarter,
/// half and three quarters over the mapped residual stream, then the control (its lower
/// half), then none.
fn layer_steps(n_layer: usize) -> [LayerSplit; 4] {
    let at = |num: usize| (n_layer * num / 4).clamp(1, n_layer.saturating_sub(1).max(1));
    [
        LayerSplit::Upper(at(3)),
        LayerSplit::Upper(at(2)),
        LayerSplit::Upper(at(1)),
        LayerSplit::Lower(at(2)),
    ]
}

/// The plan with the next layers of [`layer_steps`] for a target of `n_layer` layers,
/// what it does with positions kept (off: layers alone); after the last, none.
pub(super) fn next_layers(
    current: Option<&RereadSetting>,
    n_layer: usize,
) -> Option<RereadSetting> {
    let steps = layer_steps(n_layer);
    let next = match current.and_then(|c| c.layers) {
        None => Some(steps[0]),
        Some(now) => steps
            .iter()
            .position(|s| *s == now)
            .and_then(|i| steps.get(i + 1))
            .copied(),
    };
    match (current, next) {
        (Some(c), next) => {
            let plan = RereadSetting {
                layers: next,
                ..both_directions(*c)
            };
            // Layers alone, stepped past the last: no plan at all.
            (next.is_some() || !layers_alone(&plan)).then_some(plan)
        }
        (None, Some(l)) => Some(RereadSetting {
            budget: RereadBudget::Share(0.0),
            kind: PlanKind::Map,
            layers: Some(l),
            ..both_directions(RereadSetting::DEFAULT)
        }),
        (None, None) => None,
    }
}

/// What a plan's layers do, in words, after what its positions do.
fn layer_words(plan: &RereadSetting) -> &'static str {
    match plan.layers {
        Some(LayerSplit::Upper(_)) => {
            "; first the target computes its layers from that one on over the mapped \
             residual stream"
        }
        Some(LayerSplit::Lower(_)) => {
            "; first the target computes its layers below that one itself"
        }
        None => "",
    }
}

/// What a plan does, in words, for the line that confirms it.
pub(super) fn plan_words(plan: Option<&RereadSetting>) -> String {
    let Some(plan) = plan else {
        return "the target answers from the map as handed over".into();
    };
    format!("{}{}", position_words(plan.kind), layer_words(plan))
}

fn position_words(kind: PlanKind) -> &'static str {
    match kind {
        PlanKind::Drop => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history and drops the rest"
        }
        PlanKind::Focus => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history; where the message asks about what it says, the sentence that says it \
             whole, and drops the rest"
        }
        PlanKind::Attend => {
            "at the first message after a switch the target keeps that much of the mapped \
             history, the part the message attends to, and drops the rest"
        }
        PlanKind::Trusted => {
            "at the first message after a switch the target re-reads that much, keeps mapped \
             what the map is trusted with and drops the rest"
        }
        PlanKind::Map => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history"
        }
    }
}

#[cfg(test)]
mod tests;

//! The plan settings Ctrl-E, Ctrl-T and Ctrl-Y step through, as the engine's setting
//! text (`[up:][KIND:]BUDGET[:SELECTOR[:SPANS]][:LAYERS]`), and the words that confirm a
//! step.
//!
//! Ctrl-E steps the budget within the plan's kind, Ctrl-T the kind at the same budget,
//! and Ctrl-Y the layers the target computes itself, so no key changes what another one
//! set.

use crate::tui::panels::session_line::{split_layers, PLAN_KINDS};

/// The budgets Ctrl-E steps through, after the kind's first step.
const BUDGETS: [&str; 4] = ["10%", "20%", "30%", "40%"];

/// A setting's text split into its kind (`map` when it names none) and the rest; an
/// `up:` in front (a plan for switches up only) stays with the kind's side, dropped, as
/// a step sets one plan for both directions.
fn split_kind(s: &str) -> (&str, &str) {
    let s = s.strip_prefix("up:").unwrap_or(s);
    match s.split_once(':') {
        Some((k, rest)) if PLAN_KINDS.contains(&k) || k == "tail" => (k, rest),
        _ => ("map", s),
    }
}

/// `rest` under plan `kind`.
fn with_kind(kind: &str, rest: &str) -> String {
    if kind == "map" {
        rest.to_string()
    } else {
        format!("{kind}:{rest}")
    }
}

/// A budget's share of the history, for a budget written as a share (`20%`, `0.2`).
fn share(budget: &str) -> Option<f64> {
    match budget.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().ok().map(|p| p / 100.0),
        None => budget.trim().parse::<f64>().ok(),
    }
}

/// The setting after `current` in its kind's budget cycle: a re-read over the map goes
/// off → 10% → 20% → 30% → 40% → off (a map plan of 0% is no plan), every other kind
/// 0% → 10% → 20% → 30% → 40% → 0% (0% of a drop keeps only the opening, a plan of its own).
/// A share between the steps goes to the next step up, a time budget to the start. The
/// kind, selector and spans stay; from off, those of `before_off`, the plan Ctrl-E last
/// turned off, if any.
pub(super) fn next_budget(current: Option<&str>, before_off: Option<&str>) -> Option<String> {
    let Some(current) = current else {
        let (_, rest) = before_off.map_or(("map", ""), split_kind);
        let tail = rest.split_once(':').map_or("", |(_, t)| t);
        return Some(with_budget("map", BUDGETS[0], tail));
    };
    let (kind, rest) = split_kind(current);
    let (budget, tail) = rest.split_once(':').unwrap_or((rest, ""));
    let next = share(budget).and_then(|now| {
        BUDGETS
            .iter()
            .find(|b| share(b).is_some_and(|b| b > now + 1e-9))
    });
    match (next, kind) {
        (Some(b), _) => Some(with_budget(kind, b, tail)),
        (None, "map") => None,
        (None, _) => Some(with_budget(kind, "0%", tail)),
    }
}

fn with_budget(kind: &str, budget: &str, tail: &str) -> String {
    let rest = if tail.is_empty() {
        budget.to_string()
    } else {
        format!("{budget}:{tail}")
    };
    with_kind(kind, &rest)
}

/// The setting with the next plan kind, the rest kept; off becomes 20% of the next kind
/// after `map`. A budget of 0% stays only where the next kind has such a plan: a map
/// plan of 0% would be no plan, so it takes the first budget step.
pub(super) fn next_plan_kind(current: Option<&str>) -> String {
    let (kind, rest) = current.map_or(("map", "20%"), split_kind);
    let kind = if kind == "tail" { "drop" } else { kind };
    let i = PLAN_KINDS.iter().position(|k| *k == kind).unwrap_or(0);
    let next = PLAN_KINDS[(i + 1) % PLAN_KINDS.len()];
    let (budget, tail) = rest.split_once(':').unwrap_or((rest, ""));
    if next == "map" && share(budget) == Some(0.0) {
        return with_budget(next, BUDGETS[0], tail);
    }
    with_kind(next, rest)
}

/// The layers Ctrl-Y steps through for a target of `n_layer` layers: its upper quarter,
/// half and three quarters over the mapped residual stream, then the control (its lower
/// half), then none.
fn layer_steps(n_layer: usize) -> [String; 4] {
    let at = |num: usize| (n_layer * num / 4).clamp(1, n_layer.saturating_sub(1).max(1));
    [
        format!("upper={}", at(3)),
        format!("upper={}", at(2)),
        format!("upper={}", at(1)),
        format!("lower={}", at(2)),
    ]
}

/// The setting with the next layers of [`layer_steps`] for a target of `n_layer`
/// layers, the positions' part kept (off: layers alone); after the last, none.
pub(super) fn next_layers(current: Option<&str>, n_layer: usize) -> Option<String> {
    let (layers, rest) = match current {
        Some(c) => split_layers(c),
        None => (None, String::new()),
    };
    let steps = layer_steps(n_layer);
    let next = match layers {
        None => Some(steps[0].as_str()),
        Some(now) => steps
            .iter()
            .position(|s| s == now)
            .and_then(|i| steps.get(i + 1))
            .map(String::as_str),
    };
    match (next, rest.is_empty()) {
        (Some(l), true) => Some(l.to_string()),
        (Some(l), false) => Some(format!("{rest}:{l}")),
        (None, true) => None,
        (None, false) => Some(rest),
    }
}

/// What a plan's layers do, in words, after what its positions do.
fn layer_words(setting: &str) -> &'static str {
    match split_layers(setting).0 {
        Some(l) if l.starts_with("upper=") => {
            "; first the target computes its layers from that one on over the mapped \
             residual stream"
        }
        Some(_) => "; first the target computes its layers below that one itself",
        None => "",
    }
}

/// What a plan does, in words, for the line that confirms it.
pub(super) fn plan_words(setting: Option<&str>) -> String {
    let Some(setting) = setting else {
        return "the target answers from the map as handed over".into();
    };
    format!("{}{}", position_words(setting), layer_words(setting))
}

fn position_words(setting: &str) -> &'static str {
    match split_kind(setting).0 {
        "drop" | "tail" => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history and drops the rest"
        }
        "focus" => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history; where the message asks about what it says, the sentence that says it \
             whole, and drops the rest"
        }
        "attend" => {
            "at the first message after a switch the target keeps that much of the mapped \
             history, the part the message attends to, and drops the rest"
        }
        "trusted" => {
            "at the first message after a switch the target re-reads that much, keeps mapped \
             what the map is trusted with and drops the rest"
        }
        _ => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(from: Option<&str>, n: usize) -> Vec<Option<String>> {
        let mut at = from.map(str::to_string);
        (0..n)
            .map(|_| {
                at = next_budget(at.as_deref(), None);
                at.clone()
            })
            .collect()
    }

    #[test]
    fn the_budget_cycles_within_the_kind_and_keeps_the_selector() {
        assert_eq!(next_budget(None, None).as_deref(), Some("10%"));
        let s = next_budget(Some("10%:round-trip:word"), None);
        assert_eq!(s.as_deref(), Some("20%:round-trip:word"));
        assert_eq!(next_budget(Some("20%"), None).as_deref(), Some("30%"));
        assert_eq!(next_budget(Some("30%"), None).as_deref(), Some("40%"));
        assert_eq!(next_budget(Some("40%:deviation:token"), None), None);
        assert_eq!(next_budget(Some("150ms:recency:word"), None), None);
        // A drop stays a drop all the way round: 0% is a drop plan of its own.
        let drops = steps(Some("drop:0%:source-attention:word"), 5);
        let drops: Vec<_> = drops.iter().map(|s| s.as_deref().unwrap()).collect();
        assert_eq!(
            drops,
            [
                "drop:10%:source-attention:word",
                "drop:20%:source-attention:word",
                "drop:30%:source-attention:word",
                "drop:40%:source-attention:word",
                "drop:0%:source-attention:word",
            ]
        );
        assert_eq!(
            next_budget(Some("attend:40%"), None).as_deref(),
            Some("attend:0%")
        );
        assert_eq!(
            next_budget(Some("trusted:150ms"), None).as_deref(),
            Some("trusted:0%")
        );
        assert_eq!(
            next_budget(Some("tail:0.3"), None).as_deref(),
            Some("tail:40%")
        );
        // Between the steps, the next one up.
        assert_eq!(
            next_budget(Some("drop:25%:recency"), None).as_deref(),
            Some("drop:30%:recency")
        );
        assert_eq!(next_budget(Some("5%"), None).as_deref(), Some("10%"));
    }

    #[test]
    fn from_off_the_budget_comes_back_with_the_selector_it_had() {
        let off = next_budget(Some("40%:facts:word"), None);
        assert_eq!(off, None);
        assert_eq!(
            next_budget(None, Some("40%:facts:word")).as_deref(),
            Some("10%:facts:word")
        );
        assert_eq!(next_budget(None, Some("up:40%")).as_deref(), Some("10%"));
    }

    #[test]
    fn the_layers_cycle_on_their_own_and_keep_the_positions() {
        let mut at = Some("up:40%:facts:word".to_string());
        let mut seen = Vec::new();
        for _ in 0..5 {
            at = next_layers(at.as_deref(), 28);
            seen.push(at.clone());
        }
        let want = [
            "up:40%:facts:word:upper=21",
            "up:40%:facts:word:upper=14",
            "up:40%:facts:word:upper=7",
            "up:40%:facts:word:lower=14",
            "up:40%:facts:word",
        ];
        assert_eq!(seen, want.map(|w| Some(w.to_string())));
        // From off, layers alone; after the last, off again.
        assert_eq!(next_layers(None, 24).as_deref(), Some("upper=18"));
        assert_eq!(next_layers(Some("lower=12"), 24), None);
        // The budget's and the kind's steps keep the layers.
        assert_eq!(
            next_budget(Some("20%:facts:word:upper=14"), None).as_deref(),
            Some("30%:facts:word:upper=14")
        );
        assert_eq!(
            next_plan_kind(Some("20%:facts:word:upper=14")),
            "drop:20%:facts:word:upper=14"
        );
        assert!(plan_words(Some("upper=14")).contains("residual stream"));
        assert!(plan_words(Some("20%:lower=14")).contains("below that one"));
    }

    #[test]
    fn the_plan_kind_cycles_and_keeps_the_budget() {
        assert_eq!(next_plan_kind(None), "drop:20%");
        assert_eq!(
            next_plan_kind(Some("10%:round-trip:word")),
            "drop:10%:round-trip:word"
        );
        assert_eq!(next_plan_kind(Some("drop:10%")), "focus:10%");
        assert_eq!(next_plan_kind(Some("focus:10%")), "attend:10%");
        assert_eq!(next_plan_kind(Some("attend:10%")), "trusted:10%");
        assert_eq!(next_plan_kind(Some("trusted:40%:recency")), "40%:recency");
        assert_eq!(next_plan_kind(Some("tail:20%")), "focus:20%");
        // A map plan of nothing is no plan: from 0% the map kind starts at 10%.
        assert_eq!(
            next_plan_kind(Some("trusted:0%:recency:word")),
            "10%:recency:word"
        );
        assert_eq!(next_plan_kind(Some("drop:0%")), "focus:0%");
        // The default, for switches up only, steps to a plan for both directions.
        assert_eq!(
            next_plan_kind(Some("up:40%:cheaper-attention:word")),
            "drop:40%:cheaper-attention:word"
        );
        assert_eq!(
            next_budget(Some("up:20%:cheaper-attention:word"), None).as_deref(),
            Some("30%:cheaper-attention:word")
        );
    }
}

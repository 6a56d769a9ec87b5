//! From a plan setting and the message to the positions it re-reads, keeps and drops.

use super::focus::{resolve_for, Resolved};
use super::{
    opening_len, pick_spans, score_positions, unit_starts, PlanKind, RereadError, RereadSetting,
    SelectInputs, Selector,
};
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::model::{KvCache, Model, ModelError};
use std::ops::Range;
use std::time::Instant;

/// Of the mapped positions a `trusted` plan does not re-read, the share it keeps mapped:
/// those with the smallest predicted error (the round trip), the others are dropped.
pub const TRUSTED_SHARE: f64 = 0.5;

/// What a plan chose, before it runs. A candidate position is re-read (in `runs`),
/// dropped, or else left as mapped; runs are increasing and disjoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RereadChoice {
    /// Spans the target re-reads.
    pub runs: Vec<Range<usize>>,
    /// Spans dropped from attention.
    pub dropped: Vec<Range<usize>>,
    /// Milliseconds spent choosing (scores, spans).
    pub select_ms: f64,
    /// The plan was predicted to cost at least the re-prefill it replaces, so every
    /// candidate is re-read instead and nothing was chosen.
    pub reprefilled: bool,
    /// What the guard predicted, where it ran.
    pub cost: Option<super::PlanCost>,
}

impl RereadChoice {
    /// Positions re-read.
    pub fn count(&self) -> usize {
        total(&self.runs)
    }
}

fn total(runs: &[Range<usize>]) -> usize {
    runs.iter().map(|r| r.len()).sum()
}

/// The plan every caller runs: [`choose`] under `setting`, unless the plan is predicted
/// ([`super::cost::predict`]) to cost at least the re-prefill of `candidates`, when the
/// target re-reads them all instead, without choosing. `candidates` are the positions of
/// the history the target did not compute itself: mapped at this switch or at any
/// earlier one and not re-read since.
pub fn decide(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
    ms_per_position: Option<f64>,
) -> Result<RereadChoice, RereadError> {
    if !super::applies(setting, inputs.source.config(), inputs.target.config()) {
        // A plan for switches up only: a switch down hands the map over as it is.
        return Ok(RereadChoice::default());
    }
    // What the message makes of a `focus` plan, read once for the guard and the choice.
    let started = Instant::now();
    let focus = resolve_for(setting.kind, inputs, candidates);
    let cost = super::cost::predict(setting, inputs, candidates, ms_per_position, &focus)?;
    if cost.reaches_reprefill() {
        return Ok(RereadChoice::reprefill(candidates, Some(cost)));
    }
    let chosen = choose_resolved(
        setting,
        inputs,
        candidates,
        ms_per_position,
        &focus,
        started,
    )?;
    Ok(RereadChoice {
        cost: Some(cost),
        ..chosen
    })
}

impl RereadChoice {
    /// Every candidate re-read, nothing chosen: the re-prefill of what the target did not
    /// compute itself.
    pub fn reprefill(candidates: &PositionSet, cost: Option<super::PlanCost>) -> Self {
        Self {
            runs: candidates.runs().to_vec(),
            reprefilled: true,
            cost,
            ..Default::default()
        }
    }
}

impl RereadChoice {
    /// Drop what was chosen to drop from `cache`, then re-read what was chosen to
    /// re-read (so that no re-read position attends to a dropped one); `tokens` holds at
    /// least the cache's positions.
    pub fn apply(
        &self,
        target: &Model,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(), ModelError> {
        self.drop_chosen(cache)?;
        self.reread_chosen(target, tokens, cache)
    }

    /// The first half of [`Self::apply`]: drop what was chosen to drop.
    pub fn drop_chosen(&self, cache: &mut KvCache) -> Result<(), ModelError> {
        for r in &self.dropped {
            cache.drop_positions(r.clone())?;
        }
        Ok(())
    }

    /// The second half of [`Self::apply`]: re-read what was chosen to re-read (a plan's
    /// layers run between the two).
    pub fn reread_chosen(
        &self,
        target: &Model,
        tokens: &[u32],
        cache: &mut KvCache,
    ) -> Result<(), ModelError> {
        if self.runs.is_empty() {
            return Ok(());
        }
        target.decoder.reread(tokens, &self.runs, cache)
    }
}

/// Choose, under `setting`, what becomes of each of `candidates` (the positions of the
/// history the target did not compute itself); `ms_per_position` turns a time budget
/// into positions. The budget is a share of the history past its opening (the system
/// prompt, which the target holds as its own when the handoff anchored it); where the
/// opening is a candidate after all, it is taken first, inside the budget. A budget the
/// opening fills chooses without scoring: a budget of nothing costs nothing.
pub fn choose(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
    ms_per_position: Option<f64>,
) -> Result<RereadChoice, RereadError> {
    let started = Instant::now();
    let focus = resolve_for(setting.kind, inputs, candidates);
    choose_resolved(
        setting,
        inputs,
        candidates,
        ms_per_position,
        &focus,
        started,
    )
}

/// [`choose`] with the plan's kind resolved at this message, choosing timed from
/// `started`.
fn choose_resolved(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
    ms_per_position: Option<f64>,
    focus: &Resolved,
    started: Instant,
) -> Result<RereadChoice, RereadError> {
    let history = &inputs.tokens[..inputs.history];
    let opening = opening_len(&inputs.target.tokenizer, history);
    let budget = setting.positions(
        inputs.history - opening.min(inputs.history),
        ms_per_position,
    )?;
    let opening_in = candidates.count_before(opening);
    let budget = focus.budget(budget, opening_in, candidates);
    let chosen = if budget <= opening_in {
        // The opening (always taken) fills the budget: nothing to score.
        let mut opening_part = candidates.clone();
        opening_part.truncate(opening);
        opening_part.runs().to_vec()
    } else {
        let mut scores = score_positions(setting.selector, inputs, candidates)?;
        focus.lift(&mut scores);
        let starts = unit_starts(&inputs.target.tokenizer, history, setting.spans);
        pick_spans(&scores, candidates, &starts, opening, budget)
    };
    let mut rest = candidates.clone();
    for r in &chosen {
        rest.remove(r.clone());
    }
    let rest = rest.runs().to_vec();
    let (runs, dropped) = match focus.kind {
        PlanKind::Map | PlanKind::Focus => (chosen, Vec::new()),
        PlanKind::Drop => (chosen, rest),
        PlanKind::Attend => (Vec::new(), rest),
        PlanKind::Trusted => {
            let error = score_positions(Selector::RoundTrip, inputs, candidates)?;
            (chosen, untrusted(&error, &rest, TRUSTED_SHARE))
        }
    };
    Ok(RereadChoice {
        runs,
        dropped,
        select_ms: started.elapsed().as_secs_f64() * 1e3,
        reprefilled: false,
        cost: None,
    })
}

/// The positions of `rest` to drop: all but the `share` of them with the smallest
/// `error` (ties keep the newer position).
fn untrusted(error: &[f64], rest: &[Range<usize>], share: f64) -> Vec<Range<usize>> {
    let mut order: Vec<usize> = rest.iter().flat_map(|r| r.clone()).collect();
    let n_keep = (share * order.len() as f64).round() as usize;
    order.sort_by(|&a, &b| {
        let (x, y) = (error[a], error[b]);
        x.partial_cmp(&y)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(b.cmp(&a))
    });
    let mut dropped = PositionSet::of(rest.iter().cloned());
    for &p in order.iter().take(n_keep) {
        dropped.remove(p..p + 1);
    }
    dropped.runs().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trusted_split_keeps_the_smallest_errors_and_drops_the_rest() {
        let error = [0.0, 0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6];
        let rest = vec![1..4, 5..8];
        // Six positions, three kept: 2 (0.1), 6 (0.3), 7 (0.6); the others dropped.
        assert_eq!(untrusted(&error, &rest, 0.5), vec![1..2, 3..4, 5..6]);
        assert!(untrusted(&error, &rest, 1.0).is_empty());
        assert_eq!(untrusted(&error, &rest, 0.0), rest);
    }
}

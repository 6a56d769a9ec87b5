//! The re-read at the first message after a switch: the handoff maps at once, and when
//! the message arrives the target re-reads the part of the mapped history that message
//! needs (chosen with it known, see [`baton_method::handoff::reread`]) before it answers. The
//! message waits for it, so its time is part of the handoff's cost. What a plan dropped
//! is read back by the repair (see [`super::repair`]) while the engine is idle, and
//! before the next message at the latest.

use super::core::Engine;
use super::EngineError;
use baton_method::handoff::reread::{decide, RereadChoice, SelectInputs};
use baton_protocol::{Event, PlanPart, PlanText};
use baton_runtime::model::position_set::PositionSet;
use std::ops::Range;
use std::time::Instant;

/// Prefills shorter than this say little about the model's speed per position (fixed
/// costs dominate); a time budget is spent at the speed of a longer one.
pub(super) const MIN_TIMED_PREFILL: usize = 32;

impl Engine {
    /// Before the active model answers the message just added to the conversation:
    /// re-read what the last switch left to re-read, if the settings ask for it.
    pub(super) fn reread_for_message(&mut self, turn: u32) -> Result<(), EngineError> {
        let a = self.active;
        let Some(pending) = self.slots[a].pending_reread.take() else {
            return Ok(());
        };
        let Some(setting) = self.settings.reread else {
            return Ok(());
        };
        // A plan for switches up only leaves a switch down as handed over.
        if !baton_method::handoff::reread::applies(
            &setting,
            self.slots[pending.source].model.config(),
            self.slots[a].model.config(),
        ) {
            return Ok(());
        }
        // Every position of the history the target did not compute itself: mapped at
        // this switch or an earlier one, and not re-read or repaired since. The opening
        // the handoff copied is its own.
        let history = self.slots[a].primary.len().min(self.conv.len());
        let mut candidates = self.slots[a].primary.foreign().clone();
        candidates.truncate(history);
        if candidates.is_empty() {
            return Ok(());
        }
        // A measurement of this switch measures the cache as it was handed over: it keeps
        // its own copy of what it has still to read before the re-read changes it.
        self.detach_measurements(a)?;
        let started = Instant::now();
        let prompt_len = self.conv.len();
        let tokens = &self.conv.history[..prompt_len];
        let (target, source) = (&self.slots[a], &self.slots[pending.source]);
        let inputs = SelectInputs {
            source: &source.model,
            source_cache: &source.primary,
            target: &target.model,
            handed: &target.primary,
            mapper: &self.mappers[pending.source].mapper,
            reverse: Some(&self.mappers[a].mapper),
            tokens,
            history,
        };
        let choice = decide(&setting, &inputs, &candidates, target.read_speed);
        let choice = match choice {
            Ok(c) => c,
            Err(e) => {
                // The answer still comes, from the map as handed over.
                self.out.emit(Event::Notice {
                    message: format!("no re-read before this answer: {e}"),
                });
                return Ok(());
            }
        };
        let select_ms = started.elapsed().as_secs_f64() * 1e3;
        let speed = target.read_speed;
        let at_speed = |positions: f64| speed.map(|per| positions * per);
        let predicted_ms = choice.cost.and_then(|c| at_speed(c.plan));
        let reprefill_predicted_ms = choice.cost.and_then(|c| at_speed(c.reprefill));
        // The guard as it runs: choosing has been timed, and a plan whose re-read would
        // now take it past the re-prefill's share re-reads every candidate instead.
        let choice = match (choice.cost, speed) {
            (Some(cost), Some(per))
                if !choice.reprefilled
                    && cost.passes_reprefill_after_choosing(
                        select_ms,
                        per,
                        target.reread_speed,
                    ) =>
            {
                RereadChoice::reprefill(&candidates, Some(cost))
            }
            _ => choice,
        };
        choice.drop_chosen(&mut self.slots[a].primary)?;
        // The plan's layers, over the positions it neither drops nor chose by the guard
        // to re-read all of; the re-read then reads over them.
        let layers = match setting.layers {
            Some(split) if !choice.reprefilled => {
                match self.run_layers(split, pending.source, &candidates, &choice.dropped, history)
                {
                    Ok(run) => Some(run),
                    Err(e) => {
                        // The cache stays valid (every position holds entries it attends
                        // over); the re-read and the answer still come.
                        self.out.emit(Event::Notice {
                            message: format!("the plan's {} were not computed: {e}", split.label()),
                        });
                        None
                    }
                }
            }
            _ => None,
        };
        let slot = &mut self.slots[a];
        let t = Instant::now();
        choice.reread_chosen(
            &slot.model,
            &self.conv.history[..history],
            &mut slot.primary,
        )?;
        let reread_ms = super::timing::synced_ms(slot.model.decoder.device(), t);
        // What this re-read took per position of its predicted cost: the next guard's
        // speed for the re-read, measured on this machine.
        if choice.count() >= MIN_TIMED_PREFILL {
            let predicted = baton_method::handoff::reread::cost::reread_cost(choice.count());
            if predicted > 0.0 {
                slot.reread_speed = Some(reread_ms / predicted);
            }
        }
        let texts = choice
            .runs
            .iter()
            .map(|r| {
                slot.model
                    .tokenizer
                    .decode(&self.conv.history[r.clone()])
                    .unwrap_or_default()
            })
            .collect();
        let parts = plan_parts(history, &candidates, &choice.runs, &choice.dropped)
            .into_iter()
            .map(|(part, r)| PlanText {
                part,
                text: slot
                    .model
                    .tokenizer
                    .decode(&self.conv.history[r])
                    .unwrap_or_default(),
            })
            .collect();
        let spans = |runs: &[Range<usize>]| runs.iter().map(|r| [r.start, r.end]).collect();
        self.out.emit(Event::SwitchReread {
            index: pending.index,
            turn,
            setting: setting.to_string(),
            positions: choice.count(),
            context_tokens: history,
            spans: spans(&choice.runs),
            texts,
            select_ms,
            reread_ms,
            dropped: spans(&choice.dropped),
            reprefilled: choice.reprefilled,
            parts,
            predicted_ms,
            reprefill_predicted_ms,
            layer_positions: layers.as_ref().map(|l| l.positions),
            layers_ms: layers.as_ref().map(|l| l.ms),
        });
        Ok(())
    }
}

/// The history's positions `0..history` in runs of one part each, in order: outside
/// `candidates` the target's own (kept); among them re-read, dropped or left mapped.
fn plan_parts(
    history: usize,
    candidates: &PositionSet,
    reread: &[Range<usize>],
    dropped: &[Range<usize>],
) -> Vec<(PlanPart, Range<usize>)> {
    let part_of = |p: usize| {
        if !candidates.contains(p) {
            PlanPart::Kept
        } else if reread.iter().any(|r| r.contains(&p)) {
            PlanPart::Reread
        } else if dropped.iter().any(|r| r.contains(&p)) {
            PlanPart::Dropped
        } else {
            PlanPart::Mapped
        }
    };
    let mut out: Vec<(PlanPart, Range<usize>)> = Vec::new();
    for p in 0..history {
        let part = part_of(p);
        match out.last_mut() {
            Some((last, r)) if *last == part => r.end = p + 1,
            _ => out.push((part, p..p + 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_position_has_one_part_in_order() {
        let got = plan_parts(12, &PositionSet::of([3..12]), &[4..6, 9..10], &[6..8]);
        assert_eq!(
            got,
            vec![
                (PlanPart::Kept, 0..3),
                (PlanPart::Mapped, 3..4),
                (PlanPart::Reread, 4..6),
                (PlanPart::Dropped, 6..8),
                (PlanPart::Mapped, 8..9),
                (PlanPart::Reread, 9..10),
                (PlanPart::Mapped, 10..12),
            ]
        );
        assert!(plan_parts(0, &PositionSet::new(), &[], &[]).is_empty());
        // Candidates in pieces: what lies between them is the target's own.
        let got = plan_parts(8, &PositionSet::of([1..3, 5..8]), &[2..3], &[]);
        assert_eq!(
            got,
            vec![
                (PlanPart::Kept, 0..1),
                (PlanPart::Mapped, 1..2),
                (PlanPart::Reread, 2..3),
                (PlanPart::Kept, 3..5),
                (PlanPart::Mapped, 5..8),
            ]
        );
    }
}

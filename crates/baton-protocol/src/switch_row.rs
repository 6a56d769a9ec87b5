//! One switch as its events tell it, folded into one row: the handoff, then its
//! measurement, the next turn's follow-up and the plan's re-read, whichever of them
//! came. The workbench draws it, the report tabulates it, the console prints it and a
//! session diff compares it, so the events are read into a switch in one place.

use super::events::{Event, SwitchEvent};
use super::ids::ModelName;
use super::kinds::PlanText;
use super::measures::{GateDecision, MapperState, SwitchEstimate, SwitchMetrics, SwitchTimings};

/// Where a switch's measurement stands: its handoff is known at once, the map and
/// re-prefill times and the per-layer metrics once they are measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Measure {
    Pending,
    Done,
    /// It ended early (cancelled, or an error), with the reason.
    Stopped(String),
}

/// What the first turn after a switch said about its cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FollowUp {
    pub top1_agreement: Option<f64>,
    pub kl: Option<f64>,
    pub positions: usize,
    pub first_token_ms: f64,
    /// From the message reaching the engine to the target's first token.
    pub end_to_end_ms: f64,
}

/// What the target re-read of a switch's mapped history at the next message.
#[derive(Debug, Clone, PartialEq)]
pub struct RereadDone {
    pub positions: usize,
    pub context_tokens: usize,
    /// Choosing, the plan's layers and re-reading, in milliseconds.
    pub ms: f64,
    /// Of which choosing.
    pub select_ms: f64,
    /// Of which the layers the plan names, and over how many positions (`None` for a
    /// plan of positions alone).
    pub layers: Option<(usize, f64)>,
    /// Positions dropped.
    pub dropped: usize,
    /// The plan would have cost the re-prefill: the target re-read the mapped part.
    pub reprefilled: bool,
    /// The text of each span re-read.
    pub texts: Vec<String>,
    /// The whole context, each run marked with what the plan made of it (empty from an
    /// older session).
    pub parts: Vec<PlanText>,
}

/// One switch, as far as its events have told it.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchRow {
    pub index: u32,
    pub turn: u32,
    pub from: ModelName,
    pub to: ModelName,
    pub context_tokens: usize,
    pub suffix_tokens: usize,
    /// The switch until the target was ready, as the handoff reported it.
    pub handoff_ms: f64,
    /// The handoff's timings, replaced by the measured ones when they come.
    pub timings: SwitchTimings,
    pub metrics: Option<SwitchMetrics>,
    pub gate: Option<GateDecision>,
    /// The estimate made without a re-prefill.
    pub estimate: Option<SwitchEstimate>,
    /// The state of the mapper the handoff used (`None`: a re-prefill, or a session
    /// older than format 1.3).
    pub mapper: Option<MapperState>,
    /// The plan set for the next message (`up:40%:cheaper-attention:word`), if any.
    pub plan: Option<String>,
    pub measure: Measure,
    pub follow_up: Option<FollowUp>,
    /// What the plan re-read and dropped when the message came.
    pub reread: Option<RereadDone>,
}

impl SwitchRow {
    pub fn of(e: &SwitchEvent) -> Self {
        Self {
            index: e.index,
            turn: e.turn,
            from: e.from.clone(),
            to: e.to.clone(),
            context_tokens: e.context_tokens,
            suffix_tokens: e.suffix_tokens,
            handoff_ms: e.timings.end_to_end_ms,
            timings: e.timings,
            metrics: e.metrics.clone(),
            gate: e.gate,
            estimate: e.estimate,
            mapper: e.mapper,
            plan: e.reread.clone(),
            measure: if e.measurement_follows {
                Measure::Pending
            } else {
                Measure::Done
            },
            follow_up: None,
            reread: None,
        }
    }

    /// Whether the measurement is still to come.
    pub fn measuring(&self) -> bool {
        self.measure == Measure::Pending
    }

    /// Whether the switch was measured to the end.
    pub fn measured(&self) -> bool {
        self.measure == Measure::Done
    }

    /// What the user waited for the target's first token once the message came; the
    /// handoff's own time until the next turn reports it.
    pub fn end_to_end_ms(&self) -> f64 {
        self.follow_up.map_or(self.handoff_ms, |f| f.end_to_end_ms)
    }

    pub fn cosine_mean(&self) -> Option<f64> {
        self.metrics.as_ref().and_then(SwitchMetrics::cosine_mean)
    }

    pub fn cosine_min(&self) -> Option<f64> {
        self.metrics.as_ref().and_then(SwitchMetrics::cosine_min)
    }

    /// Next-token agreement: the measurement's, else the next turn's.
    pub fn top1_agreement(&self) -> Option<f64> {
        self.metrics
            .as_ref()
            .and_then(|m| m.top1_agreement)
            .or(self.follow_up.and_then(|f| f.top1_agreement))
    }

    pub fn kl(&self) -> Option<f64> {
        self.metrics
            .as_ref()
            .and_then(|m| m.kl)
            .or(self.follow_up.and_then(|f| f.kl))
    }

    /// Take a later event about this switch; false when it is about another one, or
    /// tells nothing about a switch.
    pub fn take(&mut self, event: &Event) -> bool {
        match event {
            Event::SwitchMeasured {
                index,
                timings,
                metrics,
                stopped,
                estimate,
                ..
            } if *index == self.index => {
                self.timings = *timings;
                // A measurement that stopped before its metrics keeps what the switch had.
                self.metrics = metrics.clone().or(self.metrics.take());
                self.estimate = estimate.or(self.estimate);
                self.measure = match stopped {
                    Some(why) => Measure::Stopped(why.clone()),
                    None => Measure::Done,
                };
            }
            Event::SwitchFollowUp {
                index,
                top1_agreement,
                kl,
                positions,
                first_token_ms,
                end_to_end_ms,
                ..
            } if *index == self.index => {
                self.follow_up = Some(FollowUp {
                    top1_agreement: *top1_agreement,
                    kl: *kl,
                    positions: *positions,
                    first_token_ms: *first_token_ms,
                    end_to_end_ms: *end_to_end_ms,
                });
            }
            Event::SwitchReread {
                index,
                positions,
                context_tokens,
                select_ms,
                reread_ms,
                texts,
                dropped,
                reprefilled,
                parts,
                layer_positions,
                layers_ms,
                ..
            } if *index == self.index => {
                let layers = layer_positions.map(|n| (n, layers_ms.unwrap_or(0.0)));
                self.reread = Some(RereadDone {
                    positions: *positions,
                    context_tokens: *context_tokens,
                    ms: select_ms + reread_ms + layers.map_or(0.0, |l| l.1),
                    select_ms: *select_ms,
                    layers,
                    dropped: dropped.iter().map(|r| r[1].saturating_sub(r[0])).sum(),
                    reprefilled: *reprefilled,
                    texts: texts.clone(),
                    parts: parts.clone(),
                });
            }
            _ => return false,
        }
        true
    }
}

/// Every switch of a conversation, folded event by event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchRows {
    rows: Vec<SwitchRow>,
}

impl SwitchRows {
    /// Fold one event in; the row it started or changed, if it was about a switch.
    pub fn add(&mut self, event: &Event) -> Option<&SwitchRow> {
        if let Event::Switch(e) = event {
            self.rows.push(SwitchRow::of(e));
            return self.rows.last();
        }
        // The newest switch of an index is the one a later event speaks of: a replayed
        // conversation may number from 0 again.
        let at = self.rows.iter_mut().rposition(|r| r.take(event))?;
        self.rows.get(at)
    }

    pub fn of<'a>(events: impl IntoIterator<Item = &'a Event>) -> Self {
        let mut rows = Self::default();
        for e in events {
            rows.add(e);
        }
        rows
    }

    pub fn into_rows(self) -> Vec<SwitchRow> {
        self.rows
    }
}

impl std::ops::Deref for SwitchRows {
    type Target = [SwitchRow];

    fn deref(&self) -> &[SwitchRow] {
        &self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(index: u32, measurement_follows: bool) -> Event {
        let timings = SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: None,
            map_suffix_ms: Some(1.0),
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: 3.0,
        };
        Event::Switch(SwitchEvent {
            index,
            turn: 2,
            from: "a".into(),
            to: "b".into(),
            context_tokens: 40,
            suffix_tokens: 40,
            timings,
            metrics: None,
            gate: None,
            measurement_follows,
            estimate: None,
            mapper: None,
            reread: Some("up:40%".into()),
        })
    }

    fn measured(index: u32, top1: Option<f64>, stopped: Option<&str>) -> Event {
        Event::SwitchMeasured {
            index,
            turn: 2,
            timings: SwitchTimings {
                source_prefill_ms: Some(50.0),
                map_full_ms: Some(2.0),
                map_suffix_ms: Some(1.0),
                reprefill_full_ms: Some(40.0),
                reprefill_suffix_ms: Some(40.0),
                end_to_end_ms: 3.0,
            },
            metrics: stopped.is_none().then(|| SwitchMetrics {
                attention_cosine: vec![0.9, 0.7],
                r2_k: vec![0.5, 0.5],
                r2_v: vec![0.5, 0.5],
                key_error_concentration: vec![1.0, 1.0],
                top1_agreement: top1,
                kl: None,
            }),
            yielded_to: Vec::new(),
            stopped: stopped.map(str::to_string),
            estimate: None,
        }
    }

    fn follow_up(index: u32) -> Event {
        Event::SwitchFollowUp {
            index,
            turn: 3,
            top1_agreement: Some(0.6),
            kl: Some(0.2),
            positions: 5,
            first_token_ms: 30.0,
            end_to_end_ms: 90.0,
        }
    }

    #[test]
    fn a_switch_measured_later_folds_into_one_measured_row() {
        let rows = SwitchRows::of(&[switch(0, true), follow_up(0), measured(0, None, None)]);
        let [s] = &rows[..] else {
            panic!("one row: {rows:?}");
        };
        assert!(s.measured() && !s.measuring());
        assert_eq!(s.handoff_ms, 3.0);
        assert_eq!(s.timings.speedup_full(), Some(20.0));
        assert!((s.cosine_mean().unwrap() - 0.8).abs() < 1e-12);
        assert_eq!(s.cosine_min(), Some(0.7));
        // The measurement had no agreement of its own: the next turn's stands.
        assert_eq!((s.top1_agreement(), s.kl()), (Some(0.6), Some(0.2)));
        assert_eq!(s.end_to_end_ms(), 90.0);
        assert_eq!(s.plan.as_deref(), Some("up:40%"));
    }

    #[test]
    fn the_measured_agreement_wins_over_the_next_turns() {
        let rows = SwitchRows::of(&[switch(0, true), follow_up(0), measured(0, Some(0.9), None)]);
        assert_eq!(rows[0].top1_agreement(), Some(0.9));
    }

    #[test]
    fn until_the_next_turn_the_wait_is_the_handoff() {
        let rows = SwitchRows::of(&[switch(0, true)]);
        assert!(rows[0].measuring() && !rows[0].measured());
        assert_eq!(rows[0].end_to_end_ms(), 3.0);
    }

    #[test]
    fn a_stopped_measurement_says_why_and_is_not_measured() {
        let rows = SwitchRows::of(&[switch(0, true), measured(0, None, Some("cancelled"))]);
        assert_eq!(rows[0].measure, Measure::Stopped("cancelled".into()));
        assert!(!rows[0].measured() && rows[0].metrics.is_none());
    }

    #[test]
    fn a_later_event_lands_on_the_newest_switch_of_its_index_only() {
        let mut rows = SwitchRows::default();
        rows.add(&switch(0, true));
        rows.add(&switch(1, true));
        // A replayed conversation numbers from 0 again.
        rows.add(&switch(0, true));
        let changed = rows.add(&measured(0, None, None)).map(|r| r.index);
        assert_eq!(changed, Some(0));
        let done: Vec<bool> = rows.iter().map(SwitchRow::measured).collect();
        assert_eq!(done, [false, false, true]);
        assert!(rows.add(&measured(7, None, None)).is_none());
        assert!(rows
            .add(&Event::Notice {
                message: "x".into()
            })
            .is_none());
    }

    #[test]
    fn a_reread_counts_its_dropped_positions_and_its_whole_time() {
        let mut rows = SwitchRows::default();
        rows.add(&switch(0, false));
        rows.add(&Event::SwitchReread {
            index: 0,
            turn: 2,
            setting: "drop:20%".into(),
            positions: 8,
            context_tokens: 40,
            spans: vec![[1, 9]],
            texts: vec!["x".into()],
            select_ms: 1.5,
            reread_ms: 10.0,
            dropped: vec![[10, 14], [20, 22]],
            reprefilled: false,
            parts: Vec::new(),
            predicted_ms: None,
            reprefill_predicted_ms: None,
            layer_positions: None,
            layers_ms: None,
        });
        let r = rows[0].reread.as_ref().unwrap();
        assert_eq!(
            (r.positions, r.dropped, r.ms, r.select_ms),
            (8, 6, 11.5, 1.5)
        );
        // A switch whose event carried its measurements is measured at once.
        assert!(rows[0].measured());
    }
}

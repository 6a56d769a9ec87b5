//! What a session amounts to: per-turn and per-switch rows of latency and fidelity, and a
//! summary over them.
//!
//! `baton report --json` prints a [`Report`] as it serializes here. Its layout is stable
//! (format `baton-report`, version 1): fields may be added, none renamed or removed
//! without a version change. Times are milliseconds, speed-ups are re-prefill time over
//! map time, and `null` means not measured.

use super::reader::Session;
use crate::protocol::{
    finite_mean, CacheOrigin, Event, GateDecision, MapperState, PathKind, StopKind, SwitchMetrics,
    SwitchTimings,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const REPORT_FORMAT: &str = "baton-report";
pub const REPORT_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub format: String,
    pub version: u32,
    pub session: SessionInfo,
    pub turns: Vec<TurnRow>,
    pub switches: Vec<SwitchRow>,
    pub summary: Summary,
    pub bookmarks: Vec<BookmarkRow>,
    pub errors: Vec<ErrorRow>,
    /// What the mappers learned from the conversation, one row per learning step.
    #[serde(default)]
    pub learning: Vec<LearningRow>,
    /// How each background repair of a cache ended (see `Event::CacheRepaired`).
    #[serde(default)]
    pub repairs: Vec<RepairRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepairRow {
    /// The switch whose handed-over cache was repaired, and its turn.
    pub index: u32,
    pub turn: u32,
    pub model: String,
    pub repaired: usize,
    pub total: usize,
    pub complete: bool,
    pub after_switch_ms: f64,
    pub compute_ms: f64,
}

/// One learning step (see `Event::MapperLearned`): the held-out cosine before and after
/// is the mean of the conversation's newest positions and the fixed calibration text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearningRow {
    /// The switch whose conversation was learned from, and its turn.
    pub index: u32,
    pub turn: u32,
    pub from: String,
    pub to: String,
    pub tokens: usize,
    pub held_out: usize,
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub accepted: bool,
    pub learned_tokens: u64,
    pub seconds: f64,
    pub kept: bool,
}

/// Which run the report describes, from the session header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub created: String,
    pub baton_version: String,
    pub device: String,
    pub models: Vec<String>,
    pub mappers: Vec<String>,
    pub events: usize,
    /// What reading the file skipped or recovered.
    pub warnings: Vec<String>,
}

/// One turn: each path's generation, and how the two compared when both ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRow {
    pub turn: u32,
    pub mapped: Option<PathRow>,
    pub reference: Option<PathRow>,
    pub identical: Option<bool>,
    pub first_difference: Option<usize>,
    pub agreement: Option<f64>,
}

/// One path's generation in a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathRow {
    pub model: String,
    /// How the cache was produced, when the session says (from `turn_started`).
    pub cache: Option<CacheOrigin>,
    pub tokens: usize,
    pub prompt_tokens: usize,
    pub prefill_ms: f64,
    pub first_token_ms: f64,
    pub decode_tokens_per_s: f64,
    pub total_ms: f64,
    pub stop: StopKind,
}

/// One switch: what it cost against a re-prefill, and how faithful the mapped cache was.
/// `handoff_ms` is the switch until the target was ready; `end_to_end_ms` what the user
/// then waited for the first token of the next answer (the handoff until that turn
/// reports it). `measured` is false while the switch's measurement is missing (the
/// session ended first) or stopped early.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchRow {
    pub index: u32,
    pub turn: u32,
    pub from: String,
    pub to: String,
    pub context_tokens: usize,
    pub suffix_tokens: usize,
    #[serde(default)]
    pub handoff_ms: f64,
    #[serde(default)]
    pub measured: bool,
    pub map_full_ms: Option<f64>,
    pub map_suffix_ms: Option<f64>,
    pub reprefill_full_ms: Option<f64>,
    pub reprefill_suffix_ms: Option<f64>,
    pub end_to_end_ms: f64,
    pub speedup_full: Option<f64>,
    pub speedup_suffix: Option<f64>,
    pub cosine_mean: Option<f64>,
    pub cosine_min: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub kl: Option<f64>,
    pub gate: Option<GateDecision>,
    /// The estimate the switch had before any re-prefill (see `SwitchEstimate`).
    #[serde(default)]
    pub feature_distance: Option<f64>,
    #[serde(default)]
    pub round_trip: Option<f64>,
    #[serde(default)]
    pub predicted_cosine: Option<f64>,
    /// The state of the mapper the handoff used (`None`: a re-prefill, or a session
    /// older than format 1.3).
    #[serde(default)]
    pub mapper: Option<MapperState>,
    /// The re-read the switch was set to make at the next message (session format 1.4
    /// on), and what it re-read: positions, and its time, choosing and re-reading.
    #[serde(default)]
    pub reread: Option<String>,
    #[serde(default)]
    pub reread_positions: Option<usize>,
    #[serde(default)]
    pub reread_ms: Option<f64>,
    /// Positions the plan dropped (session format 1.5 on).
    #[serde(default)]
    pub dropped_positions: Option<usize>,
    /// The plan would have cost the re-prefill, so the target re-read the mapped part.
    #[serde(default)]
    pub reprefilled: bool,
}

/// The session at a glance. Means are over the rows that have the value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub turns: usize,
    pub switches: usize,
    /// Turns where the mapped and the reference path were compared.
    pub compared_turns: usize,
    pub identical_turns: usize,
    pub mean_agreement: Option<f64>,
    pub mean_speedup_full: Option<f64>,
    pub mean_speedup_suffix: Option<f64>,
    /// Mean over switches of each switch's mean layer cosine.
    pub cosine_mean: Option<f64>,
    /// The worst layer cosine of any switch.
    pub cosine_min: Option<f64>,
    /// Switches where the gate let the mapped cache through, and where it re-prefilled.
    pub gate_mapped: usize,
    pub gate_reprefilled: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BookmarkRow {
    pub turn: u32,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRow {
    pub message: String,
    pub fatal: bool,
}

impl Report {
    pub fn from_session(session: &Session) -> Self {
        let mut rows = Rows::default();
        for event in session.events() {
            rows.add(event);
        }
        let turns: Vec<TurnRow> = rows.turns.into_values().collect();
        let summary = Summary::of(&turns, &rows.switches);
        let h = &session.header;
        Self {
            format: REPORT_FORMAT.into(),
            version: REPORT_VERSION,
            session: SessionInfo {
                created: h.created.clone(),
                baton_version: h.baton_version.clone(),
                device: h.device.clone(),
                models: h.models.iter().map(|m| m.name.to_string()).collect(),
                mappers: h.mappers.iter().map(|m| m.id.clone()).collect(),
                events: session.events.len(),
                warnings: session.warnings.clone(),
            },
            turns,
            switches: rows.switches,
            summary,
            bookmarks: rows.bookmarks,
            errors: rows.errors,
            learning: rows.learning,
            repairs: rows.repairs,
        }
    }
}

/// The rows a session's events build, event by event.
#[derive(Default)]
struct Rows {
    turns: BTreeMap<u32, TurnRow>,
    /// Where each turn's path got its cache, from its `TurnStarted`.
    caches: BTreeMap<(u32, PathKind), CacheOrigin>,
    switches: Vec<SwitchRow>,
    bookmarks: Vec<BookmarkRow>,
    errors: Vec<ErrorRow>,
    learning: Vec<LearningRow>,
    repairs: Vec<RepairRow>,
}

impl Rows {
    fn add(&mut self, event: &Event) {
        if let Some(turn) = event.turn().filter(|_| opens_turn(event)) {
            self.turns.entry(turn).or_insert_with(|| TurnRow::new(turn));
        }
        match event {
            Event::TurnStarted {
                turn, path, cache, ..
            } => {
                self.caches.insert((*turn, *path), *cache);
            }
            Event::Generation { turn, path, .. } => {
                let cache = self.caches.get(&(*turn, *path)).copied();
                if let Some(row) = PathRow::of(event, cache) {
                    let t = self.turn(*turn);
                    match path {
                        PathKind::Mapped => t.mapped = Some(row),
                        PathKind::Reference => t.reference = Some(row),
                    }
                }
            }
            Event::TurnComparison {
                turn,
                identical,
                first_difference,
                agreement,
            } => {
                let t = self.turn(*turn);
                t.identical = Some(*identical);
                t.first_difference = *first_difference;
                t.agreement = Some(*agreement).filter(|a| a.is_finite());
            }
            Event::Switch(_) => self.switches.extend(SwitchRow::of(event)),
            Event::SwitchMeasured { .. }
            | Event::SwitchFollowUp { .. }
            | Event::SwitchReread { .. } => self.complete_switch(event),
            Event::MapperLearned { .. } => self.learning.extend(LearningRow::of(event)),
            Event::CacheRepaired { .. } => self.repairs.extend(RepairRow::of(event)),
            Event::Bookmark { turn, note } => self.bookmarks.push(BookmarkRow {
                turn: *turn,
                note: note.clone(),
            }),
            Event::Error { message, fatal } => self.errors.push(ErrorRow {
                message: message.clone(),
                fatal: *fatal,
            }),
            _ => {}
        }
    }

    fn turn(&mut self, turn: u32) -> &mut TurnRow {
        self.turns.entry(turn).or_insert_with(|| TurnRow::new(turn))
    }

    /// A later event about a switch fills in its row.
    fn complete_switch(&mut self, event: &Event) {
        match event {
            // Sessions from format 1.1 on measure a switch after its handoff, often
            // after the next turn's follow-up.
            Event::SwitchMeasured {
                index,
                timings,
                metrics,
                stopped,
                estimate,
                ..
            } => {
                if let Some(row) = self.switches.iter_mut().rev().find(|r| r.index == *index) {
                    row.measure(timings, metrics.as_ref());
                    row.measured = stopped.is_none();
                    if let Some(e) = estimate {
                        row.feature_distance = e.feature_distance;
                        row.round_trip = e.round_trip;
                        row.predicted_cosine = e.predicted_cosine;
                    }
                }
            }
            // The first turn after a switch completes its row: agreement on the
            // user's message and the time to the target's first token.
            Event::SwitchFollowUp {
                index,
                top1_agreement,
                kl,
                end_to_end_ms,
                ..
            } => {
                if let Some(row) = self.switches.iter_mut().rev().find(|r| r.index == *index) {
                    row.top1_agreement = row.top1_agreement.or(*top1_agreement);
                    row.kl = row.kl.or(*kl);
                    row.end_to_end_ms = *end_to_end_ms;
                }
            }
            Event::SwitchReread {
                index,
                positions,
                select_ms,
                reread_ms,
                dropped,
                reprefilled,
                ..
            } => {
                if let Some(row) = self.switches.iter_mut().rev().find(|r| r.index == *index) {
                    row.reread_positions = Some(*positions);
                    row.reread_ms = Some(select_ms + reread_ms);
                    row.dropped_positions =
                        Some(dropped.iter().map(|d| d[1].saturating_sub(d[0])).sum());
                    row.reprefilled = *reprefilled;
                }
            }
            _ => {}
        }
    }
}

impl PathRow {
    /// A `Generation` event's row, with the cache its turn started on.
    fn of(event: &Event, cache: Option<CacheOrigin>) -> Option<Self> {
        let Event::Generation {
            model,
            token_ids,
            prompt_tokens,
            timings,
            stop,
            ..
        } = event
        else {
            return None;
        };
        Some(PathRow {
            model: model.to_string(),
            cache,
            tokens: token_ids.len(),
            prompt_tokens: *prompt_tokens,
            prefill_ms: timings.prefill_ms,
            first_token_ms: timings.first_token_ms,
            decode_tokens_per_s: timings.decode_tokens_per_s,
            total_ms: timings.total_ms,
            stop: *stop,
        })
    }
}

impl LearningRow {
    /// A `MapperLearned` event's row.
    fn of(event: &Event) -> Option<Self> {
        let Event::MapperLearned {
            index,
            turn,
            from,
            to,
            tokens,
            held_out,
            before,
            after,
            accepted,
            learned_tokens,
            seconds,
            kept,
            ..
        } = event
        else {
            return None;
        };
        Some(LearningRow {
            index: *index,
            turn: *turn,
            from: from.to_string(),
            to: to.to_string(),
            tokens: *tokens,
            held_out: *held_out,
            before: Some(*before).filter(|v| v.is_finite()),
            after: Some(*after).filter(|v| v.is_finite()),
            accepted: *accepted,
            learned_tokens: *learned_tokens,
            seconds: *seconds,
            kept: *kept,
        })
    }
}

impl RepairRow {
    /// A `CacheRepaired` event's row.
    fn of(event: &Event) -> Option<Self> {
        let Event::CacheRepaired {
            index,
            turn,
            model,
            repaired,
            total,
            complete,
            after_switch_ms,
            compute_ms,
        } = event
        else {
            return None;
        };
        Some(RepairRow {
            index: *index,
            turn: *turn,
            model: model.to_string(),
            repaired: *repaired,
            total: *total,
            complete: *complete,
            after_switch_ms: *after_switch_ms,
            compute_ms: *compute_ms,
        })
    }
}

/// A turn exists once the user spoke or a model started on it; a bookmark or a switch
/// naming a turn that never came does not make one.
fn opens_turn(event: &Event) -> bool {
    matches!(
        event,
        Event::UserMessage { .. } | Event::TurnStarted { .. } | Event::Generation { .. }
    )
}

impl SwitchRow {
    /// A `Switch` event's row, measured when the event carries the measurements.
    fn of(event: &Event) -> Option<Self> {
        let Event::Switch(crate::protocol::SwitchEvent {
            index,
            turn,
            from,
            to,
            context_tokens,
            suffix_tokens,
            timings,
            metrics,
            gate,
            measurement_follows,
            estimate,
            mapper,
            reread,
        }) = event
        else {
            return None;
        };
        let mut row = SwitchRow {
            index: *index,
            turn: *turn,
            from: from.to_string(),
            to: to.to_string(),
            context_tokens: *context_tokens,
            suffix_tokens: *suffix_tokens,
            handoff_ms: timings.end_to_end_ms,
            measured: !measurement_follows,
            map_full_ms: None,
            map_suffix_ms: None,
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: timings.end_to_end_ms,
            speedup_full: None,
            speedup_suffix: None,
            cosine_mean: None,
            cosine_min: None,
            top1_agreement: None,
            kl: None,
            gate: *gate,
            feature_distance: estimate.and_then(|e| e.feature_distance),
            round_trip: estimate.and_then(|e| e.round_trip),
            predicted_cosine: estimate.and_then(|e| e.predicted_cosine),
            mapper: *mapper,
            reread: reread.clone(),
            reread_positions: None,
            reread_ms: None,
            dropped_positions: None,
            reprefilled: false,
        };
        row.measure(timings, metrics.as_ref());
        Some(row)
    }

    /// Take the measured timings and metrics; the follow-up's agreement, when it came
    /// first, stays.
    fn measure(&mut self, t: &SwitchTimings, metrics: Option<&SwitchMetrics>) {
        self.map_full_ms = t.map_full_ms;
        self.map_suffix_ms = t.map_suffix_ms;
        self.reprefill_full_ms = t.reprefill_full_ms;
        self.reprefill_suffix_ms = t.reprefill_suffix_ms;
        self.speedup_full = t.speedup_full();
        self.speedup_suffix = t.speedup_suffix();
        if let Some(m) = metrics {
            self.cosine_mean = m.cosine_mean();
            self.cosine_min = m.cosine_min();
            self.top1_agreement = m.top1_agreement.or(self.top1_agreement);
            self.kl = m.kl.or(self.kl);
        }
    }
}

impl TurnRow {
    fn new(turn: u32) -> Self {
        Self {
            turn,
            mapped: None,
            reference: None,
            identical: None,
            first_difference: None,
            agreement: None,
        }
    }
}

impl Summary {
    fn of(turns: &[TurnRow], switches: &[SwitchRow]) -> Self {
        let compared: Vec<&TurnRow> = turns.iter().filter(|t| t.identical.is_some()).collect();
        let gate_used = |origin| {
            switches
                .iter()
                .filter(|s| s.gate.is_some_and(|g| g.used == origin))
                .count()
        };
        Self {
            turns: turns.len(),
            switches: switches.len(),
            compared_turns: compared.len(),
            identical_turns: compared
                .iter()
                .filter(|t| t.identical == Some(true))
                .count(),
            mean_agreement: finite_mean(turns.iter().filter_map(|t| t.agreement)),
            mean_speedup_full: finite_mean(switches.iter().filter_map(|s| s.speedup_full)),
            mean_speedup_suffix: finite_mean(switches.iter().filter_map(|s| s.speedup_suffix)),
            cosine_mean: finite_mean(switches.iter().filter_map(|s| s.cosine_mean)),
            cosine_min: switches
                .iter()
                .filter_map(|s| s.cosine_min)
                .reduce(f64::min),
            gate_mapped: gate_used(CacheOrigin::Mapped),
            gate_reprefilled: gate_used(CacheOrigin::Reprefilled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::fixtures;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-12)
    }

    #[test]
    fn switch_rows_carry_latencies_speedups_and_fidelity() {
        let r = Report::from_session(&fixtures::session());
        assert_eq!(r.switches.len(), 2);
        let s0 = &r.switches[0];
        assert_eq!(
            (s0.index, s0.turn, s0.from.as_str(), s0.to.as_str()),
            (0, 2, "a", "b")
        );
        assert_eq!(s0.map_full_ms, Some(2.0));
        assert_eq!(s0.reprefill_full_ms, Some(40.0));
        assert!(close(s0.speedup_full, 20.0));
        assert!(close(s0.speedup_suffix, 10.0));
        assert!(close(s0.cosine_mean, 0.8));
        assert!(close(s0.cosine_min, 0.7));
        assert_eq!(s0.top1_agreement, Some(0.8));
        assert_eq!(s0.kl, Some(0.1));
        let s1 = &r.switches[1];
        assert!(close(s1.speedup_full, 5.0));
        assert_eq!(s1.speedup_suffix, None);
        assert_eq!(s1.kl, None);
        assert_eq!(s1.gate.map(|g| g.used), Some(CacheOrigin::Reprefilled));
    }

    #[test]
    fn turn_rows_pair_both_paths_with_their_comparison() {
        let r = Report::from_session(&fixtures::session());
        let turns: Vec<u32> = r.turns.iter().map(|t| t.turn).collect();
        assert_eq!(turns, [1, 2, 3, 4]);
        let t1 = &r.turns[0];
        assert_eq!(
            t1.mapped.as_ref().map(|p| p.cache),
            Some(Some(CacheOrigin::True))
        );
        assert!(t1.reference.is_none() && t1.identical.is_none());
        let t2 = &r.turns[1];
        assert_eq!(
            t2.reference.as_ref().and_then(|p| p.cache),
            Some(CacheOrigin::Reprefilled)
        );
        assert_eq!(t2.identical, Some(true));
        let t3 = &r.turns[2];
        assert_eq!(t3.mapped.as_ref().map(|p| p.tokens), Some(4));
        assert_eq!(t3.mapped.as_ref().and_then(|p| p.cache), None);
        assert_eq!((t3.identical, t3.first_difference), (Some(false), Some(1)));
        assert_eq!(t3.agreement, Some(0.5));
    }

    #[test]
    fn the_summary_aggregates_over_rows() {
        let r = Report::from_session(&fixtures::session());
        let s = &r.summary;
        assert_eq!((s.turns, s.switches), (4, 2));
        assert_eq!((s.compared_turns, s.identical_turns), (2, 1));
        assert!(close(s.mean_agreement, 0.75));
        assert!(close(s.mean_speedup_full, 12.5));
        assert!(close(s.mean_speedup_suffix, 10.0));
        assert!(close(s.cosine_mean, 0.725));
        assert!(close(s.cosine_min, 0.5));
        assert_eq!((s.gate_mapped, s.gate_reprefilled), (1, 1));
        assert_eq!(
            r.bookmarks,
            [BookmarkRow {
                turn: 3,
                note: "drift".into()
            }]
        );
        assert_eq!(r.errors.len(), 1);
        assert_eq!(r.session.models, ["a", "b"]);
        assert_eq!(r.session.events, fixtures::events().len());
    }

    #[test]
    fn the_json_layout_is_stable() {
        let r = Report::from_session(&fixtures::session());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["format"], "baton-report");
        assert_eq!(v["version"], 1);
        assert_eq!(v["switches"][0]["speedup_full"], 20.0);
        assert_eq!(v["switches"][1]["gate"]["used"], "reprefilled");
        assert_eq!(v["turns"][1]["reference"]["cache"], "reprefilled");
        assert_eq!(v["summary"]["identical_turns"], 1);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_switch_measured_after_its_turn_reports_as_one_measured_with_it() {
        let old = Report::from_session(&fixtures::session());
        let new = Report::from_session(&fixtures::session_of(fixtures::measured_later(
            fixtures::events(),
        )));
        assert_eq!(new.switches.len(), 2);
        for (o, n) in old.switches.iter().zip(&new.switches) {
            assert!(o.measured && n.measured);
            assert_eq!(o.handoff_ms, n.handoff_ms);
            assert_eq!(
                (o.map_full_ms, o.reprefill_full_ms, o.reprefill_suffix_ms),
                (n.map_full_ms, n.reprefill_full_ms, n.reprefill_suffix_ms)
            );
            assert_eq!(
                (o.speedup_full, o.cosine_min),
                (n.speedup_full, n.cosine_min)
            );
            assert_eq!((o.top1_agreement, o.kl), (n.top1_agreement, n.kl));
        }
        assert_eq!(old.summary, new.summary);
        // A handoff whose measurement never came is reported as such.
        let mut events = fixtures::measured_later(fixtures::events());
        events.retain(|e| !matches!(e, Event::SwitchMeasured { index: 1, .. }));
        let r = Report::from_session(&fixtures::session_of(events));
        let s1 = &r.switches[1];
        assert!(!s1.measured);
        assert_eq!(
            (s1.map_full_ms, s1.speedup_full, s1.cosine_mean),
            (None, None, None)
        );
        assert_eq!(s1.handoff_ms, 21.0);
        assert!(r.switches[0].measured);
    }

    #[test]
    fn a_reread_lands_on_the_switch_it_belongs_to_with_its_time() {
        let mut events = fixtures::events();
        let at = events
            .iter()
            .position(|e| {
                matches!(
                    e,
                    Event::Switch(crate::protocol::SwitchEvent { index: 0, .. })
                )
            })
            .unwrap();
        events.insert(
            at + 1,
            Event::SwitchReread {
                index: 0,
                turn: 2,
                setting: "20%:source-attention:word".into(),
                positions: 7,
                context_tokens: 30,
                spans: vec![[1, 8]],
                texts: vec!["x".into()],
                select_ms: 1.5,
                reread_ms: 10.0,
                dropped: Vec::new(),
                reprefilled: false,
                parts: Vec::new(),
            },
        );
        let r = Report::from_session(&fixtures::session_of(events));
        assert_eq!(r.switches[0].reread_positions, Some(7));
        assert_eq!(r.switches[0].reread_ms, Some(11.5));
        assert_eq!(r.switches[1].reread_positions, None);
    }

    #[test]
    fn an_empty_session_reports_nothing_measured() {
        let r = Report::from_session(&fixtures::session_of(vec![]));
        assert!(r.turns.is_empty() && r.switches.is_empty());
        assert_eq!(r.summary.mean_speedup_full, None);
        assert_eq!(r.summary.cosine_min, None);
    }
}

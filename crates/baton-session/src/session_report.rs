//! What a session amounts to: per-turn and per-switch rows of latency and fidelity, and a
//! summary over them.
//!
//! `baton report --json` prints a [`Report`] as it serializes here. Its layout is stable
//! (format `baton-report`, version 1): fields may be added, none renamed or removed
//! without a version change. Times are milliseconds, speed-ups are re-prefill time over
//! map time, and `null` means not measured.

use super::reader::Session;
use baton_protocol::{finite_mean, CacheOrigin, Event, PathKind, StopKind, SwitchRow, SwitchRows};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const REPORT_FORMAT: &str = "baton-report";
pub const REPORT_VERSION: u32 = 1;

/// Written, never read back: a reader of the JSON is another program.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub format: String,
    pub version: u32,
    pub session: SessionInfo,
    pub turns: Vec<TurnRow>,
    /// In the layout of `switch_json`: flat, as version 1 gave it.
    #[serde(serialize_with = "super::switch_json::rows")]
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
        let switches = rows.switches.into_rows();
        let summary = Summary::of(&turns, &switches);
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
            switches,
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
    switches: SwitchRows,
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
            Event::Switch(_)
            | Event::SwitchMeasured { .. }
            | Event::SwitchFollowUp { .. }
            | Event::SwitchReread { .. } => {
                self.switches.add(event);
            }
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
            mean_speedup_full: finite_mean(
                switches.iter().filter_map(|s| s.timings.speedup_full()),
            ),
            mean_speedup_suffix: finite_mean(
                switches.iter().filter_map(|s| s.timings.speedup_suffix()),
            ),
            cosine_mean: finite_mean(switches.iter().filter_map(SwitchRow::cosine_mean)),
            cosine_min: switches
                .iter()
                .filter_map(SwitchRow::cosine_min)
                .reduce(f64::min),
            gate_mapped: gate_used(CacheOrigin::Mapped),
            gate_reprefilled: gate_used(CacheOrigin::Reprefilled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

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
        assert_eq!(s0.timings.map_full_ms, Some(2.0));
        assert_eq!(s0.timings.reprefill_full_ms, Some(40.0));
        assert!(close(s0.timings.speedup_full(), 20.0));
        assert!(close(s0.timings.speedup_suffix(), 10.0));
        assert!(close(s0.cosine_mean(), 0.8));
        assert!(close(s0.cosine_min(), 0.7));
        assert_eq!(s0.top1_agreement(), Some(0.8));
        assert_eq!(s0.kl(), Some(0.1));
        let s1 = &r.switches[1];
        assert!(close(s1.timings.speedup_full(), 5.0));
        assert_eq!(s1.timings.speedup_suffix(), None);
        assert_eq!(s1.kl(), None);
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
        let mut keys: Vec<&str> = v["switches"][0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut want = super::super::switch_json::VERSION_1_KEYS.to_vec();
        want.sort_unstable();
        assert_eq!(keys, want, "a switch row's keys are version 1's");
    }

    #[test]
    fn a_switch_measured_after_its_turn_reports_as_one_measured_with_it() {
        let old = Report::from_session(&fixtures::session());
        let new = Report::from_session(&fixtures::session_of(fixtures::measured_later(
            fixtures::events(),
        )));
        assert_eq!(new.switches.len(), 2);
        for (o, n) in old.switches.iter().zip(&new.switches) {
            assert!(o.measured() && n.measured());
            assert_eq!(o.handoff_ms, n.handoff_ms);
            assert_eq!(
                (
                    o.timings.map_full_ms,
                    o.timings.reprefill_full_ms,
                    o.timings.reprefill_suffix_ms
                ),
                (
                    n.timings.map_full_ms,
                    n.timings.reprefill_full_ms,
                    n.timings.reprefill_suffix_ms
                )
            );
            assert_eq!(
                (o.timings.speedup_full(), o.cosine_min()),
                (n.timings.speedup_full(), n.cosine_min())
            );
            assert_eq!((o.top1_agreement(), o.kl()), (n.top1_agreement(), n.kl()));
        }
        assert_eq!(old.summary, new.summary);
        // A handoff whose measurement never came is reported as such.
        let mut events = fixtures::measured_later(fixtures::events());
        events.retain(|e| !matches!(e, Event::SwitchMeasured { index: 1, .. }));
        let r = Report::from_session(&fixtures::session_of(events));
        let s1 = &r.switches[1];
        assert!(!s1.measured());
        assert_eq!(
            (
                s1.timings.map_full_ms,
                s1.timings.speedup_full(),
                s1.cosine_mean()
            ),
            (None, None, None)
        );
        assert_eq!(s1.handoff_ms, 21.0);
        assert!(r.switches[0].measured());
    }

    #[test]
    fn a_reread_lands_on_the_switch_it_belongs_to_with_its_time() {
        let events =
            fixtures::with_reread(fixtures::events(), "20%:source-attention:word", Vec::new());
        let r = Report::from_session(&fixtures::session_of(events));
        assert_eq!(r.switches[0].reread.as_ref().map(|r| r.positions), Some(7));
        assert_eq!(r.switches[0].reread.as_ref().map(|r| r.ms), Some(11.5));
        assert_eq!(r.switches[1].reread, None);
    }

    #[test]
    fn an_empty_session_reports_nothing_measured() {
        let r = Report::from_session(&fixtures::session_of(vec![]));
        assert!(r.turns.is_empty() && r.switches.is_empty());
        assert_eq!(r.summary.mean_speedup_full, None);
        assert_eq!(r.summary.cosine_min, None);
    }
}

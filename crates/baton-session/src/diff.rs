//! Comparing a recorded session with a new run of the same conversation (a replay):
//! where the generated tokens part, and which fidelity metrics moved beyond a tolerance.
//! Timings are left out: they differ on every run.

use super::reader::Session;
use baton_protocol::{Event, PathKind, SwitchMetrics, SwitchRow, SwitchRows};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Display, Formatter};

/// How far apart two measurements may be and still count as the same.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiffOptions {
    /// Absolute, on metrics that mostly live in [0, 1] (cosines, R², agreement, KL).
    pub tolerance: f64,
}

impl Default for DiffOptions {
    fn default() -> Self {
        Self { tolerance: 1e-4 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionDiff {
    pub tolerance: f64,
    /// What the two ran under that differs (models, mappers, device, a header's setting,
    /// a setting changed during the conversation, a switch's plan), one sentence each:
    /// the likeliest cause of any difference below.
    pub settings: Vec<String>,
    /// Turns and switches present in both sessions.
    pub turns_compared: usize,
    pub switches_compared: usize,
    /// Per path, the first turn whose generated tokens differ, and where.
    pub tokens: Vec<TokenDifference>,
    pub metrics: Vec<MetricDifference>,
    /// What cannot be compared number by number: turns or switches present in one
    /// session only, a different gate choice.
    pub structure: Vec<String>,
}

impl SessionDiff {
    pub fn is_identical(&self) -> bool {
        self.settings.is_empty()
            && self.tokens.is_empty()
            && self.metrics.is_empty()
            && self.structure.is_empty()
    }
}

/// Where one path's tokens first part; `None` on the side whose answer ended there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenDifference {
    pub path: PathKind,
    pub turn: u32,
    pub token_index: usize,
    pub recorded: Option<u32>,
    pub replayed: Option<u32>,
}

/// A metric that moved beyond the tolerance, at a switch or a turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricDifference {
    pub switch: Option<u32>,
    pub turn: Option<u32>,
    /// The metric's field name, with the target layer for per-layer ones:
    /// `attention_cosine[3]`.
    pub metric: String,
    pub recorded: f64,
    pub replayed: f64,
}

pub fn diff_sessions(recorded: &Session, replayed: &Session, opts: &DiffOptions) -> SessionDiff {
    let mut d = SessionDiff {
        tolerance: opts.tolerance,
        settings: super::settings_diff::compare(recorded, replayed),
        turns_compared: 0,
        switches_compared: 0,
        tokens: vec![],
        metrics: vec![],
        structure: vec![],
    };
    compare_generations(recorded, replayed, &mut d);
    compare_switches(recorded, replayed, opts, &mut d);
    compare_agreement(recorded, replayed, opts, &mut d);
    d.structure
        .extend(super::repair_states::compare(recorded, replayed));
    d
}

type Generations<'a> = BTreeMap<(PathKind, u32), &'a [u32]>;

fn generations(s: &Session) -> Generations<'_> {
    s.events()
        .filter_map(|e| match e {
            Event::Generation {
                turn,
                path,
                token_ids,
                ..
            } => Some(((*path, *turn), token_ids.as_slice())),
            _ => None,
        })
        .collect()
}

fn compare_generations(a: &Session, b: &Session, d: &mut SessionDiff) {
    let (ga, gb) = (generations(a), generations(b));
    let turns: BTreeSet<u32> = ga.keys().chain(gb.keys()).map(|k| k.1).collect();
    d.turns_compared = turns
        .iter()
        .filter(|t| ga.keys().any(|k| k.1 == **t) && gb.keys().any(|k| k.1 == **t))
        .count();
    for path in [PathKind::Mapped, PathKind::Reference] {
        let mut first_found = false;
        for &turn in &turns {
            match (ga.get(&(path, turn)), gb.get(&(path, turn))) {
                (Some(x), Some(y)) => {
                    if first_found {
                        continue;
                    }
                    if let Some(i) = first_difference(x, y) {
                        d.tokens.push(TokenDifference {
                            path,
                            turn,
                            token_index: i,
                            recorded: x.get(i).copied(),
                            replayed: y.get(i).copied(),
                        });
                        first_found = true;
                    }
                }
                (Some(_), None) => d.structure.push(format!(
                    "turn {turn}, {} path: only in the recorded session",
                    path_name(path)
                )),
                (None, Some(_)) => d.structure.push(format!(
                    "turn {turn}, {} path: only in the replayed session",
                    path_name(path)
                )),
                (None, None) => {}
            }
        }
    }
}

fn first_difference(x: &[u32], y: &[u32]) -> Option<usize> {
    let common = x.iter().zip(y).take_while(|(p, q)| p == q).count();
    (common < x.len().max(y.len())).then_some(common)
}

fn path_name(path: PathKind) -> &'static str {
    match path {
        PathKind::Mapped => "mapped",
        PathKind::Reference => "reference",
    }
}

/// Each switch by its index, with its metrics from its own event (sessions before
/// format 1.1) or from the measurement that followed it.
fn switches(s: &Session) -> BTreeMap<u32, SwitchRow> {
    SwitchRows::of(s.events())
        .into_rows()
        .into_iter()
        .map(|r| (r.index, r))
        .collect()
}

fn compare_switches(a: &Session, b: &Session, opts: &DiffOptions, d: &mut SessionDiff) {
    let (sa, sb) = (switches(a), switches(b));
    let indices: BTreeSet<u32> = sa.keys().chain(sb.keys()).copied().collect();
    for index in indices {
        let (x, y) = match (sa.get(&index), sb.get(&index)) {
            (Some(x), Some(y)) => (x, y),
            (x, _) => {
                let side = if x.is_some() { "recorded" } else { "replayed" };
                d.structure
                    .push(format!("switch {index}: only in the {side} session"));
                continue;
            }
        };
        d.switches_compared += 1;
        if (&x.from, &x.to, x.turn) != (&y.from, &y.to, y.turn) {
            d.structure.push(format!(
                "switch {index}: recorded {} -> {} at turn {}, replayed {} -> {} at turn {}",
                x.from, x.to, x.turn, y.from, y.to, y.turn
            ));
        }
        // Learning runs beside the conversation, so a replay may map with another state
        // of the mapper; its numbers then differ for that reason.
        if let (Some(m), Some(n)) = (&x.mapper, &y.mapper) {
            if m != n {
                d.structure.push(format!(
                    "switch {index}: recorded with the mapper {m}, replayed with the mapper {n}"
                ));
            }
        }
        let mut metric = |name: String, p: f64, q: f64| {
            if differs(p, q, opts.tolerance) {
                d.metrics.push(MetricDifference {
                    switch: Some(index),
                    turn: None,
                    metric: name,
                    recorded: p,
                    replayed: q,
                });
            }
        };
        match (&x.gate, &y.gate) {
            (Some(g), Some(h)) => {
                metric("gate.estimate".into(), g.estimate, h.estimate);
                if g.used != h.used {
                    d.structure.push(format!(
                        "switch {index}: the gate chose {:?}, replayed {:?}",
                        g.used, h.used
                    ));
                }
            }
            (None, None) => {}
            _ => d
                .structure
                .push(format!("switch {index}: gated in one session only")),
        }
        match (&x.metrics, &y.metrics) {
            (Some(m), Some(n)) => compare_metrics(index, m, n, opts, d),
            (None, None) => {}
            _ => d.structure.push(format!(
                "switch {index}: metrics measured in one session only"
            )),
        }
    }
}

fn compare_metrics(
    index: u32,
    m: &SwitchMetrics,
    n: &SwitchMetrics,
    opts: &DiffOptions,
    d: &mut SessionDiff,
) {
    let layered = [
        ("attention_cosine", &m.attention_cosine, &n.attention_cosine),
        ("r2_k", &m.r2_k, &n.r2_k),
        ("r2_v", &m.r2_v, &n.r2_v),
        (
            "key_error_concentration",
            &m.key_error_concentration,
            &n.key_error_concentration,
        ),
    ];
    let mut push = |metric: String, p: f64, q: f64| {
        if differs(p, q, opts.tolerance) {
            d.metrics.push(MetricDifference {
                switch: Some(index),
                turn: None,
                metric,
                recorded: p,
                replayed: q,
            });
        }
    };
    let mut structure = Vec::new();
    for (name, p, q) in layered {
        if p.len() != q.len() {
            structure.push(format!(
                "switch {index}: {name} has {} layers recorded, {} replayed",
                p.len(),
                q.len()
            ));
            continue;
        }
        for (layer, (x, y)) in p.iter().zip(q.iter()).enumerate() {
            push(format!("{name}[{layer}]"), *x, *y);
        }
    }
    let scalars = [
        ("top1_agreement", m.top1_agreement, n.top1_agreement),
        ("kl", m.kl, n.kl),
    ];
    for (name, p, q) in scalars {
        match (p, q) {
            (Some(x), Some(y)) => push(name.into(), x, y),
            (None, None) => {}
            _ => structure.push(format!(
                "switch {index}: {name} measured in one session only"
            )),
        }
    }
    d.structure.extend(structure);
}

fn compare_agreement(a: &Session, b: &Session, opts: &DiffOptions, d: &mut SessionDiff) {
    let agreement = |s: &Session| -> BTreeMap<u32, f64> {
        s.events()
            .filter_map(|e| match e {
                Event::TurnComparison {
                    turn, agreement, ..
                } => Some((*turn, *agreement)),
                _ => None,
            })
            .collect()
    };
    let (x, y) = (agreement(a), agreement(b));
    for (turn, p) in &x {
        if let Some(q) = y.get(turn) {
            if differs(*p, *q, opts.tolerance) {
                d.metrics.push(MetricDifference {
                    switch: None,
                    turn: Some(*turn),
                    metric: "agreement".into(),
                    recorded: *p,
                    replayed: *q,
                });
            }
        }
    }
}

/// NaN equals NaN here: a metric that was degenerate in both runs did not change.
fn differs(p: f64, q: f64, tolerance: f64) -> bool {
    match (p.is_nan(), q.is_nan()) {
        (true, true) => false,
        (false, false) => !((p - q).abs() <= tolerance || p == q),
        _ => true,
    }
}

impl Display for SessionDiff {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if self.is_identical() {
            return writeln!(
                f,
                "identical: {} turns and {} switches compared (metric tolerance {})",
                self.turns_compared, self.switches_compared, self.tolerance
            );
        }
        if !self.settings.is_empty() {
            writeln!(f, "run under other settings:")?;
            for s in &self.settings {
                writeln!(f, "  {s}")?;
            }
        }
        for t in &self.tokens {
            let token = |v: Option<u32>| v.map_or("end".to_string(), |id| id.to_string());
            writeln!(
                f,
                "{} path first differs in turn {} at token {}: recorded {}, replayed {}",
                path_name(t.path),
                t.turn,
                t.token_index,
                token(t.recorded),
                token(t.replayed)
            )?;
        }
        for m in &self.metrics {
            let at = match (m.switch, m.turn) {
                (Some(s), _) => format!("switch {s}"),
                (None, Some(t)) => format!("turn {t}"),
                (None, None) => "session".into(),
            };
            writeln!(
                f,
                "{at}: {} {} -> {} ({:+.6})",
                m.metric,
                m.recorded,
                m.replayed,
                m.replayed - m.recorded
            )?;
        }
        for s in &self.structure {
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use baton_protocol::{CacheOrigin, MapperState};

    fn replace_generation(events: &mut [Event], turn: u32, path: PathKind, ids: &[u32]) {
        for e in events.iter_mut() {
            if let Event::Generation {
                turn: t,
                path: p,
                token_ids,
                ..
            } = e
            {
                if *t == turn && *p == path {
                    *token_ids = ids.to_vec();
                }
            }
        }
    }

    #[test]
    fn a_session_is_identical_to_itself() {
        let s = fixtures::session();
        let d = diff_sessions(&s, &s, &DiffOptions::default());
        assert!(d.is_identical(), "{d}");
        assert_eq!((d.turns_compared, d.switches_compared), (4, 2));
    }

    #[test]
    fn a_recording_from_before_the_measurement_event_diffs_clean_against_a_newer_one() {
        let old = fixtures::session();
        let new = fixtures::session_of(fixtures::measured_later(fixtures::events()));
        let d = diff_sessions(&old, &new, &DiffOptions::default());
        assert!(d.is_identical(), "{d}");
        assert_eq!(d.switches_compared, 2);
        // The metrics are read from the measurement: a changed one there is found.
        let mut events = fixtures::measured_later(fixtures::events());
        for e in events.iter_mut() {
            if let Event::SwitchMeasured {
                index: 1,
                metrics: Some(m),
                ..
            } = e
            {
                m.attention_cosine[0] -= 0.5;
            }
        }
        let d = diff_sessions(&old, &fixtures::session_of(events), &DiffOptions::default());
        assert_eq!(d.metrics.len(), 1, "{d}");
        assert_eq!(d.metrics[0].switch, Some(1));
    }

    #[test]
    fn a_switch_replayed_with_another_state_of_its_mapper_says_so() {
        let with = |updates: u32| {
            let mut events = fixtures::events();
            for e in events.iter_mut() {
                if let Event::Switch(baton_protocol::SwitchEvent {
                    index: 1, mapper, ..
                }) = e
                {
                    *mapper = Some(MapperState {
                        updates,
                        learned_tokens: 40 * u64::from(updates),
                    });
                }
            }
            fixtures::session_of(events)
        };
        let d = diff_sessions(&with(0), &with(0), &DiffOptions::default());
        assert!(d.is_identical(), "{d}");
        let d = diff_sessions(&with(0), &with(2), &DiffOptions::default());
        assert_eq!(
            d.structure,
            ["switch 1: recorded with the mapper calibrated, replayed with the mapper learned, update 2 (80 positions)"]
        );
    }

    #[test]
    fn a_changed_token_is_found_at_its_turn_and_index() {
        let mut events = fixtures::events();
        replace_generation(&mut events, 3, PathKind::Reference, &[9, 13, 99, 12]);
        events.push(fixtures::generation(4, PathKind::Reference, "a", &[1]));
        let d = diff_sessions(
            &fixtures::session(),
            &fixtures::session_of(events),
            &DiffOptions::default(),
        );
        assert!(!d.is_identical());
        assert_eq!(
            d.tokens,
            [TokenDifference {
                path: PathKind::Reference,
                turn: 3,
                token_index: 2,
                recorded: Some(11),
                replayed: Some(99),
            }]
        );
        // Turn 4 ran on the reference path only in the replay.
        assert_eq!(d.structure.len(), 1, "{:?}", d.structure);
    }

    #[test]
    fn a_shorter_answer_differs_where_it_ends() {
        let mut events = fixtures::events();
        replace_generation(&mut events, 2, PathKind::Mapped, &[5, 6]);
        let d = diff_sessions(
            &fixtures::session(),
            &fixtures::session_of(events),
            &DiffOptions::default(),
        );
        assert_eq!(d.tokens.len(), 1);
        let t = &d.tokens[0];
        assert_eq!((t.path, t.turn, t.token_index), (PathKind::Mapped, 2, 2));
        assert_eq!((t.recorded, t.replayed), (Some(7), None));
    }

    #[test]
    fn metric_deltas_count_only_beyond_the_tolerance() {
        let mut events = fixtures::events();
        for e in events.iter_mut() {
            if let Event::Switch(baton_protocol::SwitchEvent {
                index: 1,
                metrics: Some(m),
                gate: Some(g),
                ..
            }) = e
            {
                m.attention_cosine[1] += 0.01;
                m.r2_k[0] += 1e-6;
                g.used = CacheOrigin::Mapped;
            }
        }
        let d = diff_sessions(
            &fixtures::session(),
            &fixtures::session_of(events),
            &DiffOptions::default(),
        );
        assert!(d.tokens.is_empty());
        assert_eq!(d.metrics.len(), 1, "{:?}", d.metrics);
        assert_eq!(d.metrics[0].metric, "attention_cosine[1]");
        assert_eq!(d.metrics[0].switch, Some(1));
        assert_eq!(d.structure.len(), 1, "{:?}", d.structure);
        assert!(
            d.to_string().contains("attention_cosine[1] 0.5 -> 0.51"),
            "{d}"
        );
    }

    #[test]
    fn nan_metrics_in_both_runs_are_no_difference() {
        assert!(!differs(f64::NAN, f64::NAN, 0.0));
        assert!(differs(f64::NAN, 0.5, 1.0));
        assert!(!differs(f64::INFINITY, f64::INFINITY, 0.0));
    }
}

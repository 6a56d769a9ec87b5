//! The headless commands' view of a conversation (`baton run`): answers, switches and
//! comparisons as plain lines, answers on stdout and progress and problems on stderr, so
//! a script can keep the transcript and drop the rest.

use super::prefill::PrefillMeter;
use baton_protocol::{
    Event, GateDecision, GenerationTimings, Measure, PathKind, SwitchEstimate, SwitchMetrics,
    SwitchRow, SwitchRows, SwitchTimings,
};

/// Which stream a line belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

/// Turns events into lines. It remembers the last loading stage because the engine
/// reports byte counts under the same stage many times a second: one line per stage is
/// what a log wants.
#[derive(Debug, Default)]
pub struct EventPrinter {
    last_stage: String,
    prefill: PrefillMeter,
    /// Each switch so far, so a later event's line can say what it adds to it.
    switches: SwitchRows,
}

impl EventPrinter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Writes the event's line, if it has one, to stdout or stderr.
    pub fn print(&mut self, e: &Event) {
        match self.line(e) {
            Some((Stream::Out, l)) => println!("{l}"),
            Some((Stream::Err, l)) => eprintln!("{l}"),
            None => {}
        }
    }

    /// The event's line and its stream; `None` for events a log does not show (tokens,
    /// repeated loading stages, turn starts).
    pub fn line(&mut self, e: &Event) -> Option<(Stream, String)> {
        let out = |s: String| Some((Stream::Out, s));
        let err = |s: String| Some((Stream::Err, s));
        match e {
            Event::Loading { stage, .. } if !stage.is_empty() => {
                if self.last_stage == *stage {
                    return None;
                }
                self.last_stage = stage.clone();
                err(stage.clone())
            }
            Event::Ready { models, device, .. } => err(format!(
                "ready: {} on {device}",
                models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(" and ")
            )),
            Event::UserMessage { turn, text } => out(format!("\n[turn {turn}] user: {text}")),
            Event::Generation {
                turn,
                path,
                model,
                text,
                timings,
                ..
            } => out(generation_line(*turn, *path, model.as_str(), text, timings)),
            Event::Switch(_)
            | Event::SwitchMeasured { .. }
            | Event::SwitchFollowUp { .. }
            | Event::SwitchReread { .. } => {
                let row = self.switches.add(e)?;
                out(switch_line(e, row))
            }
            Event::CacheRepaired { .. } | Event::MapperLearned { .. } => switch_aftermath_line(e),
            Event::TurnComparison {
                turn,
                identical,
                first_difference,
                agreement,
            } => out(format!(
                "[turn {turn}] mapped vs reference: {}",
                comparison_verdict(*identical, *first_difference, *agreement)
            )),
            Event::PrefillProgress {
                turn,
                path,
                done,
                total,
            } => self
                .prefill
                .line(*turn, *path, *done, *total, std::time::Instant::now())
                .and_then(err),
            Event::Notice { message } => err(message.clone()),
            Event::Error { message, fatal } => err(format!(
                "{}: {message}",
                if *fatal { "error" } else { "warning" }
            )),
            _ => None,
        }
    }
}

fn generation_line(
    turn: u32,
    path: PathKind,
    model: &str,
    text: &str,
    timings: &GenerationTimings,
) -> String {
    let label = match path {
        PathKind::Mapped => "answer",
        PathKind::Reference => "reference",
    };
    format!(
        "[turn {turn}] {model} {label} ({:.0} ms to first token, {:.1} tok/s): {}",
        timings.first_token_ms,
        timings.decode_tokens_per_s,
        text.trim()
    )
}

fn comparison_verdict(identical: bool, first_difference: Option<usize>, agreement: f64) -> String {
    if identical {
        "identical".to_string()
    } else {
        format!(
            "first difference at token {}, agreement {agreement:.3}",
            first_difference.unwrap_or(0)
        )
    }
}

/// The line of an event about a switch, read from the switch as it stands after it:
/// the handoff, its measurement, the plan's re-read and the next turn's follow-up.
fn switch_line(e: &Event, s: &SwitchRow) -> String {
    let (index, from, to, context) = (s.index, &s.from, &s.to, s.context_tokens);
    match e {
        Event::Switch(_) => {
            let gate = gate_note(s.gate.as_ref());
            if s.measuring() {
                format!(
                    "[switch {index}] {from} -> {to}, {context} tokens handed over in {:.1} ms{gate}",
                    s.handoff_ms
                )
            } else {
                format!(
                    "[switch {index}] {from} -> {to}, {context} tokens: {}{gate}",
                    measured_line(&s.timings, s.metrics.as_ref())
                )
            }
        }
        Event::SwitchMeasured { .. } => format!(
            "[switch {index}] measured: {}{}{}",
            measured_line(&s.timings, s.metrics.as_ref()),
            estimate_note(s.estimate.as_ref()),
            match &s.measure {
                Measure::Stopped(why) => format!(" (stopped: {why})"),
                _ => String::new(),
            }
        ),
        Event::SwitchReread { .. } => match &s.reread {
            Some(r) if r.reprefilled => format!(
                "[switch {index}] plan {} would cost a re-prefill: all {} mapped positions re-read in {:.0} ms",
                s.plan.as_deref().unwrap_or("-"),
                r.positions,
                r.ms
            ),
            Some(r) => format!(
                "[switch {index}] plan {}: {} of {} positions re-read, {} dropped, in {:.0} ms ({:.0} ms choosing{})",
                s.plan.as_deref().unwrap_or("-"),
                r.positions,
                r.context_tokens,
                r.dropped,
                r.ms,
                r.select_ms,
                match r.layers {
                    Some((n, ms)) => format!(", {ms:.0} ms of layers over {n} positions"),
                    None => String::new(),
                }
            ),
            None => String::new(),
        },
        _ => {
            let f = s.follow_up;
            format!(
                "[switch {index}] end to end {:.0} ms{}",
                s.end_to_end_ms(),
                match f.map(|f| (f.top1_agreement, f.kl)) {
                    Some((Some(a), Some(k))) => {
                        format!(", next-turn top-1 agreement {a:.3}, KL {k:.3}")
                    }
                    _ => String::new(),
                }
            )
        }
    }
}

/// The line of what comes of a switch later: the cache repair and the learning.
fn switch_aftermath_line(e: &Event) -> Option<(Stream, String)> {
    let err = |s: String| Some((Stream::Err, s));
    match e {
        Event::CacheRepaired {
            index,
            model,
            repaired,
            total,
            complete,
            after_switch_ms,
            compute_ms,
            ..
        } => err(format!(
            "[switch {index}] repair of {model}'s cache {}: {repaired} / {total} positions, {:.1} s after the switch, {:.1} s of prefill",
            if *complete { "complete" } else { "cut short" },
            after_switch_ms / 1e3,
            compute_ms / 1e3
        )),
        Event::MapperLearned { index, .. } => baton_protocol::summary::line(e)
            .and_then(|l| err(format!("[switch {index}] learned: {l}"))),
        _ => None,
    }
}

/// The gate's verdict on a switch, when a gate decided it.
fn gate_note(gate: Option<&GateDecision>) -> String {
    gate.map(|g| {
        format!(
            ", gate {:.3} vs {:.3}: {:?}",
            g.estimate, g.threshold, g.used
        )
    })
    .unwrap_or_default()
}

/// The quality the switch's estimate predicted, when there is one.
fn estimate_note(estimate: Option<&SwitchEstimate>) -> String {
    estimate
        .map(|e| {
            let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
            format!(
                " | estimate: feature distance {}, round trip {}, predicted cosine {}",
                show(e.feature_distance),
                show(e.round_trip),
                show(e.predicted_cosine)
            )
        })
        .unwrap_or_default()
}

/// A switch's map and re-prefill times, and its cosine when measured; "-" marks what
/// was not measured, never a zero.
pub fn measured_line(timings: &SwitchTimings, metrics: Option<&SwitchMetrics>) -> String {
    let opt = |v: Option<f64>| v.map(|x| format!("{x:.1} ms")).unwrap_or("-".into());
    format!(
        "map {} (suffix {}) vs re-prefill {} (suffix {}){}",
        opt(timings.map_full_ms),
        opt(timings.map_suffix_ms),
        opt(timings.reprefill_full_ms),
        opt(timings.reprefill_suffix_ms),
        metrics
            .and_then(|m| Some(format!(
                ", attention cosine mean {:.3} min {:.3}",
                m.cosine_mean()?,
                m.cosine_min()?
            )))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_session::fixtures;

    fn lines(events: &[Event]) -> Vec<(Stream, String)> {
        let mut p = EventPrinter::new();
        events.iter().filter_map(|e| p.line(e)).collect()
    }

    #[test]
    fn a_loading_stage_is_printed_once_however_often_it_reports() {
        let stage = |s: &str, done| Event::Loading {
            stage: s.into(),
            done,
            total: 10,
            eta_seconds: None,
        };
        let got = lines(&[stage("fetch a", 1), stage("fetch a", 5), stage("load b", 0)]);
        assert_eq!(
            got,
            vec![
                (Stream::Err, "fetch a".to_string()),
                (Stream::Err, "load b".to_string())
            ]
        );
    }

    #[test]
    fn answers_go_to_stdout_and_problems_to_stderr() {
        let got = lines(&fixtures::events());
        let answer = got
            .iter()
            .find(|(_, l)| l.contains(" answer ("))
            .expect("an answer line");
        assert_eq!(answer.0, Stream::Out);
        let e = lines(&[Event::Error {
            message: "disk full".into(),
            fatal: false,
        }]);
        assert_eq!(e, vec![(Stream::Err, "warning: disk full".to_string())]);
    }

    #[test]
    fn a_two_event_switch_prints_its_handoff_then_its_measurement() {
        let got = lines(&fixtures::measured_later(fixtures::events()));
        let handoff = got
            .iter()
            .position(|(_, l)| l.starts_with("[switch 0]") && l.contains("handed over in"))
            .expect("a handoff line");
        let measured = got
            .iter()
            .position(|(_, l)| l.starts_with("[switch 0] measured: map "))
            .expect("a measurement line");
        assert!(handoff < measured, "{got:#?}");
        assert!(
            got[measured].1.contains("attention cosine mean"),
            "{got:#?}"
        );
    }

    #[test]
    fn a_plans_reread_is_printed_with_what_it_read_and_dropped() {
        let events = fixtures::with_reread(fixtures::events(), "drop:20%", vec![[10, 13]]);
        let got = lines(&events);
        let line = got
            .iter()
            .find(|(_, l)| l.starts_with("[switch 0] plan"))
            .expect("a plan line");
        assert!(
            line.1
                .contains("7 of 30 positions re-read, 3 dropped, in 12 ms"),
            "{line:?}"
        );
    }

    #[test]
    fn what_was_not_measured_shows_as_a_dash_not_a_zero() {
        let t = SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: None,
            map_suffix_ms: Some(2.5),
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: 3.0,
        };
        assert_eq!(
            measured_line(&t, None),
            "map - (suffix 2.5 ms) vs re-prefill - (suffix -)"
        );
    }
}

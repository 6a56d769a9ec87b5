//! A small hand-built session with round numbers, shared by the unit tests of the
//! report, the plot and the diff.

use super::header::{RecordedEvent, SessionHeader};
use super::reader::Session;
use baton_protocol::*;

pub fn models() -> Vec<ModelInfo> {
    let a = ModelInfo {
        name: "a".into(),
        path: "models/a.gguf".into(),
        sha256: "aa".repeat(32),
        arch: "qwen2".into(),
        n_layer: 2,
        n_kv_head: 2,
        head_dim: 64,
    };
    let b = ModelInfo {
        name: "b".into(),
        sha256: "bb".repeat(32),
        ..a.clone()
    };
    vec![a, b]
}

pub fn header() -> SessionHeader {
    SessionHeader {
        created: "2026-11-30T14:05:00Z".into(),
        ..SessionHeader::new(
            models(),
            vec![MapperInfo {
                id: "a--b.safetensors".into(),
                source: "a".into(),
                target: "b".into(),
                sha256: "cc".repeat(32),
                k: 2,
            }],
            "cpu",
            serde_json::json!({"temperature": 0.0}),
        )
    }
}

pub fn generation(turn: u32, path: PathKind, model: &str, ids: &[u32]) -> Event {
    Event::Generation {
        turn,
        path,
        model: model.into(),
        text: format!("{ids:?}"),
        token_ids: ids.to_vec(),
        prompt_tokens: 10,
        timings: GenerationTimings {
            prefill_ms: 10.0,
            first_token_ms: 12.0,
            decode_tokens_per_s: 50.0,
            total_ms: 100.0,
            waited_ms: None,
        },
        stop: StopKind::Eos,
    }
}

pub fn metrics(cosine: &[f64], top1: f64, kl: Option<f64>) -> SwitchMetrics {
    SwitchMetrics {
        attention_cosine: cosine.to_vec(),
        r2_k: vec![0.9, 0.8],
        r2_v: vec![0.7, 0.6],
        key_error_concentration: vec![0.1, 0.2],
        top1_agreement: Some(top1),
        kl,
    }
}

/// Turn 1 on `a`; switch 0 to `b` (mapped, 20x faster in full, 10x on the suffix);
/// turn 2 identical on both paths; turn 3 differs at token 1; switch 1 back to `a`
/// (gate chose to re-prefill); turn 4 on `a`.
pub fn events() -> Vec<Event> {
    use PathKind::{Mapped, Reference};
    vec![
        Event::Ready {
            models: models(),
            active: 0,
            mappers: header().mappers,
            device: "cpu".into(),
        },
        Event::UserMessage {
            turn: 1,
            text: "hi".into(),
        },
        Event::TurnStarted {
            turn: 1,
            path: Mapped,
            model: "a".into(),
            cache: CacheOrigin::True,
            repaired: None,
        },
        generation(1, Mapped, "a", &[1, 2, 3, 4]),
        Event::Done { turn: 1 },
        Event::Switch(baton_protocol::SwitchEvent {
            index: 0,
            turn: 2,
            from: "a".into(),
            to: "b".into(),
            context_tokens: 14,
            suffix_tokens: 14,
            timings: SwitchTimings {
                source_prefill_ms: Some(30.0),
                map_full_ms: Some(2.0),
                map_suffix_ms: Some(1.0),
                reprefill_full_ms: Some(40.0),
                reprefill_suffix_ms: Some(10.0),
                end_to_end_ms: 3.0,
            },
            metrics: Some(metrics(&[0.9, 0.7], 0.8, Some(0.1))),
            gate: Some(GateDecision {
                threshold: 0.5,
                estimate: 0.8,
                used: CacheOrigin::Mapped,
                basis: None,
            }),
            measurement_follows: false,
            estimate: None,
            mapper: None,
            reread: None,
        }),
        Event::UserMessage {
            turn: 2,
            text: "more".into(),
        },
        Event::TurnStarted {
            turn: 2,
            path: Mapped,
            model: "b".into(),
            cache: CacheOrigin::Mapped,
            repaired: None,
        },
        Event::TurnStarted {
            turn: 2,
            path: Reference,
            model: "b".into(),
            cache: CacheOrigin::Reprefilled,
            repaired: None,
        },
        generation(2, Mapped, "b", &[5, 6, 7, 8]),
        generation(2, Reference, "b", &[5, 6, 7, 8]),
        Event::TurnComparison {
            turn: 2,
            identical: true,
            first_difference: None,
            agreement: 1.0,
        },
        Event::Done { turn: 2 },
        Event::UserMessage {
            turn: 3,
            text: "again".into(),
        },
        generation(3, Mapped, "b", &[9, 10, 11, 12]),
        generation(3, Reference, "b", &[9, 13, 11, 12]),
        Event::TurnComparison {
            turn: 3,
            identical: false,
            first_difference: Some(1),
            agreement: 0.5,
        },
        Event::Bookmark {
            turn: 3,
            note: "drift".into(),
        },
        Event::Done { turn: 3 },
        Event::Switch(baton_protocol::SwitchEvent {
            index: 1,
            turn: 4,
            from: "b".into(),
            to: "a".into(),
            context_tokens: 40,
            suffix_tokens: 26,
            timings: SwitchTimings {
                source_prefill_ms: None,
                map_full_ms: Some(4.0),
                map_suffix_ms: Some(2.0),
                reprefill_full_ms: Some(20.0),
                reprefill_suffix_ms: None,
                end_to_end_ms: 21.0,
            },
            metrics: Some(metrics(&[0.8, 0.5], 0.6, None)),
            gate: Some(GateDecision {
                threshold: 0.5,
                estimate: 0.4,
                used: CacheOrigin::Reprefilled,
                basis: None,
            }),
            measurement_follows: false,
            estimate: None,
            mapper: None,
            reread: None,
        }),
        Event::UserMessage {
            turn: 4,
            text: "last".into(),
        },
        generation(4, Mapped, "a", &[1]),
        Event::Done { turn: 4 },
        Event::Error {
            message: "slow disk".into(),
            fatal: false,
        },
        Event::ShutDown,
    ]
}

/// `events` as a baton of session format 1.1 writes them: each switch's handoff first,
/// its measurement after the turn that followed it (the measurement gave way to it).
pub fn measured_later(events: Vec<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    let mut waiting: Option<Event> = None;
    for e in events {
        match e {
            Event::Switch(baton_protocol::SwitchEvent {
                index,
                turn,
                from,
                to,
                context_tokens,
                suffix_tokens,
                timings,
                metrics,
                gate,
                ..
            }) => {
                out.push(Event::Switch(baton_protocol::SwitchEvent {
                    index,
                    turn,
                    from,
                    to,
                    context_tokens,
                    suffix_tokens,
                    timings: SwitchTimings {
                        map_full_ms: None,
                        reprefill_full_ms: None,
                        reprefill_suffix_ms: None,
                        ..timings
                    },
                    metrics: None,
                    gate,
                    measurement_follows: true,
                    estimate: None,
                    mapper: None,
                    reread: None,
                }));
                waiting = Some(Event::SwitchMeasured {
                    index,
                    turn,
                    timings,
                    metrics,
                    yielded_to: vec![turn],
                    stopped: None,
                    estimate: None,
                });
            }
            Event::Done { .. } => {
                out.push(e);
                out.extend(waiting.take());
            }
            other => out.push(other),
        }
    }
    out.extend(waiting);
    out
}

pub fn session_of(events: Vec<Event>) -> Session {
    Session {
        header: header(),
        events: events
            .into_iter()
            .enumerate()
            .map(|(i, event)| RecordedEvent {
                seq: i as u64,
                t_ms: i as f64 * 10.0,
                event,
            })
            .collect(),
        warnings: vec![],
    }
}

pub fn session() -> Session {
    session_of(events())
}

/// `events` with switch 0's plan re-reading positions 1..8 of 30 (7) at its next
/// message, choosing in 1.5 ms and re-reading in 10, and dropping `dropped`.
pub fn with_reread(mut events: Vec<Event>, setting: &str, dropped: Vec<[usize; 2]>) -> Vec<Event> {
    let at = events
        .iter()
        .position(|e| matches!(e, Event::Switch(s) if s.index == 0))
        .expect("a first switch");
    events.insert(
        at + 1,
        Event::SwitchReread {
            index: 0,
            turn: 2,
            setting: setting.into(),
            positions: 7,
            context_tokens: 30,
            spans: vec![[1, 8]],
            texts: vec!["x".into()],
            select_ms: 1.5,
            reread_ms: 10.0,
            dropped,
            reprefilled: false,
            parts: Vec::new(),
            predicted_ms: None,
            reprefill_predicted_ms: None,
            layer_positions: None,
            layers_ms: None,
        },
    );
    events
}

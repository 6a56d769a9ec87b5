//! The Command/Event types: the only contract between the engine and its callers (the
//! terminal UI, the headless runner, session files). It depends on nothing else in the
//! crate, so a caller that only reads or writes these never has to pull in the engine.
//!
//! Every type is tagged with a `"type"` field in snake case, so a session file stays
//! readable line by line.

mod commands;
mod events;
mod float;
mod ids;
mod kinds;
mod measures;
pub mod plan;
pub mod summary;
mod switch_row;

pub use commands::Command;
pub use events::{setting, Event, SwitchEvent};
pub use ids::ModelName;
pub use kinds::{CacheOrigin, MapperInfo, ModelInfo, PathKind, PlanPart, PlanText, StopKind};
pub use measures::{
    finite_mean, unverified_baseline, EstimateBasis, GateDecision, GenerationTimings, MapperState,
    SwitchEstimate, SwitchMetrics, SwitchTimings,
};
pub use switch_row::{FollowUp, Measure, RereadDone, SwitchRow, SwitchRows};

#[cfg(test)]
mod tests {
    use super::*;

    fn timings() -> GenerationTimings {
        GenerationTimings {
            prefill_ms: 12.5,
            first_token_ms: 14.0,
            decode_tokens_per_s: 31.0,
            total_ms: 400.0,
            waited_ms: None,
        }
    }

    fn switch_timings() -> SwitchTimings {
        SwitchTimings {
            source_prefill_ms: Some(80.0),
            map_full_ms: Some(4.0),
            map_suffix_ms: Some(1.0),
            reprefill_full_ms: Some(120.0),
            reprefill_suffix_ms: Some(5.0),
            end_to_end_ms: 6.5,
        }
    }

    fn one_of_each() -> Vec<Event> {
        let model = ModelInfo {
            name: "a".into(),
            path: "models/a.gguf".into(),
            sha256: "ab".repeat(32),
            arch: "qwen2".into(),
            n_layer: 24,
            n_kv_head: 2,
            head_dim: 64,
        };
        vec![
            Event::Loading {
                stage: "calibrating".into(),
                done: 3,
                total: 10,
                eta_seconds: Some(4.5),
            },
            Event::Ready {
                models: vec![
                    model.clone(),
                    ModelInfo {
                        name: "b".into(),
                        ..model
                    },
                ],
                active: 0,
                mappers: vec![MapperInfo {
                    id: "a--b.safetensors".into(),
                    source: "a".into(),
                    target: "b".into(),
                    sha256: "cd".repeat(32),
                    k: 4,
                }],
                device: "cpu".into(),
            },
            Event::UserMessage {
                turn: 1,
                text: "hello \"there\"\n".into(),
            },
            Event::TurnStarted {
                turn: 1,
                path: PathKind::Reference,
                model: "b".into(),
                cache: CacheOrigin::Reprefilled,
                repaired: None,
            },
            Event::Token {
                turn: 1,
                path: PathKind::Mapped,
                text: "hi".into(),
                id: 7,
            },
            Event::PrefillProgress {
                turn: 1,
                path: PathKind::Mapped,
                done: 512,
                total: 900,
            },
            Event::Generation {
                turn: 1,
                path: PathKind::Mapped,
                model: "a".into(),
                text: "hi there".into(),
                token_ids: vec![7, 8, 9],
                prompt_tokens: 20,
                timings: timings(),
                stop: StopKind::MaxTokens,
            },
            Event::Switch(SwitchEvent {
                index: 0,
                turn: 2,
                from: "a".into(),
                to: "b".into(),
                context_tokens: 100,
                suffix_tokens: 10,
                timings: switch_timings(),
                metrics: Some(SwitchMetrics {
                    attention_cosine: vec![0.9, 0.8],
                    r2_k: vec![0.7, 0.6],
                    r2_v: vec![0.5, 0.4],
                    key_error_concentration: vec![0.3, 0.2],
                    top1_agreement: Some(0.75),
                    kl: None,
                }),
                gate: Some(GateDecision {
                    threshold: 0.9,
                    estimate: 0.95,
                    used: CacheOrigin::Mapped,
                    basis: Some(EstimateBasis::Predicted),
                }),
                measurement_follows: false,
                estimate: Some(SwitchEstimate {
                    feature_distance: Some(1.2),
                    round_trip: Some(0.93),
                    predicted_cosine: Some(0.95),
                }),
                mapper: Some(MapperState {
                    updates: 2,
                    learned_tokens: 300,
                }),
                reread: Some("20%:source-attention:word".into()),
            }),
            Event::SwitchReread {
                index: 0,
                turn: 2,
                setting: "20%:source-attention:word".into(),
                positions: 12,
                context_tokens: 60,
                spans: vec![[0, 4], [30, 38]],
                texts: vec!["<|im_start|>system".into(), " 48,000 dollars".into()],
                select_ms: 3.5,
                reread_ms: 41.0,
                dropped: vec![[4, 30]],
                reprefilled: false,
                parts: vec![
                    PlanText {
                        part: PlanPart::Reread,
                        text: "<|im_start|>system".into(),
                    },
                    PlanText {
                        part: PlanPart::Dropped,
                        text: " the meeting".into(),
                    },
                ],
                predicted_ms: Some(50.0),
                reprefill_predicted_ms: Some(120.0),
                layer_positions: None,
                layers_ms: None,
            },
            Event::SwitchMeasured {
                index: 0,
                turn: 2,
                timings: switch_timings(),
                metrics: None,
                yielded_to: vec![2],
                stopped: Some("cancelled".into()),
                estimate: None,
            },
            Event::TurnComparison {
                turn: 2,
                identical: false,
                first_difference: Some(3),
                agreement: 0.5,
            },
            Event::SwitchFollowUp {
                index: 0,
                turn: 2,
                top1_agreement: Some(0.9),
                kl: Some(0.2),
                positions: 17,
                first_token_ms: 120.0,
                end_to_end_ms: 310.5,
            },
            Event::MapperLearned {
                index: 0,
                turn: 2,
                from: "a".into(),
                to: "b".into(),
                tokens: 120,
                held_out: 40,
                before: 0.7,
                after: 0.75,
                conversation_before: 0.6,
                conversation_after: 0.7,
                calibration_before: Some(0.8),
                calibration_after: None,
                accepted: true,
                learned_tokens: 500,
                seconds: 2.5,
                kept: true,
            },
            Event::BackgroundCalibration {
                from: "a".into(),
                to: "b".into(),
                windows: 30,
                full: 128,
                accepted: true,
                before: 0.8,
                after: 0.81,
                kept: true,
            },
            Event::RepairProgress {
                model: "b".into(),
                repaired: 256,
                total: 900,
            },
            Event::CacheRepaired {
                index: 0,
                turn: 3,
                model: "b".into(),
                repaired: 900,
                total: 900,
                complete: true,
                after_switch_ms: 9000.0,
                compute_ms: 6500.0,
            },
            Event::SettingChanged {
                turn: 2,
                setting: setting::REREAD.into(),
                value: "40%:facts:word".into(),
            },
            Event::Notice {
                message: "switch queued".into(),
            },
            Event::Bookmark {
                turn: 2,
                note: "drift starts".into(),
            },
            Event::Error {
                message: "out of memory".into(),
                fatal: true,
            },
            Event::Done { turn: 2 },
            Event::ShutDown,
        ]
    }

    #[test]
    fn every_event_round_trips_through_json() {
        let events = one_of_each();
        assert_eq!(events.len(), Event::TYPES.len());
        for e in events {
            let line = serde_json::to_string(&e).unwrap();
            assert!(!line.contains('\n'), "{line}");
            let back: Event = serde_json::from_str(&line).unwrap();
            assert_eq!(back, e, "{line}");
        }
    }

    #[test]
    fn every_event_carries_a_listed_snake_case_tag() {
        let tags: Vec<String> = one_of_each()
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(tags, Event::TYPES);
    }

    #[test]
    fn every_command_round_trips_through_json() {
        let commands = vec![
            Command::Submit { text: "x".into() },
            Command::Switch,
            Command::Cancel,
            Command::SetReference { enabled: true },
            Command::Bookmark { note: "n".into() },
            Command::Finish,
            Command::Shutdown,
        ];
        for c in commands {
            let line = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Command>(&line).unwrap(), c);
        }
        assert_eq!(
            serde_json::to_string(&Command::SetReference { enabled: false }).unwrap(),
            r#"{"type":"set_reference","enabled":false}"#
        );
    }

    #[test]
    fn only_tokens_and_progress_are_left_out_of_the_file() {
        let left_out: Vec<&str> = one_of_each()
            .iter()
            .filter(|e| !e.is_recorded())
            .map(|e| match e {
                Event::Token { .. } => "token",
                Event::PrefillProgress { .. } => "prefill_progress",
                Event::Loading { .. } => "loading",
                Event::RepairProgress { .. } => "repair_progress",
                _ => "other",
            })
            .collect();
        assert_eq!(
            left_out,
            ["loading", "token", "prefill_progress", "repair_progress"]
        );
    }

    #[test]
    fn non_finite_metrics_survive_a_round_trip() {
        let m = SwitchMetrics {
            attention_cosine: vec![f64::NAN, 0.5],
            r2_k: vec![],
            r2_v: vec![],
            key_error_concentration: vec![],
            top1_agreement: Some(f64::NAN),
            kl: Some(f64::INFINITY),
        };
        let back: SwitchMetrics =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert!(back.attention_cosine[0].is_nan());
        assert_eq!(back.attention_cosine[1], 0.5);
        assert_eq!(back.top1_agreement, None);
        assert_eq!(back.kl, None);
        // A layer that could not be measured is not averaged away.
        assert_eq!(back.cosine_mean(), None);
        assert_eq!(back.cosine_min(), None);
        assert_eq!(back.first_uncomputed_layer(), Some(0));
        let finite = SwitchMetrics {
            attention_cosine: vec![0.25, 0.5],
            ..back
        };
        assert_eq!(finite.cosine_mean(), Some(0.375));
        assert_eq!(finite.cosine_min(), Some(0.25));
    }

    #[test]
    fn speedups_are_reprefill_over_map() {
        let t = switch_timings();
        assert_eq!(t.speedup_full(), Some(30.0));
        assert_eq!(t.speedup_suffix(), Some(5.0));
        let unmeasured = SwitchTimings {
            reprefill_full_ms: None,
            map_suffix_ms: Some(0.0),
            ..t
        };
        assert_eq!(unmeasured.speedup_full(), None);
        assert_eq!(unmeasured.speedup_suffix(), None);
        // A handoff event, before its measurement: no full map timed yet.
        let handoff = SwitchTimings {
            map_full_ms: None,
            ..t
        };
        assert_eq!(handoff.speedup_full(), None);
    }

    #[test]
    fn a_switch_keeps_its_fields_flat_beside_the_tag() {
        // Session files predate the named switch struct: its fields must stay at the top
        // level of the tagged object, not nest under a key.
        let switch = one_of_each()
            .into_iter()
            .find(|e| matches!(e, Event::Switch(_)))
            .expect("the fixture has a switch");
        let v = serde_json::to_value(&switch).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj["type"], "switch");
        for key in [
            "index",
            "turn",
            "from",
            "to",
            "context_tokens",
            "timings",
            "gate",
        ] {
            assert!(obj.contains_key(key), "{key} missing from {v}");
        }
        assert!(obj.values().all(|x| x.get("index").is_none()));
    }

    #[test]
    fn a_switch_line_from_an_older_session_still_reads() {
        // Format 1.0: everything measured before the event, no `measurement_follows`.
        let line = r#"{"type":"switch","index":0,"turn":2,"from":"a","to":"b","context_tokens":9,"suffix_tokens":9,"timings":{"source_prefill_ms":null,"map_full_ms":4.0,"map_suffix_ms":null,"reprefill_full_ms":40.0,"reprefill_suffix_ms":null,"end_to_end_ms":5.0},"metrics":null,"gate":null}"#;
        match serde_json::from_str::<Event>(line).unwrap() {
            Event::Switch(SwitchEvent {
                timings,
                measurement_follows,
                ..
            }) => {
                assert!(!measurement_follows);
                assert_eq!(timings.map_full_ms, Some(4.0));
                assert_eq!(timings.speedup_full(), Some(10.0));
            }
            other => panic!("{other:?}"),
        }
        // A measurement event written without its optional fields.
        let line = r#"{"type":"switch_measured","index":1,"turn":3,"timings":{"map_full_ms":2.0,"end_to_end_ms":1.0},"metrics":null}"#;
        match serde_json::from_str::<Event>(line).unwrap() {
            Event::SwitchMeasured {
                yielded_to,
                stopped,
                timings,
                ..
            } => {
                assert!(yielded_to.is_empty() && stopped.is_none());
                assert_eq!(timings.map_full_ms, Some(2.0));
                assert_eq!(timings.reprefill_full_ms, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cosine_summaries_of_no_layers_are_none() {
        let m = SwitchMetrics {
            attention_cosine: vec![],
            r2_k: vec![],
            r2_v: vec![],
            key_error_concentration: vec![],
            top1_agreement: None,
            kl: None,
        };
        assert_eq!(m.cosine_mean(), None);
        assert_eq!(m.cosine_min(), None);
    }
}

//! The handoff engine on two tiny chat models generated here, with mappers calibrated
//! between them on the spot: the two-event switch (the handoff, then its measurement),
//! a message that goes ahead of a measurement, cancels during a measurement and during
//! generation, a switch queued behind a turn, the gate and pre-mapping. Most tests drive
//! the engine on the test's thread with commands placed in its channel beforehand, so
//! what the engine finds between two steps is known, not raced for.

mod common;

use baton::calibrate::{calibrate, save_fitted, CalibrateOptions, Direction, NoProgress, SelectBy};
use baton::data::corpus::Document;
use baton::engine::{self, load, Engine, EngineConfig, EngineHandle, Envelope, Settings};
use baton::headless::script;
use baton::mapper::artifact::CorpusInfo;
use baton::model::Model;
use baton::protocol::{CacheOrigin, Command, Event, PathKind, StopKind, SwitchMetrics};
use candle_core::Device;
use common::synthetic::{load as load_model, Tiny};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Duration;

fn tiny() -> Tiny {
    Tiny {
        context: 1024,
        ..Tiny::new("qwen2")
    }
}

fn calibration() -> CalibrateOptions {
    CalibrateOptions {
        sequences: 6,
        seq_len: 48,
        stride: 1,
        select_sequences: 2,
        probes: 8,
        k_sweep: vec![2],
        lambdas: vec![0.01],
        max_k: usize::MAX,
        k_tolerance: 0.0,
        standardize: true,
        skip_first: 0,
        rank: None,
        select_by: SelectBy::Cosine,
        chat_share: 0.0,
        token_features: baton::calibrate::TokenFeatures::Off,
        key_gain: 1.0,
        key_gain_matched: false,
        value_gain: 1.0,
        ..CalibrateOptions::default()
    }
}

/// Two chat models `a` and `b` and their mappers both ways, written under `dir`.
fn write_pair(dir: &Path) -> (Model, Model) {
    let t = tiny();
    t.write_chat_model(&dir.join("a"), 5);
    t.write_chat_model(&dir.join("b"), 6);
    let (a, b) = (
        load_model(&dir.join("a"), "a"),
        load_model(&dir.join("b"), "b"),
    );
    let docs: Vec<Document> = (0..3)
        .map(|i| Document::new(format!("d{i}"), t.chat_text(2000, 21 + i)))
        .collect();
    let fitted = calibrate(
        &a,
        &b,
        &docs,
        &[Direction::Forward, Direction::Backward],
        &calibration(),
        &NoProgress,
        &AtomicBool::new(false),
    )
    .unwrap();
    let corpus = CorpusInfo {
        files: "synthetic".into(),
        fingerprint: "synthetic".into(),
        sequences: 6,
        seq_len: 48,
        observations: 0,
    };
    save_fitted(
        &fitted,
        [&a, &b],
        &corpus,
        &baton::mapper::dir::MapperDir::named(dir.join("mappers")),
    )
    .unwrap();
    (a, b)
}

/// An engine on the pair, its command channel and its events.
struct Rig {
    _dir: tempfile::TempDir,
    engine: Engine,
    tx: Sender<Envelope>,
    rx: Receiver<Envelope>,
    events: Receiver<Event>,
    /// The calibration cosine of the mapper a -> b and of b -> a.
    calibration: [f64; 2],
}

fn rig(settings: impl FnOnce(&mut Settings)) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = write_pair(dir.path());
    let mappers = baton::mapper::dir::MapperDir::named(dir.path().join("mappers"));
    let m01 = load::load_mapper(&mappers, &a, &b).unwrap();
    let m10 = load::load_mapper(&mappers, &b, &a).unwrap();
    let calibration = [m01.calibration_cosine, m10.calibration_cosine];
    let mut config = EngineConfig::new(["a".into(), "b".into()], Device::Cpu);
    config.settings.max_tokens = 6;
    // These tests study the handoff itself; the learning ones turn it on.
    config.settings.learn = false;
    settings(&mut config.settings);
    let (etx, events) = channel();
    let engine = engine::build(a, b, [m01, m10], config, etx).unwrap();
    let (tx, rx) = channel();
    let rig = Rig {
        _dir: dir,
        engine,
        tx,
        rx,
        events,
        calibration,
    };
    assert!(matches!(rig.drain().first(), Some(Event::Ready { .. })));
    rig
}

impl Rig {
    /// Put a command in the engine's channel, for it to find at its next look.
    fn queue(&self, c: Command) {
        self.tx.send(c.into()).unwrap();
    }

    /// Carry out a command now, on this thread.
    fn handle(&mut self, c: Command) -> Vec<Event> {
        self.engine.handle(c.into(), &self.rx);
        self.drain()
    }

    fn drain(&self) -> Vec<Event> {
        let events: Vec<Event> = self.events.try_iter().collect();
        for e in &events {
            if let Event::Error { message, .. } = e {
                panic!("engine error: {message}");
            }
        }
        events
    }

    /// The engine on a thread of its own from here on.
    fn start(self) -> (EngineHandle, tempfile::TempDir, [f64; 2]) {
        let handle = engine::run_built(self.engine, (self.tx, self.rx), self.events);
        (handle, self._dir, self.calibration)
    }
}

/// Events until one satisfies `stop` (included).
fn until(handle: &EngineHandle, stop: impl Fn(&Event) -> bool) -> Vec<Event> {
    let mut seen = Vec::new();
    loop {
        let e = handle
            .events
            .recv_timeout(Duration::from_secs(60))
            .expect("an event within a minute");
        if let Event::Error { message, .. } = &e {
            panic!("engine error: {message}");
        }
        let done = stop(&e);
        seen.push(e);
        if done {
            return seen;
        }
    }
}

fn position(events: &[Event], f: impl Fn(&Event) -> bool) -> Option<usize> {
    events.iter().position(f)
}

fn measured(events: &[Event]) -> Option<&Event> {
    events
        .iter()
        .find(|e| matches!(e, Event::SwitchMeasured { .. }))
}

fn metrics_of(e: Option<&Event>) -> SwitchMetrics {
    match e {
        Some(Event::SwitchMeasured {
            metrics: Some(m), ..
        }) => m.clone(),
        other => panic!("no measured metrics: {other:?}"),
    }
}

fn say(r: &mut Rig, words: usize, seed: u64) -> Vec<Event> {
    let text = tiny().chat_text(words, seed);
    let events = r.handle(Command::Submit { text });
    assert!(
        events.iter().any(|e| matches!(e, Event::Done { .. })),
        "{events:?}"
    );
    events
}

#[test]
fn a_switch_reports_its_handoff_first_and_its_measurement_after() {
    let mut r = rig(|_| {});
    say(&mut r, 12, 1);
    assert_eq!(r.engine.active(), 0);
    let events = r.handle(Command::Switch);
    let [Event::Switch(baton::protocol::SwitchEvent {
        index: 0,
        timings,
        metrics: None,
        measurement_follows: true,
        context_tokens,
        ..
    })] = events.as_slice()
    else {
        panic!("the handoff alone: {events:?}");
    };
    // The handoff timed itself and nothing else.
    let handoff_ms = timings.end_to_end_ms;
    assert!(handoff_ms > 0.0);
    assert_eq!(timings.map_full_ms, None);
    assert_eq!(timings.reprefill_full_ms, None);
    assert_eq!(r.engine.active(), 1, "the target is ready");
    assert!(r.engine.measurement_pending());

    r.engine.measure_pending(&r.rx);
    let events = r.drain();
    let Some(Event::SwitchMeasured {
        index: 0,
        turn: 2,
        timings,
        metrics: Some(m),
        yielded_to,
        stopped: None,
        ..
    }) = events.first()
    else {
        panic!("the measurement: {events:?}");
    };
    assert!(!r.engine.measurement_pending());
    assert!(yielded_to.is_empty());
    assert!(timings.map_full_ms.is_some_and(|t| t > 0.0), "{timings:?}");
    assert!(timings.reprefill_full_ms.is_some_and(|t| t > 0.0));
    // The handoff's own time is repeated, not measured again.
    assert_eq!(timings.end_to_end_ms, handoff_ms);
    assert_eq!(m.attention_cosine.len(), tiny().n_layer);
    assert_eq!(m.r2_k.len(), tiny().n_layer);
    for c in &m.attention_cosine {
        assert!(c.is_finite() && *c <= 1.0 + 1e-9 && *c > -1.0, "{c}");
    }
    assert!(*context_tokens > 12);
}

#[test]
fn a_message_sent_right_after_the_switch_goes_before_its_measurement() {
    let mut r = rig(|_| {});
    say(&mut r, 12, 1);
    r.handle(Command::Switch);
    let text = tiny().chat_text(8, 2);
    r.queue(Command::Submit { text: text.clone() });
    // The measurement looks at the commands before each step and gives way.
    r.engine.measure_pending(&r.rx);
    assert!(r.engine.measurement_pending());
    assert!(measured(&r.drain()).is_none());
    let (handle, _dir, _) = r.start();
    let events = until(&handle, |e| matches!(e, Event::SwitchMeasured { .. }));
    let first_token = position(&events, |e| {
        matches!(
            e,
            Event::Token {
                turn: 2,
                path: PathKind::Mapped,
                ..
            }
        )
    })
    .expect("the mapped answer streams");
    let at_measured = events.len() - 1;
    assert!(first_token < at_measured, "{events:?}");
    let Some(Event::SwitchMeasured {
        yielded_to,
        stopped: None,
        ..
    }) = events.last()
    else {
        panic!("{events:?}");
    };
    assert_eq!(yielded_to, &[2], "reported as postponed for turn 2");
    // The comparison work comes after the mapped answer: the follow-up and the
    // reference answer follow its Generation.
    let mapped_done = position(&events, |e| {
        matches!(
            e,
            Event::Generation {
                turn: 2,
                path: PathKind::Mapped,
                ..
            }
        )
    })
    .unwrap();
    let follow_up = position(&events, |e| matches!(e, Event::SwitchFollowUp { .. })).unwrap();
    let reference = position(&events, |e| {
        matches!(
            e,
            Event::TurnStarted {
                path: PathKind::Reference,
                ..
            }
        )
    })
    .unwrap();
    assert!(
        mapped_done < follow_up && follow_up < reference,
        "{events:?}"
    );
    let Event::SwitchFollowUp {
        top1_agreement,
        first_token_ms,
        end_to_end_ms,
        positions,
        ..
    } = &events[follow_up]
    else {
        unreachable!()
    };
    assert!(top1_agreement.is_some() && *positions > 0);
    // Counted from the message's sending, which came before the turn started.
    assert!(
        end_to_end_ms >= first_token_ms,
        "{end_to_end_ms} {first_token_ms}"
    );
    handle.shutdown();

    // Postponed past a turn, the measurement measures what it would have at once.
    let mut r = rig(|_| {});
    say(&mut r, 12, 1);
    r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    let at_once = metrics_of(measured(&r.drain()));
    let later = metrics_of(events.last());
    assert_eq!(at_once.attention_cosine, later.attention_cosine);
    assert_eq!(at_once.r2_k, later.r2_k);
}

#[test]
fn a_cancel_stops_the_measurement_and_the_handoff_stands() {
    let mut r = rig(|_| {});
    say(&mut r, 12, 1);
    r.handle(Command::Switch);
    r.queue(Command::Cancel);
    r.engine.measure_pending(&r.rx);
    let events = r.drain();
    let [Event::SwitchMeasured {
        index: 0,
        timings,
        metrics: None,
        stopped: Some(why),
        ..
    }] = events.as_slice()
    else {
        panic!("{events:?}");
    };
    assert_eq!(why, "cancelled");
    assert_eq!(timings.map_full_ms, None, "stopped before its first step");
    assert!(!r.engine.measurement_pending());
    // The next turn answers from the handed-over cache.
    let events = say(&mut r, 6, 3);
    assert!(events.iter().any(|e| matches!(
        e,
        Event::TurnStarted {
            path: PathKind::Mapped,
            cache: CacheOrigin::Mapped,
            model,
            ..
        } if model == "b"
    )));
}

#[test]
fn a_cancel_during_the_prefill_stops_it_and_the_conversation_goes_on() {
    let mut r = rig(|s| s.max_tokens = 200);
    r.queue(Command::Cancel);
    let events = say(&mut r, 8, 1);
    let stops: Vec<(StopKind, usize)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Generation {
                stop, token_ids, ..
            } => Some((*stop, token_ids.len())),
            _ => None,
        })
        .collect();
    // Seen while the prompt is read (before its first layer): nothing is generated,
    // and the turn still completes.
    assert_eq!(stops, [(StopKind::Cancelled, 0)]);
    let events = say(&mut r, 4, 2);
    let Some(Event::Generation {
        stop, token_ids, ..
    }) = events
        .iter()
        .find(|e| matches!(e, Event::Generation { .. }))
    else {
        panic!("{events:?}");
    };
    assert_eq!((*stop, token_ids.len()), (StopKind::MaxTokens, 200));
}

#[test]
fn a_switch_sent_during_a_turn_runs_after_it() {
    let mut r = rig(|_| {});
    r.queue(Command::Switch);
    let events = say(&mut r, 8, 1);
    let notice = position(
        &events,
        |e| matches!(e, Event::Notice { message } if message.contains("switch queued")),
    );
    assert!(notice.is_some(), "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, Event::Switch(_))));
    assert_eq!(r.engine.active(), 0);
    let (handle, _dir, _) = r.start();
    let events = until(&handle, |e| matches!(e, Event::SwitchMeasured { .. }));
    assert!(
        matches!(&events[0], Event::Switch(baton::protocol::SwitchEvent { from, to, .. }) if from == "a" && to == "b"),
        "{events:?}"
    );
    handle.shutdown();
}

#[test]
fn the_gate_decides_at_the_handoff_from_what_it_knows_then() {
    // Above any cosine: the gate re-prefills, estimating from the calibration first.
    let mut r = rig(|s| s.gate = Some(2.0));
    let calibration = r.calibration;
    say(&mut r, 12, 1);
    let events = r.handle(Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent {
        gate: Some(g),
        timings,
        ..
    })) = events.first()
    else {
        panic!("{events:?}");
    };
    assert_eq!(g.used, CacheOrigin::Reprefilled);
    assert_eq!(g.estimate, calibration[0]);
    assert_eq!(timings.map_suffix_ms, None, "nothing was mapped");
    r.engine.measure_pending(&r.rx);
    // Measured on the cache the map would have given.
    let cosine = metrics_of(measured(&r.drain())).cosine_mean().unwrap();
    let events = say(&mut r, 6, 2);
    assert!(events.iter().any(|e| matches!(
        e,
        Event::TurnStarted {
            path: PathKind::Mapped,
            cache: CacheOrigin::Reprefilled,
            ..
        }
    )));
    // Back the other way: that direction has no measurement yet.
    let events = r.handle(Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent { gate: Some(g), .. })) = events.first()
    else {
        panic!("{events:?}");
    };
    assert_eq!(g.estimate, calibration[1]);
    r.engine.measure_pending(&r.rx);
    r.drain();
    say(&mut r, 6, 3);
    // The first way again: the cosine measured there is the estimate now.
    let events = r.handle(Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent { gate: Some(g), .. })) = events.first()
    else {
        panic!("{events:?}");
    };
    assert_eq!(g.estimate, cosine);
    assert_ne!(cosine, calibration[0]);

    // Below any cosine: the map goes through.
    let mut r = rig(|s| s.gate = Some(-2.0));
    say(&mut r, 12, 1);
    let events = r.handle(Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent {
        gate: Some(g),
        timings,
        ..
    })) = events.first()
    else {
        panic!("{events:?}");
    };
    assert_eq!(g.used, CacheOrigin::Mapped);
    assert!(timings.end_to_end_ms > 0.0);
}

#[test]
fn pre_mapping_leaves_the_switch_nothing_to_map() {
    let mut r = rig(|s| s.premap = true);
    let events = say(&mut r, 12, 1);
    // After the turn, not before its answer.
    let premapped = match events.as_slice() {
        [.., Event::Done { .. }, Event::Notice { message }]
            if message.starts_with("pre-mapped") =>
        {
            message.clone()
        }
        other => panic!("{other:?}"),
    };
    let events = r.handle(Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent {
        context_tokens,
        suffix_tokens,
        ..
    })) = events.first()
    else {
        panic!("{events:?}");
    };
    assert_eq!(*suffix_tokens, 0);
    // Everything after the anchor the target computes itself.
    let anchor = Settings::default().anchor;
    assert!(
        premapped.starts_with(&format!(
            "pre-mapped {} tokens into b",
            context_tokens - anchor
        )),
        "{premapped}"
    );
}

#[test]
fn a_script_waits_for_the_last_switch_to_be_measured() {
    let r = rig(|_| {});
    let (handle, _dir, _) = r.start();
    let steps = vec![
        Command::Submit {
            text: tiny().chat_text(10, 1),
        },
        Command::Switch,
    ];
    let mut seen = Vec::new();
    script::run_steps(&steps, &|c| handle.send(c), &handle.events, &mut |e| {
        seen.push(e.clone())
    })
    .unwrap();
    assert!(measured(&seen).is_some(), "{seen:?}");
    handle.shutdown();
}

#[test]
fn a_prefill_asked_to_stop_gives_up_before_the_next_layer_and_counts_nothing() {
    use baton::model::{ForwardOptions, Logits, ModelError};
    let dir = tempfile::tempdir().unwrap();
    tiny().write_chat_model(&dir.path().join("a"), 5);
    let m = load_model(&dir.path().join("a"), "a");
    let ids = m.tokenizer.encode(&tiny().chat_text(40, 3)).unwrap();
    let all = ForwardOptions {
        logits: Logits::All,
        probe_positions: vec![],
    };
    let checks = std::cell::Cell::new(0);
    let mut cache = m.decoder.new_cache();
    let e = m
        .decoder
        .forward_until(&ids, &mut cache, &all, &|| {
            checks.set(checks.get() + 1);
            checks.get() > 1
        })
        .unwrap_err();
    assert!(matches!(e, ModelError::Interrupted), "{e}");
    // Asked before the first layer's attention (go on) and before its MLP (stop).
    assert_eq!(checks.get(), 2);
    assert_eq!(cache.len(), 0, "an interrupted chunk adds no position");
    // Never told to stop, it is the plain forward pass.
    let mut a = m.decoder.new_cache();
    let mut b = m.decoder.new_cache();
    let x = m
        .decoder
        .forward_until(&ids, &mut a, &all, &|| false)
        .unwrap();
    let y = m.decoder.forward(&ids, &mut b, &all).unwrap();
    let diff = (x.logits.unwrap() - y.logits.unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(diff, 0.0);
    assert_eq!(a.len(), ids.len());
}

#[test]
fn with_a_tail_the_target_reads_the_newest_tokens_itself() {
    // A tail covering the whole conversation: the target reads all of it, so what it
    // holds is its own prefill and the measurement finds it exact.
    let mut r = rig(|s| {
        s.tail = 10_000;
        s.anchor = 0;
    });
    say(&mut r, 12, 1);
    r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    let whole = metrics_of(measured(&r.drain()));
    for (l, c) in whole.attention_cosine.iter().enumerate() {
        assert!((c - 1.0).abs() < 1e-4, "layer {l}: cosine {c}");
    }
    // No tail: the same conversation handed over mapped is measurably not exact, and a
    // partial tail sits in between on the cosine averaged over the layers.
    let mean = |m: &SwitchMetrics| m.cosine_mean().unwrap();
    let run = |tail: usize| {
        let mut r = rig(|s| {
            s.tail = tail;
            s.anchor = 0;
        });
        say(&mut r, 12, 1);
        let events = r.handle(Command::Switch);
        let Some(Event::Switch(baton::protocol::SwitchEvent { context_tokens, .. })) =
            events.first()
        else {
            panic!("{events:?}");
        };
        let n = *context_tokens;
        r.engine.measure_pending(&r.rx);
        (n, metrics_of(measured(&r.drain())))
    };
    let (n, mapped) = run(0);
    assert!(mean(&mapped) < 1.0 - 1e-3, "{}", mean(&mapped));
    let (_, half) = run(n / 2);
    assert!(
        mean(&half) > mean(&mapped) && mean(&half) < 1.0,
        "{} {}",
        mean(&half),
        mean(&mapped)
    );
}

/// The measured metrics of switch `index` among `events`.
fn metrics_of_switch(events: &[Event], index: u32) -> SwitchMetrics {
    events
        .iter()
        .find_map(|e| match e {
            Event::SwitchMeasured {
                index: i,
                metrics: Some(m),
                ..
            } if *i == index => Some(m.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("switch {index} not measured: {events:?}"))
}

#[test]
fn a_switch_does_not_wait_for_the_last_ones_measurement_which_measures_the_cache_it_handed_over() {
    // Measured before the next switch, as an idle engine does.
    let mut idle = rig(|_| {});
    say(&mut idle, 40, 1);
    idle.handle(Command::Switch);
    idle.engine.measure_pending(&idle.rx);
    let first = metrics_of_switch(&idle.drain(), 0);

    // Switched again at once: the second switch comes before the first one's measurement.
    let mut quick = rig(|_| {});
    say(&mut quick, 40, 1);
    quick.handle(Command::Switch);
    assert!(quick.engine.measurement_pending());
    let back = quick.handle(Command::Switch);
    assert!(
        back.iter().any(|e| matches!(
            e,
            Event::Switch(baton::protocol::SwitchEvent { index: 1, .. })
        )),
        "{back:?}"
    );
    assert!(
        !back
            .iter()
            .any(|e| matches!(e, Event::SwitchMeasured { .. })),
        "the switch did not wait for the measurement: {back:?}"
    );
    quick.engine.measure_pending(&quick.rx);
    let later = quick.drain();
    // Both measured, in the order of their switches, the first on the cache it handed
    // over although the second switch rebuilt it since.
    let order: Vec<u32> = later
        .iter()
        .filter_map(|e| match e {
            Event::SwitchMeasured { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(order, [0, 1]);
    assert_eq!(metrics_of_switch(&later, 0), first);
    metrics_of_switch(&later, 1);
}

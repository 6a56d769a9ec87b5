//! Background repair on two tiny chat models generated here: after a switch the active
//! model re-prefills the conversation into its own cache chunk by chunk while idle, the
//! repaired cache is its own prefill bit for bit (against a prefill in the same chunks;
//! within float rounding of a one-shot prefill), a message goes before it, and it runs
//! only when turned on.

mod common;

use baton::engine::REPAIR_CHUNK;
use baton::model::{ForwardOptions, KvCache, Logits, Model};
use baton::protocol::{CacheOrigin, Command, Event, PathKind};
use common::engine_rig::{models, rig_with, tiny, write_pair, Rig};
use std::time::Duration;

fn no_logits() -> ForwardOptions {
    ForwardOptions {
        logits: Logits::None,
        probe_positions: vec![],
    }
}

/// `model`'s own cache of `ids`, read `chunk` ids at a time.
fn own_prefill(model: &Model, ids: &[u32], chunk: usize) -> KvCache {
    let mut kv = model.decoder.new_cache();
    for piece in ids.chunks(chunk) {
        model.decoder.forward(piece, &mut kv, &no_logits()).unwrap();
    }
    kv
}

fn numbers(kv: &KvCache) -> Vec<Vec<f32>> {
    kv.export()
        .unwrap()
        .iter()
        .flat_map(|l| [&l.k, &l.v])
        .map(|t| t.flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

fn repairing(dir: &std::path::Path, on: bool) -> Rig {
    rig_with(dir, |c| {
        c.settings.repair = on;
        // Without the reference path there is no truth to start from: all is read again.
        c.settings.reference = false;
    })
}

/// A long message, a switch to b and its measurement, and a message b answers.
fn switch_and_answer(r: &mut Rig) {
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(200, 3),
    });
    let _ = r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    let events = r.handle(Command::Submit {
        text: tiny().chat_text(20, 4),
    });
    assert!(events.iter().any(|e| matches!(
        e,
        Event::TurnStarted {
            cache: CacheOrigin::Mapped,
            ..
        }
    )));
}

#[test]
fn a_repaired_cache_is_the_models_own_prefill_and_answers_as_its_own() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = repairing(dir.path(), true);
    switch_and_answer(&mut r);
    let total = r.engine.cache(1).len();
    assert!(total > 2 * REPAIR_CHUNK, "several chunks: {total}");

    r.engine.repair_pending(&r.rx);
    let events = r.drain();
    let progress: Vec<(usize, usize)> = events
        .iter()
        .filter_map(|e| match e {
            Event::RepairProgress {
                repaired, total, ..
            } => Some((*repaired, *total)),
            _ => None,
        })
        .collect();
    let expected: Vec<(usize, usize)> = (1..=total.div_ceil(REPAIR_CHUNK))
        .map(|i| ((i * REPAIR_CHUNK).min(total), total))
        .collect();
    assert_eq!(progress, expected, "a chunk at a time, to the end");
    let Some(Event::CacheRepaired {
        index: 0,
        model,
        repaired,
        complete: true,
        after_switch_ms,
        compute_ms,
        ..
    }) = events.last()
    else {
        panic!("{events:?}");
    };
    assert_eq!((model.as_str(), *repaired), ("b", total));
    assert!(*compute_ms > 0.0 && after_switch_ms >= compute_ms);

    let (_, b) = models(dir.path());
    let ids = &r.engine.history()[..total];
    let repaired = numbers(r.engine.cache(1));
    assert_eq!(
        repaired,
        numbers(&own_prefill(&b, ids, REPAIR_CHUNK)),
        "bit for bit the prefill it ran"
    );
    let whole = numbers(&own_prefill(&b, ids, ids.len()));
    let worst = repaired
        .iter()
        .flatten()
        .zip(whole.iter().flatten())
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0f32, f32::max);
    // One prefill against another cut in chunks: the same sums in another order.
    assert!(worst < 1e-4, "{worst}");

    // The cache is the model's own now: the next answer says so.
    let events = r.handle(Command::Submit {
        text: tiny().chat_text(10, 5),
    });
    assert!(events.iter().any(|e| matches!(
        e,
        Event::TurnStarted {
            path: PathKind::Mapped,
            cache: CacheOrigin::True,
            ..
        }
    )));
}

#[test]
fn a_message_goes_before_the_repair_which_then_covers_it_too() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = repairing(dir.path(), true);
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(200, 3),
    });
    let _ = r.handle(Command::Switch);
    r.queue(Command::Submit {
        text: tiny().chat_text(20, 4),
    });
    let handle = r.start();
    let mut seen = Vec::new();
    loop {
        let e = handle
            .events
            .recv_timeout(Duration::from_secs(60))
            .expect("an event within a minute");
        if let Event::Error { message, .. } = &e {
            panic!("{message}");
        }
        let done = matches!(e, Event::CacheRepaired { .. });
        seen.push(e);
        if done {
            break;
        }
    }
    let at = |f: &dyn Fn(&Event) -> bool| seen.iter().position(f).unwrap();
    let answered = at(&|e| matches!(e, Event::Done { turn: 2 }));
    let first_chunk = at(&|e| matches!(e, Event::RepairProgress { .. }));
    assert!(answered < first_chunk, "the message first: {seen:?}");
    let Some(Event::CacheRepaired {
        repaired,
        total,
        complete: true,
        ..
    }) = seen.last()
    else {
        unreachable!()
    };
    assert_eq!(repaired, total);
    handle.shutdown();
}

#[test]
fn repair_runs_only_when_turned_on() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = repairing(dir.path(), false);
    switch_and_answer(&mut r);
    r.engine.repair_pending(&r.rx);
    let events = r.drain();
    assert!(
        !events.iter().any(|e| matches!(
            e,
            Event::RepairProgress { .. } | Event::CacheRepaired { .. }
        )),
        "off by default: {events:?}"
    );
    let events = r.handle(Command::SetRepair { enabled: true });
    assert!(
        matches!(events.as_slice(), [
            Event::SettingChanged { setting, value, .. },
            Event::Notice { message },
        ] if setting == "repair" && value == "on" && message == "cache repair on"),
        "{events:?}"
    );
    r.engine.repair_pending(&r.rx);
    assert!(r
        .drain()
        .iter()
        .any(|e| matches!(e, Event::CacheRepaired { complete: true, .. })));
}

#[test]
fn a_complete_repair_teaches_the_mapper_even_with_the_reference_path_off() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let mut r = rig_with(dir.path(), |c| {
        c.settings.repair = true;
        c.settings.reference = false;
        c.settings.learn = true;
        c.learning = baton::engine::LearnSetup {
            keep: false,
            use_learned: true,
            slice_docs: Some(common::engine_rig::slice_docs()),
            background_calibration: false,
        };
    });
    r.engine.finish_learning(0, &r.rx);
    r.engine.finish_learning(1, &r.rx);
    switch_and_answer(&mut r);
    // a computed everything it holds itself: its cache of the switch's ids is its own.
    let handed_over = r.engine.cache(0).len();
    r.engine.repair_pending(&r.rx);
    r.engine.finish_learning(0, &r.rx);
    let events = r.drain();
    let learned: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::MapperLearned { .. }))
        .collect();
    let [Event::MapperLearned {
        from,
        to,
        tokens,
        held_out,
        ..
    }] = learned.as_slice()
    else {
        panic!("one step, a -> b: {events:?}");
    };
    assert_eq!((from.as_str(), to.as_str()), ("a", "b"));
    let anchor = r.engine.settings().anchor;
    assert_eq!(
        anchor + tokens + held_out,
        handed_over,
        "every position both own"
    );
}

/// [`repairing`] that repairs only when told how far, as a replay does.
fn paced(dir: &std::path::Path) -> Rig {
    rig_with(dir, |c| {
        c.settings.repair = true;
        c.settings.reference = false;
        c.paced_repair = true;
    })
}

fn repaired_events(events: &[Event]) -> Vec<(usize, usize, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::CacheRepaired {
                repaired,
                total,
                complete,
                ..
            } => Some((*repaired, *total, *complete)),
            _ => None,
        })
        .collect()
}

#[test]
fn every_repair_ends_with_a_record_even_one_cut_short_before_its_first_chunk_or_by_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    // Cut by the next switch before any chunk was read.
    let mut r = paced(dir.path());
    switch_and_answer(&mut r);
    let total = r.engine.cache(1).len();
    let events = r.handle(Command::Switch);
    assert_eq!(
        repaired_events(&events),
        vec![(0, total, false)],
        "{events:?}"
    );

    // Cut by a shutdown: said before `shut_down`.
    let mut r = paced(dir.path());
    switch_and_answer(&mut r);
    let handle = r.start();
    handle.send(Command::Shutdown);
    let mut seen = Vec::new();
    while let Ok(e) = handle.events.recv_timeout(Duration::from_secs(60)) {
        let end = matches!(e, Event::ShutDown);
        seen.push(e);
        if end {
            break;
        }
    }
    let ended = seen
        .iter()
        .position(|e| matches!(e, Event::CacheRepaired { .. }));
    let shut = seen.iter().position(|e| matches!(e, Event::ShutDown));
    assert!(
        ended.is_some() && ended < shut,
        "the repair's end comes before the shutdown: {seen:?}"
    );
}

#[test]
fn a_model_handed_back_what_it_holds_itself_keeps_its_own_cache_and_repairs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = repairing(dir.path(), true);
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(200, 3),
    });
    let _ = r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    // Back to a with nothing said since: a holds the whole conversation itself.
    let _ = r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    r.engine.repair_pending(&r.rx);
    let events = r.drain();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::RepairProgress { model, .. } if model.as_str() == "a")),
        "nothing of a's own cache is read again: {events:?}"
    );
    let events = r.handle(Command::Submit {
        text: tiny().chat_text(10, 5),
    });
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::TurnStarted {
                path: PathKind::Mapped,
                cache: CacheOrigin::True,
                repaired: None,
                ..
            }
        )),
        "{events:?}"
    );
}

/// The last answer shown in `events`.
fn answer_of(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Generation {
                path: PathKind::Mapped,
                token_ids,
                ..
            } => Some(token_ids.clone()),
            _ => None,
        })
        .expect("an answer")
}

#[test]
fn an_answer_records_how_far_the_repair_had_got_and_a_replay_repairs_as_far_first() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = paced(dir.path());
    let mut recorded = r.handle(Command::Submit {
        text: tiny().chat_text(200, 3),
    });
    recorded.extend(r.handle(Command::Switch));
    let said = r.handle(Command::RepairTo {
        positions: REPAIR_CHUNK,
    });
    let total = r.engine.cache(1).len();
    assert!(
        said.iter().any(|e| matches!(e, Event::Notice { message }
            if *message == format!("repaired to {REPAIR_CHUNK} of {total} positions"))),
        "{said:?}"
    );
    recorded.extend(said);
    let answer = r.handle(Command::Submit {
        text: tiny().chat_text(20, 4),
    });
    assert!(
        answer.iter().any(|e| matches!(
            e,
            Event::TurnStarted {
                path: PathKind::Mapped,
                cache: CacheOrigin::Mapped,
                repaired: Some(REPAIR_CHUNK),
                ..
            }
        )),
        "{answer:?}"
    );
    recorded.extend(answer.clone());

    // The replay's steps repair as far before the answer, and it answers the same.
    let steps = baton::headless::script::session_commands(&recorded);
    let repair_at = steps
        .iter()
        .position(|c| matches!(c, Command::RepairTo { positions } if *positions == REPAIR_CHUNK));
    let last_submit = steps
        .iter()
        .rposition(|c| matches!(c, Command::Submit { .. }));
    assert!(repair_at.is_some() && repair_at < last_submit, "{steps:?}");
    let mut again = paced(dir.path());
    let mut replayed = Vec::new();
    for c in steps {
        replayed.extend(again.handle(c));
    }
    assert_eq!(answer_of(&replayed), answer_of(&answer));

    // Without the step, the answer starts over a cache repaired to another point.
    let mut unrepaired = paced(dir.path());
    let _ = unrepaired.handle(Command::Submit {
        text: tiny().chat_text(200, 3),
    });
    let _ = unrepaired.handle(Command::Switch);
    let other = unrepaired.handle(Command::Submit {
        text: tiny().chat_text(20, 4),
    });
    assert!(other.iter().any(|e| matches!(
        e,
        Event::TurnStarted {
            repaired: Some(0),
            ..
        }
    )));
    // The cache answered over is the recording's in the replay, and another without it
    // (a tiny model's answer can be the same tokens over both).
    assert!(numbers(again.engine.cache(1)) == numbers(r.engine.cache(1)));
    assert!(numbers(unrepaired.engine.cache(1)) != numbers(r.engine.cache(1)));
}

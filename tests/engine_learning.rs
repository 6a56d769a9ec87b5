//! The engine learning from its conversation, on two tiny chat models generated here with
//! mappers calibrated between them (statistics kept, as `baton calibrate` does): a
//! measured switch teaches both directions in the background, the next direction first;
//! an update is taken exactly when the held-out cosine does not drop and then becomes
//! the mapper in use, is recorded in the session file and read by the report, and is
//! kept for the next engine to start from. Without saved statistics the engine says it
//! does not learn and carries on.

mod common;

use baton::mapper::artifact::ModelRef;
use baton::mapper::CacheMapper;
use baton::model::{ForwardOptions, Logits, Model};
use baton::protocol::{Event, MapperState};
use baton::session::{read_session, Report};
use common::engine_rig::{models, rig, write_pair};
use std::path::Path;

/// The engine's notices that a direction does not learn.
fn refusals(events: &[Event]) -> Vec<&String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Notice { message } if message.contains("does not learn") => Some(message),
            _ => None,
        })
        .collect()
}

fn learned(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| matches!(e, Event::MapperLearned { .. }))
        .collect()
}

/// `mapper`'s map of a's own cache of some text into b's layout, as numbers.
fn mapped_by(mapper: &CacheMapper, a: &Model, b: &Model) -> Vec<f32> {
    let ids: Vec<u32> = (0..40).map(|i| (i * 7 % 120) as u32 + 3).collect();
    let mut kv = a.decoder.new_cache();
    a.decoder
        .forward(
            &ids,
            &mut kv,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )
        .unwrap();
    let out = mapper
        .map_cache(&kv, &ids, a.decoder.rope(), b.decoder.rope())
        .unwrap();
    out.export().unwrap()[1]
        .k
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn learned_dir(dir: &Path, source: &Model, target: &Model) -> baton::mapper::dir::PairFiles {
    baton::mapper::dir::MapperDir::named(dir.join("mappers")).pair(
        &ModelRef::new(&source.identity, source.config()),
        &ModelRef::new(&target.identity, target.config()),
    )
}

#[test]
fn a_measured_switch_teaches_both_directions_and_what_is_taken_is_used_recorded_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let session = dir.path().join("s.jsonl");
    let mut r = rig(dir.path(), true, Some(session.clone()));
    let opening = r.settle();
    assert!(
        !opening.iter().any(|e| matches!(e, Event::Notice { message }
            if message.contains("learn"))),
        "nothing learned yet, and both directions can learn: {opening:?}"
    );
    let (a, b) = models(dir.path());
    let before = [
        mapped_by(r.engine.mapper(0), &a, &b),
        mapped_by(r.engine.mapper(1), &b, &a),
    ];

    let events = r.talk_and_switch(3);
    let steps = learned(&events);
    assert_eq!(steps.len(), 2, "{events:?}");
    let mut taken = 0;
    for (i, step) in steps.iter().enumerate() {
        let Event::MapperLearned {
            index,
            from,
            to,
            tokens,
            held_out,
            before: b0,
            after: a0,
            accepted,
            learned_tokens,
            kept,
            calibration_before,
            ..
        } = step
        else {
            unreachable!()
        };
        assert_eq!(*index, 0);
        // The next switch goes b -> a: that direction learns first.
        let (s, t) = if i == 0 { ("b", "a") } else { ("a", "b") };
        assert_eq!((from.as_str(), to.as_str()), (s, t));
        assert!(*tokens >= baton::learn::MIN_NEW_POSITIONS && *held_out > 0);
        assert!(
            calibration_before.is_some(),
            "judged on the calibration text too"
        );
        assert_eq!(
            *accepted,
            a0 >= b0,
            "taken exactly when it does not score lower"
        );
        let source = usize::from(i == 0);
        let (src, tgt) = if source == 0 { (&a, &b) } else { (&b, &a) };
        let now = mapped_by(r.engine.mapper(source), src, tgt);
        let meta =
            baton::learn::store::read_meta(&learned_dir(dir.path(), src, tgt), None).unwrap();
        if *accepted {
            taken += 1;
            assert_eq!(*learned_tokens, *tokens as u64);
            assert!(*kept);
            assert_ne!(now, before[source], "the update is the mapper in use");
            assert_eq!(meta.map(|m| m.tokens), Some(*learned_tokens));
        } else {
            assert_eq!(*learned_tokens, 0);
            assert_eq!(now, before[source], "a refused update changes nothing");
            assert!(meta.is_none());
        }
    }
    assert!(
        taken > 0,
        "in-domain chat text should help at least one way: {steps:?}"
    );

    // The session file keeps both steps and the report reads them.
    drop(r);
    let report = Report::from_session(&read_session(&session).unwrap());
    assert_eq!(report.learning.len(), 2);
    assert_eq!(report.learning.iter().filter(|l| l.accepted).count(), taken);
    assert!(report.to_string().contains("learning"));

    // The next engine starts from what was kept, and says so.
    let mut again = rig(dir.path(), true, None);
    let said = again.settle();
    let starts: Vec<&String> = said
        .iter()
        .filter_map(|e| match e {
            Event::Notice { message } if message.contains("what it learned before") => {
                Some(message)
            }
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), taken, "{said:?}");
}

#[test]
fn learning_without_keeping_writes_nothing_and_a_later_switch_fits_only_what_is_new() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let mut r = rig(dir.path(), false, None);
    r.settle();
    let anchor = r.engine.settings().anchor;
    let first = r.talk_and_switch(3);
    let a_first = step_of(&first, "a");
    assert!(matches!(a_first, Event::MapperLearned { kept: false, .. }));
    let (a, b) = models(dir.path());
    assert!(!learned_dir(dir.path(), &a, &b).learned().exists());
    assert!(!learned_dir(dir.path(), &b, &a).learned().exists());
    let (t1, h1, took) = sizes(a_first);
    assert_eq!(
        anchor + t1 + h1,
        context_of(&first),
        "every position after the anchor"
    );

    // Back the other way, one exchange later: a -> b fits what it has not learned yet,
    // its held-out positions included; a refused step leaves everything new.
    let second = r.talk_and_switch(4);
    let (t2, h2, _) = sizes(step_of(&second, "a"));
    let learned_before = if took { t1 } else { 0 };
    assert_eq!(anchor + learned_before + t2 + h2, context_of(&second));
}

fn step_of<'a>(events: &'a [Event], from: &str) -> &'a Event {
    events
        .iter()
        .find(|e| matches!(e, Event::MapperLearned { from: f, .. } if f == from))
        .unwrap_or_else(|| panic!("no learning step from {from}: {events:?}"))
}

/// Positions fitted on, held out, and whether the update was taken.
fn sizes(e: &Event) -> (usize, usize, bool) {
    match e {
        Event::MapperLearned {
            tokens,
            held_out,
            accepted,
            ..
        } => (*tokens, *held_out, *accepted),
        _ => unreachable!(),
    }
}

fn context_of(events: &[Event]) -> usize {
    events
        .iter()
        .find_map(|e| match e {
            Event::Switch(baton::protocol::SwitchEvent { context_tokens, .. }) => {
                Some(*context_tokens)
            }
            _ => None,
        })
        .expect("a switch")
}

#[test]
fn a_pair_without_saved_statistics_says_it_does_not_learn_and_switches_as_before() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = rig(dir.path(), true, None);
    let said = r.settle();
    let refusals = refusals(&said);
    assert_eq!(refusals.len(), 2, "{said:?}");
    assert!(refusals[0].contains("--no-save-stats") && refusals[0].contains("--no-learn"));
    let events = r.talk_and_switch(3);
    assert!(learned(&events).is_empty(), "{events:?}");
    assert!(events.iter().any(|e| matches!(
        e,
        Event::SwitchMeasured {
            metrics: Some(_),
            ..
        }
    )));
}

#[test]
fn finish_waits_for_the_measurement_and_the_learning_a_switch_started() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let r = rig(dir.path(), false, None);
    r.queue(baton::protocol::Command::Submit {
        text: common::engine_rig::tiny().chat_text(160, 3),
    });
    r.queue(baton::protocol::Command::Switch);
    r.queue(baton::protocol::Command::Finish);
    let handle = r.start();
    let mut seen = Vec::new();
    loop {
        let e = handle
            .events
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("an event within a minute");
        if let Event::Error { message, .. } = &e {
            panic!("{message}");
        }
        let done = matches!(&e, Event::Notice { message } if message == "background work done");
        seen.push(e);
        if done {
            break;
        }
    }
    assert!(seen.iter().any(|e| matches!(
        e,
        Event::SwitchMeasured {
            metrics: Some(_),
            ..
        }
    )));
    assert_eq!(learned(&seen).len(), 2, "{seen:?}");
    handle.shutdown();
}

#[test]
fn a_switch_never_waits_for_learning_and_says_which_mapper_it_used() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let mut r = rig(dir.path(), false, None);
    r.settle();
    // The first switch's measurement hands both directions' steps to the learning
    // thread; the switch back is asked for at once, while they run.
    let first = r.talk_and_switch_unsettled(3);
    let Some(Event::Switch(baton::protocol::SwitchEvent { mapper, .. })) =
        first.iter().find(|e| matches!(e, Event::Switch(_)))
    else {
        panic!("no switch: {first:?}");
    };
    assert_eq!(*mapper, Some(MapperState::default()), "nothing learned yet");
    assert!(r.engine.learning_in_flight(), "the steps are running");
    let back = r.handle(baton::protocol::Command::Switch);
    assert!(
        r.engine.learning_in_flight(),
        "the switch did not wait for the steps: {back:?}"
    );
    assert!(
        !back
            .iter()
            .any(|e| matches!(e, Event::Notice { message } if message.contains("wait"))),
        "{back:?}"
    );
    let Some(Event::Switch(baton::protocol::SwitchEvent { mapper, from, .. })) =
        back.iter().find(|e| matches!(e, Event::Switch(_)))
    else {
        panic!("no switch back: {back:?}");
    };
    assert_eq!(from, "b");
    let used = mapper.expect("a mapped switch says which mapper it used");

    // Once the steps are in, a switch the same way maps with what was taken, and says so.
    r.engine.measure_pending(&r.rx);
    let steps = r.settle();
    let taken_b_to_a = learned(&steps)
        .iter()
        .filter(|e| matches!(e, Event::MapperLearned { from, accepted: true, .. } if from == "b"))
        .count() as u32;
    let _ = r.handle(baton::protocol::Command::Submit {
        text: common::engine_rig::tiny().chat_text(40, 9),
    });
    r.engine.measure_pending(&r.rx);
    r.settle();
    let _ = r.handle(baton::protocol::Command::Switch);
    let again = r.handle(baton::protocol::Command::Switch);
    let Some(Event::Switch(baton::protocol::SwitchEvent {
        mapper: Some(now),
        from,
        ..
    })) = again.iter().find(|e| matches!(e, Event::Switch(_)))
    else {
        panic!("no switch: {again:?}");
    };
    assert_eq!(from, "b");
    assert!(
        now.updates >= used.updates + taken_b_to_a,
        "{now:?} after {taken_b_to_a} updates taken since {used:?}"
    );
}

#[test]
fn switches_made_before_learning_replies_never_learn_the_same_positions_twice() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let mut r = rig(dir.path(), false, None);
    r.settle();
    let mut events = r.talk_and_switch_unsettled(3);
    let n = r.engine.history().len();
    // Back and forth again while the first steps run: nothing new was said since, so
    // the later steps have nothing new to learn.
    for _ in 0..2 {
        events.extend(r.handle(baton::protocol::Command::Switch));
        r.engine.measure_pending(&r.rx);
    }
    events.extend(r.settle());
    for way in ["a", "b"] {
        let taken: usize = learned(&events)
            .iter()
            .filter_map(|e| match e {
                Event::MapperLearned { from, tokens, .. } if from == way => Some(*tokens),
                _ => None,
            })
            .sum();
        // Each step, taken or not, fits positions no step before it fitted: an update
        // of positions already learned would count them twice if the judge took it.
        assert!(
            taken > 0 && taken < n,
            "{way}: steps fitted {taken} positions of a conversation of {n}: {events:?}"
        );
    }
}

#[test]
fn a_trained_mapper_says_it_does_not_learn_naming_its_kind_and_switches_with_its_heads() {
    let dir = tempfile::tempdir().unwrap();
    common::engine_rig::write_trained_pair(
        dir.path(),
        baton::mapper::nonlinear::MapperKind::Residual,
    );
    let mut r = rig(dir.path(), true, None);
    let said = r.settle();
    let refusals = refusals(&said);
    assert_eq!(refusals.len(), 2, "{said:?}");
    assert!(
        refusals[0].contains("residual mapper") && refusals[0].contains("--no-learn"),
        "{}",
        refusals[0]
    );
    let events = r.talk_and_switch(3);
    assert!(learned(&events).is_empty(), "{events:?}");
    // The switch mapped with the heads and was measured like any other.
    let cosines = events
        .iter()
        .find_map(|e| match e {
            Event::SwitchMeasured {
                metrics: Some(m), ..
            } => Some(m.attention_cosine.clone()),
            _ => None,
        })
        .expect("the switch was measured");
    assert!(
        !cosines.is_empty() && cosines.iter().all(|c| c.is_finite() && *c <= 1.0),
        "{cosines:?}"
    );
}

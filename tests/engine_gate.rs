//! The gate's estimate without a re-prefill, on two tiny chat models generated here: every
//! switch carries the feature distance of what it hands over; with a line kept for the
//! pair the gate predicts the cosine from it and decides on that when the reference path
//! is off; the gate study measures switches beside both estimates and fits that line.

mod common;

use baton::gate::fit::{self, GateFit};
use baton::lab::eval::gate_study;
use baton::mapper::artifact::ModelRef;
use baton::protocol::{CacheOrigin, Command, EstimateBasis, Event};
use common::engine_rig::{models, rig_with, tiny, write_pair};
use std::path::Path;

fn keep_line(dir: &Path, estimator: &str, intercept: f64, slope: f64) {
    keep_line_on(dir, estimator, intercept, slope, |_| {});
}

/// A kept line, with `name` setting the mappers it names.
fn keep_line_on(
    dir: &Path,
    estimator: &str,
    intercept: f64,
    slope: f64,
    name: impl FnOnce(&mut GateFit),
) {
    let (a, b) = models(dir);
    let (sr, tr) = (
        ModelRef::new(&a.identity, a.config()),
        ModelRef::new(&b.identity, b.config()),
    );
    let f = GateFit {
        format: fit::FORMAT.into(),
        version: fit::VERSION,
        source: sr.clone(),
        target: tr.clone(),
        estimator: estimator.into(),
        intercept,
        slope,
        fitted_on: 30,
        checked_on: 30,
        held_out_r: -0.5,
        held_out_mae: 0.05,
        mapper: None,
        reverse_mapper: None,
    };
    let mut f = f;
    name(&mut f);
    fit::save(
        &baton::mapper::dir::MapperDir::named(dir.join("mappers")),
        &f,
    )
    .unwrap();
}

/// The switch a -> b after one long message, with the reference path off.
fn switch_once(dir: &Path, gate: Option<f64>) -> Event {
    let mut r = rig_with(dir, |c| {
        c.settings.reference = false;
        c.settings.gate = gate;
    });
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(120, 3),
    });
    r.handle(Command::Switch)
        .into_iter()
        .find(|e| matches!(e, Event::Switch(_)))
        .expect("a switch")
}

#[test]
fn every_switch_is_estimated_and_without_a_gate_off_the_handoff() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = rig_with(dir.path(), |c| c.settings.reference = false);
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(120, 3),
    });
    let handoff = r.handle(Command::Switch);
    assert!(
        handoff.iter().any(|e| matches!(
            e,
            Event::Switch(baton::protocol::SwitchEvent {
                estimate: None,
                gate: None,
                ..
            })
        )),
        "the handoff does not wait for it: {handoff:?}"
    );
    r.engine.measure_pending(&r.rx);
    let measured = r.drain();
    let Some(Event::SwitchMeasured {
        estimate: Some(e), ..
    }) = measured.first()
    else {
        panic!("the measurement brings it: {measured:?}");
    };
    // Calibration-like text sits near 1 by construction of the standardisation.
    let d = e
        .feature_distance
        .expect("the mapper has source statistics");
    assert!(d.is_finite() && d > 0.2 && d < 5.0, "{e:?}");
    let r = e.round_trip.expect("a round trip");
    assert!(r > -1.0 && r <= 1.0 + 1e-6, "{e:?}");
    assert_eq!(e.predicted_cosine, None, "no line kept for the pair yet");
}

#[test]
fn with_a_kept_line_the_gate_decides_on_the_predicted_cosine_when_the_reference_is_off() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    // cosine = 1.5 - 0.5 × distance: with the distance near 1, about 1.0.
    keep_line(dir.path(), "feature_distance", 1.5, -0.5);
    let Event::Switch(baton::protocol::SwitchEvent {
        estimate: Some(e),
        gate: Some(g),
        ..
    }) = switch_once(dir.path(), Some(0.2))
    else {
        panic!("a gated switch");
    };
    let p = e.predicted_cosine.expect("a prediction");
    let d = e.feature_distance.unwrap();
    assert!((p - (1.5 - 0.5 * d).clamp(-1.0, 1.0)).abs() < 1e-12);
    assert_eq!(g.basis, Some(EstimateBasis::Predicted));
    assert_eq!(g.estimate, p);
    assert_eq!(g.used, CacheOrigin::Mapped, "{p} clears 0.2");
    // A threshold above the prediction re-prefills instead.
    let Event::Switch(baton::protocol::SwitchEvent { gate: Some(g), .. }) =
        switch_once(dir.path(), Some(p + 0.01))
    else {
        panic!()
    };
    assert_eq!(g.used, CacheOrigin::Reprefilled);

    // A line on the round trip reads the round trip.
    keep_line(dir.path(), "round_trip", 0.1, 0.5);
    let Event::Switch(baton::protocol::SwitchEvent {
        estimate: Some(e), ..
    }) = switch_once(dir.path(), Some(0.0))
    else {
        panic!()
    };
    let r = e.round_trip.unwrap();
    assert!((e.predicted_cosine.unwrap() - (0.1 + 0.5 * r)).abs() < 1e-12);
}

#[test]
fn a_line_for_other_models_is_refused_by_name_and_not_used() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    keep_line(dir.path(), "feature_distance", 1.5, -0.5);
    let (a, b) = models(dir.path());
    let path = baton::mapper::dir::MapperDir::named(dir.path().join("mappers"))
        .pair(
            &ModelRef::new(&a.identity, a.config()),
            &ModelRef::new(&b.identity, b.config()),
        )
        .gate();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&a.identity.sha256, "0000")).unwrap();
    let mut r = rig_with(dir.path(), |c| c.settings.reference = false);
    let said = r.drain();
    assert!(
        said.iter().any(|e| matches!(e, Event::Notice { message }
            if message.contains("other models") && message.contains("gate-study"))),
        "{said:?}"
    );
    let _ = r.handle(Command::Submit {
        text: tiny().chat_text(120, 3),
    });
    let _ = r.handle(Command::Switch);
    r.engine.measure_pending(&r.rx);
    let events = r.drain();
    assert!(
        events.iter().any(
            |e| matches!(e, Event::SwitchMeasured { estimate: Some(x), .. }
            if x.predicted_cosine.is_none() && x.feature_distance.is_some())
        ),
        "estimated, but no line to predict with: {events:?}"
    );
}

#[test]
fn a_round_trip_line_is_set_aside_once_the_mapper_back_is_another_and_kept_while_it_is_the_same() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let (a, b) = models(dir.path());
    let mappers = baton::mapper::dir::MapperDir::named(dir.path().join("mappers"));
    let on = |s, t| fit::FitMapper::of(&mappers.find_for(s, t).unwrap()).unwrap();
    let (forward, back) = (on(&a, &b), on(&b, &a));
    let name_back = |back: fit::FitMapper| {
        let forward = forward.clone();
        move |f: &mut GateFit| {
            f.mapper = Some(forward);
            f.reverse_mapper = Some(back);
        }
    };
    let gate_notices = || -> Vec<String> {
        let r = rig_with(dir.path(), |c| c.settings.reference = false);
        r.drain()
            .into_iter()
            .filter_map(|e| match e {
                Event::Notice { message } if message.contains("gate") => Some(message),
                _ => None,
            })
            .collect()
    };
    let predicts = || {
        let Event::Switch(baton::protocol::SwitchEvent {
            estimate: Some(e), ..
        }) = switch_once(dir.path(), Some(0.0))
        else {
            panic!("an estimated switch")
        };
        e.predicted_cosine.is_some()
    };

    keep_line_on(
        dir.path(),
        fit::ROUND_TRIP,
        0.1,
        0.5,
        name_back(back.clone()),
    );
    assert_eq!(
        gate_notices(),
        Vec::<String>::new(),
        "the same mappers both ways"
    );
    assert!(predicts(), "the line is used");

    let mut other = back.clone();
    other.sha256 = "0".repeat(64);
    keep_line_on(dir.path(), fit::ROUND_TRIP, 0.1, 0.5, name_back(other));
    let said = gate_notices();
    assert!(
        said.iter()
            .any(|m| m.contains("another mapper back") && m.contains("gate-study")),
        "{said:?}"
    );
    assert!(!predicts(), "the line is set aside");
}

#[test]
fn the_study_measures_each_switch_beside_both_estimates_and_fits_a_line() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let (a, b) = models(dir.path());
    let mappers = baton::mapper::dir::MapperDir::named(dir.path().join("mappers"));
    let (_, forward) = mappers.open_for(&a, &b).unwrap();
    let (_, reverse) = mappers.open_for(&b, &a).unwrap();
    let docs: Vec<baton::data::corpus::Document> = (0..2)
        .map(|i| baton::data::corpus::Document::new(format!("d{i}"), tiny().text(20000, 40 + i)))
        .collect();
    let windows = gate_study::study_windows(&b, &docs, 9).unwrap();
    assert_eq!(windows.len(), 9);
    assert!(
        windows.iter().any(|(t, _)| t.starts_with("chat:")),
        "chat-shaped text too"
    );
    let mut seen = 0;
    let s = gate_study::study(&a, &b, &forward, &reverse, &windows, 1, &mut |_, _| {
        seen += 1
    })
    .unwrap();
    assert_eq!((seen, s.switches.len()), (9, 9));
    for w in &s.switches {
        assert!(w.feature_distance.is_some_and(|d| d.is_finite() && d > 0.0));
        assert!(w.round_trip.is_some_and(|r| r > -1.0 && r <= 1.0 + 1e-6));
        assert!(w.cosine.is_finite() && (0.0..=1.0).contains(&w.agreement));
    }
    assert_eq!(s.correlations.len(), 2);
    assert_eq!(s.lines.len(), 2, "a line per estimate");
    for l in &s.lines {
        assert_eq!((l.fitted_on, l.checked_on), (5, 4));
    }
    let kept = s.fit.expect("a line");
    let best = s
        .lines
        .iter()
        .map(|l| l.held_out_mae)
        .fold(f64::INFINITY, f64::min);
    assert_eq!(kept.held_out_mae, best, "the gate keeps the better line");
}

//! A plan's layers through the engine on two tiny models: the source keeps its residual
//! stream as it reads, the target computes the layers the plan names over the mapped
//! positions at the next message (lower layers equal to its own prefill's, upper layers
//! over no position the source did not compute itself), and the event says so.

mod common;

use baton::calibrate::residual::{fit_residual_maps, ResidualFit};
use baton::handoff::reread::RereadSetting;
use baton::mapper::artifact::ModelRef;
use baton::mapper::dir::MapperDir;
use baton::mapper::residual_file;
use baton::model::ForwardOptions;
use baton::protocol::{Command, Event};
use candle_core::Tensor;
use common::engine_rig::{docs, models, rig_with, tiny, write_pair, Rig};
use std::path::Path;

/// The first `switch_reread` event's setting, positions re-read, and layers.
fn plan_of(events: &[Event]) -> (String, usize, Option<usize>, Option<f64>) {
    events
        .iter()
        .find_map(|e| match e {
            Event::SwitchReread {
                setting,
                positions,
                layer_positions,
                layers_ms,
                ..
            } => Some((setting.clone(), *positions, *layer_positions, *layers_ms)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no plan ran in {events:?}"))
}

/// Residual maps to layer `m` both ways, fitted on the tiny text and kept in the pair's
/// mapper directory, as the engine keeps those it fits.
fn keep_residual_maps(dir: &Path, m: usize) {
    let (a, b) = models(dir);
    let mappers = MapperDir::named(dir.join("mappers"));
    let opts = ResidualFit {
        sequences: 4,
        seq_len: 48,
        skip_first: 1,
        ..ResidualFit::default()
    };
    for (s, t) in [(&a, &b), (&b, &a)] {
        let map = fit_residual_maps(s, t, &docs(), &[m], &opts)
            .unwrap()
            .pop()
            .unwrap();
        let (rs, rt) = (
            ModelRef::new(&s.identity, s.config()),
            ModelRef::new(&t.identity, t.config()),
        );
        residual_file::save(&mappers, &rs, &rt, &map).unwrap();
    }
}

/// The largest difference between two tensors of one shape.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap()
}

/// What the engine said on screen.
fn notices(events: Vec<Event>) -> Vec<String> {
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::Notice { message } => Some(message),
            _ => None,
        })
        .collect()
}

fn rig_planning(dir: &Path, plan: &str) -> Rig {
    let plan = RereadSetting::parse(plan).unwrap();
    rig_with(dir, |c| {
        c.settings.reread = plan;
    })
}

#[test]
fn lower_layers_are_the_targets_own_prefill_and_the_upper_ones_stay_mapped() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut rig = rig_planning(dir.path(), "lower=1");
    rig.talk_and_switch(1);
    let mapped = rig.engine.cache(1).foreign().clone();
    assert!(!mapped.is_empty());
    // A copy: a cache's layer is a view of its buffer.
    let before = rig.engine.cache(1).layer(1).unwrap().k.copy().unwrap();
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 2),
    });
    let (setting, reread, layers, ms) = plan_of(&events);
    assert_eq!(setting, "0%:facts:word:lower=1");
    assert_eq!(reread, 0, "a plan of layers alone re-reads nothing");
    assert_eq!(layers, Some(mapped.count()), "every mapped position");
    assert!(ms.is_some_and(|ms| ms >= 0.0));

    // Layer 0 of the mapped positions is now what the target's own prefill gives.
    let (_, b) = models(dir.path());
    let history = rig.engine.history()[..mapped.span().end].to_vec();
    let mut own = b.decoder.new_cache();
    b.decoder
        .forward(&history, &mut own, &ForwardOptions::cache_only())
        .unwrap();
    let span = mapped.span();
    let got = rig
        .engine
        .cache(1)
        .layer_range(0, span.start, span.end)
        .unwrap();
    let want = own.layer_range(0, span.start, span.end).unwrap();
    let diff = max_diff(&got.k, &want.k);
    assert!(
        diff < 1e-4,
        "layer 0 keys differ from the own prefill by {diff}"
    );
    // Layer 1 (above the split) is the map's, as handed over.
    let after = rig.engine.cache(1).layer(1).unwrap();
    let (s, n) = (span.start, span.len());
    let moved = max_diff(
        &before.narrow(1, s, n).unwrap(),
        &after.k.narrow(1, s, n).unwrap(),
    );
    assert_eq!(moved, 0.0);
    // The positions are still not the target's own: a later plan may re-read them.
    assert_eq!(rig.engine.cache(1).foreign(), &mapped);
}

#[test]
fn upper_layers_run_over_what_the_source_computed_itself_and_the_rest_stays_mapped() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    keep_residual_maps(dir.path(), 1);
    let mut rig = rig_planning(dir.path(), "upper=1");
    let said = notices(rig.drain());
    assert!(
        !said.iter().any(|m| m.contains("fitting")),
        "the maps kept in the mapper directory are read back: {said:?}"
    );
    // The source kept its residual stream at the layer the map reads, as it read.
    rig.talk_and_switch(1);
    let kept = rig.engine.cache(0).kept_residual().expect("kept").clone();
    assert_eq!(kept.layer(), 1);
    let own0 = rig.engine.cache(0).residual_positions();
    assert_eq!(
        own0.count(),
        rig.engine.cache(0).len(),
        "every position it read"
    );

    let mapped = rig.engine.cache(1).foreign().clone();
    // A copy: a cache's layer is a view of its buffer.
    let before = rig.engine.cache(1).layer(1).unwrap().k.copy().unwrap();
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 2),
    });
    let (setting, _, layers, _) = plan_of(&events);
    assert_eq!(setting, "0%:facts:word:upper=1");
    assert_eq!(layers, Some(mapped.count()));
    // The upper layer of the mapped positions is now the target's computation.
    let span = mapped.span();
    let after = rig.engine.cache(1).layer(1).unwrap();
    let (s, n) = (span.start, span.len());
    let moved = max_diff(
        &before.narrow(1, s, n).unwrap(),
        &after.k.narrow(1, s, n).unwrap(),
    );
    assert!(moved > 0.0, "the upper layer was not computed");

    // Nothing the target computed was counted as the source's: the positions it now
    // holds of its own have their rows, and the mapped ones none, whatever ran over them.
    let b_own = rig.engine.cache(1).residual_positions();
    for r in mapped.runs() {
        assert!(
            r.clone().all(|p| !b_own.contains(p)),
            "{r:?} counted as its own"
        );
    }
}

#[test]
fn positions_read_before_the_plan_asked_for_layers_have_no_residual_and_stay_mapped() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    keep_residual_maps(dir.path(), 1);
    let mut rig = rig_planning(dir.path(), "off");
    let _ = rig.handle(Command::Submit {
        text: tiny().chat_text(160, 1),
    });
    assert!(
        rig.engine.cache(0).kept_residual().is_none(),
        "no plan needs it"
    );
    let _ = rig.handle(Command::SetReread {
        setting: Some("upper=1".parse().unwrap()),
    });
    let _ = rig.handle(Command::Switch);
    rig.engine.measure_pending(&rig.rx);
    rig.drain();
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(10, 2),
    });
    let plan = plan_of(&events);
    assert_eq!(
        plan.2,
        Some(0),
        "the source read all of it before keeping anything: {plan:?}"
    );

    // What the second model read since is kept: back on the first, every position it
    // maps from the second has its upper layer computed.
    let _ = rig.handle(Command::Switch);
    rig.engine.measure_pending(&rig.rx);
    rig.drain();
    let candidates = rig.engine.cache(0).foreign().clone();
    assert!(!candidates.is_empty());
    let events = rig.handle(Command::Submit {
        text: tiny().chat_text(8, 3),
    });
    let (_, _, layers, _) = plan_of(&events);
    assert_eq!(layers, Some(candidates.count()));
}

#[test]
fn a_plan_with_layers_and_no_map_says_why_and_answers_from_the_map() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    // A layer the tiny target does not have: said at once, nothing kept.
    let rig = rig_planning(dir.path(), "upper=5");
    let said = notices(rig.drain());
    assert!(
        said.iter()
            .any(|m| m.contains("upper layers from 5") && m.contains("from 1 to 1")),
        "{said:?}"
    );
    assert!(rig.engine.cache(0).kept_residual().is_none());
}

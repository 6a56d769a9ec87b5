//! Calibration while the workbench is idle, on two tiny chat models generated here with
//! mappers calibrated on six windows: the engine reads further windows of calibration
//! text one at a time on the learning thread, says how far it got after each, takes a
//! window into the mapper in use only when the held-out cosine does not drop, keeps what
//! it took for the next session, answers a message that comes meanwhile, and stops by
//! itself once the text runs out or reaches the full calibration's size.

mod common;

use baton::learn::store;
use baton::mapper::artifact::ModelRef;
use baton::protocol::{Command, Event};
use common::engine_rig::{models, rig_with, slice_docs, write_pair};
use std::time::Duration;

#[test]
fn an_idle_engine_reads_more_calibration_text_and_stops_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let r = rig_with(dir.path(), |c| {
        c.settings.learn = true;
        c.learning = baton::engine::LearnSetup {
            keep: true,
            use_learned: true,
            slice_docs: Some(slice_docs()),
            background_calibration: true,
        };
    });
    let handle = r.start();
    let mut seen: Vec<Event> = Vec::new();
    let mut asked = false;
    let mut answered = false;
    let mut stopped = 0;
    while stopped < 2 {
        let e = handle
            .events
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no event for two minutes after {:?}", seen.last()));
        if let Event::Error { message, .. } = &e {
            panic!("{message}");
        }
        if matches!(&e, Event::Notice { message } if message.contains("background calibration stops"))
        {
            stopped += 1;
        }
        // A message part way through is answered: the reading gives way to it.
        if !asked && matches!(e, Event::BackgroundCalibration { .. }) {
            handle.send(Command::Submit {
                text: common::engine_rig::tiny().chat_text(40, 9),
            });
            asked = true;
        }
        answered |= matches!(e, Event::Done { .. });
        seen.push(e);
    }
    assert!(answered, "the message was answered");
    assert!(
        seen.iter().any(|e| matches!(e, Event::Notice { message }
            if message.contains("is a quick one") && message.contains("while the workbench is idle"))),
        "the quick mapper's notice says it grows while idle"
    );
    for from in ["a", "b"] {
        let progress: Vec<(usize, usize)> = seen
            .iter()
            .filter_map(|e| match e {
                Event::BackgroundCalibration {
                    from: f,
                    windows,
                    full,
                    ..
                } if f.as_str() == from => Some((*windows, *full)),
                _ => None,
            })
            .collect();
        // The first run fitted 6 windows; each event is one more, up to the last.
        let (first, full) = progress[0];
        assert_eq!(first, 7, "{from}: {progress:?}");
        assert!(
            progress.windows(2).all(|w| w[1].0 == w[0].0 + 1),
            "{from}: one window at a time: {progress:?}"
        );
        assert_eq!(progress.last().map(|p| p.0), Some(full), "{from}");
    }
    // What was taken is kept, each window as a learned step named after it.
    let taken = seen
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::BackgroundCalibration {
                    accepted: true,
                    kept: true,
                    ..
                }
            )
        })
        .count();
    assert!(taken > 0, "no window was taken: {seen:?}");
    let (a, b) = models(dir.path());
    let mut kept = 0;
    for (s, t) in [(&a, &b), (&b, &a)] {
        let at = store::learned_dir_in(
            &dir.path().join("mappers"),
            &ModelRef::new(&s.identity, s.config()),
            &ModelRef::new(&t.identity, t.config()),
        );
        if let Some(meta) = store::read_meta(&at).unwrap() {
            kept += meta
                .steps
                .iter()
                .filter(|st| st.from.starts_with("calibration window "))
                .count();
        }
    }
    assert_eq!(kept, taken);
    handle.shutdown();
}

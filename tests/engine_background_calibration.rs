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

/// Learning on, kept, and calibration read in the background while idle.
fn learning_in_background(c: &mut baton::engine::EngineConfig) {
    c.settings.learn = true;
    c.learning = baton::engine::LearnSetup {
        keep: true,
        use_learned: true,
        slice_docs: Some(slice_docs()),
        background_calibration: true,
    };
}

#[test]
fn an_idle_engine_reads_more_calibration_text_and_stops_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let r = rig_with(dir.path(), learning_in_background);
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
        let at = baton::mapper::dir::MapperDir::named(dir.path().join("mappers")).pair(
            &ModelRef::new(&s.identity, s.config()),
            &ModelRef::new(&t.identity, t.config()),
        );
        if let Some(meta) = store::read_meta(&at, None).unwrap() {
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

/// Both engines' events until each has said its background calibration stopped, both
/// directions; `None` for an engine's event once it stopped.
fn until_both_stop(handles: &[&baton::engine::EngineHandle; 2]) -> [Vec<Event>; 2] {
    let mut seen: [Vec<Event>; 2] = [Vec::new(), Vec::new()];
    let mut stopped = [0; 2];
    let start = std::time::Instant::now();
    while stopped.iter().any(|&s| s < 2) {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "not stopped: {stopped:?}"
        );
        for (i, h) in handles.iter().enumerate() {
            while let Ok(e) = h.events.recv_timeout(Duration::from_millis(50)) {
                if matches!(&e, Event::Notice { message } if message.contains("background calibration stops"))
                {
                    stopped[i] += 1;
                }
                seen[i].push(e);
            }
        }
    }
    seen
}

/// The window each `BackgroundCalibration` event of the mapper from `from` read.
fn windows_read(events: &[Event], from: &str) -> Vec<usize> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::BackgroundCalibration {
                from: f, windows, ..
            } if f.as_str() == from => Some(windows - 1),
            _ => None,
        })
        .collect()
}

#[test]
fn two_workbenches_on_one_mapper_directory_read_each_window_once() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let first = rig_with(dir.path(), learning_in_background).start();
    let second = rig_with(dir.path(), learning_in_background).start();
    let seen = until_both_stop(&[&first, &second]);
    for from in ["a", "b"] {
        let (one, two) = (windows_read(&seen[0], from), windows_read(&seen[1], from));
        assert!(
            !one.is_empty() && !two.is_empty(),
            "{from}: {one:?} {two:?}"
        );
        let mut all: Vec<usize> = one.iter().chain(&two).copied().collect();
        all.sort_unstable();
        let read = all.len();
        all.dedup();
        assert_eq!(
            all.len(),
            read,
            "{from}: a window read twice: {one:?} {two:?}"
        );
    }
    // Each window taken is kept once, and the next start counts each once.
    let (a, b) = models(dir.path());
    for (s, t) in [(&a, &b), (&b, &a)] {
        let pair = baton::mapper::dir::MapperDir::named(dir.path().join("mappers")).pair(
            &ModelRef::new(&s.identity, s.config()),
            &ModelRef::new(&t.identity, t.config()),
        );
        let meta = store::read_meta(&pair, None).unwrap().unwrap();
        let mut labels: Vec<&str> = meta.steps.iter().map(|st| st.from.as_str()).collect();
        let n = labels.len();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), n, "kept twice: {labels:?}");
        assert_eq!(meta.not_applied, 0);
    }
    first.shutdown();
    second.shutdown();
}

/// A directory no one can write in while this lives, root included: read-only by its
/// mode, and where that does not hold (root), immutable.
struct Unwritable(std::path::PathBuf);

impl Unwritable {
    fn new(dir: &std::path::Path) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let writable = || {
            let probe = dir.join("probe");
            let ok = std::fs::write(&probe, b"").is_ok();
            let _ = std::fs::remove_file(&probe);
            ok
        };
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
        if writable() {
            let made = std::process::Command::new("chattr")
                .arg("+i")
                .arg(dir)
                .status();
            assert!(
                made.is_ok_and(|s| s.success()) && !writable(),
                "this test needs a directory it cannot write in: as root that takes chattr +i"
            );
        }
        Self(dir.to_path_buf())
    }
}

impl Drop for Unwritable {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

#[test]
fn a_mapper_directory_that_cannot_be_written_is_said_at_start_and_nothing_is_called_kept() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), true);
    let _locked = Unwritable::new(&dir.path().join("mappers"));
    let r = rig_with(dir.path(), learning_in_background);
    let handle = r.start();
    let mut seen = Vec::new();
    let start = std::time::Instant::now();
    // Until a window was taken into the mapper in use: it cannot have been kept.
    while !seen
        .iter()
        .any(|e| matches!(e, Event::BackgroundCalibration { accepted: true, .. }))
    {
        assert!(start.elapsed() < Duration::from_secs(300), "{seen:?}");
        if let Ok(e) = handle.events.recv_timeout(Duration::from_secs(1)) {
            seen.push(e);
        }
    }
    handle.shutdown();
    let ready = seen
        .iter()
        .position(|e| matches!(e, Event::Ready { .. }))
        .expect("ready");
    let warned = seen.iter().position(|e| {
        matches!(e, Event::Notice { message }
            if message.contains("cannot be kept") && message.contains("--mapper-dir"))
    });
    assert!(
        warned.is_some_and(|w| w < ready + 8),
        "said at start-up: {seen:?}"
    );
    for e in &seen {
        if let Event::BackgroundCalibration { kept, .. } = e {
            assert!(!kept, "{e:?}");
        }
    }
    // The workbench's line for it says what it is.
    let taken = seen
        .iter()
        .find(|e| matches!(e, Event::BackgroundCalibration { accepted: true, .. }))
        .expect("taken");
    let mut app = baton::tui::App::new(Default::default());
    app.update(baton::tui::Msg::Engine(taken.clone()));
    let said = app.status_text().unwrap_or_default();
    assert!(said.contains("taken for this session, not kept"), "{said}");
}

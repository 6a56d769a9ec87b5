//! A message long enough to matter, on two tiny chat models generated here (context
//! 1024): its prefill reports progress chunk by chunk (a short one does not), one that
//! leaves less room than the answer budget is warned about before it is read, and one
//! past the context is refused before it is read, leaving the conversation as it was.
//! `baton run` shows the warning on stderr and keeps stdout a transcript.

mod common;

use baton::protocol::{Command, Event, PathKind};
use common::engine_rig::{rig_with, tiny, write_pair, Rig};
use std::process::Command as Process;

/// The template adds five ids around a message's words (its role, the two special
/// tokens each way, the assistant's role): a message of `words` words makes a first
/// turn of `words + 5` ids.
const FRAME: usize = 5;
const CONTEXT: usize = 1024;

fn message(words: usize) -> Command {
    Command::Submit {
        text: tiny().chat_text(words, 7),
    }
}

/// Every event the command caused, errors included (the rig's `handle` fails on them).
fn send(r: &mut Rig, c: Command) -> Vec<Event> {
    r.engine.handle(c.into(), &r.rx);
    r.events.try_iter().collect()
}

fn position(events: &[Event], what: impl Fn(&Event) -> bool) -> Option<usize> {
    events.iter().position(what)
}

#[test]
fn a_long_prefill_reports_its_progress_and_a_short_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = rig_with(dir.path(), |c| c.settings.max_tokens = 4);
    let words = 900;
    let events = r.handle(message(words));
    let progress: Vec<(PathKind, usize, usize)> = events
        .iter()
        .filter_map(|e| match e {
            Event::PrefillProgress {
                turn: 1,
                path,
                done,
                total,
            } => Some((*path, *done, *total)),
            _ => None,
        })
        .collect();
    let total = words + FRAME;
    // Before the work, after the first chunk of 512 and at the end.
    assert_eq!(
        progress,
        vec![
            (PathKind::Mapped, 0, total),
            (PathKind::Mapped, 512, total),
            (PathKind::Mapped, total, total)
        ]
    );
    let last = events
        .iter()
        .rposition(|e| matches!(e, Event::PrefillProgress { .. }))
        .unwrap();
    let first_token = position(&events, |e| matches!(e, Event::Token { .. })).unwrap();
    assert!(last < first_token, "{events:?}");
    // Nothing of it reaches the session file.
    assert!(events
        .iter()
        .filter(|e| matches!(e, Event::PrefillProgress { .. }))
        .all(|e| !e.is_recorded()));
    let events = r.handle(message(20));
    assert!(events.iter().any(|e| matches!(e, Event::Done { turn: 2 })));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::PrefillProgress { .. })),
        "{events:?}"
    );
}

#[test]
fn a_message_past_the_context_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = rig_with(dir.path(), |c| c.settings.max_tokens = 4);
    let words = 1100;
    let events = send(&mut r, message(words));
    let error = events
        .iter()
        .find_map(|e| match e {
            Event::Error { message, fatal } => Some((message.clone(), *fatal)),
            _ => None,
        })
        .expect("the message is refused");
    assert!(!error.1, "{error:?}");
    let want = format!("{} tokens with it, more than the {CONTEXT}", words + FRAME);
    assert!(error.0.contains(&want), "{}", error.0);
    assert!(error.0.contains("context length"), "{}", error.0);
    // Refused before the turn began: nothing was read, no turn number was used.
    assert!(
        !events.iter().any(|e| matches!(
            e,
            Event::UserMessage { .. } | Event::TurnStarted { .. } | Event::PrefillProgress { .. }
        )),
        "{events:?}"
    );
    let events = r.handle(message(20));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::UserMessage { turn: 1, .. })),
        "{events:?}"
    );
    assert!(events.iter().any(|e| matches!(e, Event::Done { turn: 1 })));
}

#[test]
fn a_message_that_leaves_the_answer_too_little_room_is_warned_about_first() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let mut r = rig_with(dir.path(), |c| c.settings.max_tokens = 24);
    let words = 1010;
    let events = r.handle(message(words));
    let tokens = words + FRAME;
    let room = CONTEXT - tokens;
    let (at, notice) = events
        .iter()
        .enumerate()
        .find_map(|(i, e)| match e {
            Event::Notice { message } if message.starts_with("long message") => {
                Some((i, message.clone()))
            }
            _ => None,
        })
        .expect("a warning");
    for n in [
        format!("{tokens} tokens"),
        format!("{CONTEXT} at most"),
        format!("room for {room} of its 24"),
    ] {
        assert!(notice.contains(&n), "{n:?} in {notice}");
    }
    let started = position(&events, |e| matches!(e, Event::TurnStarted { .. })).unwrap();
    assert!(at < started, "{events:?}");
    let generated = events.iter().find_map(|e| match e {
        Event::Generation { token_ids, .. } => Some(token_ids.len()),
        _ => None,
    });
    assert!(generated.is_some_and(|n| n <= room), "{generated:?}");
}

#[test]
fn baton_run_warns_on_stderr_and_keeps_stdout_a_transcript() {
    let dir = tempfile::tempdir().unwrap();
    write_pair(dir.path(), false);
    let script = dir.path().join("long.toml");
    let text = tiny().chat_text(1010, 7);
    std::fs::write(
        &script,
        format!("learn = false\nmax_tokens = 24\n\n[[step]]\nuser = \"{text}\"\n"),
    )
    .unwrap();
    let record = dir.path().join("s.jsonl");
    let out = Process::new(env!("CARGO_BIN_EXE_baton"))
        .args(["run", "--script"])
        .arg(&script)
        .arg("--source")
        .arg(dir.path().join("a"))
        .arg("--target")
        .arg(dir.path().join("b"))
        .arg("--mapper-dir")
        .arg(dir.path().join("mappers"))
        .arg("--record")
        .arg(&record)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("long message"), "{stderr}");
    assert!(stderr.contains("1015 tokens"), "{stderr}");
    assert!(!stdout.contains("long message"), "{stdout}");
    assert!(stdout.contains("[turn 1] user: w"), "{stdout}");
    assert!(stdout.contains(" answer ("), "{stdout}");
    let session = baton::session::read_session(&record).unwrap();
    assert!(session.warnings.is_empty(), "{:?}", session.warnings);
}

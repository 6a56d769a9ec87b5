//! A message sent while a switch runs waits for it, says so, and is never lost.

use super::*;

/// A ready app whose Tab has been sent, the switch not yet answered.
fn switching_app() -> App {
    let mut app = ready_app();
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    app
}

/// About 19 KB of code in lines, as a terminal pastes it (`\r` between lines).
fn long_paste() -> String {
    let lines: Vec<String> = (0..400)
        .map(|i| format!("\tlet value_{i:03} = compute(input, {i}); // step {i:03}"))
        .collect();
    let block = lines.join("\r");
    assert!((18_000..21_000).contains(&block.len()), "{}", block.len());
    block
}

#[test]
fn enter_during_a_switch_queues_the_pasted_message_and_sends_it_once_the_switch_is_done() {
    let mut app = ready_app();
    let block = long_paste();
    app.update(Msg::Paste(block.clone()));
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(app.input_text(), "");
    let status = app.status_text().unwrap_or_default().to_string();
    assert!(status.contains("queued"), "{status}");
    // A notice during the switch replaces the line, not the queued state, which the
    // message line's activity keeps saying.
    event(
        &mut app,
        Event::Notice {
            message: "pre-mapped 3 tokens into large in 1.0 ms".into(),
        },
    );
    assert!(app.has_queued_message());
    assert!(matches!(
        app.activity(),
        Some(crate::panels::status::Activity::HandingOver { queued: true })
    ));
    let want = block.replace('\r', "\n");
    assert_eq!(want.lines().count(), 400);
    assert_eq!(
        event(&mut app, switch_event(10)),
        vec![send(Command::Submit { text: want })]
    );
    assert!(app.phase.answering());
    assert!(!app.has_queued_message());
}

#[test]
fn a_switch_with_nothing_to_hand_over_also_lets_the_queued_message_go() {
    let mut app = switching_app();
    typed(&mut app, "hello");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    let fx = event(
        &mut app,
        Event::Notice {
            message: "large is active; there was no conversation to hand over".into(),
        },
    );
    assert_eq!(
        fx,
        vec![send(Command::Submit {
            text: "hello".into()
        })]
    );
}

#[test]
fn the_message_waits_for_every_switch_sent_before_it() {
    let mut app = switching_app();
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    typed(&mut app, "after both");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(event(&mut app, switch_event(10)), vec![]);
    assert_eq!(
        event(&mut app, switch_event(12)),
        vec![send(Command::Submit {
            text: "after both".into()
        })]
    );
}

#[test]
fn esc_takes_a_queued_message_back_in_front_of_what_was_typed_since() {
    let mut app = switching_app();
    typed(&mut app, "first");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    typed(&mut app, "second");
    // A second message cannot queue behind the first; it stays in the box.
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(app.input_text(), "second");
    assert!(app
        .status_text()
        .unwrap_or_default()
        .contains("already queued"));
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
    assert_eq!(app.input_text(), "first\nsecond");
    assert!(app.status_text().unwrap_or_default().contains("back"));
    // The switch runs on; nothing is sent when it ends.
    assert_eq!(event(&mut app, switch_event(10)), vec![]);
    assert!(!app.busy());
    // With nothing queued, Esc during a switch says it cannot be cancelled, as before.
    let mut app = switching_app();
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
    assert!(app
        .status_text()
        .unwrap_or_default()
        .contains("cannot be cancelled"));
}

#[test]
fn tab_after_a_queued_message_switches_after_it_is_answered() {
    let mut app = switching_app();
    typed(&mut app, "to large");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(code(&mut app, KeyCode::Tab), vec![]);
    assert_eq!(
        event(&mut app, switch_event(10)),
        vec![
            send(Command::Submit {
                text: "to large".into()
            }),
            send(Command::Switch)
        ]
    );
    // Withdrawn instead, the message leaves the later switch to go at once.
    let mut app = switching_app();
    typed(&mut app, "m");
    code(&mut app, KeyCode::Enter);
    code(&mut app, KeyCode::Tab);
    assert_eq!(code(&mut app, KeyCode::Esc), vec![send(Command::Switch)]);
    assert_eq!(app.input_text(), "m");
}

#[test]
fn a_failed_switch_or_a_stopped_engine_puts_the_queued_message_back() {
    let mut app = switching_app();
    typed(&mut app, "keep me");
    code(&mut app, KeyCode::Enter);
    let fx = event(
        &mut app,
        Event::Error {
            message: "the mapper file is unreadable".into(),
            fatal: false,
        },
    );
    assert_eq!(fx, vec![]);
    assert_eq!(app.input_text(), "keep me");
    let status = app.status_text().unwrap_or_default();
    assert!(
        status.contains("unreadable") && status.contains("back in the box"),
        "{status}"
    );
    assert!(!app.busy());

    let mut app = switching_app();
    typed(&mut app, "keep me too");
    code(&mut app, KeyCode::Enter);
    // A failing session file does not end the switch: the message still waits.
    event(
        &mut app,
        Event::Error {
            message: "recording stopped: disk full".into(),
            fatal: false,
        },
    );
    assert!(app.has_queued_message());
    let fx = event(
        &mut app,
        Event::Error {
            message: "out of memory".into(),
            fatal: true,
        },
    );
    assert_eq!(fx, vec![]);
    assert_eq!(app.input_text(), "keep me too");
    assert!(!app.has_queued_message());
}

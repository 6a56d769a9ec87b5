//! A scripted demo: it steps after each answer, pauses after a switch, and keeps the
//! presenter from typing over it.

use super::*;

fn demo_steps() -> Vec<Command> {
    vec![
        Command::Submit { text: "one".into() },
        Command::Switch,
        Command::Submit { text: "two".into() },
    ]
}

#[test]
fn a_demo_steps_after_each_answer_and_pauses_after_a_switch() {
    let mut app = App::new(AppInfo {
        demo: true,
        ..AppInfo::default()
    });
    assert_eq!(app.load_demo(demo_steps()), vec![]);
    assert_eq!(
        event(&mut app, ready()),
        vec![send(Command::Submit { text: "one".into() })]
    );
    // The presenter cannot type over the script.
    typed(&mut app, "mine");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(code(&mut app, KeyCode::Tab), vec![]);
    assert_eq!(event(&mut app, token(1, PathKind::Mapped, "x", 1)), vec![]);
    assert_eq!(
        event(
            &mut app,
            Event::Notice {
                message: "pre-mapped 3 tokens into large in 1.0 ms".into()
            }
        ),
        vec![]
    );
    assert_eq!(
        event(&mut app, Event::Done { turn: 1 }),
        vec![send(Command::Switch)]
    );
    assert_eq!(event(&mut app, switch_event(8)), vec![]);
    assert!(app.demo_paused());
    assert_eq!(
        key(&mut app, Key::char(' ')),
        vec![send(Command::Submit { text: "two".into() })]
    );
    assert!(!app.demo_paused());
    assert_eq!(event(&mut app, Event::Done { turn: 2 }), vec![]);
    assert!(app.demo.is_none());
    assert!(app
        .status_text()
        .unwrap_or_default()
        .contains("demo finished"));
    assert_eq!(app.input_text(), "mine");
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Submit {
            text: "mine".into()
        })]
    );
}

#[test]
fn a_demo_loaded_when_ready_starts_at_once_and_can_be_quit_while_paused() {
    let mut app = ready_app();
    assert_eq!(
        app.load_demo(vec![Command::Switch, Command::Submit { text: "a".into() }]),
        vec![send(Command::Switch)]
    );
    event(&mut app, switch_event(8));
    assert!(app.demo_paused());
    assert_eq!(
        key(&mut app, Key::char('q')),
        vec![send(Command::Shutdown), Effect::Quit]
    );
}

#[test]
fn a_demo_switch_with_nothing_to_hand_over_does_not_pause() {
    let mut app = ready_app();
    app.load_demo(vec![Command::Switch, Command::Submit { text: "a".into() }]);
    let fx = event(
        &mut app,
        Event::Notice {
            message: "large is active; there was no conversation to hand over".into(),
        },
    );
    assert_eq!(fx, vec![send(Command::Submit { text: "a".into() })]);
    assert!(!app.demo_paused());
}

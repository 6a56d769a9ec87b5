//! The workbench while a switch's measurement is pending: nothing waits for it.

use super::*;

/// The handoff of switch 0 as the engine now sends it: its measurement follows.
fn handoff_event() -> Event {
    match switch_event(8) {
        Event::Switch(baton_protocol::SwitchEvent {
            index,
            turn,
            from,
            to,
            context_tokens,
            suffix_tokens,
            timings,
            gate,
            ..
        }) => Event::Switch(baton_protocol::SwitchEvent {
            index,
            turn,
            from,
            to,
            context_tokens,
            suffix_tokens,
            timings: SwitchTimings {
                map_full_ms: None,
                reprefill_full_ms: None,
                ..timings
            },
            metrics: None,
            gate,
            measurement_follows: true,
            estimate: None,
            mapper: None,
            reread: None,
        }),
        other => other,
    }
}

fn measured_event(stopped: Option<&str>) -> Event {
    let Event::Switch(baton_protocol::SwitchEvent {
        timings, metrics, ..
    }) = switch_event(8)
    else {
        unreachable!()
    };
    Event::SwitchMeasured {
        index: 0,
        turn: 2,
        timings,
        metrics: metrics.filter(|_| stopped.is_none()),
        yielded_to: vec![],
        stopped: stopped.map(str::to_string),
        estimate: None,
    }
}

#[test]
fn enter_is_taken_while_the_switch_is_measured() {
    let mut app = ready_app();
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    event(&mut app, handoff_event());
    assert!(app.measuring().is_some());
    assert!(!app.busy(), "a pending measurement blocks nothing");
    typed(&mut app, "go on");
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Submit {
            text: "go on".into()
        })]
    );
    assert_eq!(app.input_text(), "");
    // The measurement arrives later and fills the record in.
    assert_eq!(app.switches[0].timings.map_full_ms, None);
    assert!(app.switches[0].metrics.is_none());
    event(&mut app, measured_event(None));
    assert!(app.measuring().is_none());
    assert_eq!(app.switches[0].timings.map_full_ms, Some(4.0));
    assert_eq!(
        app.switches[0]
            .metrics
            .as_ref()
            .map(|m| m.attention_cosine.len()),
        Some(4)
    );
}

#[test]
fn esc_cancels_a_measurement_and_the_handoff_stands() {
    let mut app = ready_app();
    code(&mut app, KeyCode::Tab);
    event(&mut app, handoff_event());
    app.mark_drawn();
    app.update(Msg::Tick);
    assert!(app.needs_redraw(), "the measuring indicator moves");
    assert_eq!(code(&mut app, KeyCode::Esc), vec![send(Command::Cancel)]);
    let status = app.status_text().unwrap_or_default().to_string();
    assert!(status.contains("cancelling the measurement"), "{status}");
    event(&mut app, measured_event(Some("cancelled")));
    assert!(app.measuring().is_none());
    assert_eq!(
        app.switches[0].measure,
        baton_protocol::Measure::Stopped("cancelled".into())
    );
    assert!(app.switches[0].metrics.is_none());
    assert_eq!(app.active, 1, "the handoff stands");
    // Nothing is left to cancel.
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
}

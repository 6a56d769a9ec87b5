//! How keys and engine events change the workbench, without a terminal.

mod demo;
mod events;
mod measuring;
mod queue;

use super::*;
use crate::KeyCode;
use baton_protocol::{
    CacheOrigin, Command, Event, GenerationTimings, MapperInfo, ModelInfo, PathKind, StopKind,
    SwitchMetrics, SwitchTimings,
};

fn model(name: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        path: format!("models/{name}"),
        sha256: "ab".repeat(32),
        arch: "qwen2".into(),
        n_layer: 4,
        n_kv_head: 2,
        head_dim: 64,
    }
}

fn ready() -> Event {
    Event::Ready {
        models: vec![model("small"), model("large")],
        active: 0,
        mappers: vec![MapperInfo {
            id: "small__to__large.0123456789ab-ba9876543210.safetensors".into(),
            source: "small".into(),
            target: "large".into(),
            sha256: "cd".repeat(32),
            k: 4,
        }],
        device: "cpu".into(),
    }
}

fn timings() -> GenerationTimings {
    GenerationTimings {
        prefill_ms: 10.0,
        first_token_ms: 12.0,
        decode_tokens_per_s: 30.0,
        total_ms: 100.0,
        waited_ms: None,
    }
}

fn switch_event(context_tokens: usize) -> Event {
    Event::Switch(baton_protocol::SwitchEvent {
        index: 0,
        turn: 2,
        from: "small".into(),
        to: "large".into(),
        context_tokens,
        suffix_tokens: context_tokens,
        timings: SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: Some(4.0),
            map_suffix_ms: None,
            reprefill_full_ms: Some(50.0),
            reprefill_suffix_ms: None,
            end_to_end_ms: 5.0,
        },
        metrics: Some(SwitchMetrics {
            attention_cosine: vec![0.99, 0.97, 0.95, 0.98],
            r2_k: vec![0.9; 4],
            r2_v: vec![0.8; 4],
            key_error_concentration: vec![1.1; 4],
            top1_agreement: None,
            kl: None,
        }),
        gate: None,
        measurement_follows: false,
        estimate: None,
        mapper: None,
        reread: None,
    })
}

fn generation(turn: u32, path: PathKind, text: &str, ids: Vec<u32>, prompt: usize) -> Event {
    Event::Generation {
        turn,
        path,
        model: "small".into(),
        text: text.into(),
        token_ids: ids,
        prompt_tokens: prompt,
        timings: timings(),
        stop: StopKind::Eos,
    }
}

fn token(turn: u32, path: PathKind, text: &str, id: u32) -> Event {
    Event::Token {
        turn,
        path,
        text: text.into(),
        id,
    }
}

fn started(turn: u32, path: PathKind, cache: CacheOrigin) -> Event {
    Event::TurnStarted {
        turn,
        path,
        model: "large".into(),
        cache,
        repaired: None,
    }
}

fn ready_app() -> App {
    let mut app = App::new(AppInfo::default());
    app.update(Msg::Engine(ready()));
    app
}

fn key(app: &mut App, k: Key) -> Vec<Effect> {
    app.update(Msg::Key(k))
}

fn code(app: &mut App, c: KeyCode) -> Vec<Effect> {
    key(app, Key::plain(c))
}

fn typed(app: &mut App, s: &str) {
    for c in s.chars() {
        assert_eq!(key(app, Key::char(c)), vec![], "typing {c:?}");
    }
}

fn event(app: &mut App, e: Event) -> Vec<Effect> {
    app.update(Msg::Engine(e))
}

fn send(c: Command) -> Effect {
    Effect::Send(c)
}

/// An app with a turn running: "hi" was sent.
fn running_app() -> App {
    let mut app = ready_app();
    typed(&mut app, "hi");
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Submit { text: "hi".into() })]
    );
    app
}

#[test]
fn typing_edits_at_the_cursor() {
    let mut app = ready_app();
    typed(&mut app, "helo");
    code(&mut app, KeyCode::Left);
    typed(&mut app, "l");
    assert_eq!(app.input_text(), "hello");
    code(&mut app, KeyCode::Home);
    code(&mut app, KeyCode::Delete);
    code(&mut app, KeyCode::End);
    code(&mut app, KeyCode::Backspace);
    typed(&mut app, "p!");
    assert_eq!(app.input_text(), "ellp!");
    app.update(Msg::Paste("a\nb".into()));
    assert_eq!(app.input_text(), "ellp!a\nb");
}

#[test]
fn a_pasted_block_is_text_and_the_enter_after_it_sends_it_whole() {
    let mut app = ready_app();
    // About 2.6 KB, starting with the keys that ask something of an empty input, with
    // line breaks (`\r\n`) and tabs, ending on a line break, as a terminal pastes it.
    let lines: Vec<String> = (0..82)
        .map(|i| format!("q? line {i:02}\tof the pasted block\r"))
        .collect();
    let block = lines.join("\n");
    assert!((2500..2800).contains(&block.len()), "{}", block.len());
    assert_eq!(app.update(Msg::Paste(block.clone())), vec![]);
    assert_eq!(app.overlay, Overlay::None);
    // Its line breaks and tabs are kept; each `\r\n` is one line break.
    let text = block.replace("\r\n", "\n").replace('\r', "\n");
    assert_eq!(text.lines().count(), 82);
    assert_eq!(app.input_text(), text);
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Submit { text })]
    );
    assert_eq!(app.input_text(), "");
}

#[test]
fn enter_sends_the_message_unless_it_is_empty_or_a_turn_runs() {
    let mut app = ready_app();
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    typed(&mut app, "   ");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    let mut app = running_app();
    assert_eq!(app.input_text(), "");
    assert!(app.busy());
    typed(&mut app, "next");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(app.input_text(), "next");
    let status = app.status_text().unwrap_or_default();
    assert!(
        status.contains("wait") && status.contains("Esc"),
        "{status}"
    );
    event(&mut app, Event::Done { turn: 1 });
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Submit {
            text: "next".into()
        })]
    );
}

#[test]
fn enter_waits_for_the_models() {
    let mut app = App::new(AppInfo::default());
    typed(&mut app, "early");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(app.input_text(), "early");
    assert!(app.status_text().unwrap_or_default().contains("loading"));
}

#[test]
fn tab_during_a_turn_sends_the_switch_and_says_it_is_queued() {
    let mut app = running_app();
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    assert!(app.status_text().unwrap_or_default().contains("queued"));
    let notice = "switch queued: it runs when this turn is done";
    event(
        &mut app,
        Event::Notice {
            message: notice.into(),
        },
    );
    assert_eq!(app.status_text(), Some(notice));
    event(&mut app, Event::Done { turn: 1 });
    // The engine runs the queued switch before anything typed now: the message waits
    // for it and goes to the model that then has the conversation.
    typed(&mut app, "x");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    assert_eq!(
        event(&mut app, switch_event(10)),
        vec![send(Command::Submit { text: "x".into() })]
    );
    assert_eq!(app.active, 1);
    assert!(app.phase.answering());
}

#[test]
fn a_switch_with_nothing_to_hand_over_still_changes_the_active_model() {
    let mut app = ready_app();
    assert_eq!(code(&mut app, KeyCode::Tab), vec![send(Command::Switch)]);
    event(
        &mut app,
        Event::Notice {
            message: "large is active; there was no conversation to hand over".into(),
        },
    );
    assert_eq!(app.active, 1);
    assert!(!app.busy());
}

#[test]
fn esc_cancels_the_generation_once() {
    let mut app = running_app();
    assert_eq!(code(&mut app, KeyCode::Esc), vec![send(Command::Cancel)]);
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
    event(&mut app, Event::Done { turn: 1 });
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
}

#[test]
fn ctrl_r_toggles_the_reference_path() {
    let mut app = ready_app();
    assert!(app.reference_enabled());
    assert_eq!(
        key(&mut app, Key::ctrl('r')),
        vec![send(Command::SetReference { enabled: false })]
    );
    assert!(!app.reference_enabled());
    assert_eq!(
        key(&mut app, Key::ctrl('r')),
        vec![send(Command::SetReference { enabled: true })]
    );
}

#[test]
fn a_bookmark_note_leaves_the_message_alone() {
    let mut app = ready_app();
    typed(&mut app, "half a thought");
    key(&mut app, Key::ctrl('b'));
    typed(&mut app, "q? l");
    assert_eq!(app.input_text(), "half a thought");
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Bookmark {
            note: "q? l".into()
        })]
    );
    assert_eq!(app.input_text(), "half a thought");
    // A note pasted in lines is one line; the message keeps its line breaks.
    key(&mut app, Key::ctrl('b'));
    app.update(Msg::Paste("two\r\nlines\tand a tab".into()));
    assert_eq!(
        code(&mut app, KeyCode::Enter),
        vec![send(Command::Bookmark {
            note: "two lines and a tab".into()
        })]
    );
    key(&mut app, Key::ctrl('b'));
    typed(&mut app, "dropped");
    assert_eq!(code(&mut app, KeyCode::Esc), vec![]);
    assert!(!app.input.note_open());
    assert_eq!(app.input_text(), "half a thought");
    event(
        &mut app,
        Event::Bookmark {
            turn: 0,
            note: "q? l".into(),
        },
    );
    assert!(matches!(
        app.transcript.last(),
        Some(Entry::Bookmark { .. })
    ));
}

#[test]
fn help_opens_on_question_mark_only_with_an_empty_message() {
    let mut app = ready_app();
    typed(&mut app, "why");
    typed(&mut app, "?");
    assert_eq!(app.input_text(), "why?");
    assert_eq!(app.overlay, Overlay::None);
    code(&mut app, KeyCode::F(1));
    assert_eq!(app.overlay, Overlay::Help);
    code(&mut app, KeyCode::Esc);
    assert_eq!(app.overlay, Overlay::None);
    assert_eq!(app.input_text(), "why?");
    let mut app = ready_app();
    typed(&mut app, "?");
    assert_eq!(app.overlay, Overlay::Help);
    assert_eq!(app.input_text(), "");
}

#[test]
fn quitting_during_a_turn_asks_first() {
    let mut app = running_app();
    assert_eq!(key(&mut app, Key::char('q')), vec![]);
    assert_eq!(app.overlay, Overlay::ConfirmQuit);
    assert_eq!(key(&mut app, Key::char('n')), vec![]);
    assert_eq!(app.overlay, Overlay::None);
    assert_eq!(key(&mut app, Key::ctrl('c')), vec![]);
    assert_eq!(
        key(&mut app, Key::char('y')),
        vec![send(Command::Cancel), send(Command::Shutdown), Effect::Quit]
    );
}

#[test]
fn quitting_when_idle_asks_on_q_and_a_message_starting_with_q_loses_nothing() {
    let mut app = ready_app();
    typed(&mut app, "a q");
    assert_eq!(app.input_text(), "a q");
    assert_eq!(
        key(&mut app, Key::ctrl('c')),
        vec![send(Command::Shutdown), Effect::Quit]
    );
    // q on an empty input asks; y quits.
    let mut app = ready_app();
    assert_eq!(key(&mut app, Key::char('q')), vec![]);
    assert_eq!(
        key(&mut app, Key::char('y')),
        vec![send(Command::Shutdown), Effect::Quit]
    );
    // Any other key types on, the q included.
    let mut app = ready_app();
    key(&mut app, Key::char('q'));
    key(&mut app, Key::char('u'));
    typed(&mut app, "ick sort");
    assert_eq!(app.input_text(), "quick sort");
    // n (or Esc) only closes the question.
    let mut app = ready_app();
    key(&mut app, Key::char('q'));
    assert_eq!(key(&mut app, Key::char('n')), vec![]);
    assert_eq!(app.input_text(), "");
}

#[test]
fn a_fatal_error_shows_and_quitting_still_works() {
    let mut app = running_app();
    event(
        &mut app,
        Event::Error {
            message: "out of memory".into(),
            fatal: true,
        },
    );
    assert!(app.fatal_error().is_some());
    assert!(!app.busy());
    typed(&mut app, "x");
    assert_eq!(code(&mut app, KeyCode::Enter), vec![]);
    key(&mut app, Key::plain(KeyCode::Backspace));
    assert_eq!(key(&mut app, Key::char('q')), vec![]);
    assert_eq!(
        key(&mut app, Key::char('y')),
        vec![send(Command::Shutdown), Effect::Quit]
    );
}

#[test]
fn a_non_fatal_error_ends_the_turn_but_a_recording_failure_does_not() {
    let mut app = running_app();
    event(
        &mut app,
        Event::Error {
            message: "recording stopped: disk full".into(),
            fatal: false,
        },
    );
    assert!(app.busy());
    assert!(app.recording_stopped);
    event(
        &mut app,
        Event::Error {
            message: "tokenizer failed".into(),
            fatal: false,
        },
    );
    assert!(!app.busy());
}

#[test]
fn the_layer_view_cycles_on_ctrl_l_and_l_is_a_letter() {
    let mut app = ready_app();
    assert_eq!(app.layer_view(), LayerView::Cosine);
    key(&mut app, Key::char('l'));
    assert_eq!(app.layer_view(), LayerView::Cosine);
    assert_eq!(app.input_text(), "l");
    key(&mut app, Key::plain(KeyCode::Backspace));
    key(&mut app, Key::ctrl('l'));
    assert_eq!(app.layer_view(), LayerView::R2);
    key(&mut app, Key::ctrl('l'));
    assert_eq!(app.layer_view(), LayerView::Concentration);
    typed(&mut app, "hel");
    assert_eq!(app.layer_view(), LayerView::Concentration);
    key(&mut app, Key::ctrl('l'));
    assert_eq!(app.layer_view(), LayerView::Cosine);
    assert_eq!(app.input_text(), "hel");
}

#[test]
fn typed_text_survives_events_switches_and_resizes() {
    let mut app = running_app();
    typed(&mut app, "draft");
    event(&mut app, started(1, PathKind::Mapped, CacheOrigin::True));
    event(&mut app, token(1, PathKind::Mapped, "x", 1));
    code(&mut app, KeyCode::Tab);
    app.update(Msg::Resize(120, 40));
    app.update(Msg::Resize(10, 3));
    app.update(Msg::Scroll(-5));
    event(&mut app, Event::Done { turn: 1 });
    event(&mut app, switch_event(3));
    app.update(Msg::Tick);
    assert_eq!(app.input_text(), "draft");
}

#[test]
fn redraws_are_asked_for_only_after_a_change() {
    let mut app = ready_app();
    assert!(app.needs_redraw());
    app.mark_drawn();
    app.update(Msg::Tick);
    assert!(!app.needs_redraw());
    let mut app = running_app();
    app.mark_drawn();
    event(&mut app, token(1, PathKind::Mapped, "x", 1));
    assert!(app.needs_redraw());
    app.mark_drawn();
    app.update(Msg::Tick);
    assert!(app.needs_redraw(), "the busy indicator moves");
}

#[test]
fn paging_up_pins_the_transcript_and_paging_down_follows_again() {
    let mut app = ready_app();
    app.update(Msg::Resize(100, 30));
    for turn in 1..=20 {
        event(
            &mut app,
            Event::UserMessage {
                turn,
                text: format!("message {turn}"),
            },
        );
    }
    assert_eq!(app.transcript_panel.scroll_top(), None);
    code(&mut app, KeyCode::PageUp);
    let pinned = app
        .transcript_panel
        .scroll_top()
        .expect("pinned after PgUp");
    event(
        &mut app,
        Event::UserMessage {
            turn: 21,
            text: "more".into(),
        },
    );
    assert_eq!(app.transcript_panel.scroll_top(), Some(pinned));
    app.update(Msg::Scroll(-1000));
    assert_eq!(app.transcript_panel.scroll_top(), Some(0));
    code(&mut app, KeyCode::PageDown);
    assert!(app.transcript_panel.scroll_top().is_some_and(|t| t > 0));
    app.update(Msg::Scroll(1000));
    assert_eq!(app.transcript_panel.scroll_top(), None);
}

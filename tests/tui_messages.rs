//! What the workbench does with what a person types and sets, through its state machine
//! and ratatui's TestBackend: the plan keys, a message that shows nothing, a line break
//! typed into a message, and the wait for the first token after a long paste.

use baton::protocol::{
    CacheOrigin, Command, Event, MapperInfo, ModelInfo, PathKind, SwitchEvent, SwitchTimings,
};
use baton::tui::{render, render_panel, App, AppInfo, Effect, Key, KeyCode, Msg, Panel};
use crossterm::event::{KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const SMALL: &str = "Qwen2.5-0.5B-Instruct";
const LARGE: &str = "Qwen2.5-1.5B-Instruct";

fn model(name: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        path: format!("models/{name}"),
        sha256: "ab".repeat(32),
        arch: "qwen2".into(),
        n_layer: 24,
        n_kv_head: 2,
        head_dim: 64,
    }
}

fn ready() -> Event {
    Event::Ready {
        models: vec![model(SMALL), model(LARGE)],
        active: 0,
        mappers: vec![MapperInfo {
            id: format!("{SMALL}__to__{LARGE}.0123456789ab-ba9876543210.safetensors"),
            source: SMALL.into(),
            target: LARGE.into(),
            sha256: "cd".repeat(32),
            k: 4,
        }],
        device: "cpu".into(),
    }
}

fn app(reread: Option<&str>) -> App {
    let mut app = App::new(AppInfo {
        reread: reread.map(|s| s.parse().unwrap()),
        ..AppInfo::default()
    });
    app.update(Msg::Resize(100, 30));
    app.update(Msg::Engine(ready()));
    app
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        app.update(Msg::Key(Key::char(c)));
    }
}

fn enter() -> Msg {
    Msg::Key(Key::plain(KeyCode::Enter))
}

/// Enter with `modifiers`, as crossterm reports it from the terminal.
fn enter_with(modifiers: KeyModifiers) -> Msg {
    Msg::Key(Key::from(KeyEvent {
        code: crossterm::event::KeyCode::Enter,
        modifiers,
        kind: KeyEventKind::Press,
        state: KeyEventState::NONE,
    }))
}

fn screen(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| render(f, app)).unwrap();
    t
}

fn panel(app: &App, width: u16, height: u16, which: Panel) -> String {
    let mut t = Terminal::new(TestBackend::new(width, height)).unwrap();
    t.draw(|f| render_panel(f, f.area(), app, which)).unwrap();
    format!("{:?}", t.backend())
}

fn row(t: &Terminal<TestBackend>, y: u16) -> String {
    let buffer = t.backend().buffer();
    (0..buffer.area.width)
        .map(|x| buffer[(x, y)].symbol())
        .collect()
}

/// The rows of the screen that the input box takes, its borders included.
fn input_box_rows(t: &Terminal<TestBackend>) -> Vec<String> {
    let height = t.backend().buffer().area.height;
    let rows: Vec<String> = (0..height).map(|y| row(t, y)).collect();
    let top = rows
        .iter()
        .rposition(|r| r.contains(" message to "))
        .expect("the input box is drawn");
    let bottom = top
        + rows[top..]
            .iter()
            .skip(1)
            .position(|r| r.starts_with('╰'))
            .expect("the input box is closed")
        + 1;
    rows[top..=bottom].to_vec()
}

fn settings(fx: &[Effect]) -> Vec<Option<String>> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Send(Command::SetReread { setting }) => Some(setting.map(|s| s.to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn ctrl_e_steps_a_drop_plan_through_drop_budgets_and_says_each_one() {
    let mut app = app(Some("drop:0%:source-attention:word"));
    let mut seen = Vec::new();
    for _ in 0..5 {
        let fx = app.update(Msg::Key(Key::ctrl('e')));
        let setting = settings(&fx);
        assert_eq!(setting.len(), 1, "{fx:?}");
        let setting = setting[0].clone().expect("a drop plan is never turned off");
        assert!(setting.starts_with("drop:"), "{setting}");
        assert!(setting.ends_with(":source-attention:word"), "{setting}");
        let said = app.status_text().unwrap_or_default().to_string();
        seen.push((setting, said));
    }
    let budgets: Vec<&str> = seen
        .iter()
        .map(|(s, _)| s.split(':').nth(1).unwrap())
        .collect();
    assert_eq!(budgets, ["10%", "20%", "30%", "40%", "0%"]);
    // The line says what the plan is now and what it was.
    assert!(
        seen[0].1.starts_with("plan drop 10% (was drop 0%)"),
        "{seen:?}"
    );
    assert!(
        seen[4].1.starts_with("plan drop 0% (was drop 40%)"),
        "{seen:?}"
    );
    let status = panel(&app, 140, 1, Panel::Status);
    assert!(status.contains("drop 0%"), "{status}");

    // The re-read over the map keeps its kind too, through off.
    let mut app = self::app(Some("20%:facts:word"));
    let steps: Vec<Option<String>> = (0..4)
        .flat_map(|_| settings(&app.update(Msg::Key(Key::ctrl('e')))))
        .collect();
    assert_eq!(
        steps,
        [
            Some("30%:facts:word".to_string()),
            Some("40%:facts:word".to_string()),
            None,
            Some("10%:facts:word".to_string())
        ]
    );
    let said = app.status_text().unwrap_or_default();
    assert!(said.starts_with("plan re-read 10% (was off)"), "{said}");
}

#[test]
fn ctrl_t_says_the_kind_it_changed_from() {
    let mut app = app(Some("20%:facts:word"));
    let fx = app.update(Msg::Key(Key::ctrl('t')));
    assert_eq!(settings(&fx), [Some("drop:20%:facts:word".to_string())]);
    let said = app.status_text().unwrap_or_default();
    assert!(
        said.starts_with("plan drop 20% (was re-read 20%)"),
        "{said}"
    );
}

#[test]
fn a_message_of_white_space_or_invisible_characters_is_not_sent_and_the_screen_says_why() {
    for blank in [
        "   ",
        " \t ",
        "\u{200B}\u{200C}\u{200D}\u{FEFF}\u{2060}",
        "\u{200B} \u{200B}",
    ] {
        let mut app = app(None);
        app.update(Msg::Paste(blank.into()));
        let fx = app.update(enter());
        assert_eq!(fx, vec![], "{blank:?} was sent");
        let said = app.status_text().unwrap_or_default().to_string();
        assert!(said.starts_with("not sent:"), "{blank:?}: {said:?}");
        // What was typed stays, so nothing is lost.
        assert_eq!(app.input_text(), blank);
        let t = screen(&app, 100, 30);
        let shown: String = (0..30).map(|y| row(&t, y)).collect();
        assert!(shown.contains("not sent:"), "{shown}");
    }
    // An empty box says what Enter wants.
    let mut app = app(None);
    assert_eq!(app.update(enter()), vec![]);
    assert!(app
        .status_text()
        .is_some_and(|s| s.contains("nothing to send")));
    // Visible text among zero-width characters is a message.
    let mut app = self::app(None);
    app.update(Msg::Paste("\u{200B}hi\u{200D}".into()));
    let fx = app.update(enter());
    assert_eq!(
        fx,
        vec![Effect::Send(Command::Submit {
            text: "\u{200B}hi\u{200D}".into()
        })]
    );
}

#[test]
fn alt_enter_types_a_line_break_the_box_grows_and_enter_sends_both_lines() {
    let mut app = app(None);
    let before = input_box_rows(&screen(&app, 100, 30));
    assert_eq!(before.len(), 3, "{before:#?}");
    // The empty box names the key.
    assert!(before[1].contains("Alt-Enter"), "{before:#?}");
    type_text(&mut app, "fn main() {");
    assert_eq!(app.update(enter_with(KeyModifiers::ALT)), vec![]);
    type_text(&mut app, "}");
    let rows = input_box_rows(&screen(&app, 100, 30));
    assert_eq!(rows.len(), 4, "two rows of text: {rows:#?}");
    assert!(rows[1].contains("fn main() {"), "{rows:#?}");
    assert!(
        rows[2].trim_start_matches('│').starts_with('}'),
        "{rows:#?}"
    );
    // Shift-Enter, where the terminal reports it, does the same.
    app.update(enter_with(KeyModifiers::SHIFT));
    type_text(&mut app, "x");
    let fx = app.update(enter());
    assert_eq!(
        fx,
        vec![Effect::Send(Command::Submit {
            text: "fn main() {\n}\nx".into()
        })]
    );
}

#[test]
fn the_input_box_grows_to_five_rows_and_keeps_the_cursor_line_in_view() {
    let mut app = app(None);
    for i in 0..8 {
        if i > 0 {
            app.update(enter_with(KeyModifiers::ALT));
        }
        type_text(&mut app, &format!("line {i}"));
    }
    let rows = input_box_rows(&screen(&app, 100, 30));
    assert_eq!(rows.len(), 7, "{rows:#?}");
    assert!(rows[0].contains("· 8 lines"), "{rows:#?}");
    assert!(
        rows[1].contains("line 3") && rows[5].contains("line 7"),
        "{rows:#?}"
    );
    // The help and the hints name the key.
    let help = panel(&app, 100, 30, Panel::Help);
    assert!(help.contains("Alt-Enter"), "{help}");
    let hints = panel(&app, 100, 1, Panel::Hints);
    assert!(hints.contains("Alt-Enter"), "{hints}");
    let hints = panel(&app, 80, 1, Panel::Hints);
    assert!(hints.contains("Alt-Enter"), "{hints}");
}

/// A long paste answered after a switch whose plan re-read the mapped history first: the
/// events as the engine records them.
fn long_paste_after_a_switch() -> Vec<Event> {
    let paste = "word ".repeat(3000);
    let generation: Event = serde_json::from_value(serde_json::json!({
        "type": "generation",
        "turn": 2,
        "path": "mapped",
        "model": LARGE,
        "text": "It reads.",
        "token_ids": [1, 2, 3],
        "prompt_tokens": 3012,
        "timings": {
            "prefill_ms": 790.2,
            "first_token_ms": 840.7,
            "decode_tokens_per_s": 12.5,
            "total_ms": 1080.0,
            "waited_ms": 11961.4
        },
        "stop": "eos"
    }))
    .unwrap();
    vec![
        Event::Switch(SwitchEvent {
            index: 0,
            turn: 2,
            from: SMALL.into(),
            to: LARGE.into(),
            context_tokens: 400,
            suffix_tokens: 400,
            timings: SwitchTimings {
                source_prefill_ms: None,
                map_full_ms: None,
                map_suffix_ms: Some(20.0),
                reprefill_full_ms: None,
                reprefill_suffix_ms: None,
                end_to_end_ms: 21.0,
            },
            metrics: None,
            gate: None,
            measurement_follows: false,
            estimate: None,
            mapper: None,
            reread: Some("40%:facts:word".into()),
        }),
        Event::UserMessage {
            turn: 2,
            text: paste,
        },
        Event::TurnStarted {
            turn: 2,
            path: PathKind::Mapped,
            model: LARGE.into(),
            cache: CacheOrigin::Mapped,
            repaired: None,
        },
        Event::Token {
            turn: 2,
            path: PathKind::Mapped,
            text: "It reads.".into(),
            id: 1,
        },
        generation,
        Event::SwitchFollowUp {
            index: 0,
            turn: 2,
            top1_agreement: None,
            kl: None,
            positions: 0,
            first_token_ms: 840.7,
            end_to_end_ms: 11961.4,
        },
        Event::Done { turn: 2 },
    ]
}

#[test]
fn after_a_long_paste_the_conversation_gives_the_wait_from_enter_that_the_panel_gives() {
    let mut app = app(Some("40%:facts:word"));
    for e in long_paste_after_a_switch() {
        app.update(Msg::Engine(e));
    }
    let transcript = panel(&app, 100, 200, Panel::Transcript);
    let latency = panel(&app, 70, 18, Panel::Latency);
    assert!(latency.contains("end-to-end 11961 ms"), "{latency}");
    assert!(
        transcript.contains("first token 11961 ms after Enter"),
        "{transcript}"
    );
    assert!(!transcript.contains("840.7"), "{transcript}");
}

//! Snapshots of the workbench's screens after a fixed, realistic run: two switches
//! between two 28-layer models, three turns, follow-ups and comparisons. Every number is
//! a literal, so the screens are the same on every machine.

use baton::protocol::{
    CacheOrigin, Command, Event, GenerationTimings, MapperInfo, ModelInfo, PathKind, PlanPart,
    PlanText, StopKind, SwitchMetrics, SwitchTimings,
};
use baton::tui::{render, render_panel, App, AppInfo, Effect, Key, KeyCode, Msg, Panel};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::{Frame, Terminal};

const SMALL: &str = "Qwen2.5-1.5B-Instruct";
const LARGE: &str = "Qwen2.5-7B-Instruct";

fn model(name: &str, sha: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        path: format!("models/{name}"),
        sha256: sha.repeat(32),
        arch: "qwen2".into(),
        n_layer: 28,
        n_kv_head: 4,
        head_dim: 128,
    }
}

fn mapper(source: &str, target: &str, sums: &str) -> MapperInfo {
    MapperInfo {
        id: format!("{source}__to__{target}.{sums}.safetensors"),
        source: source.into(),
        target: target.into(),
        sha256: "ef".repeat(32),
        k: 4,
    }
}

fn ready() -> Event {
    Event::Ready {
        models: vec![model(SMALL, "1a"), model(LARGE, "7b")],
        active: 0,
        mappers: vec![
            mapper(SMALL, LARGE, "1a1a1a1a1a1a-7b7b7b7b7b7b"),
            mapper(LARGE, SMALL, "7b7b7b7b7b7b-1a1a1a1a1a1a"),
        ],
        device: "cuda:0".into(),
    }
}

const COSINE_1: [f64; 28] = [
    0.998, 0.997, 0.996, 0.991, 0.987, 0.984, 0.979, 0.981, 0.976, 0.972, 0.969, 0.966, 0.962,
    0.958, 0.955, 0.951, 0.948, 0.944, 0.941, 0.936, 0.931, 0.925, 0.918, 0.909, 0.897, 0.883,
    0.902, 0.934,
];
const COSINE_2: [f64; 28] = [
    0.999, 0.998, 0.996, 0.994, 0.991, 0.989, 0.986, 0.984, 0.981, 0.979, 0.977, 0.974, 0.971,
    0.969, 0.966, 0.963, 0.961, 0.958, 0.955, 0.951, 0.947, 0.942, 0.936, 0.929, 0.921, 0.874,
    0.917, 0.948,
];

fn metrics(cosine: &[f64; 28]) -> SwitchMetrics {
    SwitchMetrics {
        attention_cosine: cosine.to_vec(),
        r2_k: cosine.iter().map(|c| 1.0 - (1.0 - c) * 3.0).collect(),
        r2_v: cosine.iter().map(|c| 1.0 - (1.0 - c) * 4.5).collect(),
        key_error_concentration: cosine.iter().map(|c| 0.6 + (1.0 - c) * 6.0).collect(),
        top1_agreement: None,
        kl: None,
    }
}

fn gen_timings(first_token_ms: f64) -> GenerationTimings {
    GenerationTimings {
        prefill_ms: first_token_ms - 14.0,
        first_token_ms,
        decode_tokens_per_s: 41.5,
        total_ms: 1480.0,
        // The message came with the handoff's 12.4 ms still to wait for (turn 2's
        // end-to-end).
        waited_ms: Some(first_token_ms + 12.4),
    }
}

/// A path's answer streamed piece by piece, then summed up.
fn answer(
    turn: u32,
    path: PathKind,
    model: &str,
    cache: CacheOrigin,
    pieces: &[&str],
    first_id: u32,
    prompt_tokens: usize,
) -> Vec<Event> {
    let mut events = vec![Event::TurnStarted {
        turn,
        path,
        model: model.into(),
        cache,
        repaired: None,
    }];
    let ids: Vec<u32> = (0..pieces.len() as u32).map(|i| first_id + i).collect();
    for (p, id) in pieces.iter().zip(&ids) {
        events.push(Event::Token {
            turn,
            path,
            text: p.to_string(),
            id: *id,
        });
    }
    events.push(Event::Generation {
        turn,
        path,
        model: model.into(),
        text: pieces.concat(),
        token_ids: ids,
        prompt_tokens,
        timings: gen_timings(182.0),
        stop: StopKind::Eos,
    });
    events
}

const ANSWER_1: &[&str] = &[
    "fn", " largest", "(v", ":", " &[", "i32", "])", " ->", " Option", "<i32>", " {", " v",
    ".iter", "()", ".copied", "()", ".max", "()", " }",
];
const ANSWER_2: &[&str] = &[
    "Use", " the", " `", "Ord", "`", " bound", ":", " fn", " largest", "<T", ":", " Ord", " +",
    " Copy", ">(", "v", ":", " &[", "T", "])", " ->", " Option", "<T>", ".",
];
const ANSWER_3: &[&str] = &[
    "The", " test", " calls", " `", "largest", "(&[])", "`", " and", " asserts", " it", " returns",
    " `", "None", "`.",
];
const REFERENCE_3: &[&str] = &[
    "The", " test", " calls", " `", "largest", "(&[])", "`", " then", " checks", " that", " the",
    " result", " is", " `", "None", "`.",
];

/// Switch `index` before `turn`, handing `(context, new)` tokens over `(from, to)`, as
/// the engine reports it: the handoff at once, then its measurement, which the caller
/// places where it arrives.
fn switch(
    index: u32,
    turn: u32,
    (from, to): (&str, &str),
    (context, new): (usize, usize),
    timings: SwitchTimings,
    cosine: &[f64; 28],
) -> (Event, Event) {
    let handoff = SwitchTimings {
        map_full_ms: None,
        reprefill_full_ms: None,
        reprefill_suffix_ms: None,
        ..timings
    };
    (
        Event::Switch(baton::protocol::SwitchEvent {
            index,
            turn,
            from: from.into(),
            to: to.into(),
            context_tokens: context,
            suffix_tokens: new,
            timings: handoff,
            metrics: None,
            gate: None,
            measurement_follows: true,
            estimate: None,
            mapper: None,
            reread: None,
        }),
        Event::SwitchMeasured {
            index,
            turn,
            timings,
            metrics: Some(metrics(cosine)),
            yielded_to: vec![],
            stopped: None,
            estimate: None,
        },
    )
}

fn run() -> Vec<Event> {
    let mut e = vec![
        ready(),
        Event::UserMessage {
            turn: 1,
            text: "Write a Rust function that returns the largest element of a slice of i32, \
                   or None if it is empty."
                .into(),
        },
    ];
    e.extend(answer(
        1,
        PathKind::Mapped,
        SMALL,
        CacheOrigin::True,
        ANSWER_1,
        100,
        61,
    ));
    e.push(Event::Done { turn: 1 });
    first_switch_and_turn_2(&mut e);
    second_switch_and_turn_3(&mut e);
    e
}

/// The first switch, measured before the next message, and turn 2 with its reference.
fn first_switch_and_turn_2(e: &mut Vec<Event>) {
    // The presenter types slowly: the first switch is measured before the next message.
    let (handoff, measured) = switch(
        0,
        2,
        (SMALL, LARGE),
        (81, 81),
        SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: Some(11.8),
            map_suffix_ms: None,
            reprefill_full_ms: Some(148.6),
            reprefill_suffix_ms: None,
            end_to_end_ms: 12.4,
        },
        &COSINE_1,
    );
    e.push(handoff);
    e.push(measured);
    e.push(Event::UserMessage {
        turn: 2,
        text: "Now make it generic over any type that implements Ord.".into(),
    });
    e.extend(answer(
        2,
        PathKind::Mapped,
        LARGE,
        CacheOrigin::Mapped,
        ANSWER_2,
        200,
        17,
    ));
    e.push(Event::SwitchFollowUp {
        index: 0,
        turn: 2,
        top1_agreement: Some(0.941),
        kl: Some(0.037),
        positions: 16,
        first_token_ms: 182.0,
        end_to_end_ms: 194.4,
    });
    e.extend(answer(
        2,
        PathKind::Reference,
        LARGE,
        CacheOrigin::Reprefilled,
        ANSWER_2,
        200,
        98,
    ));
    e.push(Event::TurnComparison {
        turn: 2,
        identical: true,
        first_difference: None,
        agreement: 1.0,
    });
    e.push(Event::Done { turn: 2 });
}

/// The second switch, turn 3 whose reference answer differs, then the switch's
/// measurement, which waited for the turn.
fn second_switch_and_turn_3(e: &mut Vec<Event>) {
    // The next message follows at once: the second switch is measured after its turn.
    let (handoff, measured) = switch(
        1,
        3,
        (LARGE, SMALL),
        (123, 42),
        SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: Some(7.9),
            map_suffix_ms: Some(3.1),
            reprefill_full_ms: Some(121.0),
            reprefill_suffix_ms: Some(38.2),
            end_to_end_ms: 3.9,
        },
        &COSINE_2,
    );
    let Event::SwitchMeasured {
        index,
        turn,
        timings,
        metrics,
        ..
    } = measured
    else {
        unreachable!("switch() gives a measurement second")
    };
    let measured = Event::SwitchMeasured {
        index,
        turn,
        timings,
        metrics,
        yielded_to: vec![3],
        stopped: None,
        estimate: None,
    };
    e.push(handoff);
    e.push(Event::UserMessage {
        turn: 3,
        text: "Write a unit test for the empty case.".into(),
    });
    e.extend(answer(
        3,
        PathKind::Mapped,
        SMALL,
        CacheOrigin::Mapped,
        ANSWER_3,
        300,
        12,
    ));
    e.push(Event::SwitchFollowUp {
        index: 1,
        turn: 3,
        top1_agreement: Some(0.917),
        kl: Some(0.052),
        positions: 11,
        first_token_ms: 96.0,
        end_to_end_ms: 99.9,
    });
    let mut reference = answer(
        3,
        PathKind::Reference,
        SMALL,
        CacheOrigin::Reprefilled,
        REFERENCE_3,
        300,
        135,
    );
    // The two answers share their first seven tokens.
    for ev in reference.iter_mut() {
        match ev {
            Event::Token { id, .. } if *id >= 307 => *id += 50,
            Event::Generation { token_ids, .. } => {
                for id in token_ids.iter_mut().filter(|id| **id >= 307) {
                    *id += 50;
                }
            }
            _ => {}
        }
    }
    e.extend(reference);
    e.push(Event::TurnComparison {
        turn: 3,
        identical: false,
        first_difference: Some(7),
        agreement: 0.4375,
    });
    e.push(Event::Done { turn: 3 });
    e.push(measured);
}

/// The run up to the end of turn 3, before the second switch's measurement arrives.
fn app_before_the_last_measurement(width: u16, height: u16) -> App {
    let mut app = App::new(AppInfo::default());
    app.update(Msg::Resize(width, height));
    let events = run();
    for e in &events[..events.len() - 1] {
        app.update(Msg::Engine(e.clone()));
    }
    app
}

fn app_after_run(width: u16, height: u16) -> App {
    let mut app = App::new(AppInfo {
        record_path: Some("sessions/demo.jsonl".into()),
        ..AppInfo::default()
    });
    app.update(Msg::Resize(width, height));
    for e in run() {
        app.update(Msg::Engine(e));
    }
    for c in "Summarise the difference".chars() {
        app.update(Msg::Key(Key::char(c)));
    }
    app
}

fn draw(width: u16, height: u16, f: impl FnOnce(&mut Frame)) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal.draw(f).expect("draw");
    terminal
}

fn screen(app: &App, width: u16, height: u16) -> Terminal<TestBackend> {
    draw(width, height, |f| render(f, app))
}

fn panel(app: &App, width: u16, height: u16, which: Panel) -> Terminal<TestBackend> {
    draw(width, height, |frame| {
        render_panel(frame, frame.area(), app, which)
    })
}

#[test]
fn whole_screen_at_100x30() {
    let app = app_after_run(100, 30);
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn whole_screen_at_160x48() {
    let app = app_after_run(160, 48);
    insta::assert_snapshot!(screen(&app, 160, 48).backend());
}

#[test]
fn whole_screen_at_the_minimum_size() {
    let app = app_after_run(80, 24);
    insta::assert_snapshot!(screen(&app, 80, 24).backend());
}

#[test]
fn transcript_panel() {
    let app = app_after_run(100, 30);
    insta::assert_snapshot!(panel(&app, 70, 40, Panel::Transcript).backend());
}

#[test]
fn latency_panel() {
    let app = app_after_run(100, 30);
    insta::assert_snapshot!(panel(&app, 60, 18, Panel::Latency).backend());
}

#[test]
fn layer_panel_in_each_view() {
    let mut app = app_after_run(100, 30);
    insta::assert_snapshot!(
        "layers_cosine",
        panel(&app, 70, 12, Panel::Layers).backend()
    );
    app.update(Msg::Key(Key::ctrl('l')));
    insta::assert_snapshot!("layers_r2", panel(&app, 70, 12, Panel::Layers).backend());
    app.update(Msg::Key(Key::ctrl('l')));
    insta::assert_snapshot!(
        "layers_concentration",
        panel(&app, 70, 12, Panel::Layers).backend()
    );
}

#[test]
fn side_by_side_panel_marks_the_first_difference() {
    let app = app_after_run(100, 30);
    let terminal = panel(&app, 90, 8, Panel::SideBySide);
    insta::assert_snapshot!(terminal.backend());
    // Token 7 is " and" on the mapped side and " then" on the reference side.
    let buffer = terminal.backend().buffer();
    let marked: String = buffer
        .content()
        .iter()
        .filter(|c| c.bg == Color::LightRed)
        .map(|c| c.symbol())
        .collect();
    assert_eq!(marked, " and then");
}

#[test]
fn status_lines() {
    let app = app_after_run(100, 30);
    let full = |f: &mut Frame| {
        let a = f.area();
        let row = |y| Rect::new(0, y, a.width, 1);
        render_panel(f, row(0), &app, Panel::Message);
        render_panel(f, row(1), &app, Panel::Status);
        render_panel(f, row(2), &app, Panel::Hints);
    };
    insta::assert_snapshot!("status_wide", draw(140, 3, full).backend());
    insta::assert_snapshot!("status_narrow", draw(80, 3, full).backend());
}

#[test]
fn the_status_line_names_a_tail_when_one_is_set() {
    let status = |tail: usize| {
        let mut app = App::new(AppInfo {
            tail,
            ..AppInfo::default()
        });
        app.update(Msg::Resize(140, 30));
        for e in run() {
            app.update(Msg::Engine(e));
        }
        status_line(&app)
    };
    assert!(status(32).contains("tail 32"), "{}", status(32));
    assert!(!status(0).contains("tail"), "{}", status(0));
}

#[test]
fn the_status_line_shows_how_far_the_repair_got() {
    let status = |repair: bool, progress: Option<(usize, usize)>| {
        let mut app = App::new(AppInfo {
            repair,
            ..AppInfo::default()
        });
        app.update(Msg::Resize(140, 30));
        for e in run() {
            app.update(Msg::Engine(e));
        }
        if let Some((repaired, total)) = progress {
            app.update(Msg::Engine(Event::RepairProgress {
                model: "Qwen2.5-1.5B-Instruct".into(),
                repaired,
                total,
            }));
        }
        status_line(&app)
    };
    let partway = status(true, Some((512, 900)));
    assert!(partway.contains("repaired 512 / 900"), "{partway}");
    assert!(status(true, None).contains("repair on"));
    assert!(status(true, Some((900, 900))).contains("repaired 900 / 900"));
    assert!(!status(false, None).contains("repair"));
    // Ctrl-P turns it on and tells the engine.
    let mut app = app_after_run(100, 30);
    let fx = app.update(Msg::Key(Key::ctrl('p')));
    assert_eq!(fx, vec![Effect::Send(Command::SetRepair { enabled: true })]);
}

#[test]
fn bookmark_entry_keeps_the_message() {
    let mut app = app_after_run(100, 30);
    app.update(Msg::Key(Key::ctrl('b')));
    for c in "drift starts here".chars() {
        app.update(Msg::Key(Key::char(c)));
    }
    insta::assert_snapshot!(panel(&app, 100, 3, Panel::Input).backend());
    app.update(Msg::Key(Key::plain(KeyCode::Esc)));
    assert_eq!(app.input_text(), "Summarise the difference");
}

#[test]
fn loading_screen() {
    let mut app = App::new(AppInfo {
        quick_mapper_note: Some(
            "first run: calibrating a quick mapper on a small sample; run `baton calibrate` \
             for the full one"
                .into(),
        ),
        ..AppInfo::default()
    });
    app.update(Msg::Engine(Event::Loading {
        stage: "calibrating Qwen2.5-1.5B-Instruct → Qwen2.5-7B-Instruct".into(),
        done: 37,
        total: 128,
        eta_seconds: Some(74.0),
    }));
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn a_fatal_error_while_loading_stops_the_gauge() {
    let mut app = App::new(AppInfo::default());
    app.update(Msg::Engine(Event::Loading {
        stage: "loading qwen2.5-coder-1.5b".into(),
        done: 0,
        total: 0,
        eta_seconds: None,
    }));
    app.update(Msg::Engine(Event::Error {
        message: "the two models' tokenizers differ: a mapper needs one tokenizer".into(),
        fatal: true,
    }));
    let t = screen(&app, 100, 30);
    let text: String = t
        .backend()
        .buffer()
        .content()
        .iter()
        .map(|c| c.symbol())
        .collect();
    assert!(
        text.contains("could not start") && text.contains("stopped"),
        "{text}"
    );
    assert!(
        text.contains("tokenizers differ") && text.contains("press q to quit"),
        "{text}"
    );
    assert!(
        !text.contains("working") && !text.contains("loading qwen"),
        "{text}"
    );
    assert_eq!(
        app.fatal_error(),
        Some("the two models' tokenizers differ: a mapper needs one tokenizer")
    );
}

#[test]
fn help_overlay() {
    let mut app = app_after_run(100, 30);
    app.update(Msg::Key(Key::plain(KeyCode::F(1))));
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn quit_confirmation() {
    let mut app = app_after_run(100, 30);
    app.update(Msg::Key(Key::plain(KeyCode::Enter)));
    app.update(Msg::Key(Key::ctrl('c')));
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn demo_pause_banner() {
    let mut app = App::new(AppInfo {
        demo: true,
        ..AppInfo::default()
    });
    app.load_demo(vec![
        Command::Submit {
            text: "Write a Rust function that returns the largest element of a slice of i32, \
                   or None if it is empty."
                .into(),
        },
        Command::Switch,
        Command::Submit {
            text: "Now make it generic over any type that implements Ord.".into(),
        },
    ]);
    // Up to and including the first switch.
    for e in run()
        .into_iter()
        .take_while(|e| !matches!(e, Event::UserMessage { turn: 2, .. }))
    {
        app.update(Msg::Engine(e));
    }
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn fatal_error() {
    let mut app = app_after_run(100, 30);
    app.update(Msg::Engine(Event::Error {
        message: "CUDA out of memory while mapping layer 17".into(),
        fatal: true,
    }));
    insta::assert_snapshot!(screen(&app, 100, 30).backend());
}

#[test]
fn too_small_terminal() {
    let app = app_after_run(60, 20);
    insta::assert_snapshot!(screen(&app, 60, 20).backend());
}

#[test]
fn while_measuring_the_handoff_shows_and_the_rest_says_measuring() {
    let app = app_before_the_last_measurement(100, 30);
    let latency = panel(&app, 60, 18, Panel::Latency);
    insta::assert_snapshot!("latency_panel_measuring", latency.backend());
    let layers = panel(&app, 70, 12, Panel::Layers);
    insta::assert_snapshot!("layers_measuring", layers.backend());
    let text = |t: &Terminal<TestBackend>| -> String {
        t.backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect()
    };
    let (latency, layers) = (text(&latency), text(&layers));
    // The handoff, the suffix map and the end-to-end time are known; the rest is pending.
    assert!(latency.contains("handoff 3.90 ms"), "{latency}");
    assert!(latency.contains("3.10 ms"), "{latency}");
    assert!(latency.contains("end-to-end 99.9 ms"), "{latency}");
    assert!(latency.contains("measuring…"), "{latency}");
    assert!(
        !latency.contains("121.0 ms") && !latency.contains("faster"),
        "{latency}"
    );
    assert!(layers.contains("Measuring"), "{layers}");
    // The measurement fills the panels in.
    let mut app = app;
    let last = run().pop().expect("the run ends with a measurement");
    app.update(Msg::Engine(last));
    let latency = text(&panel(&app, 60, 18, Panel::Latency));
    assert!(
        latency.contains("121.0 ms") && !latency.contains("measuring"),
        "{latency}"
    );
}

#[test]
fn no_size_panics() {
    let sizes = [
        (1, 1),
        (2, 1),
        (1, 40),
        (20, 5),
        (79, 23),
        (79, 24),
        (80, 23),
        (80, 24),
        (81, 25),
        (100, 30),
        (120, 24),
        (80, 60),
        (200, 60),
        (300, 100),
    ];
    let mut loading = App::new(AppInfo::default());
    loading.update(Msg::Engine(Event::Loading {
        stage: "loading".into(),
        done: 0,
        total: 0,
        eta_seconds: None,
    }));
    let ready = app_after_run(100, 30);
    let mut help = app_after_run(100, 30);
    help.update(Msg::Key(Key::plain(KeyCode::F(1))));
    let mut fatal = app_after_run(100, 30);
    fatal.update(Msg::Engine(Event::Error {
        message: "x".repeat(500),
        fatal: true,
    }));
    let mut scrolled = app_after_run(100, 30);
    scrolled.update(Msg::Scroll(-3));
    let measuring = app_before_the_last_measurement(100, 30);
    for (w, h) in sizes {
        for app in [&loading, &ready, &help, &fatal, &scrolled, &measuring] {
            let mut app = app.clone();
            app.update(Msg::Resize(w, h));
            app.update(Msg::Key(Key::plain(KeyCode::PageUp)));
            screen(&app, w, h);
            for which in [
                Panel::Transcript,
                Panel::Latency,
                Panel::Layers,
                Panel::SideBySide,
                Panel::Input,
                Panel::Status,
                Panel::Help,
            ] {
                panel(&app, w, h, which);
            }
        }
    }
}

/// The status bar of `app`, 140 columns wide, as text.
fn status_line(app: &App) -> String {
    let shown = draw(140, 1, |f: &mut Frame| {
        let r = f.area();
        render_panel(f, r, app, Panel::Status)
    });
    format!("{:?}", shown.backend())
}

/// The run, then a third switch set to re-read and what it re-read at the next message.
fn app_with_a_reread() -> App {
    app_with_plan("20%:source-attention:word", None)
}

/// [`app_with_a_reread`] under plan `setting`, whose layers (positions, milliseconds)
/// ran where given.
fn app_with_plan(setting: &str, layers: Option<(usize, f64)>) -> App {
    let mut app = App::new(AppInfo {
        reread: Some(setting.parse().unwrap()),
        ..AppInfo::default()
    });
    app.update(Msg::Resize(140, 40));
    for e in run() {
        app.update(Msg::Engine(e));
    }
    let (mut switched, _) = switch(
        2,
        4,
        (LARGE, SMALL),
        (300, 40),
        SwitchTimings {
            source_prefill_ms: None,
            map_full_ms: None,
            map_suffix_ms: Some(9.0),
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: 9.5,
        },
        &COSINE_1,
    );
    if let Event::Switch(baton::protocol::SwitchEvent { reread, .. }) = &mut switched {
        *reread = Some(setting.into());
    }
    app.update(Msg::Engine(switched));
    app.update(Msg::Engine(Event::SwitchReread {
        index: 2,
        turn: 4,
        setting: setting.into(),
        positions: 60,
        context_tokens: 300,
        spans: vec![[0, 20], [200, 240]],
        texts: vec![
            "system prompt".into(),
            " the budget is 48,000 dollars".into(),
        ],
        select_ms: 5.0,
        reread_ms: 40.0,
        dropped: vec![[100, 200]],
        reprefilled: false,
        parts: vec![
            PlanText {
                part: PlanPart::Kept,
                text: "system prompt".into(),
            },
            PlanText {
                part: PlanPart::Dropped,
                text: " an aside nobody asked about".into(),
            },
            PlanText {
                part: PlanPart::Reread,
                text: " the budget is 48,000 dollars".into(),
            },
            PlanText {
                part: PlanPart::Mapped,
                text: " and the rest".into(),
            },
        ],
        predicted_ms: Some(48.0),
        reprefill_predicted_ms: Some(130.0),
        layer_positions: layers.map(|l| l.0),
        layers_ms: layers.map(|l| l.1),
    }));
    app
}

#[test]
fn a_plan_with_layers_shows_them_in_the_latency_panel_and_the_status_line() {
    let app = app_with_plan("20%:facts:word:upper=14", Some((180, 80.0)));
    let latency = format!("{:?}", panel(&app, 70, 18, Panel::Latency).backend());
    // The plan's whole time: choosing, layers and the re-read.
    assert!(latency.contains("re-read 125.0 ms"), "{latency}");
    assert!(
        latency.contains("layers 80.0 ms over 180 tokens"),
        "{latency}"
    );
    let status = status_line(&app);
    assert!(status.contains("re-read 20% · upper 14"), "{status}");
}

#[test]
fn a_reread_shows_in_the_latency_panel_and_ctrl_k_marks_its_words_in_the_conversation() {
    let mut app = app_with_a_reread();
    let latency = format!("{:?}", panel(&app, 70, 18, Panel::Latency).backend());
    assert!(latency.contains("re-read 45.0 ms"), "{latency}");
    assert!(
        latency.contains("60 of 300 tokens re-read (20%)"),
        "{latency}"
    );
    let status = status_line(&app);
    assert!(status.contains("re-read 20%"), "{status}");

    let words = "the budget is 48,000 dollars";
    let before = format!("{:?}", panel(&app, 100, 80, Panel::Transcript).backend());
    assert!(!before.contains(words), "{before}");
    app.update(Msg::Key(Key::ctrl('k')));
    let after = format!("{:?}", panel(&app, 100, 80, Panel::Transcript).backend());
    assert!(after.contains(words), "{after}");
    assert!(
        after.contains("re-read 60 of 300 tokens at the next message, 100 dropped"),
        "{after}"
    );
    // Each run of the conversation is marked with what the plan made of it: a legend,
    // then the dropped words struck through and the re-read ones highlighted.
    assert!(after.contains("kept re-read mapped dropped"), "{after}");
    let drawn = panel(&app, 100, 80, Panel::Transcript);
    let buffer = drawn.backend().buffer();
    let style_of = |word: &str| {
        let w = buffer.area.width;
        (0..buffer.area.height)
            .find_map(|y| {
                let line: String = (0..w).map(|x| buffer[(x, y)].symbol()).collect();
                line.find(word).map(|i| {
                    let x = line[..i].chars().count() as u16;
                    buffer[(x, y)].style()
                })
            })
            .unwrap_or_else(|| panic!("{word} not drawn"))
    };
    assert!(style_of("nobody")
        .add_modifier
        .contains(ratatui::style::Modifier::CROSSED_OUT));
    assert_eq!(style_of("48,000").bg, Some(Color::Yellow));
    assert!(!style_of("rest")
        .add_modifier
        .contains(ratatui::style::Modifier::CROSSED_OUT));
    assert!(latency.contains("100 dropped"), "{latency}");
    // Ctrl-E steps the budget on and says so.
    app.update(Msg::Key(Key::ctrl('e')));
    let status = status_line(&app);
    assert!(status.contains("re-read 30%"), "{status}");
}

/// Row `y` of a drawn screen, as text.
fn row(terminal: &Terminal<TestBackend>, y: u16) -> String {
    let buffer = terminal.backend().buffer();
    (0..buffer.area.width)
        .map(|x| buffer[(x, y)].symbol())
        .collect()
}

#[test]
fn at_80x24_the_status_line_ends_on_a_whole_item() {
    let record = "sessions/workbench-2025-06-01-a-long-session-name.jsonl";
    let mut app = App::new(AppInfo {
        record_path: Some(record.into()),
        tail: 32,
        repair: true,
        reread: Some("20%:source-attention:word".parse().unwrap()),
        ..AppInfo::default()
    });
    app.update(Msg::Resize(80, 24));
    for e in run() {
        app.update(Msg::Engine(e));
    }
    app.update(Msg::Engine(Event::RepairProgress {
        model: SMALL.into(),
        repaired: 512,
        total: 900,
    }));
    let status = row(&screen(&app, 80, 24), 22);
    let whole = [
        "▶ 1.5B  7B",
        "cuda:0",
        "149 tokens",
        "reference on",
        "repaired 512 / 900",
        "tail 32",
        "re-read 20%",
        "● rec workbench-2025-06-01-a-long-session-name.jsonl",
        "● rec",
        "mappers 1a1a1a-7b7b7b 7b7b7b-1a1a1a",
    ];
    let items: Vec<&str> = status.split(" │ ").map(str::trim).collect();
    for item in &items {
        assert!(whole.contains(item), "{item:?} is cut: {status:?}");
    }
    // The active model and the context length are the last to be left out.
    assert_eq!(items.first(), Some(&"▶ 1.5B  7B"), "{status:?}");
    assert!(items.contains(&"149 tokens"), "{status:?}");
}

#[test]
fn a_pasted_block_shows_its_lines_and_a_message_queued_behind_a_switch_says_so() {
    let mut app = App::new(AppInfo::default());
    app.update(Msg::Resize(80, 24));
    for e in run() {
        app.update(Msg::Engine(e));
    }
    let fx = app.update(Msg::Key(Key::plain(KeyCode::Tab)));
    assert_eq!(fx, vec![Effect::Send(Command::Switch)]);
    app.update(Msg::Paste("line one\r\nline two\r\nline three".into()));
    // The box grows by a row for each line.
    let shown = screen(&app, 80, 24);
    let title = row(&shown, 17);
    assert!(title.contains("· 3 lines"), "{title}");
    for (y, line) in [(18, "line one"), (19, "line two"), (20, "line three")] {
        let body = row(&shown, y);
        assert!(body.starts_with(&format!("│{line} ")), "{body}");
    }
    assert_eq!(app.update(Msg::Key(Key::plain(KeyCode::Enter))), vec![]);
    // Sent, the message leaves the box, which is one row again.
    let shown = screen(&app, 80, 24);
    let (activity, body) = (row(&shown, 18), row(&shown, 20));
    assert!(activity.contains("then your message"), "{activity}");
    assert!(
        body.contains("message queued: sent when the handoff is done · Esc takes it back"),
        "{body}"
    );
}

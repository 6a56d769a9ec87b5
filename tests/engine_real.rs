//! The handoff engine on the real default pair: a scripted conversation with six turns
//! and four switches (both directions) is recorded, every event reads back, the report
//! shows per-turn drift, and a replay on the same build finds no difference; a cancel
//! and a switch requested during generation behave as documented.
//!
//! Mappers come from a small calibration kept under the cache dir (made on the first
//! run, reused after), so these tests do not depend on the user's own artifacts.

mod common;

use baton::calibrate::CalibrateOptions;
use baton::engine::{self, EngineConfig, EngineHandle};
use baton::headless::script;
use baton::protocol::{CacheOrigin, Command, Event, PathKind, StopKind};
use baton::session::{diff_sessions, read_session, DiffOptions, Report};
use candle_core::Device;
use std::path::PathBuf;
use std::time::Duration;

fn small_calibration() -> CalibrateOptions {
    CalibrateOptions {
        sequences: 16,
        seq_len: 256,
        stride: 2,
        select_sequences: 2,
        probes: 16,
        k_sweep: vec![2],
        ..CalibrateOptions::default()
    }
}

fn config(max_tokens: usize, record: Option<PathBuf>) -> EngineConfig {
    let models = [
        common::qwen_small().display().to_string(),
        common::qwen_large().display().to_string(),
    ];
    let mut cfg = EngineConfig::new(models, Device::Cpu);
    cfg.mapper_dir =
        baton::mapper::dir::MapperDir::named(baton::fetch::cache_root().join("test-mappers-int8"));
    cfg.calibrate_missing = Some(small_calibration());
    cfg.settings.max_tokens = max_tokens;
    // The replay is compared with the recording: no mapper changes between them.
    cfg.settings.learn = false;
    cfg.record = record;
    cfg
}

/// Engines start one at a time, so that only the first calibrates the test mappers.
static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn start(cfg: EngineConfig) -> EngineHandle {
    let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    let handle = engine::spawn(cfg);
    script::wait_ready(&handle.events, &mut |_| {}).expect("engine ready");
    handle
}

fn next(handle: &EngineHandle) -> Event {
    handle
        .events
        .recv_timeout(Duration::from_secs(600))
        .expect("an event within 10 minutes")
}

const SCRIPT: &str = r#"
reference = true
max_tokens = 12

[[step]]
user = "Write a Rust function that adds two numbers."
[[step]]
switch = true
[[step]]
user = "Now make it generic."
[[step]]
user = "Add a doc comment."
[[step]]
switch = true
[[step]]
user = "Write a test for it."
[[step]]
switch = true
[[step]]
user = "Show the same in Python."
[[step]]
switch = true
[[step]]
bookmark = "last switch"
[[step]]
user = "Which version do you prefer?"
"#;

#[test]
fn a_scripted_conversation_records_reports_and_replays_identically() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.jsonl");
    let script = script::Script::parse(SCRIPT, "inline").unwrap();
    let mut cfg = config(12, Some(first.clone()));
    cfg.settings.apply(&script.settings);
    let handle = start(cfg.clone());
    script::run_steps(
        &script.steps,
        &|c| handle.send(c),
        &handle.events,
        &mut |e| {
            if let Event::Error { message, .. } = e {
                panic!("engine error: {message}");
            }
        },
    )
    .unwrap();
    handle.shutdown();

    let recorded = read_session(&first).unwrap();
    assert!(recorded.warnings.is_empty(), "{:?}", recorded.warnings);
    let report = Report::from_session(&recorded);
    eprintln!("{report}");
    assert_eq!(report.summary.turns, 6);
    assert_eq!(report.switches.len(), 4);
    let directions: Vec<(&str, &str)> = report
        .switches
        .iter()
        .map(|s| (s.from.as_str(), s.to.as_str()))
        .collect();
    assert_ne!(directions[0], directions[1], "switches go both ways");
    for s in &report.switches {
        // Real measurements: a map and a full re-prefill were timed, and the mapped cache
        // was compared layer by layer with the target's own.
        assert!(s.measured(), "switch {} was measured", s.index);
        assert!(
            s.timings.map_full_ms.is_some_and(|m| m > 0.0)
                && s.timings.reprefill_full_ms.is_some_and(|r| r > 0.0)
        );
        let (mean, min) = (s.cosine_mean().unwrap(), s.cosine_min().unwrap());
        assert!(min <= mean && mean <= 1.0 && min > -1.0, "{mean} {min}");
        assert!(
            s.top1_agreement().is_some(),
            "switch {} has no follow-up",
            s.index
        );
        // The handoff includes its suffix map; the end-to-end time is what the next
        // message waited, which the handoff is part of only when the message waited for it.
        assert!(s.handoff_ms >= s.timings.map_suffix_ms.unwrap_or(0.0));
        assert!(s.end_to_end_ms() > 0.0);
    }
    // Every switch after the first finds a target that held a cache before: the
    // incremental handoff maps and re-prefills only the suffix.
    for s in &report.switches[2..] {
        assert!(s.suffix_tokens < s.context_tokens);
        assert!(s.timings.map_suffix_ms.is_some() && s.timings.reprefill_suffix_ms.is_some());
    }
    // Per-turn drift: after the first switch every turn is compared on both paths.
    assert_eq!(report.summary.compared_turns, 5);
    let compared = report
        .turns
        .iter()
        .filter(|t| t.identical.is_some())
        .count();
    assert_eq!(compared, 5);
    assert_eq!(report.bookmarks.len(), 1);

    // A replay of the recording on the same build and mappers generates the same tokens
    // and measures the same fidelity.
    let second = dir.path().join("second.jsonl");
    let mut cfg2 = cfg;
    cfg2.record = Some(second.clone());
    // As `baton replay` does: the repair goes only as far as the recording's had.
    cfg2.paced_repair = true;
    let events: Vec<Event> = recorded.events().cloned().collect();
    let steps = script::session_commands(&events);
    let said: Vec<Command> = steps
        .iter()
        .filter(|c| !matches!(c, Command::RepairTo { .. }))
        .cloned()
        .collect();
    assert_eq!(said, script.steps);
    let handle = start(cfg2);
    script::run_steps(&steps, &|c| handle.send(c), &handle.events, &mut |_| {}).unwrap();
    handle.shutdown();
    let replayed = read_session(&second).unwrap();
    let diff = diff_sessions(&recorded, &replayed, &DiffOptions::default());
    assert!(diff.is_identical(), "{diff}");
}

#[test]
fn cancel_and_switch_during_generation_have_defined_effects() {
    let handle = start(config(200, None));
    // A cancel stops the answer where it is; the turn still completes.
    handle.send(Command::Submit {
        text: "Count from one to one hundred, one number per line.".into(),
    });
    let mut tokens = 0;
    let mut saw_notice = false;
    let stop = loop {
        match next(&handle) {
            Event::Token { .. } => {
                tokens += 1;
                if tokens == 2 {
                    // Queued during generation: runs once the turn is done.
                    handle.send(Command::Switch);
                }
                if tokens == 6 {
                    handle.send(Command::Cancel);
                }
            }
            Event::Generation {
                path,
                stop,
                token_ids,
                ..
            } => {
                assert_eq!(path, PathKind::Mapped);
                assert!(token_ids.len() < 20, "stopped early: {}", token_ids.len());
                break stop;
            }
            Event::Notice { message } if message.contains("switch queued") => saw_notice = true,
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    };
    assert_eq!(stop, StopKind::Cancelled);
    let mut saw_done = false;
    loop {
        match next(&handle) {
            Event::Notice { message } if message.contains("switch queued") => saw_notice = true,
            Event::Done { .. } => saw_done = true,
            Event::Switch(baton::protocol::SwitchEvent { from, to, .. }) => {
                assert!(saw_done, "the queued switch runs after the turn");
                assert_ne!(from, to);
                break;
            }
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    assert!(
        saw_notice,
        "a switch during generation is announced as queued"
    );
    // The conversation goes on from the cancelled turn on the other model's mapped cache.
    handle.send(Command::Submit {
        text: "Stop there. Say done.".into(),
    });
    let mut started = None;
    loop {
        match next(&handle) {
            Event::TurnStarted {
                path: PathKind::Mapped,
                cache,
                ..
            } => started = Some(cache),
            Event::Done { .. } => break,
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    assert_eq!(started, Some(CacheOrigin::Mapped));
    // The switch's measurement gave way to that turn and resumes once the engine is idle.
    loop {
        match next(&handle) {
            Event::SwitchMeasured { stopped, .. } => {
                assert_eq!(stopped, None, "the measurement completes after the turn");
                break;
            }
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    // A cancel with nothing running is answered, not ignored.
    handle.send(Command::Cancel);
    match next(&handle) {
        Event::Notice { message } => assert!(message.contains("nothing to cancel"), "{message}"),
        other => panic!("expected a notice, got {other:?}"),
    }
    handle.shutdown();
}

#[test]
fn the_gate_reprefills_below_its_threshold_and_premapping_reports_its_cost() {
    let mut cfg = config(8, None);
    // No mapped cache reaches a mean attention cosine of 1.0: the gate must refuse it.
    cfg.settings.gate = Some(1.0);
    cfg.settings.premap = true;
    let handle = start(cfg);
    handle.send(Command::Submit {
        text: "Say hi.".into(),
    });
    let premapped = loop {
        match next(&handle) {
            Event::Notice { message } if message.starts_with("pre-mapped") => break message,
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    };
    assert!(
        premapped.ends_with(" ms"),
        "the cost is reported: {premapped}"
    );
    handle.send(Command::Switch);
    let gate = loop {
        match next(&handle) {
            Event::Switch(baton::protocol::SwitchEvent {
                gate,
                timings,
                suffix_tokens,
                ..
            }) => {
                // The pre-map already moved the conversation: nothing is left to map.
                assert_eq!(suffix_tokens, 0, "{timings:?}");
                break gate.expect("a gate decision");
            }
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    };
    assert_eq!(gate.threshold, 1.0);
    assert!(gate.estimate < 1.0);
    assert_eq!(gate.used, CacheOrigin::Reprefilled);
    handle.send(Command::Submit {
        text: "And bye.".into(),
    });
    loop {
        match next(&handle) {
            Event::TurnStarted {
                path: PathKind::Mapped,
                cache,
                ..
            } => {
                assert_eq!(cache, CacheOrigin::Reprefilled, "the gate's choice is used");
                break;
            }
            Event::Error { message, .. } => panic!("{message}"),
            _ => {}
        }
    }
    handle.shutdown();
}

#[test]
fn the_handoff_bench_times_every_stage_on_the_real_pair() {
    use baton::lab::bench::{bench_point, mapper_cost, BenchOptions};
    // Starting an engine makes sure the test mappers exist.
    start(config(4, None)).shutdown();
    let src = baton::fetch::open_model(
        &common::qwen_small().display().to_string(),
        &Device::Cpu,
        &baton::fetch::SilentProgress,
    )
    .unwrap();
    let tgt = baton::fetch::open_model(
        &common::qwen_large().display().to_string(),
        &Device::Cpu,
        &baton::fetch::SilentProgress,
    )
    .unwrap();
    let dir =
        baton::mapper::dir::MapperDir::named(baton::fetch::cache_root().join("test-mappers-int8"));
    let m = engine::load::load_mapper(&dir, &src, &tgt).unwrap();
    let cost = mapper_cost(&m.mapper);
    // Each map reads its k source layers (and the token block's pieces, when it reads
    // them) of 2×64 features into 2×128, for 28 target layers, K and V; the block costs
    // the 1.5B's layer-0 key and value projections (1536 → 256 each) on top.
    let maps = m.mapper.keys().iter().chain(m.mapper.values());
    let pieces: usize = maps.map(|t| t.sources.len()).sum();
    assert!(pieces >= 2 * 28 * m.info.k, "{pieces}");
    let block = if m.mapper.reads_tokens() {
        2.0 * 1536.0 * 256.0
    } else {
        0.0
    };
    assert_eq!(
        cost.flops_per_token,
        2.0 * (pieces as f64 * 128.0 * 256.0 + block)
    );
    let p = bench_point(
        &src,
        &tgt,
        &m.mapper,
        96,
        &BenchOptions {
            repeats: 1,
            suffix: 32,
            reread: Some(baton::handoff::reread::RereadSetting::share(0.25)),
        },
    )
    .unwrap();
    assert_eq!((p.tokens, p.suffix), (96, 32));
    // The handoff with a re-read costs the map and more, and less than reading it all.
    let with = p.handoff_with_reread.unwrap();
    assert!(with.median_ms > p.map_full.median_ms, "{with:?}");
    assert!(p
        .reread_share_of_reprefill
        .is_some_and(|s| s > 0.0 && s.is_finite()));
    for s in [
        p.source_prefill,
        p.reprefill_full,
        p.map_full,
        p.map_suffix,
        p.reprefill_suffix,
        p.switch_end_to_end,
    ] {
        assert!(
            s.min_ms > 0.0 && s.min_ms <= s.median_ms && s.median_ms <= s.max_ms,
            "{s:?}"
        );
    }
    // The switch includes the suffix map it starts with.
    assert!(p.switch_end_to_end.median_ms >= p.map_suffix.median_ms);
}

#[test]
fn a_headless_run_reports_the_errors_its_steps_met_and_none_when_there_were_none() {
    let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    let fine = [Command::Submit {
        text: "Say hi.".into(),
    }];
    let ran = baton::headless::run_headless(config(4, None), &fine, &mut |_| {}).unwrap();
    assert!(!ran.failed(), "{:?}", ran.errors);
    // Past the model's context: the turn fails, the run goes on and says so.
    let too_long = [Command::Submit {
        text: "word ".repeat(40_000),
    }];
    let ran = baton::headless::run_headless(config(4, None), &too_long, &mut |_| {}).unwrap();
    assert!(ran.failed());
    assert!(ran.errors[0].contains("context"), "{:?}", ran.errors);
}

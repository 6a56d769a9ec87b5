//! Session files on disk: written by SessionWriter, read back, recovered after a crash,
//! refused when they are not ours to read, and summarised by `baton report`.

mod common;

use baton::protocol::*;
use baton::session::{
    default_session_path, read_session, SessionError, SessionHeader, SessionWriter,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn model(name: &str) -> ModelInfo {
    ModelInfo {
        name: name.into(),
        path: format!("models/{name}.gguf"),
        sha256: name.repeat(64).chars().take(64).collect(),
        arch: "qwen2".into(),
        n_layer: 2,
        n_kv_head: 2,
        head_dim: 64,
    }
}

fn header() -> SessionHeader {
    SessionHeader::new(
        vec![model("a"), model("b")],
        vec![MapperInfo {
            id: "a--b.safetensors".into(),
            source: "a".into(),
            target: "b".into(),
            sha256: "c".repeat(64),
            k: 2,
        }],
        "cpu",
        serde_json::json!({"temperature": 0.0, "max_tokens": 64}),
    )
}

fn generation(turn: u32, path: PathKind, model: &str, ids: &[u32]) -> Event {
    Event::Generation {
        turn,
        path,
        model: model.into(),
        text: "x".repeat(ids.len()),
        token_ids: ids.to_vec(),
        prompt_tokens: 12,
        timings: GenerationTimings {
            prefill_ms: 8.0,
            first_token_ms: 9.5,
            decode_tokens_per_s: 40.0,
            total_ms: 120.0,
            waited_ms: None,
        },
        stop: StopKind::Eos,
    }
}

/// A conversation with one switch from `a` to `b` and two compared turns, with the
/// streamed tokens and loading progress an engine emits along the way.
fn emitted() -> Vec<Event> {
    use PathKind::{Mapped, Reference};
    let token = |turn, path, id| Event::Token {
        turn,
        path,
        text: format!("t{id}"),
        id,
    };
    vec![
        Event::Loading {
            stage: "loading b".into(),
            done: 1,
            total: 2,
            eta_seconds: Some(0.5),
        },
        Event::Ready {
            models: vec![model("a"), model("b")],
            active: 0,
            mappers: header().mappers,
            device: "cpu".into(),
        },
        Event::UserMessage {
            turn: 1,
            text: "write a sort".into(),
        },
        Event::TurnStarted {
            turn: 1,
            path: Mapped,
            model: "a".into(),
            cache: CacheOrigin::True,
            repaired: None,
        },
        token(1, Mapped, 11),
        token(1, Mapped, 12),
        generation(1, Mapped, "a", &[11, 12]),
        Event::Done { turn: 1 },
        Event::Switch(baton::protocol::SwitchEvent {
            index: 0,
            turn: 2,
            from: "a".into(),
            to: "b".into(),
            context_tokens: 14,
            suffix_tokens: 14,
            timings: SwitchTimings {
                map_full_ms: None,
                reprefill_full_ms: None,
                reprefill_suffix_ms: None,
                ..switch_timings()
            },
            metrics: None,
            gate: None,
            measurement_follows: true,
            estimate: None,
            mapper: Some(baton::protocol::MapperState::default()),
            reread: None,
        }),
        Event::UserMessage {
            turn: 2,
            text: "now in place".into(),
        },
        token(2, Mapped, 21),
        token(2, Reference, 21),
        generation(2, Mapped, "b", &[21, 22, 23]),
        generation(2, Reference, "b", &[21, 22, 24]),
        Event::TurnComparison {
            turn: 2,
            identical: false,
            first_difference: Some(2),
            agreement: 2.0 / 3.0,
        },
        Event::Bookmark {
            turn: 2,
            note: "first divergence".into(),
        },
        Event::Done { turn: 2 },
        // The message of turn 2 went ahead of the switch's measurement.
        Event::SwitchMeasured {
            index: 0,
            turn: 2,
            timings: switch_timings(),
            metrics: Some(switch_metrics()),
            yielded_to: vec![2],
            stopped: None,
            estimate: None,
        },
        Event::ShutDown,
    ]
}

fn switch_timings() -> SwitchTimings {
    SwitchTimings {
        source_prefill_ms: Some(25.0),
        map_full_ms: Some(2.0),
        map_suffix_ms: Some(2.0),
        reprefill_full_ms: Some(50.0),
        reprefill_suffix_ms: Some(50.0),
        end_to_end_ms: 3.0,
    }
}

fn switch_metrics() -> SwitchMetrics {
    SwitchMetrics {
        attention_cosine: vec![0.97, 0.91],
        r2_k: vec![0.9, 0.85],
        r2_v: vec![0.8, 0.75],
        key_error_concentration: vec![0.2, 0.3],
        top1_agreement: Some(0.9),
        kl: Some(0.05),
    }
}

fn recorded() -> Vec<Event> {
    emitted().into_iter().filter(Event::is_recorded).collect()
}

fn write_session(path: &Path) {
    let mut w = SessionWriter::create(path, &header()).unwrap();
    for e in emitted() {
        w.append(&e).unwrap();
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_written_session_reads_back_identical() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/folders/s.jsonl");
    let h = header();
    let mut w = SessionWriter::create(&path, &h).unwrap();
    for e in emitted() {
        assert_eq!(w.append(&e).unwrap(), e.is_recorded());
    }
    assert_eq!(w.recorded() as usize, recorded().len());
    drop(w);

    let s = read_session(&path).unwrap();
    assert_eq!(s.header, h);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    let events: Vec<Event> = s.events().cloned().collect();
    assert_eq!(events, recorded());
    let seqs: Vec<u64> = s.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    assert!(s.events.windows(2).all(|p| p[0].t_ms <= p[1].t_ms));
}

#[test]
fn the_file_is_one_header_line_then_one_line_per_recorded_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    write_session(&path);
    let lines = lines(&path);
    assert_eq!(lines.len(), 1 + recorded().len());
    let header: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(header["format"], "baton-session");
    assert_eq!(header["version"], 1);
    assert_eq!(header["minor"], baton::session::MINOR);
    assert_eq!(header["baton_version"], env!("CARGO_PKG_VERSION"));
    let created = header["created"].as_str().unwrap();
    assert!(created.len() == 20 && created.ends_with('Z'), "{created}");
    let first: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(first["seq"], 0);
    assert!(first["t_ms"].is_f64());
    assert_eq!(first["event"]["type"], "ready");
    for line in &lines[1..] {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let kind = v["event"]["type"].as_str().unwrap();
        assert!(kind != "token" && kind != "loading", "{line}");
    }
}

#[test]
fn a_file_cut_mid_line_loads_up_to_its_last_complete_event() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    write_session(&path);
    let bytes = std::fs::read(&path).unwrap();
    // Cut the last line in half, as a crash during its write would.
    let last_start = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    let cut = last_start + (bytes.len() - last_start) / 2;
    std::fs::write(&path, &bytes[..cut]).unwrap();

    let s = read_session(&path).unwrap();
    let expected = recorded();
    let events: Vec<Event> = s.events().cloned().collect();
    assert_eq!(events, expected[..expected.len() - 1]);
    assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    let line = 1 + expected.len();
    assert!(
        s.warnings[0].contains(&format!("line {line} is cut off")),
        "{}",
        s.warnings[0]
    );
}

#[test]
fn a_newer_version_is_refused_with_a_hint_to_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    write_session(&path);
    let mut lines = lines(&path);
    let mut header: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    header["version"] = 2.into();
    lines[0] = header.to_string();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();

    let err = read_session(&path).unwrap_err();
    assert!(matches!(
        err,
        SessionError::UnsupportedVersion { found: 2, .. }
    ));
    let msg = err.to_string();
    assert!(msg.contains("version 2"), "{msg}");
    assert!(msg.contains("reads version 1 only"), "{msg}");
    assert!(msg.contains("upgrade baton"), "{msg}");
    assert!(msg.contains("s.jsonl"), "{msg}");
}

#[test]
fn an_existing_file_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    write_session(&path);
    let before = std::fs::read(&path).unwrap();
    let err = SessionWriter::create(&path, &header()).unwrap_err();
    assert!(matches!(err, SessionError::Exists { .. }));
    let msg = err.to_string();
    assert!(msg.contains("s.jsonl already exists"), "{msg}");
    assert!(msg.contains("pick another file name"), "{msg}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn an_empty_file_or_a_foreign_one_is_not_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let msg = read_session(&empty).unwrap_err().to_string();
    assert!(msg.contains("is empty"), "{msg}");

    let foreign = dir.path().join("foreign.jsonl");
    std::fs::write(&foreign, "{\"hello\": 1}\n").unwrap();
    let msg = read_session(&foreign).unwrap_err().to_string();
    assert!(msg.contains("not a baton session header"), "{msg}");

    let missing = dir.path().join("missing.jsonl");
    let msg = read_session(&missing).unwrap_err().to_string();
    assert!(msg.contains("cannot read the session file"), "{msg}");
}

#[test]
fn default_paths_are_timestamped_under_sessions_and_never_collide() {
    let dir = tempfile::tempdir().unwrap();
    let first = default_session_path(dir.path());
    assert_eq!(first.parent().unwrap(), dir.path().join("sessions"));
    let name = first.file_name().unwrap().to_str().unwrap();
    // 2026-11-30T14-05-00Z-<process id>.jsonl
    let pid = std::process::id().to_string();
    assert_eq!(
        name.len(),
        "2026-11-30T14-05-00Z-.jsonl".len() + pid.len(),
        "{name}"
    );
    assert!(
        name.ends_with(&format!("Z-{pid}.jsonl")) && !name.contains(':'),
        "{name}"
    );
    SessionWriter::create(&first, &header()).unwrap();
    let second = default_session_path(dir.path());
    assert_ne!(first, second);
    SessionWriter::create(&second, &header()).unwrap();
}

fn baton(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(args)
        .output()
        .unwrap()
}

fn written(dir: &Path) -> PathBuf {
    let path = dir.join("s.jsonl");
    write_session(&path);
    path
}

#[test]
fn baton_report_prints_tables_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let file = path.to_str().unwrap();

    let out = baton(&["report", file]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("switches"), "{stdout}");
    assert!(stdout.contains("a -> b"), "{stdout}");
    assert!(stdout.contains("25.0x"), "{stdout}");
    assert!(stdout.contains("no, at token 2"), "{stdout}");
    assert!(stdout.contains("first divergence"), "{stdout}");

    let out = baton(&["report", file, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["format"], "baton-report");
    assert_eq!(v["switches"][0]["speedup_full"], 25.0);
    assert_eq!(v["turns"].as_array().unwrap().len(), 2);
    assert_eq!(v["summary"]["compared_turns"], 1);
}

/// The same session as a baton before format 1.1 wrote it: no minor version, every
/// measurement in the switch event, no measurement event.
fn written_in_format_1_0(dir: &Path) -> PathBuf {
    let path = dir.join("old.jsonl");
    let mut header = serde_json::to_value(header()).unwrap();
    header.as_object_mut().unwrap().remove("minor");
    let mut lines = vec![header.to_string()];
    let mut seq = 0;
    for e in recorded() {
        let mut v = serde_json::to_value(&e).unwrap();
        match v["type"].as_str() {
            Some("switch_measured") => continue,
            Some("switch") => {
                v["timings"] = serde_json::to_value(switch_timings()).unwrap();
                v["metrics"] = serde_json::to_value(switch_metrics()).unwrap();
                v.as_object_mut().unwrap().remove("measurement_follows");
            }
            _ => {}
        }
        lines.push(serde_json::json!({"seq": seq, "t_ms": seq as f64, "event": v}).to_string());
        seq += 1;
    }
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

#[test]
fn a_session_of_format_1_0_reads_and_reports_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let old = read_session(written_in_format_1_0(dir.path())).unwrap();
    assert!(old.warnings.is_empty(), "{:?}", old.warnings);
    assert_eq!(old.header.minor, 0);
    assert!(!old
        .events()
        .any(|e| matches!(e, Event::SwitchMeasured { .. })));
    let new = read_session(written(dir.path())).unwrap();
    let (ro, rn) = (
        baton::session::Report::from_session(&old),
        baton::session::Report::from_session(&new),
    );
    assert_eq!(ro.switches, rn.switches);
    assert_eq!(ro.summary, rn.summary);
    assert_eq!(rn.switches[0].timings.speedup_full(), Some(25.0));
    assert_eq!(rn.switches[0].cosine_min(), Some(0.91));
    assert!(rn.switches[0].measured());
}

#[test]
fn baton_report_plots_to_svg() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let svg = dir.path().join("drift.svg");
    let out = baton(&[
        "report",
        path.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("<svg") && text.contains("attention cosine mean"));
}

#[test]
fn baton_report_warns_on_a_cut_file_and_fails_on_a_foreign_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = written(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 5);
    std::fs::write(&path, &bytes).unwrap();
    let out = baton(&["report", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("cut off"));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();

    let foreign = dir.path().join("notes.txt");
    std::fs::write(&foreign, "hello\n").unwrap();
    let out = baton(&["report", foreign.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a baton session header"));
}

/// `baton replay` of `session` on the tiny pair under `dir`, recording to `record`.
fn replay(dir: &Path, session: &Path, record: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["replay", session.to_str().unwrap(), "--record", record])
        .arg("--mapper-dir")
        .arg(dir.join("mappers"))
        .current_dir(dir)
        .env("BATON_CACHE_DIR", dir.join("cache"))
        .env_remove("BATON_MAPPER_DIR")
        .output()
        .unwrap()
}

/// `path`'s lines with `edit` applied to each event line's JSON (`None` drops the line)
/// and the header's minor version set to `minor`.
fn rewrite(
    path: &Path,
    to: &Path,
    minor: u32,
    edit: impl Fn(serde_json::Value) -> Option<serde_json::Value>,
) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let mut header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    header["minor"] = minor.into();
    let mut out = vec![header.to_string()];
    for l in lines {
        if let Some(v) = edit(serde_json::from_str(l).unwrap()) {
            out.push(v.to_string());
        }
    }
    std::fs::write(to, out.join("\n") + "\n").unwrap();
}

#[test]
fn a_replay_makes_a_mid_session_plan_change_where_it_was_made_and_names_one_it_cannot() {
    use baton::protocol::Command;
    use common::engine_rig::{rig_with, tiny, write_pair};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_pair(d, false);
    // Recorded as the workbench does it: no plan at the start, then Ctrl-E between
    // turns sets one, which the next switch makes, and sets it off again after.
    let recorded = d.join("recorded.jsonl");
    let rig = rig_with(d, |cfg| {
        cfg.settings.reread = None;
        cfg.record = Some(recorded.clone());
    });
    let handle = rig.start();
    let say = |words, seed| Command::Submit {
        text: tiny().chat_text(words, seed),
    };
    let steps = [
        say(120, 1),
        Command::SetReread {
            setting: Some("40%".parse().unwrap()),
        },
        Command::Switch,
        say(12, 2),
        Command::SetReread { setting: None },
        Command::Switch,
        say(12, 3),
        Command::Finish,
    ];
    baton::headless::script::run_steps(&steps, &|c| handle.send(c), &handle.events, &mut |e| {
        if let Event::Error { message, .. } = e {
            panic!("{message}");
        }
    })
    .unwrap();
    handle.shutdown();
    let session = read_session(&recorded).unwrap();
    let changes: Vec<(u32, String)> = session
        .events()
        .filter_map(|e| match e {
            Event::SettingChanged {
                turn,
                setting,
                value,
            } if setting == "reread" => Some((*turn, value.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        changes.len(),
        2,
        "each change is an event of its own: {changes:?}"
    );
    assert_eq!(changes[0].0, 1);
    assert!(changes[0].1.starts_with("40%"), "{changes:?}");
    assert_eq!(changes[1], (2, "off".to_string()));
    let planned = session
        .events()
        .filter(|e| matches!(e, Event::SwitchReread { .. }))
        .count();
    assert_eq!(
        planned, 1,
        "the first switch's plan re-read before turn 2, the second's none"
    );

    let out = replay(d, &recorded, "replayed.jsonl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("identical"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A file from before the event: the notice says what the change was, and the
    // replay makes it from there.
    let older = d.join("older.jsonl");
    rewrite(&recorded, &older, 7, |v| {
        (v["event"]["type"] != "setting_changed").then_some(v)
    });
    let out = replay(d, &older, "older-replayed.jsonl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("identical"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A notice that does not read back: the replay says it cannot make that change and
    // names the plan the switch ran under on each side, before any other difference.
    let unreadable = d.join("unreadable.jsonl");
    rewrite(&recorded, &unreadable, 7, |mut v| {
        if v["event"]["type"] == "setting_changed" {
            return None;
        }
        if v["event"]["type"] == "notice"
            && v["event"]["message"]
                .as_str()
                .unwrap()
                .starts_with("re-read 40%")
        {
            v["event"]["message"] = "re-read forty percent from now on".into();
        }
        Some(v)
    });
    let out = replay(d, &unreadable, "unreadable-replayed.jsonl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("cannot apply") && stderr.contains("forty percent"),
        "{stderr}"
    );
    let first = stdout.lines().next().unwrap_or("");
    assert_eq!(first, "run under other settings:", "{stdout}");
    assert!(
        stdout.contains("switch 0 (turn 2): plan recorded 40%") && stdout.contains("replayed none"),
        "{stdout}"
    );
}

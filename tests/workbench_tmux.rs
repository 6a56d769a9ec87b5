//! The real binary's workbench in a real terminal (tmux) on the default pair: type a
//! message, wait for the answer, press Tab, send another, and check that the screen
//! shows a measured map time, a re-prefill time and per-layer cosines, and that the
//! session file holds the switch. On two tiny chat models generated here (seconds): a
//! long paste followed by Enter is sent whole, and a decomposed accent is answered and
//! so is the message after it. Skips with a note where tmux is missing (scripts/test
//! installs it).

mod common;

use common::engine_rig::{tiny, write_pair_of};
use common::synthetic::Tiny;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn screen(session: &str) -> String {
    tmux(&["capture-pane", "-p", "-t", session])
}

/// Poll `check` until it holds or `limit` passes; the screen is printed on failure.
fn wait_for(session: &str, what: &str, limit: Duration, check: &dyn Fn() -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let s = screen(session);
    tmux(&["kill-session", "-t", session]);
    panic!("timed out waiting for {what}; screen:\n{s}");
}

fn count_in(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches(needle).count())
        .unwrap_or(0)
}

struct KillOnDrop(String);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

#[test]
fn a_switch_in_the_workbench_shows_measured_numbers_and_is_recorded() {
    if Command::new("tmux").arg("-V").output().is_err() {
        common::skipped(
            "a_switch_in_the_workbench_shows_measured_numbers_and_is_recorded",
            "tmux is not installed (scripts/test installs it)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("s.jsonl");
    let mappers = baton::fetch::cache_root().join("test-mappers-int8");
    let (small, large) = (common::qwen_small(), common::qwen_large());
    let session = format!("baton-test-{}", std::process::id());
    let cmd = format!(
        "{} workbench --source {} --target {} --mapper-dir {} --record {} --max-tokens 16",
        env!("CARGO_BIN_EXE_baton"),
        small.display(),
        large.display(),
        mappers.display(),
        record.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "48",
        "-c",
        &dir.path().display().to_string(),
        &cmd,
    ]);
    let _kill = KillOnDrop(session.clone());
    // Ready: the header line is written once both models and mappers are loaded (a first
    // run calibrates the small test mappers, hence the long limit).
    wait_for(
        &session,
        "the engine to be ready",
        Duration::from_secs(900),
        &|| count_in(&record, "\"type\":\"ready\"") == 1,
    );
    tmux(&[
        "send-keys",
        "-t",
        &session,
        "-l",
        "Write hello world in Rust.",
    ]);
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the first answer",
        Duration::from_secs(300),
        &|| count_in(&record, "\"type\":\"done\"") == 1,
    );
    tmux(&["send-keys", "-t", &session, "Tab"]);
    wait_for(&session, "the switch", Duration::from_secs(300), &|| {
        count_in(&record, "\"type\":\"switch\"") == 1
    });
    tmux(&["send-keys", "-t", &session, "-l", "Now in Python."]);
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the answer after the switch",
        Duration::from_secs(300),
        &|| count_in(&record, "\"type\":\"done\"") == 2,
    );
    // The switch's measurement gave way to the message and follows its turn.
    wait_for(
        &session,
        "the switch's measurement",
        Duration::from_secs(300),
        &|| count_in(&record, "\"type\":\"switch_measured\"") == 1,
    );
    // Let the last events reach the screen.
    std::thread::sleep(Duration::from_millis(800));
    let s = screen(&session);
    eprintln!("{s}");
    assert!(s.contains("map"), "a map time is shown:\n{s}");
    assert!(s.contains("re-prefill"), "a re-prefill time is shown:\n{s}");
    assert!(s.contains("ms"), "times are in milliseconds:\n{s}");
    assert!(
        s.to_lowercase().contains("cosine"),
        "per-layer cosines are shown:\n{s}"
    );
    // Quit while an answer is being written: q asks first (it may start a message, and a
    // turn is running), y confirms. What was on screen and the end of the session must
    // reach the file before the workbench is gone.
    tmux(&["send-keys", "-t", &session, "-l", "And in Go?"]);
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the third message",
        Duration::from_secs(120),
        &|| count_in(&record, "\"type\":\"user_message\"") == 3,
    );
    // Into the answer (its prompt is a few tokens; 16 tokens take seconds on the 1.5B).
    std::thread::sleep(Duration::from_millis(1200));
    tmux(&["send-keys", "-t", &session, "q"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["send-keys", "-t", &session, "y"]);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) && tmux(&["list-sessions"]).contains(&session) {
        std::thread::sleep(Duration::from_millis(300));
    }
    let text = std::fs::read_to_string(&record).unwrap();
    let session_file = baton::session::read_session(&record).unwrap();
    assert!(
        session_file.warnings.is_empty(),
        "{:?}",
        session_file.warnings
    );
    assert!(session_file
        .events()
        .any(|e| matches!(e, baton::protocol::Event::Switch(_))));
    let switch = session_file
        .events()
        .find_map(|e| match e {
            baton::protocol::Event::SwitchMeasured {
                timings, metrics, ..
            } => Some((*timings, metrics.clone())),
            _ => None,
        })
        .expect("the session file holds the switch's measurement");
    assert!(switch.0.map_full_ms.is_some_and(|m| m > 0.0));
    assert!(switch.0.reprefill_full_ms.is_some_and(|r| r > 0.0));
    assert!(switch.1.is_some_and(|m| !m.attention_cosine.is_empty()));
    assert!(text.contains("\"type\":\"user_message\""));
    // The quit mid-answer: the third turn is recorded to its end and the session closed.
    assert_eq!(count_in(&record, "\"type\":\"user_message\""), 3, "{text}");
    assert!(count_in(&record, "\"type\":\"done\"") >= 3, "{text}");
    let last = text.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("\"event\":{\"type\":\"shut_down\"}"),
        "the file ends with shut_down:\n{text}"
    );
}

#[test]
fn a_fatal_start_up_error_is_shown_and_the_workbench_exits_non_zero() {
    if Command::new("tmux").arg("-V").output().is_err() {
        common::skipped(
            "a_fatal_start_up_error_is_shown_and_the_workbench_exits_non_zero",
            "tmux is not installed (scripts/test installs it)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status");
    // Two models whose tokenizers differ: the engine stops before it is ready.
    let cmd = format!(
        "{} workbench --source {} --target {} --no-record; echo $? > {}; sleep 60",
        env!("CARGO_BIN_EXE_baton"),
        common::smollm().display(),
        common::qwen_small().display(),
        status.display()
    );
    let session = format!("baton-fatal-{}", std::process::id());
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "40",
        "-c",
        &dir.path().display().to_string(),
        &cmd,
    ]);
    let _kill = KillOnDrop(session.clone());
    wait_for(
        &session,
        "the error on screen",
        Duration::from_secs(120),
        &|| screen(&session).contains("press q to quit"),
    );
    let s = screen(&session);
    assert!(s.contains("tokenizer"), "the error names the problem:\n{s}");
    assert!(
        s.contains("could not start") && !s.contains("working"),
        "{s}"
    );
    // q asks first (it may start a message), y confirms.
    tmux(&["send-keys", "-t", &session, "q"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["send-keys", "-t", &session, "y"]);
    wait_for(
        &session,
        "the exit status",
        Duration::from_secs(30),
        &|| status.exists(),
    );
    let code = std::fs::read_to_string(&status).unwrap();
    assert_ne!(
        code.trim(),
        "0",
        "a workbench that could not start exits non-zero"
    );
}

fn no_tmux(test: &str) -> bool {
    let missing = Command::new("tmux").arg("-V").output().is_err();
    if missing {
        common::skipped(test, "tmux is not installed (scripts/test installs it)");
    }
    missing
}

/// Words the tiny models know besides `w0` …, in the normal form their tokenizer reads.
const ACCENTED: &[&str] = &["café", "ñ"];

/// The workbench on two tiny chat models written under `dir`, with their mappers, in a
/// tmux session of its own; returns once the engine is ready. Answers are a few tokens.
fn tiny_workbench(dir: &Path, name: &str) -> (String, std::path::PathBuf, KillOnDrop) {
    tiny_workbench_with(dir, name, "")
}

/// [`tiny_workbench`] with `env` (`NAME=value `, or empty) before the command.
fn tiny_workbench_with(
    dir: &Path,
    name: &str,
    env: &str,
) -> (String, std::path::PathBuf, KillOnDrop) {
    let t = tiny();
    // Room for two pasted blocks of about 630 tokens each.
    let t = Tiny {
        vocab: t.vocab + ACCENTED.len(),
        chat_words: ACCENTED,
        context: 4096,
        ..t
    };
    write_pair_of(&t, dir, false);
    let record = dir.join("s.jsonl");
    let session = format!("baton-{name}-{}", std::process::id());
    let cmd = format!(
        "{env}{} workbench --source {} --target {} --mapper-dir {} --record {} --max-tokens 4 --no-learn",
        env!("CARGO_BIN_EXE_baton"),
        dir.join("a").display(),
        dir.join("b").display(),
        dir.join("mappers").display(),
        record.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "160",
        "-y",
        "48",
        "-c",
        &dir.display().to_string(),
        &cmd,
    ]);
    let kill = KillOnDrop(session.clone());
    wait_for(
        &session,
        "the engine to be ready",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"ready\"") == 1,
    );
    (session, record, kill)
}

/// The messages the session file holds, in order.
fn user_messages(record: &Path) -> Vec<String> {
    let Ok(s) = baton::session::read_session(record) else {
        return Vec::new();
    };
    s.events()
        .filter_map(|e| match e {
            baton::protocol::Event::UserMessage { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// About 2.6 KB in lines of words the tiny models know, as a pasted text block.
fn pasted_block() -> String {
    let t = tiny();
    let lines: Vec<String> = (0..52).map(|i| t.chat_text(12, 2 * i + 101)).collect();
    let text = lines.join("\n");
    assert!((2500..2800).contains(&text.len()), "{}", text.len());
    text
}

/// Paste `block` into a fresh workbench under `dir`, bracketed or as a burst of keys,
/// press Enter, and give back the messages the session file holds once it is answered.
fn paste_and_send(dir: &Path, name: &str, block: &str, bracketed: bool) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let (session, record, _kill) = tiny_workbench(dir, name);
    tmux(&["set-buffer", "-b", "baton-paste", block]);
    let mut paste = vec!["paste-buffer", "-d", "-b", "baton-paste", "-t", &session];
    if bracketed {
        paste.push("-p");
    }
    tmux(&paste);
    std::thread::sleep(Duration::from_millis(500));
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the pasted message's answer",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"done\"") == 1,
    );
    user_messages(&record)
}

// Each way of pasting gets a workbench of its own: the tiny models' word-level
// tokenizer reads a line break as a space, so their cache cannot be extended past a
// message that holds one (the models a user runs read line breaks as they are).
#[test]
fn a_long_paste_then_enter_sends_the_whole_message() {
    let test = "a_long_paste_then_enter_sends_the_whole_message";
    if no_tmux(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let block = pasted_block();
    // The message keeps its line breaks (tmux pastes them as `\r`, as terminals do).
    let want = vec![block.clone()];
    // As a terminal pastes into an application that asked for bracketed paste: the
    // block between the markers, in one write.
    let sent = paste_and_send(&dir.path().join("bracketed"), "paste", &block, true);
    assert_eq!(sent, want);
    // The same block where no bracketed paste frames it (a terminal without it, or
    // keys sent one by one): a burst of keys whose line breaks are Enter keys.
    let sent = paste_and_send(&dir.path().join("keys"), "paste-keys", &block, false);
    assert_eq!(sent, want);
}

#[test]
fn a_decomposed_accent_typed_in_the_workbench_is_answered_and_so_is_the_next_message() {
    let test = "a_decomposed_accent_typed_in_the_workbench_is_answered_and_so_is_the_next_message";
    if no_tmux(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (session, record, _kill) = tiny_workbench(dir.path(), "accent");
    // e and n with combining marks, as some keyboards and input methods send them.
    let typed = "w3 cafe\u{301} w4 n\u{303}";
    tmux(&["send-keys", "-t", &session, "-l", typed]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the first answer",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"done\"") == 1,
    );
    tmux(&["send-keys", "-t", &session, "-l", "w5 w6"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the second answer",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"done\"") == 2,
    );
    std::thread::sleep(Duration::from_millis(300));
    let s = screen(&session);
    assert!(!s.contains("prefix-stable"), "{s}");
    assert_eq!(count_in(&record, "\"type\":\"error\""), 0, "{s}");
    // The message reached the engine as typed; the engine reads it in NFC.
    assert_eq!(
        user_messages(&record),
        vec![typed.to_string(), "w5 w6".into()]
    );
    let session_file = baton::session::read_session(&record).unwrap();
    let answers = session_file
        .events()
        .filter(|e| {
            matches!(
                e,
                baton::protocol::Event::Generation { token_ids, .. } if !token_ids.is_empty()
            )
        })
        .count();
    assert_eq!(answers, 2, "{s}");
}

#[test]
fn a_paste_then_tab_then_enter_sends_the_whole_message_after_the_switch() {
    let test = "a_paste_then_tab_then_enter_sends_the_whole_message_after_the_switch";
    if no_tmux(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (session, record, _kill) = tiny_workbench(dir.path(), "queue");
    tmux(&["send-keys", "-t", &session, "-l", "w3 w4"]);
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(
        &session,
        "the first answer",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"done\"") == 1,
    );
    let block = pasted_block();
    tmux(&["set-buffer", "-b", "baton-paste", &block]);
    tmux(&[
        "paste-buffer",
        "-p",
        "-d",
        "-b",
        "baton-paste",
        "-t",
        &session,
    ]);
    std::thread::sleep(Duration::from_millis(500));
    // Tab and Enter in one go: Enter arrives while the switch runs.
    tmux(&["send-keys", "-t", &session, "Tab", "Enter"]);
    wait_for(
        &session,
        "the queued message's answer",
        Duration::from_secs(60),
        &|| count_in(&record, "\"type\":\"done\"") == 2,
    );
    std::thread::sleep(Duration::from_millis(300));
    let s = screen(&session);
    assert_eq!(
        user_messages(&record),
        vec!["w3 w4".to_string(), block],
        "{s}"
    );
    // The session file has the switch before the message that waited for it.
    let events: Vec<_> = baton::session::read_session(&record)
        .unwrap()
        .events()
        .cloned()
        .collect();
    let switch = events
        .iter()
        .position(|e| matches!(e, baton::protocol::Event::Switch(_)));
    let second = events
        .iter()
        .position(|e| matches!(e, baton::protocol::Event::UserMessage { turn: 2, .. }));
    assert!(
        switch.is_some() && switch < second,
        "the switch comes first: {switch:?} {second:?}\n{s}"
    );
}

/// The SGR parameters of every `ESC [ … m` in `text` that set a colour (not the
/// default-colour 39 and 49), with the extended forms `38;5;n` and `38;2;r;g;b`.
fn colour_sequences(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for part in text.split("\u{1b}[").skip(1) {
        let Some(end) = part.find(|c: char| !(c.is_ascii_digit() || c == ';')) else {
            continue;
        };
        if !part[end..].starts_with('m') {
            continue;
        }
        let params = &part[..end];
        let colour = params.split(';').any(|p| {
            matches!(p.parse::<u32>(), Ok(n) if (30..=38).contains(&n) || (40..=48).contains(&n) || (90..=107).contains(&n))
        });
        if colour {
            found.push(params.to_string());
        }
    }
    found
}

#[test]
fn a_dumb_terminal_is_sent_no_colour() {
    let test = "a_dumb_terminal_is_sent_no_colour";
    if no_tmux(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (session, record, _kill) = tiny_workbench_with(dir.path(), "dumb", "TERM=dumb ");
    // A turn and a switch put the coloured parts on screen: the active model's badge,
    // the mapped cache's label, the latency bars.
    tmux(&["send-keys", "-t", &session, "-l", "w3 w4"]);
    tmux(&["send-keys", "-t", &session, "Enter"]);
    wait_for(&session, "the answer", Duration::from_secs(60), &|| {
        count_in(&record, "\"type\":\"done\"") == 1
    });
    tmux(&["send-keys", "-t", &session, "Tab"]);
    wait_for(&session, "the switch", Duration::from_secs(60), &|| {
        count_in(&record, "\"type\":\"switch\"") == 1
    });
    std::thread::sleep(Duration::from_millis(500));
    let with_styles = tmux(&["capture-pane", "-e", "-p", "-t", &session]);
    // The capture does carry styles: bold is still sent.
    assert!(with_styles.contains("\u{1b}[1m"), "{with_styles:?}");
    let colours = colour_sequences(&with_styles);
    assert!(colours.is_empty(), "colours sent: {colours:?}");
}

#[test]
fn alt_enter_starts_a_new_line_and_a_blank_message_is_refused_with_a_reason() {
    let test = "alt_enter_starts_a_new_line_and_a_blank_message_is_refused_with_a_reason";
    if no_tmux(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (session, record, _kill) = tiny_workbench(dir.path(), "lines");
    let keys = |keys: &[&str]| {
        let mut args = vec!["send-keys", "-t", &session];
        args.extend(keys);
        tmux(&args);
        std::thread::sleep(Duration::from_millis(300));
    };
    // Spaces alone: nothing is sent, the screen says why, the spaces stay.
    keys(&["-l", "   "]);
    keys(&["Enter"]);
    wait_for(&session, "the refusal", Duration::from_secs(10), &|| {
        screen(&session).contains("not sent:")
    });
    keys(&["BSpace", "BSpace", "BSpace"]);
    // Alt-Enter as the terminal sends it (Escape, then a carriage return).
    keys(&["-l", "w1 w2"]);
    keys(&["M-Enter"]);
    keys(&["-l", "w3"]);
    let s = screen(&session);
    let rows: Vec<&str> = s.lines().collect();
    let at = rows
        .iter()
        .position(|r| r.contains("│w1 w2 "))
        .unwrap_or_else(|| panic!("the first line is not shown:\n{s}"));
    assert!(rows[at + 1].starts_with("│w3 "), "{s}");
    assert!(rows[at - 1].contains("· 2 lines"), "{s}");
    keys(&["Enter"]);
    wait_for(&session, "the answer", Duration::from_secs(60), &|| {
        count_in(&record, "\"type\":\"done\"") == 1
    });
    assert_eq!(user_messages(&record), vec!["w1 w2\nw3".to_string()]);
}

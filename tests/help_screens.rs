//! Every command's `-h`, as the binary prints it on an 80-column terminal: it fits above
//! the prompt on a 24-row screen (22 rows at most, so its first line stays in view when
//! the prompt returns), no line is wider than the terminal, and it reads right.

use std::process::{Command, Stdio};

fn help(path: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(path)
        .arg("-h")
        // No terminal to measure: clap reads the width from COLUMNS.
        .env("COLUMNS", "80")
        .stdin(Stdio::null())
        .output()
        .expect("baton runs");
    assert!(out.status.success(), "baton {} -h failed", path.join(" "));
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The commands a help lists (two-space indented names before their line), under the
/// headings of `baton -h` or a "Commands:" section.
fn listed(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_list = false;
    for line in text.lines() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_list = !line.starts_with("Usage") && !line.contains("Options");
            continue;
        }
        if line.is_empty() || line.starts_with("Options") {
            in_list = false;
        }
        // A command's name is indented two spaces; a wrapped line, further.
        let name = line
            .strip_prefix("  ")
            .filter(|l| !l.starts_with(' '))
            .and_then(|l| l.split_whitespace().next());
        if let Some(name) = name.filter(|_| in_list) {
            if name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !name.starts_with('-')
            {
                out.push(name.to_string());
            }
        }
    }
    out
}

/// Every command path, found by walking the helps themselves.
fn every_command() -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    let mut i = 0;
    while i < paths.len() {
        let path: Vec<String> = paths[i].clone();
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        for sub in listed(&help(&args)) {
            let mut p = path.clone();
            p.push(sub);
            paths.push(p);
        }
        i += 1;
    }
    paths
}

#[test]
fn every_short_help_stays_on_one_screen_with_its_first_line_in_view() {
    let paths = every_command();
    // The top level, fifteen commands, and study's four.
    assert!(paths.len() >= 20, "{paths:?}");
    for want in [
        &["eval"][..],
        &["run"],
        &["study", "run"],
        &["study", "plan"],
    ] {
        assert!(paths.iter().any(|p| p == want), "{want:?} not in {paths:?}");
    }
    for path in &paths {
        let args: Vec<&str> = path.iter().map(String::as_str).collect();
        let text = help(&args);
        let rows = text.lines().count();
        assert!(
            rows <= 22,
            "baton {} -h is {rows} rows:\n{text}",
            args.join(" ")
        );
        let wide = text.lines().find(|l| l.chars().count() > 80);
        assert!(wide.is_none(), "baton {} -h: {wide:?}", args.join(" "));
    }
}

#[test]
fn a_count_of_flags_is_singular_for_one() {
    for path in [
        &["report"][..],
        &["info"],
        &["mappers"],
        &["eval"],
        &["run"],
    ] {
        let text = help(path);
        assert!(!text.contains(" 1 more flags"), "{path:?}:\n{text}");
        let count = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(3)
            .find(|w| w[1] == "more" && w[2].starts_with("flag"))
            .map(|w| (w[0].trim_start_matches('(').to_string(), w[2].to_string()));
        let (n, noun) = count.unwrap_or_else(|| panic!("{path:?}: no count of flags:\n{text}"));
        let singular = noun.starts_with("flag") && !noun.starts_with("flags");
        assert_eq!(n == "1", singular, "{path:?}: {n} more {noun}");
    }
}

#[test]
fn study_run_puts_the_study_and_its_shard_under_what_to_run() {
    let text = help(&["study", "run"]);
    let section = |heading: &str| -> String {
        text.split("\n\n")
            .find(|block| block.starts_with(heading))
            .unwrap_or_else(|| panic!("no {heading} in:\n{text}"))
            .to_string()
    };
    let what = section("What to run:");
    for part in ["<STUDY>", "--shard ", "--shards"] {
        assert!(what.contains(part), "{part} not under What to run:\n{text}");
    }
    assert!(!text.contains("What to measure"), "{text}");
}

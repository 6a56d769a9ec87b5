//! The code map stays true: ARCHITECTURE.md's layer list is read here, and every room of
//! `src/` must be in it and import (outside doc comments and test modules) only from its
//! own layer and the layers below; `unsafe` appears only in the rooms that say they hold
//! it. A new import that breaks the list fails here, naming the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The rooms that may hold `unsafe` outside tests.
const UNSAFE_ROOMS: [&str; 2] = ["kernels", "os"];
/// Test-only helpers any room's tests may use.
const TEST_ONLY: &str = "test_support";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Room name → layer index, bottom first, from the fenced block of ARCHITECTURE.md's
/// "Bird's-eye view": each line's names before the description column (`name/` or
/// `name.rs`).
fn layers() -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let block = text
        .split("```")
        .nth(1)
        .expect("ARCHITECTURE.md has the layer list in its first fenced block");
    let mut out = BTreeMap::new();
    for (layer, line) in block.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if line.starts_with(' ') {
            continue;
        }
        for word in line.split_whitespace() {
            let room = word.strip_suffix('/').or_else(|| word.strip_suffix(".rs"));
            match room {
                Some(r) => {
                    out.insert(r.to_string(), layer);
                }
                None => break,
            }
        }
    }
    assert!(out.len() > 10, "the layer list was not read: {out:?}");
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The room a source file belongs to: its first component under `src/`.
fn room_of(path: &Path) -> String {
    let rel = path.strip_prefix(root().join("src")).unwrap();
    let first = rel.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The production lines of a file, numbered: the test module that ends most files
/// (`#[cfg(test)]` then `mod …`) and comments left out.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .iter()
        .enumerate()
        .position(|(i, l)| {
            l.trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|n| n.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, *l))
        .collect()
}

/// The rooms a line names as `crate::room`, its trailing comment left out.
fn rooms_named(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    code.match_indices("crate::")
        .filter(|(i, _)| {
            // `baton::` or another crate's `…crate::` is not this crate's path.
            *i == 0 || !code[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, m)| {
            code[i + m.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// `code` with what stands between double quotes left out (a message may say "unsafe").
fn without_strings(code: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    let mut chars = code.chars();
    while let Some(c) = chars.next() {
        match (inside, c) {
            (true, '\\') => {
                chars.next();
            }
            (_, '"') => inside = !inside,
            (false, c) => out.push(c),
            (true, _) => {}
        }
    }
    out
}

#[test]
fn every_import_keeps_to_the_layer_list_and_every_room_is_in_it() {
    let layers = layers();
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut broken = Vec::new();
    for file in &files {
        let room = room_of(file);
        if room == "lib" || room == TEST_ONLY {
            continue;
        }
        let Some(&own) = layers.get(&room) else {
            broken.push(format!(
                "{}: room `{room}` is not in ARCHITECTURE.md's layer list",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in code_lines(&text) {
            for named in rooms_named(line) {
                if named == TEST_ONLY || named == room {
                    continue;
                }
                match layers.get(&named) {
                    Some(&layer) if layer <= own => {}
                    Some(_) => broken.push(format!(
                        "{}:{n}: `{room}` imports `{named}`, a layer above it",
                        file.display()
                    )),
                    None => broken.push(format!(
                        "{}:{n}: `{named}` is not in the layer list",
                        file.display()
                    )),
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn unsafe_lives_only_where_the_map_says() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let mut found = Vec::new();
    for file in &files {
        if UNSAFE_ROOMS.contains(&room_of(file).as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in code_lines(&text) {
            let code = without_strings(line.split("//").next().unwrap_or(""));
            let mut words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
            if words.any(|w| w == "unsafe") {
                found.push(format!("{}:{n}: {}", file.display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "unsafe outside {UNSAFE_ROOMS:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // An import named in code counts, one in a comment or another crate's path does not.
    assert_eq!(rooms_named("use crate::engine::X;"), ["engine"]);
    assert_eq!(
        rooms_named("let a = 1; // see crate::engine"),
        Vec::<String>::new()
    );
    assert_eq!(rooms_named("use baton::engine;"), Vec::<String>::new());
    assert_eq!(
        rooms_named("f(crate::mapper::a, crate::model::b)"),
        ["mapper", "model"]
    );
    // A test module at the end is not production code.
    let text = "use crate::a;\n// crate::b\n#[cfg(test)]\nmod tests {\n use crate::c;\n}\n";
    let kept: Vec<&str> = code_lines(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(kept, ["use crate::a;"]);
    assert_eq!(
        without_strings(r#"f("unsafe \" x"); unsafe {"#),
        "f(); unsafe {"
    );
    let layers = layers();
    assert!(layers["protocol"] < layers["engine"] && layers["engine"] < layers["cli"]);
    assert_eq!(layers["mapper"], layers["gate"], "one line, one layer");
}

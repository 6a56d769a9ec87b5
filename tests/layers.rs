//! What Cargo cannot hold about the layers. The crates' manifests keep them apart: a
//! crate that names another in code without depending on it does not build. Left to
//! read from the files:
//! - the manifests themselves keep the rules that ARCHITECTURE.md states: each crate
//!   depends only on the crates listed below it, the TUI crate on the protocol crate
//!   alone, and no crate of the product on the lab;
//! - inside a crate that holds several rooms, a room imports only from its own layer and
//!   those below (`crate::room` and `super::room` paths alike);
//! - `unsafe` lives only in the runtime's `kernels/` and `os/`, outside tests.
//!
//! Production code is every line of every file that a crate compiles without
//! `cfg(test)`: an inline test module is skipped to its closing brace, a file declared
//! as a test module (`#[cfg(test)] mod tests;`) is skipped whole, and nothing else is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The rooms that may hold `unsafe` outside tests, as `crate/room`.
const UNSAFE_ROOMS: [&str; 2] = ["baton-runtime/kernels", "baton-runtime/os"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// ARCHITECTURE.md's crate map: its first fenced block, bottom first. A line that starts
/// with a crate's name is that crate; indented lines under it are its rooms' layers,
/// bottom first (`name/` words before the description).
struct Map {
    /// Crate name → its place, bottom first.
    crates: BTreeMap<String, usize>,
    /// Crate name → room → layer within the crate.
    rooms: BTreeMap<String, BTreeMap<String, usize>>,
}

fn map() -> Map {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let block = text
        .split("```")
        .nth(1)
        .expect("ARCHITECTURE.md has the crate map in its first fenced block");
    let mut crates = BTreeMap::new();
    let mut rooms: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let mut current = None;
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let first = line.split_whitespace().next().unwrap_or("");
        if !line.starts_with(' ') {
            if first == "baton" || first.starts_with("baton-") {
                crates.insert(first.to_string(), crates.len());
                current = Some(first.to_string());
            }
            continue;
        }
        let Some(krate) = &current else { continue };
        let layers = rooms.entry(krate.clone()).or_default();
        let layer = layers.values().max().map_or(0, |m| m + 1);
        for word in line.split_whitespace() {
            match word.strip_suffix('/') {
                Some(r) => {
                    layers.insert(r.to_string(), layer);
                }
                None => break,
            }
        }
    }
    assert!(crates.len() > 8, "the crate map was not read: {crates:?}");
    Map { crates, rooms }
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    out.push(root());
    out.sort();
    out
}

fn crate_name(dir: &Path) -> String {
    manifest(dir)["package"]["name"]
        .as_str()
        .unwrap()
        .to_string()
}

fn manifest(dir: &Path) -> toml::Value {
    let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    toml::from_str(&text).unwrap()
}

/// The baton crates a manifest depends on, as `(name, table)`: normal, build and
/// target-specific ones with `dev` false, dev-dependencies with it true.
fn baton_deps(m: &toml::Value) -> Vec<(String, bool)> {
    let mut tables = vec![
        (m.get("dependencies"), false),
        (m.get("dev-dependencies"), true),
    ];
    if let Some(targets) = m.get("target").and_then(|t| t.as_table()) {
        for t in targets.values() {
            tables.push((t.get("dependencies"), false));
            tables.push((t.get("dev-dependencies"), true));
        }
    }
    let mut out = Vec::new();
    for (table, dev) in tables {
        for name in table
            .and_then(|t| t.as_table())
            .into_iter()
            .flat_map(|t| t.keys())
        {
            if name.starts_with("baton-") {
                out.push((name.clone(), dev));
            }
        }
    }
    out
}

/// A source file that a crate compiles, with its module path and whether it is test code.
struct Source {
    path: PathBuf,
    module: Vec<String>,
    test: bool,
}

/// Every file reachable from `file` through `mod` declarations, walked as rustc walks
/// them: `mod x;` in `a/mod.rs` (or `lib.rs`) is `a/x.rs` or `a/x/mod.rs`, in `a/b.rs` it
/// is `a/b/x.rs` or `a/b/x/mod.rs`.
fn walk(file: &Path, module: Vec<String>, test: bool, out: &mut Vec<Source>) {
    let text = std::fs::read_to_string(file).unwrap();
    let name = file.file_name().unwrap().to_string_lossy();
    let dir = if name == "mod.rs" || name == "lib.rs" || name == "main.rs" {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let code = line.trim();
        let decl = code
            .strip_prefix("pub ")
            .or_else(|| code.strip_prefix("pub(crate) "))
            .or_else(|| code.strip_prefix("pub(super) "))
            .unwrap_or(code);
        let Some(m) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else {
            continue;
        };
        let under_test = attributes_above(&lines, i).any(|a| a.contains("cfg(test)"));
        let path_attr = attributes_above(&lines, i).find_map(|a| {
            a.strip_prefix("#[path = \"")
                .and_then(|r| r.strip_suffix("\"]"))
                .map(str::to_string)
        });
        let child = match path_attr {
            Some(p) => file.parent().unwrap().join(p),
            None if dir.join(format!("{m}.rs")).is_file() => dir.join(format!("{m}.rs")),
            None => dir.join(m).join("mod.rs"),
        };
        let mut module = module.clone();
        module.push(m.to_string());
        walk(&child, module, test || under_test, out);
    }
    out.push(Source {
        path: file.to_path_buf(),
        module,
        test,
    });
}

fn attributes_above<'a>(lines: &'a [&'a str], i: usize) -> impl Iterator<Item = &'a str> {
    lines[..i]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
        .filter(|l| l.starts_with("#["))
}

fn sources(crate_dir: &Path) -> Vec<Source> {
    let mut out = Vec::new();
    for top in ["src/lib.rs", "src/main.rs"] {
        let f = crate_dir.join(top);
        if f.is_file() {
            walk(&f, Vec::new(), false, &mut out);
        }
    }
    out
}

/// The production lines of a file, numbered, comments left out: an item under
/// `#[cfg(test)]` is skipped, to its closing brace or its semicolon.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim() == "#[cfg(test)]" {
            i = end_of_item(&lines, i + 1);
            continue;
        }
        if !line.trim_start().starts_with("//") {
            out.push((i + 1, line));
        }
        i += 1;
    }
    out
}

/// The index past the item that starts at `start`: its line ends with `;` before any
/// brace opens, or braces balance (outside strings and comments) after one opened.
fn end_of_item(lines: &[&str], start: usize) -> usize {
    let mut depth = 0i32;
    let mut opened = false;
    for (i, line) in lines.iter().enumerate().skip(start) {
        let code = without_strings(line.split("//").next().unwrap_or(""));
        for c in code.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return i + 1,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return i + 1;
        }
    }
    lines.len()
}

/// The top-level modules a line names: `crate::room`, or `super::room` where the
/// `super`s climb from `module` to the crate's root.
fn rooms_named(line: &str, module: &[String]) -> Vec<String> {
    let code = without_strings(line.split("//").next().unwrap_or(""));
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let starts_path = |i: usize| {
        i == 0 || !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
    };
    let mut out = Vec::new();
    for (i, m) in code.match_indices("crate::") {
        if starts_path(i) {
            out.push(ident(&code[i + m.len()..]));
        }
    }
    for (i, _) in code.match_indices("super::") {
        if !starts_path(i) {
            continue;
        }
        let mut rest = &code[i..];
        let mut climbs = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = r;
        }
        // A file's own module is one level; `super` from it names its parent.
        if climbs >= module.len() {
            out.push(ident(rest));
        }
    }
    out
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
fn the_manifests_keep_the_crate_map() {
    let map = map();
    let mut broken = Vec::new();
    let mut seen = BTreeSet::new();
    for dir in crate_dirs() {
        let name = crate_name(&dir);
        seen.insert(name.clone());
        let Some(&own) = map.crates.get(&name) else {
            broken.push(format!("{name} is not in ARCHITECTURE.md's crate map"));
            continue;
        };
        for (dep, dev) in baton_deps(&manifest(&dir)) {
            if dep == "baton-test-support" && dev {
                continue;
            }
            match map.crates.get(&dep) {
                Some(&place) if place < own || (dev && dep != "baton-lab") => {}
                Some(_) => broken.push(format!("{name} depends on {dep}, listed above it")),
                None => broken.push(format!("{name} depends on {dep}, not in the map")),
            }
            if name == "baton-tui" && dep != "baton-protocol" {
                broken.push(format!(
                    "baton-tui depends on {dep}: the screen knows only the protocol"
                ));
            }
            if dep == "baton-lab" && name != "baton" {
                broken.push(format!("{name} depends on the lab"));
            }
        }
    }
    for listed in map.crates.keys() {
        if !seen.contains(listed) {
            broken.push(format!("ARCHITECTURE.md lists {listed}, which is no crate"));
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn inside_a_crate_every_room_keeps_to_its_layer() {
    let map = map();
    let mut broken = Vec::new();
    for dir in crate_dirs() {
        let name = crate_name(&dir);
        let Some(layers) = map.rooms.get(&name) else {
            continue;
        };
        for src in sources(&dir) {
            if src.test || src.module.is_empty() {
                continue;
            }
            let room = &src.module[0];
            let Some(&own) = layers.get(room) else {
                broken.push(format!(
                    "{}: room `{room}` is not in the map",
                    src.path.display()
                ));
                continue;
            };
            let text = std::fs::read_to_string(&src.path).unwrap();
            for (n, line) in code_lines(&text) {
                for named in rooms_named(line, &src.module) {
                    match layers.get(&named) {
                        Some(&layer) if layer <= own => {}
                        Some(_) => broken.push(format!(
                            "{}:{n}: `{room}` imports `{named}`, a layer above it",
                            src.path.display()
                        )),
                        None => {}
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

#[test]
fn unsafe_lives_only_where_the_map_says() {
    let mut found = Vec::new();
    let mut read = 0;
    for dir in crate_dirs() {
        let name = crate_name(&dir);
        for src in sources(&dir) {
            let room = src.module.first().map_or("", String::as_str);
            if src.test || UNSAFE_ROOMS.contains(&format!("{name}/{room}").as_str()) {
                continue;
            }
            read += 1;
            let text = std::fs::read_to_string(&src.path).unwrap();
            for (n, line) in code_lines(&text) {
                let code = without_strings(line.split("//").next().unwrap_or(""));
                let mut words = code.split(|c: char| !(c.is_alphanumeric() || c == '_'));
                if words.any(|w| w == "unsafe") {
                    found.push(format!("{}:{n}: {}", src.path.display(), line.trim()));
                }
            }
        }
    }
    assert!(read > 200, "only {read} files were read");
    assert!(
        found.is_empty(),
        "unsafe outside {UNSAFE_ROOMS:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_are_for() {
    let at = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // An import named in code counts, one in a comment or another crate's path does not.
    assert_eq!(
        rooms_named("use crate::model::X;", &at(&["text"])),
        ["model"]
    );
    assert!(rooms_named("let a = 1; // see crate::model", &at(&["text"])).is_empty());
    assert!(rooms_named("use baton_runtime::model;", &at(&["text"])).is_empty());
    // `super` names a room only where it climbs to the crate's root.
    assert_eq!(
        rooms_named("use super::model::X;", &at(&["text"])),
        ["model"]
    );
    assert_eq!(
        rooms_named("use super::super::mapper::Y;", &at(&["gate", "a"])),
        ["mapper"]
    );
    assert!(rooms_named("use super::Z;", &at(&["gate", "a"])).is_empty());
    // Only what is under `cfg(test)` is left out, and only to its end.
    let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::c;\n}\nuse crate::d;\n#[cfg(test)]\nmod more;\nunsafe fn e() {}\n";
    let kept: Vec<&str> = code_lines(text).into_iter().map(|(_, l)| l).collect();
    assert_eq!(kept, ["use crate::a;", "use crate::d;", "unsafe fn e() {}"]);
    assert_eq!(
        without_strings(r#"f("unsafe \" x"); unsafe {"#),
        "f(); unsafe {"
    );
    // An out-of-line test module's file is test code, and the rest of its parent is not.
    let runtime = root().join("crates/baton-runtime");
    let all = sources(&runtime);
    let file = |p: &str| all.iter().find(|s| s.path.ends_with(p)).unwrap();
    assert!(file("kernels/int8/tests.rs").test);
    assert!(!file("kernels/int8/mod.rs").test);
    assert_eq!(
        file("model/attention/fused.rs").module,
        ["model", "attention", "fused"]
    );
    let map = map();
    assert!(map.crates["baton-protocol"] < map.crates["baton-engine"]);
    assert_eq!(
        map.rooms["baton-method"]["mapper"], map.rooms["baton-method"]["gate"],
        "one line, one layer"
    );
}

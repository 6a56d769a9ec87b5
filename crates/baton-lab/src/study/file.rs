//! The study file: which scripted conversations to run, between which models, under
//! which named settings, how many times.
//!
//! ```toml
//! name = "facts-drift"
//! scripts = ["conversations/"]           # files or directories of .toml scripts
//! pairs = [["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]]   # default: this pair
//! directions = ["source-to-target", "target-to-source"]  # default: both
//! repeats = 2                            # default 1
//!
//! [variants.map]                         # at least one; each key optional
//! learn = false
//!
//! [variants.reread]
//! reread = "20%"
//! tail = 32
//! mapper_dir = "mappers-v2"              # relative to the study file
//! ```
//!
//! Expected answers live in the scripts, on the user step they answer
//! (`expect = ["48,000", "48000 dollars"]`).

use super::StudyError;
use baton_engine::headless::Script;
use baton_method::handoff::reread::RereadSetting;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const DEFAULT_PAIR: [&str; 2] = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"];

/// Which model of a pair starts the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// The pair's first model starts, the second answers after the first switch.
    SourceToTarget,
    TargetToSource,
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Direction::SourceToTarget => "source-to-target",
            Direction::TargetToSource => "target-to-source",
        })
    }
}

impl Direction {
    /// The pair in the order the conversation uses it.
    pub fn order(self, pair: &[String; 2]) -> [&str; 2] {
        match self {
            Direction::SourceToTarget => [&pair[0], &pair[1]],
            Direction::TargetToSource => [&pair[1], &pair[0]],
        }
    }
}

/// One named setting to compare; what it leaves out is the scripts' and baton's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reread: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<usize>,
    /// `false`: the scripts' switches are left out, so the conversation's first model
    /// answers every turn: the source-alone baseline the gap recovered is measured from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<bool>,
}

impl Variant {
    /// Whether this variant leaves the switches out (the source-alone baseline).
    pub fn stays(&self) -> bool {
        self.switch == Some(false)
    }
}

const VARIANT_KEYS: &str = "mapper_dir, reread, learn, tail, switch";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStudy {
    name: Option<String>,
    scripts: Vec<PathBuf>,
    pairs: Option<Vec<[String; 2]>>,
    directions: Option<Vec<Direction>>,
    repeats: Option<u32>,
    #[serde(default)]
    variants: BTreeMap<String, toml::Value>,
}

/// A scripted conversation of the study, parsed.
#[derive(Debug, Clone)]
pub struct StudyScript {
    /// Its path as the manifest names it: relative to the study file where it can be.
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub script: Script,
}

/// A study file, checked: every script parses, every variant key is known, every
/// re-read setting reads.
#[derive(Debug, Clone)]
pub struct Study {
    pub name: String,
    /// sha256 of the study file's text: what a directory of results belongs to.
    pub sha256: String,
    pub scripts: Vec<StudyScript>,
    pub pairs: Vec<[String; 2]>,
    pub directions: Vec<Direction>,
    pub repeats: u32,
    pub variants: BTreeMap<String, Variant>,
    /// The mappers directory of the variants that name none: the running command's
    /// (`--mapper-dir`, `BATON_MAPPER_DIR`), not the file's, so it is no part of the
    /// study's identity; `None`, the cache dir's.
    pub mapper_dir: Option<PathBuf>,
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

impl Study {
    pub fn load(path: &Path) -> Result<Self, StudyError> {
        let text = std::fs::read_to_string(path).map_err(|e| StudyError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, path, base)
    }

    /// `text` of the study file at `path`; relative paths in it are taken from `base`.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Self, StudyError> {
        let bad = |reason: String| StudyError::File {
            path: path.to_path_buf(),
            reason,
        };
        let raw: RawStudy = toml::from_str(text).map_err(|e| bad(e.message().to_string()))?;
        if raw.variants.is_empty() {
            return Err(bad(
                "no [variants.NAME] table: name at least one setting to run (an empty \
                 `[variants.default]` runs baton's defaults)"
                    .into(),
            ));
        }
        let mut variants: BTreeMap<String, Variant> = BTreeMap::new();
        for (name, value) in raw.variants {
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(format!(
                    "variant name {name:?}: use letters, digits, - and _ (it names files)"
                )));
            }
            let mut v: Variant = value.try_into().map_err(|e: toml::de::Error| {
                bad(format!(
                    "[variants.{name}]: {}; a variant takes {VARIANT_KEYS}",
                    e.message()
                ))
            })?;
            if let Some(r) = &v.reread {
                RereadSetting::parse(r)
                    .map_err(|e| bad(format!("[variants.{name}] reread: {e}")))?;
            }
            if let Some(d) = &v.mapper_dir {
                v.mapper_dir = Some(base.join(d));
            }
            if v.stays() {
                // mapper_dir stays allowed: the engine loads the pair's mappers to start.
                if v.reread.is_some() || v.learn.is_some() || v.tail.is_some() {
                    return Err(bad(format!(
                        "[variants.{name}] has switch = false, so nothing is handed over and \
                         its reread, learn and tail would do nothing: leave them out"
                    )));
                }
                if let Some((other, _)) = variants.iter().find(|(_, o)| o.stays()) {
                    return Err(bad(format!(
                        "[variants.{name}] and [variants.{other}] both have switch = false and \
                         would run the same conversations: keep one"
                    )));
                }
            }
            variants.insert(name, v);
        }
        let scripts = read_scripts(&raw.scripts, base).map_err(|e| match e {
            StudyError::File { reason, .. } => bad(reason),
            other => other,
        })?;
        let pairs = raw
            .pairs
            .unwrap_or_else(|| vec![DEFAULT_PAIR.map(String::from)]);
        if pairs.is_empty() {
            return Err(bad(
                "`pairs` is empty: name at least one pair of models".into()
            ));
        }
        let directions = raw
            .directions
            .unwrap_or_else(|| vec![Direction::SourceToTarget, Direction::TargetToSource]);
        if directions.is_empty() {
            return Err(bad(
                "`directions` is empty: give source-to-target, target-to-source or both".into(),
            ));
        }
        let repeats = raw.repeats.unwrap_or(1);
        if repeats == 0 {
            return Err(bad("`repeats = 0` runs nothing: give 1 or more".into()));
        }
        let name = raw.name.unwrap_or_else(|| {
            path.file_stem()
                .map_or("study".into(), |s| s.to_string_lossy().into_owned())
        });
        Ok(Self {
            name,
            sha256: sha256(text.as_bytes()),
            scripts,
            pairs,
            directions,
            repeats,
            variants,
            mapper_dir: None,
        })
    }
}

/// The scripts named: files as given, directories' .toml files in sorted order, each
/// parsed (a script that does not parse is named with its reason).
fn read_scripts(named: &[PathBuf], base: &Path) -> Result<Vec<StudyScript>, StudyError> {
    let mut files = Vec::new();
    for p in named {
        let full = base.join(p);
        if full.is_dir() {
            let rd = std::fs::read_dir(&full).map_err(|e| StudyError::Io {
                path: full.clone(),
                source: e,
            })?;
            let mut found: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(full);
        }
    }
    if files.is_empty() {
        return Err(StudyError::File {
            path: base.to_path_buf(),
            reason:
                "`scripts` names no .toml script: give script files or directories holding them"
                    .into(),
        });
    }
    let mut out: Vec<StudyScript> = Vec::with_capacity(files.len());
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| StudyError::Io {
            path: path.clone(),
            source: e,
        })?;
        let name = path
            .strip_prefix(base)
            .unwrap_or(&path)
            .with_extension("")
            .to_string_lossy()
            .replace('\\', "/");
        let script = Script::parse(&text, &path.display().to_string())?;
        if out.iter().any(|s| s.name == name) {
            continue;
        }
        out.push(StudyScript {
            name,
            sha256: sha256(text.as_bytes()),
            path,
            script,
        });
    }
    Ok(out)
}

//! `baton mappers`: the mapper artifacts in the cache dir, with what their saved
//! statistics hold and what they learned from conversations, as lines for people or one
//! versioned JSON document.
//!
//! ```text
//! {format: "baton.mappers", version, mappers: [{path, meta?, error?,
//!  stats?: null | StatsMeta | {error}, learned?: null | LearnedMeta | {error},
//!  residual_layers?: [target layer, ...]}]}
//! ```
//!
//! An entry has `meta` (then `stats` and `learned`) or, when the artifact cannot be read,
//! `error`. `stats` and `learned` are null when nothing is saved.

use baton_method::calibrate::saved_stats::{self, StatsMeta};
use baton_method::learn::store::{self, LearnedMeta};
use baton_method::learn::LearnError;
use baton_method::mapper::artifact::MapperMeta;
use baton_method::mapper::dir::{DirError, MapperDir};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

pub const FORMAT: &str = "baton.mappers";
/// 1: the first versioned document (before it, a bare array of the entries).
pub const VERSION: u32 = 1;

/// The `baton mappers --json` document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MapperListing {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] of this baton.
    pub version: u32,
    /// Newest first.
    pub mappers: Vec<ListedMapper>,
}

/// One artifact: its metadata and what is saved beside it, or why it could not be read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListedMapper {
    pub path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<MapperMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The calibration's saved statistics (with `meta` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Saved<StatsMeta>>,
    /// What the mapper learned from conversations (with `meta` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<Saved<LearnedMeta>>,
    /// The target layers whose residual maps are kept for this direction (a plan's
    /// `upper=M`); absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub residual_layers: Vec<usize>,
}

/// A description saved beside an artifact: absent (null), read, or unreadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Saved<T> {
    Unreadable { error: String },
    Read(Option<T>),
}

impl<T> Saved<T> {
    fn of<E: fmt::Display>(r: Result<Option<T>, E>) -> Self {
        match r {
            Ok(v) => Self::Read(v),
            Err(e) => Self::Unreadable {
                error: e.to_string(),
            },
        }
    }
}

impl MapperListing {
    /// Every artifact in the mappers directory `dir`, newest first, with what is saved
    /// beside it (read from the descriptions only); what was learned counts the steps of
    /// each mapper itself.
    pub fn read(dir: &MapperDir) -> Result<Self, DirError> {
        let mappers = dir
            .list()?
            .into_iter()
            .map(|l| (l.path, l.meta))
            .map(|(path, m)| match m {
                Ok(m) => {
                    let files = dir.pair(&m.source, &m.target);
                    let stats = saved_stats::read_meta(&files.stats());
                    let learned = store::read_meta(&files, Some(&m));
                    ListedMapper {
                        stats: Some(Saved::of(stats)),
                        learned: Some(Saved::of(learned)),
                        residual_layers: files.residual_layers(),
                        meta: Some(m),
                        error: None,
                        path,
                    }
                }
                Err(e) => ListedMapper {
                    path,
                    meta: None,
                    error: Some(e.to_string()),
                    stats: None,
                    learned: None,
                    residual_layers: Vec::new(),
                },
            })
            .collect();
        Ok(Self {
            format: FORMAT.into(),
            version: VERSION,
            mappers,
        })
    }
}

/// What `baton mappers` prints: a line per artifact, with its statistics and learning
/// indented below it.
impl fmt::Display for MapperListing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.mappers.is_empty() {
            writeln!(f, "no mappers yet: run `baton calibrate` (default pair: qwen2.5-coder-0.5b and qwen2.5-coder-1.5b)")?;
        }
        for l in &self.mappers {
            let Some(m) = &l.meta else {
                writeln!(f, "unreadable: {}", l.error.as_deref().unwrap_or_default())?;
                continue;
            };
            writeln!(f, "{}", m.list_line(&l.path))?;
            match &l.stats {
                Some(Saved::Read(Some(s))) => writeln!(f, "    {}", s.summary())?,
                Some(Saved::Unreadable { error }) => writeln!(f, "    {error}")?,
                _ => {}
            }
            match &l.learned {
                Some(Saved::Read(Some(s))) => writeln!(f, "    {}", s.summary())?,
                Some(Saved::Unreadable { error }) => writeln!(f, "    {error}")?,
                _ => {}
            }
            if !l.residual_layers.is_empty() {
                let layers: Vec<String> = l.residual_layers.iter().map(|m| m.to_string()).collect();
                let noun = if layers.len() == 1 { "layer" } else { "layers" };
                writeln!(
                    f,
                    "    residual maps to target {noun} {} (a plan's upper=M)",
                    layers.join(", ")
                )?;
            }
        }
        Ok(())
    }
}

/// Forget what every mapper in the mappers directory `dir` learned from conversations,
/// returning each to its calibration; `on_reset` is told each direction that had learned
/// something, as it is reset. How many were.
pub fn reset_learned(dir: &MapperDir, on_reset: &mut dyn FnMut(&str)) -> Result<usize, LearnError> {
    let mut forgot = 0;
    for l in dir.list()? {
        if let Ok(m) = l.meta {
            if store::reset(dir, &dir.pair(&m.source, &m.target))? {
                on_reset(&m.direction);
                forgot += 1;
            }
        }
    }
    Ok(forgot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_cache_says_how_to_get_a_mapper() {
        let dir = tempfile::tempdir().unwrap();
        let mappers = MapperDir::named(dir.path().join("mappers"));
        let l = MapperListing::read(&mappers).unwrap();
        assert!(l.mappers.is_empty());
        assert!(l.to_string().starts_with("no mappers yet"), "{l}");
        assert_eq!(reset_learned(&mappers, &mut |_| {}).unwrap(), 0);
    }

    #[test]
    fn the_document_names_its_format_and_version_and_an_unreadable_artifact_says_why() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.safetensors"), b"not one").unwrap();
        let l = MapperListing::read(&MapperDir::named(dir.path())).unwrap();
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(v["format"], "baton.mappers");
        assert_eq!(v["version"], 1);
        let entry = &v["mappers"][0];
        assert!(entry["path"].as_str().unwrap().ends_with("bad.safetensors"));
        assert!(entry["error"].is_string(), "{entry}");
        assert!(entry.get("meta").is_none() && entry.get("stats").is_none());
        let text = l.to_string();
        assert!(text.starts_with("unreadable: "), "{text}");
        let back: MapperListing = serde_json::from_value(v).unwrap();
        assert_eq!(back.mappers[0].error, l.mappers[0].error);
    }

    #[test]
    fn saved_descriptions_read_back_as_absent_read_or_unreadable() {
        let none: Saved<u32> = serde_json::from_str("null").unwrap();
        assert_eq!(none, Saved::Read(None));
        let some: Saved<u32> = serde_json::from_str("3").unwrap();
        assert_eq!(some, Saved::Read(Some(3)));
        let bad: Saved<u32> = serde_json::from_str(r#"{"error": "cut"}"#).unwrap();
        assert_eq!(
            bad,
            Saved::Unreadable {
                error: "cut".into()
            }
        );
        assert_eq!(
            serde_json::to_value(Saved::<u32>::Unreadable { error: "x".into() }).unwrap(),
            serde_json::json!({"error": "x"})
        );
    }
}

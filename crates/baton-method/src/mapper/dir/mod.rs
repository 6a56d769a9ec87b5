//! The mapper directory, owned by one type. Everything kept about mappers lives in one
//! directory, and [`MapperDir`] is the only code that knows its layout:
//!
//! ```text
//! <dir>/<pair>.safetensors          the artifact (maps and metadata)
//! <dir>/<pair>.json                 its readable copy
//! <dir>/stats/<pair>/               the calibration's statistics
//! <dir>/learned/<pair>/shards/      what the mapper learned, one shard per update
//! <dir>/learned/<pair>/windows/     which calibration windows a mapper has read
//! <dir>/gate/<pair>.json            the gate's fitted line
//! <dir>/residual/<pair>.layer-M.safetensors  the residual map to the target's layer M
//! <dir>/poor/                       mappers worse than no context, kept apart
//! <dir>/.staging-*/                 a write in progress (see [`staging`])
//! ```
//!
//! `<pair>` names both models and the start of both checksums. Where it is comes from
//! the flag or `BATON_MAPPER_DIR` (then it was named, and a fix says `--mapper-dir`), or
//! is `mappers/` in the cache dir. Every write into it goes through [`staging`]: written
//! aside, then renamed into place under the directory's lock, so a write that fails
//! leaves the previous state.

mod lookup;
pub mod staging;
mod windows;

use super::artifact::{self, ArtifactError, MapperMeta, ModelRef};
use std::path::{Path, PathBuf};

pub use staging::Staging;
pub use windows::WindowClaim;

/// A mapper directory: where it is, and whether the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapperDir {
    path: PathBuf,
    named: bool,
}

/// Why something could not be kept in, or read from, a mapper directory.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot write in the mappers directory {path}: {reason}; {fix}")]
    NotWritable {
        path: PathBuf,
        reason: String,
        fix: String,
    },
    #[error("the mappers directory {path} cannot be read: {reason}; {fix}")]
    NotReadable {
        path: PathBuf,
        reason: String,
        fix: String,
    },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

impl MapperDir {
    /// The directory configured (a flag or `BATON_MAPPER_DIR`), or the default one.
    pub fn resolve(configured: Option<&Path>) -> Self {
        match configured {
            Some(p) => Self::named(p),
            None => Self::default_location(),
        }
    }

    /// A directory the user named.
    pub fn named(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            named: true,
        }
    }

    /// `mappers/` in the cache dir.
    pub fn default_location() -> Self {
        Self {
            path: baton_fetch::cache_root().join("mappers"),
            named: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory as the user named it, for a fix that must name it too; `None` for
    /// the default one.
    pub fn as_named(&self) -> Option<&Path> {
        self.named.then_some(self.path.as_path())
    }

    /// `e`, met writing in this directory, as the error that names it and the fix.
    fn not_writable(&self, e: std::io::Error) -> DirError {
        DirError::NotWritable {
            path: self.path.clone(),
            reason: e.to_string(),
            fix: self.fix(),
        }
    }

    /// What a fix tells the user to do about this directory.
    fn fix(&self) -> String {
        if self.named {
            "name a writable directory with --mapper-dir (or BATON_MAPPER_DIR)".into()
        } else {
            "make it writable, or name a writable directory with --mapper-dir".into()
        }
    }

    /// Everything kept about the mapper from `source` to `target`.
    pub fn pair(&self, source: &ModelRef, target: &ModelRef) -> PairFiles {
        PairFiles {
            dir: self.path.clone(),
            stem: pair_stem(source, target),
        }
    }

    /// Mappers worse than no context, kept apart: a mapper directory of its own.
    pub fn poor(&self) -> MapperDir {
        Self {
            path: self.path.join("poor"),
            named: self.named,
        }
    }

    /// Whether what is learned or calibrated can be kept here: the directory is made if
    /// missing and a file is written and removed in it.
    pub fn check_writable(&self) -> Result<(), DirError> {
        let not = |e| self.not_writable(e);
        std::fs::create_dir_all(&self.path).map_err(not)?;
        let probe = self
            .path
            .join(format!(".baton-write-check-{}", std::process::id()));
        std::fs::write(&probe, b"").map_err(not)?;
        let _ = std::fs::remove_file(&probe);
        Ok(())
    }

    /// Every artifact in the directory, newest first; an artifact that cannot be read
    /// is listed with its error, not skipped. A directory that does not exist holds no
    /// mapper yet; one that exists and cannot be read (or is a file) is an error.
    pub fn list(&self) -> Result<Vec<Listed>, DirError> {
        let rd = match std::fs::read_dir(&self.path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(DirError::NotReadable {
                    path: self.path.clone(),
                    reason: e.to_string(),
                    fix: if self.named {
                        "name a mappers directory with --mapper-dir (or BATON_MAPPER_DIR)".into()
                    } else {
                        "check BATON_CACHE_DIR names a directory".into()
                    },
                })
            }
        };
        let mut out: Vec<Listed> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == ARTIFACT_EXT))
            .map(|p| {
                let meta = artifact::load_meta(&p);
                Listed { path: p, meta }
            })
            .collect();
        out.sort_by_key(|l| {
            std::cmp::Reverse(l.meta.as_ref().map(|m| m.created_unix).unwrap_or(0))
        });
        Ok(out)
    }

    /// A fresh staging directory in this one, for a write that is put in place whole.
    pub fn stage(&self) -> Result<Staging, DirError> {
        Staging::new(self)
    }

    /// Removes what writers that died left: in the directory, and in every pair's
    /// shards folder (where earlier versions wrote).
    pub fn clear_leftovers(&self) {
        staging::remove_leftovers(&self.path);
        let Ok(learned) = std::fs::read_dir(self.path.join(LEARNED)) else {
            return;
        };
        for pair in learned.flatten() {
            staging::remove_leftovers(&pair.path().join(SHARDS));
        }
    }
}

const LEARNED: &str = "learned";
const SHARDS: &str = "shards";

/// One artifact of a listing.
pub struct Listed {
    pub path: PathBuf,
    pub meta: Result<MapperMeta, ArtifactError>,
}

const ARTIFACT_EXT: &str = "safetensors";
/// The residual maps' folder.
const RESIDUAL: &str = "residual";

/// What is kept about one pair of models in a mapper directory.
#[derive(Debug, Clone)]
pub struct PairFiles {
    dir: PathBuf,
    stem: String,
}

impl PairFiles {
    /// The artifact: maps and metadata.
    pub fn artifact(&self) -> PathBuf {
        self.dir.join(format!("{}.{ARTIFACT_EXT}", self.stem))
    }

    /// The artifact's metadata as readable JSON, beside it.
    pub fn readable(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.stem))
    }

    /// The calibration's statistics.
    pub fn stats(&self) -> PathBuf {
        self.dir.join("stats").join(&self.stem)
    }

    /// What the mapper learned: the legacy base of statistics and the shards' folder.
    pub fn learned(&self) -> PathBuf {
        self.dir.join(LEARNED).join(&self.stem)
    }

    /// The shards of what was learned, one per update.
    pub fn shards(&self) -> PathBuf {
        self.learned().join(SHARDS)
    }

    /// One shard, by its name.
    pub fn shard(&self, name: &str) -> PathBuf {
        self.shards().join(format!("{name}.{ARTIFACT_EXT}"))
    }

    /// The claims on calibration windows read in the background.
    pub fn windows(&self) -> PathBuf {
        self.learned().join("windows")
    }

    /// The gate's fitted line.
    pub fn gate(&self) -> PathBuf {
        self.dir.join("gate").join(format!("{}.json", self.stem))
    }

    /// The residual map to the target's layer `target_layer` (a plan's upper layers).
    pub fn residual(&self, target_layer: usize) -> PathBuf {
        self.dir
            .join(RESIDUAL)
            .join(format!("{}.layer-{target_layer}.{ARTIFACT_EXT}", self.stem))
    }

    /// The target layers whose residual maps are kept for this pair, in order (none
    /// where the folder cannot be read).
    pub fn residual_layers(&self) -> Vec<usize> {
        let prefix = format!("{}.layer-", self.stem);
        let suffix = format!(".{ARTIFACT_EXT}");
        let Ok(entries) = std::fs::read_dir(self.dir.join(RESIDUAL)) else {
            return Vec::new();
        };
        let mut layers: Vec<usize> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_prefix(&prefix)?
                    .strip_suffix(&suffix)?
                    .parse()
                    .ok()
            })
            .collect();
        layers.sort_unstable();
        layers
    }
}

/// Both models' names and the start of both checksums: one file name per pair, whatever
/// the characters of the names.
fn pair_stem(source: &ModelRef, target: &ModelRef) -> String {
    let short = |s: &str| s.chars().take(12).collect::<String>();
    format!(
        "{}__to__{}.{}-{}",
        sanitize(&source.name),
        sanitize(&target.name),
        short(&source.sha256),
        short(&target.sha256)
    )
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A model reference for tests of files named by pair.
    pub(crate) fn model(name: &str, sha: &str) -> ModelRef {
        ModelRef {
            name: name.into(),
            sha256: sha.into(),
            architecture: "qwen2".into(),
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            tokenizer_fingerprint: "t".into(),
        }
    }

    #[test]
    fn the_residual_maps_kept_for_a_pair_are_its_own_and_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = MapperDir::named(tmp.path());
        let (a, b) = (model("a", "aa"), model("b", "bb"));
        let pair = dir.pair(&a, &b);
        assert!(pair.residual_layers().is_empty(), "no folder yet");
        std::fs::create_dir_all(pair.residual(0).parent().unwrap()).unwrap();
        for path in [
            pair.residual(21),
            pair.residual(7),
            dir.pair(&b, &a).residual(14),
        ] {
            std::fs::write(path, b"x").unwrap();
        }
        std::fs::write(pair.residual(3).with_extension("tmp"), b"x").unwrap();
        assert_eq!(pair.residual_layers(), vec![7, 21]);
        assert_eq!(dir.pair(&b, &a).residual_layers(), vec![14]);
    }

    #[test]
    fn a_models_name_never_leads_out_of_the_directory() {
        let d = MapperDir::named("/m");
        let p = d.pair(&model("../../etc/x", "abc"), &model("a/b", "def"));
        for path in [p.artifact(), p.stats(), p.learned(), p.gate(), p.shard("n")] {
            assert!(path.starts_with("/m"), "{}", path.display());
            assert!(
                !path
                    .components()
                    .any(|c| c == std::path::Component::ParentDir),
                "{}",
                path.display()
            );
        }
        assert_eq!(
            p.artifact(),
            Path::new("/m/.._.._etc_x__to__a_b.abc-def.safetensors")
        );
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_an_error_not_an_empty_listing() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = MapperDir::named(&file).list().err().unwrap().to_string();
        assert!(
            err.contains("cannot be read") && err.contains("--mapper-dir"),
            "{err}"
        );
        assert!(MapperDir::named(tmp.path().join("missing"))
            .list()
            .unwrap()
            .is_empty());
    }
}

//! Mapper artifacts: one safetensors file per direction holding every target layer's K and
//! V maps, with the JSON metadata (identities, selection, λ, corpus, calibration report)
//! inside the file's header so weights and their description can never be separated.
//! A readable copy of the metadata is written next to it. Files are keyed by the two
//! models' checksums and written to a temp file, then renamed into place.

use super::calibration_report::CalibrationReport;
use super::nonlinear::{stored, Heads, MapperKind, TrainingReport};
use super::ridge::Factors;
use super::ridge::{FitInfo, LayerMap};
use super::SourceScales;
use baton_runtime::model::{ModelConfig, ModelIdentity};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod layout;
mod write;

pub use write::{save, Maps};

pub const FORMAT: &str = "baton.mapper";
/// Version 2 added trained heads and the mapper's kind; version 1 files (ridge maps
/// alone) still load.
pub const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a usable mapper artifact: {reason}")]
    Bad { path: PathBuf, reason: String },
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
    /// No mapper can join these two: calibrating them would be refused too.
    #[error("{source_name} and {target} use different tokenizers, so no mapper can hand a cache from one to the other (the token ids differ): pick two models of the same family")]
    TokenizersDiffer { source_name: String, target: String },
    #[error("no mapper from {source_name} to {target}{}: run `baton calibrate --source {source_name} --target {target}{}` first", in_dir(dir), dir_flag(dir))]
    Missing {
        source_name: String,
        target: String,
        /// The mappers directory the user named, which the fix must name too.
        dir: Option<PathBuf>,
    },
    #[error("mapper {path} does not fit the models: {source}")]
    Apply {
        path: PathBuf,
        source: Box<baton_runtime::model::ModelError>,
    },
}

fn in_dir(dir: &Option<PathBuf>) -> String {
    dir.as_ref()
        .map(|d| format!(" in {}", d.display()))
        .unwrap_or_default()
}

fn dir_flag(dir: &Option<PathBuf>) -> String {
    dir.as_ref()
        .map(|d| format!(" --mapper-dir {}", d.display()))
        .unwrap_or_default()
}

impl MapperArtifact {
    /// The maps as tensors on the target's device, ready to apply.
    pub fn cache_mapper(
        &self,
        s: &baton_runtime::model::Model,
        t: &baton_runtime::model::Model,
    ) -> Result<super::CacheMapper, ArtifactError> {
        super::CacheMapper::from_layer_maps(
            s,
            t,
            &self.keys,
            &self.values,
            self.source_scales.as_ref(),
        )
        .and_then(|m| match &self.heads {
            Some(h) => m.with_heads(h),
            None => Ok(m),
        })
        .map_err(|e| ArtifactError::Apply {
            path: self.path.clone(),
            source: Box::new(e),
        })
    }
}

/// An artifact applied to models it was not made for.
#[derive(Debug, thiserror::Error)]
#[error("mapper {path} was made for {what} {expected}, but the loaded {what} is {found}: calibrate this pair with `baton calibrate --source {src} --target {tgt}`")]
pub struct Mismatch {
    pub path: PathBuf,
    pub what: &'static str,
    pub expected: String,
    pub found: String,
    pub src: String,
    pub tgt: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelRef {
    pub name: String,
    pub sha256: String,
    pub architecture: String,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub tokenizer_fingerprint: String,
}

impl ModelRef {
    pub fn new(id: &ModelIdentity, cfg: &ModelConfig) -> Self {
        Self {
            name: id.name.clone(),
            sha256: id.sha256.clone(),
            architecture: cfg.arch.name().to_string(),
            layers: cfg.n_layer,
            kv_heads: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            tokenizer_fingerprint: id.tokenizer_fingerprint.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CorpusInfo {
    pub files: String,
    pub fingerprint: String,
    pub sequences: usize,
    pub seq_len: usize,
    pub observations: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MapperMeta {
    pub format: String,
    pub version: u32,
    pub direction: String,
    pub source: ModelRef,
    pub target: ModelRef,
    pub k: usize,
    pub lambda: f64,
    pub standardize: bool,
    /// The reduced mapper's rank; absent for the full ridge mapper.
    #[serde(default)]
    pub rank: Option<usize>,
    /// Per target layer, the source layers its keys / values are predicted from.
    pub key_sources: Vec<Vec<usize>>,
    pub value_sources: Vec<Vec<usize>>,
    /// Whether the maps also read the target's own layer 0 of the tokens: source layers
    /// from the source's layer count on are then pieces of that block
    /// ([`crate::mapper::token_block`]).
    #[serde(default)]
    pub token_features: bool,
    /// Ridge alone, or with trained heads (absent in version 1: ridge).
    #[serde(default)]
    pub kind: MapperKind,
    /// How the heads were trained and what they scored, for a trained kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingReport>,
    pub corpus: CorpusInfo,
    pub report: CalibrationReport,
    pub created_unix: u64,
    pub baton_version: String,
    /// Which calibration made this mapper, unique to it: what it learns is bound to it
    /// ([`Self::identity`]). Absent before learned steps were bound to their mapper.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
}

impl MapperMeta {
    /// What tells this mapper from any other of the same pair: its id, or for a mapper
    /// written before ids, the second it was made.
    pub fn identity(&self) -> String {
        if self.id.is_empty() {
            format!("created-{}", self.created_unix)
        } else {
            self.id.clone()
        }
    }

    /// What calibration chose and how it scored on held-out text, in one line.
    pub fn summary_line(&self) -> String {
        let r = &self.report;
        format!(
            "{}: {} mapper, k = {}{}, lambda = {}, held-out attention cosine {:.4}, R² K {:.3} V {:.3}{}",
            self.direction,
            self.kind,
            self.k,
            if self.token_features {
                " + token features"
            } else {
                ""
            },
            self.lambda,
            crate::metrics::mean(&r.cosine),
            crate::metrics::mean(&r.r2_k),
            crate::metrics::mean(&r.r2_v),
            self.training.as_ref().map_or(String::new(), |t| format!("; {}", t.summary()))
        )
    }

    /// One row of `baton mappers`: the direction, its choice, its corpus and its file.
    pub fn list_line(&self, path: &Path) -> String {
        format!(
            "{:<45} {:<8} k={:<3}{} lambda={:<6} cosine {:.4}  {} x {} tokens  {}",
            self.direction,
            self.kind.name(),
            self.k,
            if self.token_features { " +tokens" } else { "" },
            self.lambda,
            crate::metrics::mean(&self.report.cosine),
            self.corpus.sequences,
            self.corpus.seq_len,
            path.display()
        )
    }
}

/// A loaded artifact: metadata plus the maps, in the ridge module's plain form.
pub struct MapperArtifact {
    pub path: PathBuf,
    pub meta: MapperMeta,
    pub keys: Vec<LayerMap>,
    pub values: Vec<LayerMap>,
    /// Absent in artifacts written before the int8 map; such a mapper runs in f32.
    pub source_scales: Option<SourceScales>,
    /// The trained heads of a residual or mlp mapper.
    pub heads: Option<Heads>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_meta(path: &Path, bytes: &[u8]) -> Result<MapperMeta, ArtifactError> {
    let bad = |reason: String| ArtifactError::Bad {
        path: path.to_path_buf(),
        reason,
    };
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| {
        bad(format!(
            "the file is corrupt or cut short ({e}); delete it and run `baton calibrate` again"
        ))
    })?;
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("baton"))
        .ok_or_else(|| bad("no baton metadata in the header".into()))?;
    let meta: MapperMeta = serde_json::from_str(json).map_err(|e| bad(format!("metadata: {e}")))?;
    if meta.format != FORMAT {
        return Err(bad(format!("format `{}` is not `{FORMAT}`", meta.format)));
    }
    if meta.version == 0 || meta.version > VERSION {
        return Err(bad(format!(
            "format version {} is not supported (this build reads {VERSION}); calibrate again",
            meta.version
        )));
    }
    Ok(meta)
}

/// Only the metadata (for listings).
pub fn load_meta(path: &Path) -> Result<MapperMeta, ArtifactError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    read_meta(path, &bytes)
}

pub fn load(path: &Path) -> Result<MapperArtifact, ArtifactError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let meta = read_meta(path, &bytes)?;
    let bad = |reason: String| ArtifactError::Bad {
        path: path.to_path_buf(),
        reason,
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| {
        bad(format!(
            "the file is corrupt or cut short ({e}); delete it and run `baton calibrate` again"
        ))
    })?;
    // Every tensor present and shaped as the metadata says before any is read: the
    // reads below take shapes from element counts.
    layout::check(&meta, &st).map_err(bad)?;
    let read = |name: &str| -> Result<Vec<f32>, ArtifactError> {
        let t = st.tensor(name).map_err(|e| bad(format!("{name}: {e}")))?;
        if t.dtype() != Dtype::F32 {
            return Err(bad(format!("{name} is {:?}, not F32", t.dtype())));
        }
        let v: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // A map with NaN or Inf in it maps every cache to garbage without a word.
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(bad(format!(
                "tensor `{name}` holds {x} at index {i}, not a finite number: the file is \
                 damaged; delete it and run `baton calibrate` again"
            )));
        }
        Ok(v)
    };
    let names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    let has = |n: &str| names.iter().any(|x| x == n);
    let maps = |kind: &str, sources: &[Vec<usize>]| -> Result<Vec<LayerMap>, ArtifactError> {
        sources
            .iter()
            .enumerate()
            .map(|(j, s)| {
                let bias = read(&format!("{kind}.{j}.bias"))?;
                let factors = if has(&format!("{kind}.{j}.left")) {
                    let right = read(&format!("{kind}.{j}.right"))?;
                    let rank = right.len() / bias.len().max(1);
                    Some(Factors {
                        rank,
                        left: read(&format!("{kind}.{j}.left"))?,
                        right,
                    })
                } else {
                    None
                };
                Ok(LayerMap {
                    sources: s.clone(),
                    weight: read(&format!("{kind}.{j}.weight"))?,
                    bias,
                    factors,
                    info: FitInfo {
                        lambda_requested: meta.lambda,
                        lambda: meta.lambda,
                        standardized: meta.standardize,
                        constant_features: 0,
                        observations: meta.corpus.observations,
                    },
                })
            })
            .collect()
    };
    let keys = maps("keys", &meta.key_sources)?;
    let values = maps("values", &meta.value_sources)?;
    let source_scales = if has("source.key_mean") {
        Some(SourceScales {
            key_mean: read("source.key_mean")?,
            key_std: read("source.key_std")?,
            value_mean: read("source.value_mean")?,
            value_std: read("source.value_std")?,
        })
    } else {
        None
    };
    let widths = |is_keys: bool, j: usize| {
        let m = if is_keys { &keys[j] } else { &values[j] };
        (m.weight.len() / m.bias.len().max(1), m.bias.len())
    };
    let heads = stored::read(
        meta.kind,
        meta.target.layers,
        &|n| read(n).map_err(|e| e.to_string()),
        &|n| has(n),
        &widths,
    )
    .map_err(|e| bad(format!("trained heads: {e}")))?;
    Ok(MapperArtifact {
        path: path.to_path_buf(),
        meta,
        keys,
        values,
        source_scales,
        heads,
    })
}

impl MapperArtifact {
    /// Refuse to apply a mapper made for other models or another tokenizer.
    pub fn check(&self, source: &ModelRef, target: &ModelRef) -> Result<(), ArtifactError> {
        // Said first: "calibrate this pair" would be wrong advice for such a pair.
        if source.tokenizer_fingerprint != target.tokenizer_fingerprint {
            return Err(ArtifactError::TokenizersDiffer {
                source_name: source.name.clone(),
                target: target.name.clone(),
            });
        }
        let m = &self.meta;
        let checks = [
            ("source model", &m.source.sha256, &source.sha256),
            ("target model", &m.target.sha256, &target.sha256),
            (
                "source tokenizer",
                &m.source.tokenizer_fingerprint,
                &source.tokenizer_fingerprint,
            ),
            (
                "target tokenizer",
                &m.target.tokenizer_fingerprint,
                &target.tokenizer_fingerprint,
            ),
        ];
        for (what, expected, found) in checks {
            if expected != found {
                return Err(ArtifactError::Mismatch(Box::new(Mismatch {
                    path: self.path.clone(),
                    what,
                    expected: expected.clone(),
                    found: found.clone(),
                    src: source.name.clone(),
                    tgt: target.name.clone(),
                })));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_mapper_names_the_mappers_directory_in_its_fix() {
        let missing = |dir: Option<&str>| {
            ArtifactError::Missing {
                source_name: "a".into(),
                target: "b".into(),
                dir: dir.map(PathBuf::from),
            }
            .to_string()
        };
        let e = missing(Some("special"));
        assert!(
            e.contains("in special") && e.contains("--target b --mapper-dir special`"),
            "{e}"
        );
        assert!(!missing(None).contains("--mapper-dir"));
    }

    #[test]
    fn a_cut_short_artifact_is_called_corrupt_and_the_fix_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        // A header length that promises more bytes than the file holds.
        let mut bytes = 4096u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{\"__metadata__\":");
        std::fs::write(&p, &bytes).unwrap();
        let e = load(&p).err().expect("refused").to_string();
        assert!(e.contains("corrupt or cut short"), "{e}");
        assert!(e.contains("baton calibrate"), "{e}");
        assert!(e.contains("m.safetensors"), "{e}");
    }
}

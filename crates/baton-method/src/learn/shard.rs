//! One accepted update on disk: a shard. `<learned dir>/shards/<name>.safetensors` holds
//! the update's features (the source's and the target's keys and values of the learned
//! positions, RoPE stripped, f32, `[positions, layers·width]`), and its header metadata
//! says which models they are of and the step that took them ([`LearnedStep`]).
//!
//! A shard is written in a staging directory of the mapper directory
//! ([`crate::mapper::dir::staging`]), flushed to disk and renamed into place under a
//! name no other writer uses (time, process, counter), so writers never touch each
//! other's files: two runs learning at once each add their own shards, and a reader sees
//! a shard whole or not at all. The step rides in the shard's own header, so a step and
//! its features are one file and one rename.
//!
//! Features, not statistics: a shard grows with the positions it learned (about 80 kB a
//! position between Qwen2.5-Coder 0.5B and 1.5B), where the statistics of the same
//! update would weigh what the calibration's do (0.5 to 1.2 GB) however little it held.

use super::learner::Update;
use super::step::LearnedStep;
use super::LearnError;
use crate::calibrate::WindowFeatures;
use crate::mapper::artifact::ModelRef;
use crate::mapper::dir::{MapperDir, PairFiles};
use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "baton-learned-shard";
pub const VERSION: &str = "1";
const EXT: &str = ".safetensors";
const FIX: &str = "remove this file to forget that update alone, or every update with \
                   `baton mappers --reset-learned`";

/// What a shard's header says.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardHeader {
    pub source: ModelRef,
    pub target: ModelRef,
    /// The token block of the mapper that learned it; the features hold none, so a
    /// shard adds up with statistics with or without one.
    pub token_layers: usize,
    pub step: LearnedStep,
}

fn bad(path: &Path, reason: impl Into<String>) -> LearnError {
    LearnError::Store {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The shards of `pair`, oldest first; none when there is no shard folder.
pub fn list(pair: &PairFiles) -> Result<Vec<PathBuf>, LearnError> {
    let folder = pair.shards();
    let entries = match std::fs::read_dir(&folder) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(bad(&folder, e.to_string())),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| bad(&folder, e.to_string()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // A leading dot marks a shard still being written (or left by a crash).
        if name.ends_with(EXT) && !name.starts_with('.') {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// Writes `update` as a new shard in `dir`, durable once this returns; its path.
pub fn write(
    dir: &MapperDir,
    header: &ShardHeader,
    update: &Update,
) -> Result<PathBuf, LearnError> {
    let mut staging = dir.stage()?;
    let path = staging
        .new_root()
        .pair(&header.source, &header.target)
        .shard(&crate::mapper::dir::staging::unique_name());
    let json = |e: serde_json::Error| bad(&path, e.to_string());
    let meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        (
            "source".to_string(),
            serde_json::to_string(&header.source).map_err(json)?,
        ),
        (
            "target".to_string(),
            serde_json::to_string(&header.target).map_err(json)?,
        ),
        ("token_layers".to_string(), header.token_layers.to_string()),
        (
            "step".to_string(),
            serde_json::to_string(&header.step).map_err(json)?,
        ),
    ]);
    let tensors = [
        ("source.keys", &update.source.keys, &update.source),
        ("source.values", &update.source.values, &update.source),
        ("target.keys", &update.target.keys, &update.target),
        ("target.values", &update.target.values, &update.target),
    ]
    .map(|(n, data, f)| {
        let width = data.len().checked_div(f.rows).unwrap_or(0);
        (
            n.to_string(),
            F32Rows {
                data,
                shape: [f.rows, width],
            },
        )
    });
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            safetensors::serialize_to_file(tensors, Some(meta), &path)
                .map_err(std::io::Error::other)
        });
    if let Err(e) = written {
        return Err(bad(&path, e.to_string()));
    }
    let at = staging.stage(&path)?;
    staging.commit()?;
    Ok(at)
}

/// A shard file mapped into memory.
struct Mapped {
    map: memmap2::Mmap,
}

impl Mapped {
    fn open(path: &Path) -> Result<Self, LearnError> {
        let file = std::fs::File::open(path).map_err(|e| bad(path, e.to_string()))?;
        // A shard removed meanwhile stays mapped until this is dropped.
        let map = baton_runtime::os::map_file(&file).map_err(|e| bad(path, e.to_string()))?;
        Ok(Self { map })
    }

    fn header(&self, path: &Path) -> Result<ShardHeader, LearnError> {
        let (_, metadata) = SafeTensors::read_metadata(&self.map)
            .map_err(|e| bad(path, format!("not a shard ({e}): {FIX}")))?;
        let meta = metadata
            .metadata()
            .clone()
            .ok_or_else(|| bad(path, format!("a shard without header metadata: {FIX}")))?;
        let get = |key: &str| {
            meta.get(key)
                .ok_or_else(|| bad(path, format!("the header lacks `{key}`: {FIX}")))
        };
        if get("format")? != FORMAT || get("version")? != VERSION {
            return Err(bad(
                path,
                format!(
                    "format {} version {}, this build reads {FORMAT} version {VERSION}: {FIX}",
                    get("format")?,
                    get("version")?
                ),
            ));
        }
        Ok(ShardHeader {
            source: field(&meta, "source", path)?,
            target: field(&meta, "target", path)?,
            token_layers: field(&meta, "token_layers", path)?,
            step: field(&meta, "step", path)?,
        })
    }
}

/// Header entry `key`, as JSON of `T`.
fn field<T: serde::de::DeserializeOwned>(
    meta: &HashMap<String, String>,
    key: &str,
    path: &Path,
) -> Result<T, LearnError> {
    let text = meta
        .get(key)
        .ok_or_else(|| bad(path, format!("the header lacks `{key}`: {FIX}")))?;
    serde_json::from_str(text)
        .map_err(|e| bad(path, format!("`{key}` is not readable ({e}): {FIX}")))
}

/// A shard's header alone (the features are not read).
pub fn read_header(path: &Path) -> Result<ShardHeader, LearnError> {
    Mapped::open(path)?.header(path)
}

/// A shard whole, checked to be of `source → target` and to hold finite features of
/// their geometry, as many positions as its step says.
pub fn read(
    path: &Path,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<(ShardHeader, Update), LearnError> {
    let mapped = Mapped::open(path)?;
    let header = mapped.header(path)?;
    if header.source.sha256 != source.sha256 || header.target.sha256 != target.sha256 {
        return Err(bad(
            path,
            format!(
                "learned between other models ({} -> {}): {FIX}",
                header.source.name, header.target.name
            ),
        ));
    }
    let st = SafeTensors::deserialize(&mapped.map)
        .map_err(|e| bad(path, format!("not a shard ({e}): {FIX}")))?;
    let rows = header.step.tokens;
    let width = |m: &ModelRef| m.layers * m.kv_heads * m.head_dim;
    let tensor = |name: &str, width: usize| -> Result<Vec<f32>, LearnError> {
        let t = st
            .tensor(name)
            .map_err(|e| bad(path, format!("tensor `{name}`: {e}: {FIX}")))?;
        if t.dtype() != Dtype::F32 || t.shape() != [rows, width] {
            return Err(bad(
                path,
                format!(
                    "tensor `{name}` is {:?} {:?}, expected F32 [{rows}, {width}] ({rows} \
                     positions learned): {FIX}",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        let mut out = Vec::with_capacity(rows * width);
        for (k, b) in t.data().chunks_exact(4).enumerate() {
            let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            // One NaN would poison the statistics it is added to, and every map after.
            if !v.is_finite() {
                return Err(bad(
                    path,
                    format!(
                        "tensor `{name}` holds {v} at index {k}, not a finite number: the \
                         shard is damaged; {FIX}"
                    ),
                ));
            }
            out.push(v);
        }
        Ok(out)
    };
    let features = |side: &str, m: &ModelRef| -> Result<WindowFeatures, LearnError> {
        Ok(WindowFeatures {
            keys: tensor(&format!("{side}.keys"), width(m))?,
            values: tensor(&format!("{side}.values"), width(m))?,
            rows,
        })
    };
    let update = Update {
        source: features("source", source)?,
        target: features("target", target)?,
    };
    Ok((header, update))
}

/// Rows of f32 as a safetensors tensor, rendered only when the writer asks for them.
struct F32Rows<'a> {
    data: &'a [f32],
    shape: [usize; 2],
}

impl View for F32Rows<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
    fn data_len(&self) -> usize {
        4 * self.data.len()
    }
}

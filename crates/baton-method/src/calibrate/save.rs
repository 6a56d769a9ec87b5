//! Writing fitted mappers as artifacts: the metadata that binds each to its two models
//! and its corpus, and the file next to the other mappers. One place, so the calibrate
//! command, the workbench's first-run calibration and the tests write the same thing.

use super::{CalibrateError, CalibrateOptions, Fitted};
use crate::mapper::artifact::{self, CorpusInfo, MapperMeta, Maps, ModelRef};
use crate::mapper::dir::MapperDir;
use baton_data::corpus;
use baton_runtime::model::{Model, ModelConfig, ModelIdentity};
use std::path::PathBuf;

/// One written artifact.
pub struct Saved {
    pub meta: MapperMeta,
    pub path: PathBuf,
    /// Its readable copy.
    pub readable: PathBuf,
}

/// The corpus as the artifact records it; each direction fills in its own observation
/// count when it is saved.
pub fn corpus_info(files: &[PathBuf], fingerprint: &str, opts: &CalibrateOptions) -> CorpusInfo {
    CorpusInfo {
        files: corpus::describe(files),
        fingerprint: fingerprint.to_string(),
        sequences: opts.sequences,
        seq_len: opts.seq_len,
        observations: 0,
    }
}

/// Saves each of `fitted` (directions between `models`) into `dir`, under the name
/// keyed by both checksums. `corpus` describes the calibration text; each artifact
/// records its own direction's observation count.
pub fn save_fitted<'a>(
    fitted: impl IntoIterator<Item = &'a Fitted>,
    models: [&Model; 2],
    corpus: &CorpusInfo,
    dir: &MapperDir,
) -> Result<Vec<Saved>, CalibrateError> {
    let mut saved = Vec::new();
    for f in fitted {
        let (s, t) = if f.source.sha256 == models[0].identity.sha256 {
            (models[0], models[1])
        } else {
            (models[1], models[0])
        };
        let meta = meta_for(
            f,
            (&s.identity, s.config()),
            (&t.identity, t.config()),
            CorpusInfo {
                observations: f.report.observations,
                // With saved statistics merged in, more windows than this run read.
                sequences: f.report.sequences,
                ..corpus.clone()
            },
        );
        let files = dir.pair(&meta.source, &meta.target);
        let (path, readable) = (files.artifact(), files.readable());
        artifact::save(
            Maps {
                keys: &f.keys,
                values: &f.values,
                source_scales: &f.source_scales,
                heads: f.heads.as_ref(),
            },
            &meta,
            &path,
            &readable,
        )?;
        saved.push(Saved {
            meta,
            path,
            readable,
        });
    }
    Ok(saved)
}

/// The metadata of a freshly fitted mapper between `source` and `target`.
pub fn meta_for(
    f: &Fitted,
    source: (&ModelIdentity, &ModelConfig),
    target: (&ModelIdentity, &ModelConfig),
    corpus: CorpusInfo,
) -> MapperMeta {
    MapperMeta {
        format: artifact::FORMAT.into(),
        version: artifact::VERSION,
        direction: format!("{} -> {}", source.0.name, target.0.name),
        source: ModelRef::new(source.0, source.1),
        target: ModelRef::new(target.0, target.1),
        k: f.k,
        lambda: f.lambda,
        standardize: f.standardize,
        rank: f
            .keys
            .first()
            .and_then(|m| m.factors.as_ref())
            .map(|f| f.rank),
        key_sources: f.keys.iter().map(|m| m.sources.clone()).collect(),
        value_sources: f.values.iter().map(|m| m.sources.clone()).collect(),
        // Whether any map reads the block after the per-layer choice, not whether it
        // was offered.
        token_features: f
            .keys
            .iter()
            .chain(&f.values)
            .any(|m| m.sources.iter().any(|&s| s >= source.1.n_layer)),
        kind: f
            .heads
            .as_ref()
            .map_or(crate::mapper::nonlinear::MapperKind::Ridge, |h| h.kind),
        training: f.training.clone(),
        corpus,
        report: f.report.clone(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        baton_version: env!("CARGO_PKG_VERSION").into(),
        id: crate::mapper::dir::staging::unique_name(),
    }
}

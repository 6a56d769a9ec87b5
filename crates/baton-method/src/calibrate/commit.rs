//! Putting what a calibration keeps in place whole: the artifacts and their readable
//! copies, the statistics beside them, and a poor mapper's under `poor/`, all staged and
//! committed at once by the mapper directory ([`crate::mapper::dir::staging`]), so a
//! write that fails part way leaves the mappers and statistics in use as they were.

use super::saved_stats::{self, SavedStats};
use super::{save_fitted, CalibrateError, Fitted, Saved};
use crate::mapper::artifact::CorpusInfo;
use crate::mapper::dir::MapperDir;
use baton_runtime::model::Model;
use std::path::PathBuf;

/// What one calibration keeps.
pub struct Keep<'a> {
    /// Mappers made the default.
    pub kept: Vec<&'a Fitted>,
    /// Mappers kept apart under `poor/`, the ones in use staying.
    pub apart: Vec<&'a Fitted>,
    /// Statistics to keep (none: not kept), each beside its direction's mapper: under
    /// `poor/` when that mapper is kept apart.
    pub stats: &'a [SavedStats],
}

/// Where everything went, once in place.
pub struct Kept {
    pub kept: Vec<Saved>,
    pub apart: Vec<Saved>,
    /// The statistics' directories, in the order of [`Keep::stats`].
    pub stats: Vec<PathBuf>,
}

/// Writes what `keep` holds into the mapper directory `dir`, all of it or nothing.
pub fn save_calibration(
    dir: &MapperDir,
    models: [&Model; 2],
    corpus: &CorpusInfo,
    keep: Keep<'_>,
) -> Result<Kept, CalibrateError> {
    write_all(dir, models, corpus, keep).map_err(|e| CalibrateError::NotKept(Box::new(e)))
}

fn write_all(
    dir: &MapperDir,
    models: [&Model; 2],
    corpus: &CorpusInfo,
    keep: Keep<'_>,
) -> Result<Kept, CalibrateError> {
    let mut staging = dir.stage()?;
    let poor_dir = staging.new_root().poor();
    let kept = save_fitted(keep.kept, models, corpus, staging.new_root())?;
    let apart = save_fitted(keep.apart.iter().copied(), models, corpus, &poor_dir)?;
    let mut stats = Vec::new();
    for st in keep.stats {
        // A poor map's statistics go beside it, so that the mapper in use keeps the
        // statistics it was fitted from (learning adds to those).
        let is_poor = keep.apart.iter().any(|f| {
            f.source.sha256 == st.meta.source.sha256 && f.target.sha256 == st.meta.target.sha256
        });
        let home = if is_poor {
            poor_dir.clone()
        } else {
            staging.new_root().clone()
        };
        let at = home.pair(&st.meta.source, &st.meta.target).stats();
        saved_stats::save(st, &at)?;
        stats.push(staging.stage(&at)?);
    }
    let mut place = |saved: Vec<Saved>| -> Result<Vec<Saved>, CalibrateError> {
        saved
            .into_iter()
            .map(|s| {
                let readable = staging.stage(&s.readable)?;
                let path = staging.stage(&s.path)?;
                Ok(Saved {
                    meta: s.meta,
                    path,
                    readable,
                })
            })
            .collect()
    };
    let kept = place(kept)?;
    let apart = place(apart)?;
    staging.commit()?;
    Ok(Kept { kept, apart, stats })
}

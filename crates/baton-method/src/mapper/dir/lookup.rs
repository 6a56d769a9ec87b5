//! Finding the artifact for a pair of models in a mapper directory: the directory owns
//! where a pair's files live, the artifact only what is in them.

use super::MapperDir;
use crate::mapper::artifact::{self, ArtifactError, MapperArtifact, ModelRef};
use crate::mapper::CacheMapper;
use std::path::Path;

impl MapperDir {
    /// The mapper from `s` to `t` in this directory: found, loaded, checked against both models and
    /// ready to apply.
    pub fn open_for(
        &self,
        s: &baton_runtime::model::Model,
        t: &baton_runtime::model::Model,
    ) -> Result<(MapperArtifact, CacheMapper), ArtifactError> {
        let art = self.find_for(s, t)?;
        let mapper = art.cache_mapper(s, t)?;
        Ok((art, mapper))
    }

    /// The artifact from `s` to `t` in this directory, found, loaded and checked against both models,
    /// its maps still in plain form (for a caller that adjusts them before applying).
    pub fn find_for(
        &self,
        s: &baton_runtime::model::Model,
        t: &baton_runtime::model::Model,
    ) -> Result<MapperArtifact, ArtifactError> {
        let (sr, tr) = (
            ModelRef::new(&s.identity, s.config()),
            ModelRef::new(&t.identity, t.config()),
        );
        let path = self.pair(&sr, &tr).artifact();
        if !path.is_file() {
            return Err(ArtifactError::Missing {
                source_name: s.identity.name.clone(),
                target: t.identity.name.clone(),
                dir: self.as_named().map(Path::to_path_buf),
            });
        }
        let art = artifact::load(&path)?;
        art.check(&sr, &tr)?;
        Ok(art)
    }
}

//! Two tiny models generated here with their mappers calibrated between them, a text,
//! and each model's own cache of it: what the handoff tests build caches from.

use super::engine_rig::{models_and_mappers, tiny, write_pair};
use super::prefill;
use baton::handoff::HandoffInputs;
use baton::mapper::CacheMapper;
use baton::model::{KvCache, Model};

/// Two tiny models with their mappers, a text, and each model's own cache of it.
pub struct Pair {
    _dir: tempfile::TempDir,
    pub a: Model,
    pub b: Model,
    pub mapper: CacheMapper,
    pub reverse: CacheMapper,
    pub ids: Vec<u32>,
    pub src_cache: KvCache,
    pub truth: KvCache,
}

impl Pair {
    pub fn new(words: usize, seed: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_pair(dir.path(), false);
        let (a, b, mapper, reverse) = models_and_mappers(dir.path());
        let ids = a.tokenizer.encode_raw(&tiny().text(words, seed)).unwrap();
        let (src_cache, truth) = (prefill(&a, &ids), prefill(&b, &ids));
        Self {
            _dir: dir,
            a,
            b,
            mapper,
            reverse,
            ids,
            src_cache,
            truth,
        }
    }

    /// The whole text handed from a to b, with no exact cache to copy from.
    pub fn inputs(&self) -> HandoffInputs<'_> {
        HandoffInputs {
            source: &self.a,
            source_cache: &self.src_cache,
            target: &self.b,
            mapper: &self.mapper,
            tokens: &self.ids,
            exact: None,
        }
    }
}

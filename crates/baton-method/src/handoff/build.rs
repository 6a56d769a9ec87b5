//! Building the target's cache from a [`HandoffPlan`]: the one place where "anchor, then
//! the mapped middle, then what the target reads itself" is put together.

use super::HandoffPlan;
use crate::mapper::CacheMapper;
use baton_runtime::model::{ForwardOptions, KvCache, LayerKv, Model, ModelError};
use std::ops::Range;
use std::time::Instant;

/// What the handed-over cache is made from.
pub struct HandoffInputs<'a> {
    pub source: &'a Model,
    /// The source's cache, holding at least the plan's mapped positions.
    pub source_cache: &'a KvCache,
    pub target: &'a Model,
    pub mapper: &'a CacheMapper,
    /// The conversation's token ids, at least the plan's `len` of them.
    pub tokens: &'a [u32],
    /// A cache of the target's own for a prefix of the same tokens (its truth, or a
    /// precomputed opening), copied instead of computed where the plan wants exact
    /// positions. Give one only when the positions the plan keeps are the target's own
    /// too (or none are kept): copied positions were computed over the exact prefix.
    pub exact: Option<&'a KvCache>,
}

/// What each part of a build cost, in milliseconds (after the device finished).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BuildTimings {
    /// The target computing (or copying) its own leading positions.
    pub own_ms: f64,
    /// The map of the middle.
    pub map_ms: f64,
    /// The target re-reading chosen spans of the mapped middle.
    pub reread_ms: f64,
    /// The target reading the rest itself.
    pub read_ms: f64,
}

impl BuildTimings {
    pub fn total_ms(&self) -> f64 {
        self.own_ms + self.map_ms + self.reread_ms + self.read_ms
    }
}

/// Changes the mapped layers of positions `range` before they enter the cache (a study
/// that swaps in the target's own keys, say).
pub type EditMapped<'e> = &'e mut dyn FnMut(&mut [LayerKv], Range<usize>) -> Result<(), ModelError>;

impl HandoffPlan {
    /// Build the target's cache into `dst`, which must hold at least the plan's `held`
    /// positions (the rest is dropped).
    pub fn build(
        &self,
        inputs: &HandoffInputs<'_>,
        dst: &mut KvCache,
    ) -> Result<BuildTimings, ModelError> {
        self.build_edited(inputs, dst, None)
    }

    /// A new cache built from the plan (which must hold nothing).
    pub fn build_new(
        &self,
        inputs: &HandoffInputs<'_>,
    ) -> Result<(KvCache, BuildTimings), ModelError> {
        if self.maps_everything() {
            // The whole map in one call takes the mapper's fastest path.
            let t = Instant::now();
            let c = inputs.mapper.map_cache(
                inputs.source_cache,
                inputs.tokens,
                inputs.source.decoder.rope(),
                inputs.target.decoder.rope(),
            )?;
            let map_ms = synced_ms(inputs.target, t);
            if c.len() != self.len() {
                return Err(ModelError::Cache(format!(
                    "the source cache holds {} positions, the plan maps {}",
                    c.len(),
                    self.len()
                )));
            }
            return Ok((
                c,
                BuildTimings {
                    map_ms,
                    ..Default::default()
                },
            ));
        }
        let mut c = inputs.target.decoder.new_cache();
        let t = self.clone().holding(0).build(inputs, &mut c)?;
        Ok((c, t))
    }

    /// [`Self::build`], with `edit` applied to the mapped layers.
    pub fn build_edited(
        &self,
        inputs: &HandoffInputs<'_>,
        dst: &mut KvCache,
        edit: Option<EditMapped<'_>>,
    ) -> Result<BuildTimings, ModelError> {
        let (tgt, tokens) = (inputs.target, inputs.tokens);
        if tokens.len() < self.len() {
            return Err(ModelError::Cache(format!(
                "a handoff of {} positions given {} tokens",
                self.len(),
                tokens.len()
            )));
        }
        if dst.len() < self.held() {
            return Err(ModelError::Cache(format!(
                "the target cache holds {} positions, the plan keeps {}",
                dst.len(),
                self.held()
            )));
        }
        dst.truncate(self.held());
        let mut timings = BuildTimings::default();

        let t = Instant::now();
        let own = self.own();
        self.exact_part(inputs, dst, own.end)?;
        timings.own_ms = synced_ms(tgt, t);

        let mapped = self.mapped();
        if !mapped.is_empty() {
            let t = Instant::now();
            let mut layers = inputs.mapper.map_range(
                inputs.source_cache,
                tokens,
                inputs.source.decoder.rope(),
                tgt.decoder.rope(),
                mapped.start,
                mapped.end,
            )?;
            if let Some(edit) = edit {
                edit(&mut layers, mapped.clone())?;
            }
            dst.extend_with(&layers)?;
            dst.mark_foreign(mapped.clone())?;
            // A position the source itself had dropped holds nothing it read: its map
            // stays out of attention too, until a re-read takes it back.
            for r in inputs.source_cache.dropped() {
                let (start, end) = (r.start.max(mapped.start), r.end.min(mapped.end));
                if start < end {
                    dst.drop_positions(start..end)?;
                }
            }
            timings.map_ms = synced_ms(tgt, t);
            timings.reread_ms = self.reread_in(tgt, tokens, dst)?;
        }

        let t = Instant::now();
        let read = self.read();
        if mapped.is_empty() {
            // Nothing mapped: the whole cache is exact, and the exact cache may hold it.
            self.exact_part(inputs, dst, read.end)?;
        } else if !read.is_empty() {
            tgt.decoder
                .forward(&tokens[read], dst, &ForwardOptions::cache_only())?;
        }
        timings.read_ms = synced_ms(tgt, t);
        Ok(timings)
    }

    /// Re-read the plan's spans of the mapped middle in `dst`, a cache built from this
    /// plan or from its [`HandoffPlan::tail_mapped`] form (the spans chosen once the
    /// middle was mapped, say). What the plan reads after the middle is read in the same
    /// pass, over the re-read middle: a tail read before is read again, a tail mapped is
    /// read for the first time, and either way the cache is what one pass would give.
    /// Returns the milliseconds it took.
    /// The plan's dropped spans are dropped first, so that no re-read position attends to
    /// them.
    pub fn reread_in(
        &self,
        target: &Model,
        tokens: &[u32],
        dst: &mut KvCache,
    ) -> Result<f64, ModelError> {
        for r in self.dropped() {
            dst.drop_positions(r)?;
        }
        let mut runs = self.reread();
        let read = self.read();
        if !read.is_empty() && dst.len() >= read.end {
            runs.push(read);
        }
        if runs.is_empty() {
            return Ok(0.0);
        }
        let t = Instant::now();
        target.decoder.reread(tokens, &runs, dst)?;
        Ok(synced_ms(target, t))
    }

    /// Grow `dst` with the target's exact positions up to `end`: copied from the exact
    /// cache as far as it reaches, computed past that.
    fn exact_part(
        &self,
        inputs: &HandoffInputs<'_>,
        dst: &mut KvCache,
        end: usize,
    ) -> Result<(), ModelError> {
        let start = dst.len();
        if end <= start {
            return Ok(());
        }
        let copied = inputs.exact.map_or(start, |e| e.len().clamp(start, end));
        if let Some(exact) = inputs.exact {
            if copied > start {
                dst.extend_from(exact, start, copied)?;
            }
        }
        if copied < end {
            inputs.target.decoder.forward(
                &inputs.tokens[copied..end],
                dst,
                &ForwardOptions::cache_only(),
            )?;
        }
        Ok(())
    }
}

/// Milliseconds since `t` once the target's device has finished its queued work (a GPU
/// runs kernels asynchronously; on the CPU this is a no-op).
fn synced_ms(model: &Model, t: Instant) -> f64 {
    if let Err(e) = model.decoder.device().synchronize() {
        tracing::warn!("device synchronize: {e}");
    }
    t.elapsed().as_secs_f64() * 1e3
}

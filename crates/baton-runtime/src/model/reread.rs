//! The selective re-read: the model recomputes the keys and values of chosen positions of
//! a cache it already holds (a mapped one, say), layer by layer, in place.
//!
//! Each chosen position attends, causally by position, over the cache as it stands: at
//! every layer the chosen positions before it already carry what the model just
//! recomputed, every other position what the cache held. Choosing every position is a
//! prefill (the same layer code, the same rows); choosing none changes nothing. Chosen
//! positions are taken in order of position, at most [`PREFILL_CHUNK`] rows at a time
//! through all layers: a later chunk reads an earlier one's rewritten entries at every
//! layer, exactly as it would in one pass, so chunking bounds memory without changing a
//! bit.

use super::decoder::{Decoder, PREFILL_CHUNK};
use super::error::{ModelError, Result};
use super::kv_cache::{KvCache, LayerKv};
use super::position_set::PositionSet;
use candle_core::Tensor;
use std::ops::Range;

impl Decoder {
    /// Recompute the positions of `runs` (non-empty, increasing, disjoint spans inside
    /// the cache) of `cache`, whose tokens are `tokens` (at least as many as the cache
    /// holds).
    pub fn reread(&self, tokens: &[u32], runs: &[Range<usize>], cache: &mut KvCache) -> Result<()> {
        self.reread_until(tokens, runs, cache, &|| false)
    }

    /// [`Decoder::reread`] that gives up with [`ModelError::Interrupted`] as soon as
    /// `stop` says so. The cache is then part re-read: a valid cache (every position holds
    /// keys and values the model attends over), but neither the old one nor the new.
    pub fn reread_until(
        &self,
        tokens: &[u32],
        runs: &[Range<usize>],
        cache: &mut KvCache,
        stop: &dyn Fn() -> bool,
    ) -> Result<()> {
        check_runs(runs, cache.len())?;
        if tokens.len() < cache.len() {
            return Err(ModelError::Cache(format!(
                "a re-read of a cache of {} positions given {} tokens",
                cache.len(),
                tokens.len()
            )));
        }
        self.check_ids(&tokens[..cache.len()])?;
        for chunk in chunks(runs, PREFILL_CHUNK) {
            // A dropped position re-read here is back in attention from its first layer
            // on: the chunk's later rows read what it was just rewritten to. If the read
            // stops half way, the positions go back out, since their slots then hold
            // neither the old entries nor the new at every layer.
            let dropped = PositionSet::of(cache.dropped().iter().cloned());
            let was_dropped: Vec<Range<usize>> = chunk
                .iter()
                .flat_map(|r| dropped.moved(r.clone(), r.start).runs().to_vec())
                .collect();
            for r in &chunk {
                cache.undrop(r.clone());
            }
            let read = self.reread_chunk(tokens, &chunk, cache, stop);
            if read.is_err() {
                for r in was_dropped {
                    cache.drop_positions(r)?;
                }
            }
            read?;
            for r in &chunk {
                cache.mark_own(r.clone());
            }
        }
        Ok(())
    }

    fn reread_chunk(
        &self,
        tokens: &[u32],
        chunk: &[Range<usize>],
        cache: &mut KvCache,
        stop: &dyn Fn() -> bool,
    ) -> Result<()> {
        let h = self.embed_runs(tokens, chunk)?;
        self.layers_over(h, chunk, 0..self.config().n_layer, cache, stop)?;
        Ok(())
    }

    /// The embeddings of the tokens at the positions of `chunk`, in order.
    pub(super) fn embed_runs(&self, tokens: &[u32], chunk: &[Range<usize>]) -> Result<Tensor> {
        let ids: Vec<u32> = chunk
            .iter()
            .flat_map(|r| tokens[r.clone()].iter().copied())
            .collect();
        let ids = Tensor::new(ids.as_slice(), self.device())?;
        self.weights().embedding.forward(&ids, self.dtype())
    }

    /// Layers `layers` over rows `h` at the positions of `chunk` (one chunk of a read in
    /// place: re-read, upper or lower layers), each writing its keys and values there
    /// before the rows attend; the rows leaving the last of them.
    pub(super) fn layers_over(
        &self,
        mut h: Tensor,
        chunk: &[Range<usize>],
        layers: Range<usize>,
        cache: &mut KvCache,
        stop: &dyn Fn() -> bool,
    ) -> Result<Tensor> {
        let mut no_queries = Vec::new();
        let mut masks = super::attention::Masks::default();
        for l in layers {
            h = self.layer(l, h, chunk, cache, None, &mut no_queries, &mut masks, stop)?;
        }
        Ok(h)
    }

    /// The model's own keys and values of `tokens` at its first `n_layers` layers (a
    /// prefill that stops there): what a re-read's first layers would write, to compare
    /// with what a cache holds.
    pub fn leading_layers(&self, tokens: &[u32], n_layers: usize) -> Result<Vec<LayerKv>> {
        let n_layers = n_layers.min(self.config().n_layer);
        let mut shape = self.kv_shape();
        shape.n_layer = n_layers;
        let mut cache = KvCache::new(shape, self.dtype(), self.device());
        self.prefill_layers(tokens, &mut cache, n_layers, &mut |_, _| {})?;
        (0..n_layers).map(|l| cache.layer(l)).collect()
    }
}

/// Runs must be non-empty, in increasing order, disjoint, and inside the cache.
pub(super) fn check_runs(runs: &[Range<usize>], len: usize) -> Result<()> {
    let mut end = 0;
    for (i, r) in runs.iter().enumerate() {
        if r.is_empty() || (i > 0 && r.start < end) || r.end > len {
            return Err(ModelError::Cache(format!(
                "re-read spans must be non-empty, increasing, disjoint and inside the cache of \
                 {len} positions; span {i} is {}..{} after one ending at {end}",
                r.start, r.end
            )));
        }
        end = r.end;
    }
    Ok(())
}

/// The runs split into groups of at most `rows` positions, in order (a run may be cut).
pub(super) fn chunks(runs: &[Range<usize>], rows: usize) -> Vec<Vec<Range<usize>>> {
    let mut out = Vec::new();
    let mut cur: Vec<Range<usize>> = Vec::new();
    let mut n = 0;
    for r in runs {
        let mut s = r.start;
        while s < r.end {
            let take = (r.end - s).min(rows - n);
            cur.push(s..s + take);
            n += take;
            s += take;
            if n == rows {
                out.push(std::mem::take(&mut cur));
                n = 0;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_every_position_once_in_order_and_cut_runs_at_the_row_limit() {
        let runs = [0..3, 5..12, 20..21];
        let c = chunks(&runs, 4);
        assert_eq!(c, vec![vec![0..3, 5..6], vec![6..10], vec![10..12, 20..21]]);
        let flat: Vec<usize> = c.iter().flatten().flat_map(|r| r.clone()).collect();
        let want: Vec<usize> = runs.iter().flat_map(|r| r.clone()).collect();
        assert_eq!(flat, want);
        assert!(chunks(&[], 4).is_empty());
    }

    #[test]
    fn bad_runs_are_refused_with_the_span_named() {
        assert!(check_runs(&[0..2, 4..9], 9).is_ok());
        assert!(check_runs(&[], 0).is_ok());
        for bad in [vec![0..2, 1..3], vec![3..3], vec![5..10], vec![4..6, 0..2]] {
            let e = check_runs(&bad, 9).unwrap_err().to_string();
            assert!(e.contains("re-read spans"), "{e}");
        }
    }
}

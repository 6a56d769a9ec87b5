//! The residual stream between layers: kept while the model reads, and read from.
//!
//! A handoff can give the target more than keys and values: the source's residual stream
//! at one of its layers, mapped to the target's at its layer `m`, lets the target compute
//! its layers `m..L` itself over every handed position ([`Decoder::upper_layers`]). Its
//! upper keys and values are then its own computation, consistent with one another, and
//! only the layers below `m` hold a map.

use super::decoder::{Decoder, PREFILL_CHUNK};
use super::error::{ModelError, Result};
use super::kv_cache::KvCache;
use candle_core::Tensor;
use std::ops::Range;

impl Decoder {
    /// Run `tokens` after what `cache` holds, as [`Decoder::forward`] with no logits,
    /// and return, for each of `layers`, the residual stream entering that layer for each
    /// of them ([tokens, hidden], in the model's dtype): the embeddings for layer 0, the
    /// last layer's output before the final norm for `n_layer`.
    pub fn forward_keeping(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        layers: &[usize],
    ) -> Result<Vec<Tensor>> {
        let n_layer = self.config().n_layer;
        if let Some(&bad) = layers.iter().find(|&&l| l > n_layer) {
            return Err(ModelError::Cache(format!(
                "the residual stream entering layer {bad} of a {n_layer}-layer model"
            )));
        }
        let mut kept: Vec<Vec<Tensor>> = vec![Vec::new(); layers.len()];
        self.prefill_layers(tokens, cache, n_layer, &mut |l, h| {
            for (i, &want) in layers.iter().enumerate() {
                if want == l {
                    kept[i].push(h.clone());
                }
            }
        })?;
        kept.into_iter()
            .map(|parts| {
                if parts.is_empty() {
                    Ok(Tensor::zeros(
                        (0, self.config().hidden),
                        self.dtype(),
                        self.device(),
                    )?)
                } else {
                    Ok(Tensor::cat(&parts, 0)?)
                }
            })
            .collect()
    }

    /// A prefill of `tokens` after what `cache` holds through the first `n_layers` layers
    /// (the cache holds that many), in chunks of [`PREFILL_CHUNK`], no logits: `on_layer`
    /// sees each chunk's residual stream entering every layer `l` (`n_layers`: leaving the
    /// last one run).
    pub(super) fn prefill_layers(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        n_layers: usize,
        on_layer: &mut dyn FnMut(usize, &Tensor),
    ) -> Result<()> {
        self.check_ids(tokens)?;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            let start = cache.len();
            let ids = Tensor::new(chunk, self.device())?;
            let mut h = self.weights().embedding.forward(&ids, self.dtype())?;
            cache.reserve(chunk.len())?;
            let span = start..start + chunk.len();
            let run = std::slice::from_ref(&span);
            let mut no_queries = Vec::new();
            let mut masks = super::attention::Masks::default();
            for l in 0..n_layers {
                on_layer(l, &h);
                let (q, m) = (&mut no_queries, &mut masks);
                h = self.layer(l, h, run, cache, None, q, m, &|| false)?;
            }
            on_layer(n_layers, &h);
            cache.advance(chunk.len());
        }
        Ok(())
    }

    /// Compute layers `from..n_layer` of the positions of `runs` (non-empty, increasing,
    /// disjoint, inside the cache) from `hidden` ([positions of the runs, hidden], in
    /// order): the residual stream entering layer `from` there. Each layer's keys and
    /// values of those positions are written in place before they attend, causally by
    /// position, over the cache as it stands; layers below `from` are left as they are.
    /// Positions keep whatever origin they had: their lower layers are not the model's.
    pub fn upper_layers(
        &self,
        hidden: &Tensor,
        runs: &[Range<usize>],
        from: usize,
        cache: &mut KvCache,
    ) -> Result<()> {
        let n_layer = self.config().n_layer;
        let rows: usize = runs.iter().map(|r| r.len()).sum();
        let (h_rows, width) = hidden.dims2()?;
        if from > n_layer || h_rows != rows || width != self.config().hidden {
            return Err(ModelError::Cache(format!(
                "upper layers from {from} of a {n_layer}-layer model over {rows} positions \
                 given a residual of {h_rows} rows of {width} (hidden {})",
                self.config().hidden
            )));
        }
        super::reread::check_runs(runs, cache.len())?;
        let mut row = 0;
        for chunk in super::reread::chunks(runs, PREFILL_CHUNK) {
            let n: usize = chunk.iter().map(|r| r.len()).sum();
            let h = hidden.narrow(0, row, n)?.to_dtype(self.dtype())?;
            row += n;
            self.layers_over(h, &chunk, from..n_layer, cache, &|| false)?;
        }
        Ok(())
    }

    /// The control to [`Decoder::upper_layers`]: compute layers `0..to` of the positions
    /// of `runs` (as there, inside the cache) from their tokens (`tokens` holds at least
    /// the cache's positions), in place and causally by position, as a re-read that
    /// stops at layer `to`; the layers from `to` on are left as they are. Positions keep
    /// whatever origin they had: their upper layers are not the model's.
    pub fn lower_layers(
        &self,
        tokens: &[u32],
        runs: &[Range<usize>],
        to: usize,
        cache: &mut KvCache,
    ) -> Result<()> {
        let n_layer = self.config().n_layer;
        if to > n_layer || tokens.len() < cache.len() {
            return Err(ModelError::Cache(format!(
                "lower layers to {to} of a {n_layer}-layer model over a cache of {} positions \
                 given {} tokens",
                cache.len(),
                tokens.len()
            )));
        }
        super::reread::check_runs(runs, cache.len())?;
        self.check_ids(&tokens[..cache.len()])?;
        for chunk in super::reread::chunks(runs, PREFILL_CHUNK) {
            let h = self.embed_runs(tokens, &chunk)?;
            self.layers_over(h, &chunk, 0..to, cache, &|| false)?;
        }
        Ok(())
    }
}

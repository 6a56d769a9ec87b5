//! The held-out judgement of an update: attention-output cosine of the target's own
//! queries over its own cache with a stretch of positions mapped, against its own cache
//! of them, mean over target layers.

use super::LearnError;
use crate::calibrate::capture;
use crate::handoff::{HandoffInputs, HandoffPlan};
use crate::mapper::CacheMapper;
use crate::metrics::attention_output_cosine;
use baton_runtime::model::{KvCache, Model};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

/// Both models' own caches of some tokens, with the target's queries at probe positions.
pub struct Slice {
    pub tokens: Vec<u32>,
    pub src: KvCache,
    pub tgt: KvCache,
    /// Per target layer `[n_head, probes, head_dim]`.
    pub queries: Vec<Tensor>,
    pub probes: Vec<usize>,
    /// Positions before this are the target's own in the scored cache; the rest mapped.
    pub mapped_from: usize,
}

impl Slice {
    /// Both models read `tokens`; the target keeps its queries at `probes`.
    pub fn read(
        src: &Model,
        tgt: &Model,
        tokens: Vec<u32>,
        probes: Vec<usize>,
        mapped_from: usize,
    ) -> Result<Self, LearnError> {
        let s = capture(src, &tokens, &[])?;
        let t = capture(tgt, &tokens, &probes)?;
        Ok(Self {
            tokens,
            src: s.cache,
            tgt: t.cache,
            queries: t.queries,
            probes,
            mapped_from,
        })
    }

    pub fn cosine(
        &self,
        mapper: &CacheMapper,
        src: &Model,
        tgt: &Model,
    ) -> Result<f64, LearnError> {
        let view = Stretch {
            tokens: &self.tokens,
            src: &self.src,
            tgt: &self.tgt,
            queries: &self.queries,
            probes: &self.probes,
            mapped: (self.mapped_from, self.tokens.len()),
        };
        view.cosine(mapper, src, tgt)
    }
}

/// A borrowed [`Slice`]: positions `mapped.0..mapped.1` are mapped, the rest of the
/// first `mapped.1` are the target's own.
pub(super) struct Stretch<'a> {
    pub tokens: &'a [u32],
    pub src: &'a KvCache,
    pub tgt: &'a KvCache,
    pub queries: &'a [Tensor],
    pub probes: &'a [usize],
    pub mapped: (usize, usize),
}

impl Stretch<'_> {
    pub fn cosine(
        &self,
        mapper: &CacheMapper,
        src: &Model,
        tgt: &Model,
    ) -> Result<f64, LearnError> {
        let (from, to) = self.mapped;
        if self.probes.is_empty() || self.probes.iter().any(|&p| p >= to) || from >= to {
            return Err(LearnError::Unsupported(format!(
                "a held-out stretch needs probes inside its {to} positions and something to \
                 map (positions {from}..{to})"
            )));
        }
        let (cache, _) = HandoffPlan::new(to)
            .anchor(from)
            .build_new(&HandoffInputs {
                source: src,
                source_cache: self.src,
                target: tgt,
                mapper,
                tokens: self.tokens,
                exact: Some(self.tgt),
            })?;
        let layers = cache.shape().n_layer;
        if self.queries.len() != layers {
            return Err(LearnError::Unsupported(format!(
                "queries for {} layers, the target has {layers}",
                self.queries.len()
            )));
        }
        let mut sum = 0.0;
        for (l, q) in self.queries.iter().enumerate() {
            let truth = self.tgt.layer_range(l, 0, to)?;
            let mapped = cache.layer(l)?;
            sum +=
                attention_output_cosine(q, self.probes, &truth.k, &truth.v, &mapped.k, &mapped.v)?;
        }
        Ok(sum / layers.max(1) as f64)
    }
}

/// A mapper's cosine on the two halves of the held-out slice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeldOutScores {
    /// On the conversation's held-out positions.
    pub conversation: f64,
    /// On the fixed calibration text; `None` when there is none to score on.
    pub calibration: Option<f64>,
}

impl HeldOutScores {
    /// The two halves weighted alike (the conversation alone without calibration text):
    /// what an update must not lower.
    pub fn combined(&self) -> f64 {
        match self.calibration {
            Some(c) => (self.conversation + c) / 2.0,
            None => self.conversation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_halves_count_alike_and_the_conversation_stands_alone_without_calibration_text() {
        let both = HeldOutScores {
            conversation: 0.6,
            calibration: Some(0.8),
        };
        assert!((both.combined() - 0.7).abs() < 1e-12);
        let alone = HeldOutScores {
            conversation: 0.6,
            calibration: None,
        };
        assert_eq!(alone.combined(), 0.6);
    }
}

//! One direction's learner: the calibration's statistics plus what it learned, the
//! structure to solve them with, the fixed calibration text it is judged on, and the
//! mapper in use.

use super::judge::{HeldOutScores, Slice, Stretch};
use super::refit::Structure;
use super::LearnError;
use crate::calibrate::{Direction, DirectionStats, StatsRows, WindowFeatures};
use crate::mapper::CacheMapper;
use baton_runtime::model::{KvCache, Model};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Fewer new positions than this are not worth a re-solve; they wait for the next time.
pub const MIN_NEW_POSITIONS: usize = 16;

/// Both models' own caches of one conversation.
pub struct ConversationPair<'a> {
    pub tokens: &'a [u32],
    /// The source's own cache of (at least) `tokens`.
    pub src: &'a KvCache,
    /// The target's own cache of (at least) `tokens`.
    pub tgt: &'a KvCache,
    /// The target's own queries at `probes`, per layer `[n_head, probes, head_dim]`.
    pub queries: &'a [Tensor],
    pub probes: &'a [usize],
    /// Positions learned before (from this conversation): the new ones start here.
    pub from: usize,
}

/// What one learning step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnOutcome {
    /// New positions the update was fitted on.
    pub tokens: usize,
    /// Newest positions kept out of the fit to judge it.
    pub held_out: usize,
    pub before: HeldOutScores,
    pub after: HeldOutScores,
    /// The update did not lower the held-out cosine and is now the mapper in use.
    pub accepted: bool,
    /// Positions learned in all, over every conversation, once this step is counted.
    pub learned_tokens: u64,
    /// Where the conversation is learned up to now: the held-out positions and what
    /// follows them are new to the next step.
    pub learned_to: usize,
    pub seconds: f64,
}

/// An accepted update's features, as the two models' caches gave them (RoPE stripped, no
/// token block: the statistics add that themselves): what is kept of it on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// The source model's keys and values of the learned positions.
    pub source: WindowFeatures,
    /// The target model's, of the same positions.
    pub target: WindowFeatures,
}

impl Update {
    /// Adds the update to `stats` (source-first or target-first, as they were loaded).
    pub fn add_to(&self, stats: &mut DirectionStats) -> Result<(), LearnError> {
        let (a, b) = self.ordered(stats.direction);
        Ok(stats.add(a, b)?)
    }

    fn ordered(&self, direction: Direction) -> (&WindowFeatures, &WindowFeatures) {
        match direction {
            Direction::Forward => (&self.source, &self.target),
            Direction::Backward => (&self.target, &self.source),
        }
    }
}

pub struct Learner {
    structure: Structure,
    /// The calibration's statistics with every accepted update added: the only copy a
    /// learner holds, since an update is weighed without adding it (see
    /// [`Structure::refit_with`]) and what was learned is kept as the updates themselves.
    total: DirectionStats,
    /// Positions learned in all, earlier sessions' included.
    learned_tokens: u64,
    /// The latest accepted update, until it is taken to be kept.
    accepted: Option<Update>,
    calibration: Vec<Slice>,
    /// The mapper in use's cosine on `calibration`, once scored: it changes only when an
    /// update is taken, so it is not scored again for every step's "before".
    calibration_cosine: Option<f64>,
    anchor: usize,
    mapper: CacheMapper,
}

impl Learner {
    /// A learner over `stats`: the statistics the mapper was fitted on, with what was
    /// learned before (`learned_tokens` positions) already added; with something learned
    /// the mapper is solved again from them. `mapper` is the calibrated mapper, whose
    /// precision the updates keep; `anchor` the leading positions the target always
    /// computes itself.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        src: &Model,
        tgt: &Model,
        structure: Structure,
        stats: DirectionStats,
        learned_tokens: u64,
        calibration: Vec<Slice>,
        anchor: usize,
        mapper: CacheMapper,
    ) -> Result<Self, LearnError> {
        let mut learner = Self {
            structure,
            total: stats,
            learned_tokens,
            accepted: None,
            calibration,
            calibration_cosine: None,
            anchor,
            mapper,
        };
        if learned_tokens > 0 {
            learner.mapper = learner.solve(src, tgt, None)?;
        }
        Ok(learner)
    }

    pub fn mapper(&self) -> &CacheMapper {
        &self.mapper
    }

    /// The latest accepted update, to keep; `None` once taken or when none was accepted.
    pub fn take_update(&mut self) -> Option<Update> {
        self.accepted.take()
    }

    pub fn learned_tokens(&self) -> u64 {
        self.learned_tokens
    }

    /// The statistics solved from: the calibration's with what was learned.
    pub fn statistics(&self) -> &DirectionStats {
        &self.total
    }

    /// The mapper solved from the statistics, with `batch` added if there is one.
    fn solve(
        &self,
        src: &Model,
        tgt: &Model,
        batch: Option<&StatsRows<'_>>,
    ) -> Result<CacheMapper, LearnError> {
        let r = self.structure.refit_with(&self.total, batch)?;
        Ok(
            CacheMapper::from_layer_maps(src, tgt, &r.keys, &r.values, Some(&r.scales))?
                .with_precision(self.mapper.precision())?,
        )
    }

    /// `mapper`'s mean cosine on the calibration text; `None` without any.
    fn calibration_score(
        &self,
        mapper: &CacheMapper,
        src: &Model,
        tgt: &Model,
    ) -> Result<Option<f64>, LearnError> {
        if self.calibration.is_empty() {
            return Ok(None);
        }
        let mut sum = 0.0;
        for s in &self.calibration {
            sum += s.cosine(mapper, src, tgt)?;
        }
        Ok(Some(sum / self.calibration.len() as f64))
    }

    /// Fit an update on the pair's new positions but their newest quarter, judge it on
    /// that quarter and the calibration text, and take it if it does not score lower.
    /// `None` when there is too little new text, or no probe among the newest positions
    /// to judge by: nothing is learned, and the positions stay new for the next time.
    pub fn learn(
        &mut self,
        src: &Model,
        tgt: &Model,
        pair: &ConversationPair<'_>,
    ) -> Result<Option<LearnOutcome>, LearnError> {
        let t0 = Instant::now();
        let n = pair.tokens.len();
        if pair.src.len() < n || pair.tgt.len() < n {
            return Err(LearnError::Unsupported(format!(
                "caches of {} and {} positions for a conversation of {n}",
                pair.src.len(),
                pair.tgt.len()
            )));
        }
        let start = pair.from.max(self.anchor);
        if n < start + MIN_NEW_POSITIONS {
            return Ok(None);
        }
        let held_from = start + (n - start) * 3 / 4;
        let kept: Vec<usize> = (0..pair.probes.len())
            .filter(|&i| pair.probes[i] >= held_from && pair.probes[i] < n)
            .collect();
        if kept.is_empty() {
            return Ok(None);
        }
        let probes: Vec<usize> = kept.iter().map(|&i| pair.probes[i]).collect();
        let index = Tensor::new(
            kept.iter().map(|&i| i as u32).collect::<Vec<u32>>(),
            pair.queries
                .first()
                .map_or(&candle_core::Device::Cpu, |q| q.device()),
        )?;
        let queries = pair
            .queries
            .iter()
            .map(|q| q.index_select(&index, 1))
            .collect::<Result<Vec<_>, _>>()?;
        let stretch = Stretch {
            tokens: &pair.tokens[..n],
            src: pair.src,
            tgt: pair.tgt,
            queries: &queries,
            probes: &probes,
            mapped: (held_from, n),
        };
        let calibration = match self.calibration_cosine {
            Some(c) => Some(c),
            None => self.calibration_score(&self.mapper, src, tgt)?,
        };
        self.calibration_cosine = calibration;
        let before = HeldOutScores {
            conversation: stretch.cosine(&self.mapper, src, tgt)?,
            calibration,
        };

        let fs = WindowFeatures::of(pair.src, src.decoder.rope(), start, held_from, 1)?;
        let ft = WindowFeatures::of(pair.tgt, tgt.decoder.rope(), start, held_from, 1)?;
        let update = Update {
            source: fs,
            target: ft,
        };
        let (a, b) = update.ordered(self.total.direction);
        let rows = self.total.rows(a, b)?;
        let mapper = self.solve(src, tgt, Some(&rows))?;
        drop(rows);
        let after = HeldOutScores {
            conversation: stretch.cosine(&mapper, src, tgt)?,
            calibration: self.calibration_score(&mapper, src, tgt)?,
        };
        let accepted = after.combined() >= before.combined();
        let tokens = update.source.rows;
        if accepted {
            update.add_to(&mut self.total)?;
            self.learned_tokens += tokens as u64;
            self.accepted = Some(update);
            self.mapper = mapper;
            self.calibration_cosine = after.calibration;
        }
        let learned_to = if accepted { held_from } else { pair.from };
        tracing::info!(
            tokens,
            before = before.combined(),
            after = after.combined(),
            accepted,
            "learning step"
        );
        Ok(Some(LearnOutcome {
            tokens,
            held_out: n - held_from,
            before,
            after,
            accepted,
            learned_tokens: self.learned_tokens(),
            learned_to,
            seconds: t0.elapsed().as_secs_f64(),
        }))
    }
}

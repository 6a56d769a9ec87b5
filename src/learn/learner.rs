//! One direction's learner: the calibration's statistics plus what it learned, the
//! structure to solve them with, the fixed calibration text it is judged on, and the
//! mapper in use.

use super::judge::{HeldOutScores, Slice, Stretch};
use super::refit::Structure;
use super::LearnError;
use crate::calibrate::{Direction, DirectionStats, WindowFeatures};
use crate::mapper::{CacheMapper, PairStats};
use crate::model::{KvCache, Model};
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

pub struct Learner {
    structure: Structure,
    direction: Direction,
    /// The calibration's statistics with the accepted updates added.
    total: DirectionStats,
    /// The accepted updates alone, for keeping.
    learned: DirectionStats,
    calibration: Vec<Slice>,
    /// The mapper in use's cosine on `calibration`, once scored: it changes only when an
    /// update is taken, so it is not scored again for every step's "before".
    calibration_cosine: Option<f64>,
    anchor: usize,
    mapper: CacheMapper,
}

fn empty_like(d: &DirectionStats) -> Result<DirectionStats, LearnError> {
    let like = |p: &PairStats| PairStats::new(p.l_s(), p.d_s(), p.l_t(), p.d_t());
    Ok(DirectionStats {
        direction: d.direction,
        keys: like(&d.keys)?,
        values: like(&d.values)?,
        token_layers: d.token_layers,
    })
}

impl Learner {
    /// A learner over `calibration_stats` (those the mapper was fitted on) and what was
    /// `learned` before; with something learned the mapper is solved again from both.
    /// `mapper` is the calibrated mapper, whose precision the updates keep; `anchor` the
    /// leading positions the target always computes itself.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        src: &Model,
        tgt: &Model,
        structure: Structure,
        calibration_stats: DirectionStats,
        learned: Option<DirectionStats>,
        calibration: Vec<Slice>,
        anchor: usize,
        mapper: CacheMapper,
    ) -> Result<Self, LearnError> {
        let mut total = calibration_stats;
        let learned = match learned {
            Some(l) => l,
            None => empty_like(&total)?,
        };
        let mut learner = Self {
            structure,
            direction: total.direction,
            total: {
                total.keys.merge(&learned.keys)?;
                total.values.merge(&learned.values)?;
                total
            },
            learned,
            calibration,
            calibration_cosine: None,
            anchor,
            mapper,
        };
        if learner.learned.keys.count() > 0 {
            learner.mapper = learner.solve(src, tgt, &learner.total)?;
        }
        Ok(learner)
    }

    pub fn mapper(&self) -> &CacheMapper {
        &self.mapper
    }

    /// What was learned, apart from the calibration.
    pub fn learned(&self) -> &DirectionStats {
        &self.learned
    }

    pub fn learned_tokens(&self) -> u64 {
        self.learned.keys.count()
    }

    fn solve(
        &self,
        src: &Model,
        tgt: &Model,
        stats: &DirectionStats,
    ) -> Result<CacheMapper, LearnError> {
        let r = self.structure.refit(stats)?;
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
        let (first, second) = match self.direction {
            Direction::Forward => (&fs, &ft),
            Direction::Backward => (&ft, &fs),
        };
        let mut candidate = self.total.clone();
        candidate.add(first, second)?;
        let mapper = self.solve(src, tgt, &candidate)?;
        let after = HeldOutScores {
            conversation: stretch.cosine(&mapper, src, tgt)?,
            calibration: self.calibration_score(&mapper, src, tgt)?,
        };
        let accepted = after.combined() >= before.combined();
        if accepted {
            self.total = candidate;
            self.learned.add(first, second)?;
            self.mapper = mapper;
            self.calibration_cosine = after.calibration;
        }
        let learned_to = if accepted { held_from } else { pair.from };
        tracing::info!(
            tokens = fs.rows,
            before = before.combined(),
            after = after.combined(),
            accepted,
            "learning step"
        );
        Ok(Some(LearnOutcome {
            tokens: fs.rows,
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

//! The re-read as every evaluation runs it (text windows, task contexts, recall turns):
//! once the cache is handed over and the part the target reads next is known, choose
//! what to re-read under a setting and re-read it in place.

use super::EvalError;
use baton_method::handoff::reread::{decide, RereadSetting, SelectInputs};
use baton_method::handoff::HandoffPlan;
use baton_method::mapper::CacheMapper;
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::model::{KvCache, Model};
use std::time::Instant;

/// The models and mappers a re-read reads.
#[derive(Clone, Copy)]
pub struct RereadModels<'a> {
    pub source: &'a Model,
    pub target: &'a Model,
    pub mapper: &'a CacheMapper,
    /// The other direction's mapper, which only the round-trip selector needs.
    pub reverse: Option<&'a CacheMapper>,
}

/// What one re-read did.
#[derive(Debug, Clone, Copy, Default)]
pub struct RereadDone {
    /// Positions re-read.
    pub positions: usize,
    /// Positions dropped.
    pub dropped: usize,
    /// Whether the plan was predicted to cost as much as the re-prefill, so the target
    /// re-read every mapped position instead.
    pub reprefilled: bool,
    /// Choosing and re-reading, in milliseconds.
    pub ms: f64,
    /// Of which choosing.
    pub select_ms: f64,
}

/// One handed cache and what the target reads next.
pub struct RereadTurn<'a> {
    /// The handed cache's description, without any held part: its mapped middle is what
    /// may be re-read, and what it reads after the middle (the tail, a question) is read
    /// again over the re-read middle, in the same pass. Build the cache from
    /// [`HandoffPlan::tail_mapped`] where the source holds the tail, so that it is read
    /// once.
    pub plan: HandoffPlan,
    /// The source's own cache, holding at least `history` positions.
    pub source_cache: &'a KvCache,
    /// The history followed by the message: what the selectors read.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the history; the rest is the message.
    pub history: usize,
    /// The target's prefill speed, which a time budget is spent at.
    pub ms_per_position: Option<f64>,
}

impl RereadModels<'_> {
    /// Choose under `setting` with the message known and re-read `cache` in place.
    /// `cache` holds `turn.plan`'s positions as handed over.
    pub fn reread(
        &self,
        setting: &RereadSetting,
        turn: RereadTurn<'_>,
        cache: &mut KvCache,
    ) -> Result<RereadDone, EvalError> {
        if turn.history >= turn.tokens.len() {
            return Err(EvalError::Input(
                "a re-read chooses with the next message known, and here the target reads \
                 nothing after the mapped part: give it a tail (--tail N) or the question \
                 to read (--target-reads-question)"
                    .into(),
            ));
        }
        let started = Instant::now();
        let select = SelectInputs {
            source: self.source,
            source_cache: turn.source_cache,
            target: self.target,
            handed: cache,
            mapper: self.mapper,
            reverse: self.reverse,
            tokens: turn.tokens,
            history: turn.history,
        };
        let candidates = turn.plan.mapped();
        let candidates = PositionSet::of([candidates.start..candidates.end.min(turn.history)]);
        let choice = decide(setting, &select, &candidates, turn.ms_per_position)
            .map_err(|e| EvalError::Input(e.to_string()))?;
        let plan = turn
            .plan
            .rereading(choice.runs.clone())
            .dropping(choice.dropped.clone());
        plan.reread_in(self.target, &turn.tokens[..plan.len()], cache)?;
        Ok(RereadDone {
            positions: plan.reread_count(),
            dropped: plan.dropped_count(),
            reprefilled: choice.reprefilled,
            ms: started.elapsed().as_secs_f64() * 1e3,
            select_ms: choice.select_ms,
        })
    }
}

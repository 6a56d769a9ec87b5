//! The re-read as every evaluation runs it (text windows, task contexts, recall turns):
//! once the cache is handed over and the part the target reads next is known, choose
//! what to re-read under a setting and re-read it in place.

use super::EvalError;
use crate::handoff::reread::{choose, RereadSetting, SelectInputs};
use crate::handoff::HandoffPlan;
use crate::mapper::CacheMapper;
use crate::model::{KvCache, Model};
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
    pub positions: usize,
    /// Choosing and re-reading, in milliseconds.
    pub ms: f64,
}

/// One handed cache and what the target reads next.
pub struct RereadTurn<'a> {
    /// The handed cache's description, without any held part: its mapped middle is what
    /// may be re-read, and what it reads after the middle is read again over the
    /// re-read middle.
    pub plan: HandoffPlan,
    /// The source's own cache, holding at least `history` positions.
    pub source_cache: &'a KvCache,
    /// The history followed by the message: what the selectors read.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the history; the rest is the message.
    pub history: usize,
    /// The target's prefill speed, which a time budget is spent at.
    pub ms_per_position: Option<f64>,
    /// The cache holds `plan`'s tail mapped (built without it), so the tail is re-read
    /// with the chosen spans in one pass; otherwise it was read over the middle as mapped
    /// and is read again over the re-read middle.
    pub tail_mapped: bool,
}

impl RereadModels<'_> {
    /// Choose under `setting` with the message known and re-read `cache` in place.
    /// `cache` holds `turn.plan`'s positions as handed over (its tail too, when it has
    /// one: that is read again over the re-read middle).
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
        let candidates = candidates.start..candidates.end.min(turn.history);
        let choice = choose(setting, &select, candidates, turn.ms_per_position)
            .map_err(|e| EvalError::Input(e.to_string()))?;
        let tail = if turn.tail_mapped {
            turn.plan.read().len()
        } else {
            0
        };
        let plan = if turn.tail_mapped {
            let read = turn.plan.read();
            let mut runs = choice.runs;
            runs.retain(|r| r.end <= read.start);
            runs.push(read);
            // The tail is part of the middle now: one pass re-reads it with the spans.
            HandoffPlan::new(turn.plan.len())
                .anchor(turn.plan.own().end)
                .rereading(runs)
        } else {
            turn.plan.rereading(choice.runs)
        };
        let tokens = &turn.tokens[..plan.len()];
        plan.reread_in(self.target, tokens, cache)?;
        Ok(RereadDone {
            positions: plan.reread_count() - tail,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }
}

//! Learning from the conversation, on a thread of its own: after a switch's measurement
//! the engine holds both models' own caches of the conversation (the re-prefills it
//! compared against), and hands them here; each direction's learner adds them to its
//! statistics, solves the maps again and keeps the update only if the held-out cosine
//! does not drop (see [`baton_method::learn`]). The engine takes the new mapper when the reply
//! comes back, so a re-solve (seconds) never holds up a message or a switch: a switch maps
//! with the mapper as it stands and records which state it used (`MapperState`).
//!
//! Both directions' learners are set up when the engine starts, from the calibration's
//! saved statistics beside the artifact and what earlier sessions learned: a mapper that
//! learned before is solved again from both and replaces the calibrated one before the
//! first switch. A pair calibrated without statistics cannot learn, which is said once
//! and leaves the engine as it was.

mod calibration;
mod worker;

use super::config::LearnSetup;
use super::load::LoadedMapper;
use super::outbox::Outbox;
use super::repair::Repair;
use super::slot::Slot;
use super::EngineError;
use baton_protocol::{CacheOrigin, Event, MapperState, ModelName};
use baton_runtime::model::{KvCache, Model};
use candle_core::Tensor;
use std::sync::Arc;
use std::time::Duration;
use worker::{Job, Reply, Task, Worker};

/// Both models' own caches of a switch's first `n` ids, from its measurement: the
/// target's re-prefill and the source's, each with its queries at `probes`.
pub(super) struct OwnCaches {
    pub index: u32,
    pub turn: u32,
    pub source: usize,
    pub n: usize,
    pub probes: Vec<usize>,
    pub target_own: (KvCache, Vec<Tensor>),
    pub source_own: (KvCache, Vec<Tensor>),
}

/// Learning as the engine sees it: the thread and, per direction (indexed by the
/// source slot), whether it can learn, how far this conversation is learned, and which
/// state of the mapper is in use.
pub(super) struct Learning {
    worker: Option<Worker>,
    can_learn: [bool; 2],
    learned_to: [usize; 2],
    state: [MapperState; 2],
    /// Where the conversation is recorded, named with what is learned from it.
    pub(super) session_label: String,
    /// Calibration read while the engine is idle, per direction (`None`: off).
    background: Option<[Background; 2]>,
}

/// How far a direction's background calibration got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Background {
    Reading { windows: usize },
    Done,
}

/// What applying the learning thread's replies may touch.
pub(super) struct LearnCx<'a> {
    pub mappers: &'a mut [LoadedMapper; 2],
    pub names: [ModelName; 2],
    pub out: &'a mut Outbox,
}

impl Learning {
    /// No learning thread: the mappers stay as they are.
    pub fn off() -> Self {
        Self {
            worker: None,
            can_learn: [false; 2],
            learned_to: [0; 2],
            state: [MapperState::default(); 2],
            session_label: "an unrecorded session".into(),
            background: None,
        }
    }

    /// Start the learning thread; both directions' learners are set up on it at once, in
    /// the background.
    pub fn start(
        &mut self,
        models: [Arc<Model>; 2],
        mapper_dir: baton_method::mapper::dir::MapperDir,
        setup: LearnSetup,
        anchor: usize,
    ) {
        let background = setup.background_calibration;
        self.worker = Worker::spawn(models, mapper_dir, setup, anchor);
        self.can_learn = [self.worker.is_some(); 2];
        self.background = background.then_some([Background::Reading { windows: 0 }; 2]);
    }

    /// Whether the engine, idle, should have the next calibration window read: the
    /// thread has nothing else to do and a direction that learns has text left.
    pub fn calibration_wanted(&self) -> bool {
        self.next_to_calibrate().is_some() && !self.busy()
    }

    fn next_to_calibrate(&self) -> Option<usize> {
        let background = self.background.as_ref()?;
        self.worker.as_ref()?;
        (0..2)
            .filter(|&s| self.can_learn[s])
            .filter_map(|s| match background[s] {
                Background::Reading { windows } => Some((windows, s)),
                Background::Done => None,
            })
            .min()
            .map(|(_, s)| s)
    }

    /// Have the direction that has read the least read its next window.
    pub fn calibrate_next(&mut self) {
        let Some(source) = self.next_to_calibrate() else {
            return;
        };
        if let Some(w) = self.worker.as_mut() {
            w.send(Task::Calibrate { source });
        }
    }

    /// A message or a switch is waiting: a calibration window being read stops (and is
    /// read again later).
    pub fn give_way(&self) {
        if let Some(w) = &self.worker {
            w.give_way();
        }
    }

    /// Whether a switch measured now would be learned from (in either direction), with
    /// learning `on`.
    pub fn will_learn(&self, on: bool) -> bool {
        on && self.worker.is_some() && self.can_learn.iter().any(|&c| c)
    }

    /// Whether the mapper of `source -> other` is being set up or taught.
    pub fn busy_with(&self, source: usize) -> bool {
        self.worker.as_ref().is_some_and(|w| w.busy_with(source))
    }

    pub fn busy(&self) -> bool {
        self.worker.as_ref().is_some_and(Worker::busy)
    }

    /// The state of the mapper of `source -> other` in use.
    pub fn state(&self, source: usize) -> MapperState {
        self.state[source]
    }

    /// Apply the learning thread's replies that are there, waiting up to `wait` for one.
    pub fn take(&mut self, wait: Duration, cx: &mut LearnCx<'_>) {
        let mut wait = wait;
        while let Some(reply) = self.worker.as_mut().and_then(|w| w.reply(wait)) {
            self.apply(reply, cx);
            wait = Duration::ZERO;
        }
    }

    /// Hand a measured switch's caches to the learning thread: the direction of the
    /// next switch (target to source) first, then the one just used, so that the next
    /// switch is the likelier to find its own direction's update ready. Each is also its
    /// model's own cache of the first `n` ids: where a truth holds less, it saves the
    /// next reference path that work.
    pub fn learn_from(
        &mut self,
        own: OwnCaches,
        history: &[u32],
        slots: &mut [Slot; 2],
    ) -> Result<(), EngineError> {
        let OwnCaches {
            index,
            turn,
            source,
            n,
            probes,
            target_own,
            source_own,
        } = own;
        let target = 1 - source;
        let (tc, tq) = target_own;
        let (sc, sq) = source_own;
        for (slot, cache) in [(target, &tc), (source, &sc)] {
            if slots[slot].truth.len() < cache.len() {
                slots[slot].truth = cache.try_clone()?;
            }
        }
        let Some(worker) = self.worker.as_mut() else {
            return Ok(());
        };
        let tokens = Arc::new(history[..n].to_vec());
        let probes = Arc::new(probes);
        let (tc, sc) = (Arc::new(tc), Arc::new(sc));
        let ways = [(target, &tc, &sc, sq), (source, &sc, &tc, tq)];
        for (from_slot, src, tgt, queries) in ways {
            if !self.can_learn[from_slot] {
                continue;
            }
            worker.send(Task::Learn(Job {
                source: from_slot,
                index,
                turn,
                label: format!("{}, switch {index}", self.session_label),
                tokens: Arc::clone(&tokens),
                src: Arc::clone(src),
                tgt: Arc::clone(tgt),
                queries: Arc::new(queries),
                probes: Arc::clone(&probes),
                from: self.learned_to[from_slot],
            }));
        }
        Ok(())
    }

    /// Hand a completed repair to the learning thread: the repaired cache is the target's
    /// own, with its queries at the positions it kept them; the other model's own cache
    /// of a prefix (its primary if it computed it all, else its truth) is the source's.
    pub fn learn_from_repair(
        &mut self,
        job: &Repair,
        history: &[u32],
        slots: &[Slot; 2],
    ) -> Result<(), EngineError> {
        let target = job.slot;
        let source = 1 - target;
        if !self.can_learn[source] || job.probes.is_empty() {
            return Ok(());
        }
        let Some(worker) = self.worker.as_mut() else {
            return Ok(());
        };
        let src = &slots[source];
        let own = match src.origin {
            CacheOrigin::True => &src.primary,
            _ => &src.truth,
        };
        let n = own.len().min(slots[target].primary.len());
        let keep: Vec<u32> = (0..job.probes.len())
            .filter(|&i| job.probes[i] < n)
            .map(|i| i as u32)
            .collect();
        if n < baton_method::learn::MIN_NEW_POSITIONS || keep.is_empty() {
            return Ok(());
        }
        let probes: Vec<usize> = keep.iter().map(|&i| job.probes[i as usize]).collect();
        let mut queries = Vec::with_capacity(job.queries.len());
        for per_chunk in &job.queries {
            let all = Tensor::cat(per_chunk, 1)?;
            let index = Tensor::new(keep.as_slice(), all.device())?;
            queries.push(all.index_select(&index, 1)?);
        }
        worker.send(Task::Learn(Job {
            source,
            index: job.index,
            turn: job.turn,
            label: format!("{}, repair after switch {}", self.session_label, job.index),
            tokens: Arc::new(history[..n].to_vec()),
            src: Arc::new(own.try_clone_prefix(n)?),
            tgt: Arc::new(slots[target].primary.try_clone_prefix(n)?),
            queries: Arc::new(queries),
            probes: Arc::new(probes),
            from: self.learned_to[source],
        }));
        Ok(())
    }

    fn apply(&mut self, reply: Reply, cx: &mut LearnCx<'_>) {
        let name = |source: usize| (cx.names[source].clone(), cx.names[1 - source].clone());
        match reply {
            Reply::Opened {
                source,
                mapper,
                learned_tokens,
                updates,
                not_applied,
            } => {
                if not_applied > 0 {
                    let (a, b) = name(source);
                    cx.out.emit(Event::Notice {
                        message: format!(
                            "mapper {a} -> {b}: {not_applied} updates kept beside it are not applied to it (learned on a mapper a calibration has replaced since, or a calibration window kept twice); `baton mappers --reset-learned` removes them"
                        ),
                    });
                }
                if let Some(m) = mapper {
                    cx.mappers[source].mapper = *m;
                    self.state[source] = MapperState {
                        updates: u32::try_from(updates).unwrap_or(u32::MAX),
                        learned_tokens,
                    };
                    let (a, b) = name(source);
                    cx.out.emit(Event::Notice {
                        message: format!(
                            "mapper {a} -> {b} starts from what it learned before: {learned_tokens} positions in {updates} updates (`baton mappers --reset-learned` returns it to its calibration)"
                        ),
                    });
                }
            }
            Reply::Learned {
                source,
                index,
                turn,
                outcome,
                mapper,
                kept,
            } => {
                self.learned_to[source] = outcome.learned_to;
                if let Some(m) = mapper {
                    cx.mappers[source].mapper = *m;
                    let state = &mut self.state[source];
                    state.updates = state.updates.saturating_add(1);
                    state.learned_tokens = outcome.learned_tokens;
                }
                let (from, to) = name(source);
                let mut saved = false;
                match kept {
                    Some(Ok(dir)) => {
                        tracing::info!("learned statistics kept in {}", dir.display());
                        saved = true;
                    }
                    Some(Err(e)) => cx.out.emit(Event::Error {
                        message: format!(
                            "what {from} -> {to} learned is in use but could not be kept for the next session: {e}"
                        ),
                        fatal: false,
                    }),
                    None => {}
                }
                let o = *outcome;
                cx.out.emit(Event::MapperLearned {
                    index,
                    turn,
                    from,
                    to,
                    tokens: o.tokens,
                    held_out: o.held_out,
                    before: o.before.combined(),
                    after: o.after.combined(),
                    conversation_before: o.before.conversation,
                    conversation_after: o.after.conversation,
                    calibration_before: o.before.calibration,
                    calibration_after: o.after.calibration,
                    accepted: o.accepted,
                    learned_tokens: o.learned_tokens,
                    seconds: o.seconds,
                    kept: saved,
                });
            }
            Reply::Calibrated {
                source,
                windows,
                full,
                outcome,
                mapper,
                kept,
            } => {
                let (from, to) = name(source);
                if let Some(m) = mapper {
                    cx.mappers[source].mapper = *m;
                    let state = &mut self.state[source];
                    state.updates = state.updates.saturating_add(1);
                    state.learned_tokens = outcome.as_ref().map_or(0, |o| o.learned_tokens);
                }
                if let Some(Err(e)) = &kept {
                    cx.out.emit(Event::Error {
                        message: format!(
                            "what {from} -> {to} took from the calibration text is in use but could not be kept for the next session: {e}"
                        ),
                        fatal: false,
                    });
                }
                let done = windows >= full;
                if let Some(b) = self.background.as_mut() {
                    b[source] = if done {
                        Background::Done
                    } else {
                        Background::Reading { windows }
                    };
                }
                // A window with no probe to judge by was read but weighed nothing.
                let (accepted, before, after) = outcome.map_or((false, f64::NAN, f64::NAN), |o| {
                    (o.accepted, o.before.combined(), o.after.combined())
                });
                cx.out.emit(Event::BackgroundCalibration {
                    from: from.clone(),
                    to: to.clone(),
                    windows,
                    full,
                    accepted,
                    before,
                    after,
                    kept: matches!(kept, Some(Ok(_))),
                });
                if done {
                    cx.out.emit(Event::Notice {
                        message: format!(
                            "mapper {from} -> {to} has read as much calibration text as the full calibration ({full} windows): background calibration stops"
                        ),
                    });
                }
            }
            Reply::GaveWay { source } => {
                tracing::debug!("background calibration of slot {source}'s mapper gave way");
            }
            Reply::CalibrationDone {
                source,
                read_elsewhere,
            } => {
                let reading = matches!(
                    self.background.as_ref().map(|b| b[source]),
                    Some(Background::Reading { .. })
                );
                if read_elsewhere > 0 && reading {
                    let (from, to) = name(source);
                    cx.out.emit(Event::Notice {
                        message: format!(
                            "mapper {from} -> {to} has read every calibration window left ({read_elsewhere} of them read by another workbench on this mapper directory): background calibration stops"
                        ),
                    });
                }
                if let Some(b) = self.background.as_mut() {
                    b[source] = Background::Done;
                }
            }
            Reply::NothingNew { source } => {
                tracing::info!("learning: too little new text for slot {source}'s mapper");
            }
            Reply::Unavailable { source, reason } => {
                self.can_learn[source] = false;
                let (a, b) = name(source);
                cx.out.emit(Event::Notice {
                    message: format!("{a} -> {b} does not learn: {reason}"),
                });
            }
            Reply::Failed { source, reason } => {
                let (a, b) = name(source);
                cx.out.emit(Event::Error {
                    message: format!(
                        "learning {a} -> {b} failed (the mapper is as it was): {reason}"
                    ),
                    fatal: false,
                });
            }
        }
    }
}

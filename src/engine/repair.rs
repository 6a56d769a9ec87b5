//! Repair in the background: after a switch the active model's cache is mapped (and
//! what it generated since was computed over mapped positions). While the engine is
//! idle, the model re-prefills the conversation into a cache of its own, a chunk at a
//! time, and after every chunk the cache in use becomes that exact prefix followed by
//! the positions it does not cover yet: at every moment a valid cache, and once the
//! prefix covers everything, the model's own.
//!
//! It gives way as the measurement does: a message waiting stops the chunk in progress
//! at the next half layer (the chunk is thrown away and read again later), and it starts
//! only once the switch's measurement is done, since the measurement compares the
//! handed-over cache as it was. It starts from the model's truth (its own prefill of a
//! prefix, which the reference path keeps), so with the reference path on only what was
//! said after the switch's measurement is left to read.

use super::core::{synced_ms, Engine, Envelope};
use super::EngineError;
use crate::model::{ForwardOptions, KvCache, Logits, ModelError};
use crate::protocol::{CacheOrigin, Command, Event};
use candle_core::Tensor;
use std::cell::RefCell;
use std::sync::mpsc::Receiver;
use std::time::Instant;

/// Positions re-prefilled per step: long enough to run at prefill speed, short enough
/// that the cache in use improves every second or so on a CPU.
pub const REPAIR_CHUNK: usize = 128;

/// The repair of one slot's cache after a switch.
pub(super) struct Repair {
    pub(super) slot: usize,
    /// The switch it follows, its turn, and when its handoff was done.
    pub(super) index: u32,
    pub(super) turn: u32,
    since: Instant,
    /// The model's own prefill of the conversation's first `exact.len()` ids.
    exact: Option<KvCache>,
    compute_ms: f64,
    /// The model's own queries at some positions it re-read, per layer and chunk: what
    /// the learner judges an update by.
    pub(super) probes: Vec<usize>,
    pub(super) queries: Vec<Vec<Tensor>>,
}

/// Positions of a chunk whose queries are kept: every 16th, enough to judge an update
/// on the newest quarter of a conversation.
const PROBE_EVERY: usize = 16;

impl Repair {
    pub(super) fn new(slot: usize, index: u32, turn: u32) -> Self {
        Self {
            slot,
            index,
            turn,
            since: Instant::now(),
            exact: None,
            compute_ms: 0.0,
            probes: Vec::new(),
            queries: Vec::new(),
        }
    }
}

impl Engine {
    /// Whether there is repair work the engine would do when idle.
    pub(super) fn repair_wanted(&self) -> bool {
        self.settings.repair
            && self.measurement.is_none()
            && self.repair.as_ref().is_some_and(|r| {
                r.slot == self.active && self.slots[r.slot].origin == CacheOrigin::Mapped
            })
    }

    /// Repair until done or until a message (or a cancel or shutdown) is waiting in
    /// `commands`, as the engine does when idle.
    pub fn repair_pending(&mut self, commands: &Receiver<Envelope>) {
        while self.repair_wanted() && !self.shutdown {
            if let Ok(e) = commands.try_recv() {
                self.inbox.push_back(e);
            }
            if !self.inbox.is_empty() {
                return;
            }
            if let Err(e) = self.repair_step(commands) {
                if !matches!(e, EngineError::Model(ModelError::Interrupted)) {
                    self.report(&e);
                    self.end_repair(false);
                }
                return;
            }
        }
    }

    /// Whether a repair is in progress (switched to, not yet complete).
    pub fn repair_in_progress(&self) -> bool {
        self.repair.is_some()
    }

    /// Re-prefill the next chunk and put it in place.
    pub(super) fn repair_step(&mut self, commands: &Receiver<Envelope>) -> Result<(), EngineError> {
        let Some(mut job) = self.repair.take() else {
            return Ok(());
        };
        let result = self.repair_chunk(&mut job, commands);
        let done = matches!(result, Ok(true));
        self.repair = Some(job);
        if done {
            self.end_repair(true);
        }
        result.map(|_| ())
    }

    /// True once the cache in use is the model's own.
    fn repair_chunk(
        &mut self,
        job: &mut Repair,
        commands: &Receiver<Envelope>,
    ) -> Result<bool, EngineError> {
        let slot = &mut self.slots[job.slot];
        let total = slot.primary.len();
        if job.exact.is_none() {
            // Its truth is its own prefill of a prefix of the same history.
            let seed = slot.truth.len().min(total);
            job.exact = Some(match seed {
                0 => slot.model.decoder.new_cache(),
                _ => slot.truth.try_clone_prefix(seed)?,
            });
        }
        let Some(exact) = job.exact.as_mut() else {
            return Ok(false);
        };
        let from = exact.len();
        let to = (from + REPAIR_CHUNK).min(total);
        if from < to {
            let drained = RefCell::new(Vec::new());
            let stop = || {
                while let Ok(e) = commands.try_recv() {
                    drained.borrow_mut().push(e);
                }
                drained.borrow().iter().any(|e| {
                    matches!(
                        e.command,
                        Command::Submit { .. } | Command::Switch | Command::Shutdown
                    )
                })
            };
            let t = Instant::now();
            let probes: Vec<usize> = (from..to).filter(|p| p % PROBE_EVERY == 0).collect();
            let read = slot.model.decoder.forward_until(
                &self.conv.history[from..to],
                exact,
                &ForwardOptions {
                    logits: Logits::None,
                    probe_positions: probes.clone(),
                },
                &stop,
            );
            self.inbox.extend(drained.into_inner());
            let out = match read {
                Ok(out) => out,
                Err(e) => {
                    // Half a chunk is not a prefix of anything.
                    exact.truncate(from);
                    return Err(e.into());
                }
            };
            job.compute_ms += synced_ms(slot.model.decoder.device(), t);
            if !probes.is_empty() {
                job.queries.resize(out.queries.len(), Vec::new());
                for (l, q) in out.queries.into_iter().enumerate() {
                    job.queries[l].push(q);
                }
                job.probes.extend(probes);
            }
            // The exact prefix, then what it does not cover yet as it was.
            let mut spliced = exact.try_clone()?;
            if to < total {
                let rest = (0..slot.model.config().n_layer)
                    .map(|l| slot.primary.layer_range(l, to, total))
                    .collect::<Result<Vec<_>, _>>()?;
                spliced.extend_with(&rest)?;
            }
            slot.primary = spliced;
        }
        let name = slot.name();
        self.out.emit(Event::RepairProgress {
            model: name,
            repaired: to,
            total,
        });
        Ok(to >= total)
    }

    /// Say how the repair ended and forget it; a complete one makes the cache in use
    /// the model's own (and its truth, where that held less), and is learned from.
    pub(super) fn end_repair(&mut self, complete: bool) {
        let Some(job) = self.repair.take() else {
            return;
        };
        if job.exact.is_none() {
            // It never ran (repair was off): there is nothing to say.
            return;
        }
        let slot = &mut self.slots[job.slot];
        let total = slot.primary.len();
        let repaired = job.exact.as_ref().map_or(0, KvCache::len).min(total);
        if complete {
            slot.origin = CacheOrigin::True;
            if slot.truth.len() < total {
                if let Ok(c) = slot.primary.try_clone() {
                    slot.truth = c;
                }
            }
        }
        let model = slot.name();
        self.out.emit(Event::CacheRepaired {
            index: job.index,
            turn: job.turn,
            model,
            repaired,
            total,
            complete,
            after_switch_ms: job.since.elapsed().as_secs_f64() * 1e3,
            compute_ms: job.compute_ms,
        });
        if complete {
            // The repaired cache is the model's own: with the other model's own cache of
            // the same ids it is a pair to learn from, reference path or not.
            if let Err(e) = self.learn_from_repair(job) {
                self.report(&e);
            }
        }
    }
}

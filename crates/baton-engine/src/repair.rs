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

use super::slot::Slot;
use super::timing::synced_ms;
use super::EngineError;
use baton_protocol::{CacheOrigin, Event};
use baton_runtime::model::{ForwardOptions, KvCache, Logits};
use candle_core::Tensor;
use std::time::Instant;

/// Positions re-prefilled per step: long enough to run at prefill speed, short enough
/// that the cache in use improves every second or so on a CPU.
pub const REPAIR_CHUNK: usize = 128;

/// The repair of one slot's cache after a switch.
pub struct Repair {
    pub(super) slot: usize,
    /// The switch it follows, its turn, and when its handoff was done.
    pub(super) index: u32,
    pub(super) turn: u32,
    since: Instant,
    /// How many first positions of the handed-over cache the model computed itself
    /// (what it held of the conversation when it was last active): exact already.
    own: usize,
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
    pub(super) fn new(slot: usize, index: u32, turn: u32, own: usize) -> Self {
        Self {
            slot,
            index,
            turn,
            since: Instant::now(),
            own,
            exact: None,
            compute_ms: 0.0,
            probes: Vec::new(),
            queries: Vec::new(),
        }
    }
}

impl Repair {
    /// Whether the cache it repairs still needs it: `slot` is the active one and mapped.
    pub(super) fn wanted(&self, active: usize, origin: CacheOrigin) -> bool {
        self.slot == active && origin == CacheOrigin::Mapped
    }

    /// How many first positions of the cache in use are the model's own prefill.
    pub(super) fn exact_prefix(&self) -> usize {
        self.exact.as_ref().map_or(self.own, |e| e.len())
    }

    /// Re-prefill the next chunk of `slot`'s conversation (`history`) and put it in
    /// place; the progress to report, and whether the cache in use is now the model's
    /// own. A chunk that `stop` interrupts is thrown away.
    pub(super) fn step(
        &mut self,
        slot: &mut Slot,
        history: &[u32],
        stop: &dyn Fn() -> bool,
    ) -> Result<(Event, bool), EngineError> {
        let job = self;
        let total = slot.primary.len();
        if job.exact.is_none() {
            // Its truth is its own prefill of a prefix of the same history, and so is
            // what it held when it was last active: start from the longer.
            let own = job.own.min(total);
            let seed = slot.truth.len().min(total);
            job.exact = Some(if own > seed {
                slot.primary.try_clone_prefix(own)?
            } else if seed > 0 {
                slot.truth.try_clone_prefix(seed)?
            } else {
                slot.model.decoder.new_cache()
            });
        }
        let Some(exact) = job.exact.as_mut() else {
            return Err(EngineError::Internal("no repair cache".into()));
        };
        // What it reads keeps the residual stream a plan's layers need, as it would have
        // reading the first time.
        if let Some(kept) = slot.primary.kept_residual() {
            exact.keep_residual(kept.layer(), kept.width());
        }
        let from = exact.len();
        let to = (from + REPAIR_CHUNK).min(total);
        if from < to {
            let t = Instant::now();
            let probes: Vec<usize> = (from..to).filter(|p| p % PROBE_EVERY == 0).collect();
            let read = slot.model.decoder.forward_until(
                &history[from..to],
                exact,
                &ForwardOptions {
                    logits: Logits::None,
                    probe_positions: probes.clone(),
                },
                stop,
            );
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
                spliced.extend_from(&slot.primary, to, total)?;
            }
            slot.primary = spliced;
        } else if exact.len() >= total && total > 0 {
            // Its truth already covered everything: that is the cache in use now.
            slot.primary = exact.try_clone_prefix(total)?;
        }
        let progress = Event::RepairProgress {
            model: slot.name(),
            repaired: to,
            total,
        };
        Ok((progress, to >= total))
    }

    /// How the repair ended: also when no chunk was read yet, with repair on (`enabled`),
    /// so that every repair a session starts has its end recorded; `None` when it never
    /// ran because repair was off. A complete one makes the cache in use the model's own
    /// (and its truth, where that held less).
    pub(super) fn end(&self, slot: &mut Slot, complete: bool, enabled: bool) -> Option<Event> {
        if self.exact.is_none() && !enabled {
            return None;
        }
        let total = slot.primary.len();
        let repaired = self.exact_prefix().min(total);
        if complete {
            slot.origin = CacheOrigin::True;
            if slot.truth.len() < total {
                if let Ok(c) = slot.primary.try_clone() {
                    slot.truth = c;
                }
            }
        }
        Some(Event::CacheRepaired {
            index: self.index,
            turn: self.turn,
            model: slot.name(),
            repaired,
            total,
            complete,
            after_switch_ms: self.since.elapsed().as_secs_f64() * 1e3,
            compute_ms: self.compute_ms,
        })
    }
}

//! A switch's measurement, after its handoff: the whole cache mapped again and timed,
//! the target's full and suffix re-prefill, and the per-layer metrics of the handed-over
//! cache against the re-prefilled one. It runs a step at a time (one map, one prefill or
//! one layer's metrics), looking at the commands between steps and, inside a prefill,
//! before every layer, so that a message sent meanwhile waits for one layer's work at
//! most: the measurement is then put aside and resumes once the engine is idle again.
//! An interrupted prefill is thrown away and run again whole, so the re-prefill time
//! reported is always that of one uninterrupted prefill.
//!
//! It reads only what stays put until it is done: the positions `0..n` of both models'
//! primary caches (turns and pre-maps only append) and the history's first `n` ids. The
//! next switch would change them, so a switch first lets the measurement finish.

use super::learning::OwnCaches;
use super::load::LoadedMapper;
use super::slot::Slot;
use super::switch::{empty_metrics, estimate, layer_metrics, Handoff};
use super::timing::synced_ms;
use super::EngineError;
use baton_protocol::{Event, SwitchMetrics, SwitchTimings};
use baton_runtime::model::{ForwardOptions, KvCache, Logits};
use candle_core::Tensor;
use std::time::Instant;

/// A switch's measurement and how far it got.
pub struct Measurement {
    index: u32,
    turn: u32,
    source: usize,
    target: usize,
    n: usize,
    /// How many positions the target's truth held at the handoff: the suffix to
    /// re-prefill starts there.
    seen: usize,
    probes: Vec<usize>,
    /// The reference path was on at the switch: re-prefill and compare.
    reference: bool,
    /// The gate re-prefilled at the handoff: there is no mapped cache in use to
    /// compare, so the metrics describe the whole cache mapped afresh.
    reprefilled: bool,
    timings: SwitchTimings,
    map_full_done: bool,
    mapped_full: Option<KvCache>,
    /// The target's own prefill of the first `n` ids, with its queries at the probes.
    fresh: Option<(KvCache, Vec<Tensor>)>,
    suffix_done: bool,
    metrics: Option<SwitchMetrics>,
    /// Learn from the conversation once measured: the source's own prefill of the same
    /// ids, with its queries at the probes, is needed as well.
    learn: bool,
    source_own: Option<(KvCache, Vec<Tensor>)>,
    /// The estimate without a re-prefill, made now when the handoff did not need it.
    estimate: Option<baton_protocol::SwitchEstimate>,
    estimated: bool,
    /// Turns that went ahead of it.
    yielded_to: Vec<u32>,
    /// Its own copies of the switch's positions of the source's cache (for the estimate
    /// and the whole map) and of the cache handed to the target (for the per-layer
    /// measures), taken when a later switch was about to rebuild that slot's cache
    /// before they were read (see [`Measurement::detach`]).
    own_source: Option<KvCache>,
    own_handed: Option<KvCache>,
}

/// What a measurement step may touch: both slots (the target's truth grows in place
/// when the suffix is re-prefilled), the mappers, the conversation's ids and the anchor.
pub(super) struct MeasureCx<'a> {
    pub slots: &'a mut [Slot; 2],
    pub mappers: &'a [LoadedMapper; 2],
    pub history: &'a [u32],
    pub anchor: usize,
}

/// A finished measurement: its event, and what the engine keeps of it.
pub(super) struct Measured {
    pub event: Event,
    /// The mean attention cosine measured, for the gate's next decision that way.
    pub cosine: Option<(usize, f64)>,
    /// Both models' own caches of the switch's ids, to learn from.
    pub learn: Option<OwnCaches>,
    /// The target's own cache of the switch's ids (when not learned from), for its truth.
    pub fresh: Option<(usize, KvCache)>,
}

enum Step {
    Estimate,
    MapFull,
    ReprefillFull,
    ReprefillSuffix,
    Layer(usize),
    SourcePrefill,
    Done,
}

impl Measurement {
    pub(super) fn new(
        h: Handoff,
        seen: usize,
        probes: Vec<usize>,
        reference: bool,
        learn: bool,
    ) -> Self {
        Self {
            index: h.index,
            turn: h.turn,
            source: h.source,
            target: h.target,
            n: h.context_tokens,
            seen,
            probes,
            reference,
            reprefilled: h.reprefilled,
            timings: h.timings,
            map_full_done: false,
            mapped_full: None,
            fresh: None,
            suffix_done: false,
            metrics: None,
            learn: learn && reference,
            source_own: None,
            estimate: None,
            estimated: h.estimated,
            yielded_to: Vec::new(),
            own_source: None,
            own_handed: None,
        }
    }

    /// Copy what the measurement still reads of slot `rebuilt`'s cache, which the next
    /// switch is about to rebuild, so that the switch need not wait for it to finish.
    /// Only a switch rebuilds the first `n` positions of a cache (turns and pre-maps
    /// append; a repair waits for the measurements), so only that slot's is copied, and
    /// only what is still to be read; the re-prefills and the source's own prefill read
    /// the conversation's ids alone.
    pub(super) fn detach(&mut self, slots: &[Slot; 2], rebuilt: usize) -> Result<(), EngineError> {
        let cache = &slots[rebuilt].primary;
        let source_unread = !self.estimated || !self.map_full_done;
        if rebuilt == self.source && source_unread && self.own_source.is_none() {
            self.own_source = Some(cache.try_clone_prefix(self.n)?);
        }
        let handed_unread = self.reference && !self.reprefilled;
        if rebuilt == self.target && handed_unread && self.own_handed.is_none() {
            self.own_handed = Some(cache.try_clone_prefix(self.n)?);
        }
        Ok(())
    }

    /// The source's cache of the switch's positions: its own copy once detached.
    fn source_cache<'a>(&'a self, slots: &'a [Slot; 2]) -> &'a KvCache {
        self.own_source
            .as_ref()
            .unwrap_or(&slots[self.source].primary)
    }

    /// A turn went ahead of the measurement.
    pub(super) fn yielded_to(&mut self, turn: u32) {
        self.yielded_to.push(turn);
    }

    fn next(&self, n_layer: usize) -> Step {
        if !self.estimated {
            return Step::Estimate;
        }
        if !self.map_full_done {
            return Step::MapFull;
        }
        if !self.reference {
            return Step::Done;
        }
        if self.fresh.is_none() {
            return Step::ReprefillFull;
        }
        if !self.suffix_done {
            return Step::ReprefillSuffix;
        }
        let layers = self
            .metrics
            .as_ref()
            .map_or(0, |m| m.attention_cosine.len());
        if layers < n_layer {
            Step::Layer(layers)
        } else if self.learn && self.source_own.is_none() {
            Step::SourcePrefill
        } else {
            Step::Done
        }
    }
}

impl Measurement {
    /// One step of the measurement; true once it is complete. A prefill gives up with
    /// [`baton_runtime::model::ModelError::Interrupted`] as soon as `stop` says so.
    pub(super) fn step(
        &mut self,
        cx: MeasureCx<'_>,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool, EngineError> {
        let n_layer = cx.slots[self.target].model.config().n_layer;
        let history = &cx.history[..self.n];
        match self.next(n_layer) {
            Step::Estimate => {
                let cache = self.source_cache(cx.slots);
                let e = estimate(cx.slots, cx.mappers, cache, history, cx.anchor, self.source)?;
                self.estimate = e;
                self.estimated = true;
            }
            Step::MapFull => self.map_full(&cx, history)?,
            Step::ReprefillFull => {
                let tgt = &cx.slots[self.target];
                let t = Instant::now();
                let fresh = self.prefill_with_probes(tgt, history, stop)?;
                self.timings.reprefill_full_ms = Some(synced_ms(tgt.model.decoder.device(), t));
                self.fresh = Some(fresh);
            }
            Step::ReprefillSuffix => {
                self.reprefill_suffix(&mut cx.slots[self.target], history, stop)?;
                self.suffix_done = true;
            }
            Step::Layer(l) => self.layer(&cx.slots[self.target], l)?,
            Step::SourcePrefill => {
                let own = self.prefill_with_probes(&cx.slots[self.source], history, stop)?;
                self.source_own = Some(own);
            }
            Step::Done => return Ok(true),
        }
        Ok(matches!(self.next(n_layer), Step::Done))
    }

    /// The whole handed-over cache mapped again, timed.
    fn map_full(&mut self, cx: &MeasureCx<'_>, history: &[u32]) -> Result<(), EngineError> {
        let n = self.n;
        let (src, tgt) = (&cx.slots[self.source], &cx.slots[self.target]);
        // The source may hold more than `n` positions by now (a pre-map): map a copy of
        // exactly the switch's, so the time is that of the whole cache.
        let held = self.source_cache(cx.slots);
        let copy;
        let cache = if held.len() == n {
            held
        } else {
            copy = held.try_clone_prefix(n)?;
            &copy
        };
        if cache.len() != n {
            return Err(EngineError::Internal(format!(
                "the source cache holds {} positions, the switch handed over {n}",
                cache.len()
            )));
        }
        let mapper = &cx.mappers[self.source].mapper;
        let t = Instant::now();
        let full = mapper.map_cache(
            cache,
            history,
            src.model.decoder.rope(),
            tgt.model.decoder.rope(),
        )?;
        self.timings.map_full_ms = Some(synced_ms(tgt.model.decoder.device(), t));
        self.map_full_done = true;
        if self.reprefilled && self.reference {
            self.mapped_full = Some(full);
        }
        Ok(())
    }

    /// `slot`'s own prefill of `history`, with its queries at the probes.
    fn prefill_with_probes(
        &self,
        slot: &Slot,
        history: &[u32],
        stop: &dyn Fn() -> bool,
    ) -> Result<(KvCache, Vec<Tensor>), EngineError> {
        let mut own = slot.model.decoder.new_cache();
        let out = slot.model.decoder.forward_until(
            history,
            &mut own,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: self.probes.clone(),
            },
            stop,
        )?;
        Ok((own, out.queries))
    }

    /// The target re-prefilling only what its truth had not seen at the handoff, timed.
    fn reprefill_suffix(
        &mut self,
        tgt: &mut Slot,
        history: &[u32],
        stop: &dyn Fn() -> bool,
    ) -> Result<(), EngineError> {
        let (seen, n) = (self.seen, self.n);
        let have = tgt.truth.len();
        if seen == 0 || have < seen {
            return Ok(());
        }
        // Untouched since the handoff, the truth is extended in place (the next turn's
        // reference path then finds it ready); a turn that went first has extended it
        // already, so a copy of its start is timed.
        let mut copy = None;
        if have > seen {
            copy = Some(tgt.truth.try_clone_prefix(seen)?);
        }
        let cache = copy.as_mut().unwrap_or(&mut tgt.truth);
        let t = Instant::now();
        if seen < n {
            let done = tgt.model.decoder.forward_until(
                &history[seen..],
                cache,
                &ForwardOptions::cache_only(),
                stop,
            );
            if done.is_err() {
                // The truth must not keep half a suffix.
                cache.truncate(seen);
            }
            done?;
        }
        self.timings.reprefill_suffix_ms = Some(synced_ms(tgt.model.decoder.device(), t));
        Ok(())
    }

    /// Layer `l`'s measures of the handed-over cache against the re-prefilled one.
    fn layer(&mut self, tgt: &Slot, l: usize) -> Result<(), EngineError> {
        let Some((fresh, queries)) = &self.fresh else {
            return Err(EngineError::Internal(
                "no re-prefill to compare with".into(),
            ));
        };
        let handed = self.own_handed.as_ref().unwrap_or(&tgt.primary);
        let mapped = self.mapped_full.as_ref().unwrap_or(handed);
        let gram = tgt
            .grams
            .get(l)
            .ok_or_else(|| EngineError::Internal(format!("no query Gram for layer {l}")))?;
        let n_layer = tgt.model.config().n_layer;
        let metrics = self.metrics.get_or_insert_with(|| empty_metrics(n_layer));
        layer_metrics(
            &tgt.model,
            gram,
            fresh,
            mapped,
            self.n,
            queries,
            &self.probes,
            l,
            metrics,
        )?;
        Ok(())
    }

    /// The measurement ends, complete or `stopped` (why).
    pub(super) fn finish(mut self, stopped: Option<String>) -> Measured {
        let complete = stopped.is_none();
        let metrics = self.metrics.take().filter(|_| complete && self.reference);
        let cosine = metrics
            .as_ref()
            .and_then(|m| m.cosine_mean())
            .map(|c| (self.source, c));
        let learn = self.learn && metrics.is_some();
        let (fresh, own) = (self.fresh.take(), self.source_own.take());
        let event = Event::SwitchMeasured {
            index: self.index,
            turn: self.turn,
            timings: self.timings,
            metrics,
            yielded_to: std::mem::take(&mut self.yielded_to),
            stopped,
            estimate: self.estimate,
        };
        let mut out = Measured {
            event,
            cosine,
            learn: None,
            fresh: None,
        };
        match (fresh, own) {
            (Some(fresh), Some(own)) if learn => {
                out.learn = Some(OwnCaches {
                    index: self.index,
                    turn: self.turn,
                    source: self.source,
                    n: self.n,
                    probes: std::mem::take(&mut self.probes),
                    target_own: fresh,
                    source_own: own,
                });
            }
            (Some((fresh, _)), _) => out.fresh = Some((self.target, fresh)),
            _ => {}
        }
        out
    }
}

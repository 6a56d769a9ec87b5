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

use super::core::{synced_ms, Engine, Envelope};
use super::switch::{empty_metrics, layer_metrics, Handoff};
use super::EngineError;
use crate::model::{ForwardOptions, KvCache, Logits, ModelError};
use crate::protocol::{Command, Event, SwitchMetrics, SwitchTimings};
use candle_core::Tensor;
use std::cell::RefCell;
use std::sync::mpsc::{Receiver, TryRecvError};
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
    estimate: Option<crate::protocol::SwitchEstimate>,
    estimated: bool,
    /// Turns that went ahead of it.
    pub(super) yielded_to: Vec<u32>,
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

/// What the commands that arrived say the measurement should do.
enum Poll {
    Go,
    Yield,
    Cancel,
    Stop,
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
        }
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

impl Engine {
    /// Run the pending measurement until it is done, cancelled or shut down, or, with
    /// `may_yield`, until a message is waiting (it then stays pending).
    pub(super) fn measure(&mut self, commands: &Receiver<Envelope>, may_yield: bool) {
        loop {
            match self.poll_for_measurement(commands, may_yield) {
                Poll::Go => {}
                Poll::Yield | Poll::Stop => return,
                Poll::Cancel => {
                    if let Some(job) = self.measurement.take() {
                        self.finish_measurement(job, Some("cancelled".into()));
                    }
                    return;
                }
            }
            let Some(mut job) = self.measurement.take() else {
                return;
            };
            let drained = RefCell::new(Vec::new());
            let stop = || {
                while let Ok(e) = commands.try_recv() {
                    drained.borrow_mut().push(e);
                }
                drained.borrow().iter().any(|e| match e.command {
                    Command::Cancel | Command::Shutdown => true,
                    Command::Submit { .. } => may_yield,
                    _ => false,
                })
            };
            let result = self.measure_step(&mut job, &stop);
            // What arrived during the step is taken as if it had arrived after it.
            self.inbox.extend(drained.into_inner());
            match result {
                Ok(true) => {
                    self.finish_measurement(job, None);
                    return;
                }
                Ok(false) | Err(EngineError::Model(ModelError::Interrupted)) => {
                    self.measurement = Some(job)
                }
                Err(e) => {
                    self.report(&e);
                    self.finish_measurement(job, Some(format!("failed: {e}")));
                    return;
                }
            }
        }
    }

    /// Take what arrived: a cancel or a shutdown ends the measurement, a bookmark or a
    /// reference toggle is carried out at once (they touch no cache), messages and
    /// switches wait in the queue.
    fn poll_for_measurement(&mut self, commands: &Receiver<Envelope>, may_yield: bool) -> Poll {
        loop {
            let next = match self.inbox.pop_front() {
                Some(e) => Ok(e),
                None => commands.try_recv(),
            };
            match next {
                Ok(e) => match e.command {
                    Command::Cancel => return Poll::Cancel,
                    Command::Shutdown => {
                        self.shutdown = true;
                        return Poll::Stop;
                    }
                    Command::Bookmark { .. }
                    | Command::SetReference { .. }
                    | Command::SetRepair { .. } => self.handle(e, commands),
                    Command::Submit { .. } | Command::Switch | Command::Finish => {
                        self.queued.push_back(e)
                    }
                },
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.shutdown = true;
                    return Poll::Stop;
                }
            }
        }
        let message_first = self
            .queued
            .front()
            .is_some_and(|e| matches!(e.command, Command::Submit { .. }));
        if may_yield && message_first {
            Poll::Yield
        } else {
            Poll::Go
        }
    }

    /// One step of `job`; true once it is complete. A prefill gives up with
    /// [`ModelError::Interrupted`] as soon as `stop` says so.
    fn measure_step(
        &mut self,
        job: &mut Measurement,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool, EngineError> {
        let n = job.n;
        let history = &self.conv.history[..n];
        let (src, tgt) = (&self.slots[job.source], &self.slots[job.target]);
        let dev = tgt.model.decoder.device();
        match job.next(tgt.model.config().n_layer) {
            Step::Estimate => {
                job.estimate = self.estimate(job.source, n)?;
                job.estimated = true;
            }
            Step::MapFull => {
                // The source may hold more than `n` positions by now (a pre-map): map a
                // copy of exactly the switch's, so the time is that of the whole cache.
                let copy;
                let cache = if src.primary.len() == n {
                    &src.primary
                } else {
                    copy = src.primary.try_clone_prefix(n)?;
                    &copy
                };
                if cache.len() != n {
                    return Err(EngineError::Internal(format!(
                        "the source cache holds {} positions, the switch handed over {n}",
                        cache.len()
                    )));
                }
                let mapper = &self.mappers[job.source].mapper;
                let t = Instant::now();
                let full = mapper.map_cache(
                    cache,
                    history,
                    src.model.decoder.rope(),
                    tgt.model.decoder.rope(),
                )?;
                job.timings.map_full_ms = Some(synced_ms(dev, t));
                job.map_full_done = true;
                if job.reprefilled && job.reference {
                    job.mapped_full = Some(full);
                }
            }
            Step::ReprefillFull => {
                let t = Instant::now();
                let mut fresh = tgt.model.decoder.new_cache();
                let out = tgt.model.decoder.forward_until(
                    history,
                    &mut fresh,
                    &ForwardOptions {
                        logits: Logits::None,
                        probe_positions: job.probes.clone(),
                    },
                    stop,
                )?;
                job.timings.reprefill_full_ms = Some(synced_ms(dev, t));
                job.fresh = Some((fresh, out.queries));
            }
            Step::ReprefillSuffix => {
                let seen = job.seen;
                if seen > 0 {
                    let tgt = &mut self.slots[job.target];
                    let have = tgt.truth.len();
                    // Untouched since the handoff, the truth is extended in place (the
                    // next turn's reference path then finds it ready); a turn that went
                    // first has extended it already, so a copy of its start is timed.
                    let mut copy = None;
                    if have > seen {
                        copy = Some(tgt.truth.try_clone_prefix(seen)?);
                    }
                    if have >= seen {
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
                        job.timings.reprefill_suffix_ms =
                            Some(synced_ms(tgt.model.decoder.device(), t));
                    }
                }
                job.suffix_done = true;
            }
            Step::Layer(l) => {
                let Some((fresh, queries)) = &job.fresh else {
                    return Err(EngineError::Internal(
                        "no re-prefill to compare with".into(),
                    ));
                };
                let mapped = job.mapped_full.as_ref().unwrap_or(&tgt.primary);
                let gram = tgt
                    .grams
                    .get(l)
                    .ok_or_else(|| EngineError::Internal(format!("no query Gram for layer {l}")))?;
                let metrics = job
                    .metrics
                    .get_or_insert_with(|| empty_metrics(tgt.model.config().n_layer));
                layer_metrics(
                    &tgt.model,
                    gram,
                    fresh,
                    mapped,
                    n,
                    queries,
                    &job.probes,
                    l,
                    metrics,
                )?;
            }
            Step::SourcePrefill => {
                let mut own = src.model.decoder.new_cache();
                let out = src.model.decoder.forward_until(
                    history,
                    &mut own,
                    &ForwardOptions {
                        logits: Logits::None,
                        probe_positions: job.probes.clone(),
                    },
                    stop,
                )?;
                job.source_own = Some((own, out.queries));
            }
            Step::Done => return Ok(true),
        }
        Ok(matches!(
            job.next(self.slots[job.target].model.config().n_layer),
            Step::Done
        ))
    }

    fn finish_measurement(&mut self, mut job: Measurement, stopped: Option<String>) {
        let complete = stopped.is_none();
        let metrics = job.metrics.take().filter(|_| complete && job.reference);
        if let Some(cosine) = metrics.as_ref().and_then(|m| m.cosine_mean()) {
            self.measured_cosine[job.source] = Some(cosine);
        }
        let learn = job.learn && metrics.is_some();
        let fresh = job.fresh.take();
        let own = job.source_own.take();
        let (index, turn, source, target, n) = (job.index, job.turn, job.source, job.target, job.n);
        let probes = std::mem::take(&mut job.probes);
        self.out.emit(Event::SwitchMeasured {
            index: job.index,
            turn: job.turn,
            timings: job.timings,
            metrics,
            yielded_to: job.yielded_to,
            stopped,
            estimate: job.estimate,
        });
        match (fresh, own) {
            (Some(fresh), Some(own)) if learn => {
                let pair = super::learning::OwnCaches {
                    index,
                    turn,
                    source,
                    n,
                    probes,
                    target_own: fresh,
                    source_own: own,
                };
                if let Err(e) = self.learn_from(pair) {
                    self.report(&e);
                }
            }
            // The re-prefill is the target's own cache of the first `n` ids: where the
            // truth holds less, it saves the next reference path that work.
            (Some((fresh, _)), _) => {
                let truth = &mut self.slots[target].truth;
                if truth.len() < fresh.len() {
                    *truth = fresh;
                }
            }
            _ => {}
        }
    }
}

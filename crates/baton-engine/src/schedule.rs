//! The engine's background work, scheduled between commands: the pending switch
//! measurement, the repair of the active model's mapped cache, and the learning
//! thread's replies. Each job owns its state and takes one step at a time through a
//! narrow view of the caches; here the engine decides when a step runs, what may
//! interrupt it, and what its result changes.
//!
//! A step looks at the commands that arrive while it runs: a measurement stops for a
//! cancel or a shutdown (and, when it may yield, for a message or a switch), a repair
//! chunk for a message, a switch or a shutdown. What arrived during a step is taken as if it had
//! arrived after it.

use super::core::Engine;
use super::measure::MeasureCx;
use super::outbox::Envelope;
use super::EngineError;
use baton_protocol::{Command, Event};
use baton_runtime::model::ModelError;
use std::cell::RefCell;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

/// What the commands that arrived say the measurement should do.
enum Poll {
    Go,
    Yield,
    Cancel,
    Stop,
}

/// Drains `commands` into a list and says whether one of them should stop the step in
/// progress.
struct Watch<'a> {
    commands: &'a Receiver<Envelope>,
    drained: RefCell<Vec<Envelope>>,
    stops: fn(&Command, bool) -> bool,
    may_yield: bool,
}

impl Watch<'_> {
    fn stop(&self) -> bool {
        while let Ok(e) = self.commands.try_recv() {
            self.drained.borrow_mut().push(e);
        }
        self.drained
            .borrow()
            .iter()
            .any(|e| (self.stops)(&e.command, self.may_yield))
    }
}

fn stops_measurement(c: &Command, may_yield: bool) -> bool {
    match c {
        Command::Cancel | Command::Shutdown => true,
        Command::Submit { .. } | Command::Switch => may_yield,
        _ => false,
    }
}

fn stops_repair(c: &Command, _: bool) -> bool {
    matches!(
        c,
        Command::Submit { .. } | Command::Switch | Command::Shutdown
    )
}

impl Engine {
    /// Run the pending measurements, oldest first, until they are done, cancelled or
    /// shut down, or, with `may_yield`, until a message is waiting (they then stay
    /// pending).
    pub(super) fn measure(&mut self, commands: &Receiver<Envelope>, may_yield: bool) {
        while !self.measurements.is_empty() {
            match self.poll_for_measurement(commands, may_yield) {
                Poll::Go => {}
                Poll::Yield | Poll::Stop => return,
                Poll::Cancel => {
                    while let Some(job) = self.measurements.pop_front() {
                        self.finish_measurement(job, Some("cancelled".into()));
                    }
                    return;
                }
            }
            let Some(mut job) = self.measurements.pop_front() else {
                return;
            };
            let watch = Watch {
                commands,
                drained: RefCell::new(Vec::new()),
                stops: stops_measurement,
                may_yield,
            };
            let cx = MeasureCx {
                slots: &mut self.slots,
                mappers: &self.mappers,
                history: &self.conv.history,
                anchor: self.settings.anchor,
            };
            let result = job.step(cx, &|| watch.stop());
            self.inbox.extend(watch.drained.into_inner());
            match result {
                Ok(true) => self.finish_measurement(job, None),
                Ok(false) | Err(EngineError::Model(ModelError::Interrupted)) => {
                    self.measurements.push_front(job)
                }
                Err(e) => {
                    self.report(&e);
                    self.finish_measurement(job, Some(format!("failed: {e}")));
                }
            }
        }
    }

    /// Take what arrived: a cancel or a shutdown ends the measurement, a bookmark or a
    /// setting's toggle is carried out at once (they touch no cache), messages and
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
                    | Command::SetRepair { .. }
                    | Command::SetReread { .. } => self.handle(e, commands),
                    Command::Submit { .. }
                    | Command::Switch
                    | Command::Finish
                    | Command::RepairTo { .. } => self.queued.push_back(e),
                },
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.shutdown = true;
                    return Poll::Stop;
                }
            }
        }
        let command_first = self
            .queued
            .front()
            .is_some_and(|e| matches!(e.command, Command::Submit { .. } | Command::Switch));
        if may_yield && command_first {
            Poll::Yield
        } else {
            Poll::Go
        }
    }

    fn finish_measurement(&mut self, job: super::measure::Measurement, stopped: Option<String>) {
        let measured = job.finish(stopped);
        if let Some((source, cosine)) = measured.cosine {
            self.measured_cosine[source] = Some(cosine);
        }
        self.out.emit(measured.event);
        if let Some(own) = measured.learn {
            if let Err(e) = self
                .learning
                .learn_from(own, &self.conv.history, &mut self.slots)
            {
                self.report(&e);
            }
        } else if let Some((target, fresh)) = measured.fresh {
            // The re-prefill is the target's own cache of the switch's ids: where the
            // truth holds less, it saves the next reference path that work.
            let truth = &mut self.slots[target].truth;
            if truth.len() < fresh.len() {
                *truth = fresh;
            }
        }
    }

    /// Whether there is repair work the engine would do when idle: with repair on, or
    /// whatever the setting, where a plan dropped positions (out of sight of every later
    /// message until they are read back).
    pub(super) fn repair_wanted(&self) -> bool {
        self.measurements.is_empty()
            && self.repair.as_ref().is_some_and(|r| {
                (self.settings.repair || self.slots[r.slot].primary.has_dropped())
                    && r.wanted(self.active, self.slots[r.slot].origin)
                    && self.repair_bound.is_none_or(|b| r.exact_prefix() < b)
            })
    }

    /// Repair until the cache in use holds at least `positions` of the model's own
    /// prefill, or the repair is complete, and say how far it got. The pending
    /// measurement runs first, as it does before any repair.
    pub(super) fn repair_to(&mut self, positions: usize, commands: &Receiver<Envelope>) {
        self.measure(commands, false);
        let paced = self.repair_bound.take();
        self.repair_bound = Some(positions);
        self.repair_pending(commands);
        self.repair_bound = paced;
        let message = match &self.repair {
            Some(r) if r.slot == self.active => format!(
                "repaired to {} of {} positions",
                r.exact_prefix(),
                self.slots[r.slot].primary.len()
            ),
            _ => "repaired to the end: no repair is underway".to_string(),
        };
        self.out.emit(Event::Notice { message });
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
        let watch = Watch {
            commands,
            drained: RefCell::new(Vec::new()),
            stops: stops_repair,
            may_yield: true,
        };
        let result = self.advance_repair(&|| watch.stop());
        self.inbox.extend(watch.drained.into_inner());
        result
    }

    /// One chunk of the repair under way (none: nothing to do), its progress said, and
    /// its end once the cache in use is the model's own.
    fn advance_repair(&mut self, stop: &dyn Fn() -> bool) -> Result<(), EngineError> {
        let Some(mut job) = self.repair.take() else {
            return Ok(());
        };
        let result = job.step(&mut self.slots[job.slot], &self.conv.history, stop);
        self.repair = Some(job);
        let (progress, done) = result?;
        self.out.emit(progress);
        if done {
            self.end_repair(true);
        }
        Ok(())
    }

    /// Before a message is answered: what a plan dropped is read back first, by the
    /// repair run to the end now (it reads in the background when the engine is idle,
    /// so the message usually finds it done), and no answer reads a history with parts
    /// out of sight. A measurement still to come keeps its own copy of the cache it
    /// measures.
    pub(super) fn read_back_dropped(&mut self) -> Result<(), EngineError> {
        let a = self.active;
        if !self.slots[a].primary.has_dropped() {
            return Ok(());
        }
        self.detach_measurements(a)?;
        while self.slots[a].primary.has_dropped()
            && self.repair.as_ref().is_some_and(|r| r.slot == a)
        {
            self.advance_repair(&|| false)?;
        }
        Ok(())
    }

    /// Say how the repair ended and forget it; a complete one is learned from: the
    /// repaired cache is the model's own and, with the other model's own cache of the
    /// same ids, a pair to learn from, reference path or not.
    pub(super) fn end_repair(&mut self, complete: bool) {
        let Some(job) = self.repair.take() else {
            return;
        };
        let Some(event) = job.end(&mut self.slots[job.slot], complete, self.settings.repair) else {
            return;
        };
        self.out.emit(event);
        if complete && self.settings.learn {
            let learned = self
                .learning
                .learn_from_repair(&job, &self.conv.history, &self.slots);
            if let Err(e) = learned {
                self.report(&e);
            }
        }
    }

    /// Wait for what the learning thread is doing for the mapper of `source -> other`.
    /// Commands that arrive meanwhile wait their turn; a shutdown stops the wait. Only
    /// `Finish` and tests wait: a switch never does.
    pub fn finish_learning(&mut self, source: usize, commands: &Receiver<Envelope>) {
        while self.learning.busy_with(source) && !self.shutdown {
            self.take_learned(Duration::from_millis(100));
            while let Ok(e) = commands.try_recv() {
                match e.command {
                    Command::Shutdown => self.shutdown = true,
                    _ => self.inbox.push_back(e),
                }
            }
        }
    }
}

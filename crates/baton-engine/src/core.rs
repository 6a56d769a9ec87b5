//! The conversation engine: both models, their caches, both mappers, the switch, and
//! the two paths after it. It runs on its own thread (see [`super::spawn`]) and speaks
//! only the protocol.
//!
//! A switch is the handoff ([`super::switch`]), after which the target is ready, and
//! background jobs that own their state and take one step at a time through a narrow
//! view of the caches: the switch's measurement ([`super::measure`]), the repair of the
//! mapped cache ([`super::repair`]) and learning ([`super::learning`], on a thread of
//! its own). [`super::schedule`] runs them while the engine is otherwise idle; they give
//! way to the next message (see the protocol's `Event::SwitchMeasured` for the rules).

use super::config::{LearnSetup, Settings};
use super::conversation::Conversation;
use super::learning::{LearnCx, Learning};
use super::load::LoadedMapper;
use super::measure::Measurement;
use super::outbox::{Envelope, Outbox};
use super::repair::Repair;
use super::slot::{opening, PendingReread, Slot};
use super::switch::{hand_over, Sides};
use baton_method::metrics::probe_positions;
use baton_protocol::{setting, CacheOrigin, Command, Event};
use baton_runtime::model::KvCache;
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

/// What the first turn after a switch still has to report about it.
pub(super) struct FollowUp {
    pub(super) index: u32,
}

pub struct Engine {
    pub(super) slots: [Slot; 2],
    /// `mappers[i]` maps slot i's cache into the other slot's.
    pub(super) mappers: [LoadedMapper; 2],
    pub(super) active: usize,
    pub(super) settings: Settings,
    device: String,
    pub(super) conv: Conversation,
    pub(super) turn: u32,
    pub(super) switches: u32,
    pub(super) follow_up: Option<FollowUp>,
    /// The last switch's measurement, waiting to start or to resume.
    pub(super) measurements: VecDeque<Measurement>,
    /// The mean attention cosine last measured per direction (indexed by the source
    /// slot): the gate's estimate at the next handoff that way.
    pub(super) measured_cosine: [Option<f64>; 2],
    pub(super) queued: VecDeque<Envelope>,
    /// Commands taken off the channel while a measurement step ran, not yet looked at.
    pub(super) inbox: VecDeque<Envelope>,
    pub(super) shutdown: bool,
    pub(super) out: Outbox,
    /// Learning from the conversation, on a thread of its own.
    pub(super) learning: Learning,
    /// The active model's cache being repaired since the last switch.
    pub(super) repair: Option<Repair>,
    /// `residual[i]` maps slot i's residual stream to the other's, where the plan's
    /// `upper=M` needs it ([`super::layers`]).
    pub(super) residual: [Option<baton_method::mapper::residual::ResidualMap>; 2],
    /// Where residual maps are kept; `None` keeps what is fitted for the session alone.
    pub(super) mapper_dir: Option<baton_method::mapper::dir::MapperDir>,
    /// How far the repair may go while the engine is idle (`None`: to the end). A
    /// replay holds it at 0 and repairs only as far as the recording had, when told
    /// ([`Command::RepairTo`]), so that its answers are computed over the same cache.
    pub(super) repair_bound: Option<usize>,
}

/// How often an idle engine looks for the learning thread's reply.
pub(super) const LEARNING_POLL: Duration = Duration::from_millis(50);

impl Engine {
    pub fn new(
        slots: [Slot; 2],
        mappers: [LoadedMapper; 2],
        settings: Settings,
        device: String,
        out: Outbox,
    ) -> Self {
        let conv = Conversation::new(settings.system_prompt.as_deref());
        let mut slots = slots;
        if settings.anchor > 0 {
            for slot in slots.iter_mut() {
                slot.anchor_kv = opening(&slot.model, &conv, settings.anchor);
            }
        }
        Self {
            slots,
            mappers,
            active: 0,
            settings,
            device,
            conv,
            turn: 0,
            switches: 0,
            follow_up: None,
            measurements: VecDeque::new(),
            measured_cosine: [None, None],
            queued: VecDeque::new(),
            inbox: VecDeque::new(),
            shutdown: false,
            out,
            learning: Learning::off(),
            repair: None,
            repair_bound: None,
            residual: [None, None],
            mapper_dir: None,
        }
    }

    /// Serve commands until Shutdown or until every sender is gone. A pending switch
    /// measurement runs whenever no command is waiting.
    pub fn run(mut self, commands: Receiver<Envelope>) {
        while !self.shutdown {
            self.take_learned(Duration::ZERO);
            let next = match self.queued.pop_front().or_else(|| self.inbox.pop_front()) {
                Some(e) => Some(e),
                None if !self.measurements.is_empty() || self.repair_wanted() => {
                    match commands.try_recv() {
                        Ok(e) => Some(e),
                        Err(TryRecvError::Empty) => None,
                        Err(TryRecvError::Disconnected) => break,
                    }
                }
                // Idle, with nothing else to do: the next calibration window is read on
                // the learning thread, which gives way to the next command.
                None if self.learning.calibration_wanted() => {
                    self.learning.calibrate_next();
                    continue;
                }
                // Learning replies are looked for between short waits for a command.
                None if self.learning.busy() => match commands.recv_timeout(LEARNING_POLL) {
                    Ok(e) => Some(e),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                },
                None => match commands.recv() {
                    Ok(e) => Some(e),
                    Err(_) => break,
                },
            };
            match next {
                Some(e) => self.handle(e, &commands),
                None if !self.measurements.is_empty() => self.measure(&commands, true),
                None => self.repair_pending(&commands),
            }
        }
        // A repair cut short by the shutdown is said to have ended, as a switch says it.
        self.end_repair(false);
        self.out.emit(Event::ShutDown);
    }

    /// Repair only when told how far ([`Command::RepairTo`]), never while idle: what a
    /// replay needs to answer over the cache the recording answered over.
    pub fn pace_repair(&mut self) {
        self.repair_bound = Some(0);
    }

    /// Carry out one command. A message goes ahead of the pending measurements; so does
    /// a switch, which first has them copy what of the caches it will change they still
    /// read.
    pub fn handle(&mut self, envelope: Envelope, commands: &Receiver<Envelope>) {
        if matches!(
            envelope.command,
            Command::Submit { .. } | Command::Switch | Command::Finish | Command::Shutdown
        ) {
            self.learning.give_way();
        }
        let result = match envelope.command {
            Command::Submit { text } => {
                for m in self.measurements.iter_mut() {
                    m.yielded_to(self.turn + 1);
                }
                self.submit(&text, envelope.sent, commands)
            }
            Command::Switch => {
                // Background work never holds a switch up: a pending measurement keeps
                // its own copy of the caches the switch rebuilds, and the switch maps
                // with the mapper as it stands, taking any learning update that is ready
                // now, and records which one it used.
                self.take_learned(Duration::ZERO);
                self.detach_measurements(1 - self.active)
                    .and_then(|()| self.switch())
            }
            Command::Cancel => {
                self.out.emit(Event::Notice {
                    message: "nothing to cancel: no generation is running".into(),
                });
                Ok(())
            }
            Command::SetReference { enabled } => {
                self.settings.reference = enabled;
                self.setting_changed(setting::REFERENCE, on_off(enabled));
                self.out.emit(Event::Notice {
                    message: format!("reference path {}", on_off(enabled)),
                });
                Ok(())
            }
            Command::SetRepair { enabled } => {
                self.settings.repair = enabled;
                self.setting_changed(setting::REPAIR, on_off(enabled));
                self.out.emit(Event::Notice {
                    message: format!("cache repair {}", on_off(enabled)),
                });
                Ok(())
            }
            Command::SetReread { setting: r } => {
                self.settings.reread = r;
                self.prepare_layers();
                let value = r.map_or_else(|| setting::OFF.to_string(), |r| r.to_string());
                self.setting_changed(setting::REREAD, &value);
                self.out.emit(Event::Notice {
                    message: match r {
                        Some(r) => format!("re-read {r} at the first message after a switch"),
                        None => {
                            "re-read off: the target answers from the map as handed over".into()
                        }
                    },
                });
                Ok(())
            }
            Command::Bookmark { note } => {
                self.out.emit(Event::Bookmark {
                    turn: self.turn,
                    note,
                });
                Ok(())
            }
            Command::Finish => {
                self.finish_background(commands);
                Ok(())
            }
            Command::RepairTo { positions } => {
                self.repair_to(positions, commands);
                Ok(())
            }
            Command::Shutdown => {
                self.shutdown = true;
                Ok(())
            }
        };
        if let Err(e) = result {
            self.report(&e);
        }
    }

    /// Recorded as an event of its own, beside the notice a person reads, so that a
    /// replay makes the same change at the same step.
    fn setting_changed(&mut self, name: &str, value: &str) {
        self.out.emit(Event::SettingChanged {
            turn: self.turn,
            setting: name.into(),
            value: value.into(),
        });
    }

    pub(super) fn report(&mut self, e: &super::EngineError) {
        tracing::error!("{e}");
        self.out.emit(Event::Error {
            message: e.to_string(),
            fatal: false,
        });
    }

    /// Run the pending switch measurement now, as the engine does when idle: it stops
    /// early for a message waiting in `commands` (and stays pending), a cancel or a
    /// shutdown.
    pub fn measure_pending(&mut self, commands: &Receiver<Envelope>) {
        self.measure(commands, true);
    }

    /// Whether a switch's measurement has yet to run or to finish.
    pub fn measurement_pending(&self) -> bool {
        !self.measurements.is_empty()
    }

    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// The slot (0 or 1, in the order the models were given) that answers next.
    pub fn active(&self) -> usize {
        self.active
    }

    /// The cache slot `slot` (0 or 1) answers from.
    pub fn cache(&self, slot: usize) -> &KvCache {
        &self.slots[slot & 1].primary
    }

    /// The conversation's token ids so far.
    pub fn history(&self) -> &[u32] {
        &self.conv.history
    }

    /// The mapper in use from slot `source` into the other (after what it learned).
    pub fn mapper(&self, source: usize) -> &baton_method::mapper::CacheMapper {
        &self.mappers[source & 1].mapper
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    /// Whether a Shutdown was received (or every sender is gone).
    pub fn is_shut_down(&self) -> bool {
        self.shutdown
    }

    /// Run the pending measurement, wait for learning, and repair (when on) to the end,
    /// unless a command comes first; then say so.
    fn finish_background(&mut self, commands: &Receiver<Envelope>) {
        self.measure(commands, false);
        for source in 0..2 {
            self.finish_learning(source, commands);
        }
        if !self.shutdown {
            let paced = self.repair_bound.take();
            self.repair_pending(commands);
            self.repair_bound = paced;
        }
        self.out.emit(Event::Notice {
            message: "background work done".into(),
        });
    }

    /// Hand the conversation over, then leave its measurement pending.
    fn switch(&mut self) -> Result<(), super::EngineError> {
        // The active model is handed away from: its repair stops here.
        self.end_repair(false);
        let a = self.active;
        let measured = self.measured_cosine[a].filter(|_| self.settings.reference);
        let sides = Sides {
            slots: &mut self.slots,
            mappers: &self.mappers,
            history: &self.conv.history,
            settings: &self.settings,
        };
        let handed = hand_over(sides, a, self.switches, self.turn + 1, measured)?;
        self.active = 1 - a;
        let Some(h) = handed else {
            self.out.emit(Event::Notice {
                message: format!(
                    "{} is active; there was no conversation to hand over",
                    self.slots[self.active].name()
                ),
            });
            return Ok(());
        };
        self.switches += 1;
        self.follow_up = Some(FollowUp { index: h.index });
        // Whatever the target holds that it did not compute itself (mapped now or at an
        // earlier switch, and never re-read) waits for the next message's plan.
        let foreign = !self.slots[h.target].primary.foreign().is_empty();
        self.out.emit(Event::Switch(baton_protocol::SwitchEvent {
            index: h.index,
            turn: h.turn,
            from: h.names.0.clone(),
            to: h.names.1.clone(),
            context_tokens: h.context_tokens,
            suffix_tokens: h.suffix_tokens,
            timings: h.timings,
            metrics: None,
            gate: h.gate,
            measurement_follows: true,
            estimate: h.estimate,
            mapper: (!h.reprefilled).then_some(self.learning.state(a)),
            reread: self
                .settings
                .reread
                .filter(|r| {
                    foreign
                        && baton_method::handoff::reread::applies(
                            r,
                            self.slots[h.source].model.config(),
                            self.slots[h.target].model.config(),
                        )
                })
                .map(|r| r.to_string()),
        }));
        self.slots[h.target].pending_reread = foreign.then_some(PendingReread {
            index: h.index,
            source: h.source,
        });
        if self.slots[h.target].origin == CacheOrigin::Mapped {
            self.repair = Some(Repair::new(h.target, h.index, h.turn, h.own_held));
        }
        let probes = probe_positions(h.context_tokens, self.settings.probes);
        let target = &mut self.slots[h.target];
        // A cache the target computed all by itself is its truth so far: keep it, so the
        // reference path only re-prefills the suffix (as a prefix-caching server would).
        // Copied after the handoff event, since only the measurements need it.
        if h.own_prefix > target.truth.len() {
            target.truth = target.primary.try_clone_prefix(h.own_prefix)?;
        }
        let seen = target.truth.len().min(h.context_tokens);
        let learn = self.settings.reference && self.learning.will_learn(self.settings.learn);
        self.measurements.push_back(Measurement::new(
            h,
            seen,
            probes,
            self.settings.reference,
            learn,
        ));
        Ok(())
    }

    /// Have every pending measurement copy what it still reads of slot `rebuilt`'s
    /// cache, which is about to change: the inactive model's at a switch, the active
    /// one's before a re-read or a read-back.
    pub(super) fn detach_measurements(&mut self, rebuilt: usize) -> Result<(), super::EngineError> {
        for m in self.measurements.iter_mut() {
            m.detach(&self.slots, rebuilt)?;
        }
        Ok(())
    }

    /// Start the learning thread; both directions' learners are set up on it at once,
    /// in the background: no switch waits for them.
    pub(super) fn start_learning(
        &mut self,
        mapper_dir: baton_method::mapper::dir::MapperDir,
        setup: LearnSetup,
    ) {
        let models = [
            Arc::clone(&self.slots[0].model),
            Arc::clone(&self.slots[1].model),
        ];
        self.learning
            .start(models, mapper_dir, setup, self.settings.anchor);
    }

    /// Take the learning thread's replies that are there, waiting up to `wait` for one.
    pub(super) fn take_learned(&mut self, wait: Duration) {
        let names = [self.slots[0].name(), self.slots[1].name()];
        let mut cx = LearnCx {
            mappers: &mut self.mappers,
            names,
            out: &mut self.out,
        };
        self.learning.take(wait, &mut cx);
    }

    /// Whether the learning thread has work in flight for either direction.
    pub fn learning_in_flight(&self) -> bool {
        self.learning.busy()
    }
}

fn on_off(enabled: bool) -> &'static str {
    if enabled {
        setting::ON
    } else {
        setting::OFF
    }
}

//! The conversation engine: both models, their caches, both mappers, the switch, and
//! the two paths after it. It runs on its own thread (see [`super::spawn`]) and speaks
//! only the protocol.
//!
//! Each model keeps two caches over prefixes of the one token history:
//! - `primary`: what the shown (mapped) path generates from. After a switch it holds
//!   the positions the model had computed itself when it was last active, followed by
//!   positions mapped from the other model, so drift accumulates as in production.
//! - `truth`: the model's own prefill of the same tokens, extended by re-prefilling only
//!   what it has not seen (a server with prefix caching pays exactly that). It is the
//!   reference path's cache and the yardstick for the mapped one.
//!
//! A switch is two jobs: the handoff ([`super::switch`]), after which the target is
//! ready, and its measurement ([`super::measure`]), which runs while the engine is
//! otherwise idle and gives way to the next message (see the protocol's
//! `Event::SwitchMeasured` for the rules).

use super::config::Settings;
use super::conversation::Conversation;
use super::load::LoadedMapper;
use super::measure::Measurement;
use crate::metrics::{probe_positions, QueryGram};
use crate::model::{ForwardOptions, KvCache, Model};
use crate::protocol::{CacheOrigin, Command, Event, MapperState, ModelInfo};
use crate::session::SessionWriter;
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

pub struct Slot {
    /// Shared with the learning thread, which reads the models' shapes and RoPE and runs
    /// the target's attention to judge an update.
    pub(super) model: Arc<Model>,
    pub(super) primary: KvCache,
    pub(super) origin: CacheOrigin,
    pub(super) truth: KvCache,
    pub(super) grams: Vec<QueryGram>,
    pub(super) info: ModelInfo,
    /// The model's own cache of the conversation's first `anchor` ids (the template's
    /// opening, the same in every conversation), computed once so that taking over never
    /// waits for it.
    anchor_kv: Option<(Vec<u32>, KvCache)>,
}

impl Slot {
    pub fn new(model: Model, grams: Vec<QueryGram>, info: ModelInfo) -> Self {
        Self {
            primary: model.decoder.new_cache(),
            truth: model.decoder.new_cache(),
            origin: CacheOrigin::True,
            model: Arc::new(model),
            grams,
            info,
            anchor_kv: None,
        }
    }

    /// The precomputed opening, when `history` starts with it.
    pub(super) fn opening(&self, history: &[u32]) -> Option<&KvCache> {
        let (ids, kv) = self.anchor_kv.as_ref()?;
        history.starts_with(ids).then_some(kv)
    }

    pub(super) fn name(&self) -> String {
        self.info.name.clone()
    }
}

/// A command and when it was sent: the first-token latency after a switch counts from
/// here, so time the message spent waiting for the engine is part of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub command: Command,
    pub sent: Instant,
}

impl From<Command> for Envelope {
    fn from(command: Command) -> Self {
        Self {
            command,
            sent: Instant::now(),
        }
    }
}

/// What the first turn after a switch still has to report about it.
pub(super) struct FollowUp {
    pub(super) index: u32,
}

/// Where events go: the caller's channel, and the session file for recorded ones.
pub struct Outbox {
    events: Sender<Event>,
    recorder: Option<SessionWriter>,
}

impl Outbox {
    pub fn new(events: Sender<Event>, recorder: Option<SessionWriter>) -> Self {
        Self { events, recorder }
    }

    pub fn emit(&mut self, e: Event) {
        if let Some(r) = self.recorder.as_mut() {
            if let Err(err) = r.append(&e) {
                tracing::error!("session file: {err}");
                let _ = self.events.send(Event::Error {
                    message: format!("recording stopped: {err}"),
                    fatal: false,
                });
                self.recorder = None;
            }
        }
        let _ = self.events.send(e);
    }
}

/// Commands that arrive while a model generates.
pub(super) struct Inbox<'a> {
    pub(super) commands: &'a Receiver<Envelope>,
    pub(super) queued: &'a mut VecDeque<Envelope>,
    pub(super) shutdown: &'a mut bool,
}

impl Inbox<'_> {
    /// Drain what arrived; true when generation must stop now.
    pub(super) fn poll(&mut self, out: &mut Outbox) -> bool {
        let mut stop = false;
        loop {
            match self.commands.try_recv() {
                Ok(e) => match e.command {
                    Command::Cancel => stop = true,
                    Command::Shutdown => {
                        *self.shutdown = true;
                        stop = true;
                    }
                    Command::Switch => {
                        out.emit(Event::Notice {
                            message: "switch queued: it runs when this turn is done".into(),
                        });
                        self.queued.push_back(e);
                    }
                    _ => self.queued.push_back(e),
                },
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    *self.shutdown = true;
                    stop = true;
                    break;
                }
            }
        }
        stop
    }
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
    pub(super) measurement: Option<Measurement>,
    /// The mean attention cosine last measured per direction (indexed by the source
    /// slot): the gate's estimate at the next handoff that way.
    pub(super) measured_cosine: [Option<f64>; 2],
    pub(super) queued: VecDeque<Envelope>,
    /// Commands taken off the channel while a measurement step ran, not yet looked at.
    pub(super) inbox: VecDeque<Envelope>,
    pub(super) shutdown: bool,
    pub(super) out: Outbox,
    /// The learning thread, with learning on.
    pub(super) learning: Option<super::learning::Worker>,
    /// Per source slot: whether that direction can learn (it has saved statistics).
    pub(super) can_learn: [bool; 2],
    /// Per source slot: how far this conversation has been learned that way.
    pub(super) learned_to: [usize; 2],
    /// Per source slot: which state of the mapper is in use.
    pub(super) mapper_state: [MapperState; 2],
    /// Where the conversation is recorded, named with what is learned from it.
    pub(super) session_label: String,
    /// The active model's cache being repaired since the last switch.
    pub(super) repair: Option<super::repair::Repair>,
}

/// How often an idle engine looks for the learning thread's reply.
const LEARNING_POLL: std::time::Duration = std::time::Duration::from_millis(50);

pub(super) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds since `t` once `dev` has finished its queued work (a GPU runs kernels
/// asynchronously; on the CPU this is a no-op).
pub(super) fn synced_ms(dev: &candle_core::Device, t: Instant) -> f64 {
    if let Err(e) = dev.synchronize() {
        tracing::warn!("device synchronize: {e}");
    }
    ms(t)
}

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
            measurement: None,
            measured_cosine: [None, None],
            queued: VecDeque::new(),
            inbox: VecDeque::new(),
            shutdown: false,
            out,
            learning: None,
            can_learn: [false; 2],
            learned_to: [0; 2],
            mapper_state: [MapperState::default(); 2],
            session_label: "an unrecorded session".into(),
            repair: None,
        }
    }

    /// Serve commands until Shutdown or until every sender is gone. A pending switch
    /// measurement runs whenever no command is waiting.
    pub fn run(mut self, commands: Receiver<Envelope>) {
        while !self.shutdown {
            self.take_learned(std::time::Duration::ZERO);
            let next = match self.queued.pop_front().or_else(|| self.inbox.pop_front()) {
                Some(e) => Some(e),
                None if self.measurement.is_some() || self.repair_wanted() => {
                    match commands.try_recv() {
                        Ok(e) => Some(e),
                        Err(TryRecvError::Empty) => None,
                        Err(TryRecvError::Disconnected) => break,
                    }
                }
                // Learning replies are looked for between short waits for a command.
                None if self.learning_busy() => match commands.recv_timeout(LEARNING_POLL) {
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
                None if self.measurement.is_some() => self.measure(&commands, true),
                None => self.repair_pending(&commands),
            }
        }
        self.out.emit(Event::ShutDown);
    }

    /// Carry out one command. A switch first finishes the previous switch's pending
    /// measurement; a message goes ahead of it.
    pub fn handle(&mut self, envelope: Envelope, commands: &Receiver<Envelope>) {
        let result = match envelope.command {
            Command::Submit { text } => {
                if let Some(m) = self.measurement.as_mut() {
                    m.yielded_to.push(self.turn + 1);
                }
                self.submit(&text, envelope.sent, commands)
            }
            Command::Switch => {
                if self.measurement.is_some() {
                    self.measure(commands, false);
                }
                // Learning never holds a switch up: it maps with the mapper as it stands,
                // taking any update that is ready now, and records which one it used.
                self.take_learned(std::time::Duration::ZERO);
                if self.shutdown {
                    Ok(())
                } else {
                    self.switch()
                }
            }
            Command::Cancel => {
                self.out.emit(Event::Notice {
                    message: "nothing to cancel: no generation is running".into(),
                });
                Ok(())
            }
            Command::SetReference { enabled } => {
                self.settings.reference = enabled;
                self.out.emit(Event::Notice {
                    message: format!("reference path {}", if enabled { "on" } else { "off" }),
                });
                Ok(())
            }
            Command::SetRepair { enabled } => {
                self.settings.repair = enabled;
                self.out.emit(Event::Notice {
                    message: format!("cache repair {}", if enabled { "on" } else { "off" }),
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
            Command::Shutdown => {
                self.shutdown = true;
                Ok(())
            }
        };
        if let Err(e) = result {
            self.report(&e);
        }
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
        self.measurement.is_some()
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
    pub fn mapper(&self, source: usize) -> &crate::mapper::CacheMapper {
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
        if self.measurement.is_some() {
            self.measure(commands, false);
        }
        for source in 0..2 {
            self.finish_learning(source, commands);
        }
        if !self.shutdown {
            self.repair_pending(commands);
        }
        self.out.emit(Event::Notice {
            message: "background work done".into(),
        });
    }

    /// Hand the conversation over, then leave its measurement pending.
    fn switch(&mut self) -> Result<(), super::EngineError> {
        // The active model is handed away from: its repair stops here.
        self.end_repair(false);
        let Some(h) = self.handoff()? else {
            return Ok(());
        };
        if !h.reprefilled {
            self.repair = Some(super::repair::Repair::new(h.target, h.index, h.turn));
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
        let learn = self.settings.reference && self.will_learn();
        self.measurement = Some(Measurement::new(
            h,
            seen,
            probes,
            self.settings.reference,
            learn,
        ));
        Ok(())
    }
}

/// The model's own cache of the first `anchor` ids every conversation starts with (the
/// template rendered with any first message); `None` when it cannot be made.
fn opening(model: &Model, conv: &Conversation, anchor: usize) -> Option<(Vec<u32>, KvCache)> {
    let template = model.template.as_ref()?;
    let mut probe = conv.clone();
    probe.push_user(template, &model.tokenizer, "x").ok()?;
    let ids = probe.history.get(..anchor)?.to_vec();
    let mut kv = model.decoder.new_cache();
    model
        .decoder
        .forward(&ids, &mut kv, &ForwardOptions::cache_only())
        .ok()?;
    Some((ids, kv))
}

/// Both slots mutably: `a` first, the other second.
pub(super) fn split(slots: &mut [Slot; 2], a: usize) -> (&mut Slot, &mut Slot) {
    let (x, y) = slots.split_at_mut(1);
    if a == 0 {
        (&mut x[0], &mut y[0])
    } else {
        (&mut y[0], &mut x[0])
    }
}

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

use super::compare::compare_tokens;
use super::config::Settings;
use super::conversation::Conversation;
use super::load::LoadedMapper;
use super::switch::{cache_metrics, map_onto};
use super::EngineError;
use crate::mapper::CacheMapper;
use crate::metrics::{self, probe_positions, QueryGram};
use crate::model::{generate, ForwardOptions, GenerateOptions, KvCache, Logits, Model, StopReason};
use crate::protocol::{
    CacheOrigin, Command, Event, GateDecision, GenerationTimings, ModelInfo, PathKind, StopKind,
    SwitchMetrics, SwitchTimings,
};
use crate::session::SessionWriter;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::Instant;

pub struct Slot {
    pub model: Model,
    pub primary: KvCache,
    pub origin: CacheOrigin,
    pub truth: KvCache,
    pub grams: Vec<QueryGram>,
    pub info: ModelInfo,
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
            model,
            grams,
            info,
            anchor_kv: None,
        }
    }

    /// Put the first `anchor` ids of `history` into the (empty or shorter) primary cache:
    /// from the precomputed opening when it matches, else by prefilling them.
    fn fill_anchor(&mut self, history: &[u32], anchor: usize) -> Result<(), EngineError> {
        let have = self.primary.len();
        if have >= anchor {
            return Ok(());
        }
        if have == 0 {
            if let Some((ids, kv)) = &self.anchor_kv {
                if ids.as_slice() == &history[..anchor] {
                    self.primary = kv.try_clone()?;
                    return Ok(());
                }
            }
        }
        self.model.decoder.forward(
            &history[have..anchor],
            &mut self.primary,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )?;
        Ok(())
    }

    fn name(&self) -> String {
        self.info.name.clone()
    }
}

/// What the first turn after a switch still has to report about it.
struct FollowUp {
    index: u32,
    handoff_ms: f64,
}

/// Where events go: the caller's channel, and the session file for recorded ones.
pub struct Outbox {
    pub events: Sender<Event>,
    pub recorder: Option<SessionWriter>,
}

impl Outbox {
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
struct Inbox<'a> {
    commands: &'a Receiver<Command>,
    queued: &'a mut VecDeque<Command>,
    shutdown: &'a mut bool,
}

impl Inbox<'_> {
    /// Drain what arrived; true when generation must stop now.
    fn poll(&mut self, out: &mut Outbox) -> bool {
        let mut stop = false;
        loop {
            match self.commands.try_recv() {
                Ok(Command::Cancel) => stop = true,
                Ok(Command::Shutdown) => {
                    *self.shutdown = true;
                    stop = true;
                }
                Ok(Command::Switch) => {
                    out.emit(Event::Notice {
                        message: "switch queued: it runs when this turn is done".into(),
                    });
                    self.queued.push_back(Command::Switch);
                }
                Ok(other) => self.queued.push_back(other),
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
    pub slots: [Slot; 2],
    /// `mappers[i]` maps slot i's cache into the other slot's.
    pub mappers: [LoadedMapper; 2],
    pub active: usize,
    pub settings: Settings,
    pub device: String,
    conv: Conversation,
    turn: u32,
    switches: u32,
    follow_up: Option<FollowUp>,
    queued: VecDeque<Command>,
    shutdown: bool,
    pub out: Outbox,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds since `t` once `dev` has finished its queued work (a GPU runs kernels
/// asynchronously; on the CPU this is a no-op).
fn synced_ms(dev: &candle_core::Device, t: Instant) -> f64 {
    if let Err(e) = dev.synchronize() {
        tracing::warn!("device synchronize: {e}");
    }
    ms(t)
}

fn stop_kind(s: StopReason) -> StopKind {
    match s {
        StopReason::EndOfTurn => StopKind::Eos,
        StopReason::MaxTokens | StopReason::ContextFull => StopKind::MaxTokens,
        StopReason::Cancelled => StopKind::Cancelled,
    }
}

struct PathRun {
    ids: Vec<u32>,
    text: String,
    timings: GenerationTimings,
    stop: StopReason,
    prompt_tokens: usize,
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
            queued: VecDeque::new(),
            shutdown: false,
            out,
        }
    }

    /// Serve commands until Shutdown or until every sender is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        while !self.shutdown {
            let cmd = match self.queued.pop_front() {
                Some(c) => c,
                None => match commands.recv() {
                    Ok(c) => c,
                    Err(_) => break,
                },
            };
            self.handle(cmd, &commands);
        }
        self.out.emit(Event::ShutDown);
    }

    pub fn handle(&mut self, cmd: Command, commands: &Receiver<Command>) {
        let result = match cmd {
            Command::Submit { text } => self.submit(&text, commands),
            Command::Switch => self.switch(),
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
            Command::Bookmark { note } => {
                self.out.emit(Event::Bookmark {
                    turn: self.turn,
                    note,
                });
                Ok(())
            }
            Command::Shutdown => {
                self.shutdown = true;
                Ok(())
            }
        };
        if let Err(e) = result {
            tracing::error!("{e}");
            self.out.emit(Event::Error {
                message: e.to_string(),
                fatal: false,
            });
        }
    }

    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// Generate on `cache` after feeding `pending` (ids it has not seen), streaming
    /// tokens for `path`.
    #[allow(clippy::too_many_arguments)]
    fn generate_on(
        model: &Model,
        cache: &mut KvCache,
        pending: &[u32],
        settings: &Settings,
        turn: u32,
        path: PathKind,
        out: &mut Outbox,
        inbox: &mut Inbox<'_>,
    ) -> Result<PathRun, EngineError> {
        let opts = GenerateOptions {
            max_tokens: settings.max_tokens,
            sampling: settings.sampling,
            stop_ids: model.tokenizer.eos_ids().to_vec(),
        };
        let mut stream = model.tokenizer.stream();
        let mut text = String::new();
        let t0 = Instant::now();
        let mut first_token_ms = None;
        let never = AtomicBool::new(false);
        let g = generate(&model.decoder, cache, pending, &opts, &never, &mut |id| {
            first_token_ms.get_or_insert_with(|| ms(t0));
            if !opts.stop_ids.contains(&id) {
                if let Ok(piece) = stream.push(id) {
                    if !piece.is_empty() {
                        text.push_str(&piece);
                        out.emit(Event::Token {
                            turn,
                            path,
                            text: piece,
                            id,
                        });
                    }
                }
            }
            !inbox.poll(out)
        })?;
        if let Ok(rest) = stream.finish() {
            text.push_str(&rest);
        }
        Ok(PathRun {
            timings: GenerationTimings {
                prefill_ms: g.prefill.seconds * 1e3,
                first_token_ms: first_token_ms.unwrap_or_else(|| ms(t0)),
                decode_tokens_per_s: g.decode.tokens_per_second(),
                total_ms: ms(t0),
            },
            ids: g.tokens,
            text,
            stop: g.stop,
            prompt_tokens: pending.len(),
        })
    }

    fn emit_generation(&mut self, path: PathKind, slot: usize, run: &PathRun) {
        let model = self.slots[slot].name();
        self.out.emit(Event::Generation {
            turn: self.turn,
            path,
            model,
            text: run.text.clone(),
            token_ids: run.ids.clone(),
            prompt_tokens: run.prompt_tokens,
            timings: run.timings,
            stop: stop_kind(run.stop),
        });
    }

    /// Teacher-forced next-token agreement of `a` (mapped) against `b` (true) on `ids`,
    /// which both caches then hold. Needs at least one id.
    fn teacher_forced(
        model: &Model,
        mapped: &mut KvCache,
        truth: &mut KvCache,
        ids: &[u32],
    ) -> Result<metrics::NextTokenAgreement, EngineError> {
        let all = ForwardOptions {
            logits: Logits::All,
            probe_positions: vec![],
        };
        let lm = model.decoder.forward(ids, mapped, &all)?.logits;
        let lt = model.decoder.forward(ids, truth, &all)?.logits;
        match (lt, lm) {
            (Some(t), Some(m)) => Ok(metrics::logits::agreement(&t, &m)?),
            _ => Err(EngineError::Internal("no logits for the user turn".into())),
        }
    }

    fn submit(&mut self, text: &str, commands: &Receiver<Command>) -> Result<(), EngineError> {
        let a = self.active;
        self.turn += 1;
        let turn = self.turn;
        self.out.emit(Event::UserMessage {
            turn,
            text: text.to_string(),
        });
        let template = self.slots[a].model.chat_template()?.clone();
        self.conv
            .push_user(&template, &self.slots[a].model.tokenizer, text)?;
        let prompt_len = self.conv.len();
        let follow_up = self.follow_up.take();
        // The shadow path runs whenever the shown path's cache is not the model's own.
        let reference = self.settings.reference && self.slots[a].origin != CacheOrigin::True;

        // Bring the reference cache up to the primary's length first, so both take the
        // same pending ids (and the teacher-forced comparison sees the same inputs).
        let mut agreement = None;
        {
            let slot = &mut self.slots[a];
            let pending_from = slot.primary.len();
            if reference {
                if slot.truth.len() > pending_from {
                    slot.truth.truncate(pending_from);
                }
                let gap = &self.conv.history[slot.truth.len()..pending_from];
                if !gap.is_empty() {
                    slot.model.decoder.forward(
                        gap,
                        &mut slot.truth,
                        &ForwardOptions {
                            logits: Logits::None,
                            probe_positions: vec![],
                        },
                    )?;
                }
                let pending = &self.conv.history[pending_from..prompt_len];
                if follow_up.is_some() && pending.len() > 1 {
                    let ids = &pending[..pending.len() - 1];
                    agreement = Some(Self::teacher_forced(
                        &slot.model,
                        &mut slot.primary,
                        &mut slot.truth,
                        ids,
                    )?);
                }
            }
        }

        let origin = self.slots[a].origin;
        let model_name = self.slots[a].name();
        self.out.emit(Event::TurnStarted {
            turn,
            path: PathKind::Mapped,
            model: model_name.clone(),
            cache: origin,
        });
        let primary_run = {
            let slot = &mut self.slots[a];
            let pending = &self.conv.history[slot.primary.len()..prompt_len];
            let mut inbox = Inbox {
                commands,
                queued: &mut self.queued,
                shutdown: &mut self.shutdown,
            };
            Self::generate_on(
                &slot.model,
                &mut slot.primary,
                pending,
                &self.settings,
                turn,
                PathKind::Mapped,
                &mut self.out,
                &mut inbox,
            )?
        };
        if let Some(f) = follow_up {
            self.out.emit(Event::SwitchFollowUp {
                index: f.index,
                turn,
                top1_agreement: agreement.map(|a| a.top1),
                kl: agreement.map(|a| a.kl),
                positions: agreement.map(|a| a.positions).unwrap_or(0),
                first_token_ms: primary_run.timings.first_token_ms,
                end_to_end_ms: f.handoff_ms + primary_run.timings.first_token_ms,
            });
        }
        self.emit_generation(PathKind::Mapped, a, &primary_run);
        let cancelled = primary_run.stop == StopReason::Cancelled;
        let reply_ids = primary_run.ids.clone();

        if reference && !cancelled && !self.shutdown {
            self.out.emit(Event::TurnStarted {
                turn,
                path: PathKind::Reference,
                model: model_name,
                cache: CacheOrigin::Reprefilled,
            });
            let run = {
                let slot = &mut self.slots[a];
                let pending = &self.conv.history[slot.truth.len()..prompt_len];
                let mut inbox = Inbox {
                    commands,
                    queued: &mut self.queued,
                    shutdown: &mut self.shutdown,
                };
                let r = Self::generate_on(
                    &slot.model,
                    &mut slot.truth,
                    pending,
                    &self.settings,
                    turn,
                    PathKind::Reference,
                    &mut self.out,
                    &mut inbox,
                )?;
                // The shadow's own answer is not part of the conversation: keep its cache
                // a prefix of the shown history.
                slot.truth.truncate(prompt_len);
                r
            };
            self.emit_generation(PathKind::Reference, a, &run);
            if run.stop != StopReason::Cancelled {
                let (identical, first_difference, agreement) = compare_tokens(&reply_ids, &run.ids);
                self.out.emit(Event::TurnComparison {
                    turn,
                    identical,
                    first_difference,
                    agreement,
                });
            }
        }
        let tok = self.slots[a].model.tokenizer.clone();
        self.conv.push_reply(&tok, &reply_ids)?;
        self.out.emit(Event::Done { turn });
        if self.settings.premap && !self.shutdown {
            self.premap()?;
        }
        Ok(())
    }

    /// Map the newest part of the active cache into the inactive model's, so that the
    /// next switch finds it ready.
    fn premap(&mut self) -> Result<(), EngineError> {
        let a = self.active;
        let b = 1 - a;
        let (sa, sb) = split(&mut self.slots, a);
        let to = sa.primary.len();
        if to <= sb.primary.len() {
            return Ok(());
        }
        if self.settings.reference && sb.origin == CacheOrigin::True {
            // Its own positions are its truth so far (as at a switch).
            sb.truth = sb.primary.try_clone()?;
        }
        let anchor = self.settings.anchor.min(to);
        sb.fill_anchor(&self.conv.history, anchor)?;
        let from = sb.primary.len();
        let t0 = Instant::now();
        map_onto(
            &self.mappers[a].mapper,
            &sa.model,
            &sa.primary,
            &sb.model,
            &mut sb.primary,
            from,
            to,
        )?;
        sb.origin = CacheOrigin::Mapped;
        let took = synced_ms(sb.model.decoder.device(), t0);
        self.out.emit(Event::Notice {
            message: format!(
                "pre-mapped {} tokens into {} in {took:.1} ms",
                to - from,
                self.slots[b].name()
            ),
        });
        Ok(())
    }

    fn switch(&mut self) -> Result<(), EngineError> {
        let a = self.active;
        let b = 1 - a;
        let n = self.slots[a].primary.len();
        let index = self.switches;
        let (from_name, to_name) = (self.slots[a].name(), self.slots[b].name());
        if n == 0 {
            self.active = b;
            self.out.emit(Event::Notice {
                message: format!("{to_name} is active; there was no conversation to hand over"),
            });
            return Ok(());
        }
        // The handoff itself: map what the target has not seen onto its own cache.
        let mapper: &CacheMapper = &self.mappers[a].mapper;
        let (sa, sb) = split(&mut self.slots, a);
        let mut prior = sb.primary.len().min(n);
        sb.primary.truncate(prior);
        // A cache the target computed all by itself is its truth so far: keep it, so the
        // reference path only re-prefills the suffix (as a prefix-caching server would).
        if self.settings.reference && sb.origin == CacheOrigin::True && sb.truth.len() < prior {
            sb.truth = sb.primary.try_clone()?;
        }
        // What the target held before this switch: the suffix is measured from here.
        let held = prior;
        // The handoff is what the switch itself costs: the anchor the target computes and
        // the map (the truth copy above only serves the reference measurement).
        let t_handoff = Instant::now();
        let anchor = self.settings.anchor.min(n);
        if prior < anchor {
            sb.fill_anchor(&self.conv.history, anchor)?;
            prior = anchor;
        }
        let t_map = Instant::now();
        map_onto(
            mapper,
            &sa.model,
            &sa.primary,
            &sb.model,
            &mut sb.primary,
            prior,
            n,
        )?;
        let map_suffix_ms = synced_ms(sb.model.decoder.device(), t_map);
        let handoff_ms = ms(t_handoff);
        sb.origin = CacheOrigin::Mapped;

        // The whole cache mapped from scratch, timed for the full-vs-full comparison.
        let t_full = Instant::now();
        let full = mapper.map_cache(
            &sa.primary,
            sa.model.decoder.rope(),
            sb.model.decoder.rope(),
        )?;
        let map_full_ms = synced_ms(sb.model.decoder.device(), t_full);
        drop(full);

        let mut timings = SwitchTimings {
            source_prefill_ms: None,
            map_full_ms,
            map_suffix_ms: (held > 0).then_some(map_suffix_ms),
            reprefill_full_ms: None,
            reprefill_suffix_ms: None,
            end_to_end_ms: handoff_ms,
        };
        let history = &self.conv.history[..n];
        let mut metrics: Option<SwitchMetrics> = None;
        if self.settings.reference {
            let probes = probe_positions(n, self.settings.probes);
            let t_full = Instant::now();
            let mut fresh = sb.model.decoder.new_cache();
            let truth_out = sb.model.decoder.forward(
                history,
                &mut fresh,
                &ForwardOptions {
                    logits: Logits::None,
                    probe_positions: probes.clone(),
                },
            )?;
            timings.reprefill_full_ms = Some(synced_ms(sb.model.decoder.device(), t_full));
            let seen = sb.truth.len().min(n);
            if seen > 0 {
                sb.truth.truncate(seen);
                let t_suffix = Instant::now();
                if seen < n {
                    sb.model.decoder.forward(
                        &history[seen..],
                        &mut sb.truth,
                        &ForwardOptions {
                            logits: Logits::None,
                            probe_positions: vec![],
                        },
                    )?;
                }
                timings.reprefill_suffix_ms = Some(synced_ms(sb.model.decoder.device(), t_suffix));
            } else {
                sb.truth = fresh;
            }
            metrics = Some(cache_metrics(
                &sb.model,
                &sb.grams,
                &sb.truth,
                &sb.primary,
                &truth_out.queries,
                &probes,
            )?);
        }
        let gate = match self.settings.gate {
            None => None,
            Some(threshold) => {
                let estimate = metrics
                    .as_ref()
                    .and_then(|m| m.cosine_mean())
                    .unwrap_or(self.mappers[a].calibration_cosine);
                let used = if estimate < threshold {
                    sb.primary = if sb.truth.len() == n {
                        sb.truth.try_clone()?
                    } else {
                        let mut c = sb.model.decoder.new_cache();
                        sb.model.decoder.forward(
                            history,
                            &mut c,
                            &ForwardOptions {
                                logits: Logits::None,
                                probe_positions: vec![],
                            },
                        )?;
                        c
                    };
                    sb.origin = CacheOrigin::Reprefilled;
                    CacheOrigin::Reprefilled
                } else {
                    CacheOrigin::Mapped
                };
                Some(GateDecision {
                    threshold,
                    estimate,
                    used,
                })
            }
        };
        self.active = b;
        self.switches += 1;
        self.follow_up = Some(FollowUp { index, handoff_ms });
        self.out.emit(Event::Switch {
            index,
            turn: self.turn + 1,
            from: from_name,
            to: to_name,
            context_tokens: n,
            suffix_tokens: n - held,
            timings,
            metrics,
            gate,
        });
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
        .forward(
            &ids,
            &mut kv,
            &ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            },
        )
        .ok()?;
    Some((ids, kv))
}

/// Both slots mutably: `a` first, the other second.
fn split(slots: &mut [Slot; 2], a: usize) -> (&mut Slot, &mut Slot) {
    let (x, y) = slots.split_at_mut(1);
    if a == 0 {
        (&mut x[0], &mut y[0])
    } else {
        (&mut y[0], &mut x[0])
    }
}

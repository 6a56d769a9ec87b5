//! One turn: the mapped (shown) answer first, then, with the reference path on, the
//! comparison work that must never delay it (the teacher-forced agreement on the user's
//! message and the re-prefilled answer), then the pre-map for the next switch.

use super::compare::compare_tokens;
use super::config::Settings;
use super::core::Engine;
use super::outbox::{Inbox, Outbox};
use super::slot::split;
use super::timing::ms;
use super::EngineError;
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::metrics;
use baton_protocol::{CacheOrigin, Event, GenerationTimings, PathKind, StopKind};
use baton_runtime::model::decoder::PREFILL_CHUNK;
use baton_runtime::model::{
    generate_watched, ForwardOptions, GenerateOptions, KvCache, Logits, Model, StopReason,
};
use std::cell::RefCell;
use std::sync::mpsc::Receiver;
use std::time::Instant;

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

/// The turn being answered, when its message was sent, and where commands arrive.
struct TurnCx<'a> {
    turn: u32,
    sent: Instant,
    commands: &'a Receiver<super::Envelope>,
}

/// Where a generation's tokens go and where its commands come from.
struct Stream<'a, 'b> {
    turn: u32,
    path: PathKind,
    sent: Instant,
    out: &'a mut Outbox,
    inbox: &'a mut Inbox<'b>,
}

/// Generate on `cache` after feeding `pending` (ids it has not seen), streaming tokens.
fn generate_on(
    model: &Model,
    cache: &mut KvCache,
    pending: &[u32],
    settings: &Settings,
    s: Stream<'_, '_>,
) -> Result<PathRun, EngineError> {
    let opts = GenerateOptions {
        max_tokens: settings.max_tokens,
        sampling: settings.sampling,
        stop_ids: model.tokenizer.eos_ids().to_vec(),
    };
    let mut stream = model.tokenizer.stream();
    let mut text = String::new();
    let t0 = Instant::now();
    let mut first = None;
    // The inbox is asked during the prefill (a long paste can be cancelled while it is
    // read) and before every token; streaming and asking never overlap, so one RefCell
    // serves both.
    let io = RefCell::new((s.out, s.inbox));
    let asked = || {
        let mut g = io.borrow_mut();
        let (out, inbox) = &mut *g;
        inbox.poll(out)
    };
    // One chunk reads in well under a second; only a longer input is worth watching.
    let total = pending.len();
    let watched = total > PREFILL_CHUNK;
    let mut on_prefill = |done: usize| {
        if watched {
            io.borrow_mut().0.emit(Event::PrefillProgress {
                turn: s.turn,
                path: s.path,
                done,
                total,
            });
        }
    };
    if watched {
        on_prefill(0);
    }
    let on_token = &mut |id| {
        let mut g = io.borrow_mut();
        let out = &mut g.0;
        first.get_or_insert_with(|| (ms(t0), ms(s.sent)));
        if !opts.stop_ids.contains(&id) {
            if let Ok(piece) = stream.push(id) {
                if !piece.is_empty() {
                    text.push_str(&piece);
                    out.emit(Event::Token {
                        turn: s.turn,
                        path: s.path,
                        text: piece,
                        id,
                    });
                }
            }
        }
        // The inbox is asked before the next step (`asked`): once per token is enough.
        true
    };
    let g = generate_watched(
        &model.decoder,
        cache,
        pending,
        &opts,
        &asked,
        &mut on_prefill,
        on_token,
    )?;
    if let Ok(rest) = stream.finish() {
        text.push_str(&rest);
    }
    let (first_token_ms, since_sent_ms) = first.unwrap_or_else(|| (ms(t0), ms(s.sent)));
    Ok(PathRun {
        timings: GenerationTimings {
            prefill_ms: g.prefill.seconds * 1e3,
            first_token_ms,
            decode_tokens_per_s: g.decode.tokens_per_second(),
            total_ms: ms(t0),
            waited_ms: Some(since_sent_ms),
        },
        ids: g.tokens,
        text,
        stop: g.stop,
        prompt_tokens: pending.len(),
    })
}

/// Teacher-forced next-token agreement of `mapped` against `truth` on `ids`, which
/// `truth` then holds. Needs at least one id.
fn teacher_forced(
    model: &Model,
    mut mapped: KvCache,
    truth: &mut KvCache,
    ids: &[u32],
) -> Result<metrics::NextTokenAgreement, EngineError> {
    let all = ForwardOptions {
        logits: Logits::All,
        probe_positions: vec![],
    };
    let lm = model.decoder.forward(ids, &mut mapped, &all)?.logits;
    let lt = model.decoder.forward(ids, truth, &all)?.logits;
    match (lt, lm) {
        (Some(t), Some(m)) => Ok(metrics::logits::agreement(&t, &m)?),
        _ => Err(EngineError::Internal("no logits for the user turn".into())),
    }
}

impl Engine {
    fn emit_generation(&mut self, path: PathKind, slot: usize, run: &PathRun) {
        if run.prompt_tokens >= super::reread::MIN_TIMED_PREFILL && run.timings.prefill_ms > 0.0 {
            self.slots[slot].read_speed = Some(run.timings.prefill_ms / run.prompt_tokens as f64);
        }
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

    /// Answer the user's `text` on the active model: the shown (mapped) path first, then,
    /// with the reference path on and a cache that is not the model's own, the
    /// comparison that must never delay it.
    pub(super) fn submit(
        &mut self,
        text: &str,
        sent: Instant,
        commands: &Receiver<super::Envelope>,
    ) -> Result<(), EngineError> {
        let a = self.active;
        let template = self.slots[a].model.chat_template()?.clone();
        // Measured on a copy, so that a message refused for its length leaves the
        // conversation as it was.
        let mut conv = self.conv.clone();
        conv.push_user(&template, &self.slots[a].model.tokenizer, text)?;
        self.check_room(conv.len())?;
        self.turn += 1;
        let turn = self.turn;
        self.out.emit(Event::UserMessage {
            turn,
            text: text.to_string(),
        });
        self.conv = conv;
        let follow_up = self.follow_up.take();
        // The shadow path runs whenever the shown path's cache is not the model's own.
        let reference = self.settings.reference && self.slots[a].origin != CacheOrigin::True;
        let pending_from = self.slots[a].primary.len();
        let cx = TurnCx {
            turn,
            sent,
            commands,
        };
        self.read_back_dropped()?;
        self.reread_for_message(turn)?;
        let shown = self.generate_path(&cx, PathKind::Mapped)?;
        let cancelled = shown.stop == StopReason::Cancelled;
        let compare = reference && !cancelled && !self.shutdown;
        let agreement = if compare {
            self.catch_up_truth(pending_from, follow_up.is_some())?
        } else {
            None
        };
        if let Some(f) = follow_up {
            self.out.emit(Event::SwitchFollowUp {
                index: f.index,
                turn,
                top1_agreement: agreement.map(|a| a.top1),
                kl: agreement.map(|a| a.kl),
                positions: agreement.map(|a| a.positions).unwrap_or(0),
                first_token_ms: shown.timings.first_token_ms,
                // Set on every run this engine makes; the follow-up is what it waited.
                end_to_end_ms: shown
                    .timings
                    .waited_ms
                    .unwrap_or(shown.timings.first_token_ms),
            });
        }
        if compare {
            let run = self.generate_path(&cx, PathKind::Reference)?;
            if run.stop != StopReason::Cancelled {
                let (identical, first_difference, agreement) = compare_tokens(&shown.ids, &run.ids);
                self.out.emit(Event::TurnComparison {
                    turn,
                    identical,
                    first_difference,
                    agreement,
                });
            }
        }
        let tok = self.slots[a].model.tokenizer.clone();
        self.conv.push_reply(&tok, &shown.ids)?;
        self.out.emit(Event::Done { turn });
        if self.settings.premap && !self.shutdown {
            self.premap()?;
        }
        Ok(())
    }

    /// Said before a long prefill starts rather than after it: a conversation of
    /// `tokens` ids the active model cannot hold is refused, and one that leaves less
    /// room than the answer budget is answered with a warning that the answer will be
    /// cut short.
    fn check_room(&mut self, tokens: usize) -> Result<(), EngineError> {
        let slot = &self.slots[self.active];
        let max = slot.model.decoder.config().context_length;
        if tokens > max {
            return Err(EngineError::TooLong {
                model: slot.name().to_string(),
                tokens,
                max,
            });
        }
        let room = max - tokens;
        if room < self.settings.max_tokens {
            let model = slot.name();
            self.out.emit(Event::Notice {
                message: format!(
                    "long message: the conversation is {tokens} tokens with it, and {model} \
                     reads {max} at most (its context length): the answer has room for \
                     {room} of its {} tokens",
                    self.settings.max_tokens
                ),
            });
        }
        Ok(())
    }

    /// One path's answer to the conversation so far, on the active model: the shown
    /// path generates on its primary cache, the reference path on its truth, whose own
    /// answer is then dropped (it is not part of the conversation).
    fn generate_path(&mut self, cx: &TurnCx<'_>, path: PathKind) -> Result<PathRun, EngineError> {
        let a = self.active;
        let prompt_len = self.conv.len();
        let cache = match path {
            PathKind::Mapped => self.slots[a].origin,
            PathKind::Reference => CacheOrigin::Reprefilled,
        };
        let repaired = match path {
            PathKind::Mapped => self
                .repair
                .as_ref()
                .filter(|r| r.wanted(a, cache))
                .map(|r| r.exact_prefix()),
            PathKind::Reference => None,
        };
        self.out.emit(Event::TurnStarted {
            turn: cx.turn,
            path,
            model: self.slots[a].name(),
            cache,
            repaired,
        });
        let slot = &mut self.slots[a];
        let kv = match path {
            PathKind::Mapped => &mut slot.primary,
            PathKind::Reference => &mut slot.truth,
        };
        let pending = &self.conv.history[kv.len()..prompt_len];
        let mut inbox = Inbox {
            commands: cx.commands,
            queued: &mut self.queued,
            shutdown: &mut self.shutdown,
        };
        let stream = Stream {
            turn: cx.turn,
            path,
            sent: cx.sent,
            out: &mut self.out,
            inbox: &mut inbox,
        };
        let run = generate_on(&slot.model, kv, pending, &self.settings, stream)?;
        if path == PathKind::Reference {
            kv.truncate(prompt_len);
        }
        self.emit_generation(path, a, &run);
        Ok(run)
    }

    /// Bring the active model's truth up to where the primary stood before this turn
    /// (`pending_from`), so both see the same pending ids, and, on the first turn after a
    /// switch, measure the teacher-forced agreement of the two on the user's message.
    fn catch_up_truth(
        &mut self,
        pending_from: usize,
        after_switch: bool,
    ) -> Result<Option<metrics::NextTokenAgreement>, EngineError> {
        let prompt_len = self.conv.len();
        let slot = &mut self.slots[self.active];
        if slot.truth.len() > pending_from {
            slot.truth.truncate(pending_from);
        }
        let gap = &self.conv.history[slot.truth.len()..pending_from];
        if !gap.is_empty() {
            slot.model
                .decoder
                .forward(gap, &mut slot.truth, &ForwardOptions::cache_only())?;
        }
        let pending = &self.conv.history[pending_from..prompt_len];
        if !after_switch || pending.len() < 2 {
            return Ok(None);
        }
        let before = slot.primary.try_clone_prefix(pending_from)?;
        let agreement = teacher_forced(
            &slot.model,
            before,
            &mut slot.truth,
            &pending[..pending.len() - 1],
        )?;
        Ok(Some(agreement))
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
        let from = sb.primary.len();
        let history = &self.conv.history[..to];
        let plan = HandoffPlan::new(to)
            .anchor(sb.anchor_for(history, self.settings.anchor))
            .holding(from);
        let mut primary = std::mem::replace(&mut sb.primary, sb.model.decoder.new_cache());
        let inputs = HandoffInputs {
            source: &sa.model,
            source_cache: &sa.primary,
            target: &sb.model,
            mapper: &self.mappers[a].mapper,
            tokens: history,
            exact: sb.opening(history),
        };
        let built = plan.build(&inputs, &mut primary);
        sb.primary = primary;
        let took = built?.map_ms;
        sb.origin = CacheOrigin::Mapped;
        self.out.emit(Event::Notice {
            message: format!(
                "pre-mapped {} tokens into {} in {took:.1} ms",
                plan.mapped().len(),
                self.slots[b].name()
            ),
        });
        Ok(())
    }
}

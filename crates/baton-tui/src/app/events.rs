//! How each engine event changes what the screen shows.

use super::{App, Effect, Level, Overlay};
use crate::records::{Comparison, Entry, Finished, LoadingProgress, PathText, Reply, TurnPair};
use baton_protocol::{CacheOrigin, Event, ModelName, PathKind};

impl App {
    fn reply_mut(&mut self, turn: u32) -> Option<&mut Reply> {
        self.transcript.iter_mut().rev().find_map(|e| match e {
            Entry::Reply(r) if r.turn == turn => Some(r),
            _ => None,
        })
    }

    fn pair_mut(&mut self, turn: u32) -> Option<&mut TurnPair> {
        self.pair.as_mut().filter(|p| p.turn == turn)
    }

    pub(super) fn on_event(&mut self, e: Event) -> Vec<Effect> {
        // A message waits only behind switches, so an error that ends a command then
        // ended a switch: the message was meant for after it and goes back to the box.
        let switch_failed = match &e {
            Event::Error {
                message,
                fatal: false,
            } if self.has_queued_message() && !message.starts_with("recording stopped") => {
                Some(message.clone())
            }
            _ => None,
        };
        self.apply_event(&e);
        let mut fx = match switch_failed {
            Some(message) => self.withdraw_queued(
                Level::Error,
                format!("{message} · your queued message is back in the box"),
            ),
            None => self.send_queued(),
        };
        fx.extend(self.demo_after(&e));
        fx
    }

    fn apply_event(&mut self, e: &Event) {
        match e {
            Event::Loading {
                stage,
                done,
                total,
                eta_seconds,
            } => self.phase.progress(LoadingProgress {
                stage: stage.clone(),
                done: *done,
                total: *total,
                eta_seconds: *eta_seconds,
            }),
            Event::Ready {
                models,
                active,
                mappers,
                device,
            } => {
                self.models = models.clone();
                self.active = (*active).min(models.len().saturating_sub(1));
                self.mappers = mappers.clone();
                self.device = device.clone();
                self.phase.ready();
            }
            Event::UserMessage { turn, text } => {
                self.latest_turn = *turn;
                self.turn_announced = true;
                self.transcript.push(Entry::User {
                    turn: *turn,
                    text: text.clone(),
                });
            }
            Event::TurnStarted {
                turn,
                path,
                model,
                cache,
                ..
            } => self.turn_started(*turn, *path, model, *cache),
            Event::Token {
                turn,
                path,
                text,
                id,
            } => self.token(*turn, *path, text, *id),
            Event::Generation { .. } => self.generation(e),
            Event::Switch(_) => self.switched(e),
            Event::SwitchMeasured { .. } => self.switch_measured(e),
            Event::TurnComparison { .. } => self.compared(e),
            Event::SwitchFollowUp { .. } | Event::SwitchReread { .. } => {
                self.switches.add(e);
            }
            // The busy indicator already says the turn is running; the headless log,
            // which has no indicator, is what needs these.
            Event::PrefillProgress { .. } => {}
            Event::RepairProgress {
                repaired, total, ..
            } => self.repaired = Some((*repaired, *total)),
            Event::CacheRepaired { .. } => self.cache_repaired(e),
            Event::BackgroundCalibration {
                from,
                to,
                windows,
                full,
                accepted,
                before,
                after,
                kept,
            } => {
                self.calibration.insert(from.to_string(), (*windows, *full));
                // Said when the mapper in use changed, between turns; the status line
                // counts the windows read. "Kept" only of what is on disk.
                if *accepted {
                    let fate = if *kept {
                        "taken and kept"
                    } else {
                        "taken for this session, not kept"
                    };
                    self.say(
                        Level::Info,
                        format!(
                            "mapper {from} -> {to} improved in the background: calibration window {windows} of {full} {fate} (held-out cosine {before:.3} -> {after:.3})"
                        ),
                    );
                }
            }
            Event::MapperLearned { .. } => {
                if let Some(line) = baton_protocol::summary::line(e) {
                    self.say(Level::Info, line);
                }
            }
            // The notice beside it says so on screen.
            Event::SettingChanged { .. } => {}
            Event::Notice { message } => self.notice(message),
            Event::Bookmark { turn, note } => {
                self.transcript.push(Entry::Bookmark {
                    turn: *turn,
                    note: note.clone(),
                });
                self.say(Level::Info, format!("bookmarked turn {turn}: {note}"));
            }
            Event::Error { message, fatal } => self.error(message, *fatal),
            Event::Done { .. } => {
                if self.phase.turn_done() {
                    self.say(Level::Info, "cancelled");
                }
            }
            Event::ShutDown => {
                self.phase.stop(None);
                self.say(Level::Warn, "the engine has shut down: press q to quit");
            }
        }
    }

    /// A path's answer is complete.
    fn generation(&mut self, e: &Event) {
        let Event::Generation {
            turn,
            path,
            model,
            text,
            token_ids,
            prompt_tokens,
            timings,
            stop,
        } = e
        else {
            return;
        };
        let finished = Finished {
            tokens: token_ids.len(),
            timings: *timings,
            stop: *stop,
        };
        match path {
            PathKind::Mapped => {
                self.context_tokens += prompt_tokens + token_ids.len();
                if self.reply_mut(*turn).is_none() {
                    self.turn_started(*turn, *path, model, CacheOrigin::True);
                }
                if let Some(r) = self.reply_mut(*turn) {
                    r.text = text.clone();
                    r.finished = Some(finished);
                }
                if let Some(p) = self.pair_mut(*turn) {
                    p.mapped.finish(text, token_ids, *stop);
                }
            }
            PathKind::Reference => {
                if let Some(r) = self.pair_mut(*turn).and_then(|p| p.reference.as_mut()) {
                    r.finish(text, token_ids, *stop);
                }
            }
        }
    }

    /// The conversation was handed over; its measurement may follow.
    fn switched(&mut self, e: &Event) {
        let Some(s) = self.switches.add(e) else {
            return;
        };
        let (to, context_tokens, handoff_ms) = (s.to.clone(), s.context_tokens, s.handoff_ms);
        self.repaired = None;
        self.phase.switch_answered();
        self.set_active_by_name(&to);
        self.context_tokens = context_tokens;
        self.transcript.push(Entry::Switch(self.switches.len() - 1));
        self.say(
            Level::Info,
            format!(
                "{to} has the conversation ({} ms handoff)",
                crate::panels::fmt_ms(handoff_ms)
            ),
        );
    }

    fn switch_measured(&mut self, e: &Event) {
        let Some(s) = self.switches.add(e) else {
            return;
        };
        if let baton_protocol::Measure::Stopped(why) = &s.measure {
            let line = format!("the measurement of switch #{} stopped: {why}", s.index + 1);
            self.say(Level::Info, line);
        }
    }

    /// The mapped answer was compared with the reference one.
    fn compared(&mut self, e: &Event) {
        let Event::TurnComparison {
            turn,
            identical,
            first_difference,
            agreement,
        } = e
        else {
            return;
        };
        let c = Comparison {
            identical: *identical,
            first_difference: *first_difference,
            agreement: *agreement,
        };
        if let Some(p) = self.pair_mut(*turn) {
            p.comparison = Some(c);
        }
        if let Some(r) = self.reply_mut(*turn) {
            r.comparison = Some(c);
        }
    }

    fn cache_repaired(&mut self, e: &Event) {
        let Event::CacheRepaired {
            model,
            repaired,
            total,
            complete,
            after_switch_ms,
            compute_ms,
            ..
        } = e
        else {
            return;
        };
        self.repaired = Some((*repaired, *total));
        if *complete {
            self.say(
                Level::Info,
                format!(
                    "{model}'s cache is its own again: {total} positions repaired {:.1} s after the switch ({:.1} s of prefill)",
                    after_switch_ms / 1e3,
                    compute_ms / 1e3
                ),
            );
        }
    }

    fn notice(&mut self, message: &str) {
        // The engine answers a switch with nothing to hand over by a notice that names
        // the model now active.
        if message.contains("no conversation to hand over") {
            self.phase.switch_answered();
            if let Some((name, _)) = message.split_once(" is active") {
                self.set_active_by_name(&ModelName::from(name));
            }
        }
        self.say(Level::Info, message);
    }

    fn turn_started(&mut self, turn: u32, path: PathKind, model: &ModelName, cache: CacheOrigin) {
        match path {
            PathKind::Mapped => {
                self.transcript.push(Entry::Reply(Reply {
                    turn,
                    model: model.to_string(),
                    cache,
                    text: String::new(),
                    finished: None,
                    comparison: None,
                }));
                self.pair = Some(TurnPair {
                    turn,
                    model: model.to_string(),
                    cache,
                    mapped: PathText::default(),
                    reference: None,
                    comparison: None,
                });
            }
            PathKind::Reference => {
                if let Some(p) = self.pair_mut(turn) {
                    p.reference = Some(PathText::default());
                }
            }
        }
    }

    fn token(&mut self, turn: u32, path: PathKind, text: &str, id: u32) {
        match path {
            PathKind::Mapped => {
                if let Some(r) = self.reply_mut(turn) {
                    r.text.push_str(text);
                }
                if let Some(p) = self.pair_mut(turn) {
                    p.mapped.push(id, text.to_string());
                }
            }
            PathKind::Reference => {
                if let Some(r) = self.pair_mut(turn).and_then(|p| p.reference.as_mut()) {
                    r.push(id, text.to_string());
                }
            }
        }
    }

    fn error(&mut self, message: &str, fatal: bool) {
        if fatal {
            self.phase.stop(Some(message.to_string()));
            self.overlay = Overlay::None;
            self.demo = None;
            self.say(Level::Error, format!("engine stopped: {message}"));
            return;
        }
        // A failing session file is reported mid-turn while the turn goes on; any other
        // error ends the command the engine was running.
        if message.starts_with("recording stopped") {
            self.recording_stopped = true;
        } else {
            self.phase.command_failed();
        }
        self.say(Level::Error, message);
    }

    fn set_active_by_name(&mut self, name: &ModelName) {
        if let Some(i) = self.models.iter().position(|m| m.name == *name) {
            self.active = i;
        }
    }
}

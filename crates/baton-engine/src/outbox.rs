//! The engine's channels: commands in (stamped with when they were sent), events out
//! (to the caller and, for recorded sessions, the session file), and what a generating
//! turn does with commands that arrive meanwhile.

use baton_protocol::{Command, Event};
use baton_session::SessionWriter;
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::Instant;

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

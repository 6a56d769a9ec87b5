//! A message sent while a switch runs. The engine hands the conversation over before it
//! reads anything else, so Enter then does not refuse the message: it waits here, the
//! input box and the message line say so, and it goes out once the engine has answered
//! every switch sent. Esc takes it back into the box; a failed switch or a stopped engine
//! puts it back there too, so typed text is never lost.

use super::{App, Effect, Level};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Queued {
    pub text: String,
    /// Tabs pressed after the message was queued. They are sent once its turn has gone
    /// out, so the engine runs them after it, in the order they were pressed.
    pub switches_after: u32,
}

impl App {
    /// Enter while a switch runs: the message waits for it.
    pub(super) fn queue_message(&mut self) -> Vec<Effect> {
        if self.queued.is_some() {
            self.say(
                Level::Warn,
                "a message is already queued behind the switch: press Enter again once it is sent, or Esc to take it back",
            );
            return vec![];
        }
        let text = self.input.take_message();
        self.queued = Some(Queued {
            text,
            switches_after: 0,
        });
        self.say(
            Level::Info,
            "message queued: it is sent when the handoff is done · Esc takes it back",
        );
        vec![]
    }

    /// Tab while a message waits: the switch follows the message, as it was pressed.
    pub(super) fn queue_switch_after_message(&mut self) -> Vec<Effect> {
        if let Some(q) = self.queued.as_mut() {
            q.switches_after += 1;
        }
        self.say(
            Level::Info,
            "switch queued: it runs after your queued message is answered",
        );
        vec![]
    }

    pub(super) fn has_queued_message(&self) -> bool {
        self.queued.is_some()
    }

    /// After an engine event: the queued message goes out once nothing is outstanding,
    /// and returns to the box if the engine stopped.
    pub(super) fn send_queued(&mut self) -> Vec<Effect> {
        if self.phase.stopped() {
            if let Some(q) = self.queued.take() {
                self.input.restore_message(&q.text);
            }
            return vec![];
        }
        if !self.phase.idle() {
            return vec![];
        }
        let Some(q) = self.queued.take() else {
            return vec![];
        };
        let mut fx = self.start_turn(q.text);
        for _ in 0..q.switches_after {
            fx.extend(self.send_switch());
        }
        fx
    }

    /// Takes the queued message back into the box, with `note` on the message line. The
    /// switches pressed after it no longer have a message to follow and go now.
    pub(super) fn withdraw_queued(&mut self, level: Level, note: String) -> Vec<Effect> {
        let Some(q) = self.queued.take() else {
            return vec![];
        };
        self.input.restore_message(&q.text);
        let mut fx = Vec::new();
        for _ in 0..q.switches_after {
            fx.extend(self.send_switch());
        }
        self.say(level, note);
        fx
    }
}

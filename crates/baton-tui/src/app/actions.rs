//! What the keys ask for: each checks that the engine can take it now, updates the
//! screen's state and returns the commands to send.

use super::{plan_cycle, App, Effect, Level, Overlay};
use crate::input::shows_nothing;
use crate::panels::session_line::plan_item;
use crate::panels::transcript::Transcript;
use baton_protocol::plan::RereadSetting;
use baton_protocol::Command;

impl App {
    pub(super) fn submit_input(&mut self) -> Vec<Effect> {
        if self.input.message_is_empty() {
            self.say(Level::Info, "nothing to send: type a message, then Enter");
            return vec![];
        }
        // Kept in the box, so a stray key costs nothing.
        if shows_nothing(self.input.message()) {
            self.say(
                Level::Warn,
                "not sent: the message is only spaces, line breaks or invisible characters \
                 (zero-width spaces, joiners); type some text",
            );
            return vec![];
        }
        if let Some(why) = self.phase.unavailable() {
            self.say(Level::Warn, why);
            return vec![];
        }
        if self.demo.is_some() {
            self.say(
                Level::Warn,
                "the demo is running: your message waits until it ends",
            );
            return vec![];
        }
        if self.phase.answering() {
            self.say(
                Level::Warn,
                "a turn is running: wait for it to finish, or press Esc to cancel it",
            );
            return vec![];
        }
        if self.phase.switches_pending() > 0 {
            return self.queue_message();
        }
        let text = self.input.take_message();
        self.start_turn(text)
    }

    pub(super) fn start_turn(&mut self, text: String) -> Vec<Effect> {
        self.phase.turn_sent();
        self.turn_announced = false;
        self.transcript_panel.follow();
        self.message_line.clear();
        vec![Effect::Send(Command::Submit { text })]
    }

    pub(super) fn request_switch(&mut self) -> Vec<Effect> {
        if let Some(why) = self.phase.unavailable() {
            self.say(Level::Warn, why);
            return vec![];
        }
        if self.demo.is_some() {
            self.say(Level::Warn, "the demo is running: it switches by itself");
            return vec![];
        }
        if self.has_queued_message() {
            return self.queue_switch_after_message();
        }
        self.send_switch()
    }

    pub(super) fn send_switch(&mut self) -> Vec<Effect> {
        let to = self
            .other_model()
            .map_or_else(|| "the other model".to_string(), |m| m.name.to_string());
        if self.phase.answering() {
            self.say(
                Level::Info,
                format!("switch queued: hands over to {to} when this turn is done"),
            );
        } else {
            self.say(Level::Info, format!("handing the conversation to {to}…"));
        }
        self.phase.switch_sent();
        vec![Effect::Send(Command::Switch)]
    }

    pub(super) fn toggle_repair(&mut self) -> Vec<Effect> {
        self.set_repair(!self.repair)
    }

    pub(super) fn set_repair(&mut self, enabled: bool) -> Vec<Effect> {
        self.repair = enabled;
        let what = if enabled {
            "cache repair on: while idle, the active model re-reads the conversation into its own cache"
        } else {
            "cache repair off: the mapped cache stays as it is"
        };
        self.say(Level::Info, what);
        vec![Effect::Send(Command::SetRepair { enabled })]
    }

    /// The next budget of the plan's kind (see [`plan_cycle::next_budget`]), keeping the
    /// kind, the selector and the spans.
    pub(super) fn cycle_reread(&mut self) -> Vec<Effect> {
        let next = plan_cycle::next_budget(self.reread.as_ref(), self.reread_before_off.as_ref());
        if next.is_none() {
            self.reread_before_off = self.reread;
        }
        self.set_reread(next)
    }

    /// The next plan kind (map → drop → focus), keeping the budget, the selector and the
    /// spans; from off, the default budget's plan of the next kind.
    pub(super) fn cycle_plan_kind(&mut self) -> Vec<Effect> {
        let next = plan_cycle::next_plan_kind(self.reread.as_ref());
        self.set_reread(Some(next))
    }

    /// The next layers of the plan (see [`plan_cycle::next_layers`]), numbered in the
    /// larger model's layers, keeping what the plan does with positions.
    pub(super) fn cycle_layers(&mut self) -> Vec<Effect> {
        let n_layer = self.models.iter().map(|m| m.n_layer).max().unwrap_or(0);
        if n_layer < 2 {
            self.say(Level::Warn, "no model loaded yet to number its layers");
            return vec![];
        }
        let next = plan_cycle::next_layers(self.reread.as_ref(), n_layer);
        self.set_reread(next)
    }

    /// Sets the plan and says on screen what it is now and what it was, so that a step
    /// never changes the plan without a word.
    pub(super) fn set_reread(&mut self, setting: Option<RereadSetting>) -> Vec<Effect> {
        let name = |s: Option<&RereadSetting>| s.map_or_else(|| "off".to_string(), plan_item);
        let (now, was) = (name(setting.as_ref()), name(self.reread.as_ref()));
        let words = plan_cycle::plan_words(setting.as_ref());
        let what = if now == was {
            format!("plan {now}: {words}")
        } else {
            format!("plan {now} (was {was}): {words}")
        };
        self.reread = setting;
        self.say(Level::Info, what);
        vec![Effect::Send(Command::SetReread { setting })]
    }

    pub(super) fn toggle_reference(&mut self) -> Vec<Effect> {
        self.set_reference(!self.reference)
    }

    pub(super) fn set_reference(&mut self, enabled: bool) -> Vec<Effect> {
        self.reference = enabled;
        let what = if enabled {
            "reference path on: each turn after a switch is also answered from a re-prefill"
        } else {
            "reference path off: no re-prefilled answer, no per-layer metrics"
        };
        self.say(Level::Info, what);
        vec![Effect::Send(Command::SetReference { enabled })]
    }

    pub(super) fn cancel(&mut self) -> Vec<Effect> {
        if self.phase.answering() {
            if !self.phase.cancel_requested() {
                return vec![];
            }
            self.say(Level::Info, "cancelling: what was generated so far is kept");
            return vec![Effect::Send(Command::Cancel)];
        }
        if self.has_queued_message() {
            return self.withdraw_queued(
                Level::Info,
                "your queued message is back in the box; the switch runs on (it cannot be cancelled)".into(),
            );
        }
        if self.phase.switches_pending() > 0 {
            self.say(Level::Info, "a switch cannot be cancelled; it ends shortly");
        } else if let Some(s) = self.measuring().filter(|_| !self.phase.stopped()) {
            let text = format!(
                "cancelling the measurement of switch #{}: the handoff stands",
                s.index + 1
            );
            self.say(Level::Info, text);
            return vec![Effect::Send(Command::Cancel)];
        } else {
            self.message_line.clear();
        }
        vec![]
    }

    pub(super) fn start_bookmark(&mut self) -> Vec<Effect> {
        if let Some(why) = self.phase.unavailable() {
            self.say(Level::Warn, why);
            return vec![];
        }
        self.input.open_note();
        vec![]
    }

    pub(super) fn finish_bookmark(&mut self) -> Vec<Effect> {
        let note = self.input.take_note();
        if shows_nothing(&note) {
            self.say(Level::Info, "no bookmark: the note was empty");
            return vec![];
        }
        vec![Effect::Send(Command::Bookmark { note })]
    }

    pub(super) fn request_quit(&mut self) -> Vec<Effect> {
        if self.phase.answering() {
            self.overlay = Overlay::ConfirmQuit;
            return vec![];
        }
        self.quit_now()
    }

    pub(super) fn quit_now(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        if self.phase.answering() {
            fx.push(Effect::Send(Command::Cancel));
        }
        fx.push(Effect::Send(Command::Shutdown));
        fx.push(Effect::Quit);
        fx
    }

    pub(super) fn scroll_pages(&mut self, pages: i32) -> Vec<Effect> {
        let page = self.areas().map_or(1, |a| Transcript::page(a.transcript));
        self.scroll_lines(pages.saturating_mul(page as i32))
    }

    pub(super) fn scroll_lines(&mut self, delta: i32) -> Vec<Effect> {
        if let Some(a) = self.areas() {
            let conversation = super::Conversation {
                entries: &self.transcript,
                switches: &self.switches,
                mark_reread: self.mark_reread,
            };
            self.transcript_panel
                .scroll(delta, &conversation, a.transcript);
        }
        vec![]
    }
}

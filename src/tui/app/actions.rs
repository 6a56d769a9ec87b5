//! What the keys ask for: each checks that the engine can take it now, updates the
//! screen's state and returns the commands to send.

use super::{App, Effect, Level, Overlay};
use crate::protocol::Command;
use crate::tui::panels::transcript::Transcript;

impl App {
    pub(super) fn submit_input(&mut self) -> Vec<Effect> {
        if self.input.message().trim().is_empty() {
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

    /// The next re-read budget (off, 10%, 20%, 40%), keeping the selector and spans.
    pub(super) fn cycle_reread(&mut self) -> Vec<Effect> {
        let next = next_reread(self.reread.as_deref());
        self.set_reread(next)
    }

    /// The next plan kind (map → drop → attend → trusted), keeping the budget, the
    /// selector and the spans; from off, the default budget's plan of the next kind.
    pub(super) fn cycle_plan_kind(&mut self) -> Vec<Effect> {
        let next = next_plan_kind(self.reread.as_deref());
        self.set_reread(Some(next))
    }

    pub(super) fn set_reread(&mut self, setting: Option<String>) -> Vec<Effect> {
        self.reread = setting.clone();
        let what = match &setting {
            Some(s) => format!("plan {s}: {}", plan_words(s)),
            None => "plan off: the target answers from the map as handed over".into(),
        };
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
        if note.trim().is_empty() {
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

/// The budgets Ctrl-E steps through, after off.
const REREAD_STEPS: [&str; 3] = ["10%", "20%", "40%"];

/// The plan kinds Ctrl-T steps through; `map` is written without its name.
const PLAN_KINDS: [&str; 4] = ["map", "drop", "attend", "trusted"];

/// A setting's text split into its kind (`map` when it names none) and the rest; an
/// `up:` in front (a plan for switches up only) stays with the kind's side, dropped, as
/// a cycle sets one plan for both directions.
fn split_kind(s: &str) -> (&str, &str) {
    let s = s.strip_prefix("up:").unwrap_or(s);
    match s.split_once(':') {
        Some((k, rest)) if PLAN_KINDS.contains(&k) || k == "tail" => (k, rest),
        _ => ("map", s),
    }
}

/// `rest` under plan `kind`.
fn with_kind(kind: &str, rest: &str) -> String {
    if kind == "map" {
        rest.to_string()
    } else {
        format!("{kind}:{rest}")
    }
}

/// The setting after `current` in the cycle off → 10% → 20% → 40% → off; a budget not
/// in the cycle (a time, 25%) goes to off. The kind, selector and spans stay.
fn next_reread(current: Option<&str>) -> Option<String> {
    let (kind, rest) = match current {
        None => return Some(REREAD_STEPS[0].to_string()),
        Some(s) => split_kind(s),
    };
    let (budget, tail) = rest.split_once(':').map_or((rest, ""), |(b, r)| (b, r));
    let i = REREAD_STEPS.iter().position(|b| *b == budget)?;
    let next = REREAD_STEPS.get(i + 1)?;
    let rest = if tail.is_empty() {
        next.to_string()
    } else {
        format!("{next}:{tail}")
    };
    Some(with_kind(kind, &rest))
}

/// The setting with the next plan kind, the rest kept; off becomes 20% of the next kind
/// after `map`.
fn next_plan_kind(current: Option<&str>) -> String {
    let (kind, rest) = current.map_or(("map", "20%"), split_kind);
    let kind = if kind == "tail" { "drop" } else { kind };
    let i = PLAN_KINDS.iter().position(|k| *k == kind).unwrap_or(0);
    with_kind(PLAN_KINDS[(i + 1) % PLAN_KINDS.len()], rest)
}

/// What a plan does, in words, for the line that confirms it.
fn plan_words(setting: &str) -> &'static str {
    match split_kind(setting).0 {
        "drop" | "tail" => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history and drops the rest"
        }
        "attend" => {
            "at the first message after a switch the target keeps that much of the mapped \
             history, the part the message attends to, and drops the rest"
        }
        "trusted" => {
            "at the first message after a switch the target re-reads that much, keeps mapped \
             what the map is trusted with and drops the rest"
        }
        _ => {
            "at the first message after a switch the target re-reads that much of the mapped \
             history"
        }
    }
}

#[cfg(test)]
mod reread_cycle_tests {
    use super::next_reread;

    #[test]
    fn the_budget_cycles_through_off_and_keeps_the_selector() {
        assert_eq!(next_reread(None).as_deref(), Some("10%"));
        let s = next_reread(Some("10%:round-trip:word"));
        assert_eq!(s.as_deref(), Some("20%:round-trip:word"));
        assert_eq!(next_reread(Some("20%")).as_deref(), Some("40%"));
        assert_eq!(next_reread(Some("40%:deviation:token")), None);
        assert_eq!(next_reread(Some("150ms:recency:word")), None);
        assert_eq!(
            next_reread(Some("drop:10%:source-attention:word")).as_deref(),
            Some("drop:20%:source-attention:word")
        );
        assert_eq!(next_reread(Some("attend:40%")), None);
    }

    #[test]
    fn the_plan_kind_cycles_and_keeps_the_budget() {
        use super::next_plan_kind;
        assert_eq!(next_plan_kind(None), "drop:20%");
        assert_eq!(
            next_plan_kind(Some("10%:round-trip:word")),
            "drop:10%:round-trip:word"
        );
        assert_eq!(next_plan_kind(Some("drop:10%")), "attend:10%");
        assert_eq!(next_plan_kind(Some("attend:10%")), "trusted:10%");
        assert_eq!(next_plan_kind(Some("trusted:40%:recency")), "40%:recency");
        assert_eq!(next_plan_kind(Some("tail:20%")), "attend:20%");
        // The default, for switches up only, steps to a plan for both directions.
        assert_eq!(
            next_plan_kind(Some("up:40%:cheaper-attention:word")),
            "drop:40%:cheaper-attention:word"
        );
        assert_eq!(
            next_reread(Some("up:20%:cheaper-attention:word")).as_deref(),
            Some("40%:cheaper-attention:word")
        );
    }
}

//! A scripted demo: the workbench sends the script's commands one at a time, each once
//! the engine has answered the previous one, and pauses after every switch so a presenter
//! can talk over the numbers.

use super::{App, Effect, Level};
use baton_protocol::{Command, Event};
use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Demo {
    pub steps: VecDeque<Command>,
    pub total: usize,
    /// The command sent and not yet answered.
    pub waiting: Option<Command>,
    /// Set after a switch until the presenter presses a key; holds the switch's index
    /// into the app's switches.
    pub paused_after: Option<usize>,
}

impl Demo {
    /// The step now running or next to run, counted from 1.
    pub fn step(&self) -> usize {
        self.total - self.steps.len()
    }
}

impl App {
    /// Start a scripted demo. Its first step goes out now if the engine is ready and
    /// idle, otherwise once it is.
    pub fn load_demo(&mut self, steps: Vec<Command>) -> Vec<Effect> {
        self.demo = Some(Demo {
            total: steps.len(),
            steps: steps.into(),
            waiting: None,
            paused_after: None,
        });
        if self.phase.idle() {
            self.demo_next()
        } else {
            vec![]
        }
    }

    pub(super) fn demo_paused(&self) -> bool {
        self.demo.as_ref().is_some_and(|d| d.paused_after.is_some())
    }

    pub(super) fn demo_continue(&mut self) -> Vec<Effect> {
        if let Some(d) = self.demo.as_mut() {
            d.paused_after = None;
        }
        self.demo_next()
    }

    /// Move the demo on after an engine event.
    pub(super) fn demo_after(&mut self, e: &Event) -> Vec<Effect> {
        let switch_index = self.switches.len().checked_sub(1);
        let Some(d) = self.demo.as_mut() else {
            return vec![];
        };
        match (&d.waiting, e) {
            (None, Event::Ready { .. }) if d.paused_after.is_none() => return self.demo_next(),
            (Some(cmd), _) if cmd.answered_by(e) => {
                d.waiting = None;
                if matches!(e, Event::Switch(_)) {
                    d.paused_after = switch_index;
                    return vec![];
                }
                return self.demo_next();
            }
            _ => {}
        }
        vec![]
    }

    fn demo_next(&mut self) -> Vec<Effect> {
        let Some(d) = self.demo.as_mut() else {
            return vec![];
        };
        if d.waiting.is_some() || d.paused_after.is_some() {
            return vec![];
        }
        let Some(cmd) = d.steps.pop_front() else {
            self.demo = None;
            self.say(Level::Info, "demo finished: the workbench is yours");
            return vec![];
        };
        d.waiting = Some(cmd.clone());
        match cmd {
            Command::Submit { text } => self.start_turn(text),
            Command::Switch => self.send_switch(),
            Command::SetReference { enabled } => self.set_reference(enabled),
            Command::SetRepair { enabled } => self.set_repair(enabled),
            Command::SetReread { setting } => self.set_reread(setting),
            Command::Cancel
            | Command::Bookmark { .. }
            | Command::Finish
            | Command::RepairTo { .. } => {
                vec![Effect::Send(cmd)]
            }
            Command::Shutdown => {
                self.demo = None;
                self.quit_now()
            }
        }
    }
}

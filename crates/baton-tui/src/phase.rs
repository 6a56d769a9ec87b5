//! Where the workbench stands with the engine: loading, taking commands, or stopped. One
//! value with its transitions here, so that a turn cannot be running while the models
//! load, nothing can be cancelling once the engine has stopped, and a stop always clears
//! what was outstanding.

use super::records::LoadingProgress;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Phase {
    /// Before the engine's `Ready`: nothing can be sent yet. Holds the latest progress.
    Loading { progress: Option<LoadingProgress> },
    /// The models are loaded and the engine takes commands.
    Ready {
        turn: Turn,
        /// Switches sent and not yet answered. A counter beside the turn rather than a
        /// phase of its own, because the two overlap: Tab during a turn queues a switch
        /// behind it (a turn and a switch are outstanding at once), several Tabs queue
        /// several switches, and the engine answers each in order (with a switch, a
        /// notice that there was nothing to hand over, or an error).
        switches_pending: u32,
    },
    /// The engine has stopped: it shut down, or failed with `fatal`. `loaded` says
    /// whether it got as far as `Ready`; if not, the screen stays on the loading box.
    Stopped { fatal: Option<String>, loaded: bool },
}

/// Whether a turn is being answered, while the engine takes commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    Idle,
    /// A message was sent and its turn has not ended; `cancelling` once Esc asked the
    /// engine to stop it.
    Answering {
        cancelling: bool,
    },
}

impl Default for Phase {
    fn default() -> Self {
        Self::Loading { progress: None }
    }
}

impl Phase {
    /// The engine reported how far loading got.
    pub fn progress(&mut self, p: LoadingProgress) {
        if let Self::Loading { progress } = self {
            *progress = Some(p);
        }
    }

    /// The engine is ready: commands may go.
    pub fn ready(&mut self) {
        if matches!(self, Self::Loading { .. }) {
            *self = Self::Ready {
                turn: Turn::Idle,
                switches_pending: 0,
            };
        }
    }

    /// A message went out: its turn runs until the engine says it is done.
    pub fn turn_sent(&mut self) {
        if let Self::Ready { turn, .. } = self {
            *turn = Turn::Answering { cancelling: false };
        }
    }

    /// Esc asked for the running turn to stop; false if there is none or it was asked
    /// already.
    pub fn cancel_requested(&mut self) -> bool {
        match self {
            Self::Ready {
                turn: turn @ Turn::Answering { cancelling: false },
                ..
            } => {
                *turn = Turn::Answering { cancelling: true };
                true
            }
            _ => false,
        }
    }

    /// The engine ended the turn; true if it was being cancelled.
    pub fn turn_done(&mut self) -> bool {
        match self {
            Self::Ready { turn, .. } => {
                let cancelled = *turn == Turn::Answering { cancelling: true };
                *turn = Turn::Idle;
                cancelled
            }
            _ => false,
        }
    }

    pub fn switch_sent(&mut self) {
        if let Self::Ready {
            switches_pending, ..
        } = self
        {
            *switches_pending += 1;
        }
    }

    /// The engine answered the oldest switch sent.
    pub fn switch_answered(&mut self) {
        if let Self::Ready {
            switches_pending, ..
        } = self
        {
            *switches_pending = switches_pending.saturating_sub(1);
        }
    }

    /// A command failed without stopping the engine: the running turn if there is one,
    /// otherwise the oldest switch.
    pub fn command_failed(&mut self) {
        match self {
            Self::Ready {
                turn: turn @ Turn::Answering { .. },
                ..
            } => *turn = Turn::Idle,
            _ => self.switch_answered(),
        }
    }

    /// The engine stopped, on `fatal` if it failed. An earlier failure's message is kept
    /// when it then shuts down.
    pub fn stop(&mut self, fatal: Option<String>) {
        let (earlier, loaded) = match std::mem::take(self) {
            Self::Loading { .. } => (None, false),
            Self::Ready { .. } => (None, true),
            Self::Stopped { fatal, loaded } => (fatal, loaded),
        };
        *self = Self::Stopped {
            fatal: fatal.or(earlier),
            loaded,
        };
    }

    /// Whether the models ever became ready (the main screen shows, not the loading box).
    pub fn loaded(&self) -> bool {
        match self {
            Self::Loading { .. } => false,
            Self::Ready { .. } => true,
            Self::Stopped { loaded, .. } => *loaded,
        }
    }

    pub fn stopped(&self) -> bool {
        matches!(self, Self::Stopped { .. })
    }

    pub fn fatal(&self) -> Option<&str> {
        match self {
            Self::Stopped { fatal, .. } => fatal.as_deref(),
            _ => None,
        }
    }

    pub fn loading_progress(&self) -> Option<&LoadingProgress> {
        match self {
            Self::Loading { progress } => progress.as_ref(),
            _ => None,
        }
    }

    pub fn answering(&self) -> bool {
        matches!(
            self,
            Self::Ready {
                turn: Turn::Answering { .. },
                ..
            }
        )
    }

    pub fn cancelling(&self) -> bool {
        matches!(
            self,
            Self::Ready {
                turn: Turn::Answering { cancelling: true },
                ..
            }
        )
    }

    pub fn switches_pending(&self) -> u32 {
        match self {
            Self::Ready {
                switches_pending, ..
            } => *switches_pending,
            _ => 0,
        }
    }

    /// Whether the engine is answering a turn or running a switch.
    pub fn busy(&self) -> bool {
        self.answering() || self.switches_pending() > 0
    }

    /// Ready with nothing outstanding.
    pub fn idle(&self) -> bool {
        matches!(
            self,
            Self::Ready {
                turn: Turn::Idle,
                switches_pending: 0
            }
        )
    }

    /// Why a command cannot go to the engine now, if it cannot.
    pub fn unavailable(&self) -> Option<&'static str> {
        match self {
            Self::Stopped { .. } => Some("the engine has stopped: press q to quit"),
            Self::Loading { .. } => Some("the models are still loading"),
            Self::Ready { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Phase {
        let mut p = Phase::default();
        p.ready();
        p
    }

    #[test]
    fn nothing_runs_before_the_models_are_ready() {
        let mut p = Phase::default();
        p.turn_sent();
        p.switch_sent();
        assert!(!p.busy() && !p.loaded());
        assert_eq!(p.unavailable(), Some("the models are still loading"));
        p.progress(LoadingProgress {
            stage: "loading".into(),
            done: 1,
            total: 2,
            eta_seconds: None,
        });
        assert_eq!(p.loading_progress().map(|l| l.done), Some(1));
        p.ready();
        assert!(p.idle() && p.loaded() && p.loading_progress().is_none());
    }

    #[test]
    fn a_turn_is_cancelled_once_and_ends_on_done() {
        let mut p = ready();
        assert!(!p.cancel_requested());
        p.turn_sent();
        assert!(p.answering() && !p.cancelling());
        assert!(p.cancel_requested());
        assert!(!p.cancel_requested());
        assert!(p.turn_done());
        assert!(p.idle());
        assert!(!p.turn_done());
    }

    #[test]
    fn switches_queue_beside_a_turn() {
        let mut p = ready();
        p.turn_sent();
        p.switch_sent();
        p.switch_sent();
        assert_eq!(p.switches_pending(), 2);
        // A failure ends the turn first, then the oldest switch.
        p.command_failed();
        assert!(!p.answering() && p.busy());
        p.command_failed();
        p.switch_answered();
        assert!(p.idle());
        p.switch_answered();
        assert_eq!(p.switches_pending(), 0);
    }

    #[test]
    fn a_stop_clears_everything_and_keeps_the_failure() {
        let mut p = ready();
        p.turn_sent();
        p.switch_sent();
        p.stop(Some("out of memory".into()));
        assert!(p.stopped() && !p.busy() && p.loaded());
        p.stop(None);
        assert_eq!(p.fatal(), Some("out of memory"));
        p.ready();
        p.turn_sent();
        assert!(p.stopped() && !p.answering());
        let mut p = Phase::default();
        p.stop(Some("no such model".into()));
        assert!(!p.loaded());
        assert_eq!(
            p.unavailable(),
            Some("the engine has stopped: press q to quit")
        );
    }
}

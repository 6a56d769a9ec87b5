//! Progress reporting for fetches.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Receives progress of a fetch. Called from the fetching thread only.
pub trait FetchProgress {
    /// A one-line status message (source being tried, a fallback, a warning).
    fn message(&self, msg: &str);
    /// Bytes done so far of the current step, and its total when known.
    fn bytes(&self, done: u64, total: Option<u64>);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentProgress;

impl FetchProgress for SilentProgress {
    fn message(&self, _msg: &str) {}
    fn bytes(&self, _done: u64, _total: Option<u64>) {}
}

/// An indicatif progress bar on stderr with bytes, rate and ETA. Messages are printed
/// above the bar (or as plain lines when stderr is not a terminal).
pub struct BarProgress {
    bar: ProgressBar,
    tty: bool,
}

impl BarProgress {
    pub fn new() -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        BarProgress { bar, tty }
    }
}

impl Default for BarProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl FetchProgress for BarProgress {
    fn message(&self, msg: &str) {
        if self.tty && !self.bar.is_hidden() {
            self.bar.println(msg);
        } else {
            eprintln!("{msg}");
        }
    }

    fn bytes(&self, done: u64, total: Option<u64>) {
        if let Some(total) = total {
            if self.bar.length() != Some(total) {
                self.bar.set_length(total);
                self.bar.reset_eta();
            }
        } else if self.bar.length().is_some() {
            self.bar.unset_length();
        }
        self.bar.set_position(done);
    }
}

impl Drop for BarProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

//! One progress bar per phase on stderr, with elapsed time and ETA; lines printed while a
//! bar is up go above it so neither garbles the other.

use crate::eval::EvalProgress;
use indicatif::{ProgressBar, ProgressStyle};
use std::cell::RefCell;

/// Bars for a run of phases (calibration steps, evaluated tasks). With `json` set,
/// result lines go to stderr so stdout stays one JSON document.
pub struct PhaseBars {
    bar: RefCell<Option<ProgressBar>>,
    json: bool,
}

impl PhaseBars {
    pub fn new(json: bool) -> Self {
        Self {
            bar: RefCell::new(None),
            json,
        }
    }

    /// Ends the current phase's bar and starts one for `name` with `total` steps.
    pub fn phase(&self, name: &str, total: u64) {
        self.finish(false);
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:>28} [{bar:30}] {pos}/{len} elapsed {elapsed} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(name.to_string());
        *self.bar.borrow_mut() = Some(b);
    }

    pub fn advance(&self, n: u64) {
        if let Some(b) = self.bar.borrow().as_ref() {
            b.inc(n);
        }
    }

    pub fn set_position(&self, n: u64) {
        if let Some(b) = self.bar.borrow().as_ref() {
            b.set_position(n);
        }
    }

    /// Ends the current bar, leaving it on screen or clearing it.
    pub fn finish(&self, clear: bool) {
        if let Some(b) = self.bar.borrow_mut().take() {
            if clear {
                b.finish_and_clear();
            } else {
                b.finish();
            }
        }
    }

    /// A line on stderr, above the bar when one is up.
    pub fn note(&self, msg: &str) {
        match self.bar.borrow().as_ref() {
            Some(b) => b.suspend(|| eprintln!("{msg}")),
            None => eprintln!("{msg}"),
        }
    }

    /// A result line: stdout, or stderr under `--json`.
    pub fn result(&self, msg: &str) {
        if self.json {
            self.note(msg);
        } else {
            match self.bar.borrow().as_ref() {
                Some(b) => b.suspend(|| println!("{msg}")),
                None => println!("{msg}"),
            }
        }
    }
}

impl EvalProgress for PhaseBars {
    fn status(&self, line: &str) {
        self.note(line);
    }
    fn result(&self, line: &str) {
        PhaseBars::result(self, line);
    }
    fn task_started(&self, label: &str, items: usize) {
        self.phase(label, items as u64);
    }
    fn task_advanced(&self, done: usize) {
        self.set_position(done as u64);
    }
    fn task_finished(&self) {
        self.finish(true);
    }
}

impl crate::calibrate::CalibrationProgress for PhaseBars {
    fn phase(&self, name: &str, total: u64) {
        PhaseBars::phase(self, name, total);
    }
    fn advance(&self, n: u64) {
        PhaseBars::advance(self, n);
    }
    fn note(&self, msg: &str) {
        PhaseBars::note(self, msg);
    }
}

//! One progress bar per phase on stderr, with elapsed time and ETA; lines printed while a
//! bar is up go above it so neither garbles the other.

use indicatif::{ProgressBar, ProgressStyle};
use std::cell::{Cell, RefCell};
use std::io::IsTerminal;
use std::time::Instant;

/// Bars for a run of phases (calibration steps, evaluated tasks). With `json` set,
/// result lines go to stderr so stdout stays one JSON document. Without a terminal on
/// stderr (a log file, a CI job) no bar can be drawn, so each phase says how far it got
/// in a plain line at every tenth of the way instead: a long run can still be watched.
pub struct PhaseBars {
    bar: RefCell<Option<ProgressBar>>,
    json: bool,
    plain: Option<PlainProgress>,
}

/// Where a phase stands, for the plain lines.
struct PlainProgress {
    name: RefCell<String>,
    total: Cell<u64>,
    pos: Cell<u64>,
    /// The tenths already reported.
    told: Cell<u64>,
    started: Cell<Instant>,
}

impl PlainProgress {
    /// The line to print on reaching `pos`, when it crosses a tenth of the phase.
    fn reached(&self, pos: u64) -> Option<String> {
        self.pos.set(pos);
        let total = self.total.get();
        if total == 0 {
            return None;
        }
        let tenth = (pos.min(total) * 10) / total;
        if tenth <= self.told.get() {
            return None;
        }
        self.told.set(tenth);
        Some(format!(
            "{}: {pos}/{total} after {:.0} s",
            self.name.borrow(),
            self.started.get().elapsed().as_secs_f64()
        ))
    }
}

impl PhaseBars {
    pub fn new(json: bool) -> Self {
        Self::with_plain_lines(json, !std::io::stderr().is_terminal())
    }

    fn with_plain_lines(json: bool, plain: bool) -> Self {
        Self {
            bar: RefCell::new(None),
            json,
            plain: plain.then(|| PlainProgress {
                name: RefCell::new(String::new()),
                total: Cell::new(0),
                pos: Cell::new(0),
                told: Cell::new(0),
                started: Cell::new(Instant::now()),
            }),
        }
    }

    fn tell(&self, pos: u64) {
        if let Some(line) = self.plain.as_ref().and_then(|p| p.reached(pos)) {
            eprintln!("{line}");
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
        if let Some(p) = &self.plain {
            *p.name.borrow_mut() = name.to_string();
            p.total.set(total);
            p.pos.set(0);
            p.told.set(0);
            p.started.set(Instant::now());
        }
    }

    pub fn advance(&self, n: u64) {
        if let Some(b) = self.bar.borrow().as_ref() {
            b.inc(n);
        }
        if let Some(p) = &self.plain {
            self.tell(p.pos.get() + n);
        }
    }

    pub fn set_position(&self, n: u64) {
        if let Some(b) = self.bar.borrow().as_ref() {
            b.set_position(n);
        }
        self.tell(n);
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

impl baton_method::calibrate::CalibrationProgress for PhaseBars {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_terminal_a_phase_reports_each_tenth_once() {
        let bars = PhaseBars::with_plain_lines(false, true);
        bars.phase("recall (turns)", 20);
        let p = bars.plain.as_ref().unwrap();
        assert_eq!(p.reached(1), None, "a twentieth is not yet a tenth");
        let line = p.reached(2).unwrap();
        assert!(line.starts_with("recall (turns): 2/20 after "), "{line}");
        assert_eq!(p.reached(3), None);
        assert!(p.reached(11).unwrap().starts_with("recall (turns): 11/20"));
        assert!(p.reached(20).is_some());
        assert_eq!(p.reached(20), None, "the end is said once");
        // A new phase starts counting again.
        bars.phase("capture", 4);
        assert!(bars.plain.as_ref().unwrap().reached(1).is_some());
    }

    #[test]
    fn with_a_terminal_the_bar_alone_shows_progress() {
        assert!(PhaseBars::with_plain_lines(false, false).plain.is_none());
    }
}

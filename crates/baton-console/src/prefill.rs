//! Progress lines for a long prefill (`baton run`): a message of tens of thousands of
//! tokens is read for minutes before its first token, and a log that says nothing
//! meanwhile looks hung. A prefill that ends within [`QUIET`] prints nothing, so short
//! messages keep the log as it was.

use baton_protocol::PathKind;
use std::time::{Duration, Instant};

/// How long a prefill runs before its first line.
pub const QUIET: Duration = Duration::from_secs(3);
/// The least time between two lines of one prefill.
pub const EVERY: Duration = Duration::from_secs(5);

/// The prefill being watched: which one, when it started and when it last printed.
#[derive(Debug, Clone, Copy)]
struct Watched {
    turn: u32,
    path: PathKind,
    started: Instant,
    printed: Option<Instant>,
}

/// Turns the engine's prefill progress into a line now and then.
#[derive(Debug, Default)]
pub struct PrefillMeter {
    watched: Option<Watched>,
}

impl PrefillMeter {
    /// The line to print for `done` of `total` ids read by `path` at `now`, if one is due.
    pub fn line(
        &mut self,
        turn: u32,
        path: PathKind,
        done: usize,
        total: usize,
        now: Instant,
    ) -> Option<String> {
        let w = match self.watched {
            Some(w) if w.turn == turn && w.path == path => w,
            // A report of another prefill starts the clock anew: the first one of a
            // prefill says 0 done and comes before any work.
            _ => Watched {
                turn,
                path,
                started: now,
                printed: None,
            },
        };
        let elapsed = now.saturating_duration_since(w.started);
        let finished = done >= total;
        let due = match w.printed {
            // The end of a prefill that was shown, so its last line is not left at 90%.
            Some(_) if finished => true,
            Some(last) => now.saturating_duration_since(last) >= EVERY,
            None => !finished && elapsed >= QUIET,
        };
        self.watched = (!finished).then_some(Watched {
            printed: if due { Some(now) } else { w.printed },
            ..w
        });
        if !due {
            return None;
        }
        let label = match path {
            PathKind::Mapped => "",
            PathKind::Reference => " reference",
        };
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        if finished {
            return Some(format!(
                "[turn {turn}]{label} prefill done: {total} tokens read in {secs:.0} s ({rate:.0} tok/s)"
            ));
        }
        let left = match rate > 0.0 {
            true => format!(
                ", about {} left",
                fmt_duration((total - done) as f64 / rate)
            ),
            false => String::new(),
        };
        Some(format!(
            "[turn {turn}]{label} prefill: {done} / {total} tokens read ({:.0}%), {rate:.0} tok/s{left}",
            done as f64 * 100.0 / total.max(1) as f64
        ))
    }
}

fn fmt_duration(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        _ => format!("{} min {} s", s / 60, s % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOTAL: usize = 25_000;

    /// The lines a prefill of [`TOTAL`] prints when chunk `i` of `n` is done `at(i)` into it.
    fn run(n: usize, at: impl Fn(usize) -> Duration) -> Vec<String> {
        let mut m = PrefillMeter::default();
        let t0 = Instant::now();
        (0..=n)
            .filter_map(|i| m.line(4, PathKind::Mapped, TOTAL * i / n, TOTAL, t0 + at(i)))
            .collect()
    }

    #[test]
    fn a_short_prefill_prints_nothing() {
        let lines = run(10, |i| Duration::from_millis(250 * i as u64));
        assert!(lines.is_empty(), "{lines:?}");
    }

    #[test]
    fn a_long_prefill_prints_every_few_seconds_with_its_rate_and_its_end() {
        // 50 chunks, one a second: 50 s in all.
        let lines = run(50, |i| Duration::from_secs(i as u64));
        // The first after QUIET, then one per EVERY, then the end.
        assert_eq!(lines.len(), 1 + (50 - 3) / 5 + 1, "{lines:#?}");
        assert_eq!(
            lines[0],
            "[turn 4] prefill: 1500 / 25000 tokens read (6%), 500 tok/s, about 47 s left"
        );
        assert!(lines[1].contains("4000 / 25000"), "{lines:#?}");
        assert_eq!(
            lines.last().unwrap(),
            "[turn 4] prefill done: 25000 tokens read in 50 s (500 tok/s)"
        );
    }

    #[test]
    fn a_new_turn_or_path_starts_its_own_clock() {
        let mut m = PrefillMeter::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert!(m.line(1, PathKind::Mapped, 0, TOTAL, t0).is_none());
        assert!(m.line(1, PathKind::Mapped, 512, TOTAL, t0 + s(4)).is_some());
        // The reference path of the same turn reads from the start: not yet due.
        assert!(m
            .line(1, PathKind::Reference, 0, TOTAL, t0 + s(5))
            .is_none());
        assert!(m
            .line(1, PathKind::Reference, 512, TOTAL, t0 + s(6))
            .is_none());
        let l = m.line(1, PathKind::Reference, 1024, TOTAL, t0 + s(9));
        assert!(l.is_some_and(|l| l.starts_with("[turn 1] reference prefill: 1024")));
    }
}

//! Calibration that goes on while the workbench is idle. A first run fits its mappers on
//! little text; the statistics add up, so the learning thread reads further windows of
//! the calibration corpus, one at a time, and weighs each as learning weighs a
//! conversation (an update taken only if the held-out cosine does not drop, kept as a
//! shard of its own, so a `baton calibrate` of the same directory at the same time tears
//! nothing). It stops once it has read as much text as the full calibration.
//!
//! The windows are the corpus's fit split at the first run's window length, after those
//! the first run fitted on: text the learner's held-out slice (the selection split)
//! never holds. What was read in earlier sessions is known from the learned steps'
//! labels, so a later session goes on where the last one stopped; what another
//! workbench on the same directory reads meanwhile, from the windows' claims
//! ([`baton_method::mapper::dir::WindowClaim`]).

use baton_data::corpus::{self, Document, Split};
use baton_method::calibrate::{capture_until, CalibrateOptions};
use baton_method::learn::store::{LearnedMeta, CALIBRATION_WINDOW as LABEL};
use baton_method::mapper::artifact::CorpusInfo;
use baton_method::metrics::probe_positions;
use baton_runtime::model::{KvCache, Model};
use candle_core::Tensor;

/// Probes per window the update is judged at (in its newest quarter).
const PROBES: usize = 32;

/// The windows one direction reads in the background.
pub(super) struct Windows {
    /// Every fit window up to the full calibration's text, in order.
    windows: Vec<Vec<u32>>,
    /// The next to read.
    next: usize,
    /// Windows passed over because another reader of the mapper holds or read them.
    elsewhere: usize,
}

impl Windows {
    /// The windows left after those the mapper was calibrated on (`c`) and those earlier
    /// sessions read; `None` when it was calibrated on as much text as the full
    /// calibration already.
    pub fn open(
        c: &CorpusInfo,
        learned: &LearnedMeta,
        tgt: &Model,
        docs: &[Document],
    ) -> Result<Option<Self>, String> {
        let full = full_windows(c.seq_len);
        if c.sequences >= full {
            return Ok(None);
        }
        let read_before = learned
            .steps
            .iter()
            .filter_map(|s| s.from.strip_prefix(LABEL)?.parse::<usize>().ok())
            .max()
            .map_or(0, |last| last + 1);
        // Windows are taken from the documents in turn, so fewer are the first of more:
        // a corpus short of the full calibration's text gives what it has.
        let take = |n| corpus::windows(docs, &tgt.tokenizer, Split::Fit, c.seq_len, n);
        let windows = match take(full) {
            Err(corpus::CorpusError::TooSmall { got, .. }) => take(got),
            other => other,
        }
        .map_err(|e| e.to_string())?;
        Ok(Some(Self {
            next: read_before.max(c.sequences).min(windows.len()),
            windows,
            elsewhere: 0,
        }))
    }

    /// The window to read next and its number, or `None` when all are read.
    pub fn current(&self) -> Option<(usize, &[u32])> {
        self.windows
            .get(self.next)
            .map(|w| (self.next, w.as_slice()))
    }

    pub fn advance(&mut self) {
        self.next = (self.next + 1).min(self.windows.len());
    }

    /// Passes over the current window, which another reader holds or has read.
    pub fn read_by_another(&mut self) {
        self.elsewhere += 1;
        self.advance();
    }

    /// How many windows were passed over for another reader.
    pub fn read_elsewhere(&self) -> usize {
        self.elsewhere
    }

    /// Windows read so far (the first run's included), and how many make the full
    /// calibration's text.
    pub fn progress(&self) -> (usize, usize) {
        (self.next, self.windows.len())
    }
}

/// Windows of `seq_len` tokens holding the full calibration's text. A corpus with less
/// fit text gives fewer.
fn full_windows(seq_len: usize) -> usize {
    let full = CalibrateOptions::default();
    (full.sequences * full.seq_len).div_ceil(seq_len.max(1))
}

/// Both models' own caches of one window, and the target's queries at its probes (past
/// `anchor`): what a learning step takes. `stop` gives up part way
/// ([`baton_runtime::model::ModelError::Interrupted`]) when a message or a switch is waiting.
pub(super) struct Read {
    pub src: KvCache,
    pub tgt: KvCache,
    pub queries: Vec<Tensor>,
    pub probes: Vec<usize>,
}

pub(super) fn read(
    src: &Model,
    tgt: &Model,
    tokens: &[u32],
    anchor: usize,
    stop: &dyn Fn() -> bool,
) -> Result<Read, baton_method::calibrate::CalibrateError> {
    let probes: Vec<usize> = probe_positions(tokens.len(), PROBES)
        .into_iter()
        .filter(|&p| p >= anchor)
        .collect();
    let s = capture_until(src, tokens, &[], stop)?;
    let t = capture_until(tgt, tokens, &probes, stop)?;
    Ok(Read {
        src: s.cache,
        tgt: t.cache,
        queries: t.queries,
        probes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_calibration_is_counted_in_windows_of_the_first_runs_length() {
        // 64 windows of 512 tokens: 128 of 256, 64 of 512, 32 of 1024.
        assert_eq!(full_windows(256), 128);
        assert_eq!(full_windows(512), 64);
        assert_eq!(full_windows(1000), 33);
    }
}

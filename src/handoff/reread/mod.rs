//! Choosing what the target re-reads of a handed-over cache, once the next message is
//! known.
//!
//! The map keeps the gist of a conversation and loses its facts. The target can recompute
//! a chosen part of the cache itself ([`crate::model::Decoder::reread`]); which part is
//! the question here. A [`Selector`] scores every mapped position of the history, the
//! opening (the system prompt) is always taken, the best-scored positions grow into the
//! spans around them (words or sentences, [`SpanGrowth`]), and spans are taken until the
//! [`RereadBudget`] is spent. The selectors:
//! - `source-attention`: the source model reads the message over its own cache of the
//!   history, and each position scores the attention the message's tokens give it,
//!   summed over layers and heads. The small model reads the message: cheap, and its
//!   cache of the history is exact;
//! - `target-attention`: the same read by the target over the mapped cache (it sees what
//!   the target will attend to, through the map's error);
//! - `round-trip`: the predicted error per position, one minus the cosine of the source's
//!   own keys and values with what mapping them to the target and back gives (the gate's
//!   round trip, position by position; it needs the reverse mapper);
//! - `deviation`: the target computes its first layers itself for every position and each
//!   position scores how far the map is from them there (CacheBlend's choice);
//! - `recency`: the newest positions, the same as a longer tail: the baseline.

mod scores;
mod spans;

pub use scores::{score_positions, SelectInputs};
pub use spans::{opening_len, pick_spans, unit_starts};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;

#[derive(Debug, thiserror::Error)]
pub enum RereadError {
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Gate(#[from] crate::gate::GateError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Metric(#[from] crate::metrics::MetricError),
    #[error("{0}")]
    Input(String),
}

/// How much to re-read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RereadBudget {
    /// A share of the history's positions, 0 to 1, the opening included.
    Share(f64),
    /// As many positions as the target reads in this many milliseconds, at the speed its
    /// last re-prefill was measured at.
    Millis(f64),
}

/// What ranks the positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Selector {
    SourceAttention,
    TargetAttention,
    RoundTrip,
    Deviation,
    Recency,
}

impl Selector {
    pub const ALL: [Selector; 5] = [
        Selector::SourceAttention,
        Selector::TargetAttention,
        Selector::RoundTrip,
        Selector::Deviation,
        Selector::Recency,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Selector::SourceAttention => "source-attention",
            Selector::TargetAttention => "target-attention",
            Selector::RoundTrip => "round-trip",
            Selector::Deviation => "deviation",
            Selector::Recency => "recency",
        }
    }

    pub fn parse(s: &str) -> Result<Self, RereadError> {
        Self::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                RereadError::Input(format!(
                    "unknown re-read selector {s:?}: use one of {}",
                    Self::ALL.map(Selector::name).join(", ")
                ))
            })
    }
}

/// What a chosen position grows into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanGrowth {
    /// The position alone.
    Token,
    /// The word it is part of.
    Word,
    /// The sentence (or line) it is part of.
    Sentence,
}

impl SpanGrowth {
    pub const ALL: [SpanGrowth; 3] = [SpanGrowth::Token, SpanGrowth::Word, SpanGrowth::Sentence];

    pub fn name(self) -> &'static str {
        match self {
            SpanGrowth::Token => "token",
            SpanGrowth::Word => "word",
            SpanGrowth::Sentence => "sentence",
        }
    }
}

/// A re-read setting: how much, chosen how, grown into what.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RereadSetting {
    pub budget: RereadBudget,
    pub selector: Selector,
    pub spans: SpanGrowth,
}

impl RereadSetting {
    /// The selector and span growth the measurement chose (docs/reread.md).
    pub const DEFAULT_SELECTOR: Selector = Selector::SourceAttention;
    pub const DEFAULT_SPANS: SpanGrowth = SpanGrowth::Word;

    pub fn share(share: f64) -> Self {
        Self {
            budget: RereadBudget::Share(share),
            selector: Self::DEFAULT_SELECTOR,
            spans: Self::DEFAULT_SPANS,
        }
    }

    /// Parse `0.2`, `20%` or `150ms`, optionally followed by `:SELECTOR` and `:SPANS`
    /// (`0.2:round-trip:sentence`); `0` or `off` is no re-read (`None`).
    pub fn parse(s: &str) -> Result<Option<Self>, RereadError> {
        let mut parts = s.trim().split(':');
        let budget = parts.next().unwrap_or("").trim();
        if budget == "off" || budget == "none" {
            return Ok(None);
        }
        let bad = || {
            RereadError::Input(format!(
                "re-read budget {budget:?}: give a share of the history (0.2 or 20%) or a time \
                 (150ms), optionally with :SELECTOR and :SPANS (0.2:source-attention:word), or \
                 0 for none"
            ))
        };
        let budget = if let Some(ms) = budget.strip_suffix("ms") {
            let ms: f64 = ms.trim().parse().map_err(|_| bad())?;
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(bad());
            }
            if ms == 0.0 {
                return Ok(None);
            }
            RereadBudget::Millis(ms)
        } else {
            let (num, scale) = match budget.strip_suffix('%') {
                Some(p) => (p, 100.0),
                None => (budget, 1.0),
            };
            let share: f64 = num.trim().parse::<f64>().map_err(|_| bad())? / scale;
            if !(0.0..=1.0).contains(&share) {
                return Err(bad());
            }
            if share == 0.0 {
                return Ok(None);
            }
            RereadBudget::Share(share)
        };
        let selector = match parts.next() {
            Some(s) => Selector::parse(s.trim())?,
            None => Self::DEFAULT_SELECTOR,
        };
        let spans = match parts.next() {
            Some(s) => SpanGrowth::ALL
                .into_iter()
                .find(|g| g.name() == s.trim())
                .ok_or_else(|| {
                    RereadError::Input(format!(
                        "unknown span growth {s:?}: use token, word or sentence"
                    ))
                })?,
            None => Self::DEFAULT_SPANS,
        };
        if let Some(extra) = parts.next() {
            return Err(RereadError::Input(format!(
                "re-read setting {s:?} has an extra part {extra:?}: BUDGET[:SELECTOR[:SPANS]]"
            )));
        }
        Ok(Some(Self {
            budget,
            selector,
            spans,
        }))
    }

    /// Positions the budget allows in a history of `len`, given the target's measured
    /// speed (milliseconds per position read) for a time budget.
    pub fn positions(
        &self,
        len: usize,
        ms_per_position: Option<f64>,
    ) -> Result<usize, RereadError> {
        let n = match self.budget {
            RereadBudget::Share(s) => (s * len as f64).round() as usize,
            RereadBudget::Millis(ms) => match ms_per_position {
                Some(per) if per > 0.0 && per.is_finite() => (ms / per).floor() as usize,
                _ => {
                    return Err(RereadError::Input(
                        "a re-read budget in milliseconds needs the target's measured speed, \
                         and none is known yet: give a share (0.2) instead"
                            .into(),
                    ))
                }
            },
        };
        Ok(n.min(len))
    }
}

impl fmt::Display for RereadSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.budget {
            RereadBudget::Share(s) => write!(f, "{}%", (s * 1000.0).round() / 10.0)?,
            RereadBudget::Millis(ms) => write!(f, "{ms}ms")?,
        }
        write!(f, ":{}:{}", self.selector.name(), self.spans.name())
    }
}

/// What a re-read chose, before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RereadChoice {
    /// Spans of positions, increasing and disjoint.
    pub runs: Vec<Range<usize>>,
    /// Milliseconds spent choosing them (scores, spans).
    pub select_ms: f64,
}

impl RereadChoice {
    /// Positions chosen.
    pub fn count(&self) -> usize {
        self.runs.iter().map(|r| r.len()).sum()
    }
}

/// Choose what to re-read of `candidates` (the mapped positions of the history) under
/// `setting`; `ms_per_position` turns a time budget into positions.
pub fn choose(
    setting: &RereadSetting,
    inputs: &SelectInputs<'_>,
    candidates: Range<usize>,
    ms_per_position: Option<f64>,
) -> Result<RereadChoice, RereadError> {
    let t = std::time::Instant::now();
    let history = &inputs.tokens[..inputs.history];
    let budget = setting.positions(inputs.history, ms_per_position)?;
    let scores = score_positions(setting.selector, inputs, candidates.clone())?;
    let starts = unit_starts(&inputs.target.tokenizer, history, setting.spans);
    let opening = opening_len(&inputs.target.tokenizer, history);
    let runs = pick_spans(&scores, candidates, &starts, opening, budget);
    Ok(RereadChoice {
        runs,
        select_ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_print_back() {
        let s = RereadSetting::parse("0.2").unwrap().unwrap();
        assert_eq!(s, RereadSetting::share(0.2));
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        let s = RereadSetting::parse("5%:round-trip:sentence")
            .unwrap()
            .unwrap();
        assert_eq!(s.budget, RereadBudget::Share(0.05));
        assert_eq!(
            (s.selector, s.spans),
            (Selector::RoundTrip, SpanGrowth::Sentence)
        );
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        let s = RereadSetting::parse("150ms:deviation").unwrap().unwrap();
        assert_eq!(s.budget, RereadBudget::Millis(150.0));
        assert_eq!(RereadSetting::parse(&s.to_string()).unwrap(), Some(s));
        for none in ["0", "off", "0ms", "0%"] {
            assert_eq!(RereadSetting::parse(none).unwrap(), None, "{none}");
        }
        for bad in [
            "1.5",
            "-0.1",
            "abc",
            "0.2:psychic",
            "0.2:recency:page",
            "0.2:recency:word:x",
            "NaNms",
        ] {
            let e = RereadSetting::parse(bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_budget_becomes_positions_and_a_time_needs_a_speed() {
        let s = RereadSetting::share(0.25);
        assert_eq!(s.positions(400, None).unwrap(), 100);
        let t = RereadSetting::parse("100ms").unwrap().unwrap();
        assert_eq!(t.positions(400, Some(2.0)).unwrap(), 50);
        assert_eq!(
            t.positions(30, Some(2.0)).unwrap(),
            30,
            "never past the history"
        );
        let e = t.positions(400, None).unwrap_err().to_string();
        assert!(e.contains("give a share"), "{e}");
    }
}

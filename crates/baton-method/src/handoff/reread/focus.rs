//! `focus`: one plan for a question about the history and for a message that is not one.
//!
//! Dropping the mapped rest answers a question about what the history says best: the
//! target reads the facts it re-read, all its own computation, with nothing mapped to send
//! its attention wrong. A message that builds on the whole history (a new problem after
//! worked examples, a follow-up that names nothing) loses what it needed that way, and
//! answers better with the rest kept mapped, in sight. The message says which it is: a
//! question about the history names what the history says. So where the history says
//! more than [`NAMED_SHARE`] of the message's content words, the plan re-reads the
//! sentence that says most of them whole (its budget grows to hold it) and drops the
//! rest; otherwise it re-reads its budget over the map.

use super::{lexical, PlanKind, SelectInputs};
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::text::TextTokenizer;

/// The share of the message's content words the history must say, more than which the
/// message is a question about it. Chosen on questions no evaluation here asks (the 819
/// SQuAD questions on passages the recall suite does not use, the GSM8K items past the
/// 100th): at it, 7.3% of those questions find no more of their words in their passage,
/// and 2.1% of the problems find more in the eight worked examples before them (at 0.5,
/// 16.8% and 0.4%; at 0.3, 2.1% and 7.9%). Sending a problem to `drop` costs more than
/// sending a question to `map`, which still re-reads what it asks about.
pub const NAMED_SHARE: f64 = 0.4;

/// What a plan does at this message, its kind resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Never [`PlanKind::Focus`]: `drop` or `map` for it, the plan's own kind otherwise.
    pub kind: PlanKind,
    /// Positions re-read before any other, whole: the best sentence of a question about
    /// the history, where `focus` drops the rest.
    pub whole: PositionSet,
}

impl Resolved {
    /// The plan's `budget` (positions to re-read, the `opening_in` candidates of the
    /// opening among them), grown to hold what is re-read whole.
    pub fn budget(&self, budget: usize, opening_in: usize, candidates: &PositionSet) -> usize {
        if self.whole.is_empty() {
            return budget;
        }
        budget
            .max(opening_in + self.whole.count())
            .min(candidates.count())
    }

    /// Lift the positions held whole above every other score, so that the spans are
    /// taken from them first.
    pub fn lift(&self, scores: &mut [f64]) {
        if self.whole.is_empty() {
            return;
        }
        let top = scores
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(0.0f64, f64::max);
        for r in self.whole.runs() {
            for s in scores.iter_mut().take(r.end).skip(r.start) {
                *s = if s.is_finite() {
                    *s + top + 1.0
                } else {
                    top + 1.0
                };
            }
        }
    }
}

/// [`resolve`] for the history and message `inputs` holds.
pub fn resolve_for(
    kind: PlanKind,
    inputs: &SelectInputs<'_>,
    candidates: &PositionSet,
) -> Resolved {
    let (history, message) = inputs.tokens.split_at(inputs.history);
    resolve(kind, &inputs.target.tokenizer, history, message, candidates)
}

/// `kind` at the message `message` after `history`, over `candidates`.
pub fn resolve(
    kind: PlanKind,
    tok: &TextTokenizer,
    history: &[u32],
    message: &[u32],
    candidates: &PositionSet,
) -> Resolved {
    let whole = PositionSet::new();
    if kind != PlanKind::Focus {
        return Resolved { kind, whole };
    }
    if lexical::named_share(tok, history, message) <= NAMED_SHARE {
        return Resolved {
            kind: PlanKind::Map,
            whole,
        };
    }
    let best = lexical::best_sentence(tok, history, message);
    let mut whole = PositionSet::new();
    for r in candidates.runs() {
        for p in r.clone() {
            if best.get(p).copied().unwrap_or(0.0) > 0.0 {
                whole.insert(p..p + 1);
            }
        }
    }
    Resolved {
        kind: PlanKind::Drop,
        whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_held_whole_scores_above_everything_else() {
        let r = Resolved {
            kind: PlanKind::Drop,
            whole: PositionSet::of([1..3]),
        };
        let mut scores = vec![5.0, 0.0, f64::NAN, 4.0];
        r.lift(&mut scores);
        assert!(scores[1] > 5.0 && scores[2] > 5.0, "{scores:?}");
        assert_eq!((scores[0], scores[3]), (5.0, 4.0));
        let none = Resolved {
            whole: PositionSet::new(),
            ..r
        };
        let mut same = vec![1.0, 2.0];
        none.lift(&mut same);
        assert_eq!(same, vec![1.0, 2.0]);
    }
}

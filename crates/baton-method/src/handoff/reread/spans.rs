//! From scores to spans: the opening always, then the best-scored positions grown into
//! their words or sentences until the budget is spent.

use super::SpanGrowth;
use baton_runtime::model::position_set::PositionSet;
use baton_runtime::text::TextTokenizer;
use std::ops::Range;

/// The longest opening (system prompt) taken for one: a first end of turn further in is
/// a user's message, not a template's opening.
const MAX_OPENING: usize = 96;

/// Length of the conversation's opening: everything up to the first end-of-turn token
/// and the line break after it (a chat template's system prompt), or 0 when the history
/// has no such opening near its start.
pub fn opening_len(tok: &TextTokenizer, history: &[u32]) -> usize {
    opening_len_within(tok, history, MAX_OPENING)
}

/// [`opening_len`] for an opening of up to `max` positions: where the caller knows
/// the history starts with a template's opening (it rendered it), however long the
/// system prompt.
pub fn opening_len_within(tok: &TextTokenizer, history: &[u32], max: usize) -> usize {
    let Some(end) = history
        .iter()
        .take(max)
        .skip(1)
        .position(|id| tok.eos_ids().contains(id))
        .map(|i| i + 2)
    else {
        return 0;
    };
    // The line break a template puts after the end of turn belongs to it.
    match history.get(end) {
        Some(&id) if text(tok, id).trim().is_empty() && !tok.is_hard_boundary(id) => end + 1,
        _ => end,
    }
}

fn text(tok: &TextTokenizer, id: u32) -> String {
    tok.decode(&[id]).unwrap_or_default()
}

/// For each position of `history`, whether a span of `growth` starts there. Words are
/// whitespace-delimited ("48,000" is one, "Alvarez." too); sentences end after `.`, `!`,
/// `?` or a line break; special tokens stand alone.
pub fn unit_starts(tok: &TextTokenizer, history: &[u32], growth: SpanGrowth) -> Vec<bool> {
    if growth == SpanGrowth::Token {
        return vec![true; history.len()];
    }
    let texts: Vec<String> = history.iter().map(|&id| text(tok, id)).collect();
    let special: Vec<bool> = history.iter().map(|&id| tok.is_hard_boundary(id)).collect();
    unit_starts_of(&texts, &special, growth)
}

/// [`unit_starts`] over each token's text and whether it is a special token.
fn unit_starts_of(texts: &[String], special: &[bool], growth: SpanGrowth) -> Vec<bool> {
    (0..texts.len())
        .map(|i| {
            if i == 0 || special[i] || special[i - 1] || growth == SpanGrowth::Token {
                return true;
            }
            let (prev, cur) = (&texts[i - 1], &texts[i]);
            match growth {
                SpanGrowth::Token => true,
                SpanGrowth::Word => {
                    cur.starts_with(char::is_whitespace) || prev.ends_with(char::is_whitespace)
                }
                SpanGrowth::Sentence => {
                    let p = prev.trim_end_matches([' ', '\t']);
                    prev.contains('\n') || p.ends_with(['.', '!', '?'])
                }
            }
        })
        .collect()
}

/// The spans to re-read: the opening's positions among `candidates`, then, best score
/// first, each candidate's whole span (cut to the candidates around it) while it fits in
/// `budget` positions in all. A span that would overrun the budget is passed over for
/// smaller ones after it, and what is left at the end goes to the best positions not yet
/// taken, one by one. Returns increasing, disjoint runs of candidates.
pub fn pick_spans(
    scores: &[f64],
    candidates: &PositionSet,
    starts: &[bool],
    opening: usize,
    budget: usize,
) -> Vec<Range<usize>> {
    let n = scores.len().min(starts.len());
    let mut is_candidate = vec![false; n];
    for r in candidates.runs() {
        for c in is_candidate.iter_mut().take(r.end.min(n)).skip(r.start) {
            *c = true;
        }
    }
    let mut chosen = vec![false; n];
    let mut count = 0;
    for p in 0..opening.min(n) {
        if is_candidate[p] {
            chosen[p] = true;
            count += 1;
        }
    }
    let mut order: Vec<usize> = (0..n).filter(|&p| is_candidate[p]).collect();
    // Best first; NaN never first; ties go to the later position (closer to the message).
    order.sort_by(|&a, &b| {
        let (x, y) = (scores[a], scores[b]);
        match (x.is_nan(), y.is_nan()) {
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => y
                .partial_cmp(&x)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.cmp(&a)),
        }
    });
    // Whole spans first; what they leave of the budget (spans too long to fit) goes to
    // the best positions alone.
    for whole in [true, false] {
        for &p in &order {
            if count >= budget {
                break;
            }
            if chosen[p] {
                continue;
            }
            let (mut s, mut e) = (p, p + 1);
            if whole {
                while s > 0 && is_candidate[s - 1] && !starts[s] {
                    s -= 1;
                }
                while e < n && is_candidate[e] && !starts[e] {
                    e += 1;
                }
            }
            let new = (s..e).filter(|&i| !chosen[i]).count();
            if count + new > budget {
                continue;
            }
            for c in &mut chosen[s..e] {
                *c = true;
            }
            count += new;
        }
    }
    runs_of(&chosen)
}

/// The runs of `true` in `chosen`.
fn runs_of(chosen: &[bool]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &c) in chosen.iter().enumerate() {
        match (c, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(s..i);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(s..chosen.len());
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(r: Range<usize>) -> PositionSet {
        PositionSet::of([r])
    }

    fn texts(words: &[&str]) -> Vec<String> {
        words.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn words_are_whitespace_delimited_and_sentences_end_at_stops_and_line_breaks() {
        // "<s>The budget is 48,000 dollars. Room\n214"
        let t = texts(&[
            "<s>", "The", " budget", " is", " 48", ",", "000", " dollars", ".", " Room", "\n",
            "214",
        ]);
        let mut special = vec![false; t.len()];
        special[0] = true;
        let w = unit_starts_of(&t, &special, SpanGrowth::Word);
        let starts: Vec<usize> = (0..t.len()).filter(|&i| w[i]).collect();
        // "48,000" is one word, "dollars." one, the line break ends "Room".
        assert_eq!(starts, vec![0, 1, 2, 3, 4, 7, 9, 10, 11]);
        let s = unit_starts_of(&t, &special, SpanGrowth::Sentence);
        let starts: Vec<usize> = (0..t.len()).filter(|&i| s[i]).collect();
        assert_eq!(starts, vec![0, 1, 9, 11]);
        assert!(unit_starts_of(&t, &special, SpanGrowth::Token)
            .iter()
            .all(|&b| b));
    }

    #[test]
    fn the_opening_comes_first_then_the_best_spans_while_they_fit() {
        // Ten positions, units [0,1) [1,4) [4,6) [6,10); candidates 1..10, opening 2.
        let starts = [
            true, true, false, false, true, false, true, false, false, false,
        ];
        let scores = [0.0, 0.0, 0.1, 0.0, 0.9, 0.2, 0.0, 0.0, 0.5, 0.0];
        // Budget 5: the opening's position 1, then 4..6 (score 0.9); 6..10 would overrun,
        // so the rest of 1..4 (score 0.1) fills it.
        assert_eq!(pick_spans(&scores, &set(1..10), &starts, 2, 5), vec![1..6]);
        // Budget 4: the opening, then 4..6; neither other span fits, so the best
        // position left (8) fills the budget alone.
        assert_eq!(
            pick_spans(&scores, &set(1..10), &starts, 2, 4),
            vec![1..2, 4..6, 8..9]
        );
        // A span longer than the budget gives way to its best positions.
        assert_eq!(pick_spans(&scores, &set(6..10), &starts, 0, 2), vec![8..10]);
        // The opening is taken even past the budget; positions before the candidates
        // (already the target's own) never are.
        assert_eq!(pick_spans(&scores, &set(1..10), &starts, 3, 0), vec![1..3]);
        // Token spans: the best positions alone.
        assert_eq!(
            pick_spans(&scores, &set(1..10), &[true; 10], 0, 2),
            vec![4..5, 8..9]
        );
        assert!(pick_spans(&scores, &set(5..5), &starts, 2, 4).is_empty());
    }

    #[test]
    fn nan_scores_go_last_and_ties_go_to_the_newer_position() {
        let scores = [f64::NAN, 1.0, 1.0, 0.5];
        assert_eq!(
            pick_spans(&scores, &set(0..4), &[true; 4], 0, 1),
            vec![2..3]
        );
        assert_eq!(
            pick_spans(&scores, &set(0..4), &[true; 4], 0, 3),
            vec![1..4]
        );
    }

    #[test]
    fn candidates_in_pieces_are_chosen_and_grown_only_inside_themselves() {
        // Positions 2..4 are the target's own (computed by it): never chosen, and a
        // word around them grows only into candidates.
        let starts = [true, true, false, false, false, false, true, false];
        let scores = [0.0, 0.1, 0.0, 0.0, 0.9, 0.0, 0.5, 0.4];
        let c = PositionSet::of([1..2, 4..8]);
        // Budget 2: the word of 4 is 4..6 (cut at the own positions before it).
        assert_eq!(pick_spans(&scores, &c, &starts, 0, 2), vec![4..6]);
        // Budget 6: everything but the own positions.
        assert_eq!(pick_spans(&scores, &c, &starts, 0, 6), vec![1..2, 4..8]);
        // The opening counts only where it is a candidate.
        assert_eq!(pick_spans(&scores, &c, &starts, 4, 0), vec![1..2]);
    }
}

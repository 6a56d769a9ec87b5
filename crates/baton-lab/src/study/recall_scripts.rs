//! The recall suite's conversations as study scripts: the passage read in the first
//! turn, then one question a turn, each after a switch, with SQuAD's reference answers as
//! the answers the report scores. A large drift study needs many conversations whose
//! answers are known; these are the ones `baton eval --conversations` asks.

use crate::eval::recall::{ANSWER_STYLE, PASSAGE_INTRO};
use baton_data::recall::RecallConversation;

/// Answers are short: a few words, as the question asks.
const MAX_TOKENS: i64 = 32;

/// The script of one conversation, as TOML text.
pub fn script_text(c: &RecallConversation) -> String {
    let step = |pairs: Vec<(&str, toml::Value)>| {
        toml::Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    };
    let title = c.title.replace('_', " ");
    // Worded as the recall suite words them, so a study and `baton eval` ask alike (here
    // the model answers every turn itself, the passage's acknowledgement included).
    let mut steps = vec![step(vec![(
        "user",
        toml::Value::String(format!(
            "{PASSAGE_INTRO}\n\nTitle: {title}\n\n{}",
            c.passage
        )),
    )])];
    for q in &c.questions {
        steps.push(step(vec![("switch", toml::Value::Boolean(true))]));
        steps.push(step(vec![
            (
                "user",
                toml::Value::String(format!("{}\n{ANSWER_STYLE}", q.question)),
            ),
            (
                "expect",
                toml::Value::Array(q.answers.iter().cloned().map(toml::Value::String).collect()),
            ),
        ]));
    }
    let mut table = toml::Table::new();
    table.insert("max_tokens".into(), toml::Value::Integer(MAX_TOKENS));
    table.insert("step".into(), toml::Value::Array(steps));
    format!(
        "# The recall suite's conversation on {} (SQuAD): the passage, then a question a turn\n# after a switch each, scored against SQuAD's reference answers.\n\n{}",
        title,
        toml::to_string(&table).unwrap_or_default()
    )
}

/// A file name for conversation `k` on `title`.
pub fn script_name(k: usize, c: &RecallConversation) -> String {
    let title: String = c
        .title
        .chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() {
                ch.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{:03}-{}.toml", k + 1, title.trim_matches('-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_data::recall::RecallQuestion;
    use baton_engine::headless::Script;

    #[test]
    fn a_recall_conversation_becomes_a_script_that_parses_with_its_answers() {
        let c = RecallConversation {
            title: "Super_Bowl_50".into(),
            passage: "Super Bowl 50 was played in \"Santa Clara\".\nIt was won by Denver.".into(),
            questions: vec![
                RecallQuestion {
                    id: "a".into(),
                    question: "Where was it played?".into(),
                    answers: vec!["Santa Clara".into(), "Santa Clara, California".into()],
                },
                RecallQuestion {
                    id: "b".into(),
                    question: "Who won?".into(),
                    answers: vec!["Denver".into()],
                },
            ],
        };
        let text = script_text(&c);
        let s = Script::parse(&text, "x.toml").unwrap();
        // The passage, then a switch and a question twice.
        assert_eq!(s.steps.len(), 5);
        assert_eq!(
            s.expected[&2],
            vec!["Santa Clara", "Santa Clara, California"]
        );
        assert_eq!(s.expected[&3], vec!["Denver"]);
        assert_eq!(s.settings.max_tokens, Some(32));
        assert_eq!(script_name(4, &c), "005-super-bowl-50.toml");
    }
}

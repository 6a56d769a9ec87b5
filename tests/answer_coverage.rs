//! The choosers that read text, and the recall suite's answer coverage, on Qwen2.5's real
//! tokenizer and chat template: the answer is found where the passage says it, the
//! message's own words point at the fact next to them, and numbers and names score as
//! facts.

mod common;

use baton::data::recall::{RecallConversation, RecallQuestion};
use baton::handoff::reread::lexical::{
    best_sentence, message_sentences, message_words, rare_tokens,
};
use baton::lab::eval::recall::coverage::answer_positions;
use baton::lab::eval::recall::messages_for;
use baton::text::{ChatMessage, ChatTemplate, TextTokenizer};
use candle_core::quantized::gguf_file::Content;

fn qwen() -> (TextTokenizer, ChatTemplate) {
    let path = common::qwen_small();
    let mut f = std::fs::File::open(&path).expect("open gguf");
    let content = Content::read(&mut f).expect("read gguf metadata");
    (
        TextTokenizer::from_gguf(&content).expect("tokenizer"),
        ChatTemplate::from_gguf(&content).expect("chat template"),
    )
}

fn decode(tok: &TextTokenizer, ids: &[u32]) -> String {
    tok.decode(ids).unwrap()
}

#[test]
fn the_answer_is_found_in_the_passage_not_in_the_title_or_an_earlier_turn() {
    let (tok, tmpl) = qwen();
    let conv = RecallConversation {
        title: "Denver_Broncos".into(),
        passage: "The Broncos beat the Panthers 24 to 10 at Levi's Stadium in Santa Clara, \
                  and Von Miller was named the game's most valuable player."
            .into(),
        questions: vec![
            RecallQuestion {
                id: "a".into(),
                question: "Who won?".into(),
                answers: vec!["Broncos".into()],
            },
            RecallQuestion {
                id: "b".into(),
                question: "Where was the game played?".into(),
                answers: vec!["levi's stadium".into(), "Santa Clara".into()],
            },
        ],
    };
    for (j, want) in [(0, "Broncos"), (1, "Santa Clara")] {
        let messages = messages_for(&conv, j);
        let history = tmpl
            .render_ids(&tok, &messages[..messages.len() - 1], false)
            .unwrap();
        let title = format!("Title: {}", conv.title.replace('_', " "));
        let span = answer_positions(&tok, &history, &title, &conv.questions[j].answers)
            .unwrap_or_else(|| panic!("question {j}: no answer found"));
        let text = decode(&tok, &history[span.clone()]);
        assert!(text.contains(want), "question {j}: {text:?}");
        assert!(
            text.len() < want.len() + 8,
            "only the answer's tokens: {text:?}"
        );
        // It is the passage's occurrence, after the title and before the first question.
        let before = decode(&tok, &history[..span.start]);
        assert!(
            before.contains("Title: Denver Broncos\n\nThe"),
            "{before:?}"
        );
        assert!(!before.contains("Who won?"), "{before:?}");
    }
    // An answer the passage does not hold is no span.
    let messages = messages_for(&conv, 0);
    let history = tmpl.render_ids(&tok, &messages[..1], false).unwrap();
    assert_eq!(
        answer_positions(&tok, &history, "Title:", &["Chiefs".to_string()]),
        None
    );
}

#[test]
fn the_messages_words_point_at_the_fact_beside_them_and_numbers_score_as_facts() {
    let (tok, tmpl) = qwen();
    let note = "Note this: the vault PIN is 5823, the meeting moved to room 412, and it \
                starts at 9:35. Reply with OK.";
    let history = tmpl
        .render_ids(
            &tok,
            &[ChatMessage::user(note), ChatMessage::assistant("OK.")],
            false,
        )
        .unwrap();
    let full = tmpl
        .render_ids(
            &tok,
            &[
                ChatMessage::user(note),
                ChatMessage::assistant("OK."),
                ChatMessage::user("What is the vault PIN?"),
            ],
            true,
        )
        .unwrap();
    assert!(full.starts_with(&history));
    let message = &full[history.len()..];
    let scores = message_words(&tok, &history, message);
    let pin = find(&tok, &history, "5");
    let room = find(&tok, &history, "4");
    let system = find(&tok, &history, "helpful");
    assert!(
        scores[pin] > 2.0 * scores[room],
        "the PIN ({}) before the room ({})",
        scores[pin],
        scores[room]
    );
    assert!(
        scores[pin] > 2.0 * scores[system],
        "the system prompt says none of the words, and is only near them"
    );
    let rare = rare_tokens(&tok, &history);
    assert_eq!(rare[pin], 1.0);
    assert_eq!(rare[room], 1.0);
    let moved = find(&tok, &history, " moved");
    assert_eq!(rare[moved], 0.0);
}

#[test]
fn the_sentence_that_names_most_of_what_is_asked_is_read_first_and_whole() {
    let (tok, tmpl) = qwen();
    let passage = "Warsaw is the capital of Poland. The city has a mermaid on its coat of \
                   arms. This mermaid imagery has been in use since at least the mid-14th \
                   century. The Vistula river flows through Warsaw.";
    let history = tmpl
        .render_ids(
            &tok,
            &[ChatMessage::user(passage), ChatMessage::assistant("OK.")],
            false,
        )
        .unwrap();
    let full = tmpl
        .render_ids(
            &tok,
            &[
                ChatMessage::user(passage),
                ChatMessage::assistant("OK."),
                ChatMessage::user("Since when has Warsaw used the mermaid imagery?"),
            ],
            true,
        )
        .unwrap();
    let message = &full[history.len()..];
    let scores = message_sentences(&tok, &history, message);
    let text: Vec<String> = history.iter().map(|&id| decode(&tok, &[id])).collect();
    let start = find(&tok, &history, "This");
    let end = start + text[start..].iter().position(|t| t.contains('.')).unwrap() + 1;
    let answer = find(&tok, &history, " century");
    assert!((start..end).contains(&answer));
    // Every position of the answer's sentence, its century included (a word the
    // question never says), ranks above every position outside it.
    let inside = scores[start..end]
        .iter()
        .cloned()
        .fold(f64::INFINITY, f64::min);
    let outside = (0..history.len())
        .filter(|p| !(start..end).contains(p))
        .map(|p| scores[p])
        .fold(0.0, f64::max);
    assert!(inside > outside, "{inside} against {outside}");
    // By nearness alone, the century is behind the words the question repeats.
    let near = message_words(&tok, &history, message);
    let mermaid = find(&tok, &history, " mer");
    assert!(near[answer] < near[mermaid]);
    // `sentence-facts` lifts that sentence, and only it, above everything else.
    let best = best_sentence(&tok, &history, message);
    for (p, b) in best.iter().enumerate() {
        assert_eq!(*b, f64::from(u8::from((start..end).contains(&p))), "{p}");
    }
    // A message that names nothing the history says lifts nothing.
    let other = tmpl
        .render_ids(
            &tok,
            &[
                ChatMessage::user(passage),
                ChatMessage::assistant("OK."),
                ChatMessage::user("Tell me a joke about cats?"),
            ],
            true,
        )
        .unwrap();
    let none = best_sentence(&tok, &history, &other[history.len()..]);
    assert!(none.iter().all(|&b| b == 0.0));
}

/// The history and the message after it, rendered as the workbench renders them.
fn turn(
    tok: &TextTokenizer,
    tmpl: &ChatTemplate,
    said: &[ChatMessage],
    ask: &str,
) -> (Vec<u32>, Vec<u32>) {
    let history = tmpl.render_ids(tok, said, false).unwrap();
    let mut all = said.to_vec();
    all.push(ChatMessage::user(ask));
    let full = tmpl.render_ids(tok, &all, true).unwrap();
    assert!(full.starts_with(&history));
    (
        full[..history.len()].to_vec(),
        full[history.len()..].to_vec(),
    )
}

#[test]
fn focus_drops_for_a_question_about_the_history_keeping_its_sentence_whole_and_maps_otherwise() {
    use baton::handoff::reread::focus::resolve;
    use baton::handoff::reread::{opening_len, PlanKind};
    use baton::model::position_set::PositionSet;
    let (tok, tmpl) = qwen();
    let note = "Note this: the vault PIN is 5823, the meeting moved to room 412, and it \
                starts at 9:35. Reply with OK.";
    let said = [ChatMessage::user(note), ChatMessage::assistant("OK.")];
    let (history, message) = turn(
        &tok,
        &tmpl,
        &said,
        "What is the vault PIN, which room is the meeting in, and when does it start?",
    );
    // A budget smaller than the sentence that holds the three facts; every position
    // past the opening a candidate.
    let small = 6;
    let at = |kind: PlanKind, history: &[u32], message: &[u32]| {
        let candidates =
            PositionSet::of(std::iter::once(opening_len(&tok, history)..history.len()));
        let r = resolve(kind, &tok, history, message, &candidates);
        let budget = r.budget(small, 0, &candidates);
        (r, budget)
    };
    let (r, budget) = at(PlanKind::Focus, &history, &message);
    assert_eq!(r.kind, PlanKind::Drop);
    let whole: Vec<u32> = r
        .whole
        .runs()
        .iter()
        .flat_map(|x| history[x.clone()].to_vec())
        .collect();
    let text = decode(&tok, &whole);
    for fact in ["5823", "412", "9:35"] {
        assert!(text.contains(fact), "{fact} in {text:?}");
    }
    assert!(!text.contains("Reply"), "one sentence: {text:?}");
    assert_eq!(budget, r.whole.count(), "the budget grows to hold it");
    assert!(budget > small);
    // Other kinds are what they say, whatever the message.
    let (d, budget) = at(PlanKind::Drop, &history, &message);
    assert_eq!((d.kind, budget), (PlanKind::Drop, small));
    assert!(d.whole.is_empty());

    // A new problem beside a worked example, and a message that names nothing: the rest
    // stays mapped and the budget is the plan's.
    let worked = "Question: Olivia has $23. She bought five bagels for $3 each. How much \
                  money does she have left?\nAnswer: 5 x 3 = 15 dollars. 23 - 15 is 8. So \
                  the answer is 8.";
    let said = [ChatMessage::user(worked), ChatMessage::assistant("OK.")];
    for ask in [
        "Question: A farmer plants 12 rows of corn with 9 stalks in each row. How many \
         stalks does the farmer plant?",
        "Go on.",
    ] {
        let (history, message) = turn(&tok, &tmpl, &said, ask);
        let (r, budget) = at(PlanKind::Focus, &history, &message);
        assert_eq!((r.kind, budget), (PlanKind::Map, small), "{ask}");
        assert!(r.whole.is_empty());
    }
}

/// The first position of `history` whose token's text contains `piece`.
fn find(tok: &TextTokenizer, history: &[u32], piece: &str) -> usize {
    history
        .iter()
        .position(|&id| decode(tok, &[id]).contains(piece))
        .unwrap_or_else(|| panic!("{piece:?} not in the history"))
}

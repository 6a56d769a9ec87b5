//! Chat-shaped calibration windows on the real Qwen tokenizer: conversations rendered
//! through a ChatML template, cut to the window length.

mod common;

use baton::data::chat_corpus::chat_windows;
use baton::data::corpus::{CorpusError, Document, Split};
use baton::text::{ChatTemplate, TextTokenizer};

const CHATML: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

fn doc(words: usize) -> Document {
    Document {
        name: "d".into(),
        text: (0..words)
            .map(|i| format!("word{} ", i % 50))
            .collect::<String>(),
    }
}

fn tokenizer() -> TextTokenizer {
    TextTokenizer::from_tokenizer_json(common::qwen_tokenizer_json()).expect("tokenizer.json")
}

#[test]
fn chat_windows_hold_role_headers_and_have_the_asked_length() {
    let tok = tokenizer();
    let tpl = ChatTemplate::new(CHATML, None, None).expect("template");
    let w = chat_windows(&[doc(6000)], &tok, &tpl, Split::Whole, 256, 5).expect("windows");
    assert_eq!(w.len(), 5);
    assert!(w.iter().all(|w| w.len() == 256));
    let start = tok.token_to_id("<|im_start|>").expect("ChatML start token");
    for win in &w {
        assert_eq!(win[0], start, "a window opens a conversation");
        let turns = win.iter().filter(|&&id| id == start).count();
        assert!(turns >= 2, "{turns} turns in a window");
    }
    let text = tok.decode(&w[0]).expect("decode");
    assert!(
        text.starts_with("<|im_start|>user\nword") && text.contains("<|im_start|>assistant\n"),
        "{text}"
    );
    // Windows follow one another through the text: the second starts further on.
    assert_ne!(w[0], w[1]);
}

#[test]
fn too_little_text_for_the_chat_windows_asked_is_said() {
    let tok = tokenizer();
    let tpl = ChatTemplate::new(CHATML, None, None).expect("template");
    let err = chat_windows(&[doc(20)], &tok, &tpl, Split::Whole, 256, 5).err();
    assert!(
        matches!(
            err,
            Some(CorpusError::TooSmall {
                got: 0,
                want: 5,
                len: 256
            })
        ),
        "{err:?}"
    );
}

//! Chat-shaped calibration windows on the real Qwen tokenizer: conversations rendered
//! through a ChatML template, cut to the window length.

mod common;

use baton::data::chat_corpus::chat_windows;
use baton::data::corpus::windows;
use baton::data::corpus::{CorpusError, Document, Split};
use baton::text::{ChatTemplate, TextTokenizer};

const CHATML: &str =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";

fn doc(words: usize) -> Document {
    Document::new(
        "d",
        (0..words)
            .map(|i| format!("word{} ", i % 50))
            .collect::<String>(),
    )
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

/// Several blocks of varied prose, code and accented text, as a file and in memory.
fn varied_text(bytes: usize) -> String {
    let parts = [
        "The quick brown fox, named Mr. Zoë Ångström, jumped over 1,234 lazy dogs.\n",
        "    fn main() {\n        println!(\"héllo {}\", 42);\n    }\n\n",
        "Ünïcode line: 東京は日本の首都です。 emoji 😀👍🏽 and a tab\there.\n",
        "\n\n  indented after blank lines; (parenthesised) 'quoted' text's end\n",
        "numbers 3.14159 and 2e-10, URLs like https://example.org/a?b=c\n",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < bytes {
        s.push_str(parts[i % parts.len()]);
        // A line of varying length, so block ends fall in different places.
        s.push_str(&"word ".repeat(i % 37));
        s.push('\n');
        i += 1;
    }
    s
}

#[test]
fn a_file_read_in_blocks_gives_the_windows_its_whole_text_gives() {
    let tok = tokenizer();
    let text = varied_text(3 << 20);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.txt");
    std::fs::write(&path, &text).unwrap();
    let read = baton::data::corpus::read_corpus(std::slice::from_ref(&path), &mut |_, _| {})
        .expect("read");
    let in_memory = [Document::new("big.txt", text.clone())];
    assert_eq!(
        read.fingerprint,
        baton::data::corpus::fingerprint(&in_memory),
        "the one-pass fingerprint is the fingerprint of the text"
    );
    assert_eq!(
        read.fingerprint,
        baton::data::corpus::fingerprint(&read.docs)
    );
    for (split, count) in [(Split::Fit, 3000), (Split::Select, 400), (Split::Eval, 60)] {
        let whole = windows(&in_memory, &tok, split, 128, count).expect("in memory");
        let blocks = windows(&read.docs, &tok, split, 128, count).expect("from the file");
        assert_eq!(whole.len(), count);
        assert!(whole == blocks, "{split:?}: block-wise tokens differ");
    }
    let tpl = ChatTemplate::new(CHATML, None, None).expect("template");
    let whole = chat_windows(&in_memory, &tok, &tpl, Split::Fit, 256, 20).expect("in memory");
    let blocks = chat_windows(&read.docs, &tok, &tpl, Split::Fit, 256, 20).expect("file");
    assert!(whole == blocks, "chat windows differ");
}

#[test]
fn jsonl_lines_are_documents_taken_in_turn() {
    let tok = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.jsonl");
    let texts: Vec<String> = (0..5).map(|i| varied_text(2000 + 500 * i)).collect();
    let lines: Vec<String> = texts
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n\n")).unwrap();
    let read = baton::data::corpus::read_corpus(std::slice::from_ref(&path), &mut |_, _| {})
        .expect("read");
    // Blank lines count in the line numbers that name the documents.
    let in_memory: Vec<Document> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Document::new(format!("c.jsonl:{}", 2 * i + 1), t.clone()))
        .collect();
    assert_eq!(
        read.fingerprint,
        baton::data::corpus::fingerprint(&in_memory)
    );
    let a = windows(&in_memory, &tok, Split::Whole, 64, 40).expect("in memory");
    let b = windows(&read.docs, &tok, Split::Whole, 64, 40).expect("jsonl");
    assert!(a == b);
}

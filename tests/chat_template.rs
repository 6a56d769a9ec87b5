//! Chat templates of real models: rendering and prefix stability.
//!
//! Inputs come from the environment; each test prints a note and passes when its files are
//! not configured:
//! - `BATON_TEST_QWEN_GGUF`: a Qwen2.5 instruct GGUF.
//! - `BATON_TEST_QWEN_GGUF_2`: a second Qwen2.5 GGUF (its template text differs slightly).
//! - `BATON_TEST_OTHER_GGUF`: a GGUF of another family (SmolLM2-135M-Instruct).
//! - `BATON_TEST_QWEN_TOKENIZER_JSON`: a Qwen3 `tokenizer.json` with its
//!   `tokenizer_config.json` alongside (for a template that rewrites history).

use std::path::PathBuf;

use baton::text::{ChatMessage, ChatTemplate, ChatTemplateError, PrefixStability, TextTokenizer};
use candle_core::quantized::gguf_file::Content;

mod common;

fn load(path: &PathBuf) -> (TextTokenizer, ChatTemplate) {
    let mut f = std::fs::File::open(path).expect("open gguf");
    let content = Content::read(&mut f).expect("read gguf metadata");
    (
        TextTokenizer::from_gguf(&content).expect("tokenizer"),
        ChatTemplate::from_gguf(&content).expect("chat template"),
    )
}

fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![
            ChatMessage::user("Write a Rust function that adds two numbers."),
            ChatMessage::assistant("```rust\nfn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n```"),
            ChatMessage::user("Now in Python, please."),
            ChatMessage::assistant("def add(a, b):\n    return a + b"),
            ChatMessage::user("Thanks! 谢谢 🎉"),
            ChatMessage::assistant("You're welcome."),
        ],
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("2+2?"),
            ChatMessage::assistant("4"),
            ChatMessage::user("And 3×3?"),
            ChatMessage::assistant("9\n"),
            ChatMessage::user("  spaced   out  "),
        ],
        vec![ChatMessage::user("hi")],
        vec![
            ChatMessage::user("Say <|im_start|> literally?"),
            ChatMessage::assistant("I can't write that token as text."),
        ],
    ]
}

/// Simulate a chat: the cache holds the prompt plus the reply's ids and the end-of-turn id;
/// each new turn appends `incremental_ids`. At the end the cache must equal a fresh render.
fn simulate(tok: &TextTokenizer, tmpl: &ChatTemplate, conv: &[ChatMessage]) {
    let eot = tok.eos_id().expect("eos");
    let mut cache: Vec<u32> = Vec::new();
    for (i, m) in conv.iter().enumerate() {
        if m.role != baton::text::Role::Assistant || i == 0 {
            continue;
        }
        let add = tmpl
            .incremental_ids(tok, &cache, &conv[..i], true)
            .expect("incremental ids");
        cache.extend(add);
        assert_eq!(cache, tmpl.render_ids(tok, &conv[..i], true).unwrap());
        // The model's reply, as generated, then the end-of-turn id it stopped on.
        cache.extend(tok.encode_raw(&m.content).unwrap());
        cache.push(eot);
    }
    let add = tmpl
        .incremental_ids(tok, &cache, conv, true)
        .expect("incremental ids");
    cache.extend(add);
    assert_eq!(
        tok.decode(&cache).unwrap(),
        tmpl.render(conv, true).unwrap()
    );
}

#[test]
fn qwen25_template_renders_and_is_prefix_stable() {
    let path = common::qwen_small();
    let (tok, tmpl) = load(&path);
    let conv = [ChatMessage::user("hi"), ChatMessage::assistant("hello")];
    assert_eq!(
        tmpl.render(&conv, false).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
    );
    assert!(tmpl
        .render(&conv[..1], true)
        .unwrap()
        .ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
    let ids = tmpl.render_ids(&tok, &conv, false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(ids.iter().filter(|&&id| id == 151645).count(), 3);

    for conv in conversations() {
        assert_eq!(
            tmpl.prefix_stability(&tok, &conv).unwrap(),
            PrefixStability::Stable,
            "{conv:?}"
        );
        simulate(&tok, &tmpl, &conv);
    }

    // An edited history is caught.
    let conv = &conversations()[0];
    let mut cache = tmpl.render_ids(&tok, &conv[..3], true).unwrap();
    cache.extend(tok.encode_raw("something else").unwrap());
    let err = tmpl
        .incremental_ids(&tok, &cache, &conv[..5], true)
        .unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::NotPrefixStable { .. }),
        "{err}"
    );
}

#[test]
fn second_qwen25_template_is_prefix_stable() {
    let path = common::qwen_large();
    let (tok, tmpl) = load(&path);
    for conv in conversations() {
        assert!(tmpl.prefix_stable(&tok, &conv).unwrap(), "{conv:?}");
        simulate(&tok, &tmpl, &conv);
    }
}

#[test]
fn smollm2_template_is_prefix_stable() {
    let path = common::smollm();
    let (tok, tmpl) = load(&path);
    let out = tmpl.render(&[ChatMessage::user("hi")], true).unwrap();
    assert!(out.starts_with("<|im_start|>system\n"), "{out}");
    assert!(
        out.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{out}"
    );
    for conv in conversations() {
        assert!(tmpl.prefix_stable(&tok, &conv).unwrap(), "{conv:?}");
        simulate(&tok, &tmpl, &conv);
    }
}

#[test]
fn qwen3_template_renders_with_python_methods() {
    let json = common::qwen_tokenizer_json();
    let config = common::qwen_tokenizer_config();
    let tok = TextTokenizer::from_tokenizer_json(&json).expect("tokenizer.json");
    let tmpl = ChatTemplate::from_tokenizer_config(&config).expect("template");
    let conv = [
        ChatMessage::user("hi"),
        ChatMessage::assistant("<think>\nthe user greets\n</think>\n\nhello"),
        ChatMessage::user("bye"),
    ];
    let out = tmpl.render(&conv, true).unwrap();
    // Qwen3 drops the reasoning of earlier turns from the history...
    assert!(!out.contains("the user greets"), "{out}");
    assert!(
        out.ends_with("<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n"),
        "{out}"
    );
    // ...so a cache that holds the generated reasoning cannot be extended.
    match tmpl.prefix_stability(&tok, &conv).unwrap() {
        PrefixStability::Unstable {
            message_index,
            reason,
        } => {
            eprintln!("qwen3: unstable after message {message_index}: {reason}");
            assert_eq!(message_index, 1);
        }
        PrefixStability::Stable => panic!("Qwen3's template rewrites history"),
    }
}

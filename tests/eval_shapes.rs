//! Where the GSM8K shape "question read by the target" splits a real few-shot context:
//! at the token where the final question starts, on the real Qwen tokenizer.

mod common;

use baton::lab::eval::tasks::question_start;
use baton::text::TextTokenizer;

#[test]
fn the_final_question_starts_where_its_tokens_do() {
    let tok = TextTokenizer::from_tokenizer_json(common::qwen_tokenizer_json()).unwrap();
    let context = "Question: Tom has 3 apples and eats one. How many are left?\nAnswer: 3 - 1 = 2. So the answer is 2.\n\nQuestion: Olivia has $23. She buys five bagels for $3 each. How much is left?\nAnswer:";
    let ids = tok.encode_raw(context).unwrap();
    let q = question_start(&tok, context, &ids).unwrap();
    assert!(q > 0 && q < ids.len());
    let read = tok.decode(&ids[q..]).unwrap();
    let mapped = tok.decode(&ids[..q]).unwrap();
    // The target reads the whole final question; the examples before it are mapped.
    assert!(
        read.trim_start().starts_with("Question: Olivia"),
        "{read:?}"
    );
    assert!(
        mapped.ends_with("the answer is 2.\n\n") || mapped.ends_with("the answer is 2."),
        "{mapped:?}"
    );
    // A context without a question has nothing for the target to read: mapped whole.
    let plain = tok.encode_raw("no questions here").unwrap();
    assert_eq!(
        question_start(&tok, "no questions here", &plain).unwrap(),
        plain.len()
    );
}

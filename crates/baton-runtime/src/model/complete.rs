//! A prompt answered as text, streamed as it is decoded: what `baton generate` does, and
//! the quickest way to see that a model loaded right.

use super::generate::{generate, GenerateOptions, Generation};
use super::loaded::Model;
use super::Result;
use crate::text::ChatMessage;
use std::sync::atomic::AtomicBool;

/// Answers `prompt` (as a user turn of the chat template with `chat`, else as raw
/// text; either way a special token's text in it stays text), handing each decoded
/// piece of text to `on_text` as soon as it forms whole characters. End-of-sequence
/// tokens are not shown.
pub fn complete(
    m: &Model,
    prompt: &str,
    chat: bool,
    opts: &GenerateOptions,
    cancel: &AtomicBool,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation> {
    let ids = prompt_ids(m, prompt, chat)?;
    let mut cache = m.decoder.new_cache();
    let mut stream = m.tokenizer.stream();
    let mut on_token = |id: u32| -> bool {
        if !m.tokenizer.eos_ids().contains(&id) {
            // A piece that is not yet valid text waits in the stream for the next token.
            if let Ok(text) = stream.push(id) {
                on_text(&text);
            }
        }
        true
    };
    let g = generate(&m.decoder, &mut cache, &ids, opts, cancel, &mut on_token)?;
    if let Ok(tail) = stream.finish() {
        on_text(&tail);
    }
    Ok(g)
}

/// `prompt`'s ids as [`complete`] reads them: a user turn of the chat template with
/// `chat`, else raw text; either way a special token's text in it stays text.
pub fn prompt_ids(m: &Model, prompt: &str, chat: bool) -> Result<Vec<u32>> {
    Ok(if chat {
        m.chat_template()?.render_ids(
            &m.tokenizer,
            &[ChatMessage::user(prompt.to_string())],
            true,
        )?
    } else {
        m.tokenizer.encode_text(prompt)?
    })
}

//! Calibration windows shaped like what the workbench maps: conversations rendered
//! through the chat template, with its system prompt, role headers and end-of-turn
//! tokens, instead of plain running text.
//!
//! The corpus text of a split is cut into pieces of varying length that become the
//! messages of a conversation, user and assistant in turn; the rendered conversation's
//! first `len` tokens are one window. The same text as a plain window and as a chat
//! window differs only in the template around it, so a share of chat windows teaches
//! the map the positions plain text never has (the special tokens, which attention
//! reads heavily) without changing what the rest is about. The assistant turns are
//! corpus text, not answers the models wrote.

use super::corpus::{CorpusError, Document, Split};
use baton_runtime::text::{ChatMessage, ChatTemplate, TextTokenizer};

/// Token lengths of successive messages, in turn: short questions and long passages,
/// as conversations have them.
const PIECE_TOKENS: [usize; 6] = [40, 150, 24, 90, 200, 60];

/// Up to `count` chat-shaped windows of exactly `len` tokens from `split` of the
/// documents, taken in turn from each document (as [`super::corpus::windows`] does) but
/// from each document's end backwards, so that plain windows, which start at the
/// beginning, and chat windows of one calibration read different text. Of a file larger
/// than 8 MiB only the end is read.
pub fn chat_windows(
    docs: &[Document],
    tok: &TextTokenizer,
    template: &ChatTemplate,
    split: Split,
    len: usize,
    count: usize,
) -> Result<Vec<Vec<u32>>, CorpusError> {
    super::corpus::chat_windows_with(docs, tok, split, len, count, |ids| {
        conversations_of(ids, tok, template, len)
    })
}

/// Every window one document's tokens make: each conversation takes pieces until its
/// rendering holds `len` tokens, and the next starts where it stopped.
fn conversations_of(
    ids: &[u32],
    tok: &TextTokenizer,
    template: &ChatTemplate,
    len: usize,
) -> Result<Vec<Vec<u32>>, CorpusError> {
    let render = |m: &[ChatMessage]| {
        template
            .render_ids(tok, m, false)
            .map_err(|e| CorpusError::Template(e.to_string()))
    };
    let mut out = Vec::new();
    let (mut at, mut piece) = (0usize, 0usize);
    'windows: while at < ids.len() {
        let mut messages: Vec<ChatMessage> = Vec::new();
        loop {
            let n = PIECE_TOKENS[piece % PIECE_TOKENS.len()];
            piece += 1;
            let end = (at + n).min(ids.len());
            let text = tok.decode(&ids[at..end])?;
            at = end;
            let text = text.trim();
            if !text.is_empty() {
                messages.push(if messages.len().is_multiple_of(2) {
                    ChatMessage::user(text)
                } else {
                    ChatMessage::assistant(text)
                });
            }
            let rendered = render(&messages)?;
            if rendered.len() >= len {
                out.push(rendered[..len].to_vec());
                break;
            }
            if at >= ids.len() {
                break 'windows;
            }
        }
    }
    Ok(out)
}

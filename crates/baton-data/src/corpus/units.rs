//! The documents windows are cut from, one at a time and only when reached: a text in
//! memory, a plain file read in blocks, or each line of a .jsonl file. Taking windows in
//! turn from each document stops reading as soon as enough are taken, so a corpus of any
//! size costs the documents in use, a block each.

use super::file_text::FileText;
use super::jsonl::Lines;
use super::{char_slice, Body, CorpusError, Document};
use baton_runtime::text::TextTokenizer;
use std::borrow::Cow;

/// A chat window's text is read from the end of a document's split; this much of it at
/// most (whole for every file of the default corpus), so that a huge file costs a
/// bounded tail.
const CHAT_TAIL: u64 = 8 << 20;

pub(super) enum Unit<'a> {
    Text(Cow<'a, str>),
    File(&'a FileText),
}

type WindowIter<'a> = Box<dyn Iterator<Item = Result<Vec<u32>, CorpusError>> + 'a>;

/// Every document of `docs` in order, the lines of a .jsonl file each as one.
pub(super) fn units(docs: &[Document]) -> impl Iterator<Item = Result<Unit<'_>, CorpusError>> {
    docs.iter().flat_map(|d| -> Box<dyn Iterator<Item = _>> {
        match &d.body {
            Body::Text(t) => Box::new(std::iter::once(Ok(Unit::Text(Cow::Borrowed(t))))),
            Body::File(f) => Box::new(std::iter::once(Ok(Unit::File(f)))),
            Body::Jsonl(p) => match Lines::open(p) {
                Ok(lines) => Box::new(lines.map(|r| r.map(|(_, t)| Unit::Text(Cow::Owned(t))))),
                Err(e) => Box::new(std::iter::once(Err(e))),
            },
        }
    })
}

impl<'a> Unit<'a> {
    /// Consecutive windows of `len` tokens from the characters `range` of the document,
    /// from its start; a file is tokenized a block at a time as windows are taken.
    pub(super) fn windows(
        self,
        tok: &'a TextTokenizer,
        range: (f64, f64),
        len: usize,
    ) -> Result<WindowIter<'a>, CorpusError> {
        match self {
            Unit::Text(t) => {
                let ids = tok.encode_raw(char_slice(&t, range.0, range.1))?;
                let chunks: Vec<Vec<u32>> = ids.chunks_exact(len).map(|c| c.to_vec()).collect();
                Ok(Box::new(chunks.into_iter().map(Ok)))
            }
            Unit::File(f) => Ok(Box::new(FileWindows {
                blocks: f.blocks(f.region(range)?)?,
                tok,
                len,
                pending: Vec::new(),
                used: 0,
            })),
        }
    }

    /// The tokens of the characters `range`, or of their last [`CHAT_TAIL`] bytes (from
    /// a line start) for a file larger than that.
    pub(super) fn tail_tokens(
        self,
        tok: &TextTokenizer,
        range: (f64, f64),
    ) -> Result<Vec<u32>, CorpusError> {
        match self {
            Unit::Text(t) => Ok(tok.encode_raw(char_slice(&t, range.0, range.1))?),
            Unit::File(f) => {
                let (a, b) = f.region(range)?;
                let start = if b - a > CHAT_TAIL {
                    f.line_start_after(b - CHAT_TAIL, b)?
                } else {
                    a
                };
                let mut ids = Vec::new();
                for block in f.blocks((start, b))? {
                    ids.extend(tok.encode_raw(&block?)?);
                }
                Ok(ids)
            }
        }
    }
}

/// Windows of a file's text, read and tokenized a block at a time.
struct FileWindows<'a> {
    blocks: super::file_text::Blocks,
    tok: &'a TextTokenizer,
    len: usize,
    /// Tokens read and not yet handed out, from `used` on.
    pending: Vec<u32>,
    used: usize,
}

impl Iterator for FileWindows<'_> {
    type Item = Result<Vec<u32>, CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.pending.len() - self.used >= self.len {
                let w = self.pending[self.used..self.used + self.len].to_vec();
                self.used += self.len;
                return Some(Ok(w));
            }
            let text = match self.blocks.next()? {
                Ok(t) => t,
                Err(e) => return Some(Err(e)),
            };
            self.pending.drain(..self.used);
            self.used = 0;
            match self.tok.encode_raw(&text) {
                Ok(ids) => self.pending.extend(ids),
                Err(e) => return Some(Err(e.into())),
            }
        }
    }
}

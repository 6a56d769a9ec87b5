//! Incremental detokenization for streaming output.

use super::error::TokenizerError;
use super::tokenizer::TextTokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Turns generated ids into text one id at a time.
///
/// Byte-level BPE tokens can hold part of a UTF-8 character (an emoji is often two or more
/// tokens). [`TokenStream::push`] returns only text whose characters are complete: while the
/// decoded tail is an incomplete sequence it returns `""` and holds the bytes back, and emits
/// them once the character completes. It decodes a short window of recent ids against the
/// text already emitted (the approach of Hugging Face's text-generation-inference), so it works
/// with any decoder. A sequence that never completes is written as U+FFFD once a later id
/// decodes to complete text, or by [`TokenStream::finish`].
#[derive(Debug, Clone)]
pub struct TokenStream {
    tok: TextTokenizer,
    ids: Vec<u32>,
    /// Start of the decode window: ids before it are fully emitted and no longer decoded.
    prefix_offset: usize,
    /// Ids before this one have been emitted.
    read_offset: usize,
}

impl TokenStream {
    pub fn new(tok: TextTokenizer) -> Self {
        Self {
            tok,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Add one generated id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let prefix_text = self
            .tok
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = self.tok.decode(&self.ids[self.prefix_offset..])?;
        if new_text.len() > prefix_text.len() && !new_text.ends_with(REPLACEMENT) {
            if let Some(out) = new_text.get(prefix_text.len()..) {
                let out = out.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                return Ok(out);
            }
        }
        Ok(String::new())
    }

    /// Flush whatever is held back (an incomplete character becomes U+FFFD). The stream can
    /// be used further afterwards.
    pub fn finish(&mut self) -> Result<String, TokenizerError> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self
            .tok
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = self.tok.decode(&self.ids[self.prefix_offset..])?;
        let out = new_text
            .get(prefix_text.len()..)
            .map(str::to_string)
            .unwrap_or_default();
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(out)
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Whether some pushed ids have not been emitted as text yet.
    pub fn has_pending(&self) -> bool {
        self.read_offset < self.ids.len()
    }
}

impl TextTokenizer {
    /// A streaming detokenizer bound to this tokenizer.
    pub fn stream(&self) -> TokenStream {
        TokenStream::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use crate::text::tokenizer::test_support::{byte_symbols, tokenizer};

    /// The ids of the single-byte tokens of `bytes` (every multi-byte character is split).
    fn byte_ids(tok: &crate::text::TextTokenizer, bytes: &[u8]) -> Vec<u32> {
        let table = byte_symbols();
        bytes
            .iter()
            .map(|&b| tok.token_to_id(&table[b as usize].to_string()).unwrap())
            .collect()
    }

    #[test]
    fn never_splits_a_character() {
        let tok = tokenizer();
        let text = "aé🦀b 世界 👨‍👩‍👧!";
        let mut stream = tok.stream();
        let mut out = String::new();
        for id in byte_ids(&tok, text.as_bytes()) {
            let piece = stream.push(id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
            out.push_str(&piece);
            assert!(text.starts_with(&out));
        }
        out.push_str(&stream.finish().unwrap());
        assert_eq!(out, text);
        assert!(!stream.has_pending());
    }

    #[test]
    fn holds_back_until_complete() {
        let tok = tokenizer();
        let crab = "🦀".as_bytes();
        let ids = byte_ids(&tok, crab);
        let mut stream = tok.stream();
        for &id in &ids[..3] {
            assert_eq!(stream.push(id).unwrap(), "");
            assert!(stream.has_pending());
        }
        assert_eq!(stream.push(ids[3]).unwrap(), "🦀");
    }

    #[test]
    fn merged_tokens_and_specials() {
        let tok = tokenizer();
        let text = "<|im_start|>the thing<|im_end|>";
        let mut stream = tok.stream();
        let mut out = String::new();
        for id in tok.encode(text).unwrap() {
            out.push_str(&stream.push(id).unwrap());
        }
        assert_eq!(out, text);
        assert_eq!(stream.ids(), tok.encode(text).unwrap().as_slice());
    }

    #[test]
    fn invalid_bytes_become_replacement_chars() {
        let tok = tokenizer();
        let mut stream = tok.stream();
        // A lone continuation byte never completes: it is written once text follows it.
        assert_eq!(stream.push(byte_ids(&tok, &[0x80])[0]).unwrap(), "");
        assert_eq!(stream.push(byte_ids(&tok, b"a")[0]).unwrap(), "\u{FFFD}a");
        // An unfinished character is flushed by finish().
        assert_eq!(stream.push(byte_ids(&tok, &[0xC3])[0]).unwrap(), "");
        assert_eq!(stream.finish().unwrap(), "\u{FFFD}");
        assert_eq!(stream.finish().unwrap(), "");
    }
}

//! What the engine reported, kept in the shape the panels draw it in.

use baton_protocol::{CacheOrigin, GenerationTimings, StopKind};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoadingProgress {
    pub stage: String,
    pub done: u64,
    pub total: u64,
    pub eta_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Comparison {
    pub identical: bool,
    pub first_difference: Option<usize>,
    pub agreement: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub turn: u32,
    pub model: String,
    pub cache: CacheOrigin,
    pub text: String,
    /// Set once the generation is complete.
    pub finished: Option<Finished>,
    pub comparison: Option<Comparison>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Finished {
    pub tokens: usize,
    pub timings: GenerationTimings,
    pub stop: StopKind,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Entry {
    User {
        turn: u32,
        text: String,
    },
    Reply(Reply),
    /// Indexes the list of switches kept beside the transcript.
    Switch(usize),
    Bookmark {
        turn: u32,
        note: String,
    },
}

/// One streamed piece of text and the token that completed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub id: Option<u32>,
    pub text: String,
}

/// One path's answer to the latest turn, kept piece by piece so the first differing
/// token can be found again in the text.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PathText {
    pub pieces: Vec<Piece>,
    pub token_ids: Option<Vec<u32>>,
    pub stop: Option<StopKind>,
}

impl PathText {
    pub(crate) fn push(&mut self, id: u32, text: String) {
        self.pieces.push(Piece { id: Some(id), text });
    }

    pub(crate) fn finish(&mut self, text: &str, token_ids: &[u32], stop: StopKind) {
        // The decoder may flush text after the last streamed token; keep it so the panel
        // shows the whole answer.
        let streamed: String = self.pieces.iter().map(|p| p.text.as_str()).collect();
        if let Some(rest) = text.strip_prefix(streamed.as_str()) {
            if !rest.is_empty() {
                self.pieces.push(Piece {
                    id: None,
                    text: rest.to_string(),
                });
            }
        }
        self.token_ids = Some(token_ids.to_vec());
        self.stop = Some(stop);
    }

    /// The piece that holds token `index` of the answer, if the answer reaches it.
    pub fn piece_of_token(&self, index: usize) -> Option<usize> {
        let Some(ids) = &self.token_ids else {
            return (index < self.pieces.len()).then_some(index);
        };
        let mut next = 0;
        for (j, piece) in self.pieces.iter().enumerate() {
            // Only the flushed tail has no token of its own; it holds the rest.
            let Some(id) = piece.id else {
                return (index < ids.len()).then_some(j);
            };
            let Some(offset) = ids[next.min(ids.len())..].iter().position(|&t| t == id) else {
                return Some(j);
            };
            let at = next + offset;
            if at >= index {
                return Some(j);
            }
            next = at + 1;
        }
        None
    }
}

/// The mapped and the re-prefilled answer to the latest turn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TurnPair {
    pub turn: u32,
    pub model: String,
    pub cache: CacheOrigin,
    pub mapped: PathText,
    pub reference: Option<PathText>,
    pub comparison: Option<Comparison>,
}

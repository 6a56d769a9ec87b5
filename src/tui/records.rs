//! What the engine reported, kept in the shape the panels draw it in.

use crate::protocol::{
    CacheOrigin, GateDecision, GenerationTimings, PlanText, StopKind, SwitchMetrics, SwitchTimings,
};

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

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FollowUp {
    pub top1_agreement: Option<f64>,
    pub kl: Option<f64>,
    pub positions: usize,
    pub first_token_ms: f64,
    pub end_to_end_ms: f64,
}

/// Where a switch's measurement stands: its handoff is shown at once, the map and
/// re-prefill times and the per-layer metrics once they are measured.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Measure {
    Pending,
    Done,
    /// It ended early (cancelled, or an error), with the reason.
    Stopped(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SwitchRecord {
    pub index: u32,
    pub turn: u32,
    pub from: String,
    pub to: String,
    pub context_tokens: usize,
    pub suffix_tokens: usize,
    pub timings: SwitchTimings,
    pub metrics: Option<SwitchMetrics>,
    pub gate: Option<GateDecision>,
    pub estimate: Option<crate::protocol::SwitchEstimate>,
    pub follow_up: Option<FollowUp>,
    pub measure: Measure,
    /// The re-read set for the next message (`20%:source-attention:word`), if any.
    pub reread_setting: Option<String>,
    /// What the target re-read when the message came.
    pub reread: Option<RereadRecord>,
}

/// What the target re-read of a switch's mapped history at the next message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RereadRecord {
    pub positions: usize,
    pub context_tokens: usize,
    /// Choosing and re-reading, in milliseconds.
    pub ms: f64,
    /// Of which choosing.
    pub select_ms: f64,
    /// Positions dropped.
    pub dropped: usize,
    /// The plan would have cost the re-prefill: the target re-read the mapped part.
    pub reprefilled: bool,
    /// The text of each span re-read.
    pub texts: Vec<String>,
    /// The whole context, each run marked with what the plan made of it (empty from an
    /// older session).
    pub parts: Vec<PlanText>,
}

impl SwitchRecord {
    pub fn measuring(&self) -> bool {
        self.measure == Measure::Pending
    }
}

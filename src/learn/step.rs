//! One accepted update as the learned state records it: where its text came from, when,
//! how many positions, and the held-out cosine before and after.

use super::LearnOutcome;
use serde::{Deserialize, Serialize};

/// One accepted update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedStep {
    /// Where the text came from (a session file, an eval conversation).
    pub from: String,
    pub unix: u64,
    pub tokens: usize,
    /// Held-out cosine before and after, both halves combined.
    pub before: f64,
    pub after: f64,
}

impl LearnedStep {
    /// The step `o` took, from `from`, now.
    pub fn of(from: &str, o: &LearnOutcome) -> Self {
        Self {
            from: from.to_string(),
            unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tokens: o.tokens,
            before: o.before.combined(),
            after: o.after.combined(),
        }
    }
}

//! One accepted update as the learned state records it: where its text came from, when,
//! how many positions, and the held-out cosine before and after.

use super::LearnOutcome;
use crate::mapper::artifact::MapperMeta;
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
    /// The mapper it was learned on ([`crate::mapper::artifact::MapperMeta::identity`]):
    /// a step is applied to that mapper only. Absent in steps kept before steps were
    /// bound to their mapper; such a step belongs to the mapper it is no older than.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapper: Option<String>,
}

impl LearnedStep {
    /// The step `o` took on the mapper `mapper`, from `from`, now.
    pub fn of(from: &str, o: &LearnOutcome, mapper: &MapperMeta) -> Self {
        Self {
            from: from.to_string(),
            unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            tokens: o.tokens,
            before: o.before.combined(),
            after: o.after.combined(),
            mapper: Some(mapper.identity()),
        }
    }

    /// Whether this step was learned on `mapper`: one learned on another mapper of the
    /// same pair (one a calibration since replaced) is not applied to it.
    pub fn belongs_to(&self, mapper: &MapperMeta) -> bool {
        match &self.mapper {
            Some(id) => *id == mapper.identity(),
            None => self.unix >= mapper.created_unix,
        }
    }
}

//! Learning from use: the mapper adds the conversations it hands over to its statistics
//! and is solved again, so the next switch maps this kind of text better.
//!
//! A ridge map's sufficient statistics add up (see [`crate::mapper::PairStats`]). With
//! the reference path on, a switch already holds both models' own caches of the same
//! tokens: exact pairs in the very domain being mapped (this user's text, in the chat
//! template). They are added to the calibration's statistics and every target layer is
//! solved again with the calibration's structure kept as it was (the same source layers
//! per target layer, the same λ, the same gains): a re-solve, not a new calibration.
//!
//! An update is only taken if it does not lower the attention-output cosine on a
//! held-out slice made of two equal halves:
//! - the newest quarter of the conversation's new positions, kept out of the fit: the
//!   target's own queries there attend over its own cache of everything before with
//!   only the held-out positions mapped, so the two mappers are compared on positions
//!   neither was fitted on;
//! - a fixed stretch of calibration text no fit ever reads, mapped whole, which guards
//!   the mapper's use on other text.
//!
//! What was learned is kept apart from the calibration's statistics (`store`), so the
//! next session starts from it and a reset returns to the calibration. Each accepted
//! update is kept as its own file of the positions' features (`shard`), added beside the
//! others and never rewritten: what is on disk grows with what was learned, and runs
//! learning at once on the same mapper each add their own files instead of overwriting
//! one another's.
//!
//! A learner holds one copy of the statistics (the calibration's with what was
//! learned): an update is weighed by solving each target layer from the blocks it reads
//! with the update added to those alone, and is added to the whole only once taken.

mod judge;
mod learner;
pub mod open;
mod refit;
pub mod shard;
mod step;
pub mod store;

pub use judge::{HeldOutScores, Slice};
pub use learner::{ConversationPair, LearnOutcome, Learner, Update, MIN_NEW_POSITIONS};
pub use open::{calibration_slices, open, Opened};
pub use refit::{Refitted, Structure};

use crate::calibrate::CalibrateError;
use crate::mapper::MapperError;
use crate::metrics::MetricError;
use baton_runtime::model::ModelError;

/// What can stop a learning step; nothing learned so far is lost by any of them.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    #[error(transparent)]
    Calibrate(#[from] CalibrateError),
    #[error(transparent)]
    Mapper(#[from] MapperError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Metric(#[from] MetricError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Dir(#[from] crate::mapper::dir::DirError),
    #[error("learned statistics {}: {reason}", path.display())]
    Store {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Unsupported(String),
}

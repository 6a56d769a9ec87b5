//! What the gate knows about a switch before anything is re-prefilled.
//!
//! Without the reference path the engine never sees the target's own cache, so the gate
//! used to decide from a constant, the mapper's calibration cosine. Here it gets a number
//! from the conversation itself:
//! - `feature_distance` ([`estimate`]): how far the source features being handed over lie
//!   from the calibration's, per feature in units of the calibration's spread: the mean
//!   of `((x − μ) / σ)²` over the features every map reads, about 1 on text like the
//!   calibration corpus and larger where the ridge extrapolates. It costs one read of
//!   the source cache, no model run;
//! - `round_trip`: the source features mapped to the target and back with the reverse
//!   mapper, against themselves (cosine): what survives two maps. It costs a second map.
//!
//! Neither is on the attention cosine's scale, so a study over varied text
//! (`baton gate-study`) measures both against the measured attention cosine
//! and next-turn agreement, and fits a line from the better one to the cosine on half
//! of the switches, checked on the other half. That line ([`fit`]) is kept beside the
//! artifact; with it the gate predicts the cosine of each switch.

pub mod estimate;
pub mod fit;

pub use estimate::{feature_distance, round_trip, round_trip_by_position};
pub use fit::GateFit;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Model(#[from] baton_runtime::model::ModelError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("gate fit {}: {reason}", path.display())]
    Fit {
        path: std::path::PathBuf,
        reason: String,
    },
}

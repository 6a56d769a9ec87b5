//! Instruments that say how faithful a mapped KV cache is. Used by `eval` and by the
//! workbench; each works on plain tensors so the engine and the tests can call it alike.

pub mod answers;
pub mod attention_cosine;
pub mod attention_mass;
pub mod concentration;
pub mod interval;
pub mod logits;
pub mod regression;

pub use attention_cosine::{
    attention_output, attention_output_cosine, attention_output_cosine_hiding, probe_mask,
    probe_positions,
};
pub use concentration::{key_error_concentration, QueryGram};
pub use logits::{continuation_scores, ContinuationScores, NextTokenAgreement};
pub use regression::r2_per_layer;

/// The mean of per-layer values; 0 for none. A NaN (a layer whose measure could not be
/// computed) makes the mean NaN: it is never averaged away.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Metric failures are tensor failures or shape mismatches, both named.
#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("metric input shapes do not fit: {0}")]
    Shape(String),
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = MetricError> = std::result::Result<T, E>;

//! The KV-cache mapper's math: streaming sufficient statistics of paired source/target
//! features ([`stats`]), closed-form ridge fits and their evaluation from statistics
//! alone ([`ridge`]), and per-target-layer source selection ([`select`]). See
//! DESIGN.md §1 for the method.

pub mod error;
pub mod ridge;
pub mod select;
pub mod stats;

pub use error::{MapperError, Result};
pub use ridge::{
    fit_layer, fit_layer_lambdas, r2, residuals, FitInfo, LayerMap, Residuals, RidgeOptions,
    MAX_CONDITION,
};
pub use select::{select_layers, single_layer_r2, top_k};
pub use stats::PairStats;

pub mod apply;
pub mod arrow_stream;
pub mod artifact;
pub mod bench;
pub mod bench_plot;
pub mod corpus;
pub mod eval_tasks;
pub mod eval_text;
pub mod features;
pub mod low_rank;
pub mod packed;
pub mod tasks;

pub use apply::{CacheMapper, MapPrecision, TargetLayerMap};

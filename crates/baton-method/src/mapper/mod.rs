//! The method: a closed-form linear map from the source model's KV cache to the target's.
//!
//! - **Features** ([`features`]). Per layer and position, the concatenation of all KV
//!   heads, keys with the model's RoPE undone first (`K̄(t) = R(t)⁻¹ K(t)`; RoPE is an
//!   orthogonal rotation per position, so this is exact). Values carry no position.
//! - **Statistics** ([`stats`]). Streaming sufficient statistics of paired source/target
//!   features: counts, means and the Gram matrices `XᵀX`, `XᵀY`, `YᵀY`, accumulated in
//!   f64. They add up, so corpora can be merged and the fit re-solved without the data.
//! - **Selection** ([`select`]). For each target layer `j`, the `k` source layers whose
//!   single-layer ridge explains it best (R², separately for K and V).
//! - **Ridge** ([`ridge`]). With `X_j = [x^i1 | … | x^ik]` centred:
//!   `W_j = (XᵀX + λI)⁻¹ XᵀY`, solved by Cholesky in f64, with the intercept from the
//!   means; held-out R² and residuals from statistics alone.
//! - **Reduced rank** ([`low_rank`]): the fit projected onto its top singular directions,
//!   run as two thinner products.
//! - **Map** ([`map`]: [`map::dense`], [`map::int8`]). `K̂^j(t) = R_T(t)(x_K(t) W_K^j + b_K^j)` with the
//!   target's RoPE at the same absolute position, `V̂^j(t) = x_V(t) W_V^j + b_V^j`; each
//!   source layer is un-rotated once however many target layers read it. The int8 path
//!   quantises the weights to Q8_0 and runs on [`baton_runtime::kernels`].
//! - **Artifact** ([`artifact`]): the fitted maps with the identities of both models and
//!   the calibration report, found and checked by pair.
//!
//! - **Trained heads** ([`nonlinear`]): a small network per target layer added to the
//!   ridge map (`residual`) or in its place (`mlp`).
//! - **Residual map** ([`residual`]): the source's residual stream at one layer to the
//!   target's at its layer `m`, over which the target computes its own upper layers.
//!
//! Calibration (capture, sweep, choice) lives above this in `calibrate`; measuring a
//! mapper in `eval` and `bench`.

pub mod error;
pub mod ridge;
pub mod select;
pub mod stats;
pub mod token_block;

pub use error::{MapperError, Result};
pub use ridge::{
    fit_layer, fit_layer_lambdas, r2, residuals, FitInfo, LayerMap, Residuals, RidgeOptions,
    MAX_CONDITION,
};
pub use select::{select_layers, single_layer_r2, top_k};
pub use stats::PairStats;

pub mod artifact;
pub mod calibration_report;
pub mod dir;
pub mod features;
pub mod gain;
pub mod low_rank;
pub mod map;
pub mod nonlinear;
pub mod residual;
pub mod residual_file;

pub use map::{CacheMapper, MapPrecision, SourceScales, TargetLayerMap, DEFAULT_ANCHOR};

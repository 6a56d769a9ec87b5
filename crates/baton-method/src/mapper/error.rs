use std::path::PathBuf;

/// Everything that can go wrong accumulating calibration statistics or fitting a mapper.
/// Each message names the problem and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum MapperError {
    #[error("invalid geometry: {0}")]
    Geometry(String),
    #[error("batch shape mismatch: {what} has {got} values, expected {expected} ({rows} rows × {width})")]
    BatchShape {
        what: &'static str,
        got: usize,
        expected: usize,
        rows: usize,
        width: usize,
    },
    #[error("non-finite value in {what} at row {row}, column {col}: the capture produced NaN or infinity, so the batch was rejected to keep the statistics usable")]
    NonFinite {
        what: &'static str,
        row: usize,
        col: usize,
    },
    #[error("cannot merge statistics of different geometry: {0}")]
    MergeMismatch(String),
    #[error("{what} layer {layer} is out of range (the model has {layers} layers)")]
    LayerOutOfRange {
        what: &'static str,
        layer: usize,
        layers: usize,
    },
    #[error("invalid source layer selection: {0}")]
    Sources(String),
    #[error("the statistics hold {count} observations; at least {needed} are needed")]
    TooFewObservations { count: u64, needed: u64 },
    #[error("target layer {layer} has zero variance in these statistics, so R² is undefined")]
    ZeroVariance { layer: usize },
    #[error("the Gram matrix is not positive definite at λ = {lambda:e} ({reason}); use a larger λ, fewer source layers or more observations, or allow the λ fallback")]
    NotPositiveDefinite { lambda: f64, reason: String },
    #[error("invalid ridge options: {0}")]
    Options(String),
    #[error("layer map does not fit these statistics: {0}")]
    MapShape(String),
    #[error("eigendecomposition failed: {0}")]
    Eigen(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a baton pair-statistics file: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("{path} is not a residual map this baton reads: {reason}; remove it and baton fits it again when a plan needs it")]
    BadResidualFile { path: PathBuf, reason: String },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = MapperError> = std::result::Result<T, E>;

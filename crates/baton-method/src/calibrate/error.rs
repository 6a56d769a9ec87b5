use crate::mapper::MapperError;
use crate::metrics::MetricError;
use baton_data::corpus::CorpusError;
use baton_runtime::model::ModelError;
use baton_runtime::text::TokenizerError;

/// Everything that can stop a calibration. Option mistakes are caught before any model
/// runs ([`super::CalibrateOptions::validate`]) and name the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Mapper(#[from] MapperError),
    #[error(transparent)]
    Artifact(#[from] crate::mapper::artifact::ArtifactError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Metric(#[from] MetricError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Dir(#[from] crate::mapper::dir::DirError),
    #[error("saved statistics {}: {reason}", path.display())]
    Stats {
        path: std::path::PathBuf,
        reason: String,
    },
    /// Writing a calibration's output failed; what was in the mappers directory stays.
    #[error("{0}; the mappers and statistics already in the mappers directory were left as they were: free some space or name another directory with --mapper-dir, and calibrate again")]
    NotKept(Box<CalibrateError>),
    #[error("calibration cancelled; nothing was written")]
    Cancelled,
    #[error("{0}")]
    Options(String),
}

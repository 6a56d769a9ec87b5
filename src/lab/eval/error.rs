//! What can stop an evaluation, said so the message names the problem and the fix.

use crate::data::corpus::CorpusError;
use crate::data::tasks::TaskError;
use crate::mapper::artifact::ArtifactError;
use crate::mapper::MapperError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Mapper(#[from] MapperError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error(transparent)]
    Metric(#[from] crate::metrics::MetricError),
    #[error(transparent)]
    Fidelity(#[from] crate::handoff::fidelity::FidelityError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Learn(#[from] crate::learn::LearnError),
    #[error(transparent)]
    Tokenizer(#[from] crate::text::TokenizerError),
    #[error("the conversation cannot be rendered: {0}")]
    Template(#[from] crate::text::ChatTemplateError),
    /// Options or inputs that cannot be evaluated, with what to change.
    #[error("{0}")]
    Input(String),
}

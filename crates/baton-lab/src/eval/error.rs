//! What can stop an evaluation, said so the message names the problem and the fix.

use baton_data::corpus::CorpusError;
use baton_data::tasks::TaskError;
use baton_method::mapper::artifact::ArtifactError;
use baton_method::mapper::MapperError;
use baton_runtime::model::ModelError;

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
    Metric(#[from] baton_method::metrics::MetricError),
    #[error(transparent)]
    Fidelity(#[from] baton_method::handoff::fidelity::FidelityError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Learn(#[from] baton_method::learn::LearnError),
    #[error(transparent)]
    Tokenizer(#[from] baton_runtime::text::TokenizerError),
    #[error("the conversation cannot be rendered: {0}")]
    Template(#[from] baton_runtime::text::ChatTemplateError),
    /// Options or inputs that cannot be evaluated, with what to change.
    #[error("{0}")]
    Input(String),
}

//! Which path a turn ran on, where its cache came from, why it stopped, and which model and mapper files a session used.

use super::ids::ModelName;
use serde::{Deserialize, Serialize};

/// Which of the two paths a turn was generated on. Before the first switch there is only
/// the primary path, reported as `Mapped` with a [`CacheOrigin::True`] cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathKind {
    /// The primary path, shown to the user: after a switch, the target's cache comes
    /// from the mapper.
    Mapped,
    /// The shadow path: the target re-prefills the whole conversation itself, as the
    /// yardstick for the mapped one.
    Reference,
}

/// How the cache a model generates from was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheOrigin {
    /// The model prefilled the conversation itself.
    True,
    /// The cache was mapped from the other model's.
    Mapped,
    /// The model re-prefilled the conversation after a switch.
    Reprefilled,
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    Eos,
    MaxTokens,
    Cancelled,
}

/// A loaded model, enough to tell later which weights a session ran on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: ModelName,
    pub path: String,
    pub sha256: String,
    pub arch: String,
    pub n_layer: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// A loaded mapper artifact, bound to the two models it was fitted between.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MapperInfo {
    /// The artifact's file name.
    pub id: String,
    pub source: ModelName,
    pub target: ModelName,
    pub sha256: String,
    /// Source layers feeding each target layer.
    pub k: usize,
}

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

/// What a handoff's plan made of a position of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanPart {
    /// The target's own, as it held or computed it before the map.
    Kept,
    /// Recomputed by the target, once the message was known.
    Reread,
    /// Mapped from the source's cache and left so.
    Mapped,
    /// Left out: no attention reads it.
    Dropped,
}

/// A run of the conversation's text that a plan treated one way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanText {
    pub part: PlanPart,
    pub text: String,
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

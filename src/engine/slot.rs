//! One model's side of the conversation: the model, the cache its shown answers come
//! from, its own prefill of the conversation (its truth), and what it was loaded with.
//!
//! Each model keeps two caches over prefixes of the one token history:
//! - `primary`: what the shown (mapped) path generates from. After a switch it holds
//!   the positions the model had computed itself when it was last active, followed by
//!   positions mapped from the other model, so drift accumulates as in production.
//! - `truth`: the model's own prefill of the same tokens, extended by re-prefilling only
//!   what it has not seen (a server with prefix caching pays exactly that). It is the
//!   reference path's cache and the yardstick for the mapped one.

use super::conversation::Conversation;
use crate::metrics::QueryGram;
use crate::model::{ForwardOptions, KvCache, Model};
use crate::protocol::{CacheOrigin, ModelInfo, ModelName};
use std::ops::Range;
use std::sync::Arc;

/// What a switch left for the first message to re-read (see the engine's re-read).
#[derive(Debug, Clone)]
pub(super) struct PendingReread {
    /// The switch's index.
    pub(super) index: u32,
    /// The slot handed away from.
    pub(super) source: usize,
    /// The positions it mapped.
    pub(super) mapped: Range<usize>,
}

pub struct Slot {
    /// Shared with the learning thread, which reads the models' shapes and RoPE and runs
    /// the target's attention to judge an update.
    pub(super) model: Arc<Model>,
    pub(super) primary: KvCache,
    pub(super) origin: CacheOrigin,
    pub(super) truth: KvCache,
    pub(super) grams: Vec<QueryGram>,
    pub(super) info: ModelInfo,
    /// The model's own cache of the conversation's first `anchor` ids (the template's
    /// opening, the same in every conversation), computed once so that taking over never
    /// waits for it.
    pub(super) anchor_kv: Option<(Vec<u32>, KvCache)>,
    /// What the last switch to this model left for the next message to re-read.
    pub(super) pending_reread: Option<PendingReread>,
    /// Milliseconds per position of this model's last prefill long enough to say: the
    /// speed a re-read's time budget is spent at.
    pub(super) read_speed: Option<f64>,
}

impl Slot {
    pub fn new(model: Model, grams: Vec<QueryGram>, info: ModelInfo) -> Self {
        Self {
            primary: model.decoder.new_cache(),
            truth: model.decoder.new_cache(),
            origin: CacheOrigin::True,
            model: Arc::new(model),
            grams,
            info,
            anchor_kv: None,
            pending_reread: None,
            read_speed: None,
        }
    }

    /// The precomputed opening, when `history` starts with it.
    pub(super) fn opening(&self, history: &[u32]) -> Option<&KvCache> {
        let (ids, kv) = self.anchor_kv.as_ref()?;
        history.starts_with(ids).then_some(kv)
    }

    pub(super) fn name(&self) -> ModelName {
        self.info.name.clone()
    }
}

/// Both slots mutably: `a` first, the other second.
pub(super) fn split(slots: &mut [Slot; 2], a: usize) -> (&mut Slot, &mut Slot) {
    let (x, y) = slots.split_at_mut(1);
    if a == 0 {
        (&mut x[0], &mut y[0])
    } else {
        (&mut y[0], &mut x[0])
    }
}

/// The model's own cache of the first `anchor` ids every conversation starts with (the
/// template rendered with any first message); `None` when it cannot be made.
pub(super) fn opening(
    model: &Model,
    conv: &Conversation,
    anchor: usize,
) -> Option<(Vec<u32>, KvCache)> {
    let template = model.template.as_ref()?;
    let mut probe = conv.clone();
    probe.push_user(template, &model.tokenizer, "x").ok()?;
    let ids = probe.history.get(..anchor)?.to_vec();
    let mut kv = model.decoder.new_cache();
    model
        .decoder
        .forward(&ids, &mut kv, &ForwardOptions::cache_only())
        .ok()?;
    Some((ids, kv))
}

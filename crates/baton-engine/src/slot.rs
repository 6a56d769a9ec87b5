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
use baton_method::handoff::reread::opening_len_within;
use baton_method::metrics::QueryGram;
use baton_protocol::{CacheOrigin, ModelInfo, ModelName};
use baton_runtime::model::{ForwardOptions, KvCache, Model};
use std::sync::Arc;

/// A switch to this model left positions it did not compute itself (mapped at this
/// switch or an earlier one): the first message re-reads what it needs of them (see the
/// engine's re-read). It waits through any switches made before that message.
#[derive(Debug, Clone)]
pub(super) struct PendingReread {
    /// The latest switch to this model.
    pub(super) index: u32,
    /// The slot handed away from.
    pub(super) source: usize,
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
    /// The model's own cache of the conversation's opening (the template's system turn,
    /// the same in every conversation, and at least the first `anchor` ids), computed
    /// once when the model loads: every switch copies it, so no plan reads it again.
    pub(super) anchor_kv: Option<(Vec<u32>, KvCache)>,
    /// What the last switch to this model left for the next message to re-read.
    pub(super) pending_reread: Option<PendingReread>,
    /// Milliseconds per position of this model's last prefill long enough to say: the
    /// speed a re-read's time budget is spent at.
    pub(super) read_speed: Option<f64>,
    /// Milliseconds per position of predicted re-read cost, as this model's last re-read
    /// long enough to say measured it: what the guard expects a plan's re-read to take.
    pub(super) reread_speed: Option<f64>,
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
            reread_speed: None,
        }
    }

    /// The precomputed opening, when `history` starts with it.
    pub(super) fn opening(&self, history: &[u32]) -> Option<&KvCache> {
        let (ids, kv) = self.anchor_kv.as_ref()?;
        history.starts_with(ids).then_some(kv)
    }

    /// The positions a handoff of `history` to this model computes (copies) as its own
    /// before mapping: its precomputed opening where `history` starts with it, else the
    /// first `anchor`.
    pub(super) fn anchor_for(&self, history: &[u32], anchor: usize) -> usize {
        self.opening(history)
            .map_or(anchor, |kv| kv.len().max(anchor))
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

/// The model's own cache of the opening every conversation starts with: the template
/// rendered with the system prompt, up to the end of its turn and the line break after
/// it, and at least the first `anchor` ids. Found as the part two conversations with
/// different first messages share, so a template's default system prompt counts as
/// much as one the user set. `None` when it cannot be made.
pub(super) fn opening(
    model: &Model,
    conv: &Conversation,
    anchor: usize,
) -> Option<(Vec<u32>, KvCache)> {
    let template = model.template.as_ref()?;
    let rendered = |text: &str| {
        let mut probe = conv.clone();
        probe.push_user(template, &model.tokenizer, text).ok()?;
        Some(probe.history)
    };
    let (x, y) = (rendered("x")?, rendered("y")?);
    let shared = x.iter().zip(&y).take_while(|(a, b)| a == b).count();
    let system_turn = opening_len_within(&model.tokenizer, &x, shared).min(shared);
    let ids = x.get(..system_turn.max(anchor))?.to_vec();
    let mut kv = model.decoder.new_cache();
    model
        .decoder
        .forward(&ids, &mut kv, &ForwardOptions::cache_only())
        .ok()?;
    Some((ids, kv))
}

//! The caches an item starts from: the prefix every context of a task shares, prefilled
//! and mapped once, and each item's own reference and mapped caches built on it.

use super::TaskEvalOptions;
use crate::eval::reread::{RereadDone, RereadModels, RereadTurn};
use crate::eval::EvalError;
use baton_data::tasks::{TaskDef, TaskItem};
use baton_method::handoff::{HandoffInputs, HandoffPlan};
use baton_method::mapper::CacheMapper;
use baton_runtime::model::{ForwardOptions, KvCache, Model};
use std::collections::HashMap;
use std::time::Instant;

/// The caches every item starts from: true target, source, and mapped target over the
/// token prefix the items share.
pub(super) struct Shared {
    pub(super) len: usize,
    pub(super) target: KvCache,
    pub(super) source: KvCache,
    pub(super) mapped: KvCache,
}

pub(super) struct Prepared {
    pub(super) reference: KvCache,
    pub(super) mapped: KvCache,
    pub(super) map_seconds: f64,
    pub(super) reprefill_seconds: f64,
    pub(super) reread: RereadDone,
}

pub(super) fn prepare(
    models: RereadModels<'_>,
    shared: &Shared,
    prefix: &[u32],
    opts: &TaskEvalOptions,
    read_from: Option<usize>,
) -> Result<Prepared, EvalError> {
    let (src, tgt, mapper) = (models.source, models.target, models.mapper);
    let (anchor, tail) = (opts.anchor, opts.tail);
    let suffix = &prefix[shared.len..];
    let mut reference = shared.target.try_clone()?;
    let t0 = Instant::now();
    if !suffix.is_empty() {
        tgt.decoder
            .forward(suffix, &mut reference, &ForwardOptions::cache_only())?;
    }
    let reprefill_seconds = t0.elapsed().as_secs_f64();
    // The target reads the tail (and the question, when told to) itself, so neither the
    // source nor the mapper works on it; what the items share is mapped once.
    let mut whole = HandoffPlan::new(prefix.len()).anchor(anchor).tail(tail);
    if let Some(q) = read_from {
        whole = whole.read_from(q);
    }
    let map_end = whole.mapped().end;
    let plan = whole.clone().holding(shared.len.min(map_end));
    let mut source = None;
    if map_end > shared.len {
        let mut s = shared.source.try_clone()?;
        src.decoder.forward(
            &prefix[shared.len..map_end],
            &mut s,
            &ForwardOptions::cache_only(),
        )?;
        source = Some(s);
    }
    let t1 = Instant::now();
    let mut mapped = shared.mapped.try_clone_prefix(plan.held())?;
    let source_cache = source.as_ref().unwrap_or(&shared.source);
    plan.build(
        &HandoffInputs {
            source: src,
            source_cache,
            target: tgt,
            mapper,
            tokens: prefix,
            exact: None,
        },
        &mut mapped,
    )?;
    // The whole context is a candidate, the shared part mapped once included: the
    // re-read works on this item's copy.
    let reread = match &opts.reread {
        None => RereadDone::default(),
        Some(setting) => models.reread(
            setting,
            RereadTurn {
                plan: whole,
                source_cache,
                tokens: prefix,
                history: map_end,
                // The question is past the source's cache, so it cannot be mapped: it
                // was read over the mapped middle and is read again with the spans.
                ms_per_position: (!suffix.is_empty())
                    .then(|| reprefill_seconds * 1e3 / suffix.len() as f64),
            },
            &mut mapped,
        )?,
    };
    Ok(Prepared {
        reference,
        mapped,
        map_seconds: t1.elapsed().as_secs_f64(),
        reprefill_seconds,
        reread,
    })
}

pub(super) fn build_shared(
    src: &Model,
    tgt: &Model,
    mapper: &CacheMapper,
    prefixes: &[&[u32]],
    anchor: usize,
) -> Result<Shared, EvalError> {
    // The anchor is computed once, in the shared prefix, so it must lie within it.
    let len = common_prefix_len(prefixes);
    if anchor > len {
        return Err(EvalError::Input(format!(
            "an anchor of {anchor} positions is longer than the {len} tokens every context \
             of this task shares; use --anchor {len} or less"
        )));
    }
    let ids = prefixes.first().map(|p| &p[..len]).unwrap_or(&[]);
    let mut target = tgt.decoder.new_cache();
    let mut source = src.decoder.new_cache();
    let mut mapped = tgt.decoder.new_cache();
    if len > 0 {
        tgt.decoder
            .forward(ids, &mut target, &ForwardOptions::cache_only())?;
        src.decoder
            .forward(ids, &mut source, &ForwardOptions::cache_only())?;
        // The target's own cache of the anchor is already in `target`.
        (mapped, _) = HandoffPlan::new(len)
            .anchor(anchor)
            .build_new(&HandoffInputs {
                source: src,
                source_cache: &source,
                target: tgt,
                mapper,
                tokens: ids,
                exact: Some(&target),
            })?;
    }
    Ok(Shared {
        len,
        target,
        source,
        mapped,
    })
}

/// The token position where `context`'s final question starts (its last `Question:`),
/// as the context's own tokens have it; the context's end when it has none (nothing is
/// then read by the target but what it always reads).
pub fn question_start(
    tok: &baton_runtime::text::TextTokenizer,
    context: &str,
    ids: &[u32],
) -> Result<usize, EvalError> {
    let Some(at) = context.rfind("Question:") else {
        return Ok(ids.len());
    };
    let before = tok.encode_raw(&context[..at])?;
    Ok(common_prefix_len(&[&before, ids]))
}

/// Longest token prefix all sequences share.
pub fn common_prefix_len(seqs: &[&[u32]]) -> usize {
    let Some(first) = seqs.first() else {
        return 0;
    };
    let mut len = first.len();
    for s in &seqs[1..] {
        len = len.min(
            first
                .iter()
                .zip(s.iter())
                .take_while(|(a, b)| a == b)
                .count(),
        );
    }
    len
}

/// Token ids of every distinct context, all but the last token (the target computes
/// that one).
pub(super) fn encode_contexts(
    tok: &baton_runtime::text::TextTokenizer,
    def: &TaskDef,
    items: &[TaskItem],
) -> Result<HashMap<String, Vec<u32>>, EvalError> {
    let mut contexts: HashMap<String, Vec<u32>> = HashMap::new();
    for item in items {
        let ctxs: Vec<&str> = match item {
            TaskItem::MultipleChoice { choices, .. } => {
                choices.iter().map(|c| c.context.as_str()).collect()
            }
            TaskItem::Generate { context, .. } => vec![context.as_str()],
        };
        for c in ctxs {
            if !contexts.contains_key(c) {
                let ids = tok.encode_raw(c)?;
                if ids.is_empty() {
                    return Err(EvalError::Input(format!(
                        "{}: document {} has an empty context",
                        def.name,
                        item.doc_id()
                    )));
                }
                contexts.insert(c.to_string(), ids);
            }
        }
    }
    Ok(contexts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_is_the_shortest_agreement() {
        let a = [1u32, 2, 3, 4];
        let b = [1u32, 2, 3, 9, 9];
        let c = [1u32, 2];
        assert_eq!(common_prefix_len(&[&a, &b]), 3);
        assert_eq!(common_prefix_len(&[&a, &b, &c]), 2);
        assert_eq!(common_prefix_len(&[&a]), 4);
        assert_eq!(common_prefix_len(&[]), 0);
    }
}

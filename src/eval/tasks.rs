//! Task retention: does the target still answer benchmark questions when its cache of
//! the question came from the source model through the mapper?
//!
//! For every context the source prefills all but the last token, the mapper turns that
//! cache into the target's, and the target itself computes the last context token and
//! then scores each answer (multiple choice) or generates greedily (GSM8K). That is the
//! handoff as the workbench does it: the target always computes the token it predicts
//! from. The same items run on the target's own prefill (the reference) and, for
//! multiple choice, with no context at all (the floor: what the answers alone give).
//!
//! Few-shot contexts share their examples; the shared token prefix is prefilled and
//! mapped once and each item only extends it (mapping is per position, so the mapped
//! prefix is the same either way).

use super::reread::{RereadDone, RereadModels, RereadTurn};
use super::EvalError;
use crate::data::tasks::{extract_number, normalize_number, Choice, TaskDef, TaskItem, TaskKind};
use crate::handoff::reread::RereadSetting;
use crate::handoff::{HandoffInputs, HandoffPlan};
use crate::mapper::CacheMapper;
use crate::metrics::interval::{
    floor_normalised_retention, paired_bootstrap, raw_retention, wilson, Estimate, PairedOutcome,
};
use crate::model::decoder::log_softmax;
use crate::model::sampler::argmax;
use crate::model::{ForwardOptions, KvCache, Logits, Model};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Instant;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TaskEvalOptions {
    pub bootstrap_resamples: usize,
    pub seed: u64,
    /// Leading context positions the target computes itself instead of receiving them
    /// mapped (attention sinks); 0 maps everything.
    pub anchor: usize,
    /// Final context tokens (before the last one) the target computes itself on top of
    /// the mapped cache: tells whether a mapped background plus a re-read question
    /// keeps what the mapped question alone loses. 0 maps the whole context.
    pub tail: usize,
    /// Generation tasks: the target reads the final question itself (from the last
    /// `Question:` of the context on), as it reads a user's new message; the few-shot
    /// examples before it are mapped. On top of `tail`, which still applies.
    #[serde(default)]
    pub target_reads_question: bool,
    /// What the target re-reads of the mapped context, chosen with the part it reads
    /// itself (the question, the tail) as the message: it needs one of them.
    #[serde(default)]
    pub reread: Option<RereadSetting>,
}

impl Default for TaskEvalOptions {
    fn default() -> Self {
        Self {
            bootstrap_resamples: 2000,
            seed: 20_261_130,
            anchor: 0,
            tail: 0,
            target_reads_question: false,
            reread: None,
        }
    }
}

/// What happened on one item.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemOutcome {
    pub doc_id: u64,
    pub reference_correct: bool,
    pub mapped_correct: bool,
    /// No-context answer; false for generation tasks (not run: the question is the
    /// context).
    pub floor_correct: bool,
    /// Both paths chose the same option / produced the same final number.
    pub same_answer: bool,
    /// Both paths generated the same tokens (generation tasks only).
    pub identical_generation: Option<bool>,
    /// What each path generated (generation tasks only): where and how the mapped
    /// answer departs from the reference is the thing to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generations: Option<Generations>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generations {
    pub reference: String,
    pub mapped: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskResult {
    pub task: String,
    pub kind: TaskKind,
    pub shots: usize,
    pub items: usize,
    /// The target read each final question itself (see
    /// [`TaskEvalOptions::target_reads_question`]); the context before it was mapped.
    #[serde(default)]
    pub target_reads_question: bool,
    /// Target on its own prefill of the context.
    pub accuracy_reference: Estimate,
    /// Target on the mapped cache.
    pub accuracy_mapped: Estimate,
    /// The floor retention is normalised by: the target scoring the answers without
    /// the context (multiple choice), or 0 (generation).
    pub accuracy_floor: Estimate,
    pub floor: String,
    /// Random guessing, for orientation (multiple choice only).
    pub chance: Option<f64>,
    /// accuracy_mapped / accuracy_reference, paired-bootstrap 95% interval.
    pub retention_raw: Estimate,
    /// (mapped − floor) / (reference − floor), paired-bootstrap 95% interval.
    pub retention_floor_normalised: Estimate,
    /// Share of items where both paths gave the same answer.
    pub answer_agreement: f64,
    /// Mean seconds per item: mapping the (non-shared) context vs the target
    /// prefilling it.
    pub map_seconds: f64,
    pub reprefill_seconds: f64,
    /// The re-read, when there was one: its setting, its seconds per item (part of
    /// `map_seconds`) and the positions it re-read per item.
    #[serde(default)]
    pub reread: Option<RereadSetting>,
    #[serde(default)]
    pub reread_seconds: f64,
    #[serde(default)]
    pub reread_positions: f64,
    pub outcomes: Vec<ItemOutcome>,
}

/// The caches every item starts from: true target, source, and mapped target over the
/// token prefix the items share.
struct Shared {
    len: usize,
    target: KvCache,
    source: KvCache,
    mapped: KvCache,
}

struct Prepared {
    reference: KvCache,
    mapped: KvCache,
    map_seconds: f64,
    reprefill_seconds: f64,
    reread: RereadDone,
}

fn prepare(
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

fn build_shared(
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
    tok: &crate::text::TextTokenizer,
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

/// Sum of log-probabilities of `cont` after the cache and `last` (the final context
/// token, computed by the target itself).
fn continuation_logprob(
    tgt: &Model,
    cache: &KvCache,
    last: u32,
    cont: &[u32],
) -> Result<f64, EvalError> {
    let mut c = cache.try_clone()?;
    let mut ids = Vec::with_capacity(cont.len() + 1);
    ids.push(last);
    ids.extend_from_slice(cont);
    let out = tgt.decoder.forward(
        &ids,
        &mut c,
        &ForwardOptions {
            logits: Logits::All,
            probe_positions: vec![],
        },
    )?;
    let logits = out
        .logits
        .ok_or_else(|| EvalError::Input("no logits for the continuation".into()))?;
    let lp = log_softmax(&logits)?;
    let mut total = 0f64;
    for (row, &tok) in cont.iter().enumerate() {
        total += lp.get(row)?.get(tok as usize)?.to_scalar::<f32>()? as f64;
    }
    Ok(total)
}

/// The option with the highest log-likelihood per character of its text.
fn pick(scores: &[f64], choices: &[Choice]) -> usize {
    let mut best = (0usize, f64::NEG_INFINITY);
    for (i, (s, c)) in scores.iter().zip(choices).enumerate() {
        let v = s / c.continuation.chars().count().max(1) as f64;
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

pub(crate) fn generate_until(
    tgt: &Model,
    mut cache: KvCache,
    last: u32,
    stop: &[String],
    max_tokens: usize,
) -> Result<(Vec<u32>, String), EvalError> {
    let eos = tgt.tokenizer.eos_ids().to_vec();
    let mut ids = Vec::new();
    let mut next = last;
    let mut text = String::new();
    for _ in 0..max_tokens {
        let logits = tgt.decoder.next_logits(&[next], &mut cache)?;
        let v = logits.flatten_all()?.to_vec1::<f32>()?;
        let tok = argmax(&v);
        if eos.contains(&tok) {
            break;
        }
        ids.push(tok);
        text = tgt.tokenizer.decode(&ids)?;
        if let Some(cut) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            break;
        }
        next = tok;
    }
    Ok((ids, text))
}

/// Run one task on `items` in one direction. `on_item` is called after each item.
pub fn eval_task(
    src: &Model,
    tgt: &Model,
    mapper: &CacheMapper,
    def: &TaskDef,
    items: &[TaskItem],
    opts: &TaskEvalOptions,
    on_item: &mut dyn FnMut(usize),
) -> Result<TaskResult, EvalError> {
    let models = RereadModels {
        source: src,
        target: tgt,
        mapper,
        reverse: None,
    };
    eval_task_with(models, def, items, opts, on_item)
}

/// [`eval_task`] with the other direction's mapper at hand, for a re-read that ranks by
/// the round trip.
pub fn eval_task_with(
    models: RereadModels<'_>,
    def: &TaskDef,
    items: &[TaskItem],
    opts: &TaskEvalOptions,
    on_item: &mut dyn FnMut(usize),
) -> Result<TaskResult, EvalError> {
    let (src, tgt, mapper) = (models.source, models.target, models.mapper);
    let contexts = encode_contexts(&tgt.tokenizer, def, items)?;
    let prefixes: Vec<&[u32]> = contexts.values().map(|v| &v[..v.len() - 1]).collect();
    let shared = build_shared(src, tgt, mapper, &prefixes, opts.anchor)?;
    tracing::info!(
        task = def.name,
        items = items.len(),
        shared_prefix = shared.len,
        "task evaluation"
    );
    let mut run = ItemRun {
        models,
        opts,
        contexts: &contexts,
        shared,
        empty: tgt.decoder.new_cache(),
        map_s: 0.0,
        pre_s: 0.0,
        reread: RereadDone::default(),
    };
    let mut outcomes = Vec::with_capacity(items.len());
    for (n, item) in items.iter().enumerate() {
        let outcome = match item {
            TaskItem::MultipleChoice {
                doc_id,
                choices,
                gold,
            } => run.multiple_choice(*doc_id, choices, *gold)?,
            TaskItem::Generate {
                doc_id,
                context,
                stop,
                max_tokens,
                answer,
            } => run.generate(*doc_id, context, stop, *max_tokens, answer)?,
        };
        outcomes.push(outcome);
        on_item(n + 1);
    }
    Ok(summarise(def, outcomes, &run, items))
}

/// Token ids of every distinct context, all but the last token (the target computes
/// that one).
fn encode_contexts(
    tok: &crate::text::TextTokenizer,
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

/// What every item of one task reads, and the time its items spent mapping and
/// re-prefilling so far.
struct ItemRun<'a> {
    models: RereadModels<'a>,
    opts: &'a TaskEvalOptions,
    contexts: &'a HashMap<String, Vec<u32>>,
    shared: Shared,
    /// The floor's cache: no context at all.
    empty: KvCache,
    map_s: f64,
    pre_s: f64,
    /// The re-reads' positions and milliseconds, summed over items.
    reread: RereadDone,
}

impl ItemRun<'_> {
    /// The reference and mapped caches of `prefix`, adding their times to the totals.
    fn prepare(&mut self, prefix: &[u32], read_from: Option<usize>) -> Result<Prepared, EvalError> {
        let p = prepare(self.models, &self.shared, prefix, self.opts, read_from)?;
        self.map_s += p.map_seconds;
        self.pre_s += p.reprefill_seconds;
        self.reread.positions += p.reread.positions;
        self.reread.ms += p.reread.ms;
        Ok(p)
    }

    /// Scores every choice after the reference, the mapped and the empty cache, and
    /// compares the picks with `gold`.
    fn multiple_choice(
        &mut self,
        doc_id: u64,
        choices: &[Choice],
        gold: usize,
    ) -> Result<ItemOutcome, EvalError> {
        let (tgt, tok) = (self.models.target, &self.models.target.tokenizer);
        let contexts = self.contexts;
        let mut prepared: HashMap<&str, Prepared> = HashMap::new();
        let (mut sr, mut sm, mut sf) = (Vec::new(), Vec::new(), Vec::new());
        for c in choices {
            let ids = &contexts[c.context.as_str()];
            let (prefix, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);
            if !prepared.contains_key(c.context.as_str()) {
                let p = self.prepare(prefix, None)?;
                prepared.insert(c.context.as_str(), p);
            }
            let p = &prepared[c.context.as_str()];
            let cont = tok.encode_raw(&c.continuation)?;
            sr.push(continuation_logprob(tgt, &p.reference, last, &cont)?);
            sm.push(continuation_logprob(tgt, &p.mapped, last, &cont)?);
            sf.push(continuation_logprob(tgt, &self.empty, last, &cont)?);
        }
        let (r, m, f) = (pick(&sr, choices), pick(&sm, choices), pick(&sf, choices));
        Ok(ItemOutcome {
            doc_id,
            reference_correct: r == gold,
            mapped_correct: m == gold,
            floor_correct: f == gold,
            same_answer: r == m,
            identical_generation: None,
            generations: None,
        })
    }

    /// Generates greedily after the reference and the mapped cache, and compares the
    /// final numbers with `answer`.
    fn generate(
        &mut self,
        doc_id: u64,
        context: &str,
        stop: &[String],
        max_tokens: usize,
        answer: &str,
    ) -> Result<ItemOutcome, EvalError> {
        let tgt = self.models.target;
        let ids = &self.contexts[context];
        let (prefix, last) = (&ids[..ids.len() - 1], ids[ids.len() - 1]);
        let read_from = if self.opts.target_reads_question {
            Some(question_start(&tgt.tokenizer, context, ids)?)
        } else {
            None
        };
        let p = self.prepare(prefix, read_from)?;
        let (ids_r, text_r) = generate_until(tgt, p.reference, last, stop, max_tokens)?;
        let (ids_m, text_m) = generate_until(tgt, p.mapped, last, stop, max_tokens)?;
        let (ar, am) = (extract_number(&text_r), extract_number(&text_m));
        let gold = normalize_number(answer);
        tracing::debug!(doc_id, reference = %text_r, mapped = %text_m, "generated");
        Ok(ItemOutcome {
            doc_id,
            reference_correct: ar.as_deref() == Some(gold.as_str()),
            mapped_correct: am.as_deref() == Some(gold.as_str()),
            floor_correct: false,
            same_answer: ar == am,
            identical_generation: Some(ids_r == ids_m),
            generations: Some(Generations {
                reference: text_r,
                mapped: text_m,
            }),
        })
    }
}

fn summarise(
    def: &TaskDef,
    outcomes: Vec<ItemOutcome>,
    run: &ItemRun<'_>,
    items: &[TaskItem],
) -> TaskResult {
    let opts = run.opts;
    let n = outcomes.len();
    let per_item = |total: f64| total / n.max(1) as f64;
    let count = |f: &dyn Fn(&ItemOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    let paired: Vec<PairedOutcome> = outcomes
        .iter()
        .map(|o| (o.reference_correct, o.mapped_correct, o.floor_correct))
        .collect();
    let chance = match def.kind {
        TaskKind::MultipleChoice => {
            let mean_choices = items
                .iter()
                .map(|i| match i {
                    TaskItem::MultipleChoice { choices, .. } => 1.0 / choices.len() as f64,
                    TaskItem::Generate { .. } => 0.0,
                })
                .sum::<f64>()
                / items.len().max(1) as f64;
            Some(mean_choices)
        }
        TaskKind::GenerateNumber => None,
    };
    TaskResult {
        task: def.name.to_string(),
        kind: def.kind,
        shots: def.shots,
        items: n,
        target_reads_question: opts.target_reads_question && def.kind == TaskKind::GenerateNumber,
        accuracy_reference: wilson(count(&|o| o.reference_correct), n),
        accuracy_mapped: wilson(count(&|o| o.mapped_correct), n),
        accuracy_floor: wilson(count(&|o| o.floor_correct), n),
        floor: match def.kind {
            TaskKind::MultipleChoice => "no context".into(),
            TaskKind::GenerateNumber => "zero".into(),
        },
        chance,
        retention_raw: paired_bootstrap(
            &paired,
            raw_retention,
            opts.bootstrap_resamples,
            opts.seed,
        ),
        retention_floor_normalised: paired_bootstrap(
            &paired,
            floor_normalised_retention,
            opts.bootstrap_resamples,
            opts.seed,
        ),
        answer_agreement: count(&|o| o.same_answer) as f64 / n.max(1) as f64,
        map_seconds: per_item(run.map_s),
        reprefill_seconds: per_item(run.pre_s),
        reread: opts.reread,
        reread_seconds: per_item(run.reread.ms / 1e3),
        reread_positions: per_item(run.reread.positions as f64),
        outcomes,
    }
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

    #[test]
    fn choices_are_compared_per_character() {
        let ch = |s: &str| Choice {
            context: String::new(),
            continuation: s.into(),
        };
        // The longer answer has the lower total but the higher per-character score.
        let choices = [ch(" ab"), ch(" abcdefgh")];
        assert_eq!(pick(&[-3.0, -4.5], &choices), 1);
        assert_eq!(pick(&[-1.0, -9.0], &choices), 0);
    }
}

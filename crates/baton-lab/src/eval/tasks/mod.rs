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

mod caches;
mod items;

pub use caches::{common_prefix_len, question_start};
pub(crate) use items::generate_until;

use super::reread::{RereadDone, RereadModels};
use super::EvalError;
use baton_data::tasks::{TaskDef, TaskItem, TaskKind};
use baton_method::handoff::reread::RereadSetting;
use baton_method::mapper::CacheMapper;
use baton_method::metrics::interval::{
    floor_normalised_retention, paired_bootstrap, raw_retention, wilson, Estimate, PairedOutcome,
};
use baton_runtime::model::Model;
use caches::{build_shared, encode_contexts};
use items::ItemRun;
use serde::{Deserialize, Serialize};

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
